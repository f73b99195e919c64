"""The kernel cache (andrea_numba/kernel_cache.py): a compiled kernel is served again only for the
same sources, values, argument types and toolchain.

In the simulator nothing compiles, so the cache's decisions are tested on its keys and on
precompile.load_cached with stand-in dispatchers; test_gpu_recompile runs the whole path (compile,
store, load, recompile after a change in another module) on a GPU."""
import json
import os
import pickle
import subprocess
import sys
import textwrap
import time

import pytest

from andrea_numba import kernel_cache as KC
from andrea_numba.kernels.common import SIMULATOR
from andrea_numba.precompile import load_cached

ARGS = "(array(float32, 1d, C),)"

DEP = """
from numba import cuda

STEP = {step}


@cuda.jit(device=True)
def bump(x):
    return x + STEP
"""

KERN = """
from numba import cuda

from . import dep


@cuda.jit
def k_bump(out):
    out[0] = dep.bump(out[0])


def make(scale):
    @cuda.jit
    def k_scaled(out):
        out[0] = out[0] * scale
    return k_scaled
"""


def write_package(root, name, step=1):
    """A package `name` under root: dep.py (a device function) and kern.py (kernels that call it)."""
    pkg = root / name
    pkg.mkdir(exist_ok=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "dep.py").write_text(DEP.format(step=step))
    (pkg / "kern.py").write_text(KERN)
    return pkg


def fresh_import(root, name):
    """Import name.kern from root anew (forgetting earlier imports of the package)."""
    for mod in [m for m in sys.modules if m == name or m.startswith(name + ".")]:
        del sys.modules[mod]
    sys.path.insert(0, str(root))
    try:
        import importlib
        importlib.invalidate_caches()
        return importlib.import_module(f"{name}.kern")
    finally:
        sys.path.remove(str(root))


def edit(path, text):
    """Write text to path with a later modification time than it had (however fast the edit)."""
    before = path.stat().st_mtime_ns
    path.write_text(text)
    os.utime(path, ns=(before + 10**9, before + 10**9))


def key(kernel, argtypes=ARGS, tools="tools"):
    return KC.kernel_key(kernel, argtypes, tools)


def test_a_device_function_changed_in_another_module_changes_the_key(tmp_path):
    pkg = write_package(tmp_path, "kc_pkg_a")
    kern = fresh_import(tmp_path, "kc_pkg_a")
    before = key(kern.k_bump)
    assert key(kern.k_bump) == before                       # the same sources: the same key
    edit(pkg / "dep.py", DEP.format(step=2))                 # only the other module changes
    assert key(kern.k_bump) != before                        # the file alone, before any reimport
    kern = fresh_import(tmp_path, "kc_pkg_a")
    assert key(kern.k_bump) != before
    edit(pkg / "dep.py", DEP.format(step=1))                 # back as it was: served again
    kern = fresh_import(tmp_path, "kc_pkg_a")
    assert key(kern.k_bump) == before


def test_frozen_values_argument_types_and_toolchain_are_in_the_key(tmp_path):
    write_package(tmp_path, "kc_pkg_b")
    kern = fresh_import(tmp_path, "kc_pkg_b")
    two, three = kern.make(2.0), kern.make(3.0)              # the same source, other closure values
    assert key(two) != key(three)
    assert key(two) == key(kern.make(2.0))
    assert key(two) != key(two, argtypes="(array(float64, 1d, C),)")
    assert key(two) != key(two, tools="other tools")
    dep = sys.modules["kc_pkg_b.dep"]
    k0 = key(kern.k_bump)
    dep.STEP = 5                                             # a global changed at run time, file unchanged
    assert key(kern.k_bump) != k0


def test_a_kernel_compiled_again_with_another_flag_has_a_key_of_its_own():
    """common.compiled_again (the decoder's bf16 twins: the same source with BF16 = True) must never
    be served the kernel it was compiled from, nor the other way round: the flag is a frozen value
    of _in, which every product calls."""
    from andrea_numba.kernels import decode as kd
    from andrea_numba.kernels.common import compiled_again
    same_name = {flag: compiled_again(vars(kd), "", BF16=flag) for flag in (False, True)}   # the name no help
    for name in ("k_decode_qkv", "k_decode_matvec_add", "k_decode_attention", "k_decode_logits"):
        fp32, bf16 = getattr(kd, name), kd.BF16_KERNELS[name]
        assert key(fp32) != key(bf16), name
        assert key(same_name[True][name]) != key(fp32), name                 # the flag alone tells them apart
        assert key(same_name[False][name]) == key(fp32), name                # the same values: the same key


def test_the_key_is_the_same_in_another_process():
    """A key made of addresses or set order would never hit: the same kernel, two processes."""
    code = ("import json; from andrea_numba import kernel_cache as KC; "
            "from andrea_numba.kernels import attn_flash_bf16 as A, layernorm as L; "
            "f = A.make_kernels(64, 4, 64, True)[0]; "
            f"print(json.dumps([KC.kernel_key(L.k_layernorm_fwd, {ARGS!r}, 't'), KC.kernel_key(f, {ARGS!r}, 't')]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    from andrea_numba.kernels import attn_flash_bf16 as A
    from andrea_numba.kernels import layernorm as L
    mine = [key(L.k_layernorm_fwd, tools="t"), key(A.make_kernels(64, 4, 64, True)[0], tools="t")]
    assert json.loads(out.stdout.strip().splitlines()[-1]) == mine


class Standin:
    """A dispatcher as compile_ahead sees one: py_func, overloads, add_overload."""

    def __init__(self, fn):
        self.py_func, self.overloads, self.targetoptions = fn, {}, {}

    def add_overload(self, kernel, argtypes):
        self.overloads[argtypes] = kernel


def test_load_cached_serves_a_stored_kernel_until_a_dependency_changes(tmp_path, monkeypatch):
    monkeypatch.setattr("andrea_numba.kernel_cache.toolchain", lambda: "tools")
    pkg = write_package(tmp_path, "kc_pkg_c")
    kern = fresh_import(tmp_path, "kc_pkg_c")
    cache = KC.KernelCache(tmp_path / "cache")
    cache.dir.mkdir()
    disp = Standin(kern.k_bump.py_func)
    report = {"cached": 0}
    (todo,) = load_cached([(disp, ARGS)], cache, report)     # empty cache: to compile, with its key
    assert todo[0] is disp and todo[2] is not None and report["cached"] == 0
    stored = todo[2]
    assert cache.put(stored, pickle.dumps("compiled with STEP = 1"))

    again = Standin(kern.k_bump.py_func)                     # the next run: loaded, nothing to compile
    assert load_cached([(again, ARGS)], cache, report) == []
    assert again.overloads[ARGS] == "compiled with STEP = 1" and report["cached"] == 1

    edit(pkg / "dep.py", DEP.format(step=2))                 # the device function changes
    kern = fresh_import(tmp_path, "kc_pkg_c")
    changed = Standin(kern.k_bump.py_func)
    (todo,) = load_cached([(changed, ARGS)], cache, report)  # never the stale kernel
    assert changed.overloads == {} and todo[2] is not None and todo[2] != stored
    assert cache.get(stored) is not None                     # kept for the sources it was compiled from


def test_a_damaged_file_is_a_miss_and_is_removed(tmp_path):
    cache = KC.KernelCache(tmp_path)
    assert cache.put("k1", b"payload") and cache.get("k1") == b"payload"
    data = cache.path("k1").read_bytes()
    cache.path("k1").write_bytes(data[:-1] + b"X")           # one byte changed
    assert cache.get("k1") is None and not cache.path("k1").exists()
    cache.path("k2").write_bytes(b"not a kernel file")
    assert cache.get("k2") is None and not cache.path("k2").exists()
    assert cache.get("k3") is None                           # missing


def test_the_least_recently_used_go_first(tmp_path):
    cache = KC.KernelCache(tmp_path, max_bytes=3 * 1100)
    for i in range(5):
        cache.put(f"k{i}", bytes(1000))
        os.utime(cache.path(f"k{i}"), (time.time() - 100 + i,) * 2)
    cache.get("k0")                                          # used now: kept
    assert cache.prune() == 2
    assert sorted(p.stem for p in cache.entries()) == ["k0", "k3", "k4"]


def test_a_killed_writes_temporary_goes_when_it_is_old(tmp_path):
    cache = KC.KernelCache(tmp_path)
    old, new = tmp_path / ".k1.kernel.abcd1234.tmp", tmp_path / ".k2.kernel.efgh5678.tmp"
    old.write_bytes(b"half a kernel")
    new.write_bytes(b"a write in progress")
    os.utime(old, (time.time() - 2 * KC.STALE_S,) * 2)
    assert cache.prune() == 1 and not old.exists() and new.exists()


def test_where_the_cache_is_and_when_it_is_off(tmp_path, monkeypatch):
    monkeypatch.setenv(KC.ENV, str(tmp_path / "mine"))
    assert KC.default_dir() == tmp_path / "mine"
    monkeypatch.setenv(KC.ENV, "off")
    assert KC.default_dir() is None and KC.KernelCache.open() is None
    monkeypatch.delenv(KC.ENV)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert KC.default_dir() == tmp_path / "xdg" / "andrea_numba" / "kernels"
    (tmp_path / "file").write_text("")
    said = []
    assert KC.KernelCache.open(tmp_path / "file" / "sub", log=said.append) is None    # cannot be made
    assert len(said) == 1 and "kernel cache: off" in said[0] and KC.ENV in said[0]


def test_the_command_line(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(KC.ENV, str(tmp_path))
    KC.KernelCache(tmp_path).put("k", b"x" * 2048)
    assert KC.main([]) == 0 and "1 compiled kernel(s)" in capsys.readouterr().out
    assert KC.main(["--clear"]) == 0 and "removed 1" in capsys.readouterr().out
    assert KC.KernelCache(tmp_path).entries() == []


GPU_RUN = """
import sys, numpy as np
from numba import cuda
sys.path.insert(0, {root!r})
from andrea_numba.kernel_cache import KernelCache
from andrea_numba.precompile import compile_ahead
from kc_pkg_gpu import kern
out = cuda.to_device(np.zeros(1, np.float32))
import numba
report = compile_ahead([(kern.k_bump, (numba.typeof(out),))], 1, cache=KernelCache.open({cache!r}))
kern.k_bump[1, 1](out)
print(report["cached"], report["ahead"] if report["stored"] == report["ahead"] else -1, out.copy_to_host()[0])
"""


@pytest.mark.skipif(SIMULATOR, reason="compiles on a GPU")
def test_gpu_recompile(tmp_path):
    """On a GPU: the first run compiles and stores, the second loads (compiles nothing), and after
    the device function in the other module changes the kernel is compiled again and computes the
    new value."""
    write_package(tmp_path, "kc_pkg_gpu")
    script = GPU_RUN.format(root=str(tmp_path), cache=str(tmp_path / "cache"))

    def run():
        env = dict(os.environ)
        env.pop("NUMBA_ENABLE_CUDASIM", None)
        out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env)
        assert out.returncode == 0, out.stderr
        cached, compiled, value = out.stdout.split()
        return int(cached), int(compiled), float(value)

    assert run() == (0, 1, 1.0)                   # compiled, stored
    assert run() == (1, 0, 1.0)                   # loaded
    edit(tmp_path / "kc_pkg_gpu" / "dep.py", DEP.format(step=2))
    assert run() == (0, 1, 2.0)                   # the change is compiled, never the stale kernel
    assert run() == (1, 0, 2.0)


def test_the_sampler_loads_its_kernels_from_the_cache_before_the_first_token(tmp_path, monkeypatch):
    """python -m andrea_numba.sample (generate_gpu) records the whole forward's and the decoder's
    launches and hands them to compile_ahead with the kernel cache, as the trainer does; a recording
    that fails leaves every kernel to its first launch and the sampling goes on."""
    from types import SimpleNamespace

    from andrea_numba import sample
    monkeypatch.setenv(KC.ENV, str(tmp_path / "cache"))
    monkeypatch.setattr(sample, "SIMULATOR", False)
    seen = {}

    def record(*work):
        seen["work"] = len(work)
        return ["launch"] * len(work)

    def ahead(launches, workers, log=None, cache=None):
        seen.update(launches=launches, workers=workers, cache=cache)
        return {"cached": 0}
    monkeypatch.setattr(sample, "record_launches", record)
    monkeypatch.setattr(sample, "compile_ahead", ahead)
    model = SimpleNamespace(T=4, stream=SimpleNamespace(synchronize=lambda: None))
    assert sample.compile_sampler(model, decoder=SimpleNamespace(stream=None)) == {"cached": 0}
    assert seen["work"] == 2 and seen["launches"] == ["launch"] * 2 and seen["workers"] >= 1
    assert seen["cache"].dir == tmp_path / "cache"
    sample.compile_sampler(model)                            # fp16: no decoder, the whole forward alone
    assert seen["work"] == 1

    def broken(*work):
        raise RuntimeError("a launcher asked the GPU something")
    monkeypatch.setattr(sample, "record_launches", broken)
    assert sample.compile_sampler(model) is None


def test_recording_the_launches_compiles_no_kernel_that_asks_for_more_shared_memory(monkeypatch):
    """A product with more than 48 KiB of dynamic shared memory (bf16 on wgmma) allows it first
    (matmul.allow_shared), which compiles the kernel for its occupancy; while launches are recorded
    a stand-in answers instead, or the recording would compile those kernels one by one in the
    run's process before the kernel cache is even asked (about 20 s at 12M on an H100)."""
    from andrea_numba import precompile
    from andrea_numba.kernels import matmul

    class NeverCompiled:
        def compile(self, sig):
            raise AssertionError("compiled while recording")

    import numba.cuda.dispatcher as dispatcher
    if SIMULATOR:                       # the simulator's dispatcher has no launch configuration to replace
        monkeypatch.setattr(dispatcher.CUDADispatcher, "configure", None, raising=False)

    with precompile._recording([]):
        assert matmul.allow_shared(NeverCompiled(), (), 48 * 1024) is None
        big = matmul.allow_shared(NeverCompiled(), (), 64 * 1024)
        assert big.max_cooperative_grid_blocks(128, 64 * 1024) >= 1
    assert matmul.allow_shared.__name__ == "allow_shared"       # put back
