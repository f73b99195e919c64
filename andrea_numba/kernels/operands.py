"""The 16-bit copies of a product's operands, and the two scratch buffers that hold them.

A bf16 or fp16 product reads its operands rounded to 16 bits. They are rounded once, into copies
in a scratch buffer (OperandCopies, the process's one COPIES), by the kernels below:

    dst (flat, rows one after another) = round(src [R, C])          (round_into: k_round_*_v2)
    dst = round(src)^T, rows packed                                 (round_into_t: k_round_bf16_t_v1)

Who takes them: the bf16 products (matmul_bf16, matmul_bf16_wgmma and its cp.async ring:
half_tile.bf16_copies; the lab's matmul v14 and v15 take transposed copies, lab/matmul.py's
wgmma_copies), the linear ops on those products (the bf16 loss backward's dlogits written straight
into COPIES' first slot) and the library route (cublaslt.py: its bf16 and fp16 products round into
the same scratch). HELD (HeldCopies) keeps
a tensor that two products of a linear op read, rounded once (mlp, attn_qkv, attn_out).

This module sits at the bottom of the products: it imports only common.py and ptx.py, so every
product and op may import it. NumPy twin of the rounding: reference/precision.py (round_bf16,
round_fp16).
"""
from __future__ import annotations

import numpy as np
from numba import cuda, int64, uint16, uint32

from .common import SIMULATOR, address, cdiv
from .ptx import load4_row, store8

ALIGN = 128                         # elements (256 bytes) between the two 16-bit copies in the scratch

# ---------------------------------------------------------------------------------------------
# the 16-bit copies of a product's operands: dst (flat, rows one after another) = round(src [R, C])

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


# Version 2: eight values a thread, 128-bit loads and stores, a grid that strides over rows.
#
# Why v1 is slow (H200: 8192 x 3072 in 0.167 ms, 151 MB moved = 0.9 TB/s of the 4.8 the memory
# can do): a thread an element, so each thread moves 6 bytes, one 4-byte load and one 2-byte
# store; a warp's store instruction writes 64 bytes, and the GPU issues a load, a store and their
# int64 index arithmetic for every 6 bytes. Its grid is a block per 256 values of each row (8192 x
# 3072: 12 x 8192 = 98,304 blocks of 256 threads) and each thread handles one element: every
# block starts, moves 1.5 KB and ends, so starting blocks is likely a cost of its own.
#
# v2's threads (k_round_bf16_v2, k_round_fp16_v2, round_into):
#   thread x (blockIdx.x * blockDim.x + threadIdx.x) owns the 8 values j = 8x .. 8x + 7 of a row:
#       two 128-bit loads (32 bytes of fp32) and one 128-bit store (16 bytes of bf16 or fp16);
#       a warp reads 1,024 contiguous bytes and writes 512: every 32-byte sector whole
#   the blocks along x cover a row (blockDim.x a multiple of 32 sized so that none is mostly idle:
#       3072 values = 384 threads -> 2 blocks of 192, not 2 of 256 with 128 idle);
#   blockIdx.y starts at row blockIdx.y and strides gridDim.y rows: gridDim.y is set so the whole
#       grid is about ROUND_GRID_THREADS threads (half of what the H200's 132 multiprocessors hold,
#       2,048 each; ptxas gives v2 45 to 54 registers a thread, so 1,024 fit in a multiprocessor's
#       65,536), every thread looping over rows; 132 x 1,024 threads x 32 bytes in flight
#       = 4.3 MB, more than bandwidth x latency (4.8 TB/s x ~0.6 us = 2.9 MB).
# So 8192 x 3072 (151 MB moved: 101 MB read, 50 MB written) is 2 x 352 blocks of 192 threads,
# each thread 23 or 24 rows of 32 bytes in and 16 out.
# The 128-bit accesses need 16-byte aligned addresses: every row of src (its start and its row
# stride) and of dst (its start, and C % 8 == 0 so that its rows, C values apart, start on 16-byte
# boundaries too). round_into checks that on the host (round_wide) and passes `wide`; otherwise
# the same threads take their 8 values one by one, as v1 does (C odd, a view whose rows start
# anywhere), and so does a single row's ragged end.

@cuda.jit(device=True, inline=True)
def bf16_bits(b):
    """The bf16 bit pattern of the fp32 bit pattern b (uint32), all in 32-bit integers: k_round_bf16_v1's
    rounding (ties to even; NaN: the top half with the quiet bit 0x40 set). No carry leaves 32 bits:
    the largest b that is not NaN is -inf, 0xFF800000, and 0xFF800000 + 0x8000 < 2^32."""
    if (b & uint32(0x7FFFFFFF)) > uint32(0x7F800000):
        return uint16((b >> uint32(16)) | uint32(0x40))
    return uint16(uint32(b + uint32(0x7FFF) + ((b >> uint32(16)) & uint32(1))) >> uint32(16))


@cuda.jit
def k_round_bf16_v2(dst, src_bits, wide):
    """dst[i * C + j] = bf16(src[i, j]), bit for bit k_round_bf16_v1 (bf16_bits). Thread x rounds
    j = 8x .. 8x + 7 of rows blockIdx.y, blockIdx.y + gridDim.y, ... (layout above). wide (every
    row's chunks 16-byte aligned: round_wide): a whole chunk of 8 is two 128-bit loads and one
    128-bit store of eight bf16; otherwise, and for a ragged end, element by element."""
    R, C = src_bits.shape
    j = 8 * (cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x)
    if j < C:
        for i in range(cuda.blockIdx.y, R, cuda.gridDim.y):
            if wide and j + 8 <= C:
                b0, b1, b2, b3 = load4_row(src_bits, i, j)
                b4, b5, b6, b7 = load4_row(src_bits, i, j + 4)
                store8(dst, i * C + j, bf16_bits(b0), bf16_bits(b1), bf16_bits(b2), bf16_bits(b3),
                       bf16_bits(b4), bf16_bits(b5), bf16_bits(b6), bf16_bits(b7))
            else:
                for k in range(j, min(j + 8, C)):
                    dst[i * C + k] = bf16_bits(src_bits[i, k])


@cuda.jit
def k_round_fp16_v2(dst, src, wide):
    """dst[i * C + j] = fp16(src[i, j]) by the same conversion as k_round_fp16_v1 (cvt.rn.f16.f32
    on each value, so bit for bit v1, NaN included), the threads and paths of k_round_bf16_v2."""
    R, C = src.shape
    j = 8 * (cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x)
    if j < C:
        for i in range(cuda.blockIdx.y, R, cuda.gridDim.y):
            if wide and j + 8 <= C:
                x0, x1, x2, x3 = load4_row(src, i, j)
                x4, x5, x6, x7 = load4_row(src, i, j + 4)
                store8(dst, i * C + j, x0, x1, x2, x3, x4, x5, x6, x7)     # float32 -> float16 in store8
            else:
                for k in range(j, min(j + 8, C)):
                    dst[i * C + k] = src[i, k]



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

ROUND_THREADS = 4 if SIMULATOR else 256                 # threads a block (v1; v2: at most this)
ROUND_GRID_THREADS = 16 if SIMULATOR else 132 * 1024     # v2's grid, about (comment above v2)
ROUND_VERSIONS = {1: (k_round_bf16_v1, k_round_fp16_v1), 2: (k_round_bf16_v2, k_round_fp16_v2)}


def round_wide(dst, src) -> bool:
    """Whether v2 may move whole chunks of 8 values 16 bytes at a time: src's and dst's first
    elements on 16-byte boundaries, src's rows contiguous, and every later row's start on one too
    (src's row stride a multiple of 16 bytes, C % 8 == 0 so that dst's rows, C values apart, do
    too) or no later row (R == 1: its ragged end goes element by element)."""
    R, C = src.shape
    starts = address(src) % 16 == 0 and address(dst) % 16 == 0 and (C == 1 or src.strides[1] == 4)
    return starts and (R == 1 or (C % 8 == 0 and src.strides[0] % 16 == 0))


def round_grid(R: int, C: int, block_threads: int | None = None, grid_threads: int | None = None):
    """v2's launch: (grid, threads). x: ceil(C / 8) threads of 8 values over the fewest blocks of at
    most ROUND_THREADS, each a whole number of warps; y: rows, as many as make the grid about
    ROUND_GRID_THREADS threads (at least 1, at most R and 65,535), each block striding over rows.
    block_threads, grid_threads: other values of ROUND_THREADS and ROUND_GRID_THREADS (the GPU's,
    asked in the simulator)."""
    most = ROUND_THREADS if block_threads is None else block_threads
    about = ROUND_GRID_THREADS if grid_threads is None else grid_threads
    chunks = cdiv(C, 8)
    blocks_x = cdiv(chunks, most)
    threads = min(most, 32 * cdiv(cdiv(chunks, blocks_x), 32))
    rows = max(1, min(R, 65535, cdiv(about, blocks_x * threads)))
    return (blocks_x, rows), threads


def round_into(dst, src, precision, stream=0, version=2):
    """dst[:R*C] = src [R, C] rounded to bf16 (dst uint16: the bit patterns) or fp16 (dst float16).
    version 1: a thread an element (v1's grid); 2: eight a thread (round_grid, round_wide)."""
    R, C = src.shape
    if R == 0 or C == 0:
        return
    k_bf16, k_fp16 = ROUND_VERSIONS[version]
    kernel, arg = (k_bf16, src.view(np.uint32)) if precision == "bf16" else (k_fp16, src)
    if version == 1:
        kernel[(cdiv(C, ROUND_THREADS), min(R, 65535)), ROUND_THREADS, stream](dst, arg)
    else:
        grid, threads = round_grid(R, C)
        kernel[grid, threads, stream](dst, arg, round_wide(dst, src))


def _slot_b(a_elements: int) -> int:
    """Where b's copy starts in the scratch: after a's, on a 256-byte boundary."""
    return cdiv(a_elements, ALIGN) * ALIGN


class OperandCopies:
    """The scratch that holds the 16-bit copies of one product's two operands, for the library
    route (Library.matmul) and for matmul v13 (half_tile.bf16_copies): a's copy at element 0, b's
    on the next 256-byte boundary, rows packed. Launches run in stream order, so one scratch serves
    every product of a stream. It grows to the largest product seen; a model reserves its largest
    before its first step (linear_ops), since nothing may be allocated inside a graph capture."""

    def __init__(self):
        self.buf = None

    def reserve(self, a_elements: int, b_elements: int):
        need = _slot_b(a_elements) + b_elements
        if self.buf is None or self.buf.size < need:
            self.buf = cuda.device_array(need, dtype=np.uint16)

    def first(self, rows: int, cols: int):
        """The slot of a's copy as a uint16 [rows, cols] array (rows packed): where a producer writes
        an operand in bf16 itself, which the product then takes as it is (loss_bwd v13's dlogits).
        The caller reserves room first (reserve), b's slot after it."""
        return self.buf[:rows * cols].reshape(rows, cols)

    def round(self, a, b, precision: str, stream=0, transpose=(False, False)):
        """(a16, b16): a and b [rows, cols] rounded to bf16 (uint16 bit patterns) or fp16 (float16),
        each flat, rows packed (round_into: k_round_bf16_v2 / k_round_fp16_v2, ties to even). An operand that
        holds 16-bit values of the precision already (uint16 for bf16: an activation a model saved
        rounded, gpu_model.SAVED16) is not copied: it is returned flat, as it is.
        transpose (bf16 only; the lab's matmul v14, v15): for a and b, whether the copy holds the
        operand's transpose ([cols, rows], round_into_t); a transposed uint16 operand is copied (its
        bits moved)."""
        self.reserve(a.size, b.size)
        view = self.buf if precision == "bf16" else self.buf.view(np.float16)
        slots = view[:a.size], view[_slot_b(a.size):_slot_b(a.size) + b.size]
        out = []
        for x, slot, t in zip((a, b), slots, transpose):
            if t:
                assert precision == "bf16", "transposed copies are bf16 only"
                round_into_t(slot, x, stream)
                out.append(slot)
            elif x.dtype == slot.dtype:
                out.append(x.reshape(x.size))
            else:
                round_into(slot, x, precision, stream)
                out.append(slot)
        return tuple(out)


COPIES = OperandCopies()        # the process's one scratch of 16-bit operand copies


class HeldCopies:
    """The scratch where a linear op keeps the bf16 copy of a tensor that two of its products read
    (the MLP's dout and dh_pre, attn_qkv's dq, dk, dv, attn_out's dout, on matmul_bf16_wgmma),
    rounded once where each product would round it again. The products never write here (their own
    copies go to COPIES), so a held copy stays whole while they run. One tensor at a time, in stream
    order; grown as COPIES is, reserved by a model before its first step (held_elements)."""

    def __init__(self):
        self.buf = None

    def reserve(self, elements: int):
        if self.buf is None or self.buf.size < elements:
            self.buf = cuda.device_array(elements, dtype=np.uint16)

    def view(self, rows: int, cols: int):
        """The scratch's first rows x cols elements as a uint16 [rows, cols] array (rows packed)."""
        self.reserve(rows * cols)
        return self.buf[:rows * cols].reshape(rows, cols)

    def round(self, x, stream=0):
        """x [R, C] rounded to bf16 (ties to even) into the scratch, as a uint16 [R, C] array; an x
        that is uint16 (bf16 already) as it is."""
        if x.dtype == np.uint16:
            return x
        held = self.view(*x.shape)
        round_into(held.reshape(held.size), x, "bf16", stream)
        return held


HELD = HeldCopies()             # ... and its one scratch of tensors rounded once for two products


def held_elements(N: int, C: int) -> int:
    """The most elements a held copy has, for N = B*T rows and width C: dh_pre [N, 4C]."""
    return N * 4 * C


def operand_elements(N: int, C: int, V: int) -> tuple[int, int]:
    """The most elements an a and a b operand of the linear ops' products have, for N = B*T rows,
    width C (the MLP's 4C) and vocabulary V: a = dlogits [N, V] (or h [N, 4C]), b = wte [V, C]
    (or dh_pre [N, 4C], the MLP's dW_1 product)."""
    return N * max(V, 4 * C), max(V * C, N * 4 * C)


def scratch_bytes(precision: str, N: int, C: int, V: int) -> int:
    """Bytes of the 16-bit copies' scratch that a model of these sizes reserves (none in fp32)."""
    if precision == "fp32":
        return 0
    a, b = operand_elements(N, C, V)
    return 2 * (_slot_b(a) + b)


