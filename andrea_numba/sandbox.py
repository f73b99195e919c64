"""The walls around a student's file while the grader runs it (andrea_numba/exercises.py).

Each file is graded in a process of its own. That process imports the grader, works out the
expected answers with the twin, and only then puts the walls up and runs the student's file:

  modules   the op table (andrea_numba.cases), the grader, the engine's kernels (andrea_numba.kernels.*
            but common, and what an exercise's given code uses: k_loss_bwd's products), gpu_model,
            recipes, the lab and lessons/ leave sys.modules and their packages' attributes; an
            import hook (first on sys.meta_path) refuses them by any name or route.
  answers   in every module of the twin (reference, reference.*) each backward (*_bwd, *_backward,
            gelu_grad) becomes a tripwire: reached by any attribute path it exists, called it refuses.
            The forwards, the dropout mask and the helpers stay.
  files     an audit hook (sys.addaudithook) refuses, from the student's code, reading
            lessons/solutions/, reference/, lab/ and andrea_numba/ (the student's own file aside),
            opening a folder above them, and writing, moving or deleting any file; reading frames
            (sys._getframe, a traceback's or a generator's frame, inspect.stack, traceback.walk_*);
            walking the object graph (gc.get_objects, gc.get_referrers); tracing; another audit
            hook; a process, a signal to one, a network connection; and running a string (exec,
            eval, compile) called from the student's file itself. A signal handler (handed the
            frame it interrupts) is refused by a guard on signal.signal.
            "From the student's code": a frame of the student's file on the thread's stack, or any
            thread but the main one (the simulator's, or one the student started).
  tools     the namespaces the grader computes with (builtins, math, json, os, numpy, numpy.random,
            numpy.linalg, numba.cuda, the device array and kernel classes) are compared after the
            run: a file that replaced numpy.max to fake an error is refused.
  launches  for a kernel exercise, LaunchRecord: every launch made while the student's launch
            function runs (which kernel, from which file), the arrays it was handed compared between
            launches (NaN-poisoned by the harness: a write from the host shows), and host data sent
            to the device (cuda.to_device, copy_to_device, a NumPy array as a kernel argument) from
            the student's code refused. kernel_host_calls reads a kernel's code for what only a
            host can call (the simulator runs a kernel's body as Python; a GPU would refuse it).

Every refusal is written at once, as a line, to the grading process's result pipe, so a file that
catches the exception is still refused.

What the walls cannot stop: they are Python in the same process as the student's code. Code that
rewrites the interpreter's memory (ctypes), patches a library's internals below the names compared
(numpy's private modules), or takes the grader's objects apart (the launch patches keep numba's
originals in their closures; the import hook lies on sys.meta_path) is not seen. A file that copies
a solution's text is not seen either: the grader reads code, not authorship. See docs/teaching.md.
"""
from __future__ import annotations

import _signal
import _thread
import builtins
import dis
import functools
import json
import math
import os
import re
import signal
import sys
import types
from pathlib import Path

import numba.cuda
import numpy as np
from numba import config as numba_config

if numba_config.ENABLE_CUDASIM:             # where a launch and a device array live: the simulator's or the GPU's
    from numba.cuda.simulator import kernel as _launcher
    from numba.cuda.simulator.cudadrv.devicearray import FakeCUDAArray as _DeviceArray
else:
    from numba.cuda.cudadrv.devicearray import DeviceNDArray as _DeviceArray
    from numba.cuda.dispatcher import CUDADispatcher as _Dispatcher

ANSWER = re.compile(r"(_bwd|_backward)$|^gelu_grad$")     # the twin's names that are an exercise's answer
HIDDEN_ROOTS = ("andrea_numba", "lab", "lessons", "tests")  # packages whose modules are hidden unless kept
FRAME_ATTRS = {"tb_frame", "gi_frame", "cr_frame", "ag_frame"}
FRAME_GIVERS = {"inspect", "traceback", "pdb", "bdb"}     # library modules that hand frames to their caller
_OBJECTS = "walks the interpreter's objects"
_TRACE = "traces the interpreter"
_PROCESS = "starts a process"
_FILES = "changes files"
# Refused from the student's code (its frame on the stack, or another thread), whoever calls them.
ALWAYS = {"sys._current_frames": "reads every thread's frames", "gc.get_objects": _OBJECTS,
          "gc.get_referrers": _OBJECTS, "gc.get_referents": _OBJECTS, "sys.settrace": _TRACE,
          "sys.setprofile": _TRACE, "sys.addaudithook": "adds an audit hook",
          "subprocess.Popen": _PROCESS, "os.system": _PROCESS, "os.exec": _PROCESS, "os.spawn": _PROCESS,
          "os.posix_spawn": _PROCESS, "os.fork": _PROCESS, "os.forkpty": _PROCESS,
          "os.kill": "sends a signal to a process", "os.killpg": "sends a signal to a process",
          "os.remove": _FILES, "os.rename": _FILES, "os.rmdir": _FILES, "os.truncate": _FILES,
          "os.link": _FILES, "os.symlink": _FILES, "os.chmod": _FILES, "os.chown": _FILES,
          "socket.connect": "opens a network connection", "socket.sendto": "opens a network connection"}
# Refused when the student's file itself calls them (libraries use them: namedtuple runs exec).
FROM_FILE = {"exec": "runs code from a string (exec, eval)", "compile": "runs code from a string (compile)"}
WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC


class Refused(Exception):
    """A student's file reached for something the walls keep out; the message is one line."""


def student_line(student: dict):
    """The line of the student's file innermost on this thread's stack (None when it is not there)."""
    frame = sys._getframe(1)
    while frame is not None and frame.f_globals is not student:
        frame = frame.f_back
    return frame.f_lineno if frame is not None else None


class Refuser:
    """Writes a refusal to the result pipe at once, then raises it. It is all that the objects the
    student's code can reach (the import hook on sys.meta_path, the tripwires) hold: the pipe's
    number, the file's label and the file's own globals."""

    def __init__(self, fd: int, label: str, student: dict):
        self.fd, self.label, self.student = fd, label, student

    def __call__(self, what: str, line=None):
        """line: the student's line to name (None: the innermost on the stack; 0: none)."""
        if line is None:
            line = student_line(self.student)
        message = " ".join(f"{self.label}{f', line {line}' if line else ''} {what}".split())
        try:
            os.write(self.fd, f"refused {message}\n".encode())
        except OSError:
            pass
        raise Refused(message)


class Tripwire:
    """Stands where a twin's backward was, in every module that held it: calling it refuses."""

    def __init__(self, refuse: Refuser, name: str):
        self._refuse, self.name = refuse, name

    def __call__(self, *args, **kwargs):
        self._refuse(f"calls the twin's {self.name}: write your own")

    def __repr__(self):
        return f"<{self.name}: hidden by the grader>"


class ImportWall:
    """The import hook, first on sys.meta_path: a hidden module, by any name or route, is refused."""

    def __init__(self, refuse: Refuser, keep):
        self._refuse, self._keep = refuse, frozenset(keep)

    def hidden(self, name: str) -> bool:
        return name.partition(".")[0] in HIDDEN_ROOTS and name not in self._keep

    def find_spec(self, name, path=None, target=None):
        if self.hidden(name):
            self._refuse(f"imports {name}, which the grader hides from exercises (the op table, the grader, "
                         f"the engine's kernels, the lab, the solutions): write your own")
        return None


class Walls:
    """What one student's file may reach. up() is for a process that grades only that file: nothing
    is put back. The walls' own state (the snapshot, the blocked paths) is held by the audit hook
    alone, which Python cannot list."""

    def __init__(self, refuse: Refuser, student_file: Path, keep, blocked_dirs):
        self.refuse = refuse
        self.student = refuse.student                    # the student's module globals: its frames' f_globals
        self.file = Path(student_file).resolve()
        self.imports = ImportWall(refuse, keep)
        self.blocked_dirs = [Path(d).resolve() for d in blocked_dirs]
        self._busy = _thread._local()
        self._main = _thread.get_ident()
        self._saved = {}

    def up(self, protect=()):
        """Scrub the twin's answers, hide the modules, install the import and audit hooks, and
        take the snapshot of `protect` (modules and classes) that verify() compares."""
        answers = {}
        for name, mod in list(sys.modules.items()):
            if name == "reference" or name.startswith("reference."):
                for attr, value in list(vars(mod).items()):
                    if ANSWER.search(attr) and callable(value) and id(value) not in answers:
                        answers[id(value)] = Tripwire(self.refuse, attr)
        replace_everywhere(answers)
        for name in list(sys.modules):
            if self.imports.hidden(name):
                mod = sys.modules.pop(name)
                parent, _, child = name.rpartition(".")
                if parent in sys.modules and getattr(sys.modules[parent], child, None) is mod:
                    delattr(sys.modules[parent], child)
        for name in ("__main__", "__mp_main__"):            # the grading process's own entry point
            sys.modules[name] = types.ModuleType(name)
        original = signal.signal                       # a handler is handed the frame it interrupts
        guarded = {id(f): self._guard(f, "installs a signal handler (it is handed the interrupted frame)")
                   for f in (original, _signal.signal)}
        replace_everywhere(guarded)
        sys.meta_path.insert(0, self.imports)
        sys.addaudithook(self._audit)
        self._saved = {ns: dict(vars(ns)) for ns in protect}

    def verify(self):
        """Refuse if a protected namespace lost or changed a name since up()."""
        for ns, before in self._saved.items():
            now = vars(ns)
            for name, value in before.items():
                if now.get(name, _MISSING) is not value:
                    self.refuse(f"changed {getattr(ns, '__name__', ns)}.{name}: the grader's own tools must "
                                f"stay as they are", line=0)

    def _guard(self, fn, what):
        """fn, refused when called from the student's code."""
        walls = self

        def guarded(*args, **kwargs):
            if walls._student_context(sys._getframe(1)):
                walls.refuse(f"{what}: the grader refuses it")
            return fn(*args, **kwargs)
        return functools.wraps(fn)(guarded)

    # -- the audit hook --
    def _audit(self, event, args):
        if not (event in ALWAYS or event in FROM_FILE or event == "open" or event == "sys._getframe"
                or (event == "object.__getattr__" and args[1] in FRAME_ATTRS)):
            return
        if getattr(self._busy, "on", False):
            return
        self._busy.on = True
        try:
            why = self._why(event, args, sys._getframe(1))
            line = student_line(self.student) if why else None
        finally:
            self._busy.on = False
        if why:
            self.refuse(why, line)

    def _why(self, event, args, caller):
        """Why the event is refused (None: it is not). caller: the frame that raised it."""
        if event in FROM_FILE:
            return FROM_FILE[event] if caller.f_globals is self.student else None
        if not self._student_context(caller):
            return None
        if event in ALWAYS:
            return f"{ALWAYS[event]} ({event}): the grader refuses it"
        if event == "open":
            return self._open(*args[:3])
        if caller.f_globals is self.student or caller.f_globals.get("__name__") in FRAME_GIVERS:
            what = "sys._getframe" if event == "sys._getframe" else args[1]
            return f"reads the interpreter's frames ({what}): the grader refuses code that looks at its callers"
        return None

    def _open(self, path, mode, flags):
        if not isinstance(path, (str, bytes, os.PathLike)):
            return None                                         # an open file descriptor
        shown = os.fsdecode(path)
        if isinstance(flags, int) and flags & WRITE_FLAGS:
            return f"writes {shown} ({_FILES}): the grader refuses it"
        p = Path(os.path.realpath(shown))
        if p == self.file:
            return None
        if any(p == d or d in p.parents for d in self.blocked_dirs):
            return (f"reads {shown}, which the grader keeps from exercises (the solutions, the twin's, the "
                    f"engine's and the lab's source)")
        if any(p in d.parents for d in self.blocked_dirs):
            return f"opens {shown}, a folder above what the grader keeps from exercises"
        return None

    def _student_context(self, frame) -> bool:
        """A frame of the student's file on this thread's stack, or a thread other than the main one."""
        if _thread.get_ident() != self._main:
            return True
        while frame is not None:
            if frame.f_globals is self.student:
                return True
            frame = frame.f_back
        return False


_MISSING = object()


def protected() -> list:
    """The namespaces the grader computes with after the student's code has run: Walls.verify
    compares them with their state when the walls went up."""
    launch = _launcher.FakeCUDAKernel if numba_config.ENABLE_CUDASIM else _Dispatcher
    return [builtins, math, json, os, np, np.random, np.linalg, numba.cuda, _DeviceArray, launch]


def replace_everywhere(replacements: dict):
    """In every loaded module, a global whose value's id is a key of `replacements` gets the value."""
    for mod in list(sys.modules.values()):
        d = getattr(mod, "__dict__", None)
        if not isinstance(d, dict):
            continue
        for name, value in list(d.items()):
            new = replacements.get(id(value))
            if new is not None:
                d[name] = new


def reachable_modules(roots) -> set:
    """The loaded modules under HIDDEN_ROOTS or `reference` that `roots` hold, directly or through
    each other: a module, or a function or class defined in one, in their globals (what an allowed
    module imported), and the packages above each. A package's own submodule attributes do not count."""
    seen, todo = set(), list(roots)
    while todo:
        name = todo.pop()
        mod = sys.modules.get(name)
        if name in seen or mod is None:
            continue
        seen.add(name)
        package = hasattr(mod, "__path__")
        for value in vars(mod).values():
            if isinstance(value, types.ModuleType):
                other = value.__name__
                if package and other.startswith(name + "."):
                    continue
            else:
                other = getattr(value, "__module__", None)
            if isinstance(other, str) and other.partition(".")[0] in HIDDEN_ROOTS + ("reference",):
                todo.append(other)
        if "." in name:
            todo.append(name.rpartition(".")[0])
    return seen


# ---------------------------------------------------------------------------------------------
# kernels: what a kernel's code may name, and the record of launches

KERNEL_BUILTINS = {"range", "len", "min", "max", "abs", "float", "int", "bool", "round", "print", "divmod", "pow"}


def _kernel_value(value) -> bool:
    """Whether a global that a kernel names is something a GPU kernel can use."""
    if value is None or isinstance(value, (int, float, complex, bool, str, np.generic, np.ndarray)):
        return True                                        # numba freezes a global array as a constant
    if isinstance(value, tuple):
        return all(_kernel_value(v) for v in value)
    if isinstance(value, types.ModuleType):
        return value.__name__ in ("math", "cmath", "numpy", "numba") or value.__name__.startswith("numba.")
    if isinstance(value, type):
        return issubclass(value, (np.generic, BaseException))
    if hasattr(value, "py_func"):                          # another @cuda.jit function
        return True
    module = getattr(value, "__module__", None) or type(value).__module__
    return isinstance(module, str) and (module == "numba" or module.startswith("numba."))


def _lines(code):
    """(instruction, its source line) for every instruction of one code object."""
    line = None
    for op in dis.get_instructions(code):
        start = getattr(op, "line_number", None)                         # Python 3.13
        if start is None and type(op.starts_line) is int:
            start = op.starts_line
        line = start or line
        yield op, line


def kernel_host_calls(kernel) -> str | None:
    """What in a @cuda.jit function's code only a host can run (None when nothing): a global that is
    not cuda, math, a number, a numba type, a NumPy scalar type, an exception or another @cuda.jit
    function; a NumPy function (np.copyto; np.float32 is a type and fine); a private attribute (dx._ary)."""
    fn = kernel.py_func
    codes, scope = [fn.__code__], fn.__globals__
    while codes:
        code = codes.pop()
        codes += [c for c in code.co_consts if isinstance(c, types.CodeType)]
        ops = list(_lines(code))
        for i, (op, line) in enumerate(ops):
            if op.opname in ("LOAD_GLOBAL", "LOAD_NAME"):
                name = op.argval
                if name in scope:
                    value = scope[name]
                elif name in vars(builtins):
                    value = vars(builtins)[name]
                    if name in KERNEL_BUILTINS or isinstance(value, type) and issubclass(value, BaseException):
                        continue
                    return f"{name} (line {line})"
                else:
                    continue                                              # undefined: a NameError when run
                if not _kernel_value(value):
                    return f"{name} (line {line})"
                nxt = ops[i + 1][0] if i + 1 < len(ops) else None
                if value is np and nxt is not None and nxt.opname in ("LOAD_ATTR", "LOAD_METHOD"):
                    member = getattr(np, str(nxt.argval), None)
                    if not (isinstance(member, (int, float)) or isinstance(member, type) and issubclass(member, np.generic)):
                        return f"{name}.{nxt.argval} (line {line})"
            elif op.opname in ("LOAD_ATTR", "LOAD_METHOD", "STORE_ATTR") and str(op.argval).startswith("_"):
                return f".{op.argval} (line {line})"
    return None


class LaunchRecord:
    """The kernel launches made while a student's launch function runs, in the simulator or on a GPU.

    watch(launch) gives the launch function the harness calls. While it runs, every launch is
    recorded (the kernel, the file that defines it) and refused when the kernel comes from neither
    the student's file nor `helper_files` (k_loss_bwd's given products); the device arrays it was
    handed, and those it allocates, are compared with their last contents before every launch and
    after the last one (a change is a write from the host); host data sent to the device by the
    student's code (cuda.to_device, copy_to_device, a device array's item assignment, pinned or
    mapped memory, a NumPy array as a kernel argument) is refused. At the end it must have launched
    `kernel` (the exercise's) and nothing but its file's kernels and helpers."""

    def __init__(self, refuse: Refuser, student_file: Path, helper_files, kernel=None):
        self.refuse = refuse
        self.student = refuse.student
        self.file = str(Path(student_file).resolve())
        self.helpers = {str(Path(f).resolve()) for f in helper_files}
        self.kernel = kernel                 # the exercise's kernel: it must be launched
        self.active = False
        self.depth = 0                       # a GPU dispatcher's call may call another: record the outer one
        self.arrays, self.state, self.launched = {}, {}, []

    # -- the patches --
    def install(self):
        """Wrap numba's launch, its host-to-device copies and its allocations."""
        if numba_config.ENABLE_CUDASIM:
            _wrap(_launcher.FakeCUDAKernel, "__call__", self._sim_launch)
        else:
            _wrap(_Dispatcher, "call", self._gpu_launch)
        for name in ("copy_to_device", "__setitem__"):
            _wrap(_DeviceArray, name, functools.partial(self._host_copy, name))
        found = {}
        for name in ("to_device", "pinned", "pinned_array", "pinned_array_like", "mapped", "mapped_array",
                     "mapped_array_like", "managed_array", "device_array", "device_array_like"):
            original = getattr(numba.cuda, name, None)
            if callable(original):
                wrap = self._allocation if name.startswith("device_array") else self._host_copy
                found[id(original)] = wrap(f"cuda.{name}", original)
        replace_everywhere(found)

    def _sim_launch(self, original):
        record = self

        def launch(kernel, *args):
            if not record.active or kernel._device or _launcher._get_kernel_context() is not None:
                return original(kernel, *args)                  # a device function, or a launch not watched
            record._before(kernel.py_func, args)
            out = original(kernel, *args)
            record._after()
            return out
        return launch

    def _gpu_launch(self, original):
        record = self

        def call(dispatcher, args, launch_config):
            if not record.active or record.depth:
                return original(dispatcher, args, launch_config)
            record._before(dispatcher.py_func, args)
            record.depth += 1
            try:
                out = original(dispatcher, args, launch_config)
            finally:
                record.depth -= 1
            record._after()
            return out
        return call

    def _host_copy(self, what, original):
        record = self

        def copy(*args, **kwargs):
            if record.active and sys._getframe(1).f_globals is record.student:
                record.refuse(f"sends host data to the device ({what}): the answer must come from your kernel")
            return original(*args, **kwargs)
        return copy

    def _allocation(self, what, original):
        record = self

        def allocate(*args, **kwargs):
            arr = original(*args, **kwargs)
            if record.active:
                name = f"an array from {what} ({len(record.arrays) + 1})"
                record.arrays[name], record.state[name] = arr, _contents(arr)
            return arr
        return allocate

    # -- the record --
    def watch(self, launch):
        """`launch` with every launch it makes recorded and checked (see the class)."""
        record = self

        @functools.wraps(launch)
        def watched(**kwargs):
            record.arrays = {k: v for k, v in kwargs.items() if hasattr(v, "copy_to_host")}
            record.state = {k: _contents(v) for k, v in record.arrays.items()}
            record.launched = []
            record.active = True
            try:
                out = launch(**kwargs)
                record._compare("after its last launch")
            finally:
                record.active = False
            record._verdict()
            return out
        return watched

    def _before(self, fn, args):
        code = fn.__code__
        if code.co_filename != self.file and str(Path(code.co_filename).resolve()) not in self.helpers:
            self.refuse(f"launches {fn.__qualname__} of {code.co_filename}: write the kernel yourself")
        for a in args:
            if isinstance(a, np.ndarray) and a.ndim > 0:
                self.refuse(f"passes a NumPy array to {fn.__name__}: a host array is a copy from the host; "
                            f"use the device arrays you were given")
        self._compare(f"before launching {fn.__name__}")
        self.launched.append(code)

    def _after(self):
        numba.cuda.synchronize()
        self.state = {k: _contents(v) for k, v in self.arrays.items()}

    def _compare(self, when):
        for name, arr in self.arrays.items():
            if _contents(arr) != self.state[name]:
                self.refuse(f"wrote {name} on the host {when}: the answer must come from your kernel", line=0)

    def _verdict(self):
        mine = [c for c in self.launched if c.co_filename == self.file]
        name = self.kernel.__name__
        if not mine:
            self.refuse(f"launched no kernel of its own: {name} must compute the answer", line=0)
        if self.kernel.py_func.__code__ not in mine:
            self.refuse(f"never launched {name}: the answer must come from it", line=0)


def _wrap(cls, name, make):
    """cls.name = make(the original), with the original's name and docstring."""
    original = getattr(cls, name)
    setattr(cls, name, functools.wraps(original)(make(original)))


def _contents(arr) -> bytes:
    return arr.copy_to_host().tobytes()
