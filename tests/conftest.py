"""Tests run the CUDA kernels in Numba's simulator unless told otherwise
(NUMBA_ENABLE_CUDASIM=0 on a machine with a GPU runs them on the GPU)."""
import os

import pytest

os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")



def pytest_configure(config):
    """Under `pytest -n` (--dist loadgroup, pyproject.toml) a module marked xdist_group runs on one
    worker, so that its module fixture (a training run, say) is built once. pytest-xdist (3.8) marks
    such a test by renaming its node id, which pytest 9 no longer reads: the groups would split
    silently and the suite take far longer, so such a run is refused in one line."""
    grouped = config.getoption("numprocesses", None) and config.getoption("dist", "no") == "loadgroup"
    if grouped and int(pytest.__version__.split(".")[0]) >= 9:
        raise pytest.UsageError(f"pytest {pytest.__version__} ignores pytest-xdist's test groups: "
                                "install the test extra (pip install -e '.[test]': pytest below 9)")
