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
import numpy as np  # noqa: E402
from numba import cuda, typeof  # noqa: E402
from numba.core import types as nbtypes  # noqa: E402

CC = (9, 0)
COMPILED = {}          # kernel name -> {argument signature: float64 instructions in its PTX}


class HostArray(np.ndarray):
    """A NumPy array that answers the device-array calls the engine makes (no GPU needed)."""

    def copy_to_device(self, src, stream=0):
        self[...] = src

    def copy_to_host(self, stream=0):
        return np.array(self)


def _host_array(a):
    return np.array(a).view(HostArray)


@contextlib.contextmanager
def compile_only():
    """Inside: kernel launches compile to PTX for sm_90 and run nothing; device allocations and
    copies become NumPy arrays, so whole programs (the harness, GPUModel) can run through."""
    from andrea_numba.kernels import matmul
    saved = [(_dispatcher, "get_current_device"), (_dispatcher.CUDADispatcher, "configure"),
             (cuda, "to_device"), (cuda, "device_array"), (cuda, "synchronize"), (cuda, "stream"),
             (matmul, "resident_blocks")]
    saved = [(obj, name, getattr(obj, name)) for obj, name in saved]
    matmul.resident_blocks = lambda *args: 264     # split-K asks the driver for occupancy: the H200's
    _dispatcher.get_current_device = lambda: types.SimpleNamespace(compute_capability=CC)
    cuda.to_device = lambda a, stream=0: _host_array(a)
    cuda.device_array = lambda shape, dtype=np.float32, stream=0: _host_array(np.zeros(shape, dtype))
    cuda.synchronize = lambda: None
    cuda.stream = lambda: types.SimpleNamespace(synchronize=lambda: None)

    def configure(self, griddim, blockdim, stream=0, sharedmem=0):
        def launch(*args):
            sig = nbtypes.void(*(typeof(np.asarray(a) if isinstance(a, np.ndarray) else a) for a in args))
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
        for obj, name, value in saved:
            setattr(obj, name, value)


def main():
    import warnings

    from andrea_numba import check
    with compile_only(), warnings.catch_warnings():
        warnings.simplefilter("ignore")          # the harness compares garbage here: nothing ran
        check.launch_every_kernel()
        # a weight gradient's shape (long K, one output tile) takes the split-K path of the
        # warp-tile products, which the harness's small shapes do not reach on a GPU's settings
        from andrea_numba.kernels import matmul
        out, a = np.zeros((64, 64), np.float32), np.zeros((8192, 64), np.float32)
        for launch in (matmul.matmul_v3, matmul.matmul_v4, matmul.matmul_v5, matmul.matmul_v6, matmul.matmul_v7,
                       matmul.matmul_v8):
            launch(out, np.zeros(matmul.splitk_work(64), np.float32), a, a, trans_a=True, accumulate=True)
        # flash attention v2 to v8 at the models' head size (the harness's tiny size has hs = 4),
        # every declared block, with dropout
        from andrea_numba.kernels import attn_flash
        x, lse = np.zeros((2, 128, 384), np.float32), np.zeros((2, 6, 128), np.float32)
        for v in (2, 3, 4, 5, 6, 7, 8, 9, 10):
            fwd, bwd = attn_flash.flash_pair(v)
            for blk in fwd.blocks:
                fwd(x, lse, x, x, x, 6, 0.1, 7, block=blk)
            for blk in bwd.blocks:
                bwd(x, x, x, lse, x, x, x, x, x, lse, 6, 0.1, 7, block=blk)
    for name in sorted(COMPILED):
        sigs = COMPILED[name]
        print(f"{name:<32} {len(sigs)} signature(s) compiled for sm_{CC[0]}{CC[1]}, "
              f"float64 instructions: {max(sigs.values())}")
    print(f"{len(COMPILED)} kernels compiled to PTX")


if __name__ == "__main__":
    main()
