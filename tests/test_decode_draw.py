"""The decoder's draw (k_decode_draw, its sums by shuffles, and lab/decode.py rung 9's with the trees
it had before) against its twin (reference.decode.draw: numpy's Generator.choice given the
uniform number), and the block sums by warps (kernels/decode.py _block_total, _block_top) and
ptx.warp_prefix against their documented order. In the simulator (tiny
vocabularies; the radix select forced on them by setting RANK_MAX to 0) and, run on a GPU, at
the vocabularies that use each way of finding the top_k-th largest (256: counting; 1025 and
50304: the radix select) and at every block the launcher declares there.

Exact: the token drawn is the twin's (a uniform number on no boundary between two tokens: the
sums differ from numpy's by rounding only), and the block sums are the documented order's bits.
"""
import math

import numpy as np
import pytest
from numba import cuda

from andrea_numba.kernels import decode as kd
from andrea_numba.kernels.common import SIMULATOR
from andrea_numba.kernels.ptx import warp_prefix
from andrea_numba.kernels.decode import _block_top, _block_total
from lab.decode import decode_draw_v9
from reference.decode import draw

pytestmark = pytest.mark.skipif(not SIMULATOR and not cuda.is_available(), reason="needs the simulator or a GPU")

f32 = np.float32
SIM_ONLY = pytest.mark.skipif(not SIMULATOR, reason="patches a kernel's code: the simulator runs Python")
VOCABULARIES = (256, 37, 5) if SIMULATOR else (256, 37, 5, kd.RANK_MAX + 1, 50304)


def _probability_rows(V, seed):
    """Rows of float32 probabilities [V] that a draw must get right: peaked random ones, ones with
    ties (equal values, across the top_k boundary too), one with zeros and values below 1e-30 (all
    ranked as 1e-30), and a flat one (every token tied)."""
    rng = np.random.default_rng(seed)
    peaked = rng.random(V) ** 8
    ties = np.round(rng.random(V) * 6) + 1                # six values, many of each
    small = rng.random(V) ** 4
    small[::3], small[1::5] = 0.0, 1e-36
    rows = [peaked, ties, small, np.ones(V)]
    return [(r / r.sum()).astype(f32) for r in rows]


def _draw(probs, u, top_k, temperature, block, t=3, first=3, T=6, launcher=None):
    """k_decode_draw (or `launcher`'s) at position t (pos = t) of a window of T, drawing from
    `first` on, with the uniform number u at t: the tokens buffer after it (-1 where nothing was
    written)."""
    tokens = cuda.to_device(np.full(T + 1, -1, np.int32))
    uniform = np.full(T + 1, np.nan)
    if t <= T:
        uniform[t] = u
    (launcher or kd.decode_draw)(tokens, cuda.to_device(np.array([t], np.int32)), cuda.to_device(probs),
                                 cuda.to_device(uniform), cuda.to_device(np.array([first, top_k], np.int32)),
                                 cuda.to_device(np.array([temperature])), block=block)
    return tokens.copy_to_host()


# the ends of [0, 1) among them. A row of n tied kept tokens has its boundaries at u = j / n: a
# decimal u (0.9 with 90 kept, as the ties row at V = 1025 and top_k 3 keeps) would fall on one, where
# the GPU's exact sums and numpy's rounded cumsum may pick either side. 2^-31 moves u off every j / n
# (n <= 50304) by at least n 2^-31 of a token's weight, far beyond either sum's rounding.
D = 2.0 ** -31
U = (0.0, 0.137 + D, 0.503 + D, 0.9 + D, 1 - 2.0 ** -53)


def _draw_cases(V):
    """(probabilities, top_k, temperature, u): every row of _probability_rows at top_k 0 (all), 1, 3
    and V - 1, V, V + 2 (all), temperatures 1, 0.7, 3 and 0 (clamped to 1e-6: the most likely
    token), one of the uniform numbers U each."""
    settings = [(0, 1.0), (1, 1.0), (3, 0.7), (3, 3.0), (V - 1, 1.0), (V, 0.7), (V + 2, 1.0), (3, 0.0)]
    return [(p, top_k, temperature, U[(r + j) % len(U)])
            for r, p in enumerate(_probability_rows(V, V)) for j, (top_k, temperature) in enumerate(settings)]


LAUNCHERS = [("engine", kd.decode_draw, block) for block in kd.decode_draw.blocks] + \
            [("rung 9", decode_draw_v9, block) for block in decode_draw_v9.blocks]


@pytest.mark.parametrize("V", VOCABULARIES)
@pytest.mark.parametrize("which, launcher, block", LAUNCHERS, ids=[f"{w}-{b}" for w, _, b in LAUNCHERS])
@pytest.mark.parametrize("select", ["counting", "radix"] if SIMULATOR else ["as declared"])
def test_the_draw_on_the_gpu_is_the_twins(V, which, launcher, block, select, monkeypatch):
    """k_decode_draw against reference.decode.draw (numpy's Generator.choice given u) on _draw_cases:
    the same token, written at position t and nowhere else. V = 5 leaves threads of the block
    without tokens; 37 gives the runs of the threads unequal lengths. The top_k-th largest found by
    counting (V <= RANK_MAX), and by the radix select that larger vocabularies use (in the
    simulator RANK_MAX set to 0; on a GPU, whose kernels keep the value they were compiled with,
    V = RANK_MAX + 1 and 50304). Rung 9's draw (the trees) the same way."""
    if select == "radix":
        monkeypatch.setattr(kd, "RANK_MAX", 0)
    for p, top_k, temperature, u in _draw_cases(V):
        got = _draw(p, u, top_k, temperature, block, launcher=launcher)
        assert got[3] == draw(p.astype(np.float64), u, temperature, top_k), (top_k, temperature, u)
        assert (np.delete(got, 3) == -1).all()


@SIM_ONLY
def test_the_draws_cases_tell_a_top_k_one_off_and_a_missing_temperature(monkeypatch):
    """The test above could fail: on its cases the twin's token changes for some case when top_k is
    one off either way or the temperature is left out, and a kernel that forgets the temperature
    (a planted bug: l_v = log p_v) draws another token for one of them."""
    for V in (256, 37):
        cases = [(p.astype(np.float64), k, tau, u) for p, k, tau, u in _draw_cases(V)]
        want = [draw(p, u, tau, k) for p, k, tau, u in cases]
        assert want != [draw(p, u, tau, k + 1) for p, k, tau, u in cases]
        assert want != [draw(p, u, tau, max(k - 1, 0)) for p, k, tau, u in cases]
        assert want != [draw(p, u, 1.0, k) for p, k, tau, u in cases]
    monkeypatch.setattr(kd, "_scaled_log", lambda q, tau: math.log(max(float(q), 1e-30)))
    assert any(_draw(p, u, k, tau, 8)[3] != draw(p.astype(np.float64), u, tau, k) for p, k, tau, u in _draw_cases(37))


def test_the_draw_writes_nothing_before_the_first_drawn_position_or_past_the_window():
    """During the prompt (t < draw[0]) the token fed stays; past the tokens buffer nothing is written."""
    p, block = _probability_rows(37, 1)[0], kd.decode_draw.blocks[0]
    assert (_draw(p, 0.5, 3, 1.0, block, t=2, first=3) == -1).all()
    assert (_draw(p, 0.5, 3, 1.0, block, t=7, first=3, T=6) == -1).all()
    got = _draw(p, 0.5, 3, 1.0, block, t=6, first=3, T=6)   # the last slot: the window's last step draws it
    assert got[6] >= 0 and (got[:6] == -1).all()


@cuda.jit
def _k_block_sums(out, x):
    i = cuda.threadIdx.y * cuda.blockDim.x + cuda.threadIdx.x
    buf = cuda.shared.array(32, np.float32)
    total = _block_total(buf, x[i])
    top = _block_top(buf, x[i])
    out[i, 0] = total
    out[i, 1] = top


@pytest.mark.parametrize("threads", [(8, 8), (96, 1)] + ([(5, 1)] if SIMULATOR else []))
def test_a_block_sum_goes_warp_by_warp_in_the_documented_order(threads):
    """kernels/decode.py's _block_total: each warp's 32 values by the butterfly (lane i adds lane i ^ m, m = 16, ..., 1;
    lanes past the block hold 0), then the warps' sums in warp order, bit for bit, every thread the
    same; _block_top the maximum. Two and three warps, and in the simulator part of one (a GPU's
    launchers take whole warps only)."""
    n = threads[0] * threads[1]
    rng = np.random.default_rng(n)
    x = (rng.standard_normal(n) * 10.0 ** rng.uniform(-3, 3, n)).astype(f32)    # sizes apart: the order shows
    out = cuda.to_device(np.zeros((n, 2), f32))
    _k_block_sums[1, threads](out, cuda.to_device(x))
    sums = []
    for w in range(0, n, 32):
        lanes = np.zeros(32, f32)
        lanes[:min(32, n - w)] = x[w:w + 32]
        for m in (16, 8, 4, 2, 1):
            lanes = lanes + lanes[np.arange(32) ^ m]
        sums.append(lanes[0])
    want = sums[0]
    for s in sums[1:]:
        want = want + s
    got = out.copy_to_host()
    assert (got[:, 0] == want).all() and (got[:, 1] == x.max()).all()
    one_by_one = f32(0)
    for v in x:
        one_by_one = one_by_one + v
    assert n < 32 or want != one_by_one                    # another order gives other bits


@cuda.jit
def _k_prefix(out, x):
    i = cuda.threadIdx.x
    out[i] = warp_prefix(x[i])


@pytest.mark.parametrize("n", [64] + ([12] if SIMULATOR else []))
def test_a_warp_prefix_adds_lane_by_lane_and_never_goes_down(n):
    """ptx.warp_prefix: lane j of each warp gets x_0 + ... + x_{j-1} of its warp added in lane order
    (a serial cumsum's bits), so its sum plus x_j is lane j + 1's exactly, and with x >= 0 the sums
    never go down; values of many sizes, so that another order (a tree) gives other bits."""
    rng = np.random.default_rng(n)
    x = rng.random(n) * 10.0 ** rng.uniform(-12, 3, n)
    out = cuda.to_device(np.zeros(n))
    _k_prefix[1, n](out, cuda.to_device(x))
    got = out.copy_to_host()
    for w in range(0, n, 32):
        lanes, mine = x[w:w + 32], got[w:w + 32]
        want = np.concatenate([[0.0], np.cumsum(lanes)[:-1]])      # numpy's cumsum: one at a time
        assert (mine == want).all()
        assert (mine[1:] == mine[:-1] + lanes[:-1]).all() and (np.diff(mine) >= 0).all()
    m = min(n, 32)
    tree = x[:m].copy()
    d = 1
    while d < m:                                                    # a scan by steps of 1, 2, 4, ...
        tree[d:] = tree[d:] + tree[:-d].copy()
        d *= 2
    assert (np.concatenate([[0.0], tree[:-1]]) != got[:m]).any()
