"""andrea-numba: a GPT-2-shaped transformer trained kernel by kernel with Numba CUDA.

Every op is a pair of @cuda.jit kernels (forward, backward) in andrea_numba.kernels, with a NumPy
twin in the `reference` package. See README.md.
"""
__version__ = "0.1.0"
