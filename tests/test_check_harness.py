"""The agreement harness itself: it must catch an unwritten element, = instead of +=, and a
kernel that is not deterministic. Cheap: elementwise kernels on a few elements."""
import numpy as np
from numba import cuda

from andrea_numba import check
from andrea_numba.kernels import residual


def _rng():
    return np.random.default_rng(0)


def test_a_correct_kernel_passes():
    x, f = np.arange(6, dtype=np.float32), np.ones(6, dtype=np.float32)
    rows = check.run_op("residual", lambda d: residual.residual_add(d["out"], d["x"], d["f"]),
                        dict(x=x, f=f), dict(out=(6,)), [], dict(out=x + 1.0), rng=_rng())
    assert rows[0]["ok"] and rows[0]["max_abs_err"] == 0 and rows[0]["bitwise_repeat"]


def test_poison_catches_an_unwritten_element():
    x, f = np.arange(6, dtype=np.float32), np.ones(6, dtype=np.float32)
    lazy = lambda d: residual.residual_add(d["out"][:5], d["x"][:5], d["f"][:5])    # forgets the last one
    rows = check.run_op("residual", lazy, dict(x=x, f=f), dict(out=(6,)), [], dict(out=x + 1.0), rng=_rng())
    assert not rows[0]["ok"] and rows[0]["max_abs_err"] == float("inf")


def test_prefill_catches_assignment_instead_of_accumulation():
    g = np.arange(6, dtype=np.float32)
    ref = g.astype(np.float64)
    # residual_add(out, zeros, g) *writes* out = g: a backward that forgot +=
    writes = lambda d: residual.residual_add(d["dw"], d["zeros"], d["g"])
    adds = lambda d: residual.residual_add(d["dw"], d["dw"], d["g"])
    inputs = dict(g=g, zeros=np.zeros(6, np.float32))
    assert not check.run_op("x", writes, inputs, {}, ["dw"], dict(dw=ref), rng=_rng())[0]["ok"]
    assert check.run_op("x", adds, inputs, {}, ["dw"], dict(dw=ref), rng=_rng())[0]["ok"]


def test_repeat_catches_a_nondeterministic_kernel():
    x = np.zeros(6, dtype=np.float32)
    calls = []

    def flaky(d):
        calls.append(1)
        noise = cuda.to_device(np.full(6, 1e-7 * len(calls), np.float32))     # differs per run
        residual.residual_add(d["out"], d["x"], noise)

    row = check.run_op("x", flaky, dict(x=x), dict(out=(6,)), [], dict(out=x.astype(np.float64)), rng=_rng())[0]
    assert row["max_abs_err"] < 1e-6 and not row["bitwise_repeat"] and not row["ok"]


def test_op_rows_keep_only_the_versions_asked_for():
    from andrea_numba.config import load_config
    m = load_config("tiny").model
    rows = check.op_rows(m, 2, 5, _rng(), ops=["residual"], versions=[1])
    assert rows and {r["version"] for r in rows} == {1}
    assert check.op_rows(m, 2, 5, _rng(), ops=["residual"], versions=[99]) == []


def test_a_block_that_does_not_fit_the_size_is_skipped_and_said(monkeypatch, capsys):
    """A GPU block of flash attention v4 at the tiny size's head size 4 (it splits no tile of 8
    rows over 128 threads): the harness checks the other blocks and names the one it skipped."""
    from andrea_numba.config import load_config
    from lab import attn_flash as lab_attn_flash
    from lab.cases import CASES
    m = load_config("tiny").model
    fwd = lab_attn_flash.VERSIONS["attn_flash_fwd"][4]
    monkeypatch.setattr(fwd, "blocks", (fwd.blocks[0], (4, 8)))
    rows = check.op_rows(m, 1, 5, _rng(), ops=["attn_flash"], versions=[4], cases=CASES)
    assert rows and all(r["ok"] for r in rows)
    assert "(4,8)" not in {r["block"] for r in rows if r["kernel"] == "attn_flash_fwd"}
    assert "not checked at this size: flash attention v4: block (4, 8)" in capsys.readouterr().err


def test_model_only_does_not_combine_with_op_filters(capsys):
    import pytest
    with pytest.raises(SystemExit) as e:
        check.main(["--model-only", "--op", "residual"])
    assert e.value.code != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--model-only" in err[0]
