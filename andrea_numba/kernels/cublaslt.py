"""The library route: the linear ops' products through cuBLASLt, NVIDIA's matrix-product library.

Every product of the ladder in matmul.py is a kernel of ours. This module runs the same products
through the library that frameworks call (PyTorch's matmuls are cuBLAS/cuBLASLt), on the engine's
own device buffers, so that one harness checks both and one table times both: the reference that
our kernels are measured against, and the route the original engine took for its products.

    out (+)= op(a) @ op(b)        a, b, out: float32 device arrays, row major (the engine's buffers)

Precision:
    fp32   the operands as they are, CUBLAS_COMPUTE_32F: fp32 products and sums (no TF32), an SGEMM
    bf16   each operand first rounded to bf16 (ties to even) into a scratch copy by k_round_bf16_v2
           below (round_into), then a bf16 x bf16 product with fp32 sums and an fp32 output: the
           products of matmul v10 (the twin at "bf16" rounds the same inputs the same way)
    fp16   the same with fp16 copies (k_round_fp16_v2; matmul v11)
so the harness checks the bf16 and fp16 forms against the twin at that precision, as it checks
our own bf16 kernels (check.py, low_precision_reference). Why not hand cuBLAS the fp32 operands
with CUBLAS_COMPUTE_32F_FAST_16BF ("down-convert to bf16 as you go")? On the H200 (cuBLASLt 13.1,
2026-12-02) that ran TF32 kernels instead: errors 3e-4 of the output's scale where bf16 inputs
give 2.4e-3, the same kernels for FAST_16F, and 310-390 TFLOP/s where bf16 products run 580-790.
The library may pick any precision at least as good; the harness then compares unlike with like.

Row major against column major. cuBLAS stores matrices column by column (Fortran's order); our
buffers are row major. A row-major [R, C] array with row stride ld is, read column-major, the
matrix's transpose: [C, R] with leading dimension ld. So out = op(a) @ op(b) (row major, [M, N])
is, column-major, out^T = op(b)^T @ op(a)^T ([N, M]): cuBLAS is asked for D = op(A') op(B') with
A' = b and B' = a, swapped, each transposed by cuBLAS exactly when we did not transpose it
(lt_operands below; a test replays it with NumPy).

Determinism. A cuBLASLt product is bit-identical from run to run when the same algorithm runs
with the same workspace on the same GPU and library version. The first call of each shape asks
the library's heuristic for its best algorithm once, with a fixed workspace and with the
"in place" split-K reduction excluded (it adds the slices' partial sums into the output, with
counters in the workspace ordering them); algorithms that reduce slices in a workspace and then
in a separate kernel stay allowed. That plan is kept for the process: every later call of the
shape runs that algorithm. The library version goes into the trainer's run state.

Needs nvmath-python (NVIDIA's Python bindings of the CUDA math libraries: `pip install -e
".[cublas]"`) and a GPU; the simulator cannot run it (unavailable() says why, in one line).
"""
from __future__ import annotations

import functools
import importlib.util

import numpy as np
from numba import cuda, int64, uint16, uint32

from ..config import ConfigError
from .common import SIMULATOR, address, cdiv
from .ptx import load4_row, store8

WORKSPACE_BYTES = 32 << 20          # cuBLASLt's scratch for every product (NVIDIA suggests 32 MiB on Hopper)
PRECISIONS = ("fp32", "bf16", "fp16")
OPERAND_TYPE = {"fp32": "CUDA_R_32F", "bf16": "CUDA_R_16BF", "fp16": "CUDA_R_16F",   # of A and B (C, D: fp32)
                "e4m3": "CUDA_R_8F_E4M3", "e5m2": "CUDA_R_8F_E5M2"}                # (FP8: kernels/fp8_products.py)
VERSION_OF = {"fp32": 20, "bf16": 21, "fp16": 22}   # matmul's version numbers of the library route
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



# The transposed copy (matmul v14, kernels/wgmma_tile.py): wgmma reads both operands K-major, so an
# operand stored with k down its columns (b [K, N] of x @ W, a^T [K, M] of a weight gradient) is
# rounded into a copy of its transpose. A plain thread-an-element transpose reads along rows and
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


def round_grid(R: int, C: int):
    """v2's launch: (grid, threads). x: ceil(C / 8) threads of 8 values over the fewest blocks of at
    most ROUND_THREADS, each a whole number of warps; y: rows, as many as make the grid about
    ROUND_GRID_THREADS threads (at least 1, at most R and 65,535), each block striding over rows."""
    chunks = cdiv(C, 8)
    blocks_x = cdiv(chunks, ROUND_THREADS)
    threads = min(ROUND_THREADS, 32 * cdiv(cdiv(chunks, blocks_x), 32))
    rows = max(1, min(R, 65535, cdiv(ROUND_GRID_THREADS, blocks_x * threads)))
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
        transpose (bf16 only; matmul v14): for a and b, whether the copy holds the operand's
        transpose ([cols, rows], round_into_t); a transposed uint16 operand is copied (its bits moved)."""
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
    (products "bf16r" and "bf16m": the MLP's dout and dh_pre, attn_qkv's dq, dk, dv, attn_out's dout),
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


class LibraryUnavailable(ConfigError):
    """cuBLASLt cannot run here; str(err) is one line: why, and what to do."""


def unavailable() -> str | None:
    """Why the cuBLASLt route cannot run in this process (None: it can)."""
    if SIMULATOR:
        return "cuBLASLt products need a GPU: the CUDA simulator cannot run a library (use --products numba)"
    if importlib.util.find_spec("nvmath") is None:
        return 'cuBLASLt products need nvmath-python: pip install -e ".[cublas]" (or use --products numba)'
    return None


def require():
    reason = unavailable()
    if reason:
        raise LibraryUnavailable(reason)


def lt_operands(M: int, N: int, K: int, trans_a: bool, trans_b: bool, lda: int, ldb: int, ldc: int) -> dict:
    """The column-major call that computes row-major out[M, N] = op(a) @ op(b) (module docstring).
    lda, ldb, ldc: the row strides of a, b and out in elements. Returns cuBLAS's view:
    D[m, n] = op_A(A)[m, k] op_B(B)[k, n], A = b's memory, B = a's, each (rows, cols, ld) as stored."""
    return {"m": N, "n": M, "k": K,
            "trans_A": trans_b, "A": (K, N, ldb) if trans_b else (N, K, ldb),    # b stored [N, K] or [K, N]
            "trans_B": trans_a, "B": (M, K, lda) if trans_a else (K, M, lda),    # a stored [K, M] or [M, K]
            "D": (N, M, ldc)}


def _alignment(ptr: int) -> int:
    """The largest power of two (at most 256) that divides a device address: what the plan may assume."""
    a = 256
    while ptr % a:
        a //= 2
    return a


def _stream_pointer(stream) -> int:
    """A CUstream address from a numba stream, a cuda.core GraphBuilder (the trainer's graph capture:
    cuBLASLt is then recorded into the graph like our kernels) or 0 (the default stream)."""
    if not stream:
        return 0
    stream = getattr(stream, "stream", stream)          # a GraphBuilder: the stream it captures
    handle = stream.handle
    return int(getattr(handle, "value", handle) or 0)   # ctypes c_void_p or a cuda.bindings CUstream


def _row_stride(arr, name) -> int:
    """The row stride of a 2-D float32 array whose rows are contiguous, in elements."""
    if arr.ndim != 2 or arr.dtype != np.float32 or (arr.shape[1] > 1 and arr.strides[1] != 4):
        raise ValueError(f"cuBLASLt products take 2-D float32 arrays with contiguous rows: {name} "
                         f"is {arr.dtype} {arr.shape} with strides {arr.strides}")
    return max(arr.strides[0] // 4, arr.shape[1], 1)


class Library:
    """One cuBLASLt handle, its workspace (allocated here, before any step) and the plans of the
    shapes seen so far: (precision, shape, transposes, strides, alignments) -> (descriptors,
    algorithm). The bf16 and fp16 products round their operands into COPIES first."""

    def __init__(self):
        require()
        from nvmath.bindings import cublas, cublasLt
        self.lt, self.cublas = cublasLt, cublas
        self.handle = cublasLt.create()
        self.version = int(cublasLt.get_version())
        self.workspace = cuda.device_array(WORKSPACE_BYTES, dtype=np.uint8)
        self.plans = {}
        self.one, self.zero = np.ones(1, np.float32), np.zeros(1, np.float32)    # alpha, beta (host)

    def _set(self, setter, obj, attr, value, dtype_of):
        buf = np.array([value], dtype=dtype_of(attr))
        setter(obj, attr, buf.ctypes.data, buf.nbytes)

    def plan(self, precision, op: dict, aligns: tuple, types=None, scales=None) -> tuple:
        """(descriptor, layouts, algorithm) of a product: operands of `precision` (OPERAND_TYPE), or of
        the two types (A's, B's: cuBLAS's A is our b) that `types` names (FP8: "e4m3", "e5m2"), with
        `scales` (FP8: the device addresses of A's and B's descales) set before the heuristic picks
        an algorithm, so that it picks one that scales."""
        import nvmath
        lt, D, P = self.lt, self.lt.MatmulDescAttribute, self.lt.MatmulPreferenceAttribute
        cdt = nvmath.CudaDataType
        f32 = int(cdt.CUDA_R_32F)
        type_a, type_b = (int(getattr(cdt, OPERAND_TYPE[t])) for t in (types or (precision, precision)))
        desc = lt.matmul_desc_create(int(self.cublas.ComputeType.COMPUTE_32F), f32)     # fp32 sums, fp32 alpha/beta
        op_of = {False: int(self.cublas.Operation.N), True: int(self.cublas.Operation.T)}
        self._set(lt.matmul_desc_set_attribute, desc, D.TRANSA, op_of[op["trans_A"]], lt.get_matmul_desc_attribute_dtype)
        self._set(lt.matmul_desc_set_attribute, desc, D.TRANSB, op_of[op["trans_B"]], lt.get_matmul_desc_attribute_dtype)
        if scales:
            for attr, ptr in zip((D.A_SCALE_POINTER, D.B_SCALE_POINTER), scales):
                self._set(lt.matmul_desc_set_attribute, desc, attr, ptr, lt.get_matmul_desc_attribute_dtype)
        layouts = [lt.matrix_layout_create(type_a, *op["A"]), lt.matrix_layout_create(type_b, *op["B"]),
                   lt.matrix_layout_create(f32, *op["D"])]
        pref = lt.matmul_preference_create()
        dt = lt.get_matmul_preference_attribute_dtype
        self._set(lt.matmul_preference_set_attribute, pref, P.MAX_WORKSPACE_BYTES, WORKSPACE_BYTES, dt)
        allowed = int(lt.ReductionScheme.COMPUTE_TYPE) | int(lt.ReductionScheme.OUTPUT_TYPE)   # not INPLACE
        self._set(lt.matmul_preference_set_attribute, pref, P.REDUCTION_SCHEME_MASK, allowed, dt)
        for attr, align in zip((P.MIN_ALIGNMENT_A_BYTES, P.MIN_ALIGNMENT_B_BYTES, P.MIN_ALIGNMENT_C_BYTES,
                                P.MIN_ALIGNMENT_D_BYTES), aligns):
            self._set(lt.matmul_preference_set_attribute, pref, attr, align, dt)
        found = lt.MatmulHeuristicResult(1)
        count = np.zeros(1, np.int32)
        lt.matmul_algo_get_heuristic(self.handle, desc, layouts[0], layouts[1], layouts[2], layouts[2], pref, 1,
                                     found.ptr, count.ctypes.data)
        lt.matmul_preference_destroy(pref)
        if count[0] < 1:
            raise LibraryUnavailable(f"cuBLASLt {self.version} has no algorithm for a {precision} product of "
                                     f"shape {op}: use --products numba")
        return desc, layouts, found               # found.ptr: its first member is the algorithm

    def matmul(self, out, a, b, trans_a, trans_b, accumulate, precision, stream):
        M, N = out.shape
        K = a.shape[0] if trans_a else a.shape[1]
        assert (b.shape[1] if trans_b else b.shape[0]) == K and (a.shape[1] if trans_a else a.shape[0]) == M \
            and (b.shape[0] if trans_b else b.shape[1]) == N, f"shapes {a.shape} {b.shape} -> {out.shape}"
        lda, ldb = _row_stride(a, "a"), _row_stride(b, "b")
        if precision != "fp32":                   # the operands' 16-bit copies, rows packed
            lda, ldb = a.shape[1], b.shape[1]
            a, b = COPIES.round(a, b, precision, stream)
        op = lt_operands(M, N, K, bool(trans_a), bool(trans_b), lda, ldb, _row_stride(out, "out"))
        ptr_a, ptr_b, ptr_out = address(a), address(b), address(out)
        aligns = (_alignment(ptr_b), _alignment(ptr_a), _alignment(ptr_out), _alignment(ptr_out))
        key = (precision, tuple(sorted((k, v) for k, v in op.items())), aligns)
        if key not in self.plans:
            self.plans[key] = self.plan(precision, op, aligns)
        desc, (la, lb, ld), found = self.plans[key]
        beta = self.one if accumulate else self.zero
        self.lt.matmul(self.handle, desc, self.one.ctypes.data, ptr_b, la, ptr_a, lb, beta.ctypes.data,
                       ptr_out, ld, ptr_out, ld, found.ptr, address(self.workspace), WORKSPACE_BYTES,
                       _stream_pointer(stream))


    def matmul_fp8(self, out, qa, qb, accumulate, stream):
        """out (+)= (qa's values) @ (qb's values)^T: qa [M, lda] and qb [N, ldb] FP8 operands, both
        K-major (kernels/fp8_products.py's Quant: codes, format, K, the device address of its
        descale), an fp32 product D = descale_a descale_b (A_q B_q) with fp32 sums: cuBLASLt's "TN"
        FP8 form (column-major D^T = B'^T A' with A' = qb transposed, B' = qa), the only one Hopper
        has. Each call points the plan's A and B scale pointers at the operands' descales."""
        M, N = out.shape
        K = qa.codes.shape[1]                     # padded to 16 bytes with zeros, which add nothing
        assert qb.k == qa.k and qb.codes.shape[1] == K and qa.codes.shape[0] == M and qb.codes.shape[0] == N, \
            f"FP8 operands {qa.codes.shape} {qb.codes.shape} (K = {qa.k}, {qb.k}) -> {out.shape}"
        op = lt_operands(M, N, K, False, True, K, K, _row_stride(out, "out"))
        ptr_a, ptr_b, ptr_out = address(qa.codes), address(qb.codes), address(out)
        aligns = (_alignment(ptr_b), _alignment(ptr_a), _alignment(ptr_out), _alignment(ptr_out))
        types = (qb.fmt, qa.fmt)                  # cuBLAS's A is our b
        key = ("fp8", types, tuple(sorted((k, v) for k, v in op.items())), aligns)
        if key not in self.plans:
            self.plans[key] = self.plan("fp8", op, aligns, types, (qb.descale, qa.descale))
        desc, (la, lb, ld), found = self.plans[key]
        D, dt = self.lt.MatmulDescAttribute, self.lt.get_matmul_desc_attribute_dtype
        self._set(self.lt.matmul_desc_set_attribute, desc, D.A_SCALE_POINTER, qb.descale, dt)
        self._set(self.lt.matmul_desc_set_attribute, desc, D.B_SCALE_POINTER, qa.descale, dt)
        beta = self.one if accumulate else self.zero
        self.lt.matmul(self.handle, desc, self.one.ctypes.data, ptr_b, la, ptr_a, lb, beta.ctypes.data,
                       ptr_out, ld, ptr_out, ld, found.ptr, address(self.workspace), WORKSPACE_BYTES,
                       _stream_pointer(stream))


@functools.cache
def library() -> Library:
    """The process's cuBLASLt handle and workspace (made at the first call: GPUModel makes it at setup)."""
    return Library()


def version() -> int:
    """cuBLASLt's version number (e.g. 130100 for 13.1.0), for run states and tables."""
    return library().version


# While andrea_numba.precompile records a step's launches (nothing may run), a product is skipped.
RECORDING = False


def _make_matmul(precision):
    def launch(out, work, a, b, trans_a=False, trans_b=False, accumulate=False, *, block=None, stream=0):
        if not RECORDING:
            library().matmul(out, a, b, trans_a, trans_b, accumulate, precision, stream)
    launch.__name__ = launch.__qualname__ = f"matmul_v{VERSION_OF[precision]}"
    launch.__doc__ = (f"out (+)= op(a) @ op(b) through cuBLASLt, {OPERAND_TYPE[precision]} operands, fp32 sums "
                      f"(work and block unused: the library picks its own tiles and split).")
    launch.blocks = ("cublasLt",)
    if precision != "fp32":
        launch.precision = precision
    return launch


MATMUL = {p: _make_matmul(p) for p in PRECISIONS}


def matmul_versions() -> dict:
    """{version: launcher} of the library route for matmul.VERSIONS: 20 (fp32), 21 (bf16), 22 (fp16),
    where it can run (on a GPU with nvmath-python); none elsewhere (the simulator, CI)."""
    return {} if unavailable() else {VERSION_OF[p]: MATMUL[p] for p in PRECISIONS}


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


def linear_ops(precision: str, N: int, C: int, V: int):
    """GPUModel's five linear-op launchers with every product through cuBLASLt at `precision`, for
    N = B*T rows, width C and vocabulary V (the 16-bit scratch reserved here, before any step); the
    GELU passes, the softmax and the loss are the engine's own kernels (mlp v12's, loss v9's). Same
    arguments and meaning as the engine's launchers (kernels/attn_qkv.py, attn_out.py, mlp.py,
    loss.py); the work buffers go unused (the library splits K itself, in its workspace)."""
    require()
    library()                                    # the handle and workspace, before the first step
    if precision != "fp32":                      # and the copies' scratch
        COPIES.reserve(*operand_elements(N, C, V))
    from . import loss as L
    from .mlp import gelu_bwd_v2, gelu_fwd_v2
    mm = MATMUL[precision]

    def attn_qkv_fwd(q, k, v, x, w_q, w_k, w_v, *, stream=0):
        """q, k, v = x @ W_q, x @ W_k, x @ W_v"""
        for out, w in ((q, w_q), (k, w_k), (v, w_v)):
            mm(out, None, x, w, stream=stream)

    def attn_qkv_bwd(dx, dw_q, dw_k, dw_v, work, dq, dk, dv, x, w_q, w_k, w_v, *, stream=0):
        """dx = dq W_q^T + dk W_k^T + dv W_v^T (three products into one buffer); dW_* += x^T d*"""
        for i, (d, w) in enumerate(((dq, w_q), (dk, w_k), (dv, w_v))):
            mm(dx, None, d, w, trans_b=True, accumulate=i > 0, stream=stream)
        for dw, d in ((dw_q, dq), (dw_k, dk), (dw_v, dv)):
            mm(dw, None, x, d, trans_a=True, accumulate=True, stream=stream)

    def attn_out_fwd(out, y, w_o, *, stream=0):
        mm(out, None, y, w_o, stream=stream)

    def attn_out_bwd(dy, dw_o, work, dout, y, w_o, *, stream=0):
        mm(dy, None, dout, w_o, trans_b=True, stream=stream)                      # dy = dout W_O^T
        mm(dw_o, None, y, dout, trans_a=True, accumulate=True, stream=stream)     # dW_O += y^T dout

    def mlp_fwd(out, h_pre, h, work, x, w_1, w_2, *, stream=0):
        N, F = h.shape
        mm(h_pre, None, x, w_1, stream=stream)                                    # h_pre = x W_1
        gelu_fwd_v2(h.reshape(N * F), h_pre.reshape(N * F), stream)               # h = gelu(h_pre)
        mm(out, None, h, w_2, stream=stream)                                      # out = h W_2

    def mlp_bwd(dx, dw_1, dw_2, dh_pre, work, dout, x, h_pre, h, w_1, w_2, *, stream=0):
        N, F = h.shape
        mm(dw_2, None, h, dout, trans_a=True, accumulate=True, stream=stream)     # dW_2 += h^T dout
        mm(dh_pre, None, dout, w_2, trans_b=True, stream=stream)                  # dh = dout W_2^T
        gelu_bwd_v2(dh_pre.reshape(N * F), h_pre.reshape(N * F), stream)          # dh_pre = dh gelu'(h_pre)
        mm(dw_1, None, x, dh_pre, trans_a=True, accumulate=True, stream=stream)   # dW_1 += x^T dh_pre
        mm(dx, None, dh_pre, w_1, trans_b=True, stream=stream)                    # dx = dh_pre W_1^T

    def loss_fwd(loss, losses, probs, x, wte, targets, *, stream=0):
        N, V = probs.shape
        mm(probs, None, x, wte, trans_b=True, stream=stream)                      # logits = x wte^T, into probs
        L.k_loss_fwd_v1[N, L.row_threads(V, 1024), stream](losses, probs, targets)
        L.k_loss_mean_v1[1, L.MEAN_THREADS, stream](loss, losses)

    def loss_bwd(dx, dwte, dlogits, work, dloss, x, wte, probs, targets, *, stream=0):
        N, V = probs.shape
        L.k_loss_bwd_v1[N, 256, stream](dlogits, probs, targets, np.float32(float(dloss) / N))
        mm(dx, None, dlogits, wte, stream=stream)                                 # dx = dlogits wte
        mm(dwte, None, dlogits, x, trans_a=True, accumulate=True, stream=stream)  # dwte += dlogits^T x

    ops = dict(attn_qkv_fwd=attn_qkv_fwd, attn_qkv_bwd=attn_qkv_bwd, attn_out_fwd=attn_out_fwd,
               attn_out_bwd=attn_out_bwd, mlp_fwd=mlp_fwd, mlp_bwd=mlp_bwd, loss_fwd=loss_fwd, loss_bwd=loss_bwd)
    for f in ops.values():
        if precision != "fp32":
            f.precision = precision
    return ops
