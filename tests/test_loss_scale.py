"""Dynamic loss scaling (andrea_numba/loss_scale.py) and a run with fp16 products that overflows."""
import json

import numpy as np
import pytest

from andrea_numba import loss_scale as LS

# A run's last step evaluates and samples (at the tiny config's 2 batches and 16 tokens: 18 forwards
# of the fp16 model, most of these runs' time in the simulator); one batch and 2 tokens still run
# both at fp16, and nothing below reads them.
QUICK_END = dict(eval_batches=1, sample_tokens=2)


def test_overflow_halves_and_skips_a_run_of_good_steps_doubles():
    s = LS.LossScale(2.0 ** 10)
    assert "overflowed at scale 1024" in s.update(False, 7) and s.scale == 512 and s.skipped == 1 and s.good == 0
    for step in range(LS.INTERVAL - 1):
        assert s.update(True, 8 + step) is None
    assert "good steps in a row, scale -> 1024" in s.update(True, 9999) and s.scale == 1024 and s.good == 0
    assert s.to_dict() == {"scale": 1024.0, "good": 0, "skipped": 1}


@pytest.mark.parametrize("bad", [None, {}, {"scale": 3.0, "good": 0, "skipped": 0},
                                 {"scale": 1024.0, "good": -1, "skipped": 0}, {"scale": 1024.0, "good": 0},
                                 {"scale": True, "good": 0, "skipped": 0}, {"scale": 2.0 ** 80, "good": 0, "skipped": 0},
                                 {"scale": 1024.0, "good": 0, "skipped": 0, "x": 1}])
def test_a_damaged_record_is_refused_in_one_line(bad):
    with pytest.raises(LS.LossScaleError, match="'loss_scale' is not a record of a loss scale"):
        LS.LossScale.from_dict(bad, "run/.state.json")
    assert LS.LossScale.from_dict({"scale": 65536, "good": 3, "skipped": 2}, "x").to_dict() == \
        {"scale": 65536.0, "good": 3, "skipped": 2}


def test_the_twin_backward_scales_with_dloss_exactly():
    """The harness checks fp16 products with a scaled loss (check.MODEL_DLOSS): the twin's gradients
    of S x loss are S x its gradients, bit for bit in float64 for a power of two S."""
    import reference as R
    from andrea_numba.config import load_config
    from andrea_numba.layout import init_params
    m = load_config("tiny").model
    rng = np.random.default_rng(0)
    p = init_params(m, 0).astype(np.float64)
    tokens, targets = (rng.integers(0, m.vocab_size, (1, 8)) for _ in range(2))
    _, acts = R.model_forward(p, m, tokens, targets)
    np.testing.assert_array_equal(R.model_backward(p, m, acts, LS.INIT), LS.INIT * R.model_backward(p, m, acts))


@pytest.mark.slow
def test_fp16_steps_that_overflow_are_skipped_and_the_scale_halves(tmp_path, monkeypatch):
    """A scale of 2^120 makes the scaled gradients inf once they are rounded to fp16: both steps are
    skipped (the weights stay the initial ones), the scale halves twice, the log and the loss log
    say so, and the checkpoint's state records the scale."""
    from andrea_numba import train as tr
    from andrea_numba.config import config_from_dict, load_config, validate
    from andrea_numba.layout import init_params
    monkeypatch.setattr(LS, "INIT", 2.0 ** 120)
    monkeypatch.setattr(LS.LossScale.__init__, "__defaults__", (2.0 ** 120, 0, 0))
    raw = load_config("tiny").to_dict()
    raw["model"]["n_layer"] = 1
    raw["train"].update(batch_size=1, seq_len=8, n_microbatches=1, precision="fp16", steps=2, eval_interval=100,
                        sample_interval=100, checkpoint_interval=2, **QUICK_END)
    cfg = validate(config_from_dict(raw))
    lines = []
    trainer = tr.Trainer(cfg, tmp_path / "run", log=lines.append, graph=False)
    trainer.setup()
    assert trainer.model.recipe.name == "fp16"
    assert trainer.run() == 0
    assert sum("overflowed at scale" in line for line in lines) == 2, lines
    assert trainer.scaler.scale == 2.0 ** 118 and trainer.scaler.skipped == 2
    params = trainer.model.params.copy_to_host()
    assert np.array_equal(params, init_params(cfg.model, cfg.train.seed))          # nothing applied
    state = json.loads((tmp_path / "run" / ".state.json").read_text())
    assert state["loss_scale"] == {"scale": 2.0 ** 118, "good": 0, "skipped": 2}
    log = [json.loads(line) for line in (tmp_path / "run" / ".loss.json").read_text().splitlines()]
    assert [r.get("skipped") for r in log] == [True, True] and log[0]["grad_norm"] is None
    assert [r["loss_scale"] for r in log] == [2.0 ** 120, 2.0 ** 119]


@pytest.mark.slow
def test_an_fp16_run_resumed_after_skipped_steps_is_bit_exact(tmp_path, monkeypatch):
    """Scale 2^19 at first: on these batches step 1 overflows and is skipped, step 2 trains at 2^18,
    step 3 overflows at 2^18 too. A run stopped after step 2 (its checkpoint's state: scale 2^18, 1
    good step, 1 skipped) and resumed ends with the uninterrupted run's losses, scales, skips and
    checkpoint, byte for byte."""
    from andrea_numba import train as tr
    from andrea_numba.atomic import file_sha256
    from andrea_numba.config import config_from_dict, load_config, validate
    from andrea_numba.runlog import read_loss
    monkeypatch.setattr(LS.LossScale.__init__, "__defaults__", (2.0 ** 19, 0, 0))
    raw = load_config("tiny").to_dict()
    raw["model"]["n_layer"] = 1
    raw["train"].update(batch_size=1, seq_len=8, n_microbatches=1, precision="fp16", steps=3, eval_interval=100, sample_interval=100, checkpoint_interval=100,
                        **QUICK_END)
    cfg = validate(config_from_dict(raw))
    quiet = lambda s: None
    a = tr.Trainer(cfg, tmp_path / "a", log=quiet, graph=False)
    a.setup()
    a.run()
    b = tr.Trainer(cfg, tmp_path / "b", log=quiet, graph=False)
    b.setup()
    b.run(steps=2)                                # stops after step 2, with its checkpoint
    state = json.loads((tmp_path / "b" / ".state.json").read_text())
    assert state["step"] == 2 and state["loss_scale"] == {"scale": 2.0 ** 18, "good": 1, "skipped": 1}
    c = tr.Trainer(tr.resume_config(tmp_path / "b", state, None), tmp_path / "b", log=quiet, graph=False)
    c.setup(resume=True)
    assert c.scaler.to_dict() == state["loss_scale"]
    c.run()
    key = lambda d: [(r["step"], r["train_loss"], r["grad_norm"], r["loss_scale"], r.get("skipped")) for r in read_loss(d)]
    assert key(tmp_path / "a") == key(tmp_path / "b")
    assert [r.get("skipped") for r in read_loss(tmp_path / "a")] == [True, None, True]
    assert file_sha256(tmp_path / "a" / "checkpoint.bin") == file_sha256(tmp_path / "b" / "checkpoint.bin")
