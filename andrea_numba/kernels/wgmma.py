"""Hopper's warpgroup tensor-core product, wgmma.mma_async, from Numba: the instructions, the
shared-memory layout they read, and a NumPy twin of one product.

mma.sync (ptx.py) is a warp instruction: 32 threads hand their A and B fragments over in
registers and get a 16 x 8 tile back. sm_90's wgmma is a warpgroup instruction: four consecutive
warps of the block (128 threads, the first warp's index a multiple of 4) compute one 64 x N tile
together, N = 8, 16, ..., 256, sixteen values of k deep for bf16. A and B are not in registers:
the instruction reads them straight from shared memory, each described by a 64-bit "matrix
descriptor" (where the tile starts, how its 8 x 16-byte pieces are spaced, which swizzle). Only
the accumulator D lives in registers: N / 2 fp32 values a thread.

It is asynchronous: the instruction returns before the product is done, and the accumulator
registers may only be read after a wait. The protocol, one warpgroup (every thread runs each line):

    st.shared ...                        the operands, written by ordinary (generic proxy) stores
    fence.proxy.async.shared::cta        fence_proxy_async(): make those writes visible to the
                                         async proxy, which is what wgmma reads shared memory with
    bar.sync                             cuda.syncthreads(): every thread's writes are fenced
    (acc = wgmma_keep(wgmma_acc_zeros(N)): the zeros set before the fence)
    wgmma.fence.sync.aligned             wgmma_fence(): the accumulator registers are ready (needed
                                         before the first wgmma and after any other instruction
                                         wrote them)
    wgmma.mma_async ... (k0)             wgmma_bf16(acc, desc_a, desc_b, scale_d), as many as
    wgmma.mma_async ... (k0 + 16) ...    wanted: D = A @ B (scale_d = 0) or D += A @ B (1)
    wgmma.commit_group.sync.aligned      wgmma_commit(): the wgmmas issued so far form a group
    wgmma.wait_group.sync.aligned 0      wgmma_wait0(): every group of this thread is done
    (now acc may be read)                wgmma_keep(acc) pins the registers after the wait

The instruction (bf16 in, fp32 sums, both operands K-major in shared memory):

    wgmma.mma_async.sync.aligned.m64n{N}k16.f32.bf16.bf16 {d0, ..., d(N/2 - 1)}, desc_a, desc_b,
                                                           p, 1, 1, 0, 0;
    p: the scale-d predicate (false: D = A @ B, true: D = A @ B + D); 1, 1: scale A and B by +1
    (-1 would negate); 0, 0: imm-trans-a, imm-trans-b = K-major A and B (1: M- or N-major, read
    through the "MN-major layouts" below: wgmma_bf16_trans, matmul v17).

A second form takes A from registers (wgmma_bf16_rs; FlashAttention-3's products, flash attention
v15): the 128 threads hand over A 64 x 16 as four .b32 registers of bf16 pairs each, in the layout of
an m64n16 accumulator (register_a_matrix), and only B is read through a descriptor:

    wgmma.mma_async.sync.aligned.m64n{N}k16.f32.bf16.bf16 {d0, ...}, {a0, a1, a2, a3}, desc_b,
                                                           p, 1, 1, imm-trans-b;

So the accumulators of one product, rounded and packed in pairs, are the A operand of the next
without a trip through shared memory.

TF32 (wgmma_tf32; the 3xTF32 products of matmul_tf32x3_wgmma, kernels/split_wgmma.py): the same
instruction eight values of k deep on 32-bit operands,

    wgmma.mma_async.sync.aligned.m64n{N}k8.f32.tf32.tf32 {d0, ..., d(N/2 - 1)}, desc_a, desc_b, p, 1, 1;

with no transpose immediates: the PTX ISA offers imm-trans-a and imm-trans-b for .f16 and .bf16
only, so both TF32 operands are K-major. A k8 step of fp32 values is 32 bytes a row, the bytes of a
bf16 k16 step, so the K-major layouts below serve unchanged: rows of 128 bytes (32 values of k) under
the 128-byte swizzle, the k8 step s at start + 32 s. The tensor core reads a TF32 operand from the
top 19 bits of each 32-bit value (the low 13 mantissa bits are dropped: truncation), as mma.sync does.

numba-cuda 0.30 compiles for "sm_90a" on a compute-capability-9.0 device (the "a": the
architecture-specific features, wgmma among them; codegen._ensure_cc), and so does
cuda.compile_ptx(..., cc=(9, 0, "a")) without a GPU (lab/bench/wgmma_probe.py --ptx). With
cc=(9, 0) the PTX says ".target sm_90" and ptxas refuses every wgmma instruction in it.


Matrix descriptor (64 bits; PTX ISA "Matrix Descriptor Format" of the warpgroup MMA; CUTLASS
cute/arch/mma_sm90_desc.hpp GmmaDescriptor):

    bits  0-13   start address >> 4      the operand's first byte, a shared-window address (what
                                         cvta.to.shared gives, or ld.shared takes), 16-byte aligned
    bits 16-29   LBO >> 4                "leading dimension byte offset"
    bits 32-45   SBO >> 4                "stride dimension byte offset"
    bits 49-51   base offset             0 when the swizzle pattern starts on its natural
                                         boundary (1024 bytes for 128B swizzle), as here
    bits 62-63   swizzle mode            0 none, 1 128-byte, 2 64-byte, 3 32-byte
    (all other bits zero; each 14-bit field holds (x & 0x3FFFF) >> 4: 256 KiB of shared memory)

Shared-memory layouts, K-major (every row of A, m, and every row of B^T, n, holds its k values
in order; that is imm-trans = 0). The unit is the "core matrix": 8 rows x 16 bytes (8 rows of
8 bf16), its 8 rows stored one after another as 128 contiguous bytes. One k16 step of an operand
with R rows (R = 64 for A, N for B) is R/8 x 2 core matrices, and the descriptor says where they
are:

  No swizzle (mode 0, "interleave"): core matrix (i, j) = rows 8i..8i+7, k 8j..8j+7 starts at

        start + i * SBO + j * LBO          LBO: the next core matrix along K (k + 8)
                                           SBO: the next core matrix along M or N (row + 8)

  and element (r, k) at  start + (r // 8) SBO + (k // 8) LBO + (r % 8) 16 + (k % 8) 2.
  Two tight choices for a 64 x 16 A tile (B alike with N rows):
      "k pairs":  each 8-row group's two core matrices side by side: LBO = 128, SBO = 256
                  (a K = 64 tile: a group's 8 core matrices side by side, LBO = 128, SBO = 1024;
                  the k16 step s starts at start + 256 s)
      "m first":  all of k 0..7 (R/8 core matrices, R * 16 bytes), then k 8..15: LBO = 16 R, SBO = 128
  Reads: an 8-row core matrix is one 128-byte line of shared memory, conflict-free.

  128-byte swizzle (mode 1): rows are 128 bytes = 64 bf16 = a K tile of 64 (four k16 steps).
  8 rows (1024 bytes, aligned to 1024) form a "swizzle atom": row r % 8 at (r % 8) * 128, its
  16-byte chunk c (k 8c..8c+7) stored at chunk position c ^ (r % 8). Written on the address:

        address = lin ^ (((lin >> 7) & 7) << 4)      lin = the unswizzled byte address

  (bits 4-6, the chunk, XORed with bits 7-9, the row within the atom: CUTLASS's Swizzle<3,4,3>).
  SBO = 1024: the next 8 rows (the next atom along M or N). LBO is not used for K-major swizzled
  operands (a k16 step is 32 bytes, inside one row; CUTLASS writes 1, i.e. 16 bytes). The k16
  step s of the 64-wide tile starts at start + 32 s: the hardware applies the XOR to the
  addresses it computes, so the same swizzled tile serves all four steps.
  64-byte (mode 2) and 32-byte (mode 3) swizzles are the same with W = 64 or 32-byte rows: the XOR
  takes (lin >> 7) & 3 or & 1 (so for 64-byte rows two consecutive rows share a pattern), SBO =
  8 W, and a K tile wider than W/2 values continues in a second atom column placed after all rows.

MN-major layouts (imm-trans = 1: the operand stored "transposed", A as A^T [K, M] with m
contiguous, B as [K, N] with n contiguous; PTX ISA "Shared Memory Matrix Layout", its table of
canonical layouts in CuTe notation, and CUTLASS cute/arch/mma_sm90_desc.hpp say the same). Now a
row of the atom holds consecutive m (or n) values of ONE k, and the 8 rows of an atom are 8
consecutive k:

  W-byte swizzle (W = 128, 64, 32: modes 1, 2, 3): an atom is 8 rows (k .. k + 7) of W bytes, W/2
  consecutive values of m (n) a row, 8 W bytes in all, swizzled as above (the same XOR of the
  16-byte chunk with the row). Element (mn, k) of an operand at `start`:

        address = swizzle(start + (mn // (W/2)) LBO + (k // 8) SBO + (k % 8) W + 2 (mn % (W/2)))

        LBO: the next W/2 values of m (n): the next atom ALONG M/N
        SBO: the next 8 values of k: the next atom ALONG K

  No swizzle (mode 0, "interleave"): the core matrix is 8 rows (k .. k + 7) of 16 bytes (8 values
  of m or n), 128 contiguous bytes, and here the roles are the K-major ones again:

        address = start + (mn // 8) SBO + (k // 8) LBO + (k % 8) 16 + 2 (mn % 8)

        LBO: the next 8 values of k (along K);  SBO: the next 8 values of m (n)

  So for a swizzled MN-major operand "leading" means M/N and "stride" means K, the other way round
  from every K-major layout and from the MN-major interleave: read each offset off the canonical
  layout, not off its name. (The ISA's tables say it in words too: LBO, MN-major, "swizzled
  layouts: offset from the first (swizzle-byte-size/16) rows to the next (swizzle-byte-size/16)
  rows", rows being 16-byte units of m or n; SBO "swizzled layout: offset from the first 8
  columns to the next 8 columns", columns being k.)

  The tile that mnmajor_offset lays out (matmul v17's stages): a tile of `depth` values of k (a
  multiple of 8) and R values of m (n) is R / (W/2) column blocks, block j holding m (n)
  j W/2 .. (j + 1) W/2 - 1 for all `depth` k, one W-byte row per k:

        lin = (mn // (W/2)) depth W + k W + 2 (mn % (W/2)),    address = swizzle(lin)
        LBO = depth W (the next block), SBO = 8 W (8 rows on), k16 step s at start + 16 s W

  (mnmajor_lbo_sbo, mnmajor_step_offset). At W = 128 a block row is v13's k-outer tile row of 64
  bf16, chunk q at q ^ (k & 7): half_tile's copier fills it as it is. With no swizzle the same
  formula with W = 16 is a column of core matrices: LBO = 8 W = 128 (the next 8 k), SBO = depth W.
  A k16 step of an MN-major operand is two atoms along K (k 0..7 at start, 8..15 at start + SBO),
  and the step's start moves whole atoms (2048 bytes at W = 128), so it stays on the pattern's
  boundary: no start inside a row, unlike the 32-byte moves of a K-major step.

Accumulator D (PTX ISA "Matrix Fragments for wgmma .m64nNk16", fp32: N/2 registers a thread).
Thread 32 w + 4 g + t of the warpgroup (warp w = 0..3, g = lane >> 2, t = lane & 3) holds, for
each 8-column block j = 0 .. N/8 - 1:

    d[4j + 0] = D[16w + g,     8j + 2t]       d[4j + 1] = D[16w + g,     8j + 2t + 1]
    d[4j + 2] = D[16w + g + 8, 8j + 2t]       d[4j + 3] = D[16w + g + 8, 8j + 2t + 1]

i.e. each warp owns 16 rows and holds them exactly as an mma.sync m16n8 C fragment, once per
8 columns (CUTLASS CLayout_64xN: thread (4, 8, 4) : (2 cols, 1 row, 16 rows), value
(2, 2, N/8) : (1 col, 8 rows, 8 cols)). fragment_rows_cols(n) gives the table.

In the simulator nothing here can run as PTX: the instruction intrinsics have twins that do
nothing (fences, commit, wait) or raise (the product), and the whole-warpgroup product has a NumPy
twin, wgmma_warpgroup, that reads A and B out of an image of shared memory through the descriptors
exactly as the hardware is documented to (the addresses above, K-major or MN-major as the transpose
bits say; wgmma_warpgroup_rs takes A from the 128 threads' registers, which a simulated kernel
collects with warpgroup_gather), so the layout arithmetic is tested without a GPU (tests/test_wgmma.py,
tests/test_wgmma_mn.py) and lab/bench/wgmma_probe.py checks it against the H200.
"""
import functools
import threading

import numpy as np

from .common import SIMULATOR

if SIMULATOR:
    from .common import sim_meet

if not SIMULATOR:      # the code generators of the device functions below (the simulator runs twins)
    from llvmlite import ir
    from numba import types
    from numba.cuda.extending import intrinsic

    from .ptx import _no_operand, _shared_address      # one-instruction and shared-address helpers

SWIZZLE_NONE, SWIZZLE_128B, SWIZZLE_64B, SWIZZLE_32B = 0, 1, 2, 3
SWIZZLE_BYTES = {SWIZZLE_NONE: 16, SWIZZLE_128B: 128, SWIZZLE_64B: 64, SWIZZLE_32B: 32}   # row width of an atom
N_VALUES = tuple(range(8, 257, 8))      # the N of m64nNk16 for bf16


# ------------------------------------------------------------------------------------------------
# The descriptor and the layouts: plain integer arithmetic (Python ints or NumPy arrays)

def pack_desc(start, lbo, sbo, swizzle):
    """The 64-bit matrix descriptor (module docstring) of an operand starting at shared address
    `start` (bytes), with byte offsets lbo and sbo and swizzle mode 0..3, base offset 0. A Python
    int in 0 .. 2**64 - 1 here; on the GPU (smem_desc) the same bits in an int64."""
    return ((((start & 0x3FFFF) >> 4)) | (((lbo & 0x3FFFF) >> 4) << 16) | (((sbo & 0x3FFFF) >> 4) << 32)
            | ((swizzle & 3) << 62))


def unpack_desc(desc):
    """(start, lbo, sbo, base_offset, swizzle) of a descriptor, addresses in bytes."""
    desc = int(desc) & 0xFFFFFFFFFFFFFFFF
    return (((desc >> 0) & 0x3FFF) << 4, ((desc >> 16) & 0x3FFF) << 4, ((desc >> 32) & 0x3FFF) << 4,
            (desc >> 49) & 7, (desc >> 62) & 3)


def swizzle_address(addr, swizzle):
    """The byte address that the swizzle mode stores the unswizzled address `addr` at: the 16-byte
    chunk (bits 4..) XORed with the row bits 7.. of the atom (none: addr itself). Its own inverse."""
    if swizzle == SWIZZLE_NONE:
        return addr
    mask = SWIZZLE_BYTES[swizzle] // 16 - 1              # 7, 3, 1: as many bits as an atom row has chunks
    return addr ^ (((addr >> 7) & mask) << 4)


def kmajor_offset(r, k, rows, swizzle, lbo=128, sbo=None):
    """Byte offset (from a 1024-byte aligned tile start) of element (r, k) of a rows x K bf16
    operand stored K-major in a canonical layout; r and k may be NumPy arrays.
    swizzle 0: core matrix (r // 8, k // 8) at (r // 8) sbo + (k // 8) lbo (sbo defaults to the
               "k pairs" tile, K/8 core matrices side by side: give sbo = 16 K there).
    swizzle 1-3: rows of W = 128, 64, 32 bytes (W/2 values of k) in atoms of 8 rows, sbo = 8 W;
               the next W/2 values of k in the next atom column, after all `rows` rows; swizzled."""
    if swizzle == SWIZZLE_NONE:
        if sbo is None:
            raise ValueError("no swizzle: give sbo (16 K for the k-pairs tile)")
        return (r // 8) * sbo + (k // 8) * lbo + (r % 8) * 16 + (k % 8) * 2
    w = SWIZZLE_BYTES[swizzle]
    kw = w // 2                                          # values of k in an atom row
    lin = (k // kw) * (rows * w) + (r // 8) * (8 * w) + (r % 8) * w + (k % kw) * 2
    return swizzle_address(lin, swizzle)


def kmajor_read_addresses(desc, rows):
    """[rows, 16] byte addresses the hardware reads one k16 bf16 operand from, as the PTX ISA
    describes the descriptor (K-major): element (r, k) at
        none:      start + (r // 8) SBO + (k // 8) LBO + (r % 8) 16 + (k % 8) 2
        swizzled:  swizzle(start + (r // 8) SBO + (r % 8) W + 2 k)."""
    start, lbo, sbo, base, swizzle = unpack_desc(desc)
    if base:
        raise NotImplementedError("base offset != 0 is not modelled")
    r, k = np.arange(rows)[:, None], np.arange(16)[None, :]
    if swizzle == SWIZZLE_NONE:
        return start + (r // 8) * sbo + (k // 8) * lbo + (r % 8) * 16 + (k % 8) * 2
    return swizzle_address(start + (r // 8) * sbo + (r % 8) * SWIZZLE_BYTES[swizzle] + 2 * k, swizzle)


def mnmajor_offset(mn, k, depth, swizzle):
    """Byte offset (from a 1024-byte aligned tile start) of element (mn, k) of an MN-major bf16
    operand tile of `depth` values of k (a multiple of 8), laid out as R / (W/2) column blocks
    (module docstring, "MN-major layouts"): block mn // (W/2) at (mn // (W/2)) depth W, row k of it
    at k W, the value at 2 (mn % (W/2)), then swizzled; W = 128, 64, 32 bytes for modes 1-3 and
    16 for no swizzle (a column of core matrices). mn and k may be NumPy arrays."""
    w = SWIZZLE_BYTES[swizzle]
    lin = (mn // (w // 2)) * (depth * w) + k * w + (mn % (w // 2)) * 2
    return swizzle_address(lin, swizzle)


def mnmajor_lbo_sbo(depth, swizzle):
    """(LBO, SBO) of the descriptor that reads a tile laid out by mnmajor_offset: swizzled, LBO =
    depth W (the next block along M/N) and SBO = 8 W (the next 8 k); no swizzle, the roles the
    other way round: LBO = 128 (the next core matrix along K), SBO = 16 depth (along M/N)."""
    w = SWIZZLE_BYTES[swizzle]
    along_mn, along_k = depth * w, 8 * w
    return (along_k, along_mn) if swizzle == SWIZZLE_NONE else (along_mn, along_k)


def mnmajor_step_offset(step, swizzle):
    """Byte offset of the k16 step `step` (k = 16 step ..) of a tile laid out by mnmajor_offset:
    16 rows of W bytes a step (two atoms along K), the start of that step's descriptor."""
    return 16 * step * SWIZZLE_BYTES[swizzle]


def mnmajor_read_addresses(desc, rows):
    """[rows, 16] byte addresses the hardware reads one k16 bf16 operand from when it is MN-major
    (imm-trans = 1), as the PTX ISA describes the descriptor: element (mn, k) at
        none:      start + (mn // 8) SBO + (k // 8) LBO + (k % 8) 16 + (mn % 8) 2
        swizzled:  swizzle(start + (mn // (W/2)) LBO + (k // 8) SBO + (k % 8) W + (mn % (W/2)) 2)."""
    start, lbo, sbo, base, swizzle = unpack_desc(desc)
    if base:
        raise NotImplementedError("base offset != 0 is not modelled")
    mn, k = np.arange(rows)[:, None], np.arange(16)[None, :]
    if swizzle == SWIZZLE_NONE:
        return start + (mn // 8) * sbo + (k // 8) * lbo + (k % 8) * 16 + (mn % 8) * 2
    w = SWIZZLE_BYTES[swizzle]
    lin = start + (mn // (w // 2)) * lbo + (k // 8) * sbo + (k % 8) * w + (mn % (w // 2)) * 2
    return swizzle_address(lin, swizzle)


def bf16_bits(x):
    """The bf16 bit patterns (uint16) of float32 values that are already bf16 (low 16 bits zero)."""
    return (np.asarray(x, np.float32).view(np.uint32) >> np.uint32(16)).astype(np.uint16)


def bits_bf16(h):
    """float32 values of bf16 bit patterns."""
    return (np.asarray(h).astype(np.uint32) << np.uint32(16)).view(np.float32)


def fragment_rows_cols(n):
    """(rows, cols), each [128, n/2]: the element of the 64 x n accumulator that register i of
    warpgroup thread 32 w + 4 g + t holds (module docstring)."""
    thread, reg = np.arange(128)[:, None], np.arange(n // 2)[None, :]
    w, g, t = thread >> 5, (thread & 31) >> 2, thread & 3
    j, h, c = reg >> 2, (reg >> 1) & 1, reg & 1
    return 16 * w + g + 8 * h + 0 * reg, 8 * j + 2 * t + c + 0 * thread


def fragment_to_matrix(regs):
    """The 64 x n matrix from the warpgroup's registers [128, n/2]."""
    regs = np.asarray(regs)
    n = 2 * regs.shape[1]
    rows, cols = fragment_rows_cols(n)
    out = np.empty((64, n), regs.dtype)
    out[rows, cols] = regs
    return out


def matrix_to_fragment(d):
    """The warpgroup's registers [128, n/2] holding the 64 x n matrix d."""
    rows, cols = fragment_rows_cols(d.shape[1])
    return np.asarray(d)[rows, cols]


def _read_operand(smem, desc, rows, trans):
    """[rows, 16] float64: the bf16 values one k16 step of a shared operand holds, read out of the
    image smem (any array; its bytes are shared addresses 0, 1, ...) through its descriptor, K-major
    (trans 0: kmajor_read_addresses) or M/N-major (trans 1: mnmajor_read_addresses); row r is m (A)
    or n (B^T), column k."""
    raw = np.ascontiguousarray(smem).reshape(-1).view(np.uint8)
    halves = raw[: raw.size // 2 * 2].view(np.uint16)          # the 16-bit value at byte address 2 i
    index, top = _half_index(int(desc) & 0xFFFFFFFFFFFFFFFF, rows, int(bool(trans)))
    if top + 2 > raw.size:
        raise IndexError(f"descriptor {int(desc):#018x} reads outside the {raw.size}-byte image")
    return bits_bf16(halves[index]).astype(np.float64)


@functools.lru_cache(maxsize=4096)
def _half_index(desc, rows, trans):
    """(the [rows, 16] indices of the 16-bit values one k16 step reads, its highest byte address):
    the read addresses of the descriptor halved, worked out once a descriptor (the simulated kernels
    read the same few tiles from every thread)."""
    addr = (mnmajor_read_addresses if trans else kmajor_read_addresses)(desc, rows)   # [rows, 16]: (mn, k)
    if (addr % 2).any():
        raise IndexError(f"descriptor {desc:#018x} reads at odd addresses")
    index = addr // 2
    index.flags.writeable = False
    return index, int(addr.max())


def _accumulate(d, n, acc, scale_d):
    """The threads' registers [128, n/2] of D = d (64 x n, float64) + acc (when scale_d and acc),
    rounded to fp32 once."""
    if n not in N_VALUES:
        raise ValueError(f"n = {n}: m64nNk16 takes N = 8, 16, ..., 256")
    if scale_d and acc is not None:
        d = d + fragment_to_matrix(acc).astype(np.float64)
    return matrix_to_fragment(d.astype(np.float32))


def wgmma_warpgroup(smem, desc_a, desc_b, n, acc=None, scale_d=1, trans_a=0, trans_b=0):
    """NumPy twin of one wgmma.mma_async.sync.aligned.m64n{n}k16.f32.bf16.bf16 ..., trans_a, trans_b
    with A and B in shared memory, for the whole warpgroup. smem: an image of shared memory (any
    array; its bytes are shared addresses 0, 1, ...); desc_a, desc_b: the descriptors; acc
    [128, n/2]: the threads' accumulators (zeros when None); scale_d 0: D = A @ B, else D = A @ B +
    acc; trans_a, trans_b: the instruction's imm-trans-a, imm-trans-b (0: the operand is K-major,
    read through kmajor_read_addresses; 1: M- or N-major, mnmajor_read_addresses).
    Returns the threads' registers [128, n/2] (products exact, sums in fp32: float64 sums rounded
    once, which differs from the tensor core's order only in the last bits)."""
    if n not in N_VALUES:
        raise ValueError(f"n = {n}: m64nNk16 takes N = 8, 16, ..., 256")
    a, bt = _read_operand(smem, desc_a, 64, trans_a), _read_operand(smem, desc_b, n, trans_b)   # A [64, 16], B^T [n, 16]
    return _accumulate(a @ bt.T, n, acc, scale_d)


def tf32_truncate(x):
    """float64 values of float32 x as a TF32 operand reaches the tensor core: the low 13 mantissa
    bits dropped (module docstring, "TF32")."""
    bits = np.asarray(x, np.float32).view(np.uint32) & np.uint32(0xFFFFE000)
    return bits.view(np.float32).astype(np.float64)


def _read_operand_tf32(smem, desc, rows):
    """[rows, 8] float64: the TF32 values one k8 step of a K-major 32-bit operand holds, read out of
    the image smem through its descriptor. The step's 32 bytes a row are those of a bf16 k16 step,
    so value k is at the address of bf16 value 2 k (kmajor_read_addresses), truncated to TF32."""
    raw = np.ascontiguousarray(smem).reshape(-1).view(np.uint8)
    addr = kmajor_read_addresses(int(desc) & 0xFFFFFFFFFFFFFFFF, rows)[:, 0::2]    # [rows, 8]
    if (addr % 4).any():
        raise IndexError(f"descriptor {int(desc):#018x} reads 32-bit values at addresses not a multiple of 4")
    if int(addr.max()) + 4 > raw.size:
        raise IndexError(f"descriptor {int(desc):#018x} reads outside the {raw.size}-byte image")
    words = raw[: raw.size // 4 * 4].view(np.float32)
    return tf32_truncate(words[addr // 4])


def wgmma_warpgroup_tf32(smem, desc_a, desc_b, n, acc=None, scale_d=1):
    """NumPy twin of one wgmma.mma_async.sync.aligned.m64n{n}k8.f32.tf32.tf32 for the whole
    warpgroup: A [64, 8] and B^T [n, 8] read K-major from the image smem through desc_a and desc_b,
    each value truncated to TF32 as the tensor core reads it; acc and scale_d as wgmma_warpgroup's.
    Returns the threads' registers [128, n/2] (exact products, float64 sums rounded to fp32 once)."""
    if n not in N_VALUES:
        raise ValueError(f"n = {n}: m64nNk8 takes N = 8, 16, ..., 256")
    a, bt = _read_operand_tf32(smem, desc_a, 64), _read_operand_tf32(smem, desc_b, n)
    return _accumulate(a @ bt.T, n, acc, scale_d)


def register_a_matrix(a_regs):
    """The 64 x 16 bf16 matrix A (as float64) that the warpgroup's registers a_regs [128, 4] (int32,
    two bf16 a register, the lower k in the low half) hand to a register-A wgmma. The PTX ISA's
    fragment of A for .m64nNk16 (CUTLASS's ALayout_64x16) is the accumulator's layout at N = 16:
    thread 32 w + 4 g + t holds

        a0 = A[16w + g,     2t : 2t + 2]      a1 = A[16w + g + 8, 2t : 2t + 2]
        a2 = A[16w + g, 2t + 8 : 2t + 10]     a3 = A[16w + g + 8, 2t + 8 : 2t + 10]

    i.e. value 2 i + half of the thread is accumulator register 2 i + half of an m64n16 tile
    (fragment_rows_cols(16)): the mma.sync m16n8k16 A fragment, warp w on rows 16 w .. 16 w + 15."""
    bits = np.asarray(a_regs).astype(np.int64) & 0xFFFFFFFF                    # [128, 4]
    halves = np.stack([bits & 0xFFFF, bits >> 16], axis=-1).reshape(128, 8)    # value 2 i + half
    return fragment_to_matrix(bits_bf16(halves.astype(np.uint16))).astype(np.float64)


def wgmma_warpgroup_rs(a_regs, smem, desc_b, n, acc=None, scale_d=1, trans_b=0):
    """NumPy twin of one register-A wgmma, wgmma.mma_async.sync.aligned.m64n{n}k16.f32.bf16.bf16
    {d}, {a0, a1, a2, a3}, desc_b, p, 1, 1, trans_b, for the whole warpgroup: A from the threads'
    registers a_regs [128, 4] (register_a_matrix), B from the image smem through desc_b as in
    wgmma_warpgroup. Returns the threads' registers [128, n/2]."""
    if n not in N_VALUES:
        raise ValueError(f"n = {n}: m64nNk16 takes N = 8, 16, ..., 256")
    bt = _read_operand(smem, desc_b, n, trans_b)                               # B^T [n, 16]
    return _accumulate(register_a_matrix(a_regs) @ bt.T, n, acc, scale_d)


# ------------------------------------------------------------------------------------------------
# The device functions

if not SIMULATOR:
    _f32, _i32, _i64 = ir.FloatType(), ir.IntType(32), ir.IntType(64)

    @intrinsic
    def wgmma_fence(typingctx):
        """Order this thread's earlier register writes (the accumulators) before the wgmmas that
        follow: needed before the first wgmma.mma_async and after any other instruction touched
        its accumulator registers.   PTX: wgmma.fence.sync.aligned;"""
        return _no_operand("wgmma.fence.sync.aligned;")(typingctx)

    @intrinsic
    def wgmma_commit(typingctx):
        """Close the group of wgmma.mma_async issued since the last commit.
        PTX: wgmma.commit_group.sync.aligned;"""
        return _no_operand("wgmma.commit_group.sync.aligned;")(typingctx)

    @intrinsic
    def wgmma_wait0(typingctx):
        """Wait until every committed wgmma group of this thread is complete: the accumulators
        may be read and the shared operands overwritten.   PTX: wgmma.wait_group.sync.aligned 0;"""
        return _no_operand("wgmma.wait_group.sync.aligned 0;")(typingctx)

    @intrinsic
    def wgmma_wait1(typingctx):
        """Wait until at most the newest wgmma group is pending.   PTX: wgmma.wait_group.sync.aligned 1;"""
        return _no_operand("wgmma.wait_group.sync.aligned 1;")(typingctx)

    @intrinsic
    def fence_proxy_async(typingctx):
        """Make this thread's generic-proxy shared-memory writes (ordinary st.shared) visible to
        the async proxy that wgmma reads its operands with; a barrier after it covers the block.
        PTX: fence.proxy.async.shared::cta;"""
        return _no_operand("fence.proxy.async.shared::cta;")(typingctx)

    @intrinsic
    def shared_address(typingctx, sarr, index):
        """The 32-bit shared-window address (int32) of element `index` of the shared array sarr (any
        dtype: index * itemsize bytes from its start).   PTX: cvta.to.shared.u64 (or nothing)"""
        if not (isinstance(sarr, types.Array) and isinstance(index, types.Integer)):
            return None

        def codegen(context, builder, sig, args):
            return _shared_address(context, builder, sig.args[0], args[0], args[1], sig.args[1])
        return types.int32(sarr, index), codegen

    @intrinsic
    def smem_desc(typingctx, sarr, index, lbo, sbo, swizzle):
        """The matrix descriptor (int64) of an operand starting at element `index` of the shared
        array sarr (16-byte aligned; 1024 for a swizzled tile), byte offsets lbo and sbo, swizzle
        mode 0..3 (module docstring): pack_desc's arithmetic on 64-bit integers (bit 63 may be set:
        the int64 is then negative, the bits are what count).
        PTX: and, shr, shl, or on .b64 (no special instruction: a descriptor is a value in a register)"""
        ints = all(isinstance(t, types.Integer) for t in (index, lbo, sbo, swizzle))
        if not (isinstance(sarr, types.Array) and ints):
            return None

        def codegen(context, builder, sig, args):
            start = builder.zext(_shared_address(context, builder, sig.args[0], args[0], args[1], sig.args[1]), _i64)

            def field(value, shift):              # ((value & 0x3FFFF) >> 4) << shift
                v = builder.lshr(builder.and_(value, ir.Constant(_i64, 0x3FFFF)), ir.Constant(_i64, 4))
                return builder.shl(v, ir.Constant(_i64, shift))
            lbo_, sbo_, swz = (context.cast(builder, v, t, types.int64) for v, t in zip(args[2:], sig.args[2:]))
            desc = builder.or_(field(start, 0), field(lbo_, 16))
            desc = builder.or_(desc, field(sbo_, 32))
            return builder.or_(desc, builder.shl(builder.and_(swz, ir.Constant(_i64, 3)), ir.Constant(_i64, 62)))
        return types.int64(sarr, index, lbo, sbo, swizzle), codegen

    def _acc_type(acc):
        """The accumulator tuple of an m64nNk16 wgmma: N / 2 float32 (N = 8 .. 256, a multiple of 8)."""
        if (isinstance(acc, types.UniTuple) and acc.dtype == types.float32 and acc.count % 4 == 0
                and 4 <= acc.count <= 128):
            return acc
        return None

    def _wgmma_asm(nregs, trans_a=0, trans_b=0, tf32=False):
        """The inline assembly of one m64n(2 nregs)k16 bf16 wgmma (tf32: m64n(2 nregs)k8 TF32): outputs
        $0 .. $(nregs - 1) tied to the inputs of the same numbers (the accumulator is read and
        written), then desc_a, desc_b and the scale-d integer, turned into the predicate p by setp;
        trans_a, trans_b: the immediates imm-trans-a, imm-trans-b written into the instruction (0:
        K-major, 1: M/N-major). TF32 has no transpose immediates: both operands are K-major."""
        n = 2 * nregs
        d = ", ".join(f"${i}" for i in range(nregs))
        shape, tail = (f"m64n{n}k8.f32.tf32.tf32", "") if tf32 else \
            (f"m64n{n}k16.f32.bf16.bf16", f", {int(trans_a)}, {int(trans_b)}")
        ptx = ("{\n.reg .pred p;\n"
               f"setp.ne.b32 p, ${nregs + 2}, 0;\n"
               f"wgmma.mma_async.sync.aligned.{shape} "
               f"{{{d}}}, ${nregs}, ${nregs + 1}, p, 1, 1{tail};\n"
               "}")
        # "~{memory}": it reads shared memory, so no load or store of it moves across
        constraints = ",".join(["=f"] * nregs + ["l", "l", "r"] + [str(i) for i in range(nregs)] + ["~{memory}"])
        fnty = ir.FunctionType(ir.LiteralStructType([_f32] * nregs), [_i64, _i64, _i32] + [_f32] * nregs)
        return ir.InlineAsm(fnty, ptx, constraints, side_effect=True)

    def _wgmma_call(context, builder, nregs, acc_values, desc_a, desc_b, scale_d, types_abs, trans=(0, 0)):
        """Emit the wgmma; acc_values: nregs float32 values; trans: (imm-trans-a, imm-trans-b);
        returns the nregs results."""
        ta, tb, ts = types_abs
        da = context.cast(builder, desc_a, ta, types.int64)
        db = context.cast(builder, desc_b, tb, types.int64)
        sd = context.cast(builder, scale_d, ts, types.int32)
        d = builder.call(_wgmma_asm(nregs, *trans), [da, db, sd] + list(acc_values))
        return [builder.extract_value(d, i) for i in range(nregs)]

    def _scalar(t):
        return isinstance(t, (types.Integer, types.Boolean))

    @intrinsic
    def wgmma_bf16(typingctx, acc, desc_a, desc_b, scale_d):
        """acc' = the warpgroup's 64 x N tile of A @ B (+ acc when scale_d != 0), A 64 x 16 and B
        16 x N bf16 in shared memory, K-major, described by desc_a and desc_b (smem_desc); acc a
        tuple of N/2 float32 in the fragment layout of the module docstring. All 128 threads of
        the warpgroup call it together. Asynchronous: read acc' only after wgmma_commit and
        wgmma_wait0.
        PTX: wgmma.mma_async.sync.aligned.m64n{N}k16.f32.bf16.bf16 {d..}, desc_a, desc_b, p, 1, 1, 0, 0;"""
        if not (_acc_type(acc) and _scalar(desc_a) and _scalar(desc_b) and _scalar(scale_d)):
            return None

        def codegen(context, builder, sig, args):
            nregs = sig.args[0].count
            vals = [builder.extract_value(args[0], i) for i in range(nregs)]
            out = _wgmma_call(context, builder, nregs, vals, args[1], args[2], args[3], sig.args[1:])
            return context.make_tuple(builder, sig.return_type, out)
        return acc(acc, desc_a, desc_b, scale_d), codegen

    @intrinsic
    def wgmma_tf32(typingctx, acc, desc_a, desc_b, scale_d):
        """acc' = the warpgroup's 64 x N tile of A @ B (+ acc when scale_d != 0), A 64 x 8 and B 8 x N
        32-bit values in shared memory, both K-major, read as TF32 (their top 19 bits); descriptors
        and accumulators as wgmma_bf16's. Asynchronous: read acc' only after wgmma_commit and a wait.
        PTX: wgmma.mma_async.sync.aligned.m64n{N}k8.f32.tf32.tf32 {d..}, desc_a, desc_b, p, 1, 1;"""
        if not (_acc_type(acc) and _scalar(desc_a) and _scalar(desc_b) and _scalar(scale_d)):
            return None

        def codegen(context, builder, sig, args):
            nregs = sig.args[0].count
            vals = [builder.extract_value(args[0], i) for i in range(nregs)]
            da = context.cast(builder, args[1], sig.args[1], types.int64)
            db = context.cast(builder, args[2], sig.args[2], types.int64)
            sd = context.cast(builder, args[3], sig.args[3], types.int32)
            d = builder.call(_wgmma_asm(nregs, tf32=True), [da, db, sd] + vals)
            return context.make_tuple(builder, sig.return_type, [builder.extract_value(d, i) for i in range(nregs)])
        return acc(acc, desc_a, desc_b, scale_d), codegen

    def _literal_bit(t):
        """0 or 1 when t is the type of a compile-time constant 0/1 or False/True (a literal: a
        constant in the source, or a global or closure variable of the device function), else None."""
        if isinstance(t, (types.IntegerLiteral, types.BooleanLiteral)) and int(t.literal_value) in (0, 1):
            return int(t.literal_value)
        return None

    @intrinsic
    def wgmma_bf16_trans(typingctx, acc, desc_a, desc_b, scale_d, trans_a, trans_b):
        """wgmma_bf16 with operands that may be M- or N-major: trans_a, trans_b are the instruction's
        imm-trans-a and imm-trans-b, compile-time constants (0 or 1, False or True: a literal, or a
        global or closure constant of the calling function). 0: the operand is K-major (kmajor_*
        layouts, as wgmma_bf16 reads both); 1: A is M-major (element (m, k) at mnmajor_read_addresses),
        B is N-major (element (n, k) likewise); the descriptors' LBO and SBO then mean what the module
        docstring's "MN-major layouts" says. With (0, 0) it is wgmma_bf16, instruction for instruction.
        PTX: wgmma.mma_async.sync.aligned.m64n{N}k16.f32.bf16.bf16 {d..}, desc_a, desc_b, p, 1, 1, trans_a, trans_b;"""
        ta, tb = _literal_bit(trans_a), _literal_bit(trans_b)
        if ta is None or tb is None:
            return None
        if not (_acc_type(acc) and _scalar(desc_a) and _scalar(desc_b) and _scalar(scale_d)):
            return None

        def codegen(context, builder, sig, args):
            nregs = sig.args[0].count
            vals = [builder.extract_value(args[0], i) for i in range(nregs)]
            out = _wgmma_call(context, builder, nregs, vals, args[1], args[2], args[3], sig.args[1:4], (ta, tb))
            return context.make_tuple(builder, sig.return_type, out)
        return acc(acc, desc_a, desc_b, scale_d, trans_a, trans_b), codegen

    def _wgmma_rs_asm(nregs, trans_b):
        """The inline assembly of one register-A m64n(2 nregs)k16 bf16 wgmma: outputs $0 .. $(nregs - 1)
        tied to the inputs of the same numbers (the accumulator), then a0 .. a3 (four .b32 registers of
        bf16 pairs), desc_b and the scale-d integer (the predicate p by setp); trans_b: imm-trans-b.
        A register-A wgmma has no imm-trans-a (A is in registers, in the fragment layout)."""
        n = 2 * nregs
        d = ", ".join(f"${i}" for i in range(nregs))
        a = ", ".join(f"${nregs + i}" for i in range(4))
        ptx = ("{\n.reg .pred p;\n"
               f"setp.ne.b32 p, ${nregs + 5}, 0;\n"
               f"wgmma.mma_async.sync.aligned.m64n{n}k16.f32.bf16.bf16 "
               f"{{{d}}}, {{{a}}}, ${nregs + 4}, p, 1, 1, {int(trans_b)};\n"
               "}")
        constraints = ",".join(["=f"] * nregs + ["r"] * 4 + ["l", "r"] + [str(i) for i in range(nregs)] + ["~{memory}"])
        fnty = ir.FunctionType(ir.LiteralStructType([_f32] * nregs), [_i32] * 4 + [_i64, _i32] + [_f32] * nregs)
        return ir.InlineAsm(fnty, ptx, constraints, side_effect=True)

    @intrinsic
    def wgmma_bf16_rs(typingctx, acc, a0, a1, a2, a3, desc_b, scale_d, trans_b):
        """acc' = the warpgroup's 64 x N tile of A @ B (+ acc when scale_d != 0) with A 64 x 16 in the
        threads' registers: a0 .. a3, four int32 of two bf16 each (the lower k in the low half), in the
        fragment layout of register_a_matrix (the mma.sync m16n8k16 A fragment, warp w of the group
        on rows 16 w ..; the accumulator layout at N = 16, so an m64nNk16 tile's accumulators, rounded
        and packed in pairs, are the A of the next product: FlashAttention's P). B 16 x N in shared
        memory through desc_b, K-major (trans_b 0) or N-major (1; a compile-time constant, as in
        wgmma_bf16_trans). Asynchronous as wgmma_bf16: a wgmma_fence before it (the A registers were
        written), and neither acc' read nor a0 .. a3 changed before wgmma_commit and wgmma_wait0.
        PTX: wgmma.mma_async.sync.aligned.m64n{N}k16.f32.bf16.bf16 {d..}, {a0, a1, a2, a3}, desc_b, p, 1, 1, trans_b;"""
        tb = _literal_bit(trans_b)
        if tb is None or not _acc_type(acc):
            return None
        if not all(isinstance(t, types.Integer) for t in (a0, a1, a2, a3)):
            return None
        if not (_scalar(desc_b) and _scalar(scale_d)):
            return None

        def codegen(context, builder, sig, args):
            nregs = sig.args[0].count
            vals = [builder.extract_value(args[0], i) for i in range(nregs)]
            regs = [builder.trunc(context.cast(builder, v, t, types.int64), _i32) for v, t in zip(args[1:5], sig.args[1:5])]
            db = context.cast(builder, args[5], sig.args[5], types.int64)
            sd = context.cast(builder, args[6], sig.args[6], types.int32)
            d = builder.call(_wgmma_rs_asm(nregs, tb), regs + [db, sd] + vals)
            out = [builder.extract_value(d, i) for i in range(nregs)]
            return context.make_tuple(builder, sig.return_type, out)
        return acc(acc, a0, a1, a2, a3, desc_b, scale_d, trans_b), codegen

    @intrinsic
    def wgmma_bf16_m64n8k16(typingctx, d0, d1, d2, d3, desc_a, desc_b, scale_d):
        """wgmma_bf16 at N = 8 with the four accumulators as separate values: returns (d0..d3).
        PTX: wgmma.mma_async.sync.aligned.m64n8k16.f32.bf16.bf16 {d0, d1, d2, d3}, desc_a, desc_b, p, 1, 1, 0, 0;"""
        if not all(isinstance(t, (types.Float, types.Integer)) for t in (d0, d1, d2, d3)):
            return None
        if not (_scalar(desc_a) and _scalar(desc_b) and _scalar(scale_d)):
            return None
        f4 = types.UniTuple(types.float32, 4)

        def codegen(context, builder, sig, args):
            vals = [context.cast(builder, v, t, types.float32) for v, t in zip(args[:4], sig.args[:4])]
            out = _wgmma_call(context, builder, 4, vals, args[4], args[5], args[6], sig.args[4:])
            return context.make_tuple(builder, f4, out)
        return f4(d0, d1, d2, d3, desc_a, desc_b, scale_d), codegen

    @intrinsic
    def wgmma_acc_zeros(typingctx, n):
        """The accumulator tuple of an m64nNk16 wgmma, N a constant: N/2 float32 zeros."""
        if not (isinstance(n, types.IntegerLiteral) and n.literal_value in N_VALUES):
            return None
        tup = types.UniTuple(types.float32, n.literal_value // 2)

        def codegen(context, builder, sig, args):
            return context.make_tuple(builder, tup, [ir.Constant(_f32, 0.0)] * tup.count)
        return tup(n), codegen

    @intrinsic
    def wgmma_keep(typingctx, acc):
        """acc itself, through an empty assembly statement that reads and writes every register
        (CUTLASS's warpgroup_fence_operand), kept in place: after wgmma_wait0 it keeps the compiler
        from moving uses of the accumulators above the wait; before wgmma_fence, it keeps the
        instructions that set them (the zeros) above the fence.   PTX: none (an empty statement)"""
        if not _acc_type(acc):
            return None

        def codegen(context, builder, sig, args):
            nregs = sig.args[0].count
            fnty = ir.FunctionType(ir.LiteralStructType([_f32] * nregs), [_f32] * nregs)
            asm = ir.InlineAsm(fnty, "", ",".join(["=f"] * nregs + [str(i) for i in range(nregs)]), side_effect=True)
            d = builder.call(asm, [builder.extract_value(args[0], i) for i in range(nregs)])
            return context.make_tuple(builder, sig.return_type, [builder.extract_value(d, i) for i in range(nregs)])
        return acc(acc), codegen

else:
    def _nothing():
        pass

    # in the simulator the fences, the commit and the wait have nothing to order
    wgmma_fence = wgmma_commit = wgmma_wait0 = wgmma_wait1 = fence_proxy_async = _nothing

    def shared_address(sarr, index):
        """Simulator twin: the byte offset of element `index` from the array's start (a shared
        array stands for shared memory from address 0, as wgmma_warpgroup's image)."""
        return int(index) * sarr.dtype.itemsize

    def smem_desc(sarr, index, lbo, sbo, swizzle):
        """Simulator twin of the descriptor: the same bits, start = shared_address(sarr, index)."""
        return pack_desc(shared_address(sarr, index), int(lbo), int(sbo), int(swizzle))

    def wgmma_bf16(*args):
        raise NotImplementedError("wgmma is a warpgroup instruction: in the simulator use wgmma_warpgroup")

    wgmma_bf16_m64n8k16 = wgmma_bf16_trans = wgmma_bf16_rs = wgmma_tf32 = wgmma_bf16

    class _WarpgroupSlots:
        """One warpgroup's meeting point in the simulator: two sets of slots for its 128 threads'
        values (calls alternate between them) and each thread's count of its calls."""

        def __init__(self):
            self.slots = [[None] * 128, [None] * 128]
            self.calls = [0] * 128

    def warpgroup_gather(x, wg, thread):
        """Simulator only: every thread's x (a number or an array) of warpgroup wg of this block,
        stacked [128, ...] by the thread's index in the group: the twin of a register-A wgmma's
        operand, which the instruction takes from all 128 threads' registers. Each thread leaves its
        x in its slot, waits for the group's other 127 and reads them all. Calls alternate between
        two sets of slots: a thread can be one call ahead of the slowest reader (its next barrier
        waits for that reader), never two, so no slot is refilled before the group has read it. A
        barrier of the group's threads alone (ptx.warp_gather is the same for a warp)."""
        block = threading.current_thread()._manager        # the simulator's block, shared by its threads
        groups = block.__dict__.setdefault("_warpgroup_slots", {})
        meet = groups.get(wg) or groups.setdefault(wg, _WarpgroupSlots())
        slots = meet.slots[meet.calls[thread] & 1]
        meet.calls[thread] += 1
        slots[thread] = np.array(x, copy=True)
        sim_meet(("warpgroup", wg), 128)
        return np.stack(slots)

    class _WarpgroupResults:
        """One warpgroup's shared results in the simulator: each thread's count of its calls, and the
        results of the calls that not every thread has collected yet."""

        def __init__(self):
            self.lock = threading.Lock()
            self.calls = [0] * 128
            self.results = {}

    def warpgroup_once(fn, wg, thread):
        """Simulator only: fn() for warpgroup wg of this block, worked out by the first of its 128
        threads to ask and handed to every one: the twin of an instruction whose result the group
        computes together (a wgmma from shared memory: every thread would compute the same 64 x N
        product). The threads of a warpgroup make the same calls in the same order (a wgmma is
        issued by all 128 or by none), so a thread's n-th call is the group's n-th; fn must give the
        same result whichever thread runs it (what it reads does not change until every thread has
        called). No barrier: a thread waits only for the lock while the first one computes."""
        block = threading.current_thread()._manager
        groups = block.__dict__.setdefault("_warpgroup_results", {})
        state = groups.get(wg) or groups.setdefault(wg, _WarpgroupResults())
        with state.lock:
            n = state.calls[thread]
            state.calls[thread] = n + 1
            if n not in state.results:
                state.results[n] = [fn(), 128]
            entry = state.results[n]
            entry[1] -= 1
            if entry[1] == 0:
                del state.results[n]
        return entry[0]

    def wgmma_acc_zeros(n):
        return (np.float32(0),) * (n // 2)

    def wgmma_keep(acc):
        return acc
