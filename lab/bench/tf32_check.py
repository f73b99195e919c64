"""On a GPU: the kernels' TF32 rounding (kernels/ptx.py tf32_round: integer add and mask) against the
hardware's own cvt.rna.tf32.f32 (tf32_round_cvt), bit for bit, over random floats of every
magnitude, the halfway cases and the special values. Prints one line; exit 1 on a difference.

    python lab/bench/tf32_check.py            # 16M random floats + specials
"""
import sys

import numpy as np
from numba import cuda

from andrea_numba import cli
from andrea_numba.kernels.ptx import tf32_round, tf32_round_cvt


@cuda.jit
def k_both(a, b, x):
    i = cuda.grid(1)
    if i < x.shape[0]:
        a[i] = tf32_round(x[i])
        b[i] = tf32_round_cvt(x[i])


def main(argv=None):
    cli.Parser(prog="python lab/bench/tf32_check.py", description=__doc__.split("\n\n")[0]).parse_args(argv)
    rng = np.random.default_rng(0)
    bits = rng.integers(0, 2 ** 32, 1 << 24, dtype=np.uint64).astype(np.uint32)
    halfway = (rng.integers(0, 2 ** 19, 1 << 16, dtype=np.uint64).astype(np.uint32) << 13) | np.uint32(0x1000)
    special = np.array([0.0, -0.0, 1.0, -1.0, np.inf, -np.inf, 3.4e38, -3.4e38, 1e-45, 1e-40, 1.17549435e-38],
                       np.float32).view(np.uint32)
    x = np.concatenate([bits, halfway, special]).view(np.float32)
    finite = np.isfinite(x)
    d = cuda.to_device(x)
    a, b = cuda.device_array_like(d), cuda.device_array_like(d)
    k_both[(x.size + 255) // 256, 256](a, b, d)
    ai, bi = a.copy_to_host().view(np.uint32), b.copy_to_host().view(np.uint32)
    diff = int(np.count_nonzero(ai[finite] != bi[finite]))
    print(f"tf32_round vs cvt.rna.tf32.f32: {finite.sum():,} finite floats, {diff} differ "
          f"({(~finite).sum():,} NaN/inf patterns not compared)")
    sys.exit(1 if diff else 0)


if __name__ == "__main__":
    main()
