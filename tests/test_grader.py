"""The grader cannot be fooled by the ordinary routes to the answer, and grades a class.

Each file below borrows the answer one way (the op table, the twin's backward by a computed name,
the solution's text, the engine's kernels by a computed import, frames, the object graph, a host
copy in a kernel exercise's launch function, ...) and must be refused with one line, status
"refused", by the grading process's walls (andrea_numba/sandbox.py). Files that use what the
exercises allow (the forward twin, namedtuple, warnings, print) must still pass. Each file is
graded in a fork of a warm process: a few hundredths of a second for a NumPy file, a few tenths
for a kernel file in the simulator."""
import csv
import json
import textwrap
from pathlib import Path

import pytest

from andrea_numba import exercises as E
from andrea_numba import gradebook, warm
from andrea_numba.kernels.common import SIMULATOR

ROOT = Path(__file__).resolve().parent.parent
SOLUTIONS = ROOT / "lessons" / "solutions"
EXERCISES = ROOT / "lessons" / "exercises"
CALL = "dict(dout=dout, x=x, mean=mean, rstd=rstd, g=g)"


def _file(tmp_path, name, text):
    path = tmp_path / f"{name}.py"
    path.write_text(textwrap.dedent(text))
    return path


def _refused(res, *words):
    assert res["status"] == "refused" and not res["ok"] and not res["rows"], res
    assert "\n" not in res["message"] and all(w in res["message"] for w in words), res["message"]


# layernorm_bwd, borrowed: (the file, words its one line must hold)
NUMPY_BORROWINGS = {
    "the op table": (f"""
        def layernorm_bwd(dout, x, mean, rstd, g):
            from andrea_numba import cases
            r = cases.CASES["layernorm"].backward({CALL})
            return r["dx"], r["dg"], r["db"]
        """, ["line 3 imports andrea_numba.cases, which the grader hides"]),
    "a computed name": ("""
        import reference as R

        def layernorm_bwd(dout, x, mean, rstd, g):
            return getattr(R, "layernorm" + "_bwd")(dout, x, mean, rstd, g)
        """, ["line 5 calls the twin's layernorm_bwd"]),
    "a computed import": ("""
        import importlib

        def layernorm_bwd(dout, x, mean, rstd, g):
            twin = importlib.import_module("reference." + "layernorm")
            return getattr(twin, "layernorm" + "_bwd")(dout, x, mean, rstd, g)
        """, ["calls the twin's layernorm_bwd"]),
    "the forward's globals": ("""
        from reference.layernorm import layernorm_fwd

        def layernorm_bwd(dout, x, mean, rstd, g):
            return layernorm_fwd.__globals__["layernorm_bwd"](dout, x, mean, rstd, g)
        """, ["calls the twin's layernorm_bwd"]),
    "another backward, the refusal caught": ("""
        import reference as R

        def layernorm_bwd(dout, x, mean, rstd, g):
            try:
                return R.residual_layernorm_bwd(dout, dout, x, mean, rstd, g)[1:]
            except Exception:
                return dout, g, g
        """, ["calls the twin's residual_layernorm_bwd"]),
    "exec of the solution": (f"""
        ns = {{}}
        exec(open({str(SOLUTIONS / 'layernorm_bwd.py')!r}).read(), ns)
        layernorm_bwd = ns["layernorm_bwd"]
        """, ["line 3 reads", "lessons/solutions/layernorm_bwd.py, which the grader keeps from exercises"]),
    "runpy of the solution": (f"""
        import runpy
        layernorm_bwd = runpy.run_path({str(SOLUTIONS / 'layernorm_bwd.py')!r})["layernorm_bwd"]
        """, ["lessons/solutions/layernorm_bwd.py, which the grader keeps"]),
    "the twin's source": ("""
        import reference.layernorm as L

        def layernorm_bwd(dout, x, mean, rstd, g):
            ns = {}
            exec(compile(open(L.__file__).read(), "twin", "exec"), ns)
            return ns["layernorm_bwd"](dout, x, mean, rstd, g)
        """, ["reference/layernorm.py, which the grader keeps"]),
    "a string run": ("""
        source = "def layernorm_bwd(dout, x, mean, rstd, g):\\n    return dout, g, g\\n"
        exec(source)
        """, ["line 3 runs code from a string"]),
    "the caller's frame": ("""
        import sys

        def layernorm_bwd(dout, x, mean, rstd, g):
            f = sys._getframe(1)
            while "CASES" not in f.f_globals:
                f = f.f_back
            r = f.f_globals["CASES"]["layernorm"].backward(dict(dout=dout, x=x, mean=mean, rstd=rstd, g=g))
            return r["dx"], r["dg"], r["db"]
        """, ["reads the interpreter's frames (sys._getframe)"]),
    "inspect.stack": ("""
        import inspect

        def layernorm_bwd(dout, x, mean, rstd, g):
            return [f.frame.f_globals for f in inspect.stack()]
        """, ["reads the interpreter's frames"]),
    "a traceback's frame": ("""
        def layernorm_bwd(dout, x, mean, rstd, g):
            try:
                raise ValueError
            except ValueError as e:
                return e.__traceback__.tb_frame.f_back.f_globals
        """, ["reads the interpreter's frames (tb_frame)"]),
    "the object graph, from a thread": ("""
        import gc
        from concurrent.futures import ThreadPoolExecutor

        def layernorm_bwd(dout, x, mean, rstd, g):
            every = ThreadPoolExecutor(1).submit(gc.get_objects).result()
            return dout, g, g
        """, ["walks the interpreter's objects (gc.get_objects)"]),
    "a process": (f"""
        import subprocess
        text = subprocess.run(["cat", {str(SOLUTIONS / 'layernorm_bwd.py')!r}], capture_output=True).stdout
        """, ["line 3 starts a process"]),
    "a patched numpy": ("""
        import numpy as np

        def layernorm_bwd(dout, x, mean, rstd, g):
            np.max = lambda *a, **k: 0.0
            return dout, g, g
        """, ["changed numpy.max"]),
    "a signal handler": ("""
        import signal

        def layernorm_bwd(dout, x, mean, rstd, g):
            signal.signal(signal.SIGALRM, lambda number, frame: None)
        """, ["installs a signal handler"]),
    "a file written": ("""
        def layernorm_bwd(dout, x, mean, rstd, g):
            open("classmate.py", "w").write("")
        """, ["writes classmate.py"]),
}


@pytest.mark.parametrize("route", NUMPY_BORROWINGS)
def test_a_numpy_file_that_borrows_the_answer_is_refused(tmp_path, monkeypatch, route):
    monkeypatch.chdir(tmp_path)
    text, words = NUMPY_BORROWINGS[route]
    res = E.check("layernorm_bwd", _file(tmp_path, "layernorm_bwd", text))
    _refused(res, "layernorm_bwd: layernorm_bwd.py", *words)
    assert not (tmp_path / "classmate.py").exists()


HEAD = """
    from numba import cuda
    from andrea_numba.kernels.common import elementwise_launch
    """
COPY = """
    @cuda.jit
    def k_residual_add_bwd(dx, df, dout):
        i = cuda.grid(1)
        if i < dout.shape[0]:
            dx[i] = dout[i]
            df[i] = dout[i]
    """
NOTHING = """
    @cuda.jit
    def k_residual_add_bwd(dx, df, dout):
        i = cuda.grid(1)
    """
LAUNCH = """
    def residual_add_bwd(dx, df, dout, stream=0):
        blocks, threads = elementwise_launch(dout.shape[0])
    """

# k_residual_add_bwd, borrowed: (kernel, launch function body, words)
KERNEL_BORROWINGS = {
    "a host copy": (NOTHING, """
        k_residual_add_bwd[blocks, threads, stream](dx, df, dout)
        dx.copy_to_device(dout)
        df.copy_to_device(dout)
    """, ["sends host data to the device (copy_to_device)"]),
    "NumPy on the host, no launch": (NOTHING, """
        h = dout.copy_to_host()
        dx[:] = h * 1.0
        df[:] = h * 1.0
    """, ["sends host data to the device (__setitem__)"]),
    "a host answer sent to a copy kernel": (COPY, """
        answer = cuda.to_device(dout.copy_to_host() * 1.0)
        k_residual_add_bwd[blocks, threads, stream](dx, df, answer)
    """, ["sends host data to the device (cuda.to_device)"]),
    "a host array as an argument": (COPY, """
        k_residual_add_bwd[blocks, threads, stream](dx, df, dout.copy_to_host() * 1.0)
    """, ["passes a NumPy array to k_residual_add_bwd"]),
    "no launch": (COPY, """
        pass
    """, ["launched no kernel of its own"]),
    "another of its kernels": (COPY + COPY.replace("k_residual_add_bwd", "k_mine"), """
        k_mine[blocks, threads, stream](dx, df, dout)
    """, ["never launched k_residual_add_bwd"]),
    "NumPy inside the kernel": ("""
    import numpy as np

    @cuda.jit
    def k_residual_add_bwd(dx, df, dout):
        if cuda.grid(1) == 0:
            np.copyto(dx, dout)
            np.copyto(df, dout)
    """, """
        k_residual_add_bwd[blocks, threads, stream](dx, df, dout)
    """, ["k_residual_add_bwd uses np.copyto (line", "which only the host can run"]),
    "the engine's launcher": (NOTHING, """
        engine = __import__("importlib").import_module("andrea_numba.kernels." + "residual")
        getattr(engine, "residual_add" + "_bwd")(dx, df, dout)
    """, ["imports andrea_numba.kernels.residual, which the grader hides"]),
}


@pytest.mark.parametrize("route", KERNEL_BORROWINGS)
def test_a_launch_function_that_borrows_the_answer_is_refused(tmp_path, route):
    kernel, body, words = KERNEL_BORROWINGS[route]
    text = textwrap.dedent(HEAD) + textwrap.dedent(kernel) + textwrap.dedent(LAUNCH) + textwrap.indent(
        textwrap.dedent(body), "    ")
    res = E.check("k_residual_add_bwd", _file(tmp_path, "k_residual_add_bwd", text))
    _refused(res, *words)


@pytest.mark.skipif(not SIMULATOR, reason="writes through the simulator's NumPy array under a device array")
def test_a_write_past_every_hook_is_seen_by_comparing_the_arrays(tmp_path):
    """The launch record compares the arrays it was handed between launches: a write through the
    simulator's own NumPy array (no copy function called) still shows."""
    text = HEAD + NOTHING + LAUNCH + """
        k_residual_add_bwd[blocks, threads, stream](dx, df, dout)
        dx._ary[:] = dout._ary
        df._ary[:] = dout._ary
    """
    res = E.check("k_residual_add_bwd", _file(tmp_path, "k_residual_add_bwd", textwrap.dedent(text)))
    _refused(res, "wrote dx on the host after its last launch")


def test_the_engines_kernels_by_a_computed_import_are_refused(tmp_path):
    """k_layernorm_bwd's solution with its launch function swapped for the engine's, reached by a
    computed import at the bottom of the file."""
    text = (SOLUTIONS / "k_layernorm_bwd.py").read_text() + textwrap.dedent("""
        import importlib
        layernorm_bwd = getattr(importlib.import_module("andrea_numba.kernels." + "layernorm"), "layernorm_bwd")
        """)
    res = E.check("k_layernorm_bwd", _file(tmp_path, "k_layernorm_bwd", text))
    _refused(res, "imports andrea_numba.kernels.layernorm, which the grader hides")


def test_what_the_exercises_allow_still_passes(tmp_path):
    """The forward twin, namedtuple and dataclasses (which run exec inside the standard library),
    warnings and print: none of it is refused, and the result is the solution's."""
    text = (SOLUTIONS / "layernorm_bwd.py").read_text() + textwrap.dedent("""
        import warnings
        from collections import namedtuple
        from dataclasses import dataclass

        import reference as R

        Pair = namedtuple("Pair", "a b")


        @dataclass
        class Note:
            text: str = "checked"


        _solution = layernorm_bwd


        def layernorm_bwd(dout, x, mean, rstd, g):
            warnings.warn(Note().text)
            print("shapes", dout.shape, R.layernorm_fwd(x, g, g)[0].shape)
            return _solution(dout, x, mean, rstd, g)
        """)
    res = E.check("layernorm_bwd", _file(tmp_path, "layernorm_bwd", text))
    assert res["status"] == "pass" and all(r["verdict"] == "right" for r in res["rows"]), res


def test_a_kernel_with_what_kernels_use_still_passes(tmp_path):
    """math, NumPy's scalar types, a global array and tuple (numba freezes them as constants), a
    device function of the file's own: nothing a GPU kernel cannot run, so nothing is refused."""
    res = E.check("k_residual_add_bwd", _file(tmp_path, "k_residual_add_bwd", HEAD + """
    import math

    import numpy as np
    from numba import float32

    ONES = np.ones(4, np.float32)
    SCALE = (1.0, 1.0)


    @cuda.jit(device=True)
    def same(v):
        return v * ONES[0] * SCALE[1]


    @cuda.jit
    def k_residual_add_bwd(dx, df, dout):
        i = cuda.grid(1)
        if i < dout.shape[0]:
            g = same(dout[i]) * np.float32(1.0) + float32(math.sqrt(0.0))
            dx[i] = g
            df[i] = g
    """ + LAUNCH + """
        k_residual_add_bwd[blocks, threads, stream](dx, df, dout)
    """))
    assert res["status"] == "pass" and all(r["bitwise_repeat"] for r in res["rows"]), res


def test_a_file_cannot_forge_its_result(tmp_path):
    """Lines that look like a passing result, printed and written to every low descriptor, then an
    exit without a result: a crash, never a pass (the result line carries a token the file never sees)."""
    fake = json.dumps({**E._result(E.BY_NAME["layernorm_bwd"], "x"), "status": "pass", "ok": True, "rows": []})
    res = E.check("layernorm_bwd", _file(tmp_path, "layernorm_bwd", f"""
        import os
        line = {fake!r} + "\\n"
        print(line)
        for fd in range(1, 40):
            try:
                os.write(fd, line.encode())
                os.write(fd, ("0" * 32 + " " + line).encode())
            except OSError:
                pass
        os._exit(0)
        """))
    assert res["status"] == "crash" and "exit code 0" in res["message"], res


@pytest.mark.parametrize("body, status, words", [
    ("import time\ntime.sleep(60)\n", "timeout", "took longer than 1 s, the time limit"),
    ("import os\nos._exit(3)\n", "crash", "ended its grading process (exit code 3)"),
    ("import signal\nsignal.raise_signal(signal.SIGKILL)\n", "crash", "killed by signal 9 (SIGKILL)"),
])
def test_a_timeout_or_a_crash_is_a_result_with_its_reason(tmp_path, monkeypatch, body, status, words):
    monkeypatch.chdir(tmp_path)
    res = E.check("residual_bwd", _file(tmp_path, "residual_bwd", body), timeout=1)
    assert res["status"] == status and words in res["message"] and not res["ok"], res
    assert status == "crash" or 1 <= res["seconds"] < 10                 # killed at the limit, not before


def test_without_fork_each_file_gets_a_fresh_interpreter(tmp_path, monkeypatch):
    """Where the platform cannot fork, the same walls run in a fresh interpreter per file."""
    monkeypatch.setattr(warm, "FORK", False)
    text, words = NUMPY_BORROWINGS["a computed name"]
    res = E.check("layernorm_bwd", _file(tmp_path, "layernorm_bwd", text))
    _refused(res, *words)


# ------------------------------------------------------------------------------------------------
# a class


def _class(tmp_path):
    """alice: two NumPy solutions and a kernel solution; bob: a borrowing, an untouched stub, no
    kernel file, and a note that is no exercise; a hidden folder that is no student."""
    d = tmp_path / "class"
    for who in ("alice", "bob", ".git"):
        (d / who).mkdir(parents=True)
    for name in ("layernorm_bwd", "residual_bwd", "k_residual_add_bwd"):
        (d / "alice" / f"{name}.py").write_text((SOLUTIONS / f"{name}.py").read_text())
    _file(d / "bob", "layernorm_bwd", NUMPY_BORROWINGS["a computed name"][0])
    (d / "bob" / "residual_bwd.py").write_text((EXERCISES / "residual_bwd.py").read_text())
    (d / "bob" / "notes.txt").write_text("not an exercise\n")
    return d


def test_a_class_is_graded_into_a_gradebook(tmp_path, capsys):
    d = _class(tmp_path)
    assert E.main(["grade", str(d), "--jobs", "2", "--timeout", "60"]) == 0
    out, err = capsys.readouterr()
    rows = list(csv.DictReader((d / "grades.csv").open()))
    assert [tuple(r[k] for k in ("student", "exercise", "status")) for r in rows] == [
        ("alice", "layernorm_bwd", "pass"), ("alice", "residual_bwd", "pass"),
        ("alice", "k_residual_add_bwd", "pass"),
        ("bob", "layernorm_bwd", "refused"), ("bob", "residual_bwd", "not implemented"),
        ("bob", "k_residual_add_bwd", "missing")]
    assert list(rows[0]) == list(gradebook.FIELDS)
    alice = rows[:3]
    assert [(r["passed"], r["total"]) for r in alice] == [("3", "3"), ("2", "2"), ("2", "2")]
    assert all(float(r["worst_error"]) <= 1e-7 and float(r["seconds"]) > 0 and r["reason"] == "" for r in alice)
    assert "line 5 calls the twin's layernorm_bwd" in rows[3]["reason"]
    assert rows[4]["reason"].startswith("residual_bwd: not implemented yet (the TODO in ")
    assert rows[5]["reason"] == "no file k_residual_add_bwd.py in bob/" and rows[5]["seconds"] == ""
    lines = out.splitlines()
    assert lines[0].startswith("gradebook: 2 students x 3 exercises -> ") and lines[0].endswith("grades.csv")
    assert lines[2].split() == ["alice", "P", "P", "P", "3/3"]
    assert lines[3].split() == ["bob", "R", "-", ".", "0/3"]
    assert "exercises: 1 layernorm_bwd, 2 residual_bwd, 3 k_residual_add_bwd" in out
    assert "counts: pass 3, not implemented 1, refused 1, missing 1" in out
    progress = err.splitlines()
    assert len(progress) == 5 and all(p.startswith(f"[{i}/5] ") for i, p in enumerate(progress, 1))
    assert "bob/layernorm_bwd.py: refused" in err
    assert sorted(p.name for p in d.iterdir()) == [".git", "alice", "bob", "grades.csv"]   # no temporary file left


def test_a_gradebook_that_cannot_be_written_is_one_line_and_exit_1(tmp_path, capsys, monkeypatch):
    d = tmp_path / "class"
    (d / "carol").mkdir(parents=True)
    (d / "carol" / "residual_bwd.py").write_text((EXERCISES / "residual_bwd.py").read_text())

    def refuse(path, rows):
        raise PermissionError(13, "Permission denied")
    monkeypatch.setattr(gradebook, "write_csv", refuse)
    assert E.main(["grade", str(d), "--csv", str(tmp_path / "g.csv")]) == 1
    out, err = capsys.readouterr()
    assert "carol" in out and err.splitlines()[-1].startswith("error: cannot write the gradebook ")
    assert "Traceback" not in out + err


@pytest.mark.parametrize("argv, words", [
    (["grade", "{T}/none"], "does not exist"),
    (["grade", "{T}/empty"], "no student folders in"),
    (["grade", "{T}/nofiles"], "no exercise files in the student folders"),
    (["grade", "{T}/class", "--csv", "{T}/dir.csv"], "is a directory"),
    (["grade", "{T}/class", "--csv", "{T}/grades.txt"], "ending in .csv"),
    (["grade", "{T}/class", "--csv", "{T}/none/grades.csv"], "does not exist"),
    (["grade", "{T}/class", "--timeout", "0"], "argument --timeout"),
    (["grade", "{T}/class", "--timeout", "nan"], "argument --timeout"),
    (["grade", "{T}/class", "--timeout", "1e9"], "must be at most 86400 seconds"),
    (["grade", "{T}/class", "--jobs", "0"], "argument --jobs"),
    (["check", "residual_bwd", "--timeout", "-1"], "argument --timeout"),
])
def test_bad_grade_input_is_one_line_and_exit_2(tmp_path, capsys, argv, words):
    (tmp_path / "empty").mkdir()
    (tmp_path / "dir.csv").mkdir()
    (tmp_path / "nofiles" / "dave").mkdir(parents=True)
    (tmp_path / "class" / "erin").mkdir(parents=True)
    (tmp_path / "class" / "erin" / "residual_bwd.py").write_text("")
    with pytest.raises(SystemExit) as e:
        E.main([a.replace("{T}", str(tmp_path)) for a in argv])
    err = capsys.readouterr().err
    assert e.value.code == 2 and len(err.splitlines()) == 1 and err.startswith("error: ") and words in err, err
    assert not (tmp_path / "class" / "grades.csv").exists()
