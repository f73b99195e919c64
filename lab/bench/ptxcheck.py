"""Compile kernels to PTX for the H200 (sm_90) on a machine without a GPU.

Typing errors in a @cuda.jit kernel only show when it is compiled for a real device, and the CUDA
simulator never compiles anything. This tool turns every kernel launch into a compile-only step:
it types the launch's arguments as a real launch would (numba.typeof) and runs Numba's CUDA
compiler down to PTX. It needs NVVM (pip install numba-cuda[cu12]) but no driver and no GPU.

    python lab/bench/ptxcheck.py          # compiles every kernel the agreement harness launches
    python lab/bench/ptxcheck.py --v12    # matmul v12's kernels at each GPU tile: instruction counts,
                                      # registers (with ptxas on the PATH), local memory
    python lab/bench/ptxcheck.py --v13    # the same for matmul v13 (cp.async ring): cp.async, commit,
                                      # wait_group, ldmatrix, mma, bar.sync in the K loop
    python lab/bench/ptxcheck.py --decode # the KV-cache decoder's step at 12M: its kernels, their
                                      # registers (with ptxas on the PATH)
    python lab/bench/ptxcheck.py --model bf16m   # one forward + backward of the 12M model with this
                                      # recipe (the engine's or a lab rung), every kernel it launches
                                      # compiled for sm_90a: what a GPU run would compile first

In code: `with compile_only(): some_launch_function(numpy arrays ...)`.
"""
import contextlib
import os
import sys
import types

if os.environ.get("NUMBA_ENABLE_CUDASIM") == "1":     # (compile_time.py imports this module: its name is said)
    print(f"error: lab/bench/{os.path.basename(sys.argv[0])} compiles the kernels for a real GPU, which the "
          "simulator cannot: run it without NUMBA_ENABLE_CUDASIM=1", file=sys.stderr)
    sys.exit(2)

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))   # the checkout, as lab/bench/gemm.py

import numba.cuda.dispatcher as _dispatcher  # noqa: E402
import numpy as np  # noqa: E402
from numba import cuda, typeof  # noqa: E402
from numba.core import types as nbtypes  # noqa: E402

CC = (9, 0)
COMPILED = {}          # kernel name -> {argument signature: float64 instructions in its PTX}
PTX = {}               # kernel name -> the PTX of its last compiled launch


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
    from andrea_numba.kernels import matmul, tma
    saved = [(tma.TMAPS, "address"), (matmul, "sm_count"), (_dispatcher, "get_current_device"), (_dispatcher.CUDADispatcher, "configure"),
             (cuda, "to_device"), (cuda, "device_array"), (cuda, "synchronize"), (cuda, "stream"),
             (matmul, "resident_blocks"), (matmul, "allow_shared")]
    saved = [(obj, name, getattr(obj, name)) for obj, name in saved]
    matmul.resident_blocks = lambda *args: 264     # split-K asks the driver for occupancy: the H200's
    matmul.allow_shared = lambda *args: None       # (the driver's attribute for dynamic shared memory)
    tma.TMAPS.address = lambda *args: 0            # matmul v18's tensor maps (the driver encodes them)
    matmul.sm_count = lambda: 132                  # the H200's multiprocessors
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
            PTX[self.py_func.__name__] = ptx
        return launch

    _dispatcher.CUDADispatcher.configure = configure
    try:
        yield
    finally:
        for obj, name, value in saved:
            setattr(obj, name, value)


# What matmul v12's kernel (kernels/half_tile.py) should hold: the K loop's body is one stage; the
# prologue copies the first stage (its global loads, cvt and shared stores) and the epilogue adds
# into out (its scalar ld.global.f32 when accumulating), so those show twice or more in the whole.
V12_COUNTS = {"ldmatrix": "ldmatrix.sync", "mma": "mma.sync", "cvt.bf16x2": "cvt.rn.bf16x2.f32",
              "ld.global.v4": "ld.global.v4.f32", "ld.global (scalar)": "ld.global.f32",
              "st.shared": "st.shared", "bar.sync": "bar.sync", "local": ".local"}


def _loop_body(ptx):
    """The lines of the K loop of a v12 kernel: from the label the loop's back branch goes to, to
    that branch (the loop whose body holds the mma.sync)."""
    lines = ptx.splitlines()
    first_mma = next(i for i, line in enumerate(lines) if "mma.sync" in line)
    for j in range(first_mma, len(lines)):
        parts = lines[j].split()
        if "bra" in lines[j] and parts and parts[-1].rstrip(";") + ":" in lines[:first_mma]:
            return lines[lines.index(parts[-1].rstrip(";") + ":"):j + 1]
    return []


def _ptxas(ptx):
    """'N registers, S bytes spill stores' from ptxas -v for sm_90, or why not."""
    import re
    import shutil
    import subprocess
    import tempfile
    if not shutil.which("ptxas"):
        return "ptxas not on the PATH"
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "k.ptx")
        with open(path, "w") as f:
            f.write(ptx)
        p = subprocess.run(["ptxas", f"-arch=sm_{CC[0]}{CC[1]}", "-v", path, "-o", os.path.join(d, "k.cubin")],
                           capture_output=True, text=True)
    regs = re.search(r"Used (\d+) registers", p.stderr)
    spill = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", p.stderr)
    stack = re.search(r"(\d+) bytes stack frame", p.stderr)
    if not regs:
        return "ptxas: " + " ".join(p.stderr.split())[-300:]
    return (f"{regs.group(1)} registers, {stack.group(1) if stack else '?'} bytes stack, "
            f"{spill.group(1) if spill else '?'}/{spill.group(2) if spill else '?'} bytes spilled (stores/loads)")


def v12_report():
    """Compile matmul v12 at each GPU tile, every transpose, with 128-bit copies (an aligned
    launch's kernel), and print its instruction counts: in the whole kernel and in the K loop (one stage)."""
    from numba.core import types as nbt

    from andrea_numba.kernels import matmul
    from lab import matmul as lab_matmul
    M = N = K = 256
    print("| tile | op | " + " | ".join(f"{k} (loop / all)" for k in V12_COUNTS) + " | ptxas |")
    print("|---" * (3 + len(V12_COUNTS)) + "|")
    with compile_only():
        for block in lab_matmul.matmul_v12.blocks:
            for ta, tb in ((False, False), (False, True), (True, False), (True, True)):
                a = np.zeros((K, M) if ta else (M, K), np.float32)
                b = np.zeros((N, K) if tb else (K, N), np.float32)
                out = np.zeros((M, N), np.float32)
                kernel = matmul._k_matmul_warp(("v12", *block, True), ta, tb)
                sig = nbt.void(*(typeof(x) for x in (out, out.reshape(1, M, N), a, b, True, K)))
                ptx, _ = cuda.compile_ptx(kernel.py_func, sig, cc=CC)
                body = "\n".join(_loop_body(ptx))
                cells = [f"{body.count(pat)} / {ptx.count(pat)}" for pat in V12_COUNTS.values()]
                op = f"{'a^T' if ta else 'a'} @ {'b^T' if tb else 'b'}"
                print(f"| {block} | {op} | " + " | ".join(cells) + f" | {_ptxas(ptx)} |", flush=True)


# What matmul v13's kernel (kernels/half_tile.py, the cp.async ring) should hold in its K loop at
# 128 x 128 (8 warps): 4 cp.async (2 chunks of a, 2 of b a thread), one commit, one wait_group
# STAGES-2, one bar.sync, v12's 12 ldmatrix and 32 mma.sync, no global load or cvt (the chunks never
# pass through registers); the st.shared are the zero fills of chunks past an edge (a branch).
V13_COUNTS = {"cp.async": "cp.async.cg.shared.global", "commit": "cp.async.commit_group",
              "wait_group": "cp.async.wait_group", "ldmatrix": "ldmatrix.sync", "mma": "mma.sync",
              "bar.sync": "bar.sync", "st.shared": "st.shared", "ld.global": "ld.global",
              "cvt.bf16x2": "cvt.rn.bf16x2.f32", "local": ".local"}


def v13_report():
    """Compile matmul v13's product kernel at each GPU tile, every transpose, on the cp.async path
    (bf16 copies whose rows are whole 16-byte chunks), and print its instruction counts in the K
    loop and in the whole kernel, and ptxas's registers and spills; then one kernel of the guarded
    path (copies with rows not a multiple of 8 values)."""
    from numba.core import types as nbt

    from andrea_numba.kernels import matmul
    from andrea_numba.kernels.half_tile import async_resolve
    M = N = K = 256
    print("| tile | op | " + " | ".join(f"{k} (loop / all)" for k in V13_COUNTS) + " | ptxas |")
    print("|---" * (3 + len(V13_COUNTS)) + "|")
    runs = [(block, ta, tb, K) for block in matmul.matmul_bf16.blocks
            for ta, tb in ((False, False), (False, True), (True, False), (True, True))]
    runs.append((matmul.matmul_bf16.blocks[0], False, False, K - 1))      # the guarded copies
    with compile_only():
        for block, ta, tb, k in runs:
            a = np.zeros((k, M) if ta else (M, k), np.uint16)            # the bf16 copies
            b = np.zeros((N, k) if tb else (k, N), np.uint16)
            out = np.zeros((M, N), np.float32)
            tile = async_resolve(block, a, b)
            kernel = matmul._k_matmul_warp(tile, ta, tb)
            sig = nbt.void(*(typeof(x) for x in (out, out.reshape(1, M, N), a, b, True, k)))
            ptx, _ = cuda.compile_ptx(kernel.py_func, sig, cc=CC)
            body = "\n".join(_loop_body(ptx))
            cells = [f"{body.count(pat)} / {ptx.count(pat)}" for pat in V13_COUNTS.values()]
            op = f"{'a^T' if ta else 'a'} @ {'b^T' if tb else 'b'}" + ("" if tile[6] else f", K = {k}: guarded")
            print(f"| {tile[1:6]}, {tile[7]} stages | {op} | " + " | ".join(cells) + f" | {_ptxas(ptx)} |", flush=True)


def model_report(args):
    """--model RECIPE: GPUModel(recipe=RECIPE) at 12M, B = 2, T = 64, one forward and backward with every
    launch compiled for sm_90a (wgmma needs the "a"), as the trainer's first step would compile them."""
    from andrea_numba import gpu_model
    from andrea_numba.config import load_config
    from lab.recipes import NAMES, get
    ours = [n for n in NAMES if get(n).library is None]
    if len(args) != 1 or args[0] not in ours:
        sys.exit(f"lab/bench/ptxcheck.py: --model takes one of the recipes of our kernels: {', '.join(ours)}")
    global CC
    CC = (9, 0, "a")
    m = load_config("12M").model
    tokens = np.zeros((2, 64), np.int32)
    with compile_only():
        model = gpu_model.GPUModel(m, 2, 64, recipe=get(args[0]))
        model.forward(tokens, tokens)
        model.backward()
    for name in sorted(COMPILED):
        print(f"{name:<32} float64 instructions: {max(COMPILED[name].values())}")
    print(f"recipe {args[0]}: {len(COMPILED)} kernels of one forward + backward compiled to PTX for sm_90a")


def decode_report():
    """--decode: the KV-cache decoder's step at 12M (window 512), every kernel of it compiled for sm_90
    as Decoder.work launches them (the default blocks), at fp32 and bf16, and the lab's rungs 4 (the step in one launch),
    5 to 9 (the products with 128-bit loads; with their sums by shuffles; the classifier's too; the
    trees of attention and the draw), with
    ptxas's registers: a
    block of 1024 threads needs at most 64 registers a thread."""
    from andrea_numba.config import load_config
    from andrea_numba.decode import Decoder
    from andrea_numba.layout import n_params
    m = load_config("12M").model
    saved = cuda.pinned_array
    cuda.pinned_array = lambda shape, dtype=np.float32: np.zeros(shape, dtype)
    try:
        with compile_only():
            dec = Decoder(m, np.zeros(n_params(m), np.float32), 512)
            dec.work(0)
            Decoder(m, np.zeros(n_params(m), np.float32), 512, precision="bf16").work(0)   # the bf16 twins
            from lab.decode_step import PersistentDecoder        # rung 4: the step in one launch
            PersistentDecoder(m, np.zeros(n_params(m), np.float32), 512).work(0)
            from andrea_numba.kernels import decode as kd
            from lab.decode import VERSIONS                       # rungs 5 to 7: the products with 128-bit loads
            saved_launchers = {name: getattr(kd, name) for name in VERSIONS}
            try:
                for rung in (5, 6, 7, 8, 9):
                    for name, rungs in VERSIONS.items():
                        setattr(kd, name, rungs[rung])
                    Decoder(m, np.zeros(n_params(m), np.float32), 512).work(0)
            finally:
                for name, f in saved_launchers.items():
                    setattr(kd, name, f)
    finally:
        cuda.pinned_array = saved
    for name in sorted(COMPILED):
        print(f"{name:<24} float64 instructions: {max(COMPILED[name].values())}; {_ptxas(PTX[name])}")
    print(f"the decoder's step: {len(COMPILED)} kernels compiled to PTX for sm_{CC[0]}{CC[1]}")


def main():
    import warnings
    args = sys.argv[1:]
    if {"-h", "--help"} & set(args):
        print(__doc__.split("In code:")[0].rstrip())
        return
    if args[:1] == ["--model"]:
        model_report(args[1:])
        return
    unknown = sorted(set(args) - {"--v12", "--v13", "--decode"})
    if unknown:
        sys.exit(f"lab/bench/ptxcheck.py: unknown argument {unknown[0]} (it takes --v12, --v13, --decode, "
                 f"--model KIND or nothing; --help)")
    if "--decode" in args:
        decode_report()
        return
    if "--v12" in sys.argv[1:]:
        v12_report()
        return
    if "--v13" in sys.argv[1:]:
        v13_report()
        return

    from andrea_numba import check
    with compile_only(), warnings.catch_warnings():
        warnings.simplefilter("ignore")          # the harness compares garbage here: nothing ran
        check.launch_every_kernel()
        # a weight gradient's shape (long K, one output tile) takes the split-K path of the
        # warp-tile products, which the harness's small shapes do not reach on a GPU's settings
        from lab import matmul
        out, a = np.zeros((64, 64), np.float32), np.zeros((8192, 64), np.float32)
        for launch in (matmul.matmul_v3, matmul.matmul_v4, matmul.matmul_v5, matmul.matmul_v6, matmul.matmul_v7,
                       matmul.matmul_tf32x3, matmul.matmul_v12, matmul.matmul_bf16):
            launch(out, np.zeros(matmul.splitk_work(64), np.float32), a, a, trans_a=True, accumulate=True)
        # flash attention v2 on at the models' head size (the harness's tiny size has hs = 4),
        # every declared block, with dropout (v11, v12: bf16 and fp16 products)
        from lab import attn_flash as lab_attn_flash
        x, lse = np.zeros((2, 128, 384), np.float32), np.zeros((2, 6, 128), np.float32)
        for v in sorted(lab_attn_flash.VERSIONS["attn_flash_bwd"])[1:]:
            fwd, bwd = lab_attn_flash.flash_pair(v)
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
