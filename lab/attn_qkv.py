"""The lab's rungs of andrea_numba/kernels/attn_qkv.py: every numbered version the engine does not run,
beside the engine's own (imported from the engine module), and the VERSIONS table of the ladder.

v1 runs the kernels on matmul v2's tiles, v2 on the SIMT warp tiles of matmul v3, v3 on the 3xTF32
tensor-core warp tiles of matmul v4, v4-v6 on those of matmul v5-v7, the engine's v7 on matmul v8's
(the same kernel text on other tiles), v8 on matmul v9's SIMT tiles, v9 on matmul v10's bf16 tiles,
the engine's v10 on matmul v11's (fp16), v11 on matmul v12's. The engine's v12 chains products of
matmul v13 (its tiles take the bf16 copies only its launcher makes: three launches where v11 ran
one of three z-slices, dx summed in the output, not in registers: other bits than v11's, the same
math); v13-v15 (the comment above v13).
"""
from andrea_numba.kernels.attn_qkv import *  # noqa: F401,F403  (the engine's rungs and helpers)
from andrea_numba.kernels.attn_qkv import _bwd_held, _bwd_warp, _fwd_chain, _fwd_warp  # noqa: F401
from lab.matmul import (HALF_OP_TILES, MN_TILES, RING_TILES, SIMT2_TILES, SPLIT_TILES, WARP_TILES,
                        matmul_bf16_wgmma_cp_async, matmul_v3, matmul_v4, matmul_v5, matmul_v6, matmul_v7, matmul_v9,
                        matmul_v10, matmul_v12, matmul_v16)


# the backward's first (the engine's) tile is 128 x 64: at 12M the 64 x 64 tile took 0.86 ms
# against 0.59 (H200, docs/kernels.md), at 120M 2.06 against 2.23
BWD_TILES = dict(gpu=WARP_TILES["gpu"][:3], sim=WARP_TILES["sim"])      # (the 128 x 64 tile now leads WARP_TILES too)


@blocks(**WARP_TILES)
def attn_qkv_fwd_v2(q, k, v, x, w_q, w_k, w_v, *, block, stream=0):
    """v1 on SIMT warp tiles; block = (BM, BN, BK, WM, WN)."""
    _fwd_warp(matmul_v3, q, k, v, x, w_q, w_k, w_v, block, stream)


@blocks(**BWD_TILES)
def attn_qkv_bwd_v2(dx, dw_q, dw_k, dw_v, work, dq, dk, dv, x, w_q, w_k, w_v, *, block, stream=0):
    """v1 on SIMT warp tiles, the weight gradients split over K into work."""
    _bwd_warp(matmul_v3, dx, dw_q, dw_k, dw_v, work, dq, dk, dv, x, w_q, w_k, w_v, block, stream)


@blocks(**WARP_TILES)
def attn_qkv_fwd_v3(q, k, v, x, w_q, w_k, w_v, *, block, stream=0):
    """v1 on 3xTF32 tensor-core warp tiles."""
    _fwd_warp(matmul_v4, q, k, v, x, w_q, w_k, w_v, block, stream)


@blocks(**BWD_TILES)
def attn_qkv_bwd_v3(dx, dw_q, dw_k, dw_v, work, dq, dk, dv, x, w_q, w_k, w_v, *, block, stream=0):
    """v1 on 3xTF32 tensor-core warp tiles, the weight gradients split over K into work."""
    _bwd_warp(matmul_v4, dx, dw_q, dw_k, dw_v, work, dq, dk, dv, x, w_q, w_k, w_v, block, stream)


@blocks(**SPLIT_TILES)
def attn_qkv_fwd_v4(q, k, v, x, w_q, w_k, w_v, *, block, stream=0):
    """v1 on the split tiles of matmul v5 (3xTF32, parts made once, BK = 16)."""
    _fwd_warp(matmul_v5, q, k, v, x, w_q, w_k, w_v, block, stream)


@blocks(**SPLIT_TILES)
def attn_qkv_bwd_v4(dx, dw_q, dw_k, dw_v, work, dq, dk, dv, x, w_q, w_k, w_v, *, block, stream=0):
    """v1 on the split tiles of matmul v5, the weight gradients split over K into work."""
    _bwd_warp(matmul_v5, dx, dw_q, dw_k, dw_v, work, dq, dk, dv, x, w_q, w_k, w_v, block, stream)


@blocks(**KMAJOR_TILES)
def attn_qkv_fwd_v5(q, k, v, x, w_q, w_k, w_v, *, block, stream=0):
    """v1 on the k-major tiles of matmul v6 (3xTF32, split as read, BK = 16)."""
    _fwd_warp(matmul_v6, q, k, v, x, w_q, w_k, w_v, block, stream)


@blocks(**KMAJOR_TILES)
def attn_qkv_bwd_v5(dx, dw_q, dw_k, dw_v, work, dq, dk, dv, x, w_q, w_k, w_v, *, block, stream=0):
    """v1 on the k-major tiles of matmul v6, the weight gradients split over K into work."""
    _bwd_warp(matmul_v6, dx, dw_q, dw_k, dw_v, work, dq, dk, dv, x, w_q, w_k, w_v, block, stream)


@blocks(**KMAJOR_TILES)
def attn_qkv_fwd_v6(q, k, v, x, w_q, w_k, w_v, *, block, stream=0):
    """v5 on the tiles of matmul v7 (the small parts truncated by the tensor core)."""
    _fwd_warp(matmul_v7, q, k, v, x, w_q, w_k, w_v, block, stream)


@blocks(**KMAJOR_TILES)
def attn_qkv_bwd_v6(dx, dw_q, dw_k, dw_v, work, dq, dk, dv, x, w_q, w_k, w_v, *, block, stream=0):
    """v5 on the tiles of matmul v7, the weight gradients split over K into work."""
    _bwd_warp(matmul_v7, dx, dw_q, dw_k, dw_v, work, dq, dk, dv, x, w_q, w_k, w_v, block, stream)


@blocks(**SIMT2_TILES)
def attn_qkv_fwd_v8(q, k, v, x, w_q, w_k, w_v, *, block, stream=0):
    """v1 on the SIMT tiles of matmul v9 (no tensor cores: fp32 multiply-adds, 128-bit shared reads)."""
    _fwd_warp(matmul_v9, q, k, v, x, w_q, w_k, w_v, block, stream)


@blocks(**SIMT2_TILES)
def attn_qkv_bwd_v8(dx, dw_q, dw_k, dw_v, work, dq, dk, dv, x, w_q, w_k, w_v, *, block, stream=0):
    """v1 on the SIMT tiles of matmul v9, the weight gradients split over K into work."""
    _bwd_warp(matmul_v9, dx, dw_q, dw_k, dw_v, work, dq, dk, dv, x, w_q, w_k, w_v, block, stream)


# bf16 products (the first rung in bf16): the kernels of the tf32x3w version on matmul v10's tiles,
# every product's inputs rounded to bf16 as its fragments are read, fp32 sums. .precision tells the
# harness to check them against the twin at that precision (check.py, low_precision_reference).
@blocks(**KMAJOR_TILES)
def attn_qkv_fwd_v9(q, k, v, x, w_q, w_k, w_v, *, block, stream=0):
    """v7 with bf16 products (matmul v10's tiles)."""
    _fwd_warp(matmul_v10, q, k, v, x, w_q, w_k, w_v, block, stream)


@blocks(**KMAJOR_TILES)
def attn_qkv_bwd_v9(dx, dw_q, dw_k, dw_v, work, dq, dk, dv, x, w_q, w_k, w_v, *, block, stream=0):
    """v7's backward with bf16 products, the weight gradients split over K into work."""
    _bwd_warp(matmul_v10, dx, dw_q, dw_k, dw_v, work, dq, dk, dv, x, w_q, w_k, w_v, block, stream)


attn_qkv_fwd_v9.precision = attn_qkv_bwd_v9.precision = "bf16"


# bf16 products on matmul v12's tiles (kernels/half_tile.py): each operand rounded to bf16 once, on
# its way into shared memory, the fragments read with ldmatrix; the same kernels as v9 (same math,
# other order of the sums).
@blocks(**HALF_OP_TILES)
def attn_qkv_fwd_v11(q, k, v, x, w_q, w_k, w_v, *, block, stream=0):
    """v9 on matmul v12's tiles (bf16 shared tiles, ldmatrix)."""
    _fwd_warp(matmul_v12, q, k, v, x, w_q, w_k, w_v, block, stream)


@blocks(**HALF_OP_TILES)
def attn_qkv_bwd_v11(dx, dw_q, dw_k, dw_v, work, dq, dk, dv, x, w_q, w_k, w_v, *, block, stream=0):
    """v9's backward on matmul v12's tiles, the weight gradients split over K into work."""
    _bwd_warp(matmul_v12, dx, dw_q, dw_k, dw_v, work, dq, dk, dv, x, w_q, w_k, w_v, block, stream)


attn_qkv_fwd_v11.precision = attn_qkv_bwd_v11.precision = "bf16"


# v13: v12's products through matmul v16: wgmma (v15) for q, k, v and dx, v13 for the weight gradients;
# each of dq, dk, dv rounded to bf16 once (operands.HELD) for its two products, where v12 rounded it
# for each. The products run in the order (dx, dW_Q), (dx, dW_K), (dx, dW_V): dx still sums q, k, v.
# v14: the same on matmul v17 (wgmma for every product, the weight gradients' operands read as
# stored); the engine's v15 (attn_qkv_fwd_bf16_wgmma) on v18.
@blocks(**RING_TILES)
def attn_qkv_fwd_v13(q, k, v, x, w_q, w_k, w_v, *, block, stream=0):
    """q = x @ W_Q, k = x @ W_K, v = x @ W_V: three products of matmul v16 (v15's wgmma)."""
    _fwd_chain(matmul_v16, q, k, v, x, w_q, w_k, w_v, block, stream)


@blocks(**RING_TILES)
def attn_qkv_bwd_v13(dx, dw_q, dw_k, dw_v, work, dq, dk, dv, x, w_q, w_k, w_v, *, block, stream=0):
    """v12's six products through matmul v16: dx's three on v15 (wgmma), the weight gradients on v13;
    dq, dk, dv each rounded to bf16 once (operands.HELD)."""
    _bwd_held(matmul_v16, dx, dw_q, dw_k, dw_v, work, dq, dk, dv, x, w_q, w_k, w_v, block, stream)


@blocks(**MN_TILES)
def attn_qkv_fwd_v14(q, k, v, x, w_q, w_k, w_v, *, block, stream=0):
    """q, k, v: three products of matmul v17 (wgmma, W read N-major as stored)."""
    _fwd_chain(matmul_bf16_wgmma_cp_async, q, k, v, x, w_q, w_k, w_v, block, stream)


@blocks(**MN_TILES)
def attn_qkv_bwd_v14(dx, dw_q, dw_k, dw_v, work, dq, dk, dv, x, w_q, w_k, w_v, *, block, stream=0):
    """v13's backward with all six products on matmul v17."""
    _bwd_held(matmul_bf16_wgmma_cp_async, dx, dw_q, dw_k, dw_v, work, dq, dk, dv, x, w_q, w_k, w_v, block, stream)


attn_qkv_fwd_v13.precision = attn_qkv_bwd_v13.precision = "bf16"


attn_qkv_fwd_v14.precision = attn_qkv_bwd_v14.precision = "bf16"


VERSIONS = {"attn_qkv_fwd": {1: attn_qkv_fwd, 2: attn_qkv_fwd_v2, 3: attn_qkv_fwd_v3, 4: attn_qkv_fwd_v4, 5: attn_qkv_fwd_v5, 6: attn_qkv_fwd_v6, 7: attn_qkv_fwd_tf32x3,
                             8: attn_qkv_fwd_v8, 9: attn_qkv_fwd_v9, 10: attn_qkv_fwd_fp16, 11: attn_qkv_fwd_v11, 12: attn_qkv_fwd_bf16, 13: attn_qkv_fwd_v13, 14: attn_qkv_fwd_v14, 15: attn_qkv_fwd_bf16_wgmma,
                             16: attn_qkv_fwd_tf32x3_wgmma},
            "attn_qkv_bwd": {1: attn_qkv_bwd, 2: attn_qkv_bwd_v2, 3: attn_qkv_bwd_v3, 4: attn_qkv_bwd_v4, 5: attn_qkv_bwd_v5, 6: attn_qkv_bwd_v6, 7: attn_qkv_bwd_tf32x3,
                             8: attn_qkv_bwd_v8, 9: attn_qkv_bwd_v9, 10: attn_qkv_bwd_fp16, 11: attn_qkv_bwd_v11, 12: attn_qkv_bwd_bf16, 13: attn_qkv_bwd_v13, 14: attn_qkv_bwd_v14, 15: attn_qkv_bwd_bf16_wgmma,
                             16: attn_qkv_bwd_tf32x3_wgmma}}
