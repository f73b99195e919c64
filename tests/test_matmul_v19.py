"""matmul v19 (lab/wgmma_tma.py, point 6): v18 whose kernel adds its split-K slices itself. The last
consumer warp of the S slices of a tile's cells (an integer counter a (tile, warp), counted after a
threadfence) sums them in k_splitk_sum's order, so the result is v18's bit for bit, and it sets its
counter back to 0, so the next launch (a CUDA graph's replay) starts clean. In the simulator the
warp's meeting (syncwarp, shfl) is a barrier of its 32 threads and the atomic add a locked one."""
import numpy as np
import pytest
from numba import cuda

from andrea_numba.kernels import matmul as MM
from lab import matmul as lab_matmul
from lab import wgmma_tma as lab_tma
from andrea_numba.kernels.common import SIMULATOR
from test_matmul_v12 import _operands, _run
from test_matmul_v17 import _bits

sim_only = pytest.mark.skipif(not SIMULATOR, reason="the simulator's twins (NUMBA_ENABLE_CUDASIM=1)")


def _split_product(seed, M, N, K, slots):
    """A weight gradient out += a^T @ b that splits over K: (a16, b16, o0, work of `slots` M x N
    slices, its slice count S on the auto tile with the simulator's resident blocks)."""
    rng = np.random.default_rng(seed)
    a, b = _operands(rng, M, N, K, True, False)
    o0 = rng.standard_normal((M, N)).astype(np.float32)
    work = cuda.to_device(np.zeros(slots * M * N, np.float32))
    tile = MM.pick_tile(M, N, K, work, MM.sm_count())
    S, _ = MM.splitk(M, N, K, 1, tile, work, MM.RESIDENT_BLOCKS)
    return _bits(a), _bits(b), o0, work, S


def _fixup(launch, a16, b16, o0, work):
    """launch's out, on a work buffer of NaN (every slice it sums must have been written)."""
    return _run(a16, b16, True, False, o0, work=cuda.to_device(np.full(work.shape[0], np.nan, np.float32)),
                accumulate=True, launch=launch)


@sim_only
def test_v19_adds_its_slices_itself_with_v18s_bits_and_leaves_its_counters_at_zero(monkeypatch):
    """out += a^T @ b, 64 x 128 (two 64 x 64 tiles) x K = 512 on the auto tile: two slices a tile, each
    unit on its own persistent block; v18 then k_splitk_sum against v19 alone, twice (the
    counters must be back at 0 for the second)."""
    a16, b16, o0, work, S = _split_product(191, 64, 128, 512, 8)
    assert S > 1
    sums = []
    real_sum = MM.splitk_sum
    monkeypatch.setattr(MM, "splitk_sum", lambda *a, **k: (sums.append(1), real_sum(*a, **k))[1])
    want = _run(a16, b16, True, False, o0, work=work, accumulate=True, launch=MM.matmul_bf16_wgmma)
    assert sums == [1]                                    # v18: the second kernel
    counts = lab_tma.COUNTS.reserve()
    for _ in range(2):
        got = _fixup(lab_matmul.matmul_v19, a16, b16, o0, work)
        assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
        assert not counts.copy_to_host().any()
    assert sums == [1]                                    # v19: none


def test_tma_matmul_points_the_tma_recipes_products_at_a_fixup_version_and_back():
    """Benchmarks time v19 and v23 inside the whole model by pointing the products of the ops on v18
    (matmul_bf16_wgmma, which bf16-hopper's, bf16t's and bf16s's ops name at each product) at them,
    then back."""
    from andrea_numba.kernels import loss, mlp
    from lab import mlp as lab_mlp
    assert lab_matmul.VERSIONS["matmul"][19] is lab_matmul.matmul_v19 and lab_matmul.matmul_v19.precision == "bf16"
    users = (mlp, loss, lab_mlp)
    assert all(m.matmul_bf16_wgmma is MM.matmul_bf16_wgmma for m in users)
    with lab_matmul.tma_matmul(23):
        assert all(m.matmul_bf16_wgmma is lab_matmul.matmul_v23 for m in users)
    assert all(m.matmul_bf16_wgmma is MM.matmul_bf16_wgmma for m in users)
    with pytest.raises(RuntimeError), lab_matmul.tma_matmul(19):          # put back when the block raises too
        assert all(m.matmul_bf16_wgmma is lab_matmul.matmul_v19 for m in users)
        raise RuntimeError
    with pytest.raises(AssertionError), lab_matmul.tma_matmul(17):
        pass
    assert all(m.matmul_bf16_wgmma is MM.matmul_bf16_wgmma for m in users)
    assert MM.matmul_bf16_wgmma is lab_matmul.VERSIONS["matmul"][18]


@sim_only
def test_v23_batches_the_sums_loads_and_keeps_v18s_bits(monkeypatch):
    """v23 (fixup 2): a split product with more slices than a batch holds (SMAX = 8: K = 1280 on one
    64 x 64 tile, with 16 resident blocks, gives 10 slices of 128, so a second batch continues the
    running sums): v18's bits, counters back at 0."""
    monkeypatch.setattr(MM, "RESIDENT_BLOCKS", 16)
    a16, b16, o0, work, S = _split_product(233, 64, 64, 1280, 16)
    assert S > 8, S
    want = _run(a16, b16, True, False, o0, work=work, accumulate=True, launch=MM.matmul_bf16_wgmma)
    got = _fixup(lab_matmul.matmul_v23, a16, b16, o0, work)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
    assert not lab_tma.COUNTS.reserve().copy_to_host().any()
    assert lab_matmul.VERSIONS["matmul"][23] is lab_matmul.matmul_v23
