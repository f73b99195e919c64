"""The embedding backward v3, v4 and v5 (kernels/embed.py): each chunk of positions sorted by token, then
each token's runs summed in position order (v4: a thread per channel, more loads in flight; v5: the runs' bounds found once a block). All
must give v2's bits (the same sums in the same order)
on the token streams that made v2 slow and on the edge cases of the chunks: one token in most
positions (as the space in text), every position the same token (runs longer than the unrolled
step), a token whose first position is not in the first chunk, a last chunk shorter than the
others, a single position. Checked against the float64 twin as well, and repeated bit for bit."""
import numpy as np
import pytest
from numba import cuda

from andrea_numba.kernels import embed
from lab import embed as lab_embed
from reference import embed as R

S = embed.SORT_CHUNK


def _tokens(kind, B, T, V, rng):
    if kind == "common":                # one token in 40% of the positions, the others spread
        return np.where(rng.random((B, T)) < 0.4, V // 2, rng.integers(0, V, (B, T)))
    if kind == "one":                   # a single token everywhere: runs of S positions
        return np.full((B, T), 3)
    if kind == "late":                  # tokens that first appear in the last chunk
        t = rng.integers(0, 2, (B, T))
        t.reshape(-1)[-2:] = [V - 1, V - 2]
        return t
    return rng.integers(0, V, (B, T))


def _run(version, dwte0, dout, tokens, V, T_max):
    B, T, C = dout.shape
    dwte, dwpe = cuda.to_device(dwte0), cuda.to_device(np.zeros((T_max, C), np.float32))
    links = cuda.to_device(np.full((2, B * T), -7, np.int32))          # poisoned, as the harness does
    lab_embed.VERSIONS["embed_bwd"][version](dwte, dwpe, links, cuda.to_device(dout), cuda.to_device(tokens), V, T_max)
    cuda.synchronize()
    return dwte.copy_to_host(), dwpe.copy_to_host()


@pytest.mark.parametrize("kind,B,T,C,V", [
    ("common", 2, 16, 8, 64),           # 4 chunks in the simulator, 1 on a GPU
    ("one", 3, 8, 5, 7),                # every run as long as a chunk
    ("late", 2, 11, 4, 9),              # a last chunk of 6 positions (simulator: S = 8)
    ("spread", 1, 1, 3, 5),             # a single position
    ("common", 2, 40, 3, 16),           # simulator: 10 chunks, more than v5's 4 threads a block
])
@pytest.mark.parametrize("version", [3, 4, 5])
def test_sorted_versions_give_v2s_bits_and_the_twins_sums(version, kind, B, T, C, V):
    rng = np.random.default_rng(len(kind) + B * T)
    tokens = _tokens(kind, B, T, V, rng).astype(np.int32)
    dout = rng.standard_normal((B, T, C)).astype(np.float32)
    dwte0 = rng.standard_normal((V, C)).astype(np.float32)              # += into what is there
    v2, v3 = _run(2, dwte0, dout, tokens, V, T + 1), _run(version, dwte0, dout, tokens, V, T + 1)
    assert v3[0].tobytes() == v2[0].tobytes() and v3[1].tobytes() == v2[1].tobytes()
    assert v3[0].tobytes() == _run(version, dwte0, dout, tokens, V, T + 1)[0].tobytes()
    ref_dwte, ref_dwpe = R.embed_bwd(dout.astype(np.float64), tokens, V, T + 1)
    np.testing.assert_allclose(v3[0] - dwte0.astype(np.float64), ref_dwte, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(v3[1], ref_dwpe, rtol=1e-5, atol=1e-5)
    absent = np.setdiff1d(np.arange(V), tokens)
    assert v3[0][absent].tobytes() == dwte0[absent].tobytes()           # rows of absent tokens untouched


def test_the_sort_puts_each_chunk_in_token_then_position_order():
    rng = np.random.default_rng(5)
    N = 3 * S + 2
    tokens = rng.integers(0, 4, N).astype(np.int32)
    order = cuda.to_device(np.full(N, -7, np.int32))
    embed.k_embed_bwd_sort[embed.cdiv(N, S), S // 2](order, cuda.to_device(tokens))
    got = order.copy_to_host()
    for p in range(embed.cdiv(N, S)):
        local = np.arange(min(S, N - p * S))
        want = np.sort(tokens[p * S + local] * S + local)
        assert got[p * S: p * S + len(local)].tolist() == want.tolist()
