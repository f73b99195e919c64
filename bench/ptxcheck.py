"""Compile kernels to PTX for the H200 (sm_90) on a machine without a GPU.

Typing errors in a @cuda.jit kernel only show when it is compiled for a real device, and the CUDA
simulator never compiles anything. This tool turns every kernel launch into a compile-only step:
it types the launch's arguments as a real launch would (numba.typeof) and runs Numba's CUDA
compiler down to PTX. It needs NVVM (pip install numba-cuda[cu12]) but no driver and no GPU.

    python bench/ptxcheck.py          # compiles every kernel the agreement harness launches

In code: `with compile_only(): some_launch_function(numpy arrays ...)`.
"""
import contextlib
import os
import sys
import types

if os.environ.get("NUMBA_ENABLE_CUDASIM") == "1":
    sys.exit("ptxcheck compiles for a real GPU: run it without NUMBA_ENABLE_CUDASIM=1")

import numba.cuda.dispatcher as _dispatcher  # noqa: E402
from numba import cuda, typeof  # noqa: E402
from numba.core import types as nbtypes  # noqa: E402

CC = (9, 0)
COMPILED = {}          # kernel name -> {argument signature: float64 instructions in its PTX}


@contextlib.contextmanager
def compile_only():
    """Inside: kernel launches compile to PTX for sm_90 and run nothing. Pass NumPy arrays."""
    orig_dev, orig_cfg = _dispatcher.get_current_device, _dispatcher.CUDADispatcher.configure
    _dispatcher.get_current_device = lambda: types.SimpleNamespace(compute_capability=CC)

    def configure(self, griddim, blockdim, stream=0, sharedmem=0):
        def launch(*args):
            sig = nbtypes.void(*(typeof(a) for a in args))
            ptx, _ = cuda.compile_ptx(self.py_func, sig, cc=CC)
            # float64 instructions in a float32 kernel usually mean an int or Python float
            # promoted the arithmetic: slow on the GPU and a different rounding from the twin
            f64 = sum(".f64" in line for line in ptx.splitlines())
            COMPILED.setdefault(self.py_func.__name__, {})[str(sig)] = f64
        return launch

    _dispatcher.CUDADispatcher.configure = configure
    try:
        yield
    finally:
        _dispatcher.get_current_device, _dispatcher.CUDADispatcher.configure = orig_dev, orig_cfg


def main():
    from andrea_numba import check
    with compile_only():
        check.launch_every_kernel()
    for name in sorted(COMPILED):
        sigs = COMPILED[name]
        print(f"{name:<32} {len(sigs)} signature(s) compiled for sm_{CC[0]}{CC[1]}, "
              f"float64 instructions: {max(sigs.values())}")
    print(f"{len(COMPILED)} kernels compiled to PTX")


if __name__ == "__main__":
    main()
