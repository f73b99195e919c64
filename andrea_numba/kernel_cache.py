"""Compiled kernels kept on disk, so that a second run of the same config starts at once.

Compiling is the slow part of a run's start: Numba types and lowers each kernel in Python, NVVM
turns it into PTX, the driver's assembler into a cubin (precompile.py spreads that over several
processes). None of it changes between two runs of the same code on the same GPU, so the compiled
kernel (its PTX and cubin, in the serialised form numba uses for pickling) is written to a file
named by a key, and a later run with the same key loads it instead of compiling.

The key is what the compiled code depends on, and nothing else:

    the kernel's sources    the file of every module the kernel's module imports, directly or not,
                            that belongs to this project or to the user (not Python's library or an
                            installed dependency): a device function changed in another module
                            changes the key, so a stale kernel is never served
    the values it froze     Numba compiles globals and closure variables as constants: the values
                            of those the kernel and its device functions read (tile sizes, flags)
    how it is compiled      the kernel's name, its argument types, its jit options
    the compiler and GPU    numba's and numba-cuda's versions, llvmlite's, NumPy's, Python's, the
                            GPU's compute capability, the driver's and NVVM's versions, and numba's
                            code-generation settings

    key = sha256(all of the above, in a fixed order)    ->   CACHE_DIR/<key>.kernel

numba's own `cache=True` keys a kernel by its own file's time stamp alone, so a change to a
device function in another module would be served stale: hence this module.

A file is the magic line, the payload's sha256, then the payload: one that fails to read or to
check is a miss (compiled again and written over). Files are written atomically (atomic.py); the
least recently used are removed when the directory grows past MAX_BYTES, and a killed write's
temporary file once it is an hour old. The directory is
$ANDREA_KERNEL_CACHE, else $XDG_CACHE_HOME/andrea_numba/kernels (~/.cache/...);
ANDREA_KERNEL_CACHE=off turns the cache off. In the simulator nothing is compiled and nothing is
cached.

    python -m andrea_numba.kernel_cache            # where the cache is, its files and size
    python -m andrea_numba.kernel_cache --clear    # remove them
"""
from __future__ import annotations

import ast
import enum
import hashlib
import importlib.util
import inspect
import marshal
import os
import re
import sys
import sysconfig
import time
import types
from pathlib import Path

import numpy as np
from numba.core import types as numba_types

from .atomic import atomic_write, stale_temporaries

ENV = "ANDREA_KERNEL_CACHE"
OFF = ("off", "0", "none", "no", "false")
FORMAT = b"andrea-numba compiled kernel 1\n"
SUFFIX = ".kernel"
MAX_BYTES = 2 << 30             # the directory's size past which the least recently used files go
STALE_S = 3600                  # a temporary file this old is a write that was killed, not one in progress

# Packages whose code is keyed by their version, not their files.
LIBRARIES = frozenset({"numba", "numba_cuda", "llvmlite", "numpy", "cuda"})


def default_dir() -> Path | None:
    """The cache directory ($ANDREA_KERNEL_CACHE, or the user's cache directory), None when off."""
    env = os.environ.get(ENV)
    if env is not None:
        return None if env.strip().lower() in OFF or not env.strip() else Path(env).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "andrea_numba" / "kernels"


# -- the sources a kernel depends on ---------------------------------------------------------------

_STDLIB = tuple(os.path.realpath(p) + os.sep for p in {sysconfig.get_paths()["stdlib"], sysconfig.get_paths()["platstdlib"]})


def _library_module(name: str) -> bool:
    return name.partition(".")[0] in LIBRARIES or name in sys.builtin_module_names


def _ours(path: str | None) -> bool:
    """Whether a source file is keyed by its bytes: a real .py file outside Python's own library."""
    return bool(path) and path.endswith(".py") and not os.path.realpath(path).startswith(_STDLIB) \
        and os.path.isfile(path)


class _Files:
    """sha256 and imported modules of each source file, read once per (path, mtime, size)."""

    def __init__(self):
        self.memo = {}

    def read(self, path: str) -> tuple[str, list[str]]:
        st = os.stat(path)
        stamp = (path, st.st_mtime_ns, st.st_size)
        if stamp not in self.memo:
            data = Path(path).read_bytes()
            self.memo[stamp] = (hashlib.sha256(data).hexdigest(), _imports(data, path))
        return self.memo[stamp]


def _imports(source: bytes, path: str) -> list[str]:
    """The modules a source file imports (absolute names; `from . import x` gives pkg and pkg.x)."""
    try:
        tree = ast.parse(source, path)
    except SyntaxError:
        return []
    package = _package_of(path)
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            try:                               # `from ..a import b` resolved as Python resolves it
                base = importlib.util.resolve_name("." * node.level + (node.module or ""), package)
            except (ImportError, ValueError):  # beyond the top package, or relative outside one
                continue
            if base:
                names.append(base)
                names += [f"{base}.{a.name}" for a in node.names if a.name != "*"]
    return names


def _package_of(path: str) -> str:
    """The package a file's relative imports start from: the folders above it that hold an
    __init__.py, joined by dots (as Python names a module found on its path)."""
    folder = os.path.dirname(os.path.realpath(path))
    parts = []
    while os.path.isfile(os.path.join(folder, "__init__.py")):
        parts.append(os.path.basename(folder))
        folder = os.path.dirname(folder)
    return ".".join(reversed(parts))


_FOUND: dict = {}


def _module_file(name: str) -> str | None:
    """The source file of the module called name, if it is one (None for a package's attribute)."""
    mod = sys.modules.get(name)
    if mod is not None:
        return getattr(mod, "__file__", None)
    if name not in _FOUND:
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError, AttributeError):
            spec = None
        _FOUND[name] = spec.origin if spec is not None and spec.has_location else None
    return _FOUND[name]


def _sanitised(text: str) -> str:
    return re.sub(r" at 0x[0-9a-fA-F]+", "", text)


def _options(dispatcher) -> str:
    """A dispatcher's jit options (fastmath, max_registers, ...) as text, in a fixed order."""
    return _sanitised(repr(sorted(getattr(dispatcher, "targetoptions", {}).items())))


def _code_names(code) -> set:
    names = set(code.co_names)
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            names |= _code_names(c)
    return names


class Fingerprint:
    """Everything a kernel's compiled code depends on, gathered from its Python function: call
    add(kernel) for each kernel, then digest()."""

    def __init__(self, files: _Files | None = None):
        self.files = files or _Files()
        self.parts: list[str] = []
        self.sources: dict[str, str] = {}     # file -> sha256
        self.seen_fn: set = set()

    # the import closure of a file: every module it imports that is ours, and theirs
    def source(self, path: str | None):
        if not _ours(path) or path in self.sources:
            return
        todo = [path]
        while todo:
            p = todo.pop()
            if p in self.sources:
                continue
            digest, imported = self.files.read(p)
            self.sources[p] = digest
            for name in imported:
                if _library_module(name):
                    continue
                f = _module_file(name)
                if _ours(f) and f not in self.sources:
                    todo.append(f)

    def function(self, fn, where: str):
        """A Python function Numba compiles (a kernel, a device function, an intrinsic's typer): its
        source file and its closure, and the values of the globals and closure variables it reads."""
        if id(fn) in self.seen_fn:
            return
        self.seen_fn.add(id(fn))
        code = fn.__code__
        name = f"{fn.__module__}.{fn.__qualname__}"
        if _ours(code.co_filename):
            self.source(code.co_filename)
        else:                                  # no file to read (exec'd code): its compiled code
            self.parts.append(f"code {name} {hashlib.sha256(marshal.dumps(code)).hexdigest()}")
        g = fn.__globals__
        self.source(g.get("__file__"))
        names = sorted(_code_names(code))
        read = [(n, g[n]) for n in names if n in g]
        for n, cell in zip(code.co_freevars, fn.__closure__ or ()):
            try:
                read.append((n, cell.cell_contents))
            except ValueError:                 # an empty cell
                self.parts.append(f"{name}:{n} = <empty>")
        for n, v in read:
            self.value(f"{name}:{n}", v)
            # `mod.f(...)`, `mod.CONST`: a module's attributes the code names (an attribute name
            # is among the code's names), for a module of ours
            if isinstance(v, types.ModuleType) and not _library_module(v.__name__):
                for a in names:
                    if a != n and hasattr(v, a):
                        self.value(f"{name}:{n}.{a}", getattr(v, a))
        for i, d in enumerate(fn.__defaults__ or ()):
            self.value(f"{name}:default{i}", d)

    def value(self, where: str, v):
        """A value a compiled function reads: simple values by their text, functions Numba compiles
        by their own dependencies, modules by their sources."""
        if v is None or isinstance(v, (bool, int, float, complex, str, bytes, np.generic, np.dtype)):
            self.parts.append(f"{where} = {type(v).__name__} {v!r}")
        elif isinstance(v, (tuple, list)):
            self.parts.append(f"{where} = {type(v).__name__} of {len(v)}")
            for i, x in enumerate(v):
                self.value(f"{where}[{i}]", x)
        elif isinstance(v, np.ndarray):
            self.parts.append(f"{where} = ndarray {v.dtype} {v.shape} "
                              f"{hashlib.sha256(np.ascontiguousarray(v).tobytes()).hexdigest()}")
        elif isinstance(v, types.ModuleType):
            self.parts.append(f"{where} = module {v.__name__}")
            if not _library_module(v.__name__):
                self.source(getattr(v, "__file__", None))
        elif hasattr(v, "py_func"):            # a @cuda.jit dispatcher (a device function)
            self.parts.append(f"{where} = jit {_options(v)}")
            self.function(v.py_func, where)
        elif hasattr(v, "_defn") and callable(v._defn):   # an @intrinsic: its typer holds its codegen
            self.parts.append(f"{where} = intrinsic")
            self.function(v._defn, where)
        elif inspect.isfunction(v):
            self.parts.append(f"{where} = function {v.__module__}.{v.__qualname__}")
            file = v.__code__.co_filename
            if not _library_module(v.__module__ or "") and (_ours(file) or file.startswith("<")):
                self.function(v, where)     # Python's and the libraries' functions: by their versions
        elif isinstance(v, type) or inspect.isbuiltin(v):
            mod = getattr(v, "__module__", "") or ""
            self.parts.append(f"{where} = {type(v).__name__} {mod}.{getattr(v, '__qualname__', '')}")
            if mod and not _library_module(mod):
                self.source(_module_file(mod))
        elif isinstance(v, (enum.Enum, numba_types.Type)):      # constants Numba compiles: their text
            self.parts.append(f"{where} = {type(v).__module__}.{type(v).__qualname__} {_sanitised(repr(v))}")
        else:                                   # nothing a kernel can compile (a dict, a lock): its type
            self.parts.append(f"{where} = {type(v).__module__}.{type(v).__qualname__}")

    def digest(self) -> str:
        h = hashlib.sha256()
        for line in self.parts:
            h.update(line.encode() + b"\n")
        for path in sorted(self.sources):
            h.update(f"source {os.path.basename(path)} {self.sources[path]}\n".encode())
        return h.hexdigest()


def toolchain() -> str:
    """The compiler and the GPU: what changes every kernel's compiled code."""
    import llvmlite
    import numba
    from importlib.metadata import PackageNotFoundError, version
    from numba import config, cuda
    try:
        numba_cuda = version("numba-cuda")
    except PackageNotFoundError:
        numba_cuda = "unknown"
    dev = cuda.get_current_device()
    try:
        from numba.cuda.cudadrv.driver import driver
        drv = driver.get_version()
    except Exception:                          # pragma: no cover (a driver without the query)
        drv = "unknown"
    try:
        from numba.cuda.cudadrv import nvvm
        nv = nvvm.NVVM().get_version()
    except Exception:                          # pragma: no cover
        nv = "unknown"
    settings = {k: getattr(config, k, None) for k in ("OPT", "DEBUGINFO_DEFAULT", "CUDA_DEBUGINFO_DEFAULT",
                                                         "CUDA_DEFAULT_PTX_CC", "CUDA_ENABLE_PYNVJITLINK",
                                                         "CUDA_USE_NVIDIA_BINDING")}
    return (f"numba {numba.__version__} numba-cuda {numba_cuda} llvmlite {llvmlite.__version__} "
            f"numpy {np.__version__} python {sys.version_info[:3]} cc {dev.compute_capability} "
            f"driver {drv} nvvm {nv} settings {sorted(settings.items())!r}")


def kernel_key(dispatcher, argtypes, tools: str, files: _Files | None = None) -> str:
    """The key of one kernel compiled for one tuple of argument types (see the module docstring)."""
    fp = Fingerprint(files)
    py_func = getattr(dispatcher, "py_func", None) or dispatcher.fn     # the simulator's kernels: .fn
    fp.parts.append(f"kernel {py_func.__module__}.{py_func.__qualname__}")
    fp.parts.append(f"options {_options(dispatcher)}")
    fp.parts.append(f"argtypes {argtypes!r}")
    fp.parts.append(f"tools {tools}")
    fp.function(py_func, "kernel")
    return fp.digest()


# -- the files -------------------------------------------------------------------------------------

class KernelCache:
    """The cache directory: get(key) -> the pickled kernel or None; put(key, blob)."""

    def __init__(self, directory: Path, max_bytes: int = MAX_BYTES):
        self.dir = Path(directory)
        self.max_bytes = max_bytes
        self.files = _Files()

    @classmethod
    def open(cls, directory=None, log=None) -> "KernelCache | None":
        """The cache at `directory` (default_dir() when None), created if missing; None when it is
        off or cannot be written (said in one line to log: the run compiles as without it)."""
        d = default_dir() if directory is None else Path(directory)
        if d is None:
            return None
        try:
            d.mkdir(parents=True, exist_ok=True)
            probe = d / f".probe.{os.getpid()}"
            probe.write_bytes(b"")
            probe.unlink()
        except OSError as e:
            if log:
                log(f"kernel cache: off ({d} cannot be written: {e.strerror or e}); "
                    f"set {ENV} to a writable directory, or to off")
            return None
        return cls(d)

    def path(self, key: str) -> Path:
        return self.dir / f"{key}{SUFFIX}"

    def get(self, key: str) -> bytes | None:
        """The payload stored under key, or None (missing, or a file that fails its check: removed)."""
        p = self.path(key)
        try:
            data = p.read_bytes()
        except OSError:
            return None
        head, digest, payload = data[:len(FORMAT)], data[len(FORMAT):len(FORMAT) + 64], data[len(FORMAT) + 65:]
        if head != FORMAT or hashlib.sha256(payload).hexdigest().encode() != digest:
            self.discard(key)
            return None
        try:
            os.utime(p)                        # recently used: kept longest
        except OSError:
            pass
        return payload

    def put(self, key: str, payload: bytes) -> bool:
        """Store payload under key, atomically; False when the disk refused (the run goes on)."""
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            atomic_write(self.path(key), FORMAT + hashlib.sha256(payload).hexdigest().encode() + b"\n" + payload)
        except OSError:
            return False
        return True

    def discard(self, key: str):
        try:
            self.path(key).unlink()
        except OSError:
            pass

    def entries(self) -> list[Path]:
        return sorted(self.dir.glob(f"*{SUFFIX}"))

    def size(self) -> int:
        return sum(p.stat().st_size for p in self.entries() if p.exists())

    def prune(self) -> int:
        """Remove the least recently used files until the directory holds at most max_bytes, and the
        temporaries of writes killed before their rename (older than STALE_S: another run's write
        may be in progress); returns how many files went."""
        removed = 0
        for p in stale_temporaries(self.dir):
            try:
                if time.time() - p.stat().st_mtime > STALE_S:
                    p.unlink()
                    removed += 1
            except OSError:
                continue
        files = []
        for p in self.entries():
            try:
                st = p.stat()
            except OSError:
                continue
            files.append((st.st_mtime, st.st_size, p))
        total = sum(s for _, s, _ in files)
        for _, s, p in sorted(files):
            if total <= self.max_bytes:
                break
            try:
                p.unlink()
            except OSError:
                continue
            total -= s
            removed += 1
        return removed

    def clear(self) -> int:
        n = 0
        for p in self.entries():
            try:
                p.unlink()
                n += 1
            except OSError:
                pass
        return n


def lookup(cache: KernelCache, launches, tools: str) -> tuple[list, list]:
    """Split (dispatcher, argtypes) pairs into hits [(dispatcher, argtypes, key, payload)] and
    misses [(dispatcher, argtypes, key)]; a kernel whose key cannot be made is a miss with key None
    (compiled, never stored)."""
    hits, misses = [], []
    for disp, argtypes in launches:
        try:
            key = kernel_key(disp, argtypes, tools, cache.files)
        except Exception:                     # something the fingerprint cannot read: never cached
            misses.append((disp, argtypes, None))
            continue
        payload = cache.get(key)
        if payload is None:
            misses.append((disp, argtypes, key))
        else:
            hits.append((disp, argtypes, key, payload))
    return hits, misses


def main(argv=None) -> int:
    from . import cli
    ap = cli.Parser(prog="python -m andrea_numba.kernel_cache",
                    description="The compiled kernels kept on disk between runs: where, how many, how large.")
    ap.add_argument("--clear", action="store_true", help="remove every cached kernel")
    args = ap.parse_args(argv)
    d = default_dir()
    if d is None:
        print(f"kernel cache: off ({ENV}={os.environ.get(ENV)})")
        return 0
    cache = KernelCache(d)
    if not d.is_dir():
        print(f"kernel cache: {d} (empty: nothing compiled yet)")
        return 0
    if args.clear:
        print(f"kernel cache: removed {cache.clear()} file(s) from {d}")
        return 0
    entries = cache.entries()
    newest = max((p.stat().st_mtime for p in entries), default=None)
    print(f"kernel cache: {d}: {len(entries)} compiled kernel(s), {cache.size() / 2**20:.1f} MiB"
          + (f", last used {time.strftime('%Y-%m-%d %H:%M', time.localtime(newest))}" if newest else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
