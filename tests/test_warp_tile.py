"""The warp-tile products (matmul v3, v4: lab/matmul.py), their split-K and the simulator twins of kernels/ptx.py.

The harness (tests/test_kernels.py) checks every version at every block against the twin; these
tests pin down the pieces underneath: the TF32 rounding twin, how split-K slices K, that a split
product adds its slices in a fixed order (bit-identical reruns, the same sums as a product of
the slices added by hand), and that v4's NumPy step twin in the simulator gives v3's outputs.
"""
import numpy as np
import pytest
from numba import cuda

from lab import matmul as MM                        # the whole ladder: the engine's products and the lab's
from andrea_numba.kernels.ptx import tf32_round
from andrea_numba.kernels.warp_tile import aligned


def _bits(x):
    return int(np.array(x, dtype=np.float32).view(np.uint32))


@pytest.mark.parametrize("x, expect", [
    (1.0, 1.0),                                   # exact in TF32
    (1.0 + 2.0 ** -10, 1.0 + 2.0 ** -10),         # the last of TF32's 10 mantissa bits
    (1.0 + 2.0 ** -12, 1.0),                      # below half a unit: down
    (1.0 + 2.0 ** -11, 1.0 + 2.0 ** -10),         # exactly half a unit: away from zero
    (-(1.0 + 2.0 ** -11), -(1.0 + 2.0 ** -10)),   # ties away from zero for negatives too
    (1.0 + 3 * 2.0 ** -12, 1.0 + 2.0 ** -10),     # above half: up
])
def test_tf32_round_is_round_to_nearest_ties_away(x, expect):
    r = tf32_round(np.float32(x))
    assert float(r) == expect
    assert _bits(r) & 0x1FFF == 0                 # the low 13 mantissa bits are zero


def test_big_plus_small_carries_about_21_bits():
    rng = np.random.default_rng(0)
    x = rng.standard_normal(200).astype(np.float32)
    worst = 0.0
    for v in x:
        big = tf32_round(v)
        small = tf32_round(np.float32(v - big))
        worst = max(worst, abs(float(big) + float(small) - float(v)) / abs(float(v)))
    assert worst < 2.0 ** -20                     # a plain TF32 value: up to 2^-11


def test_small_truncated_by_the_tensor_core_still_carries_about_21_bits():
    """matmul v7 hands the tensor core x - big as it is; it keeps the top 19 bits (truncation)."""
    rng = np.random.default_rng(1)
    x = (rng.standard_normal(2000) * 10.0 ** rng.integers(-6, 6, 2000)).astype(np.float32)
    big = np.array([tf32_round(v) for v in x], np.float32)
    small = ((x - big).view(np.uint32) & np.uint32(0xFFFFE000)).view(np.float32)
    rel = np.abs(big.astype(np.float64) + small - x) / np.abs(x)
    assert rel.max() < 2.0 ** -21                 # small keeps 11 of its at most 13 significant bits
    assert rel.max() > 2.0 ** -25                 # (and it is not exact: the check can fail)


@pytest.mark.parametrize("M, N, K, z", [(8, 8, 64, 1), (8, 32, 39, 1), (8, 8, 39, 3), (39, 32, 8, 1), (400, 400, 64, 1)])
def test_splitk_slices_cover_k_and_fit_the_work_buffer(M, N, K, z):
    block = MM.matmul_v3.blocks[0]
    BK = block[2]
    work = np.zeros(MM.splitk_work(8), np.float32)
    S, ksplit = MM.splitk(M, N, K, z, block, work)
    assert S == 1 or ksplit % BK == 0                          # slices are whole K steps
    assert (S - 1) * ksplit < K <= S * ksplit                 # every k in exactly one slice, none empty
    assert S == 1 or S * z * M * N <= work.shape[0]
    assert MM.splitk(M, N, K, z, block, None) == (1, K)      # no buffer: no split


def test_splitk_picks_the_slices_of_fewest_wave_stages():
    """With the H200's 264 resident blocks of 128 x 64: the 120M dW_1 (288 tiles, one full wave
    and a 24-block one unsplit) goes to 8 slices (9 full waves of 64 stages); dW_O (72 tiles) to
    11; the 12M dW_O (18 tiles) to 14, one wave (15 would spill 6 blocks into a second); the
    logits' weight gradient (4716 tiles) stays whole: splitting adds waves, not speed."""
    block = (128, 64, 16, 64, 32)
    work = np.zeros(MM.splitk_work(768), np.float32)
    assert MM.splitk(768, 3072, 8192, 1, block, work, 264) == (8, 1024)
    assert MM.splitk(768, 768, 8192, 1, block, work, 264) == (11, 752)
    assert MM.splitk(50304, 768, 8192, 1, block, work, 264) == (1, 8192)
    assert MM.splitk(384, 384, 8192, 1, block, np.zeros(MM.splitk_work(384), np.float32), 264) == (14, 592)


def test_a_split_product_adds_its_slices_in_order_and_reruns_bit_identically():
    rng = np.random.default_rng(1)
    K, M, N = 70, 8, 24                               # a weight gradient's shape: long K, few tiles
    a = rng.standard_normal((K, M)).astype(np.float32)
    b = rng.standard_normal((K, N)).astype(np.float32)
    o0 = rng.standard_normal((M, N)).astype(np.float32)
    block = MM.matmul_v3.blocks[0]
    work = cuda.to_device(np.zeros(MM.splitk_work(8), np.float32))
    S, ksplit = MM.splitk(M, N, K, 1, block, work)
    assert S > 1
    outs = []
    for _ in range(2):
        out = cuda.to_device(o0.copy())
        MM.matmul_v3(out, work, cuda.to_device(a), cuda.to_device(b), trans_a=True, accumulate=True)
        outs.append(out.copy_to_host())
    assert np.array_equal(outs[0], outs[1])
    # the same as S products of the slices, added to out in slice order
    parts = []
    for s in range(S):
        part = cuda.to_device(np.zeros((M, N), np.float32))
        sl = slice(s * ksplit, min(K, (s + 1) * ksplit))
        MM.matmul_v3(part, None, cuda.to_device(np.ascontiguousarray(a[sl])), cuda.to_device(np.ascontiguousarray(b[sl])),
                     trans_a=True)
        parts.append(part.copy_to_host())
    total = parts[0]
    for p in parts[1:]:
        total = total + p
    assert np.array_equal(outs[0], o0 + total)


@pytest.mark.parametrize("trans_a, trans_b", [(False, False), (True, False), (False, True), (True, True)])
def test_in_the_simulator_v4s_step_twin_gives_v3s_outputs(trans_a, trans_b):
    """v4's 8-deep product is a NumPy twin in the simulator: the same outputs as v3's
    multiply-adds to float32 rounding, with every transpose, for rows and columns past a tile."""
    rng = np.random.default_rng(2)
    a = rng.standard_normal((24, 39) if trans_a else (39, 24)).astype(np.float32)
    b = rng.standard_normal((37, 24) if trans_b else (24, 37)).astype(np.float32)
    ref = (a.T if trans_a else a).astype(np.float64) @ (b.T if trans_b else b)
    outs = []
    for launch in (MM.matmul_v3, MM.matmul_v4):
        out = cuda.to_device(np.full((39, 37), np.nan, np.float32))
        launch(out, None, cuda.to_device(a), cuda.to_device(b), trans_a=trans_a, trans_b=trans_b)
        outs.append(out.copy_to_host())
    for out in outs:
        assert np.abs(out - ref).max() <= 1e-5 * np.abs(ref).max()
    assert np.abs(outs[0] - outs[1]).max() <= 1e-6 * np.abs(ref).max()


def test_no_128_bit_copies_in_the_simulator():
    assert not aligned(np.zeros((4, 8), np.float32))


@pytest.mark.parametrize("old, new", [(5, 6), (8, 9)])
def test_mlp_versions_that_move_the_gelu_keep_the_bits(old, new):
    """mlp v6 (k_mlp_fwd_v2 / k_mlp_bwd_v2: the sums stored from registers, the GELU and its
    derivative applied to the values just written) gives v5's bits, and v9 (plain products, the
    GELU in a pass of its own) gives v8's, forward and backward, with dW += on top of random
    values and a shape that crosses the tiles' edges."""
    from lab import mlp as lab_mlp
    rng = np.random.default_rng(7)
    N, C = 37, 12
    x, dout = rng.standard_normal((N, C)).astype(np.float32), rng.standard_normal((N, C)).astype(np.float32)
    w_1, w_2 = (rng.standard_normal(s).astype(np.float32) * 0.3 for s in ((C, 4 * C), (4 * C, C)))
    dw0 = [rng.standard_normal(w.shape).astype(np.float32) for w in (w_1, w_2)]
    work = cuda.to_device(np.zeros(MM.splitk_work(C), np.float32))
    outs = {}
    for v in (old, new):
        fwd, bwd = lab_mlp.VERSIONS["mlp_fwd"][v], lab_mlp.VERSIONS["mlp_bwd"][v]
        d = {k: cuda.to_device(a) for k, a in dict(x=x, w_1=w_1, w_2=w_2, dout=dout).items()}
        out, dx = cuda.to_device(np.full((N, C), np.nan, np.float32)), cuda.to_device(np.full((N, C), np.nan, np.float32))
        h_pre, h, dh_pre = (cuda.to_device(np.full((N, 4 * C), np.nan, np.float32)) for _ in range(3))
        dw_1, dw_2 = (cuda.to_device(a.copy()) for a in dw0)
        fwd(out, h_pre, h, d["x"], d["w_1"], d["w_2"], block=fwd.blocks[0])
        bwd(dx, dw_1, dw_2, dh_pre, work, d["dout"], d["x"], h_pre, h, d["w_1"], d["w_2"], block=bwd.blocks[0])
        outs[v] = [a.copy_to_host() for a in (out, h_pre, h, dx, dw_1, dw_2, dh_pre)]
    for a, b in zip(outs[old], outs[new]):
        assert np.isfinite(a).all() and np.array_equal(a, b)


@pytest.mark.parametrize("trans_a, trans_b", [(False, False), (True, False), (False, True), (True, True)])
def test_v8s_swizzled_tiles_give_v7s_bits(trans_a, trans_b):
    """matmul v8 stores the same values at swizzled shared rows, transposed operands in 4 x 4
    blocks or v6's chunks (both across the two simulator tiles): v7's bits at every transpose and tile,
    for rows, columns and k past a tile's edge."""
    rng = np.random.default_rng(3)
    M, N, K = 45, 70, 37
    a = rng.standard_normal((K, M) if trans_a else (M, K)).astype(np.float32)
    b = rng.standard_normal((N, K) if trans_b else (K, N)).astype(np.float32)
    for block in MM.matmul_tf32x3.blocks:
        outs = []
        for launch in (MM.matmul_v7, MM.matmul_tf32x3):
            out = cuda.to_device(np.full((M, N), np.nan, np.float32))
            launch(out, None, cuda.to_device(a), cuda.to_device(b), trans_a=trans_a, trans_b=trans_b, block=block)
            outs.append(out.copy_to_host())
        assert np.isfinite(outs[0]).all() and np.array_equal(outs[0].view(np.uint32), outs[1].view(np.uint32))


@pytest.mark.parametrize("trans_a, trans_b", [(False, False), (True, False), (False, True), (True, True)])
def test_v9s_simt_tiles_give_v3s_bits(trans_a, trans_b):
    """matmul v9 (k-major shared tiles, 4 x 4 blocks of outputs a thread, transposing copies)
    sums each output in the same k order as v3, one multiply-add at a time: v3's bits at every
    transpose and at both simulator tiles, with rows, columns and k past a tile's edge."""
    rng = np.random.default_rng(5)
    M, N, K = 45, 70, 37
    a = rng.standard_normal((K, M) if trans_a else (M, K)).astype(np.float32)
    b = rng.standard_normal((N, K) if trans_b else (K, N)).astype(np.float32)
    ref = (a.T if trans_a else a).astype(np.float64) @ (b.T if trans_b else b)
    v3 = cuda.to_device(np.full((M, N), np.nan, np.float32))
    MM.matmul_v3(v3, None, cuda.to_device(a), cuda.to_device(b), trans_a=trans_a, trans_b=trans_b)
    v3 = v3.copy_to_host()
    assert np.abs(v3 - ref).max() <= 1e-5 * np.abs(ref).max()
    for block in MM.matmul_v9.blocks:
        out = cuda.to_device(np.full((M, N), np.nan, np.float32))
        MM.matmul_v9(out, None, cuda.to_device(a), cuda.to_device(b), trans_a=trans_a, trans_b=trans_b, block=block)
        assert np.array_equal(v3.view(np.uint32), out.copy_to_host().view(np.uint32)), block


def test_mlp_v11_splits_the_c_wide_products_and_v12_keeps_v11s_bits():
    """mlp v11 offers every product the split-K buffer: at N = 37, C = 24 (K = 4C = 96 for
    out = h @ W_2 and dx = dh_pre @ W_1^T, two output tiles on the simulator's 4 resident blocks)
    splitk cuts them into two slices, so out differs from v9's in its last bits (and agrees with it
    to float32 rounding). v12 (the GELU passes four elements a thread) gives v11's bits, forward
    and backward, with dW += on top of random values."""
    from lab import mlp as lab_mlp
    rng = np.random.default_rng(8)
    N, C = 37, 24
    x, dout = rng.standard_normal((N, C)).astype(np.float32), rng.standard_normal((N, C)).astype(np.float32)
    w_1, w_2 = (rng.standard_normal(s).astype(np.float32) * 0.3 for s in ((C, 4 * C), (4 * C, C)))
    dw0 = [rng.standard_normal(w.shape).astype(np.float32) for w in (w_1, w_2)]
    work = cuda.to_device(np.full(MM.splitk_work(C, N), np.nan, np.float32))
    block = lab_mlp.mlp_fwd_v11.blocks[0]
    assert MM.splitk(N, C, 4 * C, 1, block, work) == (2, 2 * C)
    outs = {}
    for v in (9, 11, 12):
        fwd, bwd = lab_mlp.VERSIONS["mlp_fwd"][v], lab_mlp.VERSIONS["mlp_bwd"][v]
        d = {k: cuda.to_device(a) for k, a in dict(x=x, w_1=w_1, w_2=w_2, dout=dout).items()}
        out, dx = cuda.to_device(np.full((N, C), np.nan, np.float32)), cuda.to_device(np.full((N, C), np.nan, np.float32))
        h_pre, h, dh_pre = (cuda.to_device(np.full((N, 4 * C), np.nan, np.float32)) for _ in range(3))
        dw_1, dw_2 = (cuda.to_device(a.copy()) for a in dw0)
        more = dict(work=work) if v > 9 else {}
        fwd(out=out, h_pre=h_pre, h=h, x=d["x"], w_1=d["w_1"], w_2=d["w_2"], block=block, **more)
        bwd(dx, dw_1, dw_2, dh_pre, work, d["dout"], d["x"], h_pre, h, d["w_1"], d["w_2"], block=block)
        outs[v] = [a.copy_to_host() for a in (out, h_pre, h, dx, dw_1, dw_2, dh_pre)]
    for a, b in zip(outs[11], outs[12]):
        assert np.isfinite(a).all() and np.array_equal(a, b)
    out9, out11 = outs[9][0], outs[11][0]
    assert not np.array_equal(out9, out11) and np.allclose(out9, out11, rtol=1e-5, atol=1e-5)
