"""The lab's rungs of andrea_numba/kernels/matmul.py: every numbered version the engine does not run,
beside the engine's own (imported from the engine module), and the VERSIONS table of the ladder.
"""
import contextlib
import sys

from andrea_numba.kernels.matmul import *  # noqa: F401,F403  (the engine's rungs and helpers)
from lab.cublaslt import matmul_versions as library_versions
from lab.fp8_products import matmul_versions as fp8_versions
from andrea_numba.kernels.matmul import _tma_matmul, _wgmma_matmul  # noqa: F401
from lab.wgmma_tile import wgmma_resolve


VERSIONS = {"matmul": {1: matmul_naive, 2: matmul, 3: matmul_v3, 4: matmul_v4, 5: matmul_v5, 6: matmul_v6,
                       7: matmul_v7, 8: matmul_tf32x3, 9: matmul_v9, 10: matmul_v10,
                       11: matmul_fp16}}


# the linear ops on v12's tiles (attn_qkv, attn_out v11, mlp v15): in the simulator two tiles of one
# warp (matmul v12's rows check the two-warp tile and its swizzle of 128-byte rows)
HALF_OP_TILES = dict(gpu=HALF_TILES["gpu"], sim=(HALF_TILES["sim"][0], (32, 16, 32, 32, 16)))


VERSIONS["matmul"][12] = matmul_v12


VERSIONS["matmul"][13] = matmul_bf16


# v14: bf16 products on Hopper's warpgroup instruction wgmma.mma_async (kernels/wgmma_tile.py). v13's
# bf16 copies, cp.async ring and swizzled shared tiles, but the stage is two wgmma m64n128k16 a
# warpgroup (two warpgroups, 256 threads, a 128 x 128 tile), reading A and B straight from shared
# memory through descriptors (the 64-byte swizzle of v13's k-inner tiles is wgmma's mode 2): no
# ldmatrix, no fragment registers. wgmma reads the tiles K-major, so both copies are made K-major,
# the a @ b^T form: a16 [M, K], b16 [N, K]; an operand stored with k down its columns (b of x @ W,
# a^T of a weight gradient) is rounded into a transposed copy (operands.k_round_bf16_t_v1, a 32 x 32
# tile transpose through shared memory). Same math as v13 (inputs rounded to bf16 ties to even,
# exact products, fp32 sums), another order of the sums inside the tensor core: other bits than
# v13, the same at every run. Tiles (BM, BN, 32, 64, BN[, STAGES]): 128 x 128 of 2 warpgroups with
# 3 stages (48 KiB) and 64 x 128 of one with 4 (48 KiB); in the simulator one warpgroup of 64 x 16
# (3 stages) and of 64 x 8 (4 stages: wait_group 2).
WGMMA_TILES = dict(gpu=((128, 128, 32, 64, 128), (64, 128, 32, 64, 128, 4)),
                   sim=((64, 16, 32, 64, 16), (64, 8, 32, 64, 8, 4)))


@blocks(**WGMMA_TILES)
def matmul_v14(out, work, a, b, trans_a=False, trans_b=False, accumulate=False, *, block, stream=0):
    """bf16 products on wgmma (sm_90a) from K-major bf16 copies of the operands (rounded once, ties
    to even; transposed where stored the other way) copied to shared memory by cp.async through a
    ring of stages; block = (BM, BN, 32, 64, BN[, STAGES]); work: the split-K buffer (or None). The
    copies live in operands.COPIES, as v13's (its caveats: one scratch, grown at a new largest size)."""
    _wgmma_matmul(wgmma_resolve, out, work, a, b, trans_a, trans_b, accumulate, block, stream)


matmul_v14.precision = "bf16"
matmul_v14.family = "v14"


VERSIONS["matmul"][14] = matmul_v14          # no linear op runs on it: they stay on v13


VERSIONS["matmul"][15] = matmul_v15          # no linear op runs on it, as v14


VERSIONS["matmul"][16] = matmul_v16


VERSIONS["matmul"][17] = matmul_v17


def tma_fits(a, b) -> bool:
    """Whether matmul v18 runs a product of a and b itself: each a 2-D array with rows of a multiple
    of 8 values (a float32 operand is copied into an aligned slot of COPIES with its rows packed), a
    uint16 one (read where it is) also a tensor map's alignment (tma.map_fits); else v18 hands the
    product to v17."""
    return all(x.ndim == 2 and x.shape[1] % 8 == 0 and (x.dtype != "uint16" or map_fits(x)) for x in (a, b))


VERSIONS["matmul"][18] = matmul_bf16_wgmma


# v19: v18 whose kernel adds its split-K slices itself (wgmma_tma.py, point 6): the last warp of the S
# slices of a tile's cells sums them in k_splitk_sum_v2's order, so v18's bits without the second
# launch and its pass over memory (the sums took 0.93 ms of the 120M bf16 step). Measured on the
# H200: v18's bits in whole 120M and 12M steps, but the split products took 173 us against
# 23: the summing warp's scalar loads, one slice after another, wait on L2 S x 128 times a thread.
# A rung that lost (docs/precision.md); batching those loads is its next step.
@blocks(gpu=(TMA_AUTO,) + TMA_TILES["gpu"], sim=(TMA_AUTO,) + TMA_TILES["sim"])
def matmul_v19(out, work, a, b, trans_a=False, trans_b=False, accumulate=False, *, block, stream=0):
    """matmul v18 with the split-K slices added in the product's own kernel (SplitKCounts)."""
    _tma_matmul(out, work, a, b, trans_a, trans_b, accumulate, block, stream, fixup=1)


matmul_v19.precision = "bf16"


VERSIONS["matmul"][19] = matmul_v19


# the modules whose linear ops name matmul_bf16_wgmma at each product: the engine's and their lab twins
TMA_OPS = tuple(f"{wing}.{op}" for wing in ("andrea_numba.kernels", "lab") for op in ("attn_qkv", "attn_out", "mlp", "loss"))


@contextlib.contextmanager
def tma_matmul(version: int):
    """Benchmarks only: inside, the linear ops whose products run on matmul v18 (matmul_bf16_wgmma:
    the bf16-hopper recipe's, the lab's recipes bf16t and bf16s) run matmul `version` (18, 19, 23)
    instead, for a rung of the split-K fixup timed and checked inside the whole model without a
    recipe of its own: the name matmul_bf16_wgmma, which those ops look up at each product, points at
    it in their modules (TMA_OPS, those imported); after, at v18 again."""
    assert version in (18, 19, 23), f"matmul v{version} is not a TMA version (18, 19, 23)"
    engine, launch = VERSIONS["matmul"][18], VERSIONS["matmul"][version]
    users = [m for name, m in sys.modules.items() if name in TMA_OPS and getattr(m, "matmul_bf16_wgmma", None) is engine]
    for m in users:
        m.matmul_bf16_wgmma = launch
    try:
        yield
    finally:
        for m in users:
            m.matmul_bf16_wgmma = engine


# v23 (20-22 are the library route's numbers, cublaslt.py): v19 with the in-kernel sums' loads batched
# (wgmma_tma.py, point 6: sum_slices_batched, up to 8 slices of 2 accumulator pairs in flight before
# the adds, in the same order): v18's bits. Its time on a GPU is not measured yet; the simulator
# checks its bits (tests/test_matmul_v19.py), and lab/bench/gpu_profile.sh times it beside v18 and v19.
@blocks(gpu=(TMA_AUTO,) + TMA_TILES["gpu"], sim=(TMA_AUTO,) + TMA_TILES["sim"])
def matmul_v23(out, work, a, b, trans_a=False, trans_b=False, accumulate=False, *, block, stream=0):
    """matmul v19 with the split-K slices' loads batched before their adds."""
    _tma_matmul(out, work, a, b, trans_a, trans_b, accumulate, block, stream, fixup=2)


matmul_v23.precision = "bf16"


VERSIONS["matmul"][23] = matmul_v23


# matmul v20-v22 (cuBLASLt in fp32, bf16, fp16) and v24 (FP8) beside the ladder, where they can run
# (a GPU with nvmath-python; FP8: Ada or Hopper): the harness checks them and lab/bench/gemm.py times
# them as it does our kernels.
VERSIONS["matmul"].update(library_versions())
VERSIONS["matmul"].update(fp8_versions())
