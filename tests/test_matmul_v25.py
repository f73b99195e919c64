"""matmul v25, matmul_tf32x3_wgmma (kernels/split_wgmma.py): 3xTF32 on wgmma, each operand split into
big and small planes stored K-major by the threads, in the simulator (wgmma the NumPy twin there,
wgmma.wgmma_warpgroup_tf32: the same descriptors, each value truncated to TF32 as the tensor core
reads it).

The twin reads the kernel's planes through the PTX ISA's K-major layout (the word formula of the
tile and the descriptor's addresses are checked against each other); the products are held to an
error bound worked out from 3xTF32's parts, which a TF32-only product (the small planes dropped)
breaks; every transpose with edges in M, N and K, accumulate, split K and a bit-identical rerun.
Harness rows (tests/test_kernels.py) check it against the twin as every other rung.
"""
import numpy as np
import pytest
from numba import cuda

from andrea_numba.kernels import matmul as MM
from andrea_numba.kernels import split_wgmma as SW
from andrea_numba.kernels.common import SIMULATOR
from andrea_numba.kernels.wgmma import (SWIZZLE_128B, pack_desc, tf32_truncate, wgmma_warpgroup_tf32,
                                        fragment_to_matrix)
from lab import matmul as lab_matmul

sim_only = pytest.mark.skipif(not SIMULATOR, reason="the simulator's twins (NUMBA_ENABLE_CUDASIM=1)")
SMALL, WIDE = MM.SPLIT_WGMMA_TILES["sim"]            # (64, 32, 32, 64, 32), (64, 64, 32, 64, 64)
EPS = 2.0 ** -24                                       # fp32's unit roundoff


@sim_only
def test_v25_is_the_ladders_rung_25_with_two_stages_of_four_planes():
    assert lab_matmul.VERSIONS["matmul"][25] is MM.matmul_tf32x3_wgmma
    assert MM.TILE_FAMILIES["tf32x3_wgmma"].rung == 25
    for block in MM.SPLIT_WGMMA_TILES["gpu"] + MM.SPLIT_WGMMA_TILES["sim"]:
        t = SW.make_split_tile(SW.split_resolve(block, None, None))
        assert t.THREADS == 128 * (block[0] // 64)
        assert t.SHARED == SW.STAGES * 2 * (block[0] + block[1]) * 128 + 1024 <= 227 * 1024
    with pytest.raises(AssertionError):                 # warpgroups of 64 rows
        SW.make_split_tile(("tf32x3_wgmma", 96, 64, 32, 64, 64, False, 3))


def _plane(x):
    """The words of a plane holding x [R, 32] (rows r, k along them) at SW.plane_word(r, k)."""
    R = x.shape[0]
    out = np.full(R * 32, np.nan, np.float32)
    for r in range(R):
        for k in range(32):
            out[SW.plane_word(r, k)] = x[r, k]
    return out


@sim_only
def test_the_twin_reads_the_planes_back_step_by_step_truncated_to_tf32():
    """An A plane (64 rows) and a B plane (24 rows) at the tile's word formula; each k8 step's
    descriptors as tile_mma builds them read back A[:, 8 ks : 8 ks + 8] @ B^T, every value with its
    low 13 bits dropped (values with those bits set, so rounding instead of truncating would show)."""
    rng = np.random.default_rng(0)
    a = (rng.standard_normal((64, 32)) * (1 + 2.0 ** -12)).astype(np.float32)
    bt = (rng.standard_normal((24, 32)) * (1 + 2.0 ** -12)).astype(np.float32)
    assert (a.view(np.uint32) & 0x1FFF).any()
    image = np.concatenate([_plane(a), _plane(bt)])
    b_at = 64 * 32 * 4                                  # bytes: B's plane after A's (8 KiB, 1024-aligned)
    for ks in range(SW.KSTEPS):
        desc_a = pack_desc(32 * ks, SW.LBO, SW.SBO, SWIZZLE_128B)
        desc_b = pack_desc(b_at + 32 * ks, SW.LBO, SW.SBO, SWIZZLE_128B)
        got = fragment_to_matrix(wgmma_warpgroup_tf32(image, desc_a, desc_b, 24))
        k = slice(8 * ks, 8 * ks + 8)
        want = (tf32_truncate(a[:, k]) @ tf32_truncate(bt[:, k]).T).astype(np.float32)
        np.testing.assert_array_equal(got, want)
    # the same words without the swizzle are another matrix
    flat = np.concatenate([a.reshape(-1), bt.reshape(-1)])
    got = fragment_to_matrix(wgmma_warpgroup_tf32(flat, pack_desc(0, SW.LBO, SW.SBO, SWIZZLE_128B),
                                                  pack_desc(b_at, SW.LBO, SW.SBO, SWIZZLE_128B), 24))
    assert not np.allclose(got, tf32_truncate(a[:, :8]) @ tf32_truncate(bt[:, :8]).T, atol=1e-3)


@sim_only
def test_split_gives_a_tf32_big_part_and_an_exact_remainder():
    x = np.float32(1.0) + np.float32(2.0 ** -11) + np.float32(2.0 ** -20)
    big, small = SW.split(x)
    assert big.view(np.uint32) & 0x1FFF == 0 and np.float32(big + small) == x and big == np.float32(1 + 2.0 ** -10)


def _bound(A, B, K, out0=None):
    """Elementwise bound on |out - A @ B|: each product term a b is off by at most 2 2^-21 |a b| (the
    truncated small parts: 10 bits kept of a value below 2^-11 |a|) + 2^-22 |a b| (small*small left
    out), and 3 K fp32 additions add at most 3 K eps |a| |b| over the row; an accumulated out0 one
    rounding more."""
    bound = (2 * 2.0 ** -21 + 2.0 ** -22 + 3 * K * EPS) * (np.abs(A) @ np.abs(B))
    return bound if out0 is None else bound + EPS * (np.abs(out0) + np.abs(A @ B))


def _product(a, b, trans_a, trans_b, out0, accumulate, block, work=None, launch=MM.matmul_tf32x3_wgmma):
    """out0 (+)= op(a) @ op(b) by `launch` (v25, or a rung on its tiles), on the host."""
    d_out = cuda.to_device(out0.copy())
    launch(d_out, None if work is None else cuda.to_device(work), cuda.to_device(a), cuda.to_device(b),
           trans_a, trans_b, accumulate, block=block)
    return d_out.copy_to_host()


@sim_only
@pytest.mark.parametrize("trans_a, trans_b, block", [(False, False, SMALL), (False, True, WIDE),
                                                       (True, False, WIDE), (True, True, SMALL)])
def test_every_transpose_is_within_the_3xtf32_bound_and_a_tf32_product_is_not(trans_a, trans_b, block):
    """M, N and K off the tile (70 x 40 x 45: a second block row, a part tile, a part last stage),
    out accumulated for the weight-gradient form. (A rerun's bits: the harness's rows.)"""
    M, N, K = 70, 40, 45
    rng = np.random.default_rng(1)
    a = rng.standard_normal((K, M) if trans_a else (M, K)).astype(np.float32)
    b = rng.standard_normal((N, K) if trans_b else (K, N)).astype(np.float32)
    A, B = (a.T if trans_a else a).astype(np.float64), (b.T if trans_b else b).astype(np.float64)
    out0 = rng.standard_normal((M, N)).astype(np.float32)
    accumulate = trans_a
    got = _product(a, b, trans_a, trans_b, out0, accumulate, block)
    want = A @ B + (out0 if accumulate else 0)
    bound = _bound(A, B, K, out0 if accumulate else None)
    assert (np.abs(got - want) <= bound).all(), np.max(np.abs(got - want) / bound)
    tf32_only = tf32_truncate(A.astype(np.float32)) @ tf32_truncate(B.astype(np.float32)) + (out0 if accumulate else 0)
    assert (np.abs(tf32_only - want) > bound).any()     # the bound catches a product without the small planes


@sim_only
def test_split_k_slices_are_added_in_order_within_the_bound():
    """A weight gradient with K = 256 rows: the launcher cuts K into slices (S > 1) whose partial
    tiles k_splitk_sum adds; the result keeps the bound and reruns to the same bits."""
    M, N, K = 64, 32, 256
    rng = np.random.default_rng(2)
    a, b = rng.standard_normal((K, M)).astype(np.float32), rng.standard_normal((K, N)).astype(np.float32)
    out0 = rng.standard_normal((M, N)).astype(np.float32)
    work = np.zeros(8 * M * N, np.float32)
    S, _ = MM.splitk(M, N, K, 1, SMALL, work)
    assert S > 1
    got = _product(a, b, True, False, out0, True, SMALL, work)
    A, B = a.T.astype(np.float64), b.astype(np.float64)
    assert (np.abs(got - (A @ B + out0)) <= _bound(A, B, K, out0)).all()
    np.testing.assert_array_equal(got, _product(a, b, True, False, out0, True, SMALL, work))


@pytest.mark.skipif(SIMULATOR, reason="the tensor core's own sums: a GPU with wgmma (NUMBA_ENABLE_CUDASIM=0)")
def test_on_the_gpu_a_deep_product_of_positive_values_keeps_fp32s_error():
    """On the tensor core, not its twin: 256 x 256 x 4096 of values in [0, 1) (no cancellation, so a
    sum that drops bits drifts one way). fp32 sums rounded to nearest stay within the probabilistic
    bound 4 sqrt(3 K) eps of the product (Higham and Mary's, lambda = 4); sums chained through the
    tensor core over all of K, which keeps fewer bits, were off by about 3e-5 on an H100."""
    M = N = 256
    K = 4096
    rng = np.random.default_rng(3)
    a, b = rng.random((M, K), np.float32), rng.random((K, N), np.float32)
    got = _product(a, b, False, False, np.zeros((M, N), np.float32), False, MM.matmul_tf32x3_wgmma.blocks[0])
    want = a.astype(np.float64) @ b.astype(np.float64)
    assert np.max(np.abs(got - want) / want) <= 4 * np.sqrt(3 * K) * EPS
