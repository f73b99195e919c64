"""The engine's k-major tiles are written out (andrea_numba/kernels/split_tile.py); the flag factory
they were built by is the lab's (lab/split_tile.py). At the engine's flag values (one plane of raw
values split as read, swizzled rows; split_mode "trunc" for matmul_tf32x3, half "fp16" for
matmul_fp16) the factory's tile and the written-out one give the same bits, at every transpose, at
tiles whose transposed operands take either copy (4 x 4 blocks, 4 rows at one k), with rows,
columns and k past a tile's edge, one float at a time (37 x 42 x 29, in two split-K slices of 16
and 13) and in 128-bit chunks (36 x 44 x 28); and both are close to the float64 product.

In the simulator a stage's products are the NumPy twins; on a GPU (NUMBA_ENABLE_CUDASIM=0) the
same test runs the mma.sync stages.
"""
import functools

import numpy as np
import pytest
from numba import cuda, float32

from andrea_numba.kernels.common import SIMULATOR, cdiv
from andrea_numba.kernels.matmul import KMAJOR_TILES
from andrea_numba.kernels.warp_tile import make_fp16_tile, make_tf32x3_tile
from lab.warp_tile import make_split_tile
from reference.precision import round_fp16

# M, N, K, 128-bit copies, split-K slice, tiles. A transposed operand of 16 values a thread comes in
# 4 x 4 blocks, one of 8 as 4 tile rows at one k: one float at a time, the simulator's 32 x 64 tile
# (2 x 1 warps) copies a^T in rows at one k and b in blocks; in 128-bit chunks, its 32 x 32 tile
# both in blocks and the GPU's 128 x 64 (4 warps, 2 x 2) a^T in blocks and b in rows at one k. On a
# GPU every tile matmul_tf32x3 declares.
SIM, GPU = KMAJOR_TILES["sim"], KMAJOR_TILES["gpu"]
SHAPES = [(37, 42, 29, False, 16, (SIM[1],) if SIMULATOR else GPU),
          (36, 44, 28, True, 28, (SIM[0], GPU[0]) if SIMULATOR else GPU)]
TRANSPOSES = [(False, False), (True, False), (False, True), (True, True)]

ENGINE = {"tf32x3": make_tf32x3_tile, "fp16": make_fp16_tile}
LAB = {"tf32x3": functools.partial(make_split_tile, presplit=False, split_mode="trunc", swizzle=True),
       "fp16": functools.partial(make_split_tile, presplit=False, split_mode="round", swizzle=True, half="fp16")}


@functools.cache
def _kernel(make, tile, trans_a, trans_b):
    t = make(tile)
    mma, zero, store, TM, TN = t.mma[(trans_a, trans_b)], t.zero, t.store, t.TM, t.TN

    @cuda.jit
    def k_tile_product(work, a, b, ksplit):
        """work[z] = op(a)[:, kb:ke] @ op(b)[kb:ke, :] over K slice z = blockIdx.z, one tile per block."""
        acc = cuda.local.array((TM, TN), float32)
        zero(acc)
        K = a.shape[0] if trans_a else a.shape[1]
        z = cuda.blockIdx.z
        mma(acc, a, b, z * ksplit, min(K, (z + 1) * ksplit))
        store(work[z], acc, False)
    return k_tile_product, t


def _product(make, tile, trans_a, trans_b, a, b, M, N, K, ksplit):
    kernel, t = _kernel(make, tile, trans_a, trans_b)
    S = cdiv(K, ksplit)
    work = cuda.to_device(np.full((S, M, N), np.nan, np.float32))
    kernel[t.grid(M, N, S), t.THREADS](work, cuda.to_device(a), cuda.to_device(b), ksplit)
    return work.copy_to_host()


@pytest.mark.parametrize("family", ["tf32x3", "fp16"])
@pytest.mark.parametrize("trans_a, trans_b", TRANSPOSES)
def test_the_written_out_tiles_give_the_flag_built_tiles_bits(family, trans_a, trans_b):
    rng = np.random.default_rng(7)
    for M, N, K, vec, ksplit, blocks in SHAPES:
        a = rng.standard_normal((K, M) if trans_a else (M, K)).astype(np.float32)
        b = rng.standard_normal((N, K) if trans_b else (K, N)).astype(np.float32)
        opa, opb = (a.T if trans_a else a).astype(np.float64), (b.T if trans_b else b).astype(np.float64)
        if family == "fp16":       # fp16 inputs, exact products, fp32 sums
            opa, opb = round_fp16(opa.astype(np.float32)).astype(np.float64), round_fp16(opb.astype(np.float32)).astype(np.float64)
        slices = [slice(k, min(K, k + ksplit)) for k in range(0, K, ksplit)]
        ref = np.stack([opa[:, s] @ opb[s] for s in slices])
        # 3xTF32: about 2^-21 a product; either: fp32 sums of at most ksplit terms
        bound = ((2.0 ** -20 if family == "tf32x3" else 0.0) + ksplit * 2.0 ** -23) * \
            np.stack([np.abs(opa[:, s]) @ np.abs(opb[s]) for s in slices])
        for block in blocks:
            tile = (family, *block, vec)
            engine = _product(ENGINE[family], tile, trans_a, trans_b, a, b, M, N, K, ksplit)
            lab = _product(LAB[family], tile, trans_a, trans_b, a, b, M, N, K, ksplit)
            assert np.isfinite(engine).all(), (tile, M, N, K)
            assert np.array_equal(engine.view(np.uint32), lab.view(np.uint32)), (tile, M, N, K)
            assert (np.abs(engine - ref) <= bound).all(), (tile, M, N, K, np.abs(engine - ref).max())
