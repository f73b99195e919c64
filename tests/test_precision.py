"""bfloat16 rounding (reference/precision.py), its twin of the GPU's packing instruction (ptx.bf16x2)
and the harness's two checks of a bf16 product version (check.low_precision_reference)."""
import dataclasses

import numpy as np
import pytest

import reference as R
from andrea_numba import check
from andrea_numba.cases import CASES, Dims
from andrea_numba.config import load_config
from andrea_numba.kernels import matmul
from lab import matmul as lab_matmul
from andrea_numba.kernels.common import SIMULATOR
from lab.recipes import get as lab_recipe


def bits(x):
    return np.asarray(x, np.float32).view(np.uint32)


def test_round_bf16_is_to_nearest_with_ties_to_even():
    one = 1.0
    gap = 2.0 ** -7                                       # bf16 neighbours of 1.0 are 2^-7 apart
    x = np.array([one + gap / 2, one + 3 * gap / 2,       # ties: to the even neighbour (1, then 1 + 2 gap)
                  one + gap / 2 + 2 ** -20,               # just past the tie: up
                  one + gap / 2 - 2 ** -20,               # just below: down
                  -(one + 3 * gap / 2)], np.float32)
    want = np.array([one, one + 2 * gap, one + gap, one, -(one + 2 * gap)], np.float32)
    assert np.array_equal(R.round_bf16(x), want)


def test_round_bf16_keeps_8_significant_bits_and_float32s_range():
    x = np.random.default_rng(0).standard_normal(50_000).astype(np.float32) * np.float32(1e3)
    y = R.round_bf16(x)
    assert np.all(bits(y) & 0xFFFF == 0)                  # a float32 with its low 16 bits zero
    assert np.max(np.abs(y - x) / np.abs(x)) <= 2.0 ** -8  # moved by at most u = 2^-8 of itself
    assert np.array_equal(R.round_bf16(y), y)             # bf16 values stay as they are
    special = R.round_bf16(np.array([np.inf, -np.inf, np.nan, 0.0, -0.0, 3.4e38], np.float32))
    assert np.isinf(special[0]) and special[0] > 0 and np.isinf(special[1]) and np.isnan(special[2])
    assert bits(special[3]) == 0 and bits(special[4]) == 0x80000000
    assert np.isinf(special[5])                           # past bf16's largest finite value


def test_round_bf16_matches_an_independent_nearest_neighbour_search():
    x = np.random.default_rng(1).standard_normal(2_000).astype(np.float32)
    lo = (bits(x) & 0xFFFF0000).view(np.float32).astype(np.float64)     # truncation: one neighbour
    hi = ((bits(x) & 0xFFFF0000) + 0x10000).astype(np.uint32).view(np.float32).astype(np.float64)
    xd = x.astype(np.float64)
    nearest = np.where(np.abs(xd - lo) < np.abs(xd - hi), lo, hi)      # (no exact ties in random data)
    assert np.array_equal(R.round_bf16(x).astype(np.float64), nearest)


@pytest.mark.skipif(not SIMULATOR, reason="the simulator's twin of cvt.rn.bf16x2.f32")
def test_bf16x2_packs_the_low_value_in_the_low_half():
    from andrea_numba.kernels.ptx import bf16x2
    packed = np.int32(bf16x2(np.float32(1.0), np.float32(-2.0))).view(np.uint32)
    assert packed & 0xFFFF == 0x3F80 and packed >> 16 == 0xC000       # bf16 1.0 and -2.0


def test_the_rounding_bound_holds_and_catches_coarser_rounding():
    rng = np.random.default_rng(2)
    a, b = rng.standard_normal((40, 64)), rng.standard_normal((64, 24))
    exact = a @ b
    bound = R.error_bound(a, b, "bf16")
    with R.products_in("bf16"):
        assert np.all(np.abs(R.matmul(a, b) - exact) <= bound)
    coarse = lambda x: (bits(x) & 0xFFF00000).view(np.float32).astype(np.float64)   # 4 bits kept, truncated
    assert np.any(np.abs(coarse(a) @ coarse(b) - exact) > bound)


def test_the_harness_checks_a_bf16_version_twice():
    """Against the twin on rounded inputs at the fp32 tolerance, and against the fp32 twin within
    the rounding bound: a launcher that does not round fails the first, one that rounds more the second."""
    case = CASES["matmul"]
    dims = Dims.of(load_config("tiny").model, 3, 13)
    rng = np.random.default_rng(3)
    ref = check.reference_for(case, "fwd", dims, rng)

    def fake(rounding):
        def launch(out, work, a, b, trans_a=False, trans_b=False, accumulate=False, *, block=None, stream=0):
            got = rounding(check.to_host(a)).astype(np.float64) @ rounding(check.to_host(b)).astype(np.float64)
            out.copy_to_device(got.astype(np.float32))
        launch.precision = "bf16"
        return launch
    ok = check.check_launcher(case, "fwd", fake(R.round_bf16), dims, rng, version=10, ref=ref)
    assert [r["tensor"] for r in ok] == ["out", "out vs fp32 twin (bf16 products)"] and all(r["ok"] for r in ok)
    unrounded = check.check_launcher(case, "fwd", fake(lambda x: x), dims, rng, version=10, ref=ref)
    assert not unrounded[0]["ok"] and unrounded[1]["ok"]
    coarse = lambda x: (bits(x) & 0xFFF00000).view(np.float32)
    rough = check.check_launcher(case, "fwd", fake(coarse), dims, rng, version=10, ref=ref)
    assert not rough[0]["ok"] and not rough[1]["ok"]


def test_matmul_v10_is_a_bf16_version_of_the_ladder():
    assert lab_matmul.VERSIONS["matmul"][10] is lab_matmul.matmul_v10 and lab_matmul.matmul_v10.precision == "bf16"
    assert lab_matmul.matmul_v10.family == "v10" and matmul.TILE_FAMILIES["v10"].rung == 10


@pytest.mark.slow
def test_the_whole_model_with_bf16_products_agrees_with_the_twin_at_bf16():
    m = load_config("tiny").model
    rows = check.model_rows(m, 2, 8, np.random.default_rng(1234), 1234, recipe=lab_recipe("bf16w"), attention=(True,))
    assert {r["op"] for r in rows} == {"model, flash attention, bf16 products"}     # the engine's attention
    assert all(r["ok"] and r["bitwise_repeat"] for r in rows)
    assert [r["share"] for r in rows if "share" in r] == [1.0]       # every tensor nearest the twin


def test_the_whole_model_rows_fail_a_model_that_truncates_or_does_not_round():
    """check.model_compare on the tiny model's twins: the twin at bf16 with fp32-grade noise passes
    every row; the truncating twin fails the gradient rows (nearer itself than the twin); the
    unrounded twin fails the share row."""
    import reference as R
    from andrea_numba.layout import init_params
    m = load_config("tiny").model
    rng = np.random.default_rng(2)
    params = (init_params(m, 2) + rng.standard_normal(init_params(m, 2).size) * 0.01).astype(np.float64)
    tokens, targets = (rng.integers(0, m.vocab_size, size=(2, 8)).astype(np.int32) for _ in range(2))

    def twin(precision):
        loss, acts = R.model_forward(params, m, tokens, targets, check.MODEL_DROPOUT, 7, precision)
        return np.concatenate([[float(loss)], R.model_backward(params, m, acts, 1.0)])
    ref = twin("bf16")
    with R.precision.truncating():
        wrong = {"truncated": twin("bf16")}
    wrong["unrounded"] = twin("fp32")

    def rows(model):
        runs = [(model[:1].astype(np.float32), model[1:].astype(np.float32))] * 2
        return check.model_compare("model", m, "bf16", runs, ref, wrong)
    noisy = ref * (1 + 1e-7 * rng.standard_normal(ref.size))
    assert all(r["ok"] for r in rows(noisy))
    cut = rows(wrong["truncated"])
    assert sum(not r["ok"] for r in cut if r["tensor"].startswith("d ")) >= len(cut) // 2
    share = rows(wrong["unrounded"])[-1]
    assert share["tensor"].startswith("share nearer") and share["share"] < 0.25 and not share["ok"]


@pytest.mark.slow
def test_a_model_that_truncates_fails_the_whole_model_check(monkeypatch):
    """The simulator's bf16 conversions planted wrong, end to end through the kernels: cut toward
    zero (the operand copies' bf16_bits and the stand-in of cvt.rn.bf16x2). The model lands nearer
    the truncating twin than the twin in most gradient tensors, each such row failing. (A model that
    does not round: test_the_whole_model_rows_fail_a_model_that_truncates_or_does_not_round, on the
    twins; planted in the stand-in alone it fails the share row too, below one half of the tensors
    nearer the twin, but that costs another simulated model.) The correct model passes
    (test_the_whole_model_with_bf16_products_agrees_with_the_twin_at_bf16)."""
    from numba import cuda, uint16, uint32

    from andrea_numba.kernels import operands, ptx
    true_round = ptx._round_to_grid

    def cut(x, mantissa_bits, min_exponent, max_value):
        x = np.asarray(x, np.float32)
        return (x.view(np.uint32) & np.uint32(0xFFFF0000)).view(np.float32) if mantissa_bits == 7 else \
            true_round(x, mantissa_bits, min_exponent, max_value)

    @cuda.jit(device=True)
    def cut_bits(b):
        return uint16(b >> uint32(16))
    monkeypatch.setattr(ptx, "_round_to_grid", cut)
    monkeypatch.setattr(operands, "bf16_bits", cut_bits)
    m = load_config("tiny").model
    rows = check.model_rows(m, 2, 8, np.random.default_rng(5), 5, recipe="bf16-ampere", attention=(True,))
    grads = [r for r in rows if r["tensor"].startswith("d ")]
    nearer_cut = [r for r in grads if r["wrong_models"]["truncated"] < r["rel_err"]]
    assert len(nearer_cut) >= len(grads) // 2 and not any(r["ok"] for r in nearer_cut), \
        [(r["tensor"], r["rel_err"], r["wrong_models"]) for r in grads]


def test_the_bf16_model_tolerance_fails_a_gradient_tensor_five_percent_off():
    """bf16-grade differences pass (a few units of 2^-8 on some elements); a tensor 5% off fails."""
    rng = np.random.default_rng(0)
    ref = rng.standard_normal(500)
    tol = check.MODEL_TOLS["bf16"]
    flipped = ref.copy()
    flipped[rng.integers(0, 500, 50)] *= 1 + 4 * 2.0 ** -8                 # 50 values moved by 4 units
    assert check.compare("model", "d w", flipped.astype(np.float32), ref, tol)["ok"]
    for f in (1.05, 0.95):
        assert not check.compare("model", "d w", (ref * f).astype(np.float32), ref, tol)["ok"]


def test_a_config_without_precision_trains_in_fp32_and_bf16_picks_the_bf16_versions(tmp_path):
    import json

    from andrea_numba import train as tr
    from andrea_numba.config import config_from_dict, validate
    raw = load_config("tiny").to_dict()
    raw["train"].pop("precision")                        # a config (or run state) from before the field
    assert validate(config_from_dict(raw)).train.precision == "fp32"
    raw["train"]["precision"] = "bf16"
    cfg = validate(config_from_dict(raw))
    trainer = tr.Trainer(cfg, tmp_path / "run", log=lambda s: None, graph=False)
    trainer.setup()
    model = trainer.model
    assert model.recipe.name == "bf16-hopper" and model.precision == "bf16"
    assert all(getattr(f, "precision", None) == "bf16" for f in (model.qkv_fwd, model.qkv_bwd, model.out_fwd,
                                                                 model.out_bwd, model.mlp_fwd, model.mlp_bwd,
                                                                 model.loss_fwd, model.loss_bwd, *model.kernels["attention"]))
    trainer.write_state()
    assert json.loads((tmp_path / "run" / ".state.json").read_text())["config"]["train"]["precision"] == "bf16"


def test_bf16_ampere_reserves_its_copies_before_the_first_step():
    """GPUModel(recipe="bf16-ampere") runs the linear ops on matmul v13, whose operands are bf16 copies in
    cublaslt.COPIES: the model reserves room for its largest product's two copies when it is built
    (nothing may be allocated once a step is captured as a graph), counts it in nbytes, and its
    launchers all take bf16 products."""
    from andrea_numba.gpu_model import GPUModel, buffer_specs
    from andrea_numba.kernels import cublaslt
    m = load_config("tiny").model
    B, T = 2, 8
    cublaslt.COPIES.buf = None
    model = GPUModel(m, B, T, recipe="bf16-ampere")
    a, b = cublaslt.operand_elements(B * T, m.d_model, m.vocab_size)
    assert cublaslt.COPIES.buf is not None and cublaslt.COPIES.buf.size >= a + b
    copies = cublaslt.scratch_bytes("bf16", B * T, m.d_model, m.vocab_size)
    assert copies > 0 and model.nbytes == sum(s.nbytes for s in model.specs) + copies
    assert GPUModel(m, B, T, recipe=lab_recipe("bf16l")).nbytes == sum(s.nbytes for s in buffer_specs(m, B, T))
    assert model.precision == "bf16" and all(
        getattr(f, "precision", None) == "bf16" for f in (model.qkv_fwd, model.qkv_bwd, model.out_fwd, model.out_bwd,
                                                          model.mlp_fwd, model.mlp_bwd, model.loss_fwd, model.loss_bwd))


def test_the_score_weights_get_twice_the_low_precision_allowance_and_still_fail_ten_percent_off():
    """W_Q's and W_K's gradients pass through the softmax's backward (check.SCORE_GRADS): below fp32
    they are allowed 2^-4 of their scale, every other tensor 2^-5, fp32 keeps MODEL_TOL everywhere;
    a W_Q gradient 10% off still fails."""
    assert check.model_tol("bf16", "h3.attn.w_q") == (check.MODEL_TOLS["bf16"][0], 2 * check.MODEL_TOLS["bf16"][1])
    assert check.model_tol("fp16", "h0.attn.w_k")[1] == 2.0 ** -4
    assert check.model_tol("bf16", "h3.attn.w_v") == check.MODEL_TOLS["bf16"]
    assert check.model_tol("fp32", "h3.attn.w_q") == check.MODEL_TOL
    rng = np.random.default_rng(1)
    ref = rng.standard_normal(500)
    tol = check.model_tol("bf16", "h3.attn.w_q")
    near = ref + 0.04 * np.abs(ref).max() * rng.uniform(-1, 1, 500)        # 4% of the scale: passes 2^-4
    assert check.compare("model", "d h3.attn.w_q", near.astype(np.float32), ref, tol)["ok"]
    assert not check.compare("model", "d h3.attn.w_v", near.astype(np.float32), ref, check.model_tol("bf16", "h3.attn.w_v"))["ok"]
    for f in (1.10, 0.90):
        assert not check.compare("model", "d h3.attn.w_q", (ref * f).astype(np.float32), ref, tol)["ok"]


@pytest.mark.parametrize("precision", sorted(check.MODEL_TOLS))
@pytest.mark.parametrize("tensor", ["d h0.attn.w_q", "d h1.attn.w_k", "d h0.mlp.w_1", "loss"])
def test_no_model_allowance_passes_a_gradient_at_half_or_twice_its_value(precision, tensor):
    """At every precision and FP8 scope, for every tensor (the score weights' doubled allowance
    included), the whole-model check fails a tensor scaled by 1/2 or by 2: its allowance is below
    a half of the tensor's scale."""
    ref = np.random.default_rng(3).standard_normal(400)
    tol = check.model_tol(precision, tensor)
    assert tol[0] + tol[1] < 0.5, (precision, tensor, tol)
    for f in (0.5, 2.0):
        assert not check.compare("model", tensor, (ref * f).astype(np.float32), ref, tol)["ok"], (precision, f)


def test_saving_the_bf16_products_inputs_rounded_changes_no_bit(monkeypatch):
    """With recipe bf16-ampere the model saves LN1's, LN2's, LNf's and the GELU's outputs as bf16
    (recipes.SAVED16: uint16 buffers, half the bytes), since only bf16 products read them and
    each rounds its inputs so: the loss and every gradient are bit for bit those of the same
    products on fp32 buffers (the same recipe with bf16_saved off). The residual LayerNorms write
    the bf16 output themselves (their v3); the run on fp32 buffers takes v3 too, so the two differ
    only in where the rounding happens."""
    from andrea_numba import gpu_model as G
    from andrea_numba import recipes as R16
    from andrea_numba.kernels import layernorm
    from andrea_numba.layout import init_params
    m = load_config("tiny").model
    B, T = 1, 8
    rng = np.random.default_rng(5)
    tokens, targets = (rng.integers(0, m.vocab_size, (B, T)).astype(np.int32) for _ in range(2))
    runs = []
    bf16 = R16.get("bf16-ampere")
    assert bf16.kernels["residual_layernorm"][0] is layernorm.residual_layernorm_fwd_vec4
    for saved in (True, False):
        model = G.GPUModel(m, B, T, recipe=dataclasses.replace(bf16, bf16_saved=saved))
        assert model.saved16 is saved
        assert {model.buf[n].dtype for n in R16.SAVED16} == {np.dtype(np.uint16 if saved else np.float32)}
        model.params.copy_to_device(init_params(m, 3))
        model.forward(tokens, targets)
        model.backward()
        runs.append((model.read_loss(), model.grads.copy_to_host()))
    assert runs[0][0] == runs[1][0]
    assert np.array_equal(runs[0][1].view(np.uint32), runs[1][1].view(np.uint32))
    saved = {s.name: s.nbytes for s in G.buffer_specs(m, B, T, saved16=True)}
    plain = {s.name: s.nbytes for s in G.buffer_specs(m, B, T)}
    assert all(2 * saved[n] == plain[n] for n in R16.SAVED16) and "ln_out" in saved and "ln_out" not in plain


def test_the_memory_plan_is_the_engines_model_at_each_precision():
    """The trainer's memory plan (plan.memory_plan) counts exactly the bytes of the model it builds:
    at bf16 the bf16-saved activations and matmul v13's operand copies too."""
    from andrea_numba import plan
    from andrea_numba.config import config_from_dict, validate
    from andrea_numba.gpu_model import GPUModel
    from andrea_numba.recipes import recipe_for
    for precision in ("fp32", "bf16", "fp16"):
        raw = load_config("tiny").to_dict()
        raw["train"]["precision"] = precision
        cfg = validate(config_from_dict(raw))
        t = cfg.train
        rows = plan.memory_plan(cfg)
        model_bytes = sum(b for kind, _, b in rows if kind in ("params", "grads", "activations", "scratch"))
        model = GPUModel(cfg.model, t.batch_size, t.seq_len, recipe=recipe_for(precision))
        assert model_bytes == model.nbytes, precision
        assert (("scratch", "operands_16bit") in {(k, n) for k, n, _ in rows}) == (precision == "bf16")
