"""The lab's rungs of andrea_numba/kernels/attn_flash.py: every numbered version the engine does not run,
beside the engine's own (imported from the engine module), and the VERSIONS table of the ladder.

v13 and v14 (the bf16 recipes': kernels/attn_flash_bf16.py, attn_flash_*_bf16 and _bf16_out16)
against v11. v11 is v8's kernel text with bf16 products: its tiles sit in shared memory as fp32 and
every lane rounds its fragment values as it reads them, one float at a time; the scores p~ f and ds
go through shared tiles between the two products of a key tile; the backward runs 2 warps a block.
v13 keeps v11's numbers (the inputs of the five kinds of product rounded to bf16 as v11 rounds
them; D = dy . y by v10's sum, v10's bits) and changes where they live: bf16 tiles rounded once on
their way in, ldmatrix fragments, p~ f and ds kept in registers as the next product's A operand,
4 to 8 warps a block, one barrier a tile. What changes is the order of some fp32 sums:
  - the k steps of every product are chained inside the tensor core (D = A B + C), and so are the
    key (query) tiles of o, dq, dk and dv; v11 started each k16 step from zero and added it in fp32;
  - l's four lane parts are added (l0 + l1) + (l2 + l3) (a butterfly), v11 ((l0 + l1) + l2) + l3;
  - a masked score is set to -inf and gives p~ = 2^-inf = 0 (v11 set p = 0 by a branch: the same).
Per key tile and warp, the hot loop of v13's forward at (8, 64) issues about 550 SASS instructions
for its 64 mma.sync (32 for s, 32 for p~ f V; 36 ldmatrix.x4; 600 when the maximum moves), the dq
kernel at (4, 32) about 530 for 48, the dk/dv kernel about 620 for 64: 8 to 11 instructions a
tensor-core instruction, where v11 issued about 37 (forward, (4, 16): 600 for 16 mma.sync) and 48
to 49 (backward, (2, 16)) (sm_90). v14 is v13 writing its outputs in bf16 where only bf16 products
read them (y16 beside y; dq, dk, dv in bf16 only): v13's values rounded as the products' operand
copies rounded them, five [N, C] copies a layer fewer; without y16 and with float32 dq, dk, dv (the
harness's call) v14 is v13. docs/kernels.md has both measured on the H200.
"""
from andrea_numba.kernels.attn_flash import *  # noqa: F401,F403  (the engine's rungs and helpers)
from lab.attn_flash_mma import attn_flash_bwd_v2, attn_flash_fwd_v2
from lab.attn_flash_wgmma import attn_flash_bwd_v15, attn_flash_fwd_v15
from lab.attn_flash_v3 import attn_flash_bwd_v11, attn_flash_bwd_v3, attn_flash_bwd_v4, attn_flash_bwd_v5, attn_flash_bwd_v6, attn_flash_bwd_v7, attn_flash_bwd_v8, attn_flash_bwd_v9, attn_flash_fwd_v11, attn_flash_fwd_v3, attn_flash_fwd_v4, attn_flash_fwd_v5, attn_flash_fwd_v6, attn_flash_fwd_v7


# The versions (v1 above; the others imported at the top):
# v2: the same three kernels with their products on tensor cores (lab/attn_flash_mma.py)
# v3: v2 with the next tiles loading during the products, the own tile split once (lab/attn_flash_v3.py)
# v4: v3 with the own tiles' values in one plane, split as read: larger tiles fit (same file)
# v5: v3 with matmul v7's split (the small parts truncated by the tensor core) (same file)
# v6: v5 with swizzled inner tiles: no bank conflicts in either way they are read (same file)
# v7: v5 with indices the compiler knows are >= 0 (no code for negative indices); v8: v7 with the
#     longest tiles of every head first (same file)
# v9: (the backward only; v8's forward) D = dy . y worked out in the dq kernel (no rowdot launch)
# v10: (the backward only) v9 with dy and y read 128 bits at a time for D (same file)
# v11: v8's forward and v10's backward with bf16 products (mma.sync m16n8k16, inputs rounded as read,
#     the forward's softmax in base 2); v12: the same in fp16 (the 16-bit pieces: kernels/attn_flash_lowp.py;
#     the launchers: lab/attn_flash_v3.py). Forward and backward share the number (there is no forward v9
#     or v10: those versions changed the backward only)
# v13: v11's math (bf16 products) with bf16 tiles read by ldmatrix, p~ f and ds kept in registers as the
#     next product's A operand, 4 warps a block, one barrier a tile (kernels/attn_flash_bf16.py)
# v14: v13 writing y's bf16 copy (y16) and dq, dk, dv in bf16 where given uint16 buffers (same file)
# v15: v13's math (and v14's bf16 outputs) on Hopper's wgmma: a warpgroup of 64 own rows, S from shared
#     tiles, p~ f and ds in registers as the register-A operand of the next product, V, K, Q and dY read
#     N-major through the transpose bit; head size up to 64 (lab/attn_flash_wgmma.py)
VERSIONS = {"attn_flash_fwd": {1: attn_flash_fwd, 2: attn_flash_fwd_v2, 3: attn_flash_fwd_v3, 4: attn_flash_fwd_v4,
                               5: attn_flash_fwd_v5, 6: attn_flash_fwd_v6, 7: attn_flash_fwd_v7,
                               8: attn_flash_fwd_tf32x3, 11: attn_flash_fwd_v11, 12: attn_flash_fwd_fp16,
                               13: attn_flash_fwd_bf16, 14: attn_flash_fwd_bf16_out16, 15: attn_flash_fwd_v15},
            "attn_flash_bwd": {1: attn_flash_bwd, 2: attn_flash_bwd_v2, 3: attn_flash_bwd_v3, 4: attn_flash_bwd_v4,
                               5: attn_flash_bwd_v5, 6: attn_flash_bwd_v6, 7: attn_flash_bwd_v7,
                               8: attn_flash_bwd_v8, 9: attn_flash_bwd_v9, 10: attn_flash_bwd_tf32x3,
                               11: attn_flash_bwd_v11, 12: attn_flash_bwd_fp16, 13: attn_flash_bwd_bf16,
                               14: attn_flash_bwd_bf16_out16, 15: attn_flash_bwd_v15}}


def flash_pair(version: int):
    """(forward, backward) launchers of flash attention `version`: the backward of that number and
    the latest forward up to it whose products have the same precision (`.precision`: none is fp32).
    v9 and v10 change the backward only and run v8's forward; v11 (bf16) and v12 (fp16) are pairs."""
    precision = getattr(VERSIONS["attn_flash_bwd"][version], "precision", None)
    fwd = max(v for v, f in VERSIONS["attn_flash_fwd"].items()
              if v <= version and getattr(f, "precision", None) == precision)
    return VERSIONS["attn_flash_fwd"][fwd], VERSIONS["attn_flash_bwd"][version]
