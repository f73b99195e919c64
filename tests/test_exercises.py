"""The classroom exercises and their checker: for every exercise the untouched stub is reported as
not implemented, the solution passes, and a planted mistake fails with a row and a hint.
Kernel exercises run in the CUDA simulator at a few rows of C=8 (the whole file: a few seconds)."""
import inspect
import json
import subprocess
import sys
from pathlib import Path

import pytest

import reference as R
from andrea_numba import exercises as E

ROOT = Path(__file__).resolve().parent.parent
EXERCISES = ROOT / "lessons" / "exercises"
SOLUTIONS = ROOT / "lessons" / "solutions"
NAMES = [e.name for e in E.EXERCISES]

# One realistic mistake per exercise, as text edits of its solution:
# name -> ([(old, new), ...], tensor whose row must fail, a word of the hint it must show)
PLANTED = {
    "embed_bwd": ([("np.add.at(dwte, tokens.reshape(-1), dout.reshape(B * T, C))",
                    "dwte[tokens.reshape(-1)] += dout.reshape(B * T, C)")],          # repeats lost
                  "dwte", "np.add.at"),
    "layernorm_bwd": ([("(dxhat - m1 - xhat * m2)", "(dxhat - m1)")],                   # one mean only
                      "dx", "both means"),
    "attn_qkv_bwd": ([("dx = dq @ w_q.T + dk @ w_k.T + dv @ w_v.T", "dx = dq @ w_q.T")],
                     "dx", "three products"),
    "attn_bwd": ([("dkh = (ds.transpose(0, 1, 3, 2) @ qh) * scale",
                   "dkh = ds.transpose(0, 1, 3, 2) @ qh")],                              # scale forgotten
                 "dk", "1/sqrt(hs)"),
    "attn_out_bwd": ([("dw_o = y.reshape(-1, C).T @ dout.reshape(-1, C)",
                       "dw_o = dout.reshape(-1, C).T @ y.reshape(-1, C)")],              # transposed
                     "dw_o", "order"),
    "mlp_bwd": ([("du_dz = GELU_K * (1.0 + 3.0 * GELU_C * z ** 2)", "du_dz = GELU_K")],  # chain rule cut
                "gelu'(z)", "du/dz"),
    "residual_bwd": ([("dx = dout.copy()", "dx = 0.5 * dout"), ("df = dout.copy()", "df = 0.5 * dout")],
                     "dx", "not halved"),
    "dropout_bwd": ([("return dout * keep / (1.0 - dropout_p)", "return dout * keep")],   # scale forgotten
                    "dx", "1/(1-p)"),
    "loss_bwd": ([("(float(dloss) / n_pos)", "float(dloss)")], "dx", "B*T"),
    "k_residual_add_bwd": ([("        df[i] = g\n", "")], "df", "BOTH"),                 # df never written
    "k_layernorm_bwd": ([("block_sum(buf, s1)", "s1"), ("block_sum(buf, s2)", "s2")],    # partial sums only
                        "dx", "block_sum"),
    "k_loss_bwd": ([("dlogits[row, v] = p * scale", "dlogits[row, v] = p")], "dx", "scale"),
    "k_embed_bwd_wpe": ([("dwpe[t, c] += s\n", "dwpe[t, c] = s\n")], "dwpe", "+="),           # = instead of +=
}


def _plant(tmp_path, name, edits, subdir="planted"):
    text = (SOLUTIONS / f"{name}.py").read_text()
    for old, new in edits:
        assert text.count(old) == 1, (name, old)
        text = text.replace(old, new)
    d = tmp_path / subdir
    d.mkdir(exist_ok=True)
    path = d / f"{name}.py"
    path.write_text(text)
    return path


def test_every_exercise_has_a_stub_a_solution_and_a_planted_mistake():
    assert set(PLANTED) == set(NAMES)
    from andrea_numba.cases import OPS
    numpy_ops = [e.op for e in E.EXERCISES if e.kind == "numpy"]
    assert sorted(numpy_ops) == sorted(OPS)               # one NumPy exercise per op pair, dropout too
    assert len([e for e in E.EXERCISES if e.kind == "kernel"]) >= 3
    for name in NAMES:
        stub, sol = (EXERCISES / f"{name}.py").read_text(), (SOLUTIONS / f"{name}.py").read_text()
        assert "# TODO" in stub and 'raise NotImplementedError("write ' in stub, name
        assert "NotImplementedError" not in sol and "# TODO" not in sol, name
        assert stub.startswith('"""') and sol.split('"""')[1] == stub.split('"""')[1], name   # same docstring


@pytest.mark.parametrize("name", [e.name for e in E.EXERCISES if e.kind == "numpy"])
def test_numpy_exercises_have_exactly_the_twins_signature(name):
    ex = E.BY_NAME[name]
    want = inspect.signature(getattr(R, ex.func))
    for folder in (EXERCISES, SOLUTIONS):
        mod = E.load(ex, folder / f"{name}.py")
        assert inspect.signature(getattr(mod, ex.func)) == want, (folder, name)


@pytest.mark.parametrize("name", NAMES)
def test_untouched_stub_is_not_implemented(name):
    res = E.check(name, EXERCISES / f"{name}.py")
    assert res["status"] == "not implemented" and not res["ok"] and not res["rows"]
    assert res["message"].startswith(f"{name}: not implemented yet (the TODO in ")
    assert f"{name}.py, line " in res["message"]


@pytest.mark.parametrize("name", NAMES)
def test_solution_passes(name):
    res = E.check(name, SOLUTIONS / f"{name}.py")
    assert res["status"] == "pass" and res["ok"], E.format_result(res)
    assert res["rows"] and all(r["ok"] and r["verdict"] == "right" and r["hint"] is None for r in res["rows"])
    if res["kind"] == "numpy":
        assert all(r["rel_err"] <= 1e-7 and r["rel_err_twin"] <= 1e-7 for r in res["rows"])
    else:
        assert all(r["bitwise_repeat"] for r in res["rows"])


@pytest.mark.parametrize("name", NAMES)
def test_planted_mistake_fails_with_a_row_and_a_hint(tmp_path, name):
    edits, tensor, hint_word = PLANTED[name]
    res = E.check(name, _plant(tmp_path, name, edits))
    assert res["status"] == "fail" and not res["ok"], res["message"]
    rows = {r["tensor"]: r for r in res["rows"]}
    bad = rows[tensor]
    assert not bad["ok"] and bad["verdict"].startswith(("wrong", "suspicious")), bad
    assert hint_word in bad["hint"], bad["hint"]
    assert f"HINT: {bad['hint']}" in E.format_result(res)


def test_mlp_with_only_gelu_grad_written_points_at_the_second_todo(tmp_path):
    stub = (EXERCISES / "mlp_bwd.py").read_text()
    sol = (SOLUTIONS / "mlp_bwd.py").read_text()
    gelu = sol[sol.index("def gelu_grad"):sol.index("def mlp_bwd")]
    path = tmp_path / "mlp_bwd.py"
    path.write_text(stub[:stub.index("def gelu_grad")] + gelu + stub[stub.index("def mlp_bwd"):])
    res = E.check("mlp_bwd", path)
    todo_lines = [i + 1 for i, s in enumerate(path.read_text().splitlines()) if "# TODO" in s]
    assert res["status"] == "not implemented" and res["message"].endswith(f"line {todo_lines[-1]})")
    assert E.file_status("mlp_bwd", path) == "in progress"


def test_broken_files_give_one_line_with_file_and_line(tmp_path):
    bad = tmp_path / "layernorm_bwd.py"
    bad.write_text("import numpy as np\n\ndef layernorm_bwd(dout, x, mean, rstd, g)\n    return 1\n")
    res = E.check("layernorm_bwd", bad)
    assert res["status"] == "error" and "layernorm_bwd.py, line 3: SyntaxError" in res["message"]
    assert "\n" not in res["message"]
    bad.write_text("import numpy as np\nfrom reference.layernorm import layernorm_fwdd\n")
    res = E.check("layernorm_bwd", bad)
    assert "line 2 does not import: ImportError" in res["message"]
    bad.write_text("from reference.layernorm import layernorm_bwd  # borrowed\n")
    assert "imports the twin's layernorm_bwd: write your own" in E.check("layernorm_bwd", bad)["message"]
    bad.write_text("import reference as R\n\ndef layernorm_bwd(dout, x, mean, rstd, g):\n"
                   "    return R.layernorm_bwd(dout, x, mean, rstd, g)\n")
    assert "calls the twin's layernorm_bwd" in E.check("layernorm_bwd", bad)["message"]
    bad.write_text("def layernorm_bwd(dout, x, mean, rstd, g):\n    return dout, g\n")
    assert "returned 2 values; it must return 3: (dx, dg, db)" in E.check("layernorm_bwd", bad)["message"]
    bad.write_text("def layernorm_bwd(dout, x, mean, rstd, g):\n    return dout, g, g[:2]\n")
    assert "returned db of shape (2,)" in E.check("layernorm_bwd", bad)["message"]
    bad.write_text("def layernorm_bwd(dout, x, mean, rstd, g):\n    return dout.bogus\n")
    res = E.check("layernorm_bwd", bad)
    assert res["status"] == "error" and "line 2: AttributeError" in res["message"]
    assert "no file" in E.check("layernorm_bwd", tmp_path / "nowhere.py")["message"]


@pytest.mark.parametrize("borrow, says", [
    ("from andrea_numba.kernels.layernorm import layernorm_bwd_two_stage as layernorm_bwd\n",
     "imports the engine's own kernels (andrea_numba.kernels.layernorm)"),
    ("from andrea_numba.kernels import layernorm as L\nlayernorm_bwd = L.layernorm_bwd\n",
     "imports the engine's own kernels (andrea_numba.kernels.layernorm)"),
    ("import andrea_numba.gpu_model\n", "imports the engine's own kernels (andrea_numba.gpu_model)"),
    ("import reference as R\nk_layernorm_bwd = R.layernorm_bwd\n", "calls the twin's layernorm_bwd"),
])
def test_a_kernel_file_that_borrows_the_answer_is_refused(tmp_path, borrow, says):
    """The grader reads what the student's module imports and holds: the engine's own kernels of
    the op, or its twin's backward, are the answer, not a way to it (one line, status refused)."""
    path = tmp_path / "k_layernorm_bwd.py"
    path.write_text((SOLUTIONS / "k_layernorm_bwd.py").read_text() + "\n" + borrow)
    res = E.check("k_layernorm_bwd", path)
    assert res["status"] == "refused" and says in res["message"] and "\n" not in res["message"], res["message"]


def test_a_kernel_that_indexes_out_of_bounds_names_its_line(tmp_path):
    path = _plant(tmp_path, "k_residual_add_bwd", [("    if i < dout.shape[0]:\n", "    if True:\n")])
    res = E.check("k_residual_add_bwd", path)
    line = next(i + 1 for i, s in enumerate(path.read_text().splitlines()) if "g = dout[i]" in s)
    assert res["status"] == "error" and f"line {line}: IndexError" in res["message"], res["message"]


def test_list_and_exit_codes(tmp_path, capsys):
    assert E.main(["list"]) == 0
    out = capsys.readouterr().out
    for e in E.EXERCISES:
        assert any(line.split()[:3] == [e.name, e.kind, e.op] and line.endswith("not started")
                   for line in out.splitlines()), e.name
    assert E.main(["list", "--dir", str(SOLUTIONS)]) == 0
    assert "written (run check)" in capsys.readouterr().out
    assert E.main(["check", "layernorm_bwd", "--file", str(SOLUTIONS / "layernorm_bwd.py")]) == 0
    out = capsys.readouterr().out
    assert "PASS" in out and "right" in out and "vs numeric" in out
    planted = _plant(tmp_path, "loss_bwd", PLANTED["loss_bwd"][0])
    assert E.main(["check", "loss_bwd", "--file", str(planted), "--json"]) == 1
    res = json.loads(capsys.readouterr().out)
    assert res["status"] == "fail" and any(r["hint"] and "B*T" in r["hint"] for r in res["rows"])
    assert E.main(["check", "no_such_exercise"]) == 2
    assert "unknown exercise" in capsys.readouterr().err


def test_command_line_module():
    p = subprocess.run([sys.executable, "-m", "andrea_numba.exercises", "check", "attn_bwd",
                        "--file", str(EXERCISES / "attn_bwd.py")], capture_output=True, text=True, cwd=ROOT)
    assert p.returncode == 1, p.stderr
    assert p.stdout.strip() == "attn_bwd: not implemented yet (the TODO in lessons/exercises/attn_bwd.py, line " \
        + str(next(i + 1 for i, s in enumerate((EXERCISES / "attn_bwd.py").read_text().splitlines())
                   if "# TODO" in s)) + ")"
