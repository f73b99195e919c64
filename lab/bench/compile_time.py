"""How long the engine's kernels take to compile, kernel by kernel, without a GPU.

A kernel is compiled at its first launch (Numba types and lowers it, NVVM turns it into PTX, the
driver into machine code). Compiled that way, one after another, the default 12M run's first step
ended 30.6 s after launch on an H200, an eighth of the run; the trainer now compiles them ahead on
worker processes (andrea_numba.precompile: 11 s there). This tool runs one forward + backward of
GPUModel at a size under lab/bench/ptxcheck.py's compile-only mode, compiles each kernel once per
argument signature as a launch would (to PTX for sm_90; the driver's last step is not counted) and
prints the seconds each took, largest first.

    python lab/bench/compile_time.py [--size 12M] [--batch 16] [--seq 512]
"""
import collections
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import ptxcheck  # noqa: E402  (it refuses to run in the simulator)
import numba.cuda.dispatcher as _dispatcher  # noqa: E402
from numba import cuda, typeof  # noqa: E402
from numba.core import types as nbtypes  # noqa: E402

from andrea_numba.cli import Parser, positive_int  # noqa: E402
from andrea_numba.config import ConfigError, load_config  # noqa: E402
from andrea_numba.gpu_model import GPUModel  # noqa: E402


def main(argv=None):
    ap = Parser(description="Seconds each of the engine's kernels takes to compile (to PTX, no GPU needed).")
    ap.add_argument("--size", default="12M", help="tiny, 12M, 120M or a config file (default 12M)")
    ap.add_argument("--batch", type=positive_int, help="batch size B (default: the config's)")
    ap.add_argument("--seq", type=positive_int, help="sequence length T (default: the config's)")
    args = ap.parse_args(argv)
    try:
        cfg = load_config(args.size)
    except ConfigError as e:
        sys.exit(f"error: {e}")
    m, t = cfg.model, cfg.train
    B, T = args.batch or t.batch_size, min(args.seq or t.seq_len, m.context_length)
    seconds = {}                                   # (kernel, signature) -> (name, seconds)

    def configure(self, griddim, blockdim, stream=0, sharedmem=0):
        def launch(*launch_args):
            sig = nbtypes.void(*(typeof(np.asarray(a) if isinstance(a, np.ndarray) else a) for a in launch_args))
            key = (id(self.py_func), str(sig))
            if key not in seconds:                 # a launch compiles once per signature
                t0 = time.perf_counter()
                cuda.compile_ptx(self.py_func, sig, cc=ptxcheck.CC)
                seconds[key] = (self.py_func.__name__, time.perf_counter() - t0)
        return launch

    with ptxcheck.compile_only():
        _dispatcher.CUDADispatcher.configure = configure       # (compile_only puts back the original)
        t0 = time.perf_counter()
        model = GPUModel(m, B, T)
        tokens = np.zeros((B, T), np.int32)
        model.forward(tokens, tokens)
        model.backward()
        wall = time.perf_counter() - t0
    by_name = collections.defaultdict(list)
    for name, s in seconds.values():
        by_name[name].append(s)
    print(f"{cfg.name}, B={B} T={T}: one forward + backward compiles {len(seconds)} kernel signatures, "
          f"{sum(s for _, s in seconds.values()):.1f} s of compiling ({wall:.1f} s in all)")
    print("| kernel | signatures | seconds |")
    print("|---|---|---|")
    for name, ss in sorted(by_name.items(), key=lambda kv: -sum(kv[1])):
        print(f"| {name} | {len(ss)} | {sum(ss):.2f} |")


if __name__ == "__main__":
    main()
