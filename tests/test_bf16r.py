"""Products "bf16r": matmul v16 routes each product to
v15 (wgmma) or v13 (mma.sync); the loss's two-pass softmax (k_loss_fwd_online) and its dlogits written
in bf16 (k_loss_bwd_bf16); the MLP's GELU' pass writing bf16 (k_gelu_bwd_bf16); gradients rounded once
for two products (cublaslt.HELD). The harness (tests/test_kernels.py) checks every new launcher
against the twin; these tests check the claims that make them the same math as before: the bits
that reach the products are the ones a per-product copy would have made."""
import math

import numpy as np
import pytest
from numba import cuda

from andrea_numba.kernels import attn_out, cublaslt, loss, mlp
from lab import mlp as lab_mlp
from lab import attn_out as lab_attn_out
from lab import matmul as MM
from andrea_numba.kernels.common import SIMULATOR
from reference.precision import round_bf16

pytestmark = pytest.mark.skipif(not SIMULATOR, reason="the simulator's twins (NUMBA_ENABLE_CUDASIM=1)")


def _bits(x):
    """bf16 bit patterns (uint16) of float32 values, ties to even."""
    return (round_bf16(np.asarray(x, np.float32)).view(np.uint32) >> 16).astype(np.uint16)


@pytest.mark.parametrize("V", [72, 70])          # 72: four values a thread (wide); 70: one at a time
def test_loss_fwd_v2_is_v1s_softmax_in_two_passes(V):
    """Probabilities and losses within float32 rounding of v1's three-pass softmax, a -inf logit
    (probability 0) included; the picked logit is read before the row is overwritten."""
    rng = np.random.default_rng(7)
    N = 3
    logits = (4 * rng.standard_normal((N, V))).astype(np.float32)
    logits[1, 5] = -np.inf
    targets = rng.integers(0, V, N).astype(np.int32)
    out = {}
    for name, kernel, extra in (("v1", loss.k_loss_fwd, ()), ("v2", loss.k_loss_fwd_online, (V % 4 == 0,))):
        probs, losses = cuda.to_device(logits), cuda.device_array(N, np.float32)
        kernel[N, 4](losses, probs, cuda.to_device(targets), *extra)
        out[name] = probs.copy_to_host(), losses.copy_to_host()
    assert loss.wide_rows(cuda.to_device(logits)) == (V % 4 == 0)
    np.testing.assert_allclose(out["v2"][0], out["v1"][0], rtol=2e-6, atol=1e-9)
    np.testing.assert_allclose(out["v2"][1], out["v1"][1], rtol=2e-6)
    assert out["v2"][0][1, 5] == 0.0 and np.allclose(out["v2"][0].sum(axis=1), 1, rtol=1e-6)
    lse = np.log(np.exp(logits.astype(np.float64)).sum(axis=1))
    np.testing.assert_allclose(out["v2"][1], lse - logits[np.arange(N), targets], rtol=1e-5)


@pytest.mark.parametrize("V", [72, 70])
def test_loss_bwd_v2_writes_the_bits_a_copy_of_v1s_dlogits_would_hold(V):
    """k_loss_bwd_bf16's bf16 dlogits are bit for bit the ties-to-even rounding of k_loss_bwd's fp32
    ones: the products see the same operand as loss_bwd v12's copy gave them."""
    rng = np.random.default_rng(8)
    N = 3
    probs = rng.dirichlet(np.ones(V), N).astype(np.float32)
    targets = rng.integers(0, V, N).astype(np.int32)
    scale = np.float32(1.0 / 3.0)
    d32 = cuda.device_array((N, V), np.float32)
    loss.k_loss_bwd[N, 4](d32, cuda.to_device(probs), cuda.to_device(targets), scale)
    d16 = cuda.to_device(np.zeros((N, V), np.uint16))
    words = d16.reshape(N * V).view(np.int32).reshape(N, V // 2)
    loss.k_loss_bwd_bf16[N, 4](d16, words, cuda.to_device(probs), cuda.to_device(targets), scale, V % 4 == 0)
    assert np.array_equal(d16.copy_to_host(), _bits(d32.copy_to_host()))


def test_gelu_bwd_v3_writes_the_bits_of_v2s_result_rounded():
    rng = np.random.default_rng(9)
    n = 64
    dh, h_pre = (rng.standard_normal(n).astype(np.float32) for _ in range(2))
    ref = cuda.to_device(dh)
    mlp.gelu_bwd_vec4(ref, cuda.to_device(h_pre), 0)
    dh16 = cuda.to_device(np.zeros(n, np.uint16))
    mlp.gelu_bwd_bf16(dh16, cuda.to_device(dh), cuda.to_device(h_pre), 0)
    assert np.array_equal(dh16.copy_to_host(), _bits(ref.copy_to_host()))


def test_matmul_v16_is_v15_for_a_and_v13_for_a_transposed():
    """Bit for bit: v15 (at v16's tile) where op(a) = a, v13 (its default tile) where op(a) = a^T."""
    rng = np.random.default_rng(16)
    M, N, K = 20, 12, 40
    block = MM.matmul_v16.blocks[0]
    for ta, tb in ((False, False), (False, True), (True, False)):
        a = rng.standard_normal((K, M) if ta else (M, K)).astype(np.float32)
        b = rng.standard_normal((N, K) if tb else (K, N)).astype(np.float32)
        outs = []
        for launch, kw in ((MM.matmul_v16, {"block": block}),
                           (MM.matmul_bf16 if ta else MM.matmul_v15, {} if ta else {"block": block})):
            out = cuda.to_device(np.full((M, N), np.nan, np.float32))
            launch(out, None, cuda.to_device(a), cuda.to_device(b), ta, tb, **kw)
            outs.append(out.copy_to_host())
        assert np.array_equal(outs[0].view(np.uint32), outs[1].view(np.uint32)), (ta, tb)
        assert np.isfinite(outs[0]).all()


def _dev(rng, *shape):
    return cuda.to_device(rng.standard_normal(shape).astype(np.float32) * 0.5)


def test_rounding_a_gradient_once_changes_no_bit():
    """attn_out v13 and mlp v17 round dout (and the MLP's dh_pre) once into cublaslt.HELD for two
    products; the same products each rounding their own copy give the same bits."""
    rng = np.random.default_rng(17)
    N, C = 16, 8
    F = 4 * C
    mm = MM.matmul_v16
    dout, y, w_o = _dev(rng, N, C), _dev(rng, N, C), _dev(rng, C, C)
    runs = []
    for held in (True, False):
        dy, dw_o = cuda.to_device(np.zeros((N, C), np.float32)), cuda.to_device(np.zeros((C, C), np.float32))
        if held:
            lab_attn_out.attn_out_bwd_v13(dy, dw_o, None, dout, y, w_o)
        else:
            mm(dy, None, dout, w_o, trans_b=True, block=lab_attn_out.attn_out_bwd_v13.blocks[0])
            mm(dw_o, None, y, dout, trans_a=True, accumulate=True)
        runs.append(np.concatenate([dy.copy_to_host().ravel(), dw_o.copy_to_host().ravel()]))
    assert np.array_equal(runs[0].view(np.uint32), runs[1].view(np.uint32))

    x, h_pre, h, w_1, w_2, dout = _dev(rng, N, C), _dev(rng, N, F), _dev(rng, N, F), _dev(rng, C, F), \
        _dev(rng, F, C), _dev(rng, N, C)
    runs = []
    for held in (True, False):
        dx, dw_1, dw_2 = (cuda.to_device(np.zeros(s, np.float32)) for s in ((N, C), (C, F), (F, C)))
        dh_pre = cuda.device_array((N, F), np.float32)
        args = (dx, dw_1, dw_2, dh_pre, None, dout, x, h_pre, h, w_1, w_2)
        if held:
            lab_mlp.mlp_bwd_v17(*args)
        else:                                   # v16's order of products, each rounding its own copies
            mlp._bwd_split(MM.matmul_v16, *args, lab_mlp.mlp_bwd_v17.blocks[0], 0, mlp.gelu_bwd_vec4)
        runs.append(np.concatenate([a.copy_to_host().ravel() for a in (dx, dw_1, dw_2)]))
    assert np.array_equal(runs[0].view(np.uint32), runs[1].view(np.uint32))
    assert cublaslt.HELD.buf is not None and cublaslt.HELD.buf.dtype == np.uint16


def test_bf16_runs_wgmma_only_on_a_hopper(monkeypatch):
    """--precision bf16 runs the recipe bf16-hopper (matmul v18, weights from params16, operands
    written in bf16 by the ops) where wgmma runs (compute capability 9.0, or the simulator's twin),
    and bf16-ampere (mma.sync, the same math) on any other GPU, where sm_90a code would not load."""
    from andrea_numba import recipes
    name = lambda *a, **k: recipes.recipe_for(*a, **k).name
    assert name("bf16") == "bf16-hopper" and name("fp16") == "fp16" and name("bf16", hopper=False) == "bf16-ampere"
    monkeypatch.setattr(recipes, "hopper_here", lambda: False)
    assert name("bf16") == "bf16-ampere" and name("fp32") == "fp32"
    assert name("bf16", "cublas") == "cublas-bf16" and name("fp8-all", "cublas") == "cublas-fp8-all"
