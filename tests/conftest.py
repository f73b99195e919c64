"""Tests run the CUDA kernels in Numba's simulator unless told otherwise
(NUMBA_ENABLE_CUDASIM=0 on a machine with a GPU runs them on the GPU)."""
import os

os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")
