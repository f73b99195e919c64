"""Flash attention v15 (lab/attn_flash_wgmma.py): v13's math on Hopper's wgmma. In the simulator its
products are wgmma.py's twins reading the shared tiles through the kernels' own descriptors, so
these tests check the tiles, the swizzle, the descriptors, the register-A fragments, the masks and
the math (not the asynchrony: lab/bench/flash_wgmma.py asks a GPU). It agrees with the twin at bf16
through the harness's comparison at a head size of 64 with a ragged last tile, and at a small head
size padded to 64 with dropout; it reruns bit for bit; two warpgroups a block (one skipping tiles the
other computes) give one warpgroup's bits; its bf16 outputs are its fp32 values rounded; a planted
bug fails. (The harness rows at the simulator's blocks, at the tiny size, are in test_kernels.py.)
About 10 s in the simulator."""
import inspect
import textwrap

import numpy as np
import pytest
from numba import cuda

import reference as R
from andrea_numba import check
from andrea_numba.kernels.common import SIMULATOR, BlockDoesNotFit
from lab import attn_flash as lab_attn_flash
from lab import attn_flash_wgmma as V15
from reference.precision import round_bf16

pytestmark = [pytest.mark.xdist_group("attn_flash")]
KEY = 0x5EED1234
TOL = check.LOW_PRECISION_TOL["attn_flash"]     # the harness's tolerance for a bf16 attention kernel
NAMES = ("y", "lse", "dq", "dk", "dv")


def _inputs(seed, B, T, C):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((B, T, C)).astype(np.float32) for _ in range(4)]     # q, k, v, dy


def _run(block, q, k, v, dy, p, H, out16=False):
    """v15's forward, then its backward on the forward's y and lse; outputs NaN-poisoned (with out16
    also y16 and bf16 dq, dk, dv, filled with a NaN's bits: every word must be written)."""
    B, T, C = q.shape
    nan = lambda *shape: cuda.to_device(np.full(shape, np.nan, np.float32))
    junk = lambda: cuda.to_device(np.full((B, T, C), 0xFFFF, np.uint16))
    qd, kd, vd, dyd = (cuda.to_device(a) for a in (q, k, v, dy))
    y, lse, d_rowdot = nan(B, T, C), nan(B, H, T), nan(B, H, T)
    extra = {"y16": junk()} if out16 else {}
    V15.attn_flash_fwd_v15(y, lse, qd, kd, vd, H, p, KEY, block=block, **extra)
    grads = [junk() for _ in range(3)] if out16 else [nan(B, T, C) for _ in range(3)]
    V15.attn_flash_bwd_v15(*grads, d_rowdot, dyd, qd, kd, vd, y, lse, H, p, KEY, block=block)
    out = dict(y=y, lse=lse, dq=grads[0], dk=grads[1], dv=grads[2], d_rowdot=d_rowdot, **extra)
    return {name: a.copy_to_host() for name, a in out.items()}


def _twin(q, k, v, dy, p, H, got):
    """The twin at bf16, its backward on the kernel's own y and lse (as the engine runs them)."""
    q64, k64, v64, dy64 = (a.astype(np.float64) for a in (q, k, v, dy))
    y_k, lse_k = (got[n].astype(np.float64) for n in ("y", "lse"))
    with R.products_in("bf16"):
        y, lse = R.attn_flash_fwd(q64, k64, v64, H, p, KEY)
        dq, dk, dv = R.attn_flash_bwd(dy64, q64, k64, v64, y_k, lse_k, H, p, KEY)
    return dict(y=y, lse=lse, dq=dq, dk=dk, dv=dv)


def _bits16(a):
    """float values as the uint16 bf16 bit patterns round_bf16 gives (ties to even)."""
    return (round_bf16(a).view(np.uint32) >> 16).astype(np.uint16)


# hs = 64 (one head, C = 64) at T = 80: query tiles of 64 (the second of 16 rows), key tiles of 32
# (the last ragged) at block (1, 32); one query tile of 128 at (2, 16), whose first warpgroup skips
# the key tile 64..79 that the second computes. No dropout: the tiles take the paths that test only
# the diagonal's elements.
SHAPE = (1, 80, 64, 1)


@pytest.fixture(scope="module")
def runs():
    B, T, C, H = SHAPE
    q, k, v, dy = _inputs(1, B, T, C)
    first = _run((1, 32), q, k, v, dy, 0.0, H)
    return dict(inputs=(q, k, v, dy), first=first, again=_run((1, 32), q, k, v, dy, 0.0, H),
                two=_run((2, 16), q, k, v, dy, 0.0, H, out16=True), twin=_twin(q, k, v, dy, 0.0, H, first))


def test_v15_agrees_with_the_twin_at_bf16(runs):
    """Within the harness's bf16 tolerance, and within fp32 rounding (rel_err < 1e-5) of the twin;
    D = dy . y in fp32, never rounded."""
    got = runs["first"]
    for name, ref in runs["twin"].items():
        row = check.compare("attn_flash", name, got[name], ref, TOL)
        assert row["ok"] and row["rel_err"] < 1e-5, row
    (B, T, C, H), (q, k, v, dy) = SHAPE, runs["inputs"]
    d = (dy.astype(np.float64) * got["y"]).reshape(B, T, H, -1).sum(-1).transpose(0, 2, 1)
    np.testing.assert_allclose(got["d_rowdot"], d, rtol=1e-5, atol=1e-6)


def test_v15_reruns_bit_for_bit(runs):
    for name, a in runs["first"].items():
        assert np.array_equal(a, runs["again"][name]), name


def test_two_warpgroups_give_one_warpgroups_bits_and_bf16_outputs_are_them_rounded(runs):
    """Block (2, 16) against (1, 32): the same bits (in the simulator's sums a tile boundary moves no
    bit: the maxima are integers, the rescales powers of two). With y16 and uint16 dq, dk, dv (v14's
    form) y is the same and the bf16 outputs are the fp32 values rounded to bf16."""
    one, two = runs["first"], runs["two"]
    for name in ("y", "lse", "d_rowdot"):
        assert np.array_equal(one[name], two[name]), name
    assert np.array_equal(two["y16"], _bits16(one["y"]))
    for name in ("dq", "dk", "dv"):
        assert np.array_equal(two[name], _bits16(one[name])), name


def test_a_small_head_size_padded_to_64_with_dropout():
    """hs = 8 (C = 16, two heads), T = 21, dropout 0.25: channels 8 .. 63 of every tile are zeros, and
    every tile takes the paths that draw the dropout masks."""
    B, T, C, H = 1, 21, 16, 2
    q, k, v, dy = _inputs(2, B, T, C)
    got = _run((1, 32), q, k, v, dy, 0.25, H)
    for name, ref in _twin(q, k, v, dy, 0.25, H, got).items():
        row = check.compare("attn_flash", name, got[name], ref, TOL)
        assert row["ok"], row


def _planted(monkeypatch, old, new):
    """make_kernels with the line `old` of its source replaced by `new` (a planted bug), in place of
    the module's own for this test (the kernels' cache emptied)."""
    src = textwrap.dedent(inspect.getsource(V15.make_kernels))
    assert src.count(old) == 1, old
    namespace = dict(vars(V15))
    exec(compile(src.replace(old, new), V15.__file__, "exec"), namespace)
    monkeypatch.setattr(V15, "make_kernels", namespace["make_kernels"])
    monkeypatch.setattr(V15, "_KERNELS", {})


@pytest.mark.skipif(not SIMULATOR, reason="plants a bug in the simulator's Python kernels")
@pytest.mark.parametrize("bug", ["no causal mask on the diagonal", "dk/dv without the last query tile"])
def test_a_planted_bug_fails_the_check(runs, monkeypatch, bug):
    """The forward without its causal mask on the tiles that cross the diagonal fails y; a dk/dv kernel
    that stops one query tile early fails dk and dv (dq, from the other kernel, still agrees)."""
    if bug.startswith("no causal"):
        _planted(monkeypatch, "diag = u0 + BKV - 1 > row0 ", "diag = False ")
    else:
        _planted(monkeypatch, "n_tiles = (T - u0 + BKV - 1) // BKV ", "n_tiles = (T - u0 - 1) // BKV ")
    (B, T, C, H), (q, k, v, dy) = SHAPE, runs["inputs"]
    got = _run((1, 32), q, k, v, dy, 0.0, H)
    ok = {n: check.compare("attn_flash", n, got[n], runs["twin"][n], TOL)["ok"] for n in NAMES}
    if bug.startswith("no causal"):
        assert not ok["y"]
    else:
        assert ok["dq"] and not ok["dk"] and not ok["dv"], ok


def test_head_sizes_past_64_and_odd_blocks_are_refused():
    q = cuda.to_device(np.zeros((1, 16, 160), np.float32))
    out = lambda *s: cuda.to_device(np.zeros(s, np.float32))
    with pytest.raises(BlockDoesNotFit, match="head size 80: at most 64"):
        V15.attn_flash_fwd_v15(out(1, 16, 160), out(1, 2, 16), q, q, q, 2, block=(1, 32))
    with pytest.raises(BlockDoesNotFit, match="inner tiles of a multiple of 16"):
        V15.kernels(64, (1, 40), False)
    with pytest.raises(BlockDoesNotFit, match="1 or 2 warpgroups"):
        V15.kernels(64, (3, 64), False)


def test_tiles_start_on_the_swizzle_atom_and_the_blocks_fit():
    """Every shared tile starts on a 1024-byte boundary (the 128-byte swizzle is applied to absolute
    addresses), the tiles do not overlap, and every GPU block fits Hopper's 227 KiB."""
    for block in V15.FLASH_WGMMA_FWD_BLOCKS["gpu"] + V15.FLASH_WGMMA_BWD_BLOCKS["gpu"] + ((2, 16), (1, 32)):
        for kernel in ("fwd", "dq", "dkdv"):
            tiles = sorted(V15.layout(block, kernel).values())
            assert all((4 * at) % 1024 == 0 for at, _ in tiles), (block, kernel)
            assert all(a + n <= b for (a, n), (b, _) in zip(tiles, tiles[1:]))
            assert V15.shared_bytes(block, kernel) <= V15.DYNAMIC_LIMIT
    assert V15.shared_bytes((1, 64), "fwd") == (64 + 4 * 64) * 128 + 1024


def test_v15_is_a_bf16_pair_of_the_ladder():
    fwd, bwd = lab_attn_flash.flash_pair(15)
    assert (fwd, bwd) == (V15.attn_flash_fwd_v15, V15.attn_flash_bwd_v15)
    assert fwd.precision == bwd.precision == "bf16"
    assert len(fwd.blocks) >= 2 and len(bwd.blocks) >= 2
