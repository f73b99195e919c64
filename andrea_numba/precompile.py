"""Compile a run's kernels before its first step, on several processes at once.

Numba compiles a @cuda.jit kernel the first time it is launched with new argument types, in the
launching process, one kernel after another: it types and lowers the kernel in Python, NVVM turns
the LLVM IR into PTX, the driver's assembler turns the PTX into machine code (a cubin). The 12M
training step launches 28 kernel signatures, and its first step used to end 30 s after launch,
most of that in Numba's Python, which holds the GIL: threads would not help, processes do.

    launches = record_launches(lambda: trainer.step_work(stream), ...)   # 1. what a step launches
    report = compile_ahead(launches, workers=12, log=print)              # 2. and 3.

1. record_launches runs the launching code with every kernel launch turned into a note of
   (kernel, argument types): nothing runs on the GPU, nothing is compiled.
2. compile_ahead sends each kernel to a pool of worker processes. Numba pickles a @cuda.jit kernel
   as its Python function (code, closure and globals), so a worker rebuilds the same kernel,
   compiles it for the same argument types on the same GPU, and sends back the compiled kernel (its
   PTX and cubin, in the serialised form numba's own on-disk cache uses).
3. The run's process installs each compiled kernel in its own dispatcher (add_overload, what
   numba's compile does after compiling): the first launch finds it compiled and only loads it.

Same source, same argument types, same compiler: the same PTX as a launch in the run's process
compiles (lab/bench/compile_ahead_check.py compares them instruction by instruction; only generated
symbol names and the order of declarations differ), so the same bits. A kernel that cannot be
compiled ahead (a worker fails, a launch the recording did not see) is compiled on its first
launch, as before. In the simulator nothing is compiled: this module does nothing there.

Given a kernel cache (kernel_cache.py), compile_ahead first loads every kernel compiled by an
earlier run of the same sources on the same GPU and toolchain, and stores what it compiles: the
second run of a config compiles nothing.
"""
from __future__ import annotations

import concurrent.futures as cf
import contextlib
import multiprocessing
import os
import pickle
import time

from .kernels.common import SIMULATOR

# A worker process holds a CUDA context of its own while it compiles (a few hundred MiB of the
# GPU's memory, given back when the pool closes): never more workers than the free memory allows.
WORKER_GPU_BYTES = 1 << 30
MAX_WORKERS = 16


def default_workers() -> int:
    """One worker per CPU this process may run on, at most MAX_WORKERS."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:                     # not Linux
        cpus = os.cpu_count() or 1
    return max(1, min(MAX_WORKERS, cpus))


@contextlib.contextmanager
def _recording(notes):
    """Inside: a kernel launch appends (dispatcher, argument types) to `notes` and runs nothing."""
    import numba
    import numba.cuda.dispatcher as dispatcher

    from .kernels import cublaslt, matmul

    def configure(self, griddim, blockdim, stream=0, sharedmem=0):
        def launch(*args):
            notes.append((self, tuple(numba.typeof(a) for a in args)))
        return launch

    # The split-K products ask the occupancy API how many blocks of the compiled kernel the GPU
    # runs at once, which would compile it here. Any count gives the same argument types; one
    # block per multiprocessor (the fewest) lets every launch that may split record its sum too.
    # The products with more than 48 KiB of dynamic shared memory (bf16 on wgmma) first allow it
    # (matmul.allow_shared), which compiles the kernel and returns it for its occupancy: here a
    # stand-in answers with the same count, compiling nothing, or the recording would compile
    # those kernels one after another in this process, kernel cache or not.
    sms = matmul.sm_count()                    # the multiprocessors (the simulator: its stand-in)
    saved = [(dispatcher.CUDADispatcher, "configure"), (matmul, "resident_blocks"), (matmul, "allow_shared"),
             (cublaslt, "RECORDING")]
    saved = [(obj, name, getattr(obj, name)) for obj, name in saved]
    dispatcher.CUDADispatcher.configure = configure
    matmul.resident_blocks = lambda *args: sms
    matmul.allow_shared = lambda kernel, args, nbytes: None if nbytes <= 48 * 1024 else _Occupancy(sms)
    cublaslt.RECORDING = True                  # the library's products (products="cublas..."): skipped
    try:
        yield notes
    finally:
        for obj, name, value in saved:
            setattr(obj, name, value)


class _Occupancy:
    """matmul.allow_shared's answer while launches are recorded: a compiled kernel's occupancy
    query, answered with a fixed count of resident blocks."""

    def __init__(self, blocks: int):
        self.blocks = blocks

    def max_cooperative_grid_blocks(self, *args) -> int:
        return self.blocks


def record_launches(*launching) -> list:
    """Call each function in `launching` with kernel launches recorded instead of run; returns the
    distinct (dispatcher, argument types) pairs in first-launch order. The functions may copy
    between host and device (those run), but must not read results of the launches."""
    notes = []
    with _recording(notes):
        for fn in launching:
            fn()
    seen, unique = set(), []
    for disp, argtypes in notes:
        if (id(disp), argtypes) not in seen:
            seen.add((id(disp), argtypes))
            unique.append((disp, argtypes))
    return unique


def _start_worker():
    from numba import cuda
    cuda.current_context()                     # the context at start-up, in parallel with the others


def _compile_in_worker(payload: bytes):
    """In a worker: rebuild the kernel, compile it for the argument types on this process's GPU
    (numba's compile also loads the cubin: the driver's assembler has run), send it back."""
    t0 = time.perf_counter()
    disp, argtypes = pickle.loads(payload)
    kernel = disp.compile(argtypes)
    return pickle.dumps(kernel), time.perf_counter() - t0


def plan_workers(n_tasks: int, workers: int, free_gpu_bytes: int) -> int:
    """Worker processes to start: no more than the tasks, the request, or the free GPU memory's
    share (WORKER_GPU_BYTES each) allow."""
    return max(0, min(n_tasks, workers, free_gpu_bytes // WORKER_GPU_BYTES))


def load_cached(todo, cache, report, log=None) -> list:
    """Install every kernel of `todo` that `cache` holds; returns the rest as (dispatcher, argtypes,
    key) to compile (key None: not to be stored)."""
    from .kernel_cache import lookup, toolchain
    t0 = time.perf_counter()
    hits, misses = lookup(cache, todo, toolchain())
    for disp, argtypes, key, payload in hits:
        try:
            kernel = pickle.loads(payload)
        except Exception:                      # written by another numba, or damaged: compiled again
            cache.discard(key)
            misses.append((disp, argtypes, key))
            continue
        if argtypes not in disp.overloads:
            disp.add_overload(kernel, argtypes)
        report["cached"] += 1
    report["cache_seconds"] = time.perf_counter() - t0
    if log:
        log(f"kernel cache: {report['cached']} of {len(todo)} kernel signatures loaded from {cache.dir} "
            f"in {report['cache_seconds']:.2f} s" + (f"; {len(misses)} to compile" if misses else ""))
    return misses


def compile_ahead(launches, workers: int, log=None, cache=None) -> dict:
    """Compile every (dispatcher, argument types) in `launches` not compiled yet, on up to `workers`
    processes, and install the results. With a KernelCache (kernel_cache.py), the kernels it holds
    are loaded instead, and those compiled here are stored in it. Returns {"kernels", "cached",
    "ahead", "stored", "workers", "seconds", "cache_seconds", "compile_seconds", "failed": [(kernel
    name, reason)]}; nothing raises: a kernel not compiled ahead is compiled on its first launch."""
    t0 = time.perf_counter()
    todo = [(d, a) for d, a in launches if a not in d.overloads]
    report = {"kernels": len(todo), "cached": 0, "ahead": 0, "stored": 0, "workers": 0, "seconds": 0.0,
              "cache_seconds": 0.0, "compile_seconds": 0.0, "failed": []}
    if SIMULATOR or not todo:
        return report
    keyed = load_cached(todo, cache, report, log) if cache is not None else [(d, a, None) for d, a in todo]
    if not keyed or workers < 1:
        report["seconds"] = time.perf_counter() - t0
        return report
    from numba import cuda
    payloads = []
    for disp, argtypes, key in keyed:
        try:
            payloads.append((pickle.dumps((disp, argtypes)), disp, argtypes, key))
        except Exception as e:                 # a closure numba cannot pickle: compiled at its launch
            report["failed"].append((disp.py_func.__name__, f"not picklable: {type(e).__name__}"))
    payloads.sort(key=lambda p: -len(p[0]))    # the largest kernels (most code to compile) first
    n = plan_workers(len(payloads), workers, cuda.current_context().get_memory_info()[0])
    report["workers"] = n
    if n == 0:
        return report
    if log:
        log(f"compiling {len(payloads)} kernel signatures on {n} processes before the first step")
    ctx = multiprocessing.get_context("spawn")  # a forked child would inherit this process's CUDA state
    try:
        with cf.ProcessPoolExecutor(max_workers=n, mp_context=ctx, initializer=_start_worker) as pool:
            futures = {pool.submit(_compile_in_worker, p): (disp, argtypes, key) for p, disp, argtypes, key in payloads}
            for fut in cf.as_completed(futures):
                disp, argtypes, key = futures[fut]
                try:
                    blob, seconds = fut.result()
                    kernel = pickle.loads(blob)
                except Exception as e:
                    report["failed"].append((disp.py_func.__name__, f"{type(e).__name__}: {' '.join(str(e).split())[:200]}"))
                    continue
                if argtypes not in disp.overloads:
                    disp.add_overload(kernel, argtypes)
                report["ahead"] += 1
                report["compile_seconds"] += seconds
                if key is not None and cache.put(key, blob):
                    report["stored"] += 1
    except Exception as e:                     # the pool itself failed (e.g. a worker was killed)
        report["failed"].append(("(process pool)", f"{type(e).__name__}: {' '.join(str(e).split())[:200]}"))
    if report["stored"]:
        cache.prune()
    report["seconds"] = time.perf_counter() - t0
    if log:
        log(f"compiled {report['ahead']} of {len(payloads)} kernel signatures in {report['seconds']:.1f} s "
            f"({report['compile_seconds']:.1f} s of compiling on {n} processes)"
            + (f", {report['stored']} stored in the kernel cache" if report["stored"] else "")
            + (f"; {len(report['failed'])} left to compile at their first launch" if report["failed"] else ""))
    return report
