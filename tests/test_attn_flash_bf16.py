"""Flash attention v13 (kernels/attn_flash_bf16.py): bf16 tiles read by ldmatrix, p~ f and ds kept in
registers. It agrees with the twin at bf16 through the harness's own comparison (check.compare with
the tolerance the harness gives a bf16 attention kernel) at shapes of several query and key tiles
whose last tiles are partial, with and without dropout, at a head size padded to a k step; it reruns
bit for bit; a warp that skips the tiles its rows cannot see gives the bits of a block that never
had those tiles; its ldmatrix addresses are half_tile's swizzled words; its blocks fit 48 KiB.
(The harness rows at the simulator's blocks are in test_kernels.py.) About 15 s in the simulator."""
import functools

import numpy as np
import pytest

import reference as R
from andrea_numba import check
from andrea_numba.kernels import attn_flash, attn_flash_bf16 as V13
from lab import attn_flash as lab_attn_flash
from andrea_numba.kernels.common import BlockDoesNotFit
from andrea_numba.kernels.half_tile import _frag_index
from test_attn_flash_lowp import KEY, _run as run_version      # (KEY: the dropout key it passes)

pytestmark = [pytest.mark.xdist_group("attn_flash")]
U = 2.0 ** -8                                   # unit roundoff of a bf16 input
TOL = check.LOW_PRECISION_TOL["attn_flash"]     # the harness's tolerance for a bf16 attention kernel


def _inputs(seed, B, T, C):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((B, T, C)).astype(np.float32) for _ in range(4)]     # q, k, v, dy


# v13's forward, then its backward on the forward's y and lse; outputs and D poisoned with NaN (v11's
# helper, the same dropout KEY): _run(block, q, k, v, dy, p, n_head)
_run = functools.partial(run_version, 13)


# (dropout p, shape B, T, C, H). hs = 8 (padded to 16 channels: one k step, half of it zeros) at
# T = 37: query and key tiles of 16 (three, the last of 5 rows) at block (1, 16); two query tiles
# of 32 at (2, 16), whose second warp skips key tiles. hs = 24 (padded to 32: two k steps) at T = 21.
SHAPES = [pytest.param((0.25, (1, 37, 16, 2)), id="hs8-T37-dropout"),
          pytest.param((0.0, (1, 21, 48, 2)), id="hs24-T21")]


@pytest.fixture(scope="module", params=SHAPES)
def runs(request):
    """Each simulator block's run (the first block's twice), and the twin at bf16 and fp32, on the
    kernels' own y and lse for the backward (as the engine runs them)."""
    p, (B, T, C, H) = request.param
    q, k, v, dy = _inputs(1, B, T, C)
    blocks = V13.attn_flash_fwd_bf16.blocks
    assert blocks == V13.attn_flash_bwd_bf16.blocks == ((1, 16), (2, 16))
    got = {block: _run(block, q, k, v, dy, p, H) for block in blocks}
    again = _run(blocks[0], q, k, v, dy, p, H)
    q64, k64, v64, dy64 = (a.astype(np.float64) for a in (q, k, v, dy))
    y_k, lse_k = (got[blocks[0]][n].astype(np.float64) for n in ("y", "lse"))

    def twin(at):
        with R.products_in(at):
            y, lse = R.attn_flash_fwd(q64, k64, v64, H, p, KEY)
            dq, dk, dv = R.attn_flash_bwd(dy64, q64, k64, v64, y_k, lse_k, H, p, KEY)
        return dict(y=y, lse=lse, dq=dq, dk=dk, dv=dv)
    return got, again, twin("bf16"), twin("fp32"), (dy64, y_k, B, T, H)


def test_v13_agrees_with_the_bf16_twin(runs):
    """Every output within the harness's bf16 tolerance of the twin at bf16 (measured far inside it:
    the same rounded inputs, only the order of fp32 sums differs), and within 8 u of the fp32 twin."""
    got, _, ref, ref32, _ = runs
    for block, out in got.items():
        for name, r in ref.items():
            row = check.compare("attn_flash", name, out[name], r, TOL)
            assert row["ok"] and row["rel_err"] < 1e-5, (block, row)
            far = np.max(np.abs(out[name] - ref32[name])) / np.max(np.abs(ref32[name]))
            assert far < 8 * U, (block, name, far)


def test_v13_writes_d_in_fp32(runs):
    """D = dy . y, written by the dq kernel for the dk/dv kernel, is the fp32 row sum (never rounded)."""
    got, _, _, _, (dy64, y_k, B, T, H) = runs
    want = (dy64 * y_k).reshape(B, T, H, -1).sum(-1).transpose(0, 2, 1)
    for out in got.values():
        np.testing.assert_allclose(out["d_rowdot"], want, rtol=1e-5, atol=1e-6)


def test_v13_reruns_bit_identical(runs):
    got, again, _, _, _ = runs
    first = next(iter(got.values()))
    for name in first:
        assert np.array_equal(first[name], again[name], equal_nan=True), name


def test_a_warp_that_skips_a_tile_gives_the_bits_of_a_block_without_it(runs):
    """Block (2, 16) runs two warps on 32 rows; a warp whose rows cannot see a tile (keys after its
    rows, or queries before its keys) skips its products. Each row then meets the same tiles in the
    same order as at block (1, 16), where those tiles are outside its block: the same bits."""
    got, _, _, _, _ = runs
    one, two = got[(1, 16)], got[(2, 16)]
    for name in one:
        assert np.array_equal(one[name], two[name]), name


@pytest.mark.parametrize("W", [8, 16, 32, 64])
def test_ldmatrix_addresses_are_half_tiles_swizzled_words(W):
    """v13 works out each lane's ldmatrix word as a per-lane offset and one XOR a step
    (attn_flash_bf16.fragment_words); that is the word half_tile's _frag_index gives for the same
    16 x 16 block, for every lane, row block and step, in tiles of W words a row (head sizes 16,
    32, 64, 128): A of an own tile, B of an inner tile read as [n, k] and as [k, n] (.trans)."""
    lane_frag, frag_word = V13.fragment_words(W)
    lanes = np.arange(32)
    offa, bitsa, offb, bitsb = lane_frag(lanes)
    a_ref, b_ref, t_ref = _frag_index(True, W, 3, 4), _frag_index(True, W, 4, 3), _frag_index(False, W, 4, 3)
    assert V13.padded_head(2 * W) == 2 * W
    for r0 in (0, 16, 48):
        for step in range(W // 8):                  # the 16-channel steps of a row of 2 W values
            assert np.array_equal(frag_word(r0, step, offa, bitsa), a_ref(r0, step, lanes))
            assert np.array_equal(frag_word(r0, step, offb, bitsb), b_ref(r0, step, lanes))
            assert np.array_equal(frag_word(r0, step, offa, bitsa), t_ref(16 * step, r0 // 16, lanes))


def test_v13_blocks_fit_48_kib_and_a_block_that_does_not_is_refused():
    """At hs = 64 every declared GPU block fits 48 KiB of static shared memory in each kernel (the
    module docstring's table); a larger one is refused before any launch, with the bytes."""
    for blocks, kernels in ((V13.FLASH_BF16_FWD_BLOCKS["gpu"], ("fwd",)),
                            (V13.FLASH_BF16_BWD_BLOCKS["gpu"], ("dq", "dkdv"))):
        for warps, bkv in blocks:
            for name in kernels:
                assert V13.shared_bytes(64, warps, bkv, name) <= V13.SHARED_LIMIT, (warps, bkv, name)
    assert V13.shared_bytes(64, 4, 64, "fwd") == 8192 + 32768
    q = np.zeros((1, 64, 128), np.float32)
    with pytest.raises(BlockDoesNotFit, match="bytes of shared memory"):
        V13.attn_flash_bwd_bf16(q, q, q, np.zeros((1, 2, 64), np.float32), q, q, q, q, q,
                               np.zeros((1, 2, 64), np.float32), 2, block=(8, 64))
    with pytest.raises(BlockDoesNotFit, match="multiple of 16"):
        V13.attn_flash_fwd_bf16(q, np.zeros((1, 2, 64), np.float32), q, q, q, 2, block=(1, 8))


def test_v13_is_registered_as_a_bf16_pair():
    fwd, bwd = lab_attn_flash.flash_pair(13)
    assert fwd is lab_attn_flash.VERSIONS["attn_flash_fwd"][13] is V13.attn_flash_fwd_bf16
    assert bwd is lab_attn_flash.VERSIONS["attn_flash_bwd"][13] is V13.attn_flash_bwd_bf16
    assert fwd.precision == bwd.precision == "bf16"
