"""What every kernel module shares: the simulator switch, launch sizes, a deterministic block sum.

Numba's CUDA simulator (NUMBA_ENABLE_CUDASIM=1) runs every thread as a Python thread: fine for
correctness, slow per thread. So each launch configuration has two values, one for a real GPU and a
much smaller one for the simulator. The kernels themselves are written for any block size
(block-stride loops), so the same code runs in both places.

Determinism: no kernel uses atomics on floats. A reduction is either a sequential loop in one
thread or `block_sum`, a shared-memory tree whose order depends only on the block size, so the same
inputs and launch give bit-identical results.
"""
import collections
import contextlib
import functools
import math
import os
import sys
import threading
import types

import numpy as _np
from numba import config as numba_config
from numba import cuda, int64, uint32
from numba.core import types as _types
from numba.np import numpy_support as _numpy_support

if numba_config.ENABLE_CUDASIM:      # the simulator's parts that the replacements below patch
    from numba.cuda.simulator import kernel as _simkernel
    from numba.cuda.simulator import kernelapi as _kernelapi

SIMULATOR = bool(numba_config.ENABLE_CUDASIM)
# Small test launches (tiny model, the harness) are meant to be small: no warning per launch.
numba_config.CUDA_LOW_OCCUPANCY_WARNINGS = False

if SIMULATOR:
    # A simulated thread that hands the block's turn on (below) waits for the interpreter to switch
    # to the next one; Python switches every 5 ms by default. Switching every 50 us runs the
    # agreement harness's MLP rows 10% faster with the block runner below (about five times
    # faster with numba's own, whose threads all run at once).
    sys.setswitchinterval(5e-5)

    # numba-cuda 0.30's simulator creates a shared array on the first call from a source line
    # without a lock: two threads of a block that arrive together can each create their own
    # array and no longer share it (seen as rare wrong, non-repeatable sums). This replacement
    # does the same lookup under a lock, and reads only the caller's frame instead of the stack.
    _shared_lock = threading.Lock()
    _shared_array_unlocked = _kernelapi.FakeCUDAShared.array

    def _shared_array(self, shape, dtype, alignment=None):
        # alignment (the 16 bytes a 128-bit store needs on a GPU) is moot here: the simulator
        # neither runs those stores nor accepts the argument, so it is dropped
        if shape == 0:                               # dynamic shared memory: no per-line lookup
            return _shared_array_unlocked(self, shape, dtype)
        if isinstance(dtype, _types.Type):
            dtype = _numpy_support.as_dtype(dtype)
        frame = sys._getframe(1)
        caller = (frame.f_code.co_filename, frame.f_lineno)           # (file, line), as numba's lookup
        with _shared_lock:
            arr = self._allocations.get(caller)
            if arr is None:
                arr = self._allocations[caller] = _np.empty(shape, dtype)
        return arr

    _kernelapi.FakeCUDAShared.array = _shared_array

    # numba-cuda 0.30's simulator runs a block as one Python thread per CUDA thread: it starts a
    # new thread for every thread of every block (about 0.1 ms each), lets them all run at once,
    # so that they fight over the interpreter lock, and finds a finished barrier by polling them.
    # This replacement runs a block's threads one at a time, as coroutines: each simulated thread
    # still has an operating-system thread of its own (its Python stack), taken from a pool that
    # outlives the block, but only the thread holding the block's turn runs. It runs until it
    # finishes or waits (at syncthreads, at a meeting of some of the block's threads: sim_meet,
    # or when it yields: sim_yield), then hands the turn to the next ready thread, in the order
    # they became ready (threads start in index order). The last thread to reach a barrier opens
    # it: the threads that waited there become ready, behind it. A block whose threads all wait
    # with none ready, at barriers that cannot open, is a deadlock: each waiting thread raises.
    # The same programs give the same results (each thread sees what the barriers let it see);
    # the order of the threads' steps between barriers is now always the same. An exception in
    # one thread releases the others with an error, as before. A simulated thread costs about a
    # fifth of what it did (an empty kernel: 115 -> 23 us a thread, one with a barrier 240 -> 48),
    # and the test suite runs in half the time.
    _pool_lock = threading.Lock()
    _idle_workers = []                  # pooled simulated threads, parked between blocks

    def _forget_pool():
        """In a forked child (the exercise grader's warm process forks a job a file): the pooled
        threads are the parent's and do not exist here; the child starts its own."""
        global _pool_lock
        _pool_lock = threading.Lock()
        _idle_workers.clear()

    if hasattr(os, "register_at_fork"):
        os.register_at_fork(after_in_child=_forget_pool)

    class _SimThread(_simkernel.BlockThread):
        """A simulated CUDA thread: the attributes the simulator's kernel API reads (threadIdx,
        blockIdx, thread_id, _manager) are set for each block it runs; between blocks it waits in
        the pool. It runs when its lock `turn` is released, and holds the block's turn until it
        hands it on."""

        def __init__(self):
            threading.Thread.__init__(self, daemon=True)
            self.turn = threading.Lock()
            self.turn.acquire()
            self.job = None
            self.exception = None

        def run(self):
            while True:
                self.turn.acquire()
                if not self._run_job():
                    return                          # it raised: it ends, a new thread takes its place

        def _run_job(self):
            """One simulated thread of a block (self.job); True when it ended without an error. Its
            locals end with it: an idle thread keeps no launch's arrays alive."""
            m, args, point, tid = self.job
            self._manager, self.threadIdx, self.thread_id = m, _simkernel.Dim3(*point), tid
            self.blockIdx, self.exception = m.grid_point, None
            try:
                if m._debug:
                    with _np.errstate(divide="raise"):
                        m._f(*args)
                else:
                    m._f(*args)
            except BaseException as e:          # as BlockThread.run words it, then the others abort
                where = f"tid={list(self.threadIdx)} ctaid={list(self.blockIdx)}"
                try:
                    err = type(e)(f"{where}: {e}" if str(e) else where)
                except Exception:               # a type that wants other arguments: said in words
                    err = RuntimeError(f"{where}: {type(e).__name__}: {e}")
                self.exception = (err, e.__traceback__)
                if m.first_error is None:           # the cause; the others' errors follow from it
                    m.first_error = self.exception
                _abort(m)
            m.alive -= 1
            m.finished += 1
            self.job = self._manager = None
            ok = self.exception is None
            _hand_on(m)
            return ok

    def _abort(m):
        """Every waiting thread becomes ready, to raise when it resumes."""
        m.abort = True
        m.ready.extend(m.at_sync)
        m.at_sync = []
        for waiting in m.meets.values():
            m.ready.extend(waiting)
            waiting.clear()

    def _open_sync(m):
        m.ready.extend(m.at_sync)
        m.at_sync = []

    def _hand_on(m):
        """The running thread stops (finished, or waits): the turn goes to the next ready thread; to
        the launcher once every thread has finished."""
        if m.at_sync and len(m.at_sync) == m.alive:     # the rest wait at syncthreads: it opens
            _open_sync(m)
        if not m.ready and m.finished < m.n:            # all wait, nothing can open: a deadlock
            m.deadlock = True
            _abort(m)
        if m.ready:
            m.ready.popleft().turn.release()
        else:
            m.all_done.release()

    def _wait(self, m, where):
        """Hand the turn on, wait for it again, raise if the block aborted meanwhile."""
        _hand_on(m)
        self.turn.acquire()
        if m.abort:
            raise RuntimeError(f"{'deadlock: the block' if m.deadlock else 'another thread'} stopped while "
                               f"this one waited at {where}")

    def _syncthreads(self):
        m = self._manager
        if m.abort:
            raise RuntimeError("abort flag set on syncthreads call")
        if len(m.at_sync) + 1 == m.alive:              # the last live thread: open, and run on
            _open_sync(m)
            return
        m.at_sync.append(self)
        _wait(self, m, "syncthreads")

    def sim_meet(key, count):
        """Simulator only: wait until `count` threads of this block have called sim_meet(key) (a
        barrier of part of the block: a warp's 32 threads, a warpgroup's 128); the last one runs on."""
        self = threading.current_thread()
        m = self._manager
        waiting = m.meets.setdefault(key, [])
        if len(waiting) + 1 == count:
            m.ready.extend(waiting)
            waiting.clear()
            return
        waiting.append(self)
        _wait(self, m, f"a meeting of {count} threads ({key})")

    def sim_yield():
        """Simulator only: let the block's other ready threads run before this one goes on (a thread
        polling for what another thread will do). Called from the host (no block running): nothing."""
        self = threading.current_thread()
        m = getattr(self, "_manager", None)
        if m is not None and m.ready:
            m.ready.append(self)
            _wait(self, m, "a yield")

    def _block_run(self, grid_point, *args):
        points = list(_np.ndindex(*self._block_dim))
        n = len(points)
        with _pool_lock:
            workers = _idle_workers[len(_idle_workers) - min(n, len(_idle_workers)):]
            del _idle_workers[len(_idle_workers) - len(workers):]
        while len(workers) < n:
            w = _SimThread()
            w.start()
            workers.append(w)
        bx, by = self._block_dim[0], self._block_dim[1] if len(self._block_dim) > 1 else 1
        for w, p in zip(workers, points):
            w.job = (self, args, p, p[0] + bx * (p[1] + by * p[2]))
        self.grid_point = _simkernel.Dim3(*grid_point)
        self.n = self.alive = n
        self.finished, self.abort, self.deadlock, self.first_error = 0, False, False, None
        self.ready, self.at_sync, self.meets = collections.deque(workers), [], {}
        self.all_done = threading.Lock()
        self.all_done.acquire()
        self.ready.popleft().turn.release()
        self.all_done.acquire()
        with _pool_lock:                    # a thread that raised leaves the pool (its thread-locals)
            _idle_workers.extend(w for w in workers if w.exception is None)
        if self.first_error is not None:
            raise self.first_error[0].with_traceback(self.first_error[1])

    _simkernel.BlockManager.run = _block_run
    _simkernel.BlockThread.syncthreads = _syncthreads

    # numba-cuda 0.30's simulator points a function's module at the launch's fake `cuda` module
    # on every call of a device function, and back when the last caller leaves: a generator, two
    # locks, an import and, each time no other thread is inside, a scan of the module's globals.
    # The kernels here call small device functions in their inner loops (tile copies, the
    # tensor-core step's twin), and that bookkeeping took about a third of the interpreter's time
    # in a tiny training step. This replacement swaps a module's `cuda` names once per launch
    # (on the first call from it) and puts the real module back when the launch ends; between
    # launches every module sees the real `cuda`, as before. A device function called from the
    # host (no launch running) keeps numba's own path.
    _REAL_CUDA = (cuda,)                 # in a tuple: a module global bound to `cuda` itself would be swapped too
    _launch_swaps = {}                   # id(module globals) -> (globals, the names swapped)
    _swap_lock = threading.Lock()
    _swapped_per_call = _simkernel.swapped_cuda_module
    _kernel_call = _simkernel.FakeCUDAKernel.__call__

    def _swap_in(fn, fake):
        g = fn.__globals__
        if id(g) not in _launch_swaps:
            with _swap_lock:
                if id(g) not in _launch_swaps:
                    names = [k for k, v in g.items() if v is _REAL_CUDA[0]]
                    for k in names:
                        g[k] = fake
                    _launch_swaps[id(g)] = (g, names)

    def _restore_all():
        with _swap_lock:
            for g, names in _launch_swaps.values():
                for k in names:
                    g[k] = _REAL_CUDA[0]
            _launch_swaps.clear()

    def _swapped_cuda_module(fn, fake):
        """swapped_cuda_module(fn, fake) inside a launch: swap once; the launch's end restores."""
        if fake is None:                                  # called from the host: numba's own way
            return _swapped_per_call(fn, fake)
        _swap_in(fn, fake)
        return contextlib.nullcontext()

    def _fake_kernel_call(self, *args):
        if _simkernel._kernel_context is not None:       # called inside a launch: a device function
            _swap_in(self.fn, _simkernel._kernel_context)
            return self.fn(*args)
        if self._device:                                   # a device function called from the host
            return _kernel_call(self, *args)
        try:                                               # a launch: restore the modules after it
            return _kernel_call(self, *args)
        finally:
            _restore_all()

    _simkernel.swapped_cuda_module = _swapped_cuda_module
    _simkernel.FakeCUDAKernel.__call__ = _fake_kernel_call

    # Two more costs of every simulated thread, with the same results:
    # - the kernels' array arguments reach them as the NumPy arrays the simulator's device arrays
    #   hold, not behind its FakeWithinKernelCUDAArray wrapper (two Python calls an element read);
    # - float32(x) (numba's type object called on a number) goes straight to NumPy's np.float32(x):
    #   numba's Type.__call__ imports its signature helper and runs an ABC isinstance check on
    #   every call. With types as arguments (a signature) it is numba's call, unchanged.
    _simkernel.FakeWithinKernelCUDAArray = lambda fake: fake._ary
    _PLAIN_NUMBERS = (float, int, bool, _np.float32, _np.float64, _np.int32, _np.int64, _np.uint8, _np.uint32,
                      _np.uint64, _np.bool_, _np.int8, _np.int16, _np.uint16, _np.float16)
    _type_call = _types.Type.__call__

    def _number_call(self, *args):
        if len(args) == 1 and type(args[0]) in _PLAIN_NUMBERS:
            return getattr(_np, self.name)(args[0])
        return _type_call(self, *args)

    _types.scalars.Float.__call__ = _number_call
    _types.scalars.Integer.__call__ = _number_call

MAX_BLOCK = 1024          # the largest block any kernel here is launched with (shared scratch size)
ELEMENTWISE_THREADS = 32 if SIMULATOR else 256      # elementwise_launch's block


class BlockDoesNotFit(ValueError):
    """A launcher's block cannot run this shape (a tile that does not split the head size, or
    needs more shared memory than a block has): the harness skips that block at that size."""


def blocks(gpu, sim):
    """Declare the block sizes a launcher is checked (andrea_numba.check) and timed (lab/bench/kernels.py)
    at, on a GPU and in the simulator; the first is the one it uses when called without `block=`.

        @blocks(gpu=(256, 64, 1024), sim=(4, 2))
        def layernorm_fwd(out, mean, rstd, x, g, b, eps, *, block, stream=0): ...

    What a "block" is belongs to the launcher: threads per block for most kernels, a tile shape
    for the products, (rows, threads per row) for attention. Its docstring says which."""
    choices = tuple(sim if SIMULATOR else gpu)

    def mark(launch):
        @functools.wraps(launch)
        def with_default(*args, block=None, **kwargs):
            return launch(*args, block=choices[0] if block is None else block, **kwargs)
        with_default.blocks = choices
        return with_default
    return mark


def rung(number: int):
    """Declare which rung of its op's ladder a launcher is: the engine names its launchers by what
    they are (mlp_fwd_tf32x3), the lab numbers every version of an op (lab/<module>.py's VERSIONS),
    and the harness's --version, the benchmarks and CHANGELOG.md speak of rungs by number.

        @rung(12)
        @blocks(gpu=..., sim=...)
        def mlp_fwd_tf32x3(out, h_pre, h, work, x, w_1, w_2, *, block, stream=0): ...
    """
    def mark(launch):
        launch.rung = number
        return launch
    return mark


# Numba types cuda.threadIdx.x (and blockIdx, gridDim) as a signed int32, and a signed index keeps
# Python's meaning: a[i] with i < 0 counts from the end, i // 32 and i % 32 round toward minus
# infinity. So every a[i] whose i comes from a thread index compiles to "if i < 0: i += n" for each
# dimension, and every i // 32 to a fix-up for negative i, because the compiler cannot tell that
# a thread index is never negative. Flash attention v7 drops them from v5's inner loops: 10-24%
# fewer PTX instructions besides the mma.sync (docs/kernels.md). Going through uint32 says so:
# int64(uint32(i)) is the same number, known to lie in [0, 2^32), and LLVM drops the wrap-around
# tests and the fix-ups. The same integers index the same elements: a kernel's bits do not change.
if SIMULATOR:           # the same numbers, as plain functions: a device function call costs the simulator
    def nonneg(i):
        """A thread or block index (or any int known to be >= 0), as it is: the simulator has no compiler."""
        return i

    def as_is(i):
        return i
else:
    @cuda.jit(device=True, inline="always")
    def nonneg(i):
        """A thread or block index (or any int known to be >= 0) as an int64 the compiler knows is >= 0."""
        return int64(uint32(i))

    @cuda.jit(device=True, inline="always")
    def as_is(i):
        """The index as it is (the kernels written before nonneg: their PTX unchanged)."""
        return i


def jit_as(fn, version):
    """cuda.jit(fn) named fn_v<version> (the lab's k_attn_flash_fwd_v3, ...): the name profilers and
    errors show, for a lab rung's kernel built once per tile or block shape. (The engine's kernels are
    named by what they are, never numbered: tests/test_engine_wing.py.)"""
    fn.__name__ = fn.__qualname__ = f"{fn.__name__}_v{version}"
    return cuda.jit(fn)


def device_name() -> str:
    """The GPU's name, or a note that the kernels run in the simulator (for logs and results)."""
    if SIMULATOR:
        return "CUDA simulator (NUMBA_ENABLE_CUDASIM=1)"
    name = cuda.get_current_device().name
    return name.decode() if isinstance(name, bytes) else str(name)


def address(arr) -> int:
    """The address of arr's first element: a device array's (its __cuda_array_interface__), or a
    NumPy array's (the simulator's arrays, lab/bench/ptxcheck.py's host arrays)."""
    face = getattr(arr, "__cuda_array_interface__", None) or arr.__array_interface__
    return int(face["data"][0])


def wide_rows(*arrays) -> bool:
    """Whether each C-contiguous 2-D array's rows are whole 16-byte chunks on 16-byte boundaries (the
    row kernels' 128-bit loads and stores: loss's k_loss_fwd_online/_bwd_v2, layernorm's v3)."""
    return all(a.shape[1] * a.dtype.itemsize % 16 == 0 and a.strides[1] == a.dtype.itemsize
               and a.strides[0] == a.dtype.itemsize * a.shape[1] and address(a) % 16 == 0 for a in arrays)


def _compiled(f, name: str, names: dict):
    """@cuda.jit function f's Python code compiled anew as `name` (as a profiler and the kernel cache
    see it) with the globals `names`, under f's own jit options (a kernel, a device function)."""
    fn = getattr(f, "py_func", None) or f.fn                           # a GPU's dispatcher / the simulator's
    again = types.FunctionType(fn.__code__.replace(co_name=name), names, name, fn.__defaults__, fn.__closure__)
    again.__qualname__ = name
    if SIMULATOR:
        options = dict(device=f._device, fastmath=f._fastmath)
    else:
        options = {k: f.targetoptions[k] for k in ("device", "inline", "fastmath", "lineinfo", "debug", "opt")
                   if k in f.targetoptions}
    return cuda.jit(**options)(again)


def compiled_with(f, name: str, **names):
    """One kernel or device function, as written, compiled anew as `name` with `names` in place of
    the globals it calls by those names: a variant that differs from f only in some device functions
    is f's code, not a copy of it (lab/decode.py's rungs)."""
    fn = getattr(f, "py_func", None) or f.fn
    return _compiled(f, name, {**fn.__globals__, **names})


def compiled_again(module_globals: dict, suffix: str, **constants) -> dict:
    """Every @cuda.jit function of a module (its kernels and device functions, found in
    module_globals) compiled again from its Python code, with `constants` in place of the module's
    globals of those names, each calling the others' new versions: {name: the new function}, each
    named name + suffix (as a profiler and the kernel cache see it). Numba compiles the globals a
    function reads as constants, so a flag read as a global is compiled out (a branch never taken
    leaves no code), where a flag passed as an argument is a test at every use: a module's kernels
    at another precision are the same code with another flag (kernels/decode.py, BF16)."""
    new = {**module_globals, **constants}
    out = {}
    for name, f in module_globals.items():
        fn = getattr(f, "py_func", None) or getattr(f, "fn", None)
        if not isinstance(fn, types.FunctionType) or fn.__globals__ is not module_globals:
            continue                                                   # (not ours: imported from elsewhere)
        out[name] = new[name] = _compiled(f, name + suffix, new)
    return out


def cdiv(a: int, b: int) -> int:
    """Ceiling division: blocks needed to cover a elements with b per block."""
    return (a + b - 1) // b


def pow2_threads(n: int, gpu_max: int = 256, sim_max: int = 4) -> int:
    """Threads per block for a row-wise kernel over rows of n elements: a power of two (block_sum
    needs one), at most gpu_max on a GPU and sim_max in the simulator. (The exercises' given
    launchers use it and elementwise_launch; the engine's launchers declare theirs with blocks.)"""
    cap = sim_max if SIMULATOR else gpu_max
    return min(cap, 1 << max(0, math.ceil(math.log2(max(1, n)))))


def elementwise_launch(n: int):
    """(blocks, threads) for one thread per element of an n-element array."""
    return cdiv(n, ELEMENTWISE_THREADS), ELEMENTWISE_THREADS


@cuda.jit(device=True)
def block_sum(buf, val):
    """Sum `val` over the threads of a block (its thread count a power of two; a 2-D block's threads
    counted row by row, i = threadIdx.y * blockDim.x + threadIdx.x): a tree in shared memory `buf`
    (at least as many floats as threads). Every thread gets the total. Fixed order: deterministic.
        step s = n/2, n/4, ..., 1:  buf[i] += buf[i + s] for i < s"""
    i = cuda.threadIdx.y * cuda.blockDim.x + cuda.threadIdx.x
    buf[i] = val
    cuda.syncthreads()
    s = cuda.blockDim.x * cuda.blockDim.y // 2
    while s > 0:
        if i < s:
            buf[i] += buf[i + s]
        cuda.syncthreads()
        s //= 2
    total = buf[0]
    cuda.syncthreads()              # buf may be reused right after
    return total


@cuda.jit(device=True)
def block_max(buf, val):
    """Maximum of `val` over the threads of a block, same tree as block_sum."""
    i = cuda.threadIdx.y * cuda.blockDim.x + cuda.threadIdx.x
    buf[i] = val
    cuda.syncthreads()
    s = cuda.blockDim.x * cuda.blockDim.y // 2
    while s > 0:
        if i < s:
            buf[i] = max(buf[i], buf[i + s])
        cuda.syncthreads()
        s //= 2
    total = buf[0]
    cuda.syncthreads()
    return total

