"""Model FLOPs utilisation: the FLOPs of a token counted from the model's shapes, the peak by GPU
name, and the trainer's lines."""
import pytest

from andrea_numba.config import load_config
from andrea_numba.mfu import flops_per_token, format_mfu, mfu, peak_flops


@pytest.mark.parametrize("size", ["tiny", "12M", "120M"])
def test_a_tokens_flops_are_six_per_product_weight_plus_attention(size):
    """Against a count from the shapes: Q, K, V, W_O, W_1, W_2 of every block, the classifier (the
    tied token embedding) and the LayerNorms' gains and biases (counted as nanoGPT counts them), 6
    FLOPs a weight; attention's scores and weighted sum, 12 L C T; no position embedding."""
    m = load_config(size).model
    C, L, V, T = m.d_model, m.n_layer, m.vocab_size, m.context_length
    weights = L * (3 * C * C + C * C + 4 * C * C + 4 * C * C) + V * C + (2 * L + 1) * 2 * C
    assert flops_per_token(m, T) == 6 * weights + 12 * L * C * T
    assert flops_per_token(m, T // 2) < flops_per_token(m, T)


def test_the_peak_is_looked_up_by_the_gpu_and_the_precision():
    assert peak_flops("NVIDIA H100 80GB HBM3", "bf16") == pytest.approx(989.4e12)
    assert peak_flops("NVIDIA H100 80GB HBM3", "fp32") == pytest.approx(66.9e12)
    assert peak_flops("NVIDIA H100 PCIe", "bf16") == pytest.approx(756e12)   # not the SXM part's
    assert peak_flops("NVIDIA H200", "fp8-fwd") == peak_flops("NVIDIA H200", "bf16")
    assert peak_flops("CUDA simulator", "fp32") is None and peak_flops("Tesla T4", "fp16") is None


def test_mfu_is_model_flops_a_second_over_the_peak():
    m = load_config("120M").model
    f = flops_per_token(m, 1024)
    assert mfu(8 * 1024 / 0.0264, f, 989.4e12) == pytest.approx(8 * 1024 / 0.0264 * f / 989.4e12)
    assert 0.2 < mfu(8 * 1024 / 0.0264, f, 989.4e12) < 0.35          # the 120M bf16 graph step on an H100
    assert mfu(1e6, f, None) is None
    assert format_mfu(None) == "MFU unknown" and format_mfu(0.3812) == "MFU 38.1%"


def test_the_summary_leaves_out_each_processs_first_step():
    """The done line's MFU: 10 steps in 10 s of which the first took 9 s (it loaded every kernel)
    is the rate of the other nine, 9 steps a second; a single step is its own rate."""
    from types import SimpleNamespace

    from andrea_numba.train import Trainer
    cfg = load_config("12M")
    t = cfg.train
    per_step = t.batch_size * t.seq_len * t.n_microbatches
    me = SimpleNamespace(tokens_per_step=per_step, flops_token=1.0, peak=per_step * 100.0)   # MFU = steps a second / 100
    after = Trainer.average_mfu(me, 10 * per_step, {"train_s": 10.0, "first_steps_s": 9.0, "first_steps": 1})
    assert after == "MFU 9.0% over its steps after the first"
    one = Trainer.average_mfu(me, per_step, {"train_s": 4.0, "first_steps_s": 4.0, "first_steps": 1})
    assert one == "MFU 0.2% over its steps"              # 0.25 steps a second: nothing to leave out
    resumed = Trainer.average_mfu(me, 20 * per_step, {"train_s": 20.0, "first_steps_s": 18.0, "first_steps": 2})
    assert resumed == "MFU 9.0% over its steps after the first"        # two processes, two first steps
