"""Is k_matmul_bf16_wgmma's PTX the flag-built v18 kernel's? Compiled for sm_90a without a GPU.

    python lab/bench/v18_ptx.py [--show]

The engine's written-out kernel (kernels/wgmma_tma.py) against the lab's flag-built kernel it was
written out from (lab/wgmma_tma.py: make_tma_kernel at the engine's flags, epilogue None, fixup 0),
at each GPU tile of matmul.TMA_TILES and each form (trans_a, trans_b), on the argument types of a
launch. The two are compared line by line once every mangled name (_Z...: the kernel's, its device
functions', its parameters') and every shared array's name (_cudapy_smem_<n>, numbered by the
process) is replaced by S<n> in order of first appearance and comments are dropped. The written-out kernel takes two arguments fewer (aux, counts: the flag-built kernel's
fused epilogue and split-K fixup, unread at those flags), so the only lines expected to differ are
those parameters' declarations (16 .param lines); any other line that differs is reported as a
change of the code. It needs NVVM and NVRTC (numba-cuda's own requirements), no driver and no GPU.
"""
import argparse
import difflib
import os
import re
import sys
from pathlib import Path
from types import SimpleNamespace

if os.environ.get("NUMBA_ENABLE_CUDASIM") == "1":
    print("error: lab/bench/v18_ptx.py compiles the kernels for a real GPU, which the simulator cannot: run it "
          "without NUMBA_ENABLE_CUDASIM=1", file=sys.stderr)
    sys.exit(2)
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import numba.cuda.dispatcher as _dispatcher  # noqa: E402
from numba import cuda, types  # noqa: E402

# device functions are compiled for the current device's compute capability: none here (ptxcheck.py)
_dispatcher.get_current_device = lambda: SimpleNamespace(compute_capability=(9, 0))
CC = (9, 0, "a")                  # wgmma needs sm_90a

F32_2, F32_3 = types.Array(types.float32, 2, "C"), types.Array(types.float32, 3, "C")
U16_2, I32_1 = types.Array(types.uint16, 2, "C"), types.Array(types.int32, 1, "C")
ARGS = (F32_2, F32_3, U16_2, U16_2, types.int64, types.int64, types.boolean, types.int64)   # out .. ksplit
FLAG_ARGS = ARGS + (F32_2, I32_1)                                                          # .. aux, counts


def normalized(ptx):
    """The PTX's lines without comments or blank lines, every mangled or shared array's name S<n>."""
    names, lines = {}, []
    for line in ptx.splitlines():
        s = line.split("//")[0].rstrip()
        if s:
            lines.append(re.sub(r"_Z\w+|_cudapy_smem_\d+", lambda m: names.setdefault(m.group(0), f"S{len(names)}"), s))
    return lines


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--show", action="store_true", help="print the lines that differ")
    args = ap.parse_args()
    from andrea_numba.kernels import matmul as MM
    from andrea_numba.kernels import wgmma_tma
    from lab import wgmma_tma as lab_tma
    changed = 0
    for BM, BN, BK, stages in MM.TMA_TILES["gpu"]:
        for ta, tb in ((False, False), (False, True), (True, False), (True, True)):
            kernel, threads = wgmma_tma.tma_kernel(BM, BN, stages, ta, tb)
            flag_fn, flag_threads = lab_tma.make_tma_kernel(BM, BN, stages, ta, tb)
            assert threads == flag_threads
            ptx = [cuda.compile_ptx(fn, types.void(*sig), cc=CC, launch_bounds=(threads, 1))[0]
                   for fn, sig in ((kernel.py_func, ARGS), (flag_fn, FLAG_ARGS))]
            engine, flags = map(normalized, ptx)
            diff = [d for d in difflib.unified_diff(flags, engine, lineterm="", n=0)
                    if d[:1] in "+-" and d[:3] not in ("+++", "---")]
            code = [d for d in diff if not re.fullmatch(r"[+-]\s*\.param \.u64 S\d+,?", d)]
            changed += bool(code)
            print(f"{BM} x {BN}, {stages} stages, trans_a {ta:d} trans_b {tb:d}: {len(engine)} lines against "
                  f"{len(flags)}; {len(diff)} differ, {len(code)} besides the parameters' declarations"
                  + ("" if code else ": the same code"), flush=True)
            if args.show and diff:
                print("\n".join(diff))
    print(f"{changed} kernels whose code differs from the flag-built kernel's")
    sys.exit(1 if changed else 0)


if __name__ == "__main__":
    main()
