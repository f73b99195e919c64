"""loss_fwd v18 and loss_bwd v16 (kernels/loss.py): the softmax is not written. With stats, the forward
leaves the logits in probs and saves each row's maximum M and sum se = sum exp(x - M) (k_loss_fwd_stats);
the backward recomputes p = exp(x - M) / se from the logits (k_loss_bwd_from_stats). The operations are
k_loss_fwd_rows's on the same values, so everything is bit for bit loss_fwd v17 + loss_bwd v15's: the
losses and the loss, the bf16 dlogits the backward leaves in the operand scratch (cublaslt.COPIES),
dx, and dwte (+=, prefilled), with dloss not 1. Without stats both are v17 / v15 (the harness's
call); where the rows are not whole 16-byte chunks (V % 4 != 0) both fall back to them with stats.

In the simulator (each thread a Python thread): N = 6 rows, C = 8, V = 64 (four values a thread) and
V = 62 (the fallback); a row whose target is its largest logit, one where it is the smallest. The
sum's order is replayed in NumPy to check se itself (each thread's values in order, then the tree).
bf16 dlogits show only a value's top 16 bits (an fp32 p one ulp off rarely changes them), so one test
also reads the fp32 (p - onehot) * scale before its rounding (bf16x2 made to hand back fp32 bits), at
scale = 1/8, where p's every bit shows."""
import math

import numpy as np
import pytest
from numba import cuda

from andrea_numba import recipes
from andrea_numba.kernels import cublaslt, loss
from lab import loss as lab_loss
from andrea_numba.kernels import matmul as MM
from andrea_numba.kernels.common import SIMULATOR

pytestmark = pytest.mark.skipif(not SIMULATOR, reason="the simulator's twins (NUMBA_ENABLE_CUDASIM=1)")

N, C = 6, 8
f32 = np.float32


def _logits(x, wte):
    """The bf16t product alone: logits = x @ wte^T, the values v17 and v18 start their softmax from."""
    out = cuda.device_array((N, wte.shape[0]), f32)
    MM.matmul_bf16_wgmma(out, None, cuda.to_device(x), cuda.to_device(wte), trans_b=True)
    return out.copy_to_host()


def _inputs(V, seed=18):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((N, C)).astype(f32)
    wte = (0.7 * rng.standard_normal((V, C))).astype(f32)
    logits = _logits(x, wte)
    targets = rng.integers(0, V, N).astype(np.int32)
    targets[0] = logits[0].argmax()                   # the target is the row's maximum
    targets[1] = logits[1].argmin()                   # ... its minimum
    assert logits[2, targets[2]] < logits[2].max()
    return x, wte, targets, logits


def _forward(version, x, wte, targets, block, stats=None):
    V = wte.shape[0]
    out = {"loss": cuda.device_array(1, f32), "losses": cuda.device_array(N, f32),
           "probs": cuda.to_device(np.full((N, V), np.nan, f32))}
    extra = {} if stats is None else {"stats": stats}
    lab_loss.VERSIONS["loss_fwd"][version](out["loss"], out["losses"], out["probs"], cuda.to_device(x), cuda.to_device(wte),
                                       cuda.to_device(targets), block=block, **extra)
    return out


def _backward(version, fwd, x, wte, targets, dwte0, block, stats=None, dloss=0.5):
    """dx, dwte (+= onto dwte0) and the bf16 dlogits left in COPIES' first slot."""
    V = wte.shape[0]
    dx, dwte = cuda.to_device(np.full((N, C), np.nan, f32)), cuda.to_device(dwte0)
    work = cuda.to_device(np.full(MM.splitk_work(C, N), np.nan, f32))
    extra = {} if stats is None else {"stats": stats}
    lab_loss.VERSIONS["loss_bwd"][version](dx, dwte, None, work, dloss, cuda.to_device(x), cuda.to_device(wte), fwd["probs"],
                                       cuda.to_device(targets), block=block, **extra)
    return dx.copy_to_host(), dwte.copy_to_host(), cublaslt.COPIES.first(N, V).copy_to_host()


def _se_in_order(logits, M, T):
    """k_loss_fwd_rows's sum, replayed: thread t holds x[4 (t + q T) .. + 3] for q < NQ (past the row's
    end: exp(-inf) = 0), adds its e = exp(x - M) in that order, then block_sum's tree over the T."""
    V = logits.shape[0]
    NQ = math.ceil(V / (4 * T))
    part = []
    for t in range(T):
        s = f32(0.0)
        for q in range(NQ):
            for k in range(4):
                j = 4 * (t + q * T) + k
                if j < V:                                   # (4 | V: a chunk is in the row or past it)
                    s = f32(s + f32(math.exp(f32(logits[j] - M))))
        part.append(s)
    step = T // 2
    while step:
        part = [f32(part[i] + part[i + step]) for i in range(step)] + part[step:]
        step //= 2
    return part[0]


def _bits(a):
    return np.asarray(a, f32).view(np.uint32)


@pytest.mark.parametrize("fwd_block, bwd_block", [(4, 4), (8, 2)])
def test_stats_give_v17_and_v15s_bits_with_the_logits_kept(fwd_block, bwd_block):
    V = 64
    x, wte, targets, logits = _inputs(V)
    assert loss.wide_rows(cuda.to_device(logits))
    stats = cuda.to_device(np.full((2, N), np.nan, f32))
    v17 = _forward(17, x, wte, targets, fwd_block)
    v18 = _forward(18, x, wte, targets, fwd_block, stats)
    # (a) the loss and losses are v17's; probs keeps the logits; stats = (M, se)
    assert _bits(v18["loss"].copy_to_host()) == _bits(v17["loss"].copy_to_host())
    assert np.array_equal(_bits(v18["losses"].copy_to_host()), _bits(v17["losses"].copy_to_host()))
    assert np.array_equal(_bits(v18["probs"].copy_to_host()), _bits(logits))
    M, se = stats.copy_to_host()
    assert np.array_equal(_bits(M), _bits(logits.max(axis=1)))
    assert np.array_equal(_bits(se), _bits([_se_in_order(logits[n], M[n], fwd_block) for n in range(N)]))
    np.testing.assert_allclose(se, np.exp(logits.astype(np.float64) - M[:, None]).sum(axis=1), rtol=1e-6)
    # v17's softmax is exp(x - M) / se with these M and se (the value v16 recomputes)
    e = np.array([[f32(math.exp(f32(v - M[n]))) for v in logits[n]] for n in range(N)], f32)
    assert np.array_equal(_bits(v17["probs"].copy_to_host()), _bits(e / se[:, None]))
    # (b), (c): v16 after v18 gives v15-after-v17's dlogits (bf16), dx and dwte (+=), dloss = 0.5
    dwte0 = np.random.default_rng(3).standard_normal((V, C)).astype(f32)
    dx15, dwte15, d15 = _backward(15, v17, x, wte, targets, dwte0, bwd_block)
    dx16, dwte16, d16 = _backward(16, v18, x, wte, targets, dwte0, bwd_block, stats)
    assert np.array_equal(d16, d15)
    assert np.array_equal(_bits(dx16), _bits(dx15)) and np.array_equal(_bits(dwte16), _bits(dwte15))
    assert not np.array_equal(dwte16, dwte0) and np.isfinite(dx16).all()
    assert np.array_equal(_bits(v18["probs"].copy_to_host()), _bits(logits))     # the backward reads, never writes, them


def test_the_scalar_path_of_the_backward_gives_the_wide_ones_bits():
    """k_loss_bwd_from_stats one value a thread (wide False: an unaligned d16 on a GPU) writes the same bf16
    dlogits as four a thread, and as k_loss_bwd_bf16 from v3's softmax."""
    V = 64
    x, wte, targets, logits = _inputs(V, seed=5)
    stats = cuda.to_device(np.zeros((2, N), f32))
    v18 = _forward(18, x, wte, targets, 4, stats)
    v17 = _forward(17, x, wte, targets, 4)
    scale = f32(0.5 / N)
    got = []
    for kernel, src, extra, wide in ((loss.k_loss_bwd_from_stats, v18, (stats,), True), (loss.k_loss_bwd_from_stats, v18, (stats,), False),
                                     (loss.k_loss_bwd_bf16, v17, (), True)):
        d16 = cuda.to_device(np.zeros((N, V), np.uint16))
        words = d16.reshape(N * V).view(np.int32).reshape(N, V // 2)
        kernel[N, 4](d16, words, src["probs"], *extra, cuda.to_device(targets), scale, wide)
        got.append(d16.copy_to_host())
    assert np.array_equal(got[0], got[1]) and np.array_equal(got[0], got[2])
    assert (got[0] != 0).all()


def _fp32_dlogits(monkeypatch, kernel, probs, extra, targets, scale, wide):
    """The fp32 values (p - onehot) * scale that the kernel rounds to bf16, recovered whole: bf16x2 (a
    module global, looked up as the simulator runs the kernel) is made to hand back the fp32 bits of
    one of its two values (wide: lo, then hi, each run's words holding every other value) or half of
    them (one value a thread: d16 keeps 16 bits, the low, then the high half)."""
    V = probs.shape[1]
    runs = []
    for part in range(2):
        if wide:
            probe = lambda lo, hi, part=part: np.array([lo, hi][part], f32).view(np.int32)   # noqa: E731
        else:
            probe = lambda lo, hi, part=part: np.array(lo, f32).view(np.int32) >> (16 * part)  # noqa: E731
        monkeypatch.setattr(loss, "bf16x2", probe)
        d16 = cuda.to_device(np.zeros((N, V), np.uint16))
        words = d16.reshape(N * V).view(np.int32).reshape(N, V // 2)
        kernel[N, 4](d16, words, probs, *extra, cuda.to_device(targets), scale, wide)
        runs.append(d16.copy_to_host())
    monkeypatch.undo()
    if wide:
        a, b = (r.view(np.uint32) for r in runs)              # [N, V/2]: values 4i, 4i + 2 | 4i + 1, 4i + 3
        out = np.empty((N, V), np.uint32)
        out[:, 0::4], out[:, 2::4], out[:, 1::4], out[:, 3::4] = a[:, 0::2], a[:, 1::2], b[:, 0::2], b[:, 1::2]
        return out
    return runs[0].astype(np.uint32) | (runs[1].astype(np.uint32) << 16)


@pytest.mark.parametrize("wide", [True, False])
def test_the_backward_recomputes_v3s_fp32_softmax_bit_for_bit(monkeypatch, wide):
    """bf16 hides all but a value's top 16 bits: here k_loss_bwd_from_stats's fp32 (p - onehot) * scale, before
    the rounding, against k_loss_bwd_bf16's from v17's probs (and NumPy's from them). scale = 0.75 / 6 =
    1/8, a power of two: the products are exact, so p's every bit shows."""
    V = 64
    x, wte, targets, _ = _inputs(V, seed=7)
    stats = cuda.to_device(np.zeros((2, N), f32))
    v18, v17 = _forward(18, x, wte, targets, 4, stats), _forward(17, x, wte, targets, 4)
    scale = f32(0.75 / N)
    assert scale == f32(0.125)
    got = _fp32_dlogits(monkeypatch, loss.k_loss_bwd_from_stats, v18["probs"], (stats,), targets, scale, wide)
    want = _fp32_dlogits(monkeypatch, loss.k_loss_bwd_bf16, v17["probs"], (), targets, scale, wide)
    p = v17["probs"].copy_to_host()
    p[np.arange(N), targets] -= f32(1.0)
    assert np.array_equal(want, _bits(p * scale))
    assert np.array_equal(got, want)


def test_without_stats_or_with_rows_not_whole_chunks_they_are_v17_and_v15():
    """V = 62: rows of 248 bytes, not whole 16-byte chunks; v18 / v16 with stats run v17's two-pass
    softmax and v15's kernel (stats neither written nor read), so the pair still agrees with v17 + v15.
    Without stats at V = 64: v17 and v15 (the agreement harness's call)."""
    for V, with_stats in ((62, True), (64, False)):
        x, wte, targets, _ = _inputs(V, seed=V)
        stats = cuda.to_device(np.full((2, N), 7.0, f32)) if with_stats else None
        v17, v18 = _forward(17, x, wte, targets, 4), _forward(18, x, wte, targets, 4, stats)
        for name in ("loss", "losses", "probs"):
            assert np.array_equal(_bits(v18[name].copy_to_host()), _bits(v17[name].copy_to_host())), (V, name)
        if with_stats:
            assert (stats.copy_to_host() == 7.0).all()
        dwte0 = np.ones((V, C), f32)
        want = _backward(15, v17, x, wte, targets, dwte0, 2)
        got = _backward(16, v18, x, wte, targets, dwte0, 2, stats)
        for a, b in zip(got, want):
            assert np.array_equal(a.view(np.uint8), b.view(np.uint8)), V


def test_stats_of_another_shape_are_refused():
    V = 64
    x, wte, targets, _ = _inputs(V)
    with pytest.raises(ValueError, match="stats must be float32"):
        _forward(18, x, wte, targets, 4, cuda.to_device(np.zeros((N, 2), f32)))


def test_registered_bf16_and_the_engine_unchanged():
    assert lab_loss.VERSIONS["loss_fwd"][18] is loss.loss_fwd_bf16_wgmma and lab_loss.VERSIONS["loss_bwd"][16] is loss.loss_bwd_bf16_wgmma
    assert loss.loss_fwd_bf16_wgmma.precision == loss.loss_bwd_bf16_wgmma.precision == "bf16"
    assert loss.loss_fwd_bf16_wgmma.blocks == loss.loss_fwd_bf16_wgmma_probs.blocks and loss.loss_bwd_bf16_wgmma.blocks == lab_loss.loss_bwd_v15.blocks
    assert recipes.get("fp32").kernels["loss"] == (loss.loss_fwd_tf32x3, loss.loss_bwd_tf32x3)
