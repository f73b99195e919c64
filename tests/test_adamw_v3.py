"""AdamW v3 (kernels/optim.py: every load of an element before any store, a thread an element)
must give v2's bits: the same update of params, m and v, the gradient cleared, and on a step with a
NaN or infinite loss or norm the weights, m and v left as they were (the gradient still cleared).
Its float operations are v2's in v2's order (the two kernels' PTX has the same sequence of float
instructions); here the simulator checks the values, at a size that is not a multiple of a block."""
import numpy as np
import pytest
from numba import cuda

import reference as R
from andrea_numba.kernels import optim
from lab import optim as lab_optim

N = 37


@pytest.mark.parametrize("stats", [(2.5, 0.7), (np.nan, 0.7), (2.5, np.inf)], ids=["finite", "nan-loss", "inf-norm"])
def test_v3_gives_v2s_bits(stats):
    rng = np.random.default_rng(3)
    p, g = rng.standard_normal(N).astype(np.float32), rng.standard_normal(N).astype(np.float32)
    m, v = rng.standard_normal(N).astype(np.float32) * 0.1, rng.random(N).astype(np.float32) * 0.1
    decay = (rng.random(N) < 0.5).astype(np.uint8)
    hyper = R.adamw_hyper(7, 1e-3, 0.9, 0.95).astype(np.float32)
    out = {}
    for version in (2, 3):
        dev = [cuda.to_device(a) for a in (p, g, m, v)]
        lab_optim.VERSIONS["adamw"][version](dev[0], dev[1], dev[2], dev[3], cuda.to_device(decay), cuda.to_device(hyper),
                                         0.9, 0.95, 1e-8, 0.1, cuda.to_device(np.array(stats, np.float32)))
        out[version] = [a.copy_to_host() for a in dev]
    for a, b in zip(out[2], out[3]):
        assert a.tobytes() == b.tobytes()
    assert not out[3][1].any()                                   # the gradient cleared on both paths
    if not np.isfinite(stats).all():
        assert out[3][0].tobytes() == p.tobytes() and out[3][2].tobytes() == m.tobytes()
    else:
        assert not np.array_equal(out[3][0], p)
