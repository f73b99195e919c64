"""The decoder's kernels one by one (andrea_numba/kernels/decode.py), in the simulator, at sizes
the tiny model does not reach: the order of a product's sums (bit for bit), ragged columns,
attention's chunks of keys (t inside the first chunk, on a chunk's edge, past it), the last block's
merge whichever block comes last, a planted bug in the merge, and the decoder's step at every
block each launcher declares.

Tolerances: against float64 NumPy, 1e-5 of the output's largest size (sums of at most a few dozen
fp32 products and exponentials: errors of a few 1e-7); the order test is exact.
"""
import dataclasses

import numpy as np
import pytest
from numba import cuda

from andrea_numba.config import load_config
from andrea_numba.kernels import decode as kd
from andrea_numba.kernels.common import SIMULATOR
from andrea_numba.layout import init_params
from reference.decode import KVCache
from test_decode_gpu import _decode_each      # feeding a decoder token by token

pytestmark = pytest.mark.skipif(not SIMULATOR, reason="tiny sizes for the simulator (NUMBA_ENABLE_CUDASIM=1)")

f32 = np.float32
TOL = 1e-5


def _distance(got, want) -> float:
    return float(np.abs(np.asarray(got, np.float64) - want).max() / np.abs(want).max())


def _thread_parts(a, w, n, ks):
    """Thread ty's part of out[n] (kernels/decode.py _column_part), in float32, ty = 0 .. KS - 1: four
    running sums over rows ty + j KS (the first four, then four a round, then two, then one),
    (s0 + s1) + (s2 + s3)."""
    K = a.shape[0]
    parts = []
    for ty in range(ks):
        s = [f32(0)] * 4
        k = ty
        for j in range(4):
            if k + j * ks < K:
                s[j] = a[k + j * ks] * w[k + j * ks, n]
        k += 4 * ks
        while k + 3 * ks < K:
            for j in range(4):
                s[j] = s[j] + a[k + j * ks] * w[k + j * ks, n]
            k += 4 * ks
        if k + ks < K:
            s[0] = s[0] + a[k] * w[k, n]
            s[1] = s[1] + a[k + ks] * w[k + ks, n]
            k += 2 * ks
        if k < K:
            s[2] = s[2] + a[k] * w[k, n]
        parts.append((s[0] + s[1]) + (s[2] + s[3]))
    return parts


def _column_in_order(a, w, n, tx_n, ks):
    """out[n] as k_decode_matvec_add sums it (module docstring): the threads' parts (_thread_parts),
    then a tree over the slices: at step s = KS/2, ..., 1 slice ty < s adds slice ty + s."""
    parts = _thread_parts(a, w, n, ks)
    s = ks // 2
    while s > 0:
        for ty in range(s):
            parts[ty] = parts[ty] + parts[ty + s]
        s //= 2
    return parts[0]


def _column_by_shuffles(a, w, n, tx_n, ks):
    """out[n] as lab/decode.py rung 2 sums it: the threads' parts, then the G = 32 / TX slices a warp
    holds by the shuffles' butterfly (lane i adds lane i ^ m, m = 16, 8, ..., TX; lanes the block
    lacks hold 0), then the warps' sums in order."""
    parts = _thread_parts(a, w, n, ks)
    tx, g = n % tx_n, max(1, 32 // tx_n)
    sums = []
    for first in range(0, ks, g):                 # a warp's slices first .. first + g - 1
        lanes = np.zeros(32, f32)
        for ty in range(first, min(first + g, ks)):
            lanes[(ty - first) * tx_n + tx] = parts[ty]
        m = 16
        while m >= tx_n:
            lanes = lanes + lanes[np.arange(32) ^ m]
            m //= 2
        sums.append(lanes[tx])
    total = sums[0]
    for x in sums[1:]:
        total = total + x
    return total


@pytest.mark.parametrize("K, N, block", [(13, 11, (4, 4)), (29, 6, (8, 2)), (7, 9, (2, 8)), (40, 5, (1, 4)),
                                         (50, 10, (8, 8)), (70, 3, (1, 64))])
@pytest.mark.parametrize("rung", [1, 2])
def test_a_products_sums_go_in_the_documented_order_and_columns_past_n_are_left_alone(K, N, block, rung):
    """x += a @ w at ragged sizes (N not a multiple of TX, K not of KS, K below 4 KS): every column
    bit for bit the order of the module's docstring (rung 1, the engine's: a tree; lab/decode.py's
    rung 2: shuffles); nothing past N written."""
    from lab.decode import VERSIONS
    rng = np.random.default_rng(K)
    a, w = rng.standard_normal(K).astype(f32), rng.standard_normal((K, N)).astype(f32)
    x0 = rng.standard_normal(N + 3).astype(f32)
    x = cuda.to_device(x0)
    VERSIONS["decode_matvec_add"][rung](x[:N], cuda.to_device(a), cuda.to_device(w), block=block)
    got = x.copy_to_host()
    order = _column_in_order if rung == 1 else _column_by_shuffles
    want = [x0[n] + order(a, w, n, block[0], block[1]) for n in range(N)]
    assert got[:N].tobytes() == np.array(want, f32).tobytes()
    assert got[N:].tobytes() == x0[N:].tobytes()


def _layernorm(x, g, b, eps=1e-5):
    x = x.astype(np.float64)
    return (x - x.mean()) / np.sqrt(x.var() + eps) * g + b


@pytest.mark.parametrize("block", [(8, 2), (4, 4)])
def test_qkv_with_the_embedding_and_mlp_up_at_a_ragged_width(block):
    """C = 12 (3C = 36 columns, blocks of 8 straddle W_q | W_k and W_k | W_v; F = 48): q, the cache's
    row t (and no other row), and with embed x = wte[tokens[t]] + wpe[t] written once; then the MLP's
    first product on that x."""
    C, T, V, t = 12, 6, 10, 4
    rng = np.random.default_rng(1)
    g, b = (1 + 0.1 * rng.standard_normal(C)).astype(f32), (0.1 * rng.standard_normal(C)).astype(f32)
    w_q, w_k, w_v = (rng.standard_normal((C, C)).astype(f32) for _ in range(3))
    wte, wpe = rng.standard_normal((V, C)).astype(f32), rng.standard_normal((T, C)).astype(f32)
    tokens = np.array([1, 2, 3, 4, 7, 0], np.int32)
    q, K, Vc, x = (cuda.to_device(np.full(s, np.nan, f32)) for s in ((C,), (T, C), (T, C), (C,)))
    kd.decode_qkv(q, K, Vc, cuda.to_device(np.array([t], np.int32)), x, g, b, 1e-5, w_q, w_k, w_v,
                  cuda.to_device(tokens), wte, wpe, True, block=block)
    x_want = wte[7].astype(np.float64) + wpe[t]
    assert _distance(x.copy_to_host(), x_want) <= TOL
    a = _layernorm(x_want, g, b)
    for got, want in ((q.copy_to_host(), a @ w_q), (K.copy_to_host()[t], a @ w_k), (Vc.copy_to_host()[t], a @ w_v)):
        assert _distance(got, want) <= TOL
    assert np.isnan(np.delete(K.copy_to_host(), t, axis=0)).all() and np.isnan(np.delete(Vc.copy_to_host(), t, axis=0)).all()
    w_1 = rng.standard_normal((C, 4 * C)).astype(f32)
    h = cuda.to_device(np.full(4 * C, np.nan, f32))
    kd.decode_mlp_up(h, x, g, b, 1e-5, w_1, block=block)
    z = a @ w_1
    assert _distance(h.copy_to_host(), 0.5 * z * (1 + np.tanh(np.sqrt(2 / np.pi) * (z + 0.044715 * z ** 3)))) <= TOL


def _attention(q, K, V, t, H):
    """y of one query against keys 0..t, per head, in float64."""
    C = q.shape[0]
    hs = C // H
    y = np.zeros(C)
    for h in range(H):
        c = slice(h * hs, (h + 1) * hs)
        s = K[:t + 1, c].astype(np.float64) @ q[c] / np.sqrt(hs)
        e = np.exp(s - s.max())
        y[c] = e @ V[:t + 1, c] / e.sum()
    return y


class _Attention:
    """decode_attention at H = 2, hs = 8, window T = 20, its scratch poisoned with NaN (a chunk past t
    that the merge read would show)."""
    H, C, T = 2, 16, 20

    def __init__(self, block, seed=0, launcher=None):
        rng = np.random.default_rng(seed)
        self.block, self.launcher = block, launcher
        self.q = rng.standard_normal(self.C).astype(f32)
        self.K, self.V = (rng.standard_normal((self.T, self.C)).astype(f32) for _ in range(2))
        nch = kd.cdiv(self.T, block[1])
        self.part = [cuda.to_device(np.full(s, np.nan, f32))
                     for s in ((self.H, nch), (self.H, nch), (self.H, nch, self.C // self.H))]
        self.done = cuda.to_device(np.zeros(self.H, np.int32))

    def run(self, t):
        y = cuda.to_device(np.full(self.C, np.nan, f32))
        (self.launcher or kd.decode_attention)(y, *self.part, self.done, self.q, self.K, self.V,
                                               cuda.to_device(np.array([t], np.int32)), block=self.block)
        assert not self.done.copy_to_host().any()             # every counter back to 0 for the next launch
        return y.copy_to_host()


def _rung_9_attention():
    from lab.decode import decode_attention_v9
    return decode_attention_v9


@pytest.mark.parametrize("block, rung", [((2, 4), 1), ((1, 8), 1), ((8, 2), 1), ((8, 8), 1), ((2, 4), 9), ((8, 2), 9)])
def test_attention_in_chunks_of_keys(block, rung):
    """Chunks of CK = block[1] keys: t inside the first chunk, at its last key, at the next chunk's
    first key, and on to the window's last position; the chunks past t are neither run nor read.
    The engine's (sums by shuffles), also at a block of two warps (8 x 8: the merge's maximum and
    sum across them), and lab/decode.py rung 9's (the trees it had before)."""
    att = _Attention(block, launcher=_rung_9_attention() if rung == 9 else None)
    ck = block[1]
    for t in sorted({0, ck // 2, ck - 1, ck, ck + 1, 2 * ck + 1, att.T - 1}):
        assert _distance(att.run(t), _attention(att.q, att.K, att.V, t, att.H)) <= TOL, t
        if t < ck:                                             # chunk 1 on has not run yet: still NaN
            assert np.isnan(att.part[0].copy_to_host()[:, 1:]).all()


@cuda.jit
def _k_arrival(order, ticket):
    """order[block] = how many blocks came before it."""
    if cuda.threadIdx.x == 0:
        order[cuda.blockIdx.x] = cuda.atomic.add(ticket, 0, 1)


class _Reversed:
    """numpy for the simulator's launch loop, its blocks in reverse order: the last block is block 0."""

    def __getattr__(self, name):
        return getattr(np, name)

    @staticmethod
    def ndindex(*shape):
        return reversed(list(np.ndindex(*shape)))


def test_the_merge_gives_the_same_bits_whichever_block_comes_last(monkeypatch):
    """The simulator runs a launch's blocks one after another, so the last to finish is the last
    launched: run once in order and once in reverse, where another block merges the chunks (and,
    in the decoder, computes the softmax): the same bits."""
    from numba.cuda.simulator import kernel as simkernel
    att = _Attention((2, 4))
    forward = att.run(13)
    m, params = _decoder_model()
    fwd = _decode(m, params, [5, 1, 4, 1, 5, 9])
    monkeypatch.setattr(simkernel, "np", _Reversed())
    order, ticket = cuda.to_device(np.zeros(4, np.int32)), cuda.to_device(np.zeros(1, np.int32))
    _k_arrival[4, 1](order, ticket)
    assert list(order.copy_to_host()) == [3, 2, 1, 0]            # (the reversal works: block 0 comes last)
    assert att.run(13).tobytes() == forward.tobytes()
    assert [r.tobytes() for r in _decode(m, params, [5, 1, 4, 1, 5, 9])] == [r.tobytes() for r in fwd]


def test_a_merge_that_forgets_the_chunks_weights_fails_the_comparison(monkeypatch):
    """A planted bug: the merge adds the chunks' sums without bringing them to the common maximum
    (w_p = 1). Inside the first chunk there is one chunk and nothing to bring (it passes); from the
    second chunk on the test above catches it."""
    monkeypatch.setattr(kd, "_chunk_weight", lambda m_p, big: np.float32(1.0))
    att = _Attention((2, 4))
    assert _distance(att.run(3), _attention(att.q, att.K, att.V, 3, att.H)) <= TOL
    assert min(_distance(att.run(t), _attention(att.q, att.K, att.V, t, att.H)) for t in (5, 9, 19)) > 100 * TOL


def _decoder_model():
    m = dataclasses.replace(load_config("tiny").model, n_layer=1)
    rng = np.random.default_rng(4)
    p = init_params(m, 4).astype(np.float64)
    return m, (p + rng.standard_normal(p.size) * 0.05).astype(np.float32)


def _decode(m, params, tokens):
    """The decoder's logits and probabilities at each position of tokens, fed one by one
    (test_decode_gpu._decode_each), in one flat list; the merge counters back at zero after."""
    pairs, dec = _decode_each(m, params, tokens)
    assert not dec.read("attn_done").any() and not dec.read("logits_done").any()
    return [row for pair in pairs for row in pair]


@pytest.mark.parametrize("launcher", ["decode_qkv", "decode_attention", "decode_matvec_add", "decode_mlp_up",
                                      "decode_logits"])
def test_the_decoders_step_at_every_block_a_launcher_declares(monkeypatch, launcher):
    """The step with one launcher at each of its other blocks (the others at their defaults), as
    lab/bench/decode_speed.py times them: the twin's logits at positions 0..5 (the attention
    chunks of the simulator's blocks: 4, 2 and 8 keys)."""
    m, params = _decoder_model()
    tokens = [3, 1, 4, 1, 5, 9]
    twin = KVCache(params.astype(np.float64), m)
    want = [twin.step(tok) for tok in tokens]
    base = getattr(kd, launcher)
    for block in base.blocks[1:]:
        monkeypatch.setattr(kd, launcher, lambda *args, _b=block, **kw: base(*args, block=_b, **kw))
        rows = _decode(m, params, tokens)
        for t in range(len(tokens)):
            assert _distance(rows[2 * t], want[t]) <= TOL, (block, t)


@pytest.mark.parametrize("version", [1, 2, 3, 5, 6, 7, 8, 9])
def test_every_rung_of_the_decoders_step_gives_the_twins_logits(monkeypatch, version):
    """The step with each rung's launchers (lab/decode.py VERSIONS: 1 the engine's, its sums as
    shared-memory trees, 2 by shuffles, 3 with attention in one block a head, 5 the products with
    128-bit loads, 6 those with their sums by shuffles, 7 the classifier's too, 8 rung 5's products
    with rung 7's classifier, 9 attention and the draw by trees; rung 4,
    the step in one launch, has a test of its own), as
    lab/bench/decode_speed.py --versions times them: the twin's logits at positions 0..5 (the merge
    counters back at 0 after)."""
    from lab.decode import VERSIONS
    m, params = _decoder_model()
    tokens = [2, 7, 1, 8, 2, 8]
    twin = KVCache(params.astype(np.float64), m)
    want = [twin.step(tok) for tok in tokens]
    for name, rungs in VERSIONS.items():
        monkeypatch.setattr(kd, name, rungs[version])
    rows = _decode(m, params, tokens)
    for t in range(len(tokens)):
        assert _distance(rows[2 * t], want[t]) <= TOL, t


@pytest.mark.parametrize("C, block", [(16, 64), (128, 32)])
def test_attention_in_one_block_a_head_rung_3(C, block):
    """lab/decode.py's decode_attention_v3 against float64 NumPy: two heads of 8 or 64 channels
    (the lanes' second channel), one or two warps, from t = 0 (one key) to the window's last
    position (warps with no key, then every warp with several)."""
    from lab.decode import decode_attention_v3
    H, T = 2, 20
    rng = np.random.default_rng(C)
    q = rng.standard_normal(C).astype(f32)
    K, V = (rng.standard_normal((T, C)).astype(f32) for _ in range(2))
    scratch = [cuda.to_device(np.zeros(s, f32)) for s in ((H, 1), (H, 1), (H, 1, C // H))]
    for t in (0, 1, 2, 7, T - 1):
        y = cuda.to_device(np.full(C, np.nan, f32))
        decode_attention_v3(y, *scratch, cuda.to_device(np.zeros(H, np.int32)), q, K, V,
                            cuda.to_device(np.array([t], np.int32)), block=block)
        assert _distance(y.copy_to_host(), _attention(q, K, V, t, H)) <= TOL, t


@pytest.mark.parametrize("block", [32, 64])
def test_rung_4_the_step_in_one_launch_gives_the_twins_logits_cache_and_probabilities(monkeypatch, block):
    """lab/decode_step.py: the whole step as one launch (one block in the simulator, its grid
    barriers the block's), two layers (the layer stride), positions 0..9 (chunks of 4 keys: one,
    two and three of them), one and two warps: the twin's logits and cache, the probabilities the
    softmax of the logits, and the barrier's count back at 0 after 5 L + 1 barriers a step."""
    import lab.decode_step as D
    m = dataclasses.replace(load_config("tiny").model, n_layer=2)
    rng = np.random.default_rng(5)
    params = (init_params(m, 5).astype(np.float64) + rng.standard_normal(init_params(m, 5).size) * 0.05).astype(f32)
    base = D.decode_step_v4
    monkeypatch.setattr(D, "decode_step_v4", lambda *args, **kw: base(*args, **{**kw, "block": block}))
    tokens = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3]
    twin = KVCache(params.astype(np.float64), m)
    dec = D.PersistentDecoder(m, cuda.to_device(params))
    dec.reset()
    for t in range(len(tokens)):
        dec.feed(tokens[:t + 1])
        want = twin.step(tokens[t])
        logits = dec.read("logits")
        assert _distance(logits, want) <= TOL, t
        e = np.exp(logits.astype(np.float64) - logits.max())
        assert np.abs(dec.read("probs") - e / e.sum()).max() <= 1e-6, t
    n = len(tokens)
    for name, cache in (("k_cache", twin.K), ("v_cache", twin.V)):
        assert _distance(dec.read(name)[:, :n], cache[:, :n]) <= TOL, name
    assert list(dec.bar.copy_to_host()) == [0, n * (5 * m.n_layer + 1)]


@pytest.mark.parametrize("K, N, block", [(13, 12, (1, 4)), (29, 8, (2, 2)), (7, 4, (1, 8)), (40, 16, (2, 4)),
                                         (70, 8, (1, 16))])
def test_rung_5_products_with_128_bit_loads_at_ragged_depths(K, N, block):
    """lab/decode.py rung 5's x += a @ w (4 columns a thread, a row one 128-bit load) at depths K
    that are not a multiple of 4 KS (rounds that run past the last row, which add nothing) and
    below 4 KS: every column to fp32 rounding, nothing past N written. A width that is not a
    multiple of 4 is refused."""
    from lab.decode import decode_matvec_add_v5
    rng = np.random.default_rng(K)
    a, w = rng.standard_normal(K).astype(f32), rng.standard_normal((K, N)).astype(f32)
    x0 = rng.standard_normal(N + 4).astype(f32)
    x = cuda.to_device(x0)
    decode_matvec_add_v5(x[:N], cuda.to_device(a), cuda.to_device(w), block=block)
    got = x.copy_to_host()
    want = x0[:N].astype(np.float64) + a.astype(np.float64) @ w.astype(np.float64)
    assert np.abs(got[:N] - want).max() <= TOL * np.abs(want).max()
    assert got[N:].tobytes() == x0[N:].tobytes()
    with pytest.raises(AssertionError, match="multiple of 4"):
        decode_matvec_add_v5(x[:N - 2], cuda.to_device(a), cuda.to_device(w[:, :N - 2].copy()), block=block)


@pytest.mark.parametrize("block", [(1, 64), (2, 32)])
def test_rung_6_sums_across_warps(block):
    """lab/decode.py rung 6 at blocks of two warps, which the tiny model's step cannot fill (C = 8):
    x += a @ w at K = 100 (every warp's slices hold rows), and mlp_up's h = gelu(LN(x) @ w_1) with
    C = 72 channels over the two warps (the LayerNorm's sums across them), against float64 NumPy."""
    from lab.decode import decode_matvec_add_v6, decode_mlp_up_v6
    from reference.layernorm import layernorm_fwd
    from reference.mlp import gelu
    rng = np.random.default_rng(6)
    K, N = 100, 8
    a, w = rng.standard_normal(K).astype(f32), rng.standard_normal((K, N)).astype(f32)
    x0 = rng.standard_normal(N).astype(f32)
    x = cuda.to_device(x0)
    decode_matvec_add_v6(x, cuda.to_device(a), cuda.to_device(w), block=block)
    want = x0.astype(np.float64) + a.astype(np.float64) @ w.astype(np.float64)
    assert np.abs(x.copy_to_host() - want).max() <= TOL * np.abs(want).max()
    C, F = 72, 16
    xs, g, b = (rng.standard_normal(C).astype(f32) for _ in range(3))
    w1 = rng.standard_normal((C, F)).astype(f32)
    h = cuda.to_device(np.zeros(F, f32))
    decode_mlp_up_v6(h, cuda.to_device(xs), cuda.to_device(g), cuda.to_device(b), 1e-5, cuda.to_device(w1),
                     block=block)
    ln = layernorm_fwd(xs.astype(np.float64)[None], g.astype(np.float64), b.astype(np.float64))[0][0]
    want = gelu(ln @ w1.astype(np.float64))
    assert np.abs(h.copy_to_host() - want).max() <= TOL * np.abs(want).max()


@pytest.mark.parametrize("rung", [5, 6, 7, 9])
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_rungs_5_to_9_at_every_block_they_declare_and_at_bf16(monkeypatch, precision, rung):
    """The step with rung 5's launchers (the products with 128-bit loads), rung 6's (the same, sums
    by shuffles), rung 7's (the classifier's sums by shuffles too) or rung 9's (attention by trees),
    each of the launchers the rung adds at every block it declares in turn (the others at their
    defaults), at fp32 and at bf16: the twin's logits at that precision, positions 0..5."""
    from lab.decode import VERSIONS
    m, params = _decoder_model()
    tokens = [3, 1, 4, 1, 5, 9]
    twin = KVCache(params.astype(np.float64), m, precision)
    want = [twin.step(tok) for tok in tokens]
    rung5 = {name: rungs[rung] for name, rungs in VERSIONS.items()}
    for name, f in rung5.items():
        monkeypatch.setattr(kd, name, f)
    added = {7: ("decode_logits",), 9: ("decode_attention",)}
    for name in added.get(rung, ("decode_qkv", "decode_matvec_add", "decode_mlp_up")):
        base = rung5[name]
        for block in base.blocks:
            monkeypatch.setattr(kd, name, lambda *args, _b=block, _f=base, **kw: _f(*args, block=_b, **kw))
            pairs, _ = _decode_each(m, params, tokens, precision)
            for t in range(len(tokens)):
                assert _distance(pairs[t][0], want[t]) <= TOL, (name, block, t)
        monkeypatch.setattr(kd, name, base)
