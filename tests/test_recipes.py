"""Recipes (andrea_numba/recipes.py): one per precision and class of GPU, resolved by one function for
the trainer, the sampler, the memory plan and the harness; the model runs exactly the kernels its
recipe names; sampling works from a run of every precision; the engine never imports the lab."""
import ast
import dataclasses
import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np

import pytest

from andrea_numba import data, gpu_model as G, plan, recipes, sample
from andrea_numba.checkpoint import save_checkpoint
from andrea_numba.config import config_from_dict, load_config, validate
from andrea_numba.layout import init_params, n_params
from andrea_numba.runlog import CHECKPOINT_FILE, STATE_FILE
from lab.recipes import LAB

ROOT = Path(__file__).resolve().parents[1]
PRECISIONS = ("fp32", "bf16", "fp16", "fp8-fwd", "fp8-e5m2", "fp8-all")


def test_every_precision_and_route_has_one_recipe():
    names = {(p, r): recipes.recipe_for(p, r, hopper=True).name for p in PRECISIONS for r in ("numba", "cublas")
             if not (p.startswith("fp8") and r == "numba")}
    assert names == {("fp32", "numba"): "fp32-hopper", ("bf16", "numba"): "bf16-hopper", ("fp16", "numba"): "fp16",
                     ("fp32", "cublas"): "cublas-fp32", ("bf16", "cublas"): "cublas-bf16",
                     ("fp16", "cublas"): "cublas-fp16", ("fp8-fwd", "cublas"): "cublas-fp8-fwd",
                     ("fp8-e5m2", "cublas"): "cublas-fp8-e5m2", ("fp8-all", "cublas"): "cublas-fp8-all"}
    assert recipes.recipe_for("bf16", hopper=False).name == "bf16-ampere"
    assert recipes.recipe_for("fp32", hopper=False).name == "fp32" and recipes.recipe_for("fp32").name == "fp32"   # simulated
    assert set(recipes.RECIPES) == set(names.values()) | {"bf16-ampere", "fp32"}
    assert not set(recipes.RECIPES) & set(LAB)
    for r in recipes.RECIPES.values():
        assert set(r.kernels) == set(recipes.OPS) - (set(recipes.LINEAR) if r.library else set()), r.name
        assert r.what and (r.elsewhere is None or not recipes.get(r.elsewhere).needs_hopper)
    with pytest.raises(KeyError, match="no recipe 'bf16o'"):
        recipes.get("bf16o")


def test_the_saved_formats_are_declared_per_tensor():
    hopper, fp32 = recipes.get("bf16-hopper"), recipes.get("fp32")
    assert [hopper.saved_format(n) for n in ("ln1", "h", "h_pre", "y", "q")] == ["bf16", "bf16", "fp32", "fp32", "fp32"]
    assert {fp32.saved_format(n) for n in ("ln1", "h", "y")} == {"fp32"}
    m = load_config("tiny").model
    specs = {s.name: s for s in G.buffer_specs(m, 1, 8, **hopper.buffer_flags(m))}
    assert all(specs[n].dtype == np.uint16 for n in recipes.SAVED16 + recipes.OUT16)


@pytest.mark.parametrize("name", ["fp32", "bf16-hopper", "bf16-ampere", "fp16", "bf16w"])
def test_the_model_runs_the_kernels_its_recipe_names(name):
    """GPUModel calls each op's launcher from recipe.kernels: every launch of one forward + backward
    is one of the recipe's launchers (or dropout's, or the v1 LayerNorm that a bf16-saved output
    falls back to), and every linear op's launcher runs."""
    recipe = recipes.RECIPES.get(name) or LAB[name]
    m = dataclasses.replace(load_config("tiny").model, n_layer=1)      # one block runs every op
    model = G.GPUModel(m, 1, 8, recipe=recipe)
    called = []

    def spy(f):
        def launch(*a, **k):
            called.append(f)
            return f(*a, **k)
        return launch
    model.kernels = {op: tuple(spy(f) for f in pair) for op, pair in model.kernels.items()}
    model.params.copy_to_device(init_params(m, 1))
    tokens = np.zeros((1, 8), np.int32)
    model.forward(tokens, tokens)
    model.backward()
    declared = {f for pair in recipe.kernels.values() for f in pair}
    assert set(called) <= declared
    ops = {op for op, pair in recipe.kernels.items() if set(pair) & set(called)}
    assert ops == set(recipes.OPS) - {"layernorm"} or ops == set(recipes.OPS), ops


def test_the_memory_plan_and_the_model_read_the_same_recipe():
    for precision in ("fp32", "bf16", "fp16"):
        raw = load_config("tiny").to_dict()
        raw["train"]["precision"] = precision
        cfg = validate(config_from_dict(raw))
        recipe = recipes.recipe_for(precision)
        rows = plan.memory_plan(cfg)
        names = {n for _, n, _ in rows}
        assert ("y16" in names) == recipe.bf16_outputs and ("params16" in names) == recipe.bf16_weights


def _run_dir(root: Path, precision: str) -> Path:
    """A run directory of the tiny model trained at `precision` (a checkpoint of small random
    weights: what sampling reads)."""
    cfg = load_config("tiny").to_dict()
    cfg["train"].update(precision=precision, products="cublas" if precision.startswith("fp8") else "numba")
    cfg = validate(config_from_dict(cfg))
    run = root / precision
    run.mkdir()
    meta = data.prepare(str(ROOT / "tests" / "test_recipes.py"), "bytes", 256, 0.1, run / "data",
                        seq_len=cfg.train.seq_len)
    n = n_params(cfg.model)
    params = (np.random.default_rng(0).standard_normal(n) * 0.05).astype(np.float32)
    sha = save_checkpoint(run / CHECKPOINT_FILE, 2, params, np.zeros(n, np.float32), np.zeros(n, np.float32))
    state = {"step": 2, "config": cfg.to_dict(), "tokenizer": "bytes", "data": {**meta, "dir": "data"},
             "tokens_seen": 128, "n_params": n, "checkpoint": CHECKPOINT_FILE, "checkpoint_sha256": sha,
             "previous_checkpoint_sha256": None}
    (run / STATE_FILE).write_text(json.dumps(state))
    return run


@pytest.mark.parametrize("precision", PRECISIONS)
def test_sampling_works_from_a_run_of_every_precision(precision, tmp_path, capsys):
    """On the kernels where the run's recipe runs here (the simulator runs ours; cuBLASLt and FP8
    need a GPU: one error line that says so and points to --cpu), and on the twin everywhere."""
    run = _run_dir(tmp_path, precision)
    args = [str(run), "--tokens", "1", "--prompt", "ab"]
    if precision.startswith("fp8"):
        with pytest.raises(SystemExit) as e:
            sample.main(args)
        err = capsys.readouterr().err.strip().splitlines()
        assert e.value.code == 2 and len(err) == 1 and err[0].startswith("error: FP8") and "--cpu" in err[0]
    else:
        assert sample.main(args) == 0
        assert capsys.readouterr().out.startswith("ab")
    assert sample.main(args + ["--cpu"]) == 0
    assert capsys.readouterr().out.startswith("ab")


def _imports(path: Path) -> set:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
    return names


def test_the_engine_never_imports_the_lab():
    """No module of andrea_numba names the lab, and the trainer, the sampler and the harness load
    without it."""
    for path in (ROOT / "andrea_numba").rglob("*.py"):
        assert not {n for n in _imports(path) if n == "lab" or n.startswith("lab.")}, path
    code = ("import sys; import andrea_numba.train, andrea_numba.sample, andrea_numba.check, andrea_numba.plan; "
            "print(sorted(m for m in sys.modules if m == 'lab' or m.startswith('lab.')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT / "tests",
                         env={"NUMBA_ENABLE_CUDASIM": "1", "PATH": "", "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stderr[-2000:]


def test_the_engine_holds_no_ladder_and_the_lab_holds_every_rung():
    """No module of andrea_numba/kernels has a VERSIONS table (the ladders are the lab's); every
    launcher a recipe names is a rung of its op's ladder in the lab, under its own number."""
    import importlib
    import pkgutil

    import andrea_numba.kernels as K
    from lab.cases import CASES as LADDER
    for info in pkgutil.iter_modules(K.__path__):
        assert not hasattr(importlib.import_module(f"andrea_numba.kernels.{info.name}"), "VERSIONS"), info.name
    rungs = {f for case in LADDER.values() for d in ("fwd", "bwd") if d == "fwd" or case.bwd
             for f in case.versions(d).values()}
    for r in recipes.RECIPES.values():
        for op, pair in r.kernels.items():
            assert set(pair) <= rungs, (r.name, op)


def test_the_plain_names_are_the_lessons_pair_and_engine_is_the_fp32_recipe():
    """The names without a suffix (mlp.mlp_fwd, ...) are the simple pair the lessons teach, rung 1 of
    each ladder; case.engine() (what lesson 03 runs) is the fp32 recipe's launcher, so the two
    cannot drift apart. Every engine launcher declares its rung."""
    from andrea_numba.cases import CASES
    from andrea_numba.kernels import attn_flash, attn_out, attn_qkv, embed, layernorm, loss, mlp
    fp32 = recipes.get("fp32").kernels
    for module, op in ((embed, "embed"), (layernorm, "layernorm"), (attn_flash, "attn_flash"), (attn_qkv, "attn_qkv"),
                       (attn_out, "attn_out"), (mlp, "mlp"), (loss, "loss"), (layernorm, "residual_layernorm")):
        assert getattr(module, op + "_fwd").rung == getattr(module, op + "_bwd").rung == 1, op
    for case, op in (("embed", "embed"), ("layernorm", "layernorm"), ("residual_layernorm", "residual_layernorm"),
                     ("attn_flash", "attention"), ("attn_qkv", "attn_qkv"), ("attn_out", "attn_out"), ("mlp", "mlp"),
                     ("loss", "loss")):
        assert (CASES[case].engine("fwd"), CASES[case].engine("bwd")) == fp32[op], case
    for r in recipes.RECIPES.values():
        for op, pair in r.kernels.items():
            assert all(isinstance(f.rung, int) and not re.search(r"_v\d+$", f.__name__) for f in pair), (r.name, op)


def test_the_lab_prints_every_ladder():
    """python -m lab.cases: the MLP's 20 rungs, the recipes' and the lessons' starred."""
    from lab.cases import ladder
    text = ladder()
    mlp_line = next(line for line in text.splitlines() if line.split()[1] == "mlp_fwd")
    assert mlp_line.split()[2:] == [f"v{v}{'*' if v in (1, 12, 14, 16, 19, 21) else ''}" for v in range(1, 22)]
