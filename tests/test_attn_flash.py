"""Flash attention (kernels/attn_flash.py): its twin is attention's twin with lse saved instead of
att; its kernels agree with that twin at a shape of several query and key tiles with T not a
multiple of any tile, rerun bit for bit, and without dropout give the y of attention's v2 kernels.
v1 (SIMT) and v3 (tensor cores, prefetched tiles; v2 is checked by the harness) run at each of
their simulator blocks; v3 also at a head size that is not a multiple of 8 (hs = 12: zero padding,
two k steps), with and without dropout, and with its 128-bit copies. (The harness rows of the
"attn_flash" case are checked in test_kernels.py, its twin's backward against centred differences
in test_gradcheck.py.) Some seconds in the simulator."""
import math

import numpy as np
import pytest
from numba import cuda

import reference as R
from andrea_numba import check
from andrea_numba.cases import CASES, Dims
from andrea_numba.kernels import attn, attn_flash, attn_flash_tf32x3
from lab import attn_flash_v3 as lab_attn_flash_v3
from lab import attn_flash as lab_attn_flash

pytestmark = [pytest.mark.xdist_group("attn_flash")]   # one worker of `pytest -n` runs the module: its module fixture once

B, T, C, H = 2, 21, 16, 2          # hs = 8; in the simulator: 3 key tiles of 8, 3 or 6 query tiles, the last partial
KEY = 0x5EED1234


def _qkv(rng, dtype=np.float64):
    return [rng.standard_normal((B, T, C)).astype(dtype) for _ in range(4)]      # q, k, v, dy


@pytest.mark.parametrize("p", [0.0, 0.25])
def test_twin_equals_attention_twin(p):
    q, k, v, dy = _qkv(np.random.default_rng(0))
    y, att = R.attn_fwd(q, k, v, H, p, KEY)
    y2, lse = R.attn_flash_fwd(q, k, v, H, p, KEY)
    assert lse.shape == (B, H, T)
    np.testing.assert_allclose(y2, y, rtol=0, atol=1e-12)
    # lse is what att is made of: att[t, u] = exp(s[t, u] - lse[t]) for u <= t
    s = np.einsum("bthd,buhd->bhtu", q.reshape(B, T, H, -1), k.reshape(B, T, H, -1)) / math.sqrt(C // H)
    causal = np.tril(np.ones((T, T), dtype=bool))
    np.testing.assert_allclose(np.where(causal, np.exp(s - lse[..., None]), 0.0), att, rtol=0, atol=1e-12)
    for g, g2 in zip(R.attn_bwd(dy, q, k, v, att, H, p, KEY), R.attn_flash_bwd(dy, q, k, v, y2, lse, H, p, KEY)):
        np.testing.assert_allclose(g2, g, rtol=0, atol=1e-12)


def test_the_case_saves_no_t_by_t_buffer():
    case = CASES["attn_flash"]
    assert case.fwd_out == ("y", "lse") and case.upstream == {"dy": "y"}
    assert set(case.scratch) == {"d_rowdot"}
    assert case.scratch["d_rowdot"][0](Dims(B, T, C, H, 7, T)) == (B, H, T)


def _run(version, block, q, k, v, dy, p, key, n_head=H):
    """Forward, then backward on the forward's y and lse; outputs and work buffer poisoned with NaN."""
    fwd, bwd = lab_attn_flash.flash_pair(version)
    B, T, C = q.shape
    nan = lambda *shape: cuda.to_device(np.full(shape, np.nan, np.float32))
    q_d, k_d, v_d, dy_d = (cuda.to_device(a) for a in (q, k, v, dy))
    y, lse = nan(B, T, C), nan(B, n_head, T)
    fwd(y, lse, q_d, k_d, v_d, n_head, p, key, block=block)
    dq, dk, dv, d_rowdot = nan(B, T, C), nan(B, T, C), nan(B, T, C), nan(B, n_head, T)
    bwd(dq, dk, dv, d_rowdot, dy_d, q_d, k_d, v_d, y, lse, n_head, p, key, block=block)
    return {name: a.copy_to_host() for name, a in dict(y=y, lse=lse, dq=dq, dk=dk, dv=dv, d_rowdot=d_rowdot).items()}


# (version, dropout p, shape B, T, C, H); v3's hs = 12 case at T = 37 walks two query tiles of 32
# and three key tiles of 16 at its block (2, 16)
RUNS = [pytest.param((1, 0.25, (B, T, C, H)), id="v1"), pytest.param((3, 0.25, (B, T, C, H)), id="v3"),
        pytest.param((3, 0.25, (1, 37, 24, 2)), id="v3-hs12"),
        pytest.param((3, 0.0, (1, T, 24, 2)), id="v3-hs12-no-dropout")]


@pytest.fixture(scope="module", params=RUNS)
def runs(request):
    """Every simulator block of a version, each run twice; and the twin in float64 on the same inputs."""
    version, p, (b_, t_, c_, h_) = request.param
    rng = np.random.default_rng(1)
    q, k, v, dy = (rng.standard_normal((b_, t_, c_)).astype(np.float32) for _ in range(4))
    fwd, bwd = (lab_attn_flash.VERSIONS[name][version] for name in ("attn_flash_fwd", "attn_flash_bwd"))
    blocks = dict.fromkeys(fwd.blocks + bwd.blocks)          # each block once (in the simulator both declare the same)
    got = {block: [_run(version, block, q, k, v, dy, p, KEY, h_) for _ in range(2)] for block in blocks}
    q64, k64, v64, dy64 = (a.astype(np.float64) for a in (q, k, v, dy))
    y, lse = R.attn_flash_fwd(q64, k64, v64, h_, p, KEY)
    dq, dk, dv = R.attn_flash_bwd(dy64, q64, k64, v64, y, lse, h_, p, KEY)
    return got, dict(y=y, lse=lse, dq=dq, dk=dk, dv=dv)


def test_kernels_agree_with_the_twin_across_tiles(runs):
    got, ref = runs
    assert len(got) >= 2
    for block, (first, _) in got.items():
        for name, r in ref.items():
            row = check.compare("attn_flash", name, first[name], r, check.OP_TOL)
            assert row["ok"] and row["rel_err"] < 1e-5, (block, row)


def test_kernels_rerun_bit_identical(runs):
    got, _ = runs
    for block, (first, second) in got.items():
        for name in first:
            assert np.array_equal(first[name], second[name]), (block, name)


def test_v3_128_bit_copies_give_the_same_bits(monkeypatch):
    """The 128-bit copy path (chosen on a GPU when the rows are 16-byte aligned, never in the
    simulator) run in the simulator through ptx.py's twins of load4 / store4: the same tiles in
    shared memory, so the same bits as the float-by-float copies, for the lab's v3 and the
    engine's v10 (attn_flash_tf32x3: its own aligned_rows). Block (1, 16) at hs = 8: a K tile of
    16 x 8 floats is 4 floats per thread, one chunk."""
    rng = np.random.default_rng(3)
    q, k, v, dy = (rng.standard_normal((1, T, C)).astype(np.float32) for _ in range(4))
    plain, plain10 = _run(3, (1, 16), q, k, v, dy, 0.25, KEY), _run(10, (1, 16), q, k, v, dy, 0.25, KEY)
    for module in (lab_attn_flash_v3, attn_flash_tf32x3):
        monkeypatch.setattr(module, "aligned_rows", lambda hs, *arrays: True)
    wide, wide10 = _run(3, (1, 16), q, k, v, dy, 0.25, KEY), _run(10, (1, 16), q, k, v, dy, 0.25, KEY)
    assert (C // H, 1, 16, True, 2, False, False, False, False, 0) in lab_attn_flash_v3._KERNELS   # (hs, warps, BKV, vec, planes, trunc, swizzle, nonneg, heavy, rowdot)
    assert (C // H, 1, 16, True, "tf32x3") in attn_flash_tf32x3._KERNELS                        # (hs, warps, BKV, vec, format)
    for name in plain:                            # (v10: also D from 128-bit loads of dy and y)
        assert np.array_equal(plain[name], wide[name]) and np.array_equal(plain10[name], wide10[name]), name


def test_v3_blocks_fit_and_a_block_that_does_not_is_refused():
    """The declared GPU blocks fit 48 KiB at hs = 64 (the module docstring's table); a block that
    does not is refused by the launcher with the bytes it would need, before any launch."""
    fits = {(4, 16): 47616, (2, 32): 38912, (2, 16): 28160}
    for block in lab_attn_flash_v3.FLASH_V3_FWD_BLOCKS["gpu"]:
        assert lab_attn_flash_v3.shared_bytes(64, *block, forward_only=True) == fits[block]
    fits = {(2, 16): 46720, (1, 16): 27776, (2, 8): 40256}
    for block in lab_attn_flash_v3.FLASH_V3_BWD_BLOCKS["gpu"]:
        assert lab_attn_flash_v3.shared_bytes(64, *block) == fits[block]
    x = np.zeros((1, 16, 128), np.float32)
    lse = np.zeros((1, 2, 16), np.float32)
    with pytest.raises(ValueError, match="49664 bytes"):
        lab_attn_flash_v3.attn_flash_fwd_v3(x, lse, x, x, x, 2, block=(2, 48))
    with pytest.raises(ValueError, match="bytes of shared memory"):
        lab_attn_flash_v3.attn_flash_bwd_v3(x, x, x, lse, x, x, x, x, x, lse, 2, block=(4, 16))


def test_v4_blocks_fit_with_one_plane_and_v4_gives_v3s_bits():
    """v4 keeps the own tiles' values in one plane (split as read): the same sums in the same
    order as v3's two split planes, so the same bits; its larger declared blocks fit 48 KiB at
    hs = 64 only because of the single plane; its kernels carry _v4 names."""
    fits = {(4, 32): 44032, (4, 16): 31232, (2, 32): 30720}
    for block in lab_attn_flash_v3.FLASH_V4_FWD_BLOCKS["gpu"]:
        assert lab_attn_flash_v3.shared_bytes(64, *block, forward_only=True, planes=1) == fits[block]
    assert lab_attn_flash_v3.shared_bytes(64, 4, 32, forward_only=True, planes=2) > lab_attn_flash_v3.SHARED_LIMIT
    fits = {(2, 32): 43264, (4, 8): 43328, (2, 16): 30336}
    for block in lab_attn_flash_v3.FLASH_V4_BWD_BLOCKS["gpu"]:
        assert lab_attn_flash_v3.shared_bytes(64, *block, planes=1) == fits[block]
    assert lab_attn_flash_v3.shared_bytes(64, 2, 32, planes=2) > lab_attn_flash_v3.SHARED_LIMIT
    rng = np.random.default_rng(4)
    q, k, v, dy = (rng.standard_normal((1, T, C)).astype(np.float32) for _ in range(4))
    v3, v4 = _run(3, (1, 8), q, k, v, dy, 0.25, KEY), _run(4, (1, 8), q, k, v, dy, 0.25, KEY)
    for name in v3:
        assert np.array_equal(v3[name], v4[name]), name
    assert [f.__name__ for f in lab_attn_flash_v3.kernels(C // H, (1, 8), False, planes=1)] == \
        ["k_attn_flash_fwd_v4", "k_attn_flash_bwd_dq_v4", "k_attn_flash_bwd_dkdv_v4"]


def test_without_dropout_y_equals_attention_v2():
    q, k, v, _ = _qkv(np.random.default_rng(2), np.float32)
    block = attn_flash.attn_flash_fwd.blocks[0]
    y, lse = cuda.device_array((B, T, C), np.float32), cuda.device_array((B, H, T), np.float32)
    attn_flash.attn_flash_fwd(y, lse, q, k, v, H, block=block)
    y2, att = cuda.device_array((B, T, C), np.float32), cuda.device_array((B, H, T, T), np.float32)
    attn.attn_fwd_tiled(y2, att, q, k, v, H, block=block)
    np.testing.assert_allclose(y.copy_to_host(), y2.copy_to_host(), rtol=1e-5, atol=1e-6)
    # and lse rebuilds v2's probabilities
    q64, k64 = (a.astype(np.float64).reshape(B, T, H, -1) for a in (q, k))
    s = np.einsum("bthd,buhd->bhtu", q64, k64) / math.sqrt(C // H)
    P = np.where(np.tril(np.ones((T, T), dtype=bool)), np.exp(s - lse.copy_to_host()[..., None]), 0.0)
    np.testing.assert_allclose(P, att.copy_to_host(), rtol=0, atol=1e-6)


def test_the_model_with_flash_attention_holds_no_T_by_T_buffer_and_agrees():
    """GPUModel(flash=True): lse [L, B, H, T] and d_rowdot [B, H, T] instead of att and d_scores;
    the loss of a training forward (dropout on) agrees with the engine's attention to float32."""
    import numpy as np

    from andrea_numba.config import load_config
    from andrea_numba.gpu_model import GPUModel, buffer_specs
    from andrea_numba.layout import init_params

    m = load_config("tiny").model
    B, T = 2, 8
    names = {s.name: s.shape for s in buffer_specs(m, B, T, flash=True)}
    assert "att" not in names and "d_scores" not in names
    assert names["lse"] == (m.n_layer, B, m.n_head, T) and names["d_rowdot"] == (B, m.n_head, T)
    assert not any(len(s) >= 2 and tuple(s[-2:]) == (T, T) for s in names.values())     # nothing T x T
    rng = np.random.default_rng(2)
    tokens = rng.integers(0, m.vocab_size, (B, T)).astype(np.int32)
    targets = rng.integers(0, m.vocab_size, (B, T)).astype(np.int32)
    losses = []
    for flash in (False, True):
        model = GPUModel(m, B, T, dropout=0.1, flash=flash)
        model.params.copy_to_device(init_params(m, 0))
        model.forward(tokens, targets, dropout_key=12345)
        losses.append(model.read_loss())
    assert abs(losses[0] - losses[1]) < 1e-5 * abs(losses[0])


def test_v6s_swizzled_tiles_give_v5s_bits_and_the_twins_gradients():
    """At hs = 32 (rows of 32 floats: v6 swizzles) v6 stores its K, V, Q and dY tiles at swizzled
    columns and reads them back through the same map, in the copies, in the s-like products and in
    the products with B stored [key, channel]: v5's bits at both simulator blocks, with dropout,
    and the float64 twin's values. (At hs = 8, the other tests' size, v6 is v5.)"""
    assert lab_attn_flash_v3.swizzled(32, True) and not lab_attn_flash_v3.swizzled(8, True)
    rng = np.random.default_rng(5)
    b_, t_, c_, h_ = 1, 19, 64, 2
    q, k, v, dy = (rng.standard_normal((b_, t_, c_)).astype(np.float32) for _ in range(4))
    ref = None
    for block in lab_attn_flash.VERSIONS["attn_flash_fwd"][6].blocks:
        v5, v6 = (_run(ver, block, q, k, v, dy, 0.25, KEY, h_) for ver in (5, 6))
        for name in v5:
            assert np.isfinite(v5[name]).all() and np.array_equal(v5[name], v6[name]), (block, name)
        ref = ref or v5
    assert (32, 1, 8, False, 2, True, True, False, False, 0) in lab_attn_flash_v3._KERNELS
    plain = _run(1, lab_attn_flash.VERSIONS["attn_flash_fwd"][1].blocks[0], q, k, v, dy, 0.25, KEY, h_)
    for name in ref:                              # v1 (SIMT, no tiles in common) as the independent check
        assert np.abs(ref[name] - plain[name]).max() <= 1e-5 * max(1.0, np.abs(plain[name]).max()), name


def test_v8_and_v10_give_v5s_bits():
    """v7 reads its thread and block indices through common.nonneg, v8 also runs on the grid
    (B*H, tiles), v9 also works out D = dy . y in its dq kernel, v10 from 128-bit loads where rows
    are aligned (test_v3_128_bit_copies_give_the_same_bits): the same elements meet the same
    arithmetic, so v8 and v10 give v5's bits (and v10's d_rowdot is v5's), at both simulator
    blocks, with dropout, at hs = 12 (zero-padded to 16) and T = 37 (two query tiles of 32 rows at
    block (2, 16), a partial last key tile). (v8's forward and v10 are the engine's, written out in
    kernels/attn_flash_tf32x3.py; tests/test_attn_flash_tf32x3.py checks them against the lab's
    flag-built copies.)"""
    rng = np.random.default_rng(9)
    b_, t_, c_, h_ = 1, 37, 24, 2
    q, k, v, dy = (rng.standard_normal((b_, t_, c_)).astype(np.float32) for _ in range(4))
    for block in lab_attn_flash.VERSIONS["attn_flash_fwd"][8].blocks:
        v5, v8, v10 = (_run(ver, block, q, k, v, dy, 0.25, KEY, h_) for ver in (5, 8, 10))   # v8 holds v7's change
        for name in v5:
            assert np.isfinite(v5[name]).all(), (block, name)
            assert np.array_equal(v5[name], v8[name]) and np.array_equal(v5[name], v10[name]), (block, name)
    assert lab_attn_flash_v3.make_kernels(12, 1, 8, False, NONNEG=True, HEAVY=True)[0].__name__ == "k_attn_flash_fwd_v8"
