"""The op-case table and the kernel ladder: one table names every op, every kernel module lists its
versions in VERSIONS (the lab's rungs named by number, the engine's by what they are), and every launcher's signature is its twin's, argument
for argument, after its outputs and work buffers. (That every version has a harness row at every
block size is checked in test_kernels.py, which runs the harness.)"""
import inspect
import re
import sys

import numpy as np
import pytest

import reference as R
from andrea_numba.cases import OPS, VARIANTS, Dims
from lab.cases import CASES, KERNEL_MODULES      # the whole ladder
from andrea_numba.kernels import common

LAUNCHERS = [(case, direction, version, launch)
             for case in CASES.values() for direction in (("fwd", "bwd") if case.bwd else ("fwd",))
             for version, launch in case.versions(direction).items()]


def _id(item):
    case, direction, version, launch = item
    return f"{case.op}-{direction}-v{version}"


def test_the_ops_in_kernel_table_order():
    """The eight op pairs of the kernel table, with dropout before the loss."""
    assert OPS == ["embed", "layernorm", "attn_qkv", "attn", "attn_out", "mlp", "residual", "dropout", "loss"]


def test_every_launcher_in_every_versions_table_belongs_to_a_case():
    named = {(c.module.__name__, n) for c in CASES.values() for n in (c.fwd, c.bwd) if n}
    for module in KERNEL_MODULES:
        for name, versions in module.VERSIONS.items():
            assert (module.__name__, name) in named, f"{module.__name__}.{name} has no case: the harness skips it"
            assert versions and all(isinstance(v, int) and v >= 1 for v in versions)
            for v, launch in versions.items():
                # a lab rung is named by its number; an engine launcher by what it is, with its rung declared
                assert launch.__name__ == f"{name}_v{v}" or getattr(launch, "rung", None) == v, (name, v, launch.__name__)
                assert getattr(module, launch.__name__) is launch             # a module-level name
                assert launch.blocks, f"{launch.__name__} declares no block sizes"
            assert getattr(module, name) in versions.values(), f"{name}: the lessons' launcher is not in VERSIONS"


def test_every_version_belongs_to_a_case():
    """A case may check some versions of a launcher only (`only`: AdamW's v2 has a twin of its
    own); then other cases check the rest: no version is left out, none checked twice that way.
    (Several cases of one launcher with different fixed arguments, as matmul's, check all; the deep
    matmul cases check some of them again, at another shape.)"""
    for module in KERNEL_MODULES:
        for name, versions in module.VERSIONS.items():
            for v in versions:
                owners = [c for c in CASES.values() for d in ("fwd", "bwd")
                          if c.module is module and (c.fwd if d == "fwd" else c.bwd) == name and v in c.versions(d)]
                assert owners, f"{module.__name__}.{name} v{v} is checked by no case"
                fixed = [sorted(c.fixed.items()) for c in owners if c.only]
                assert all(fixed.count(f) == 1 for f in fixed), [c.op for c in owners]


@pytest.mark.parametrize("module", KERNEL_MODULES, ids=lambda m: m.__name__)
def test_lab_kernels_are_numbered_and_engine_kernels_named_by_what_they_are(module):
    """A kernel of a lab module is numbered (k_..._vN); one of the engine (andrea_numba/kernels/,
    seen in a lab module through its star import) is named by what it is."""
    engine = {id(obj) for m in list(sys.modules.values()) if m and m.__name__.startswith("andrea_numba.kernels.")
              for obj in vars(m).values()}
    for name, obj in vars(module).items():
        if name.startswith("k_") and hasattr(obj, "py_func"):
            if id(obj) in engine:
                assert not re.search(r"_v\d+$", name), f"{module.__name__}.{name}: engine kernels are named by what they are"
            else:
                assert re.search(r"_v\d+$", name), f"{module.__name__}.{name}: lab kernels are numbered k_..._vN"


@pytest.mark.parametrize("item", LAUNCHERS, ids=_id)
def test_launcher_signature_is_outputs_scratch_then_the_twins(item):
    case, direction, version, launch = item
    twin = case.twin_fwd if direction == "fwd" else case.twin_bwd
    twin_args = [p for p in inspect.signature(twin).parameters if p not in case.fixed]
    params = inspect.signature(launch).parameters
    assert list(params)[-2:] == ["block", "stream"]
    assert params["block"].kind is inspect.Parameter.KEYWORD_ONLY and params["stream"].default == 0
    # matmul's `accumulate` picks = or += for its output: the twin returns the product either way; an
    # optional keyword output (flash v14's y16, residual_layernorm_bwd v6's d16: a bf16 copy of an
    # output for the engine's bf16o model) is not the twin's and the harness leaves it out
    args = [p for p, q in params.items() if p not in ("block", "stream", "accumulate") and p not in case.fixed
            and not (q.kind is inspect.Parameter.KEYWORD_ONLY and q.default is None)]
    outputs = case.fwd_out if direction == "fwd" else case.bwd_out
    written = [o for o in outputs if o not in twin_args]          # in-place outputs are twin arguments too
    scratch = [s for s in case.scratch if s in args]
    assert args == written + scratch + twin_args, f"{launch.__name__}{inspect.signature(launch)} vs {twin.__name__}{inspect.signature(twin)}"


@pytest.mark.parametrize("op", OPS + VARIANTS)
def test_twin_outputs_have_the_names_and_shapes_the_case_gives(op):
    case, rng = CASES[op], np.random.default_rng(0)
    values = case.make(Dims(B=2, T=3, C=8, H=2, V=7, T_max=5), rng)
    outs = case.forward(values)
    assert set(outs) == set(case.fwd_out)
    grads = case.backward({**values, **outs, **case.upstream_for(outs, rng)})
    for name in case.bwd_out:
        assert np.shape(grads[name]) == np.shape(values[name[1:]]), name      # "dx" is the gradient of "x"
    assert set(case.accumulate) <= set(case.bwd_out)
    assert set(case.upstream.values()) <= set(case.fwd_out)


def test_blocks_gives_the_default_and_declares_the_choices():
    seen = []

    @common.blocks(gpu=(256, 64), sim=(4, 2))
    def launcher(out, *, block, stream=0):
        seen.append(block)
    launcher(None)
    launcher(None, block=2)
    assert seen == [launcher.blocks[0], 2] and len(launcher.blocks) == 2


def test_twin_names_are_the_launcher_names():
    for case in CASES.values():
        for name in (case.fwd, case.bwd):
            if name:
                assert callable(getattr(R, name)), name
        if case.twin:                        # a version with its own twin: only that version
            assert callable(getattr(R, case.twin)) and case.only, case.op


def test_bench_kernels_knows_the_work_of_every_launcher():
    """lab/bench/kernels.py's FLOP and byte table has a row for every launcher of every case."""
    import importlib.util
    from pathlib import Path
    path = Path(__file__).resolve().parents[1] / "lab" / "bench" / "kernels.py"
    spec = importlib.util.spec_from_file_location("bench_kernels", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    d = Dims(2, 8, 8, 2, 7, 16)
    for case in CASES.values():
        for name in (case.fwd, case.bwd):
            if name:
                _flops, nbytes, bound = bench.work(name, d)
                assert bound in ("flop", "byte") and nbytes > 0, name

