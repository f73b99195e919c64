"""TMA and mbarriers: Hopper's copy engine and the barriers that count its bytes (matmul v18).

Until matmul v17 every thread of a product block copies its share of each stage: it works out the
global address of each 16-byte chunk, the swizzled shared address, whether the chunk lies inside
the matrix, and issues a cp.async; then the whole block meets at a barrier before the tensor cores
may read the stage. Hopper has a unit that does all of that alone, the Tensor Memory Accelerator.

1. A tensor map (CUtensorMap, 128 opaque bytes) describes a 2-D array in global memory once, on the
   host (the driver's cuTensorMapEncodeTiled): its address, its two sizes, its row pitch, the box
   one copy moves (here 64 values of the contiguous dimension, 128 bytes, by `rows` rows), and the
   swizzle the box lands in shared memory with. The 128-byte swizzle is exactly the layout our
   wgmma tiles use (kernels/wgmma_ring.py, kernels/wgmma_mn.py): row r of the box is 128 bytes at
   offset 128 r, its 16-byte chunk q stored at chunk q ^ (r & 7) (on the absolute shared address,
   so the box starts on a 1024-byte boundary). Past the array's edges the box is filled with zeros:
   the guards of v17's copier are the hardware's job now.

2. One thread starts a whole box:

       cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes
           [shared destination], [tensor map, {c0, c1}], [mbarrier];

   c0 is the element along the contiguous dimension, c1 the row. The copy runs on its own; when its
   bytes have landed it tells the mbarrier ("complete_tx": so many bytes done).

3. An mbarrier is a 64-bit object in shared memory that counts two things in its current phase:
   arrivals still expected (set by mbarrier.init) and bytes still expected (raised by
   mbarrier.arrive.expect_tx, lowered by the copies as they land). When both reach zero the phase
   completes, the barrier flips to the next phase and re-arms its arrival count. A thread waits for
   a phase by its parity (mbarrier.try_wait.parity P: true once the phase of parity P is over,
   false after a short while otherwise, so it is called in a loop). A fresh barrier is in phase 0,
   and the phase "before" it, parity 1, counts as over: waiting on parity 1 passes at once.

   A ring of S stages takes two barriers a stage. full[st]: one arrival (the producer's expect_tx)
   plus the stage's bytes; the consumers wait on it. empty[st]: one arrival per consumer warp, made
   once that warp's wgmmas on the stage are complete; the producer waits on it before refilling.
   Use number g of the ring (g = 0, 1, 2, ...: every stage of every tile the block computes) goes
   to stage g % S in phase g // S, so its parity is (g // S) & 1: consumers wait full[st] on that
   parity, the producer waits empty[st] on the one before, parity ^ 1 (the first S waits pass).

No block-wide barrier is left in the loop: the producer runs as far ahead as the ring lets it,
each consumer warpgroup as fast as its copies land.

The simulator runs none of this PTX. Its twins keep each mbarrier's phase, arrivals and bytes in a
Python table under a lock, and the box copy is done at once in NumPy (zeros past the edges, the
128-byte swizzle on the box's rows) before its bytes are counted: the producer and the consumers
still run as separate threads that wait on each other, so the simulator checks the phases,
parities and counts, the box placement, the swizzle and the edges. A wait that cannot finish raises
instead of hanging (MBAR_TIMEOUT_S). The tensor maps themselves exist only on a GPU (TensorMaps).
"""
import threading
import time

import numpy as np
from numba import cuda

from .common import SIMULATOR, address

if SIMULATOR:
    from .common import sim_yield

if not SIMULATOR:      # the code generators of the intrinsics below (the simulator runs their twins)
    from llvmlite import ir
    from numba import types
    from numba.cuda.extending import intrinsic

    from .ptx import _no_operand, _shared_address

BOX_INNER = 64           # values of the contiguous dimension a box row holds: 128 bytes of bf16
BOX_ROW_BYTES = 128      # ... one row of the 128-byte swizzle
MAP_BYTES = 128          # a CUtensorMap
MBAR_TIMEOUT_S = 60.0    # the simulator's longest wait for a phase before it calls the run stuck

if not SIMULATOR:
    _i32, _i64 = ir.IntType(32), ir.IntType(64)

    def _bar(sarr, index):
        return isinstance(sarr, types.Array) and sarr.dtype == types.int64 and isinstance(index, types.Integer)

    def _asm(context, builder, ptx, constraints, operands, ret=None):
        fnty = ir.FunctionType(ret or ir.VoidType(), [op.type for op in operands])
        return builder.call(ir.InlineAsm(fnty, ptx, constraints, side_effect=True), operands)

    def _i32_of(context, builder, value, ty):
        return builder.trunc(context.cast(builder, value, ty, types.int64), _i32)

    @intrinsic
    def mbar_init(typingctx, bars, index, count):
        """Set up the mbarrier bars[index] (an int64 shared array) for `count` arrivals a phase, in
        phase 0. One thread does it, before any other touches the barrier.
        PTX: mbarrier.init.shared::cta.b64 [addr], count;"""
        if not (_bar(bars, index) and isinstance(count, types.Integer)):
            return None

        def codegen(context, builder, sig, args):
            addr = _shared_address(context, builder, sig.args[0], args[0], args[1], sig.args[1])
            _asm(context, builder, "mbarrier.init.shared::cta.b64 [$0], $1;", "r,r,~{memory}",
                 [addr, _i32_of(context, builder, args[2], sig.args[2])])
            return context.get_dummy_value()
        return types.void(bars, index, count), codegen

    @intrinsic
    def mbar_fence_init(typingctx):
        """Make the mbarrier.init writes visible to the other threads and to the copy engine (the
        barrier that follows covers the block).   PTX: fence.mbarrier_init.release.cluster;"""
        return _no_operand("fence.mbarrier_init.release.cluster;")(typingctx)

    @intrinsic
    def mbar_arrive(typingctx, bars, index):
        """Count one arrival on bars[index] (release: this thread's earlier work is ordered before
        it).   PTX: mbarrier.arrive.shared::cta.b64 state, [addr];  (state unused)"""
        if not _bar(bars, index):
            return None

        def codegen(context, builder, sig, args):
            addr = _shared_address(context, builder, sig.args[0], args[0], args[1], sig.args[1])
            _asm(context, builder, "{\n.reg .b64 st;\nmbarrier.arrive.shared::cta.b64 st, [$0];\n}",
                 "r,~{memory}", [addr])
            return context.get_dummy_value()
        return types.void(bars, index), codegen

    @intrinsic
    def mbar_expect_tx(typingctx, bars, index, nbytes):
        """Raise the bytes bars[index] waits for in this phase by nbytes and count one arrival: what
        the producer does just before starting a stage's copies.
        PTX: mbarrier.arrive.expect_tx.shared::cta.b64 state, [addr], nbytes;"""
        if not (_bar(bars, index) and isinstance(nbytes, types.Integer)):
            return None

        def codegen(context, builder, sig, args):
            addr = _shared_address(context, builder, sig.args[0], args[0], args[1], sig.args[1])
            _asm(context, builder, "{\n.reg .b64 st;\nmbarrier.arrive.expect_tx.shared::cta.b64 st, [$0], $1;\n}",
                 "r,r,~{memory}", [addr, _i32_of(context, builder, args[2], sig.args[2])])
            return context.get_dummy_value()
        return types.void(bars, index, nbytes), codegen

    @intrinsic
    def mbar_try_wait(typingctx, bars, index, parity):
        """True once the phase of parity `parity` (0 or 1) of bars[index] is complete; false if it
        is not within the hardware's time limit (call it again). Acquire: what the arrivals and the
        copies wrote is visible after a true.
        PTX: mbarrier.try_wait.parity.shared::cta.b64 p, [addr], parity; selp.u32 r, 1, 0, p;"""
        if not (_bar(bars, index) and isinstance(parity, types.Integer)):
            return None

        def codegen(context, builder, sig, args):
            addr = _shared_address(context, builder, sig.args[0], args[0], args[1], sig.args[1])
            r = _asm(context, builder, "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [$1], $2;\n"
                     "selp.u32 $0, 1, 0, p;\n}", "=r,r,r,~{memory}",
                     [addr, _i32_of(context, builder, args[2], sig.args[2])], ret=_i32)
            return builder.icmp_unsigned("!=", r, ir.Constant(_i32, 0))
        return types.boolean(bars, index, parity), codegen

    @intrinsic
    def tma_load_2d(typingctx, ring, at, src, tmap, c0, c1, rows, bars, index):
        """Start the copy of the box at (c0, c1) of the tensor map at generic address tmap (64 values
        of the contiguous dimension from c0, `rows` rows from c1) into the shared array `ring` from
        its element `at` on (a 1024-byte boundary), counting its bytes on the mbarrier bars[index].
        src (the array the map describes) and rows are what the map already says: only the
        simulator's twin reads them.
        PTX: cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes
             [dst], [tmap, {c0, c1}], [bar];"""
        ints = all(isinstance(t, types.Integer) for t in (at, tmap, c0, c1, rows))
        if not (isinstance(ring, types.Array) and ints and isinstance(src, types.Array) and _bar(bars, index)):
            return None

        def codegen(context, builder, sig, args):
            dst = _shared_address(context, builder, sig.args[0], args[0], args[1], sig.args[1])
            bar = _shared_address(context, builder, sig.args[7], args[7], args[8], sig.args[8])
            tm = context.cast(builder, args[3], sig.args[3], types.int64)
            x, y = (_i32_of(context, builder, args[i], sig.args[i]) for i in (4, 5))
            _asm(context, builder, "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes "
                 "[$0], [$1, {$2, $3}], [$4];", "r,l,r,r,r,~{memory}", [dst, tm, x, y, bar])
            return context.get_dummy_value()
        return types.void(ring, at, src, tmap, c0, c1, rows, bars, index), codegen

    @intrinsic
    def fence_tensormap(typingctx, tmap):
        """Before the first copy through a tensor map that was written to global memory from the host:
        make the copy engine's view of its 128 bytes (the tensormap proxy) see what was written.
        PTX: fence.proxy.tensormap::generic.acquire.sys [tmap], 128;"""
        if not isinstance(tmap, types.Integer):
            return None

        def codegen(context, builder, sig, args):
            tm = context.cast(builder, args[0], sig.args[0], types.int64)
            _asm(context, builder, "fence.proxy.tensormap::generic.acquire.sys [$0], 128;", "l,~{memory}", [tm])
            return context.get_dummy_value()
        return types.void(tmap), codegen

else:
    _LOCK = threading.Lock()
    _STATE = {}          # barrier address -> [phase, arrivals left, arrivals a phase, bytes left]
    _WAITING = threading.local()

    def _key(bars, index):
        return bars.__array_interface__["data"][0] + 8 * int(index)

    def _complete_if_done(s):
        if s[1] == 0 and s[3] == 0:
            s[0] += 1                                  # the phase is over: the next one, re-armed
            s[1] = s[2]

    def mbar_init(bars, index, count):
        """Twin: phase 0, `count` arrivals, no bytes (the entry of an earlier block's barrier at the
        same address is replaced: the table holds one entry an address)."""
        with _LOCK:
            _STATE[_key(bars, index)] = [0, int(count), int(count), 0]

    def mbar_fence_init():
        pass

    def _arrive(bars, index, nbytes):
        with _LOCK:
            s = _STATE[_key(bars, index)]
            assert s[1] > 0, "an arrival on an mbarrier whose phase expects no more"
            s[3] += nbytes
            s[1] -= 1
            _complete_if_done(s)

    def mbar_arrive(bars, index):
        """Twin: one arrival."""
        _arrive(bars, index, 0)

    def mbar_expect_tx(bars, index, nbytes):
        """Twin: nbytes more to land in this phase, and one arrival."""
        _arrive(bars, index, int(nbytes))

    def mbar_try_wait(bars, index, parity):
        """Twin: whether the phase of this parity is over (the current phase's parity differs);
        if not, the thread lets the block's other threads run first (common.sim_yield), and a wait that lasts past
        MBAR_TIMEOUT_S raises: a barrier protocol that deadlocks fails the test instead of hanging."""
        key = _key(bars, index)
        with _LOCK:
            state = list(_STATE[key])
        done = (state[0] & 1) != int(parity)
        if done:
            _WAITING.since = None
            return True
        if getattr(_WAITING, "since", None) is None or _WAITING.on != (key, parity):
            _WAITING.since, _WAITING.on = time.monotonic(), (key, parity)    # this wait's first miss
        elif time.monotonic() - _WAITING.since > MBAR_TIMEOUT_S:
            raise RuntimeError(f"mbarrier {index}: a wait on parity {parity} never completed (phase {state[0]}, "
                               f"{state[1]} of {state[2]} arrivals and {state[3]} bytes still due): the ring's protocol is stuck")
        sim_yield()
        return False

    def tma_load_2d(ring, at, src, tmap, c0, c1, rows, bars, index):
        """Twin of the box copy: rows x 64 values of src (uint16 [outer, inner]) from row c1, column
        c0, zeros outside src, into the ring's bytes from word `at` with the 128-byte swizzle (chunk q
        of box row r at chunk q ^ (r & 7)); then its bytes are counted on bars[index]."""
        g = getattr(src, "_ary", src)
        box = np.zeros((rows, BOX_INNER), np.uint16)
        r1, e1 = min(g.shape[0], c1 + rows), min(g.shape[1], c0 + BOX_INNER)
        if r1 > c1 and e1 > c0:
            box[:r1 - c1, :e1 - c0] = g[c1:r1, c0:e1]
        start = 4 * int(at)
        assert start % 1024 == 0, "a box with the 128-byte swizzle starts on a 1024-byte boundary"
        chunks = box.reshape(rows, 8, 8)
        swz = np.empty_like(chunks)
        r = np.arange(rows)
        for q in range(8):
            swz[r, q ^ (r & 7)] = chunks[:, q]
        ring.reshape(-1).view(np.uint16)[start // 2:start // 2 + rows * BOX_INNER] = swz.reshape(-1)
        with _LOCK:
            s = _STATE[_key(bars, index)]
            s[3] -= rows * BOX_ROW_BYTES
            assert s[3] >= 0, "a copy landed more bytes than its phase expected"
            _complete_if_done(s)

    def fence_tensormap(tmap):
        pass


class TensorMaps:
    """The tensor maps of the products' operands, in one device table (slots of 128 bytes, 64-byte
    aligned), each written once when its (address, shape, pitch, box) is first seen; the kernels get
    a slot's global address. A captured CUDA graph replays launches with those addresses frozen, so
    every map a graph uses must be written before the capture (the trainer's first step is eager)
    and never moved: a new map while a graph is being recorded is an error, and a full table is one
    too (never reached by a training run: its products see the same few hundred operands at every
    step). reserve() allocates the table before the first step; in the simulator there is no table
    (address() gives 0: the kernels' twins read the arrays themselves)."""

    SLOTS = 4096

    def __init__(self):
        self.table = None
        self.slots = {}

    def reserve(self, slots: int = SLOTS):
        if SIMULATOR or self.table is not None:
            return
        self.table = cuda.device_array((slots, MAP_BYTES // 8), np.uint64)

    @property
    def nbytes(self) -> int:
        return 0 if self.table is None else self.table.nbytes

    def address(self, arr, rows: int, stream=0) -> int:
        """The global address of the tensor map of the 2-D bf16 array arr (uint16, rows of a whole
        number of 16-byte chunks) with boxes of `rows` rows x 64 values and the 128-byte swizzle."""
        if SIMULATOR:
            return 0
        ptr = arr.__cuda_array_interface__["data"][0]
        key = (ptr, arr.shape, arr.strides, rows)
        slot = self.slots.get(key)
        if slot is None:
            if not isinstance(stream, (int, cuda.cudadrv.driver.Stream)):
                raise RuntimeError("a new TMA tensor map while a CUDA graph is being recorded: run the step "
                                   "once eagerly before capturing it")
            self.reserve()
            if len(self.slots) >= self.table.shape[0]:
                raise RuntimeError(f"the table of {self.table.shape[0]} TMA tensor maps is full")
            slot = len(self.slots)
            words = encode_map(ptr, arr.shape, arr.strides[0], rows)
            if isinstance(stream, int):
                self.table[slot].copy_to_device(words)
            else:
                self.table[slot].copy_to_device(words, stream=stream)
            self.slots[key] = slot
        return self.table.__cuda_array_interface__["data"][0] + slot * MAP_BYTES


def encode_map(ptr: int, shape, pitch: int, rows: int) -> np.ndarray:
    """The 16 words of the tensor map of a bf16 array at device address ptr, shape (outer, inner),
    `pitch` bytes from one row to the next, boxes of `rows` x 64 values, 128-byte swizzle, zeros
    past the edges (cuTensorMapEncodeTiled: dimensions and box listed innermost first)."""
    from cuda.bindings import driver as drv       # optional (cuda-python, with a GPU): imported where a map is made
    outer, inner = shape
    u64, u32 = drv.cuuint64_t, drv.cuuint32_t
    err, tmap = drv.cuTensorMapEncodeTiled(
        drv.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, ptr, [u64(inner), u64(outer)], [u64(pitch)],
        [u32(BOX_INNER), u32(rows)], [u32(1), u32(1)], drv.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE,
        drv.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_128B, drv.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
        drv.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE)
    if err != drv.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"cuTensorMapEncodeTiled failed ({err}) for shape {tuple(shape)}, pitch {pitch}, box {rows} x 64")
    return np.array([int(w) for w in tmap.opaque], np.uint64)


def map_fits(arr) -> bool:
    """Whether a 2-D uint16 array can be read through a tensor map: rows of a whole number of 16-byte
    chunks, C-contiguous rows, a 16-byte aligned start (the driver's rules for globalAddress and
    globalStrides)."""
    if arr.ndim != 2 or arr.dtype != np.uint16 or arr.strides[1] != 2 or arr.strides[0] % 16:
        return False
    return address(arr) % 16 == 0


TMAPS = TensorMaps()
