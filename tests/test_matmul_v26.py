"""matmul v26 (lab/split_wgmma_overlap.py): matmul v25 with a stage's wgmmas in flight across the
stage boundary. The same sums added in the same order, so v25's bits: every transpose with edges,
an odd and an even number of stages and a single one, accumulate and split K, at each declared
tile; in the simulator (the twins) and on a GPU (the tensor core's own sums, where the order of the
waits and barriers is what keeps a stage from being overwritten while it is read)."""
import numpy as np
import pytest

from andrea_numba.kernels import matmul as MM
from andrea_numba.kernels.common import SIMULATOR
from lab import matmul as lab_matmul
from test_matmul_v25 import _product

V25, V26 = MM.matmul_tf32x3_wgmma, lab_matmul.matmul_v26


def test_v26_is_rung_26_on_v25s_tiles():
    assert lab_matmul.VERSIONS["matmul"][26] is V26 and V26.blocks == V25.blocks
    assert MM.TILE_FAMILIES["v26"].rung == 26


# K = 45: 2 stages (even); 77: 3 (odd); 20: 1. M, N off the tile edges (a part block row and column).
SHAPES = [(70, 40, 45), (70, 40, 77), (70, 40, 20)] if SIMULATOR else [(200, 136, 45), (300, 264, 77), (130, 72, 20),
                                                                       (512, 384, 768), (384, 512, 1536)]


@pytest.mark.parametrize("trans_a, trans_b", [(False, False), (False, True), (True, False), (True, True)])
def test_v26_gives_v25s_bits(trans_a, trans_b):
    rng = np.random.default_rng(4)
    blocks = V25.blocks if not SIMULATOR else V25.blocks[(trans_a + trans_b) % 2:][:1]    # one tile each here
    for M, N, K in SHAPES:
        a = rng.standard_normal((K, M) if trans_a else (M, K)).astype(np.float32)
        b = rng.standard_normal((N, K) if trans_b else (K, N)).astype(np.float32)
        out0 = rng.standard_normal((M, N)).astype(np.float32)
        for block in blocks:
            got, want = (_product(a, b, trans_a, trans_b, out0, trans_a, block, launch=v) for v in (V26, V25))
            np.testing.assert_array_equal(got, want, err_msg=f"{M} x {N} x {K} at {block}")


def test_split_k_gives_v25s_bits():
    """A weight gradient whose K the launcher cuts into slices (S > 1; on a GPU 120M's dW_1, in 8
    slices on an H100)."""
    M, N, K = (64, 32, 256) if SIMULATOR else (768, 3072, 8192)
    rng = np.random.default_rng(5)
    a, b = rng.standard_normal((K, M)).astype(np.float32), rng.standard_normal((K, N)).astype(np.float32)
    out0 = rng.standard_normal((M, N)).astype(np.float32)
    work = np.zeros(MM.splitk_work(max(M, N)) if not SIMULATOR else 8 * M * N, np.float32)
    block = V25.blocks[0]
    S, _ = MM.splitk(M, N, K, 1, block, work, *(() if SIMULATOR else (MM.sm_count(),)))
    assert S > 1
    got, want = (_product(a, b, True, False, out0, True, block, work, launch=v) for v in (V26, V25))
    np.testing.assert_array_equal(got, want)
