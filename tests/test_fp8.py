"""The FP8 formats of reference/fp8.py (simulated FP8): every one of the 256 bit patterns
of E4M3 and E5M2, decoded from the OCP FP8 definitions, is a fixed point of round_fp8; a value
halfway between two neighbours goes to the one whose last mantissa bit is 0; everything past the
largest value saturates; and per-tensor scaling maps a tensor's amax onto the format's largest value,
losing to underflow what lies more than the format's range below it."""
import numpy as np
import pytest

from reference.fp8 import E4M3, E5M2, quantize, round_fp8


def _decode(fmt):
    """{value: mantissa bits} of every finite value of fmt, from its bit patterns (sign, exponent,
    mantissa) as the OCP FP8 formats define them."""
    M, bias = fmt.mantissa_bits, 1 - fmt.min_exponent
    E = 7 - M                                          # exponent bits
    out = {}
    for exp in range(2 ** E):
        for man in range(2 ** M):
            if fmt is E4M3 and exp == 2 ** E - 1 and man == 2 ** M - 1:
                continue                               # E4M3's NaN
            if fmt is E5M2 and exp == 2 ** E - 1:
                continue                               # E5M2's infinities and NaNs
            v = (man / 2 ** M) * 2.0 ** (1 - bias) if exp == 0 else (1 + man / 2 ** M) * 2.0 ** (exp - bias)
            out[v] = out[-v] = man
    return out


@pytest.mark.parametrize("fmt", [E4M3, E5M2], ids=lambda f: f.name)
def test_every_value_is_a_fixed_point_and_midpoints_go_to_the_even_neighbour(fmt):
    table = _decode(fmt)
    values = np.array(sorted(table))
    assert values.max() == fmt.max_value and values[values > 0].min() == fmt.smallest
    assert len(values) == (253 if fmt is E4M3 else 247)      # 254 / 248 patterns, +0 and -0 one value
    np.testing.assert_array_equal(round_fp8(values, fmt), values)
    lo, hi = values[:-1], values[1:]
    mid = (lo + hi) / 2
    even = np.array([a if table[a] % 2 == 0 else b for a, b in zip(lo, hi)])   # last mantissa bit 0
    np.testing.assert_array_equal(round_fp8(mid, fmt), even)
    np.testing.assert_array_equal(round_fp8(mid + (hi - lo) * 1e-3, fmt), hi)   # just past halfway
    np.testing.assert_array_equal(round_fp8(mid - (hi - lo) * 1e-3, fmt), lo)
    try:
        import ml_dtypes                                            # its FP8 types agree, where installed
    except ImportError:
        return
    dt = ml_dtypes.float8_e4m3fn if fmt is E4M3 else ml_dtypes.float8_e5m2
    x = np.random.default_rng(1).standard_normal(5000) * np.logspace(-5, 2.5, 5000)
    x = x[np.abs(x) <= fmt.max_value]        # past it ml_dtypes gives NaN or inf; we saturate, as .satfinite
    np.testing.assert_array_equal(round_fp8(x, fmt), x.astype(dt).astype(np.float64))


@pytest.mark.parametrize("fmt", [E4M3, E5M2], ids=lambda f: f.name)
def test_saturation_nan_and_the_unit_roundoff(fmt):
    big = np.array([fmt.max_value * 1.01, 1e30, np.inf, -np.inf, -1e30])
    np.testing.assert_array_equal(round_fp8(big, fmt), [fmt.max_value, fmt.max_value, fmt.max_value,
                                                        -fmt.max_value, -fmt.max_value])
    assert np.isnan(round_fp8(np.nan, fmt))
    assert round_fp8(fmt.smallest / 2, fmt) == 0 and round_fp8(fmt.smallest * 0.51, fmt) == fmt.smallest
    rng = np.random.default_rng(2)                  # normals: |error| <= u |x| / (1 + u), reached just past
    x = rng.uniform(1, 2, 20000) * 2.0 ** rng.integers(fmt.min_exponent, 8, 20000)   # 2^e + half a step
    rel = np.abs(round_fp8(x, fmt) - x) / x
    u = fmt.unit_roundoff
    assert rel.max() <= u / (1 + u) and rel.max() > 0.95 * u / (1 + u)


def test_per_tensor_scaling_maps_amax_to_the_largest_value_and_counts_underflow():
    rng = np.random.default_rng(3)
    x = rng.standard_normal(4096) * 1e-4                     # far below E4M3's range unscaled
    assert np.mean(round_fp8(x, E4M3) == 0) > 0.99            # unscaled: nearly all lost
    q = quantize(x, E4M3)
    assert q.amax == np.max(np.abs(x)) and q.scale == E4M3.max_value / q.amax
    assert np.max(np.abs(q.values)) == q.amax and q.saturated == 0.0
    assert np.max(np.abs(q.values - x) / np.abs(x)) < 0.2 and q.underflow < 0.01
    wide = np.concatenate([[1.0], np.full(100, 1e-6)])       # 1e-6 of amax: below E4M3's 2^-9 / 448
    assert quantize(wide, E4M3).underflow == pytest.approx(100 / 101) and quantize(wide, E5M2).underflow == 0.0
    stale = quantize(np.array([0.5, 2.0, -4.0]), E4M3, amax=1.0)    # a delayed scale from a smaller amax
    assert stale.saturated == pytest.approx(2 / 3) and list(stale.values) == [0.5, 1.0, -1.0]
    assert quantize(np.zeros(3), E5M2).scale == 1.0 and quantize(np.zeros(3), E5M2).underflow == 0.0


# ------------------------------------------------------------------------------------------------
# FP8 products in the twin (reference.precision's FP8 scopes) and the study (python -m andrea_numba.fp8)

def test_the_scopes_quantize_the_products_they_name():
    import reference as R
    from reference.fp8 import quantize_gpu
    from reference.precision import as_grad, backward_products, fp8_log, mm, round_bf16
    rng = np.random.default_rng(4)
    a, b = rng.standard_normal((8, 16)), rng.standard_normal((16, 4))
    g = as_grad(rng.standard_normal((8, 16)) * 1e-3)
    exact = a @ b
    with R.products_in("fp8-fwd"), fp8_log() as log:
        fwd = mm(a, b)
        with backward_products():
            want = round_bf16(g).astype(np.float64) @ round_bf16(b).astype(np.float64)
            assert np.array_equal(mm(g, b), want)                      # the backward's: bf16
    assert [e["format"] for e in log] == ["e4m3", "e4m3"] and not np.array_equal(fwd, exact)
    np.testing.assert_array_equal(fwd, quantize_gpu(a, E4M3).values @ quantize_gpu(b, E4M3).values)
    np.testing.assert_allclose(fwd, quantize(a, E4M3).values @ quantize(b, E4M3).values, rtol=1e-5, atol=1e-5)
    with R.products_in("fp8-e5m2"), backward_products(), fp8_log() as log:
        out = mm(g.reshape(8, 16).T.T * 2.0, b)                          # the mark survives views and arithmetic
    assert [e["format"] for e in log] == ["e5m2", "e4m3"] and all(e["backward"] for e in log)
    assert type(out).__name__ == "Grad"                                   # ... and products of a gradient
    with R.products_in("fp8-all"), backward_products(), fp8_log() as log:
        mm(g, b)
    assert [e["format"] for e in log] == ["e4m3", "e4m3"]


def test_the_study_measures_every_op_output_at_every_scope(tmp_path):
    import json

    from andrea_numba import fp8
    from andrea_numba.cases import CASES
    rows = fp8.study("tiny", B=1, T=8)
    assert {r["op"] for r in rows} == set(fp8.STUDY_OPS)
    for op in fp8.STUDY_OPS:
        outs = {(r["direction"], r["tensor"]) for r in rows if r["op"] == op}
        assert outs >= {("fwd", t) for t in CASES[op].fwd_out if t != "att"} | {("bwd", t) for t in CASES[op].bwd_out}
    for r in rows:
        if r["scope"] == "fp8-fwd" and r["direction"] == "bwd" and r["op"] in ("attn_qkv", "attn_out"):
            assert 0 < r["rel_err"] < 2.0 ** -6 and r["quantized"] == 0    # bf16 products: within a few u of bf16
        elif r["tensor"] != "loss":
            assert 1e-3 < r["rel_err"] < 1.0, r                              # eight bits show, and no blow-up
    out, png = tmp_path / "s.json", tmp_path / "s.png"
    fp8.main(["study", "--size", "tiny", "--seq", "8", "--batch", "1", "--json", str(out), "--plot", str(png)])
    assert json.loads(out.read_text())[0].keys() >= {"op", "scope", "rel_err", "underflow"}
    assert png.read_bytes()[:4] == b"\x89PNG"


def test_the_study_runs_at_its_defaults_on_the_tiny_model_and_says_what_its_columns_are(capsys):
    """--seq defaults to 64 or the model's context where that is shorter (tiny's 16), and the table
    ends with what its error and underflow columns measure."""
    from andrea_numba import fp8
    fp8.main(["study", "--size", "tiny", "--batch", "1", "--scope", "fp8-fwd"])
    out = capsys.readouterr().out
    assert "B = 1, T = 16:" in out
    assert "max |fp8 - exact| / max |exact|" in out and "underflow" in out.split("\n\n")[-1]


@pytest.mark.parametrize("argv, says", [(["study", "--scope", "fp4"], "unknown scope 'fp4'"),
                                        (["study", "--size", "tiny", "--seq", "17"], "longer than the tiny model's context"),
                                        (["study", "--plot", "/nonexistent/x.png"], "does not exist"),
                                        ([], "the following arguments are required")])
def test_the_study_refuses_bad_input_in_one_line(argv, says, capsys):
    from andrea_numba import fp8
    with pytest.raises(SystemExit) as e:
        fp8.main(argv)
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and says in err and "\n" not in err


def test_the_history_command_reads_a_runs_fp8_record(tmp_path, capsys):
    import json

    from andrea_numba import fp8
    run = tmp_path / "run"
    run.mkdir()
    with open(run / ".fp8.json", "w") as f:
        for step in (1, 10):
            tensors = [dict(label=lab, layer=l, elements=10, amax=a * (l + 1), underflow=u * step)
                       for l in range(2) for lab, a, u in (("mlp.fwd.h", 2.0, 0.0), ("mlp.bwd.dout", 1e-3, 0.01))]
            f.write(json.dumps({"step": step, "tensors": tensors}) + "\n")
    series = fp8.by_tensor(fp8.read_history(run))
    assert series["mlp.fwd.h"] == [(1, 4.0, 0.0), (10, 4.0, 0.0)]          # the largest over the layers
    assert series["mlp.bwd.dout"][-1] == (10, 2e-3, 0.1)
    png = tmp_path / "h.png"
    fp8.main(["history", str(run), "--plot", str(png)])
    assert "10.00%" in capsys.readouterr().out and png.read_bytes()[:4] == b"\x89PNG"
    (run / ".fp8.json").write_text("{not json\n")
    with pytest.raises(SystemExit) as e:
        fp8.main(["history", str(run)])
    assert e.value.code == 2 and "is not an FP8 record" in capsys.readouterr().err


def test_an_fp8_precision_runs_through_cublaslt_and_says_so_where_it_cannot():
    from andrea_numba import train
    from andrea_numba.config import ConfigError, config_from_dict, load_config
    from andrea_numba.gpu_model import products_scratch
    from andrea_numba.recipes import recipe_for
    args = train.parser().parse_args(["--size", "tiny", "--precision", "fp8-e5m2"])
    cfg = train.build_config(args)
    assert (cfg.train.precision, cfg.train.products) == ("fp8-e5m2", "cublas")     # --products implied
    assert recipe_for("fp8-e5m2", "cublas").name == "cublas-fp8-e5m2"
    raw = load_config("tiny").to_dict()
    raw["train"].update(precision="fp8-all", products="numba")
    with pytest.raises(ConfigError, match="set train.products to 'cublas'"):
        config_from_dict(raw)
    m = cfg.model
    assert products_scratch("cublas-fp8-all", 64, m.d_model, m.vocab_size, m.n_layer)["operands_fp8"] > 0
    from andrea_numba.plan import PlanError, check_device
    with pytest.raises(PlanError, match="FP8 products need a GPU"):            # the simulator: one line
        check_device(cfg)
