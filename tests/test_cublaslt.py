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
from andrea_numba.kernels import cublaslt, matmul, operands
from lab import matmul as lab_matmul
from lab import cublaslt as lab_cublaslt
from lab import operands as lab_operands
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
    assert lab_cublaslt.matmul_versions() == {}
    assert not set(cublaslt.VERSION_OF.values()) & set(lab_matmul.VERSIONS["matmul"])     # no harness rows for it here
    from andrea_numba.gpu_model import GPUModel
    with pytest.raises(ConfigError, match="cuBLASLt"):
        GPUModel(load_config("tiny").model, 1, 8, recipe="cublas-bf16")


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


@pytest.mark.parametrize("version", [1, 2])
@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_the_16_bit_copies_round_as_the_twin(precision, version):
    """k_round_bf16(_v1) / k_round_fp16(_v1) (the operand copies: the engine's, the lab's v1) give the twin's rounding
    bit for bit: ties to even, NaN, inf, fp16's overflow and subnormals, rows of a strided view."""
    from numba import cuda

    from reference.precision import ROUND
    rng = np.random.default_rng(2)
    full = (rng.standard_normal((3, 9)) * 10.0 ** rng.integers(-9, 6, (3, 9))).astype(np.float32)
    full[0, :6] = [np.nan, np.inf, -np.inf, 1.0 + 2.0 ** -8, 1.0 + 3 * 2.0 ** -8, 7e4]   # ties (bf16), fp16's overflow
    src = cuda.to_device(full)[:, 1:8]                    # rows strided: 9 floats apart, 7 long
    dtype = np.uint16 if precision == "bf16" else np.float16
    dst = cuda.to_device(np.zeros(3 * 7, dtype))
    lab_operands.round_into(dst, src, precision, version=version)
    got = dst.copy_to_host()
    got = (got.astype(np.uint32) << 16).view(np.float32) if precision == "bf16" else got.astype(np.float32)
    want = ROUND[precision](full[:, 1:8]).ravel()
    np.testing.assert_array_equal(got, want)


# v2 of the copies (eight values a thread, 128-bit loads and stores, rows grid-strided) against v1
# and the twin, bit for bit. Bit patterns every path must carry: signed zeros, infinities, NaNs
# (quiet, signalling, either sign, payloads high and low), fp32 subnormals, bf16's ties either side
# of even and its overflow, fp16's largest value, its overflow tie, its subnormals and their ties.
SPECIAL_BITS = [0x00000000, 0x80000000, 0x7F800000, 0xFF800000,
                0x7FC00000, 0xFFC00000, 0x7F800001, 0x7FBFFFFF, 0xFFFFFFFF, 0x7FFFFFFF, 0xFF80FFFF,
                0x00000001, 0x80000001, 0x007FFFFF, 0x00008000, 0x00018000,
                0x3F808000, 0x3F818000, 0x3F808001, 0xBF818000, 0x7F7FFFFF, 0x7F7F8000, 0x7F7E8000,
                0x477FE000, 0x477FEFFF, 0x477FF000, 0xC77FF000, 0x47800000,
                0x33800000, 0x33000000, 0x33400000, 0x38800000, 0x387FC000, 0x387FE000]


def _round_bits(src, dtype, version):
    """The 16-bit patterns that round_into writes for a device array src [R, C] (flat, rows packed)."""
    from numba import cuda
    dst = cuda.to_device(np.zeros(src.shape[0] * src.shape[1], dtype))
    lab_operands.round_into(dst, src, "bf16" if dtype == np.uint16 else "fp16", version=version)
    return dst.copy_to_host().view(np.uint16)


ROUND_CASES = {             # name: (shape of the allocation, the view of it rounded, wide)
    "aligned, C % 8 == 0": ((6, 40), (slice(None), slice(None)), True),
    "C odd": ((6, 13), (slice(None), slice(None)), False),
    "strided view, rows 16-byte aligned": ((6, 48), (slice(None), slice(0, 40)), True),
    "strided view, rows 4 bytes off": ((6, 48), (slice(None), slice(1, 41)), False),
    "one row, a ragged end": ((1, 21), (slice(None), slice(None)), True),
}


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
@pytest.mark.parametrize("case", list(ROUND_CASES))
def test_round_v2_is_v1_and_the_twin_bit_for_bit(precision, case):
    """k_round_* (the engine's, v2) writes v1's bits for every input (NaN payloads too) and the twin's (NaN as NaN),
    on the wide path and element by element, with more rows than the grid has (a block strides)."""
    from numba import cuda

    from reference.precision import round_bf16
    shape, index, wide = ROUND_CASES[case]
    rng = np.random.default_rng(5)
    bits = rng.integers(0, 2 ** 32, shape, dtype=np.uint64).astype(np.uint32)    # every kind of float
    flat = bits.reshape(-1)
    flat[1:1 + len(SPECIAL_BITS)] = SPECIAL_BITS[:flat.size - 1]
    flat[::3] = (rng.standard_normal(flat[::3].size) * 100).astype(np.float32).view(np.uint32)
    full = cuda.to_device(bits.view(np.float32))
    src, host = full[index], bits.view(np.float32)[index]
    dtype = np.uint16 if precision == "bf16" else np.float16
    R, C = host.shape
    assert cublaslt.round_wide(cuda.to_device(np.zeros(R * C, dtype)), src) == wide
    (_, rows), _ = operands.round_grid(R, C)
    assert R == 1 or rows < R                                    # rows strided by the grid
    v1, v2 = _round_bits(src, dtype, 1), _round_bits(src, dtype, 2)
    np.testing.assert_array_equal(v2, v1)
    nan = np.isnan(host).ravel()
    if precision == "bf16":
        twin = (round_bf16(host).view(np.uint32) >> 16).astype(np.uint16).ravel()
        got = (v2.astype(np.uint32) << 16).view(np.float32)
    else:
        with np.errstate(over="ignore"):
            twin = host.astype(np.float16).view(np.uint16).ravel()
        got = v2.view(np.float16)
    np.testing.assert_array_equal(v2[~nan], twin[~nan])
    assert np.isnan(got[nan]).all()


def test_round_v2_wide_path_needs_aligned_rows():
    """The simulator's 128-bit load refuses an address off a 16-byte boundary, as the GPU would
    fault: round_wide is what keeps v2's wide path away from such rows."""
    from numba import cuda
    src = cuda.to_device(np.ones((2, 48), np.float32))[:, 1:41]
    dst = cuda.to_device(np.zeros(80, np.float16))
    assert not cublaslt.round_wide(dst, src)
    grid, threads = operands.round_grid(2, 40)
    with pytest.raises(AssertionError, match="16-byte"):
        cublaslt.k_round_fp16[grid, threads](dst, src, True)


def test_round_v2_grid_on_the_gpu():
    """v2's launch at the GPU's settings: 8 values a thread cover the row, blocks of whole warps and
    none mostly idle, about ROUND_GRID_THREADS threads in all, rows at most 65,535."""
    gpu = lambda R, C: operands.round_grid(R, C, 256, 132 * 1024)     # the GPU's ROUND_THREADS, ROUND_GRID_THREADS
    assert gpu(8192, 3072) == ((2, 352), 192)
    assert gpu(50304, 8192) == ((4, 132), 256)
    assert gpu(3, 768) == ((1, 3), 96)
    assert gpu(1, 7) == ((1, 1), 32)
    for R, C in ((8192, 3072), (50304, 8192), (8192, 768), (768, 50304), (10 ** 6, 8), (5, 13), (1, 1)):
        (bx, rows), t = gpu(R, C)
        idle = bx * t - -(-C // 8)                              # threads past the row's end
        assert t % 32 == 0 and t <= 256 and 0 <= idle < 32 * bx
        assert rows == min(R, 65535) or bx * t * rows >= 132 * 1024 > bx * t * (rows - 1)
