"""FP8 quantization on the GPU: a tensor's absolute maximum by a fixed tree, its scale, and
its values cast to E4M3 or E5M2 bytes, laid out the way the FP8 products read them. NumPy twin:
reference/fp8.py (quantize_fp32, encode). The products themselves: kernels/fp8_products.py.

    k_amax_partial      partial[b] = max |x| over block b's grid-stride share of x [R, C] (a tree in
                        shared memory; a maximum does not depend on the order, so neither do its bits)
    k_amax_final        stats = [descale, scale, amax, 0]: amax = max of the partials, scale = max / amax
                        and descale = amax / max in fp32 (both 1 where amax is 0), max the format's
                        largest value; count[0] = 0 (the quantize kernel's underflow counter). The
                        descale comes first: cuBLASLt reads it from a 16-byte aligned address (a
                        record is 16 bytes; on the H200 a scale pointer 4 bytes past a 16-byte
                        boundary made every FP8 product fail with CUBLAS_STATUS_NOT_SUPPORTED)
    k_quantize          codes[i * ld + j] = the byte of round_fp8(x[i, j] * scale): x's rows as they
                        are, each padded with zero bytes to ld (ld >= C)
    k_quantize_t        codes[j * ld + i] = the same byte: x transposed, through a shared tile
                        (ld >= R), each row of the transpose padded with zero bytes to ld
Both quantize kernels count the values that underflowed (x != 0, the byte +-0) into count[0]: an
integer sum, whatever its order (no float atomics: the bits stay deterministic).

Why the layouts. Hopper's FP8 tensor cores read both operands of a product "K-major": op(a) [M, K]
and op(b)^T [N, K], each row a run of K bytes (cuBLASLt: FP8 products only in its "TN" form). An
operand stored with k along its rows (x of x @ W, dout of dout @ W^T) is quantized as it lies; one
stored with k down its columns (W [K, N] of x @ W, x [N, C] of the weight gradient x^T dout) is
quantized into its transpose. And cuBLASLt wants every row of an FP8 operand to start on a 16-byte
boundary: ld is K rounded up to a multiple of 16, the tail zeros (they add nothing to a sum).

The rounding is done with exact arithmetic on powers of two (frexp, a division by a power of two, a
floor, a tie-to-even test), so the simulator's Python floats and the GPU's fp32 give the same byte.
Hopper has an instruction for the cast (cvt.rn.satfinite.e4m3x2.f32); the simulator has no inline
PTX, and this form is one a student can follow.
"""
import math

import numpy as np
from numba import cuda, float32, int32, uint8

from .common import block_max, cdiv, MAX_BLOCK, rung, SIMULATOR

AMAX_BLOCKS = 2 if SIMULATOR else 264           # k_amax_partial's grid (its partials)
THREADS = 16 if SIMULATOR else 256              # a block of the 1-D kernels (a power of two)
QUANT_BLOCKS = 2 if SIMULATOR else 132 * 8      # k_quantize's grid (it strides over the tensor)
T_TILE = 8 if SIMULATOR else 32                 # k_quantize_t's square tile of x
T_ROWS = 2 if SIMULATOR else 8                  # its threads along y: each T_TILE / T_ROWS rows
T_PITCH = T_TILE + 1                            # the tile's rows: one word more (the column reads' banks)
T_THREADS = T_TILE * T_ROWS
T_GRID_Y = 65535
STATS = 4                                       # floats of a quantized tensor's record: descale, scale, amax, 0
ROW_ALIGN = 16                                  # bytes: where each row of an FP8 operand starts (cuBLASLt)


def padded(k: int) -> int:
    """The row length in bytes of an FP8 operand with k values a row: k rounded up to ROW_ALIGN."""
    return cdiv(k, ROW_ALIGN) * ROW_ALIGN


@cuda.jit
def k_amax_partial(partial, x):
    """partial[blockIdx.x] = max |x[i, j]| over the flat indices thread, thread + grid threads, ...
    of x [R, C] (rows may be strided)."""
    buf = cuda.shared.array(MAX_BLOCK, float32)
    R, C = x.shape
    m = float32(0.0)
    for f in range(cuda.grid(1), R * C, cuda.gridsize(1)):
        m = max(m, abs(x[f // C, f % C]))
    m = block_max(buf, m)
    if cuda.threadIdx.x == 0:
        partial[cuda.blockIdx.x] = m


@cuda.jit
def k_amax_final(stats, count, partial, fmax):
    """stats = [amax / fmax, fmax / amax, amax, 0] (fp32; 1, 1 for amax = 0), amax the max of the
    partials; count[0] = 0."""
    buf = cuda.shared.array(MAX_BLOCK, float32)
    m = float32(0.0)
    for i in range(cuda.threadIdx.x, partial.shape[0], cuda.blockDim.x):
        m = max(m, partial[i])
    m = block_max(buf, m)
    if cuda.threadIdx.x == 0:
        stats[0] = m / fmax if m > float32(0.0) else float32(1.0)
        stats[1] = fmax / m if m > float32(0.0) else float32(1.0)
        stats[2] = m
        stats[3] = float32(0.0)
        count[0] = 0


@cuda.jit(device=True)
def block_count(buf, n, tid, nthreads):
    """The sum of the block's n (int32) by a fixed tree in shared buf, for thread tid of nthreads (a
    power of two; common.block_sum's tree for a block of any shape). The callers' thread 0 then adds
    it to the counter: one integer atomic a block, so the count has no order to depend on."""
    buf[tid] = n
    cuda.syncthreads()
    s = nthreads // 2
    while s > 0:
        if tid < s:
            buf[tid] += buf[tid + s]
        cuda.syncthreads()
        s //= 2
    return buf[0]


def make_quantize(M: int, E: int, fmax: float):
    """k_quantize and k_quantize_t for a format of M mantissa bits, smallest normal 2^E,
    largest value fmax."""
    BIAS = 1 - E
    SUB_STEP = float32(2.0 ** (E - M))        # the subnormals' spacing (and the lowest binade's)
    MIN_NORMAL = float32(2.0 ** E)
    MAX = float32(fmax)
    ONE, HALF, SCALE_M = float32(1.0), float32(0.5), float32(1 << M)     # (fp32 constants: no fp64 code)

    @cuda.jit(device=True)
    def to_byte(y):
        """The byte of y rounded to the format: sign, then |y| on its binade's grid of 2^M steps
        (ties to the even step), saturating at MAX."""
        sign = 128 if math.copysign(ONE, y) < 0 else 0      # (-0 too: its byte is 0x80)
        a = abs(y)
        if not a < MAX:                          # at or past the largest value (or inf): saturate
            a = MAX
        else:
            _, k = math.frexp(a)                  # a = m 2^k, 0.5 <= m < 1: the binade 2^(k-1)
            e = max(k - 1, E)
            step = math.ldexp(ONE, e - M)         # a power of two: a / step and t * step are exact
            t = a / step
            f = math.floor(t)
            r = t - f
            if r > HALF or (r == HALF and int(f) & 1):       # past halfway, or halfway from an odd step
                f += ONE
            a = f * step
            if a > MAX:
                a = MAX
        if a < MIN_NORMAL:                       # a subnormal (or zero): exponent field 0
            return uint8(sign | int(a / SUB_STEP))
        _, k = math.frexp(a)
        e = k - 1
        man = int((math.ldexp(a, -e) - ONE) * SCALE_M)
        return uint8(sign | ((e + BIAS) << M) | man)

    @cuda.jit(device=True)
    def quantize_one(v, scale):
        """(the byte of v * scale, 1 if v underflowed to +-0 else 0)."""
        b = to_byte(v * scale)
        return b, 1 if (b & 0x7F) == 0 and v != float32(0.0) else 0

    @cuda.jit
    def k_quantize(codes, count, x, stats, ld):
        """codes[i * ld + j] = byte(x[i, j] * scale) for j < C, 0 for C <= j < ld; x [R, C]; the
        underflowed counted into count[0]. A thread a byte, striding over the R * ld bytes."""
        buf = cuda.shared.array(MAX_BLOCK, int32)
        R, C = x.shape
        scale = stats[1]
        n = 0
        for f in range(cuda.grid(1), R * ld, cuda.gridsize(1)):
            i, j = f // ld, f % ld
            b = uint8(0)
            if j < C:
                b, u = quantize_one(x[i, j], scale)
                n += u
            codes[f] = b
        total = block_count(buf, n, cuda.threadIdx.x, cuda.blockDim.x)
        if cuda.threadIdx.x == 0 and total > 0:
            cuda.atomic.add(count, 0, total)

    @cuda.jit
    def k_quantize_t(codes, count, x, stats, ld):
        """codes[j * ld + i] = byte(x[i, j] * scale) for i < R, 0 for R <= i < ld; x [R, C]: the
        transpose [C, ld]. Block (T_TILE, T_ROWS), a T_TILE x T_TILE tile of x a block along x, tiles
        of rows over y (striding past 65,535): read along x's rows (coalesced), the bytes through a
        shared tile, written along the transpose's rows (lab/operands.py's k_round_bf16_t_v1:
        the same walk; the tile's rows one word longer so the column reads hit different banks)."""
        tile = cuda.shared.array((T_TILE, T_PITCH), int32)
        buf = cuda.shared.array(T_THREADS, int32)
        R, C = x.shape
        tx, ty = cuda.threadIdx.x, cuda.threadIdx.y
        scale = stats[1]
        j0 = cuda.blockIdx.x * T_TILE
        n = 0
        for i0 in range(cuda.blockIdx.y * T_TILE, ld, cuda.gridDim.y * T_TILE):
            for q in range(ty, T_TILE, T_ROWS):                  # read: rows i0 + q, columns j0 + tx
                i, j = i0 + q, j0 + tx
                b = uint8(0)
                if i < R and j < C:
                    b, u = quantize_one(x[i, j], scale)
                    n += u
                tile[q, tx] = b
            cuda.syncthreads()
            for q in range(ty, T_TILE, T_ROWS):                  # write: row j0 + q, columns i0 + tx
                j, i = j0 + q, i0 + tx
                if j < C and i < ld:
                    codes[j * ld + i] = uint8(tile[tx, q])
            cuda.syncthreads()                                   # the tile is read before the next rows
        total = block_count(buf, n, ty * T_TILE + tx, T_THREADS)
        if tx == 0 and ty == 0 and total > 0:
            cuda.atomic.add(count, 0, total)

    return k_quantize, k_quantize_t


_QUANTIZE = {}


def kernels_of(fmt):
    """(k_quantize, k_quantize_t) of a format (reference.fp8.Format), made once."""
    if fmt.name not in _QUANTIZE:
        _QUANTIZE[fmt.name] = make_quantize(fmt.mantissa_bits, fmt.min_exponent, fmt.max_value)
    return _QUANTIZE[fmt.name]


@rung(1)
def quantize(codes, stats, count, partial, x, fmt, transpose=False, ld=None, stream=0):
    """codes (uint8, flat) = x [R, C] quantized per tensor to fmt, as it lies ([R, ld], ld >= C) or
    transposed ([C, ld], ld >= R); ld: padded(C) or padded(R) unless given. stats (float32 [4]) =
    [descale, scale, amax, 0]; count (int32 [1]) = how many nonzero values underflowed; partial
    (float32 [AMAX_BLOCKS]) the reduction's scratch. Returns the codes as a uint8 [rows, ld] view.
    Launch: k_amax_partial, AMAX_BLOCKS blocks of THREADS; k_amax_final, one block; then k_quantize
    (grid-stride, at most QUANT_BLOCKS blocks of THREADS) or k_quantize_t (a (T_TILE, T_ROWS) block
    a T_TILE x T_TILE tile of x)."""
    R, C = x.shape
    rows, ld = (C, padded(R) if ld is None else ld) if transpose else (R, padded(C) if ld is None else ld)
    out = codes[:rows * ld]
    k_amax_partial[partial.shape[0], THREADS, stream](partial, x)
    k_amax_final[1, THREADS, stream](stats, count, partial, np.float32(fmt.max_value))
    k_rows, k_t = kernels_of(fmt)
    if transpose:
        grid = (cdiv(C, T_TILE), min(cdiv(ld, T_TILE), T_GRID_Y))
        k_t[grid, (T_TILE, T_ROWS), stream](out, count, x, stats, ld)
    else:
        k_rows[min(QUANT_BLOCKS, cdiv(rows * ld, THREADS)), THREADS, stream](out, count, x, stats, ld)
    return out.reshape(rows, ld)
