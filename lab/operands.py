"""The lab's rungs of andrea_numba/kernels/operands.py: the 16-bit operand copies the engine does not
run, beside the engine's own (imported from the engine module), and ROUND_VERSIONS:

    v1   k_round_bf16_v1, k_round_fp16_v1: a thread an element (the first copies)
    v2   the engine's k_round_bf16, k_round_fp16: eight values a thread, 128-bit loads and stores
    k_round_bf16_t_v1   the transposed bf16 copy of matmul v14 and v15 (round_into_t, round_copies)

    round_into(dst, src, precision, stream, version)    either rung of the plain copy
    round_copies(a, b, stream, transpose)               COPIES' bf16 copies, each as stored or transposed
"""
import numpy as np
from numba import cuda, int64, uint16, uint32

from andrea_numba.kernels.common import SIMULATOR, cdiv
from andrea_numba.kernels.operands import *  # noqa: F401,F403  (the engine's copies and helpers)
from andrea_numba.kernels.operands import (COPIES, ROUND_THREADS, bf16_bits, k_round_bf16, k_round_fp16,
                                           round_into as round_into_v2)

# ---------------------------------------------------------------------------------------------
# v1: a thread an element

@cuda.jit
def k_round_bf16_v1(dst, src_bits):
    """dst[i * C + j] = bf16(src[i, j]) with ties to even, on the bit pattern (reference/precision.py:
    round_bf16): add 0x7FFF plus the lowest kept bit, keep the high 16 bits; NaN stays NaN.
    src_bits: the fp32 operand seen as uint32 [R, C] (rows may be strided), dst: uint16 [>= R*C].
    A thread an element, x along a row (coalesced), rows over y (strided past 65,535 rows)."""
    j = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
    R, C = src_bits.shape
    if j < C:
        for i in range(cuda.blockIdx.y, R, cuda.gridDim.y):
            b = int64(src_bits[i, j])
            if (b & 0x7FFFFFFF) > 0x7F800000:                 # NaN: keep it a (quiet) NaN
                dst[i * C + j] = uint16((b >> 16) | 0x40)
            else:
                dst[i * C + j] = uint16((b + 0x7FFF + ((b >> 16) & 1)) >> 16)


@cuda.jit
def k_round_fp16_v1(dst, src):
    """dst[i * C + j] = fp16(src[i, j]): the conversion rounds to nearest, ties to even (past 65504:
    inf; below 6.1e-5 the subnormals); dst: float16 [>= R*C]. The same threads as k_round_bf16_v1."""
    j = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
    R, C = src.shape
    if j < C:
        for i in range(cuda.blockIdx.y, R, cuda.gridDim.y):
            dst[i * C + j] = src[i, j]                           # float32 -> float16: cvt.rn.f16.f32


# v2, the engine's k_round_bf16 and k_round_fp16 (operands.py): eight values a thread, 128-bit loads
# and stores, a grid that strides over rows (the layout is described there). Bit for bit v1.
#
# Why v1 is slow (H200: 8192 x 3072 in 0.167 ms, 151 MB moved = 0.9 TB/s of the 4.8 the memory
# can do): a thread an element, so each thread moves 6 bytes, one 4-byte load and one 2-byte
# store; a warp's store instruction writes 64 bytes, and the GPU issues a load, a store and their
# int64 index arithmetic for every 6 bytes. Its grid is a block per 256 values of each row (8192 x
# 3072: 12 x 8192 = 98,304 blocks of 256 threads) and each thread handles one element: every
# block starts, moves 1.5 KB and ends, so starting blocks is likely a cost of its own.
ROUND_VERSIONS = {1: (k_round_bf16_v1, k_round_fp16_v1), 2: (k_round_bf16, k_round_fp16)}


def round_into(dst, src, precision, stream=0, version=2):
    """dst[:R*C] = src [R, C] rounded to bf16 (dst uint16: the bit patterns) or fp16 (dst float16).
    version 1: a thread an element (v1's grid); 2: the engine's round_into (eight a thread)."""
    R, C = src.shape
    if version == 2:
        round_into_v2(dst, src, precision, stream)
        return
    if R == 0 or C == 0:
        return
    k_bf16, k_fp16 = ROUND_VERSIONS[version]
    kernel, arg = (k_bf16, src.view(np.uint32)) if precision == "bf16" else (k_fp16, src)
    kernel[(cdiv(C, ROUND_THREADS), min(R, 65535)), ROUND_THREADS, stream](dst, arg)


# ---------------------------------------------------------------------------------------------
# The transposed copy (the lab's matmul v14 and v15, lab/wgmma_tile.py: their wgmma reads both
# operands K-major, so an operand stored with k down its columns, b [K, N] of x @ W or a^T [K, M] of
# a weight gradient, is rounded into a copy of its transpose). A plain thread-an-element transpose reads along rows and
# writes down columns (one 2-byte write in every row: 32 rows a warp, uncoalesced). So the copy
# goes through shared memory a 32 x 32 tile at a time (Harris, "An Efficient Matrix Transpose in
# CUDA C/C++"), block (32, 8):
#     read   thread (x, y) rounds src[i0 + y + 8 q, j0 + x], q = 0..3: a warp reads 32 consecutive
#            values of one row (128 bytes), and stores them in row y + 8 q of the tile
#     barrier
#     write  thread (x, y) writes dst[j0 + y + 8 q, i0 + x] = tile[x, y + 8 q]: a warp writes 32
#            consecutive values of one row of dst (64 bytes)
# The tile holds the bf16 bits in 32-bit words with rows of 33: the column read tile[x, y + 8 q]
# (32 lanes, 33 words apart) hits 32 different banks, as does the row write.
T_TILE = 8 if SIMULATOR else 32          # the tile's side (the simulator runs every thread: small)
T_ROWS = 2 if SIMULATOR else 8           # threads along y: each T_TILE / T_ROWS rows of the tile
T_GRID_Y = 65535                         # blocks along y at most (rows of tiles stride past it)
T_PITCH = T_TILE + 1                     # the shared tile's row: one word more (the column reads' banks)


@cuda.jit
def k_round_bf16_t_v1(dst, src_bits, rnd):
    """dst[j * R + i] = bf16(src[i, j]) (rnd: src_bits the fp32 operand seen as uint32, rounded by
    bf16_bits, bit for bit k_round_bf16_v1) or = src[i, j] (not rnd: src_bits already bf16, uint16:
    a transpose of the bits). src_bits [R, C] (rows may be strided), dst uint16 [>= R * C]: the
    transpose [C, R], rows packed. Block (T_TILE, T_ROWS), one T_TILE x T_TILE tile of src a block
    along x, tiles of rows over y (striding past 65,535), through shared memory (comment above)."""
    tile = cuda.shared.array((T_TILE, T_PITCH), uint32)
    R, C = src_bits.shape
    x, y = cuda.threadIdx.x, cuda.threadIdx.y
    j0 = cuda.blockIdx.x * T_TILE
    for i0 in range(cuda.blockIdx.y * T_TILE, R, cuda.gridDim.y * T_TILE):
        for q in range(y, T_TILE, T_ROWS):                   # read: rows i0 + q, columns j0 + x
            i, j = i0 + q, j0 + x
            if i < R and j < C:
                tile[q, x] = bf16_bits(uint32(src_bits[i, j])) if rnd else uint32(src_bits[i, j])
        cuda.syncthreads()
        for q in range(y, T_TILE, T_ROWS):                   # write: rows j0 + q of dst, columns i0 + x
            j, i = j0 + q, i0 + x
            if j < C and i < R:
                dst[j * R + i] = uint16(tile[x, q])
        cuda.syncthreads()                                    # the tile is read before the next rows


def round_into_t(dst, src, stream=0):
    """dst[:R*C] = src [R, C] transposed, [C, R] rows packed, in bf16 bit patterns (dst uint16):
    src float32 rounded (ties to even) or src uint16 (bf16 already) moved as it is."""
    R, C = src.shape
    if R == 0 or C == 0:
        return
    rnd = src.dtype != np.uint16
    grid = (cdiv(C, T_TILE), min(cdiv(R, T_TILE), T_GRID_Y))
    k_round_bf16_t_v1[grid, (T_TILE, T_ROWS), stream](dst, src.view(np.uint32) if rnd else src, rnd)


def round_copies(a, b, stream=0, transpose=(False, False)):
    """(a16, b16): a and b [rows, cols] in bf16 in COPIES' two slots, each flat, rows packed: for a
    and b, whether the copy holds the operand's transpose ([cols, rows], round_into_t; a uint16
    operand has its bits moved) or the operand as stored (COPIES.round's: rounded by k_round_bf16,
    a uint16 operand used where it is)."""
    out = []
    for x, slot, t in zip((a, b), COPIES.slots(a, b, "bf16"), transpose):
        if t:
            round_into_t(slot, x, stream)
            out.append(slot)
        elif x.dtype == slot.dtype:
            out.append(x.reshape(x.size))
        else:
            round_into_v2(slot, x, "bf16", stream)
            out.append(slot)
    return tuple(out)
