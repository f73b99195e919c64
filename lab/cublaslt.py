"""The library route beside the matmul ladder: cuBLASLt's products as matmul v20-v22 (lab/matmul.py
adds them to its VERSIONS where they can run)."""
from andrea_numba.kernels.cublaslt import *  # noqa: F401,F403  (the engine's rungs and helpers)


def matmul_versions() -> dict:
    """{version: launcher} of the library route for matmul.VERSIONS: 20 (fp32), 21 (bf16), 22 (fp16),
    where it can run (on a GPU with nvmath-python); none elsewhere (the simulator, CI)."""
    return {} if unavailable() else {VERSION_OF[p]: MATMUL[p] for p in PRECISIONS}
