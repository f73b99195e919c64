"""The pieces of a wgmma tile (Hopper's warpgroup instruction, kernels/wgmma.py) that the engine's
wgmma products share: the warpgroup, the cp.async copier of a K-major stage tile (wgmma_mn.py),
and the accumulators' layout (wgmma_mn.py, wgmma_tma.py).

1. The warpgroup. Four consecutive warps, 128 threads, issue one wgmma.mma_async together: warpgroup
   wg (threads 128 wg .. 128 wg + 127) owns rows 64 wg .. 64 wg + 63 of the block's tile and all BN
   columns, one wgmma m64nBNk16 for each 16 values of k, reading A and B straight from shared
   memory through two descriptors. No ldmatrix, no fragment registers: only the accumulators live
   in registers, BN / 2 fp32 a thread.

2. The accumulators (wgmma.py's docstring). Thread 32 w + 4 g + t of warpgroup wg (w = 0..3 its
   warp within the group, g = lane >> 2, t = lane & 3) holds d[4 j + 2 h + c] = out tile element

       row 64 wg + 16 w + g + 8 h,   column 8 j + 2 t + c        (j = 0 .. BN/8 - 1, h, c = 0, 1)

   which is the mma.sync C layout once per 8 columns for a warp of 16 rows: warp_tile.fragment_tile's
   layout with WM = 16, WN = BN (warp 4 wg + w owns rows 16 (4 wg + w) ..). So a wgmma tile reuses
   that epilogue unchanged, and matmul's _k_matmul_warp, split-K and all: acc[h, 2 j + c] =
   d[4 j + 2 h + c] (_fragment_add). The tuple lives in registers through the K loop (64 fp32 at
   BN = 128) and is added to acc once.

3. The copier of a K-major stage tile: matmul_bf16's cp.async copier (half_tile._async_copier) of R
   rows (m or n) of BK values of k, 16-byte chunks, chunk q of row r at its swizzled place, which is
   wgmma's swizzle of the rows' width (BK = 32: 64-byte rows, mode 2; BK = 64: 128-byte rows, mode
   1; wgmma_mn.py). Chunks past M, N or K are zero-filled with plain stores; copies whose rows are
   not whole 16-byte chunks take the copier's guarded path of 2-byte loads.
"""
from numba import cuda

from .common import SIMULATOR
from .half_tile import BK_HALF, _async_copier

if not SIMULATOR:      # the code generator of _add_fragment_tuple (below)
    from numba import types
    from numba.core import cgutils
    from numba.cuda.extending import intrinsic

WARPGROUP = 128        # threads of a warpgroup: four consecutive warps


def _copier(R, THREADS, vec, BK=BK_HALF):
    """copy(s, g, r0, c0, rlim, clim): matmul_bf16's cp.async copier of an R x BK tile of a K-major
    bf16 copy (rows r0.., k c0..) into the stage tile s (R rows of BK / 2 words, swizzled). Its chunks
    are R * BK / 8; when that is fewer than the block's threads (the simulator's narrow B tiles) the
    first R * BK / 8 threads copy one chunk each and the others issue nothing. (BK = 64: rows of 128
    bytes, wgmma_mn.py.)"""
    chunks = R * BK // 8
    n = min(THREADS, chunks)
    copy = _async_copier(R, BK, n, vec)
    if n == THREADS:
        return copy

    @cuda.jit(device=True)
    def copy_some(s, g, r0, c0, rlim, clim):
        if cuda.threadIdx.x < n:
            copy(s, g, r0, c0, rlim, clim)
    return copy_some


if SIMULATOR:
    def _fragment_add(NREG):
        def fragment_add(acc, d):
            for r in range(NREG):
                acc[(r >> 1) & 1, 2 * (r >> 2) + (r & 1)] += d[r]
        return fragment_add
else:
    @intrinsic
    def _add_fragment_tuple(typingctx, acc, d):
        """acc[h, 2 j + c] += d[4 j + 2 h + c] for every register of d (point 2), acc a C-contiguous
        float32 [2, N/4] array and d the N/2 float32 accumulators of an m64nNk16 wgmma: straight-line
        code, every index a constant (a loop over d[r] with r a variable would compile to a 64-way
        branch per register: Numba indexes a tuple by a switch).   PTX: ld, add.f32, st (or registers)"""
        ok = (isinstance(acc, types.Array) and acc.ndim == 2 and acc.dtype == types.float32 and acc.layout == "C"
              and isinstance(d, types.UniTuple) and d.dtype == types.float32 and d.count % 4 == 0)
        if not ok:
            return None

        def codegen(context, builder, sig, args):
            arrty, tupty = sig.args
            arr = context.make_array(arrty)(context, builder, args[0])
            shape = cgutils.unpack_tuple(builder, arr.shape, 2)
            strides = cgutils.unpack_tuple(builder, arr.strides, 2)
            for r in range(tupty.count):
                inds = [context.get_constant(types.intp, (r >> 1) & 1),
                        context.get_constant(types.intp, 2 * (r >> 2) + (r & 1))]
                ptr = cgutils.get_item_pointer2(context, builder, arr.data, shape, strides, "C", inds)
                builder.store(builder.fadd(builder.load(ptr), builder.extract_value(args[1], r)), ptr)
            return context.get_dummy_value()
        return types.void(acc, d), codegen

    def _fragment_add(NREG):
        return _add_fragment_tuple


