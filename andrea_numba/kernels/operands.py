"""The 16-bit copies of a product's operands, and the two scratch buffers that hold them.

A bf16 or fp16 product reads its operands rounded to 16 bits. They are rounded once, into copies
in a scratch buffer (OperandCopies, the process's one COPIES), by the kernels below:

    dst (flat, rows one after another) = round(src [R, C])      (round_into: k_round_bf16, k_round_fp16)

Who takes them: the bf16 products (matmul_bf16, matmul_bf16_wgmma and its cp.async ring:
half_tile.bf16_copies; the lab's matmul v14 and v15 take transposed copies, lab/operands.py), the
linear ops on those products (the bf16 loss backward's dlogits written straight
into COPIES' first slot) and the library route (cublaslt.py: its bf16 and fp16 products round into
the same scratch). HELD (HeldCopies) keeps
a tensor that two products of a linear op read, rounded once (mlp, attn_qkv, attn_out).

This module sits at the bottom of the products: it imports only common.py and ptx.py, so every
product and op may import it. NumPy twin of the rounding: reference/precision.py (round_bf16,
round_fp16).
"""
from __future__ import annotations

import numpy as np
from numba import cuda, uint16, uint32

from .common import SIMULATOR, address, cdiv
from .ptx import load4_row, store8

ALIGN = 128                         # elements (256 bytes) between the two 16-bit copies in the scratch

# ---------------------------------------------------------------------------------------------
# the 16-bit copies of a product's operands: dst (flat, rows one after another) = round(src [R, C])

# The copies' threads (k_round_bf16, k_round_fp16, round_into):
#   thread x (blockIdx.x * blockDim.x + threadIdx.x) owns the 8 values j = 8x .. 8x + 7 of a row:
#       two 128-bit loads (32 bytes of fp32) and one 128-bit store (16 bytes of bf16 or fp16);
#       a warp reads 1,024 contiguous bytes and writes 512: every 32-byte sector whole
#   the blocks along x cover a row (blockDim.x a multiple of 32 sized so that none is mostly idle:
#       3072 values = 384 threads -> 2 blocks of 192, not 2 of 256 with 128 idle);
#   blockIdx.y starts at row blockIdx.y and strides gridDim.y rows: gridDim.y is set so the whole
#       grid is about ROUND_GRID_THREADS threads (half of what the H200's 132 multiprocessors hold,
#       2,048 each; ptxas gives these kernels 45 to 54 registers a thread, so 1,024 fit in a
#       multiprocessor's 65,536), every thread looping over rows; 132 x 1,024 threads x 32 bytes in
#       flight = 4.3 MB, more than bandwidth x latency (4.8 TB/s x ~0.6 us = 2.9 MB).
# So 8192 x 3072 (151 MB moved: 101 MB read, 50 MB written) is 2 x 352 blocks of 192 threads,
# each thread 23 or 24 rows of 32 bytes in and 16 out.
# The 128-bit accesses need 16-byte aligned addresses: every row of src (its start and its row
# stride) and of dst (its start, and C % 8 == 0 so that its rows, C values apart, start on 16-byte
# boundaries too). round_into checks that on the host (round_wide) and passes `wide`; otherwise
# the same threads take their 8 values one by one (C odd, a view whose rows start anywhere), and so
# does a single row's ragged end. (The lab's k_round_bf16_v1, a thread an element, is the rung
# before: lab/operands.py.)

@cuda.jit(device=True, inline=True)
def bf16_bits(b):
    """The bf16 bit pattern of the fp32 bit pattern b (uint32), all in 32-bit integers, rounded to
    nearest, ties to even (reference/precision.py: round_bf16): add 0x7FFF plus the lowest kept bit,
    keep the high 16 bits; a NaN keeps its top half with the quiet bit 0x40 set. No carry leaves 32
    bits: the largest b that is not NaN is -inf, 0xFF800000, and 0xFF800000 + 0x8000 < 2^32."""
    if (b & uint32(0x7FFFFFFF)) > uint32(0x7F800000):
        return uint16((b >> uint32(16)) | uint32(0x40))
    return uint16(uint32(b + uint32(0x7FFF) + ((b >> uint32(16)) & uint32(1))) >> uint32(16))


@cuda.jit
def k_round_bf16(dst, src_bits, wide):
    """dst[i * C + j] = bf16(src[i, j]) (bf16_bits; src_bits: the fp32 operand seen as uint32 [R, C],
    rows may be strided; dst: uint16 [>= R*C]). Thread x rounds
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
def k_round_fp16(dst, src, wide):
    """dst[i * C + j] = fp16(src[i, j]) (dst: float16 [>= R*C]): the conversion cvt.rn.f16.f32 on each
    value rounds to nearest, ties to even (past 65504: inf; below 6.1e-5 the subnormals); the
    threads and paths of k_round_bf16."""
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



ROUND_THREADS = 4 if SIMULATOR else 256                 # threads a block, at most
ROUND_GRID_THREADS = 16 if SIMULATOR else 132 * 1024     # threads of the grid, about (comment above)


def round_wide(dst, src) -> bool:
    """Whether k_round_* may move whole chunks of 8 values 16 bytes at a time: src's and dst's first
    elements on 16-byte boundaries, src's rows contiguous, and every later row's start on one too
    (src's row stride a multiple of 16 bytes, C % 8 == 0 so that dst's rows, C values apart, do
    too) or no later row (R == 1: its ragged end goes element by element)."""
    R, C = src.shape
    starts = address(src) % 16 == 0 and address(dst) % 16 == 0 and (C == 1 or src.strides[1] == 4)
    return starts and (R == 1 or (C % 8 == 0 and src.strides[0] % 16 == 0))


def round_grid(R: int, C: int, block_threads: int | None = None, grid_threads: int | None = None):
    """The copies' launch: (grid, threads). x: ceil(C / 8) threads of 8 values over the fewest blocks of at
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


def round_into(dst, src, precision, stream=0):
    """dst[:R*C] = src [R, C] rounded to bf16 (dst uint16: the bit patterns; k_round_bf16) or fp16
    (dst float16; k_round_fp16), eight values a thread (round_grid, round_wide)."""
    R, C = src.shape
    if R == 0 or C == 0:
        return
    kernel, arg = (k_round_bf16, src.view(np.uint32)) if precision == "bf16" else (k_round_fp16, src)
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

    def slots(self, a, b, precision: str):
        """The scratch's two slots for copies of a and b (reserved), flat: uint16 (bf16) or float16."""
        self.reserve(a.size, b.size)
        view = self.buf if precision == "bf16" else self.buf.view(np.float16)
        return view[:a.size], view[_slot_b(a.size):_slot_b(a.size) + b.size]

    def round(self, a, b, precision: str, stream=0):
        """(a16, b16): a and b [rows, cols] rounded to bf16 (uint16 bit patterns) or fp16 (float16),
        each flat, rows packed (round_into: k_round_bf16 / k_round_fp16, ties to even). An operand that
        holds 16-bit values of the precision already (uint16 for bf16: an activation a model saved
        rounded, gpu_model.SAVED16) is not copied: it is returned flat, as it is."""
        out = []
        for x, slot in zip((a, b), self.slots(a, b, precision)):
            if x.dtype == slot.dtype:
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


