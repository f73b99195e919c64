"""The FP8 linear ops (kernels/fp8_products.py) in the simulator: the quantize kernels are ours and
run here; the FP8 product itself is cuBLASLt's, which the simulator cannot run, so `mm` is replaced
by its definition (decode both operands' bytes, multiply by their descales, A_q @ B_q^T in float64).
What this checks is everything of ours around the library: which operand is quantized as it lies
and which transposed, the padding of K, E5M2 for the gradient operands, the descales' slots, the
accumulation, against the twin at the same scope (check.check_launcher, as on the GPU:
python -m andrea_numba.fp8 check)."""
import numpy as np
import pytest

from andrea_numba import check
from andrea_numba.cases import CASES, Dims
from andrea_numba.config import load_config
from andrea_numba.kernels import cublaslt
from andrea_numba.kernels import fp8_products as F
from reference.fp8 import decode


def _mm(out, qa, qb, accumulate=False, stream=0):
    """out (+)= decode(A_q) descale_a @ (decode(B_q) descale_b)^T: cuBLASLt's FP8 product, by definition."""
    stats = F.FP8.stats.copy_to_host()
    a = decode(qa.codes.copy_to_host(), F.FORMATS[qa.fmt]) * np.float64(stats[qa.slot, 0])
    b = decode(qb.codes.copy_to_host(), F.FORMATS[qb.fmt]) * np.float64(stats[qb.slot, 0])
    res = a @ b.T
    if accumulate:
        res += out.copy_to_host()
    out.copy_to_device(res.astype(np.float32))


@pytest.fixture
def fake_library(monkeypatch):
    monkeypatch.setattr(F, "require_fp8", lambda: None)
    monkeypatch.setattr(F, "mm", _mm)
    monkeypatch.setattr(cublaslt, "linear_ops", lambda *a, **k: {n: None for n in
                        ("loss_fwd", "loss_bwd", "attn_qkv_bwd", "attn_out_bwd", "mlp_bwd")})


def test_the_linear_ops_at_fp8_e5m2_agree_with_the_twin(fake_library):
    m = load_config("tiny").model
    dims = Dims.of(m, *check.SHAPES["tiny"][0])
    ops = F.linear_ops("fp8-e5m2", dims.N, m.d_model, m.vocab_size, m.n_layer)
    rng = np.random.default_rng(0)
    rows = []
    for op in ("attn_qkv", "attn_out", "mlp"):
        for direction in ("fwd", "bwd"):
            rows += check.check_launcher(CASES[op], direction, ops[f"{op}_{direction}"], dims, rng,
                                         version="fp8-e5m2", block="fp8-e5m2")
    print(check.format_table(rows))
    assert rows and all(r["ok"] for r in rows)
    labels = [F.FP8.labels[s] for s in sorted(F.FP8.labels)]
    assert "mlp.bwd.dh_pre_t" in labels and "attn_qkv.bwd.x" in labels


def test_the_record_reads_every_slot_of_the_step_after_a_shorter_forward(fake_library):
    """A training step replayed from its graph runs no Python: the record must not stop at the count
    an evaluation's forward (fewer quantizations, begin() again) left behind."""
    from numba import cuda
    ws = F.FP8Workspace()
    ws.reserve(256, 256, 8)
    x = cuda.to_device(np.arange(12, dtype=np.float32).reshape(3, 4) - 5)
    for label in ("mlp.fwd.x", "mlp.bwd.dout", "mlp.bwd.x"):             # a training step: 3 records
        ws.quantize(x, "e4m3", False, 0, label)
    ws.begin()
    ws.quantize(x, "e4m3", False, 0, "mlp.fwd.x")                        # an evaluation's forward
    rec = ws.record(n_layer=1)
    assert [r["label"] for r in rec] == ["mlp.fwd.x", "mlp.bwd.dout", "mlp.bwd.x"]
    assert rec[0]["amax"] == 6.0 and rec[0]["layer"] == 0 and rec[1]["layer"] == 0
