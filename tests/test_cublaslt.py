"""The library route (kernels/cublaslt.py) where no GPU is: the row-major to column-major call
replayed with NumPy, and every way it refuses to run here says so in one line."""
import itertools
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from andrea_numba.config import ConfigError, config_from_dict, load_config, validate
from andrea_numba.kernels import cublaslt, matmul
from andrea_numba.plan import memory_plan

ROOT = Path(__file__).resolve().parent.parent


def column_major(flat, rows, cols, ld):
    """The [rows, cols] matrix that cuBLAS reads from `flat` (element (i, j) at i + j * ld)."""
    return np.array([[flat[i + j * ld] for j in range(cols)] for i in range(rows)])


@pytest.mark.parametrize("trans_a,trans_b", list(itertools.product((False, True), repeat=2)))
def test_the_column_major_call_computes_the_row_major_product(trans_a, trans_b):
    """cuBLAS's D = op(A) op(B) on our buffers' memory, read back row-major, is op(a) @ op(b),
    also when the rows are views with a longer stride than their width."""
    rng = np.random.default_rng(1)
    M, N, K, pad = 5, 3, 4, 2
    a_full = rng.standard_normal((K, M + pad) if trans_a else (M, K + pad))
    b_full = rng.standard_normal((N, K + pad) if trans_b else (K, N + pad))
    a = a_full[:, :M] if trans_a else a_full[:, :K]             # row stride longer than the row
    b = b_full[:, :K] if trans_b else b_full[:, :N]
    op = cublaslt.lt_operands(M, N, K, trans_a, trans_b, a_full.shape[1], b_full.shape[1], N)
    A = column_major(b_full.ravel(), *op["A"])
    B = column_major(a_full.ravel(), *op["B"])
    D = (A.T if op["trans_A"] else A) @ (B.T if op["trans_B"] else B)
    assert D.shape == (op["m"], op["n"]) == op["D"][:2]
    out = np.zeros(M * N)
    for i, j in itertools.product(range(op["m"]), range(op["n"])):   # D written column-major
        out[i + j * op["D"][2]] = D[i, j]
    want = (a.T if trans_a else a) @ (b.T if trans_b else b)
    np.testing.assert_allclose(out.reshape(M, N), want, rtol=1e-12)


def test_alignment_and_stream_pointer():
    assert [cublaslt._alignment(p) for p in (0, 4, 48, 256, 1024 + 16)] == [256, 4, 16, 256, 16]

    class Handle:
        value = 1234

    class NumbaStream:
        handle = Handle()

    class Builder:                      # a cuda.core GraphBuilder: .stream is what it captures
        stream = type("S", (), {"handle": 99})()
    assert cublaslt._stream_pointer(0) == 0
    assert cublaslt._stream_pointer(NumbaStream()) == 1234
    assert cublaslt._stream_pointer(Builder()) == 99


def test_not_in_the_simulator_one_line_each():
    reason = cublaslt.unavailable()
    assert reason and "\n" not in reason and "--products numba" in reason
    assert cublaslt.matmul_versions() == {}
    assert not any(v >= 20 for v in matmul.VERSIONS["matmul"])      # no harness rows for it here
    from andrea_numba.gpu_model import GPUModel
    with pytest.raises(ConfigError, match="cuBLASLt"):
        GPUModel(load_config("tiny").model, 1, 8, products="cublas-bf16")


def test_products_field_defaults_to_numba_and_is_checked():
    raw = load_config("tiny").to_dict()
    raw["train"].pop("products")                         # a config or run state from before the field
    cfg = validate(config_from_dict(raw))
    assert cfg.train.products == "numba"
    assert not any(r[1] == "cublaslt_workspace" for r in memory_plan(cfg))
    raw["train"]["products"] = "cublas"
    assert ("library", "cublaslt_workspace", cublaslt.WORKSPACE_BYTES) in memory_plan(validate(config_from_dict(raw)))
    raw["train"]["precision"] = "bf16"                  # and the operands' 16-bit copies: dlogits + wte at most
    rows = {r[1]: r[2] for r in memory_plan(validate(config_from_dict(raw)))}
    m, t = cfg.model, cfg.train
    N = t.batch_size * t.seq_len
    assert rows["operands_16bit"] >= 2 * (N * m.vocab_size + m.vocab_size * m.d_model)
    raw["train"]["products"] = "cuda"
    with pytest.raises(ConfigError, match="train.products"):
        validate(config_from_dict(raw))


def test_train_with_cublas_in_the_simulator_says_why_and_writes_nothing(tmp_path):
    out = tmp_path / "run"
    r = subprocess.run([sys.executable, "-m", "andrea_numba.train", "--size", "tiny", "--products", "cublas",
                        "--out", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=120,
                       env={**__import__("os").environ, "NUMBA_ENABLE_CUDASIM": "1"})
    assert r.returncode != 0
    lines = [l for l in r.stderr.splitlines() if l.strip()]
    assert len(lines) == 1 and "cuBLASLt" in lines[0], r.stderr
    assert not out.exists()
    for f in (ROOT / "configs").glob("*.json"):         # every shipped config names the field
        assert json.loads(f.read_text())["train"]["products"] == "numba"


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_the_16_bit_copies_round_as_the_twin(precision):
    """k_round_bf16_v1 / k_round_fp16_v1 (the library route's operand copies) give the twin's rounding
    bit for bit: ties to even, NaN, inf, fp16's overflow and subnormals, rows of a strided view."""
    from numba import cuda

    from reference.precision import ROUND
    rng = np.random.default_rng(2)
    full = (rng.standard_normal((3, 9)) * 10.0 ** rng.integers(-9, 6, (3, 9))).astype(np.float32)
    full[0, :6] = [np.nan, np.inf, -np.inf, 1.0 + 2.0 ** -8, 1.0 + 3 * 2.0 ** -8, 7e4]   # ties (bf16), fp16's overflow
    src = cuda.to_device(full)[:, 1:8]                    # rows strided: 9 floats apart, 7 long
    dtype = np.uint16 if precision == "bf16" else np.float16
    dst = cuda.to_device(np.zeros(3 * 7, dtype))
    cublaslt.round_into(dst, src, precision)
    got = dst.copy_to_host()
    got = (got.astype(np.uint32) << 16).view(np.float32) if precision == "bf16" else got.astype(np.float32)
    want = ROUND[precision](full[:, 1:8]).ravel()
    np.testing.assert_array_equal(got, want)
