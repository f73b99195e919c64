"""Which cuBLASLt FP8 product forms run on this GPU: one small E4M3 product in each candidate form
(output type, where the scale pointers are set and how they are aligned), with cuBLASLt's own log on (run with
CUBLASLT_LOG_LEVEL=5 for its reasons). Prints one line a form: ok (with the error against float64)
or the library's status.

    python lab/bench/fp8_probe.py
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def main(argv=None) -> int:
    from andrea_numba import cli
    cli.Parser(prog="python lab/bench/fp8_probe.py", description=__doc__.split("\n\n")[0]).parse_args(argv)
    try:
        import nvmath
    except ImportError:
        cli.fail("lab/bench/fp8_probe.py needs nvmath-python (cuBLASLt's bindings) and a GPU: pip install nvmath-python")
    from numba import cuda

    from andrea_numba.kernels import cublaslt as L
    from andrea_numba.kernels import fp8_products as F
    lib = L.library()
    lt, D, P = lib.lt, lib.lt.MatmulDescAttribute, lib.lt.MatmulPreferenceAttribute
    cdt = nvmath.CudaDataType
    M = N = K = 256
    rng = np.random.default_rng(0)
    a = rng.standard_normal((M, K)).astype(np.float32)
    b = rng.standard_normal((N, K)).astype(np.float32)            # b^T: K-major already
    qa = F.FP8.quantize(cuda.to_device(a), "e4m3", False, 0, "probe.a")
    qb = F.FP8.quantize(cuda.to_device(b), "e4m3", False, 1, "probe.b")
    ref = a.astype(np.float64) @ b.astype(np.float64).T
    dt = lt.get_matmul_desc_attribute_dtype

    def attempt(name, out_type, scales_first, with_scales=True, offset=0):
        out_np = {"CUDA_R_32F": np.float32, "CUDA_R_16BF": np.uint16, "CUDA_R_16F": np.float16}[out_type]
        out = cuda.to_device(np.zeros((M, N), out_np))
        desc = lt.matmul_desc_create(int(lib.cublas.ComputeType.COMPUTE_32F), int(cdt.CUDA_R_32F))
        lib._set(lt.matmul_desc_set_attribute, desc, D.TRANSA, int(lib.cublas.Operation.T), dt)
        lib._set(lt.matmul_desc_set_attribute, desc, D.TRANSB, int(lib.cublas.Operation.N), dt)

        def scales():
            if with_scales:
                lib._set(lt.matmul_desc_set_attribute, desc, D.A_SCALE_POINTER, qb.descale + offset, dt)
                lib._set(lt.matmul_desc_set_attribute, desc, D.B_SCALE_POINTER, qa.descale + offset, dt)
        if scales_first:
            scales()
        e4 = int(cdt.CUDA_R_8F_E4M3)
        la, lb = lt.matrix_layout_create(e4, K, N, K), lt.matrix_layout_create(e4, K, M, K)
        lc = lt.matrix_layout_create(int(getattr(cdt, out_type)), N, M, N)
        pref = lt.matmul_preference_create()
        lib._set(lt.matmul_preference_set_attribute, pref, P.MAX_WORKSPACE_BYTES, L.WORKSPACE_BYTES,
                 lt.get_matmul_preference_attribute_dtype)
        found = lt.MatmulHeuristicResult(1)
        count = np.zeros(1, np.int32)
        try:
            lt.matmul_algo_get_heuristic(lib.handle, desc, la, lb, lc, lc, pref, 1, found.ptr, count.ctypes.data)
            if count[0] < 1:
                print(f"{name}: no algorithm")
                return
            if not scales_first:
                scales()
            lt.matmul(lib.handle, desc, lib.one.ctypes.data, L.address(qb.codes), la, L.address(qa.codes), lb,
                      lib.zero.ctypes.data, L.address(out), lc, L.address(out), lc, found.ptr,
                      L.address(lib.workspace), L.WORKSPACE_BYTES, 0)
            cuda.synchronize()
            got = out.copy_to_host()
            if out_type == "CUDA_R_16BF":
                got = (got.astype(np.uint32) << 16).view(np.float32)
            got = got.astype(np.float64)
            err = np.max(np.abs(got - ref)) / np.max(np.abs(ref))
            print(f"{name}: ok, err {err:.2e}")
        except Exception as e:                  # noqa: BLE001 (the probe reports every form)
            print(f"{name}: {type(e).__name__}: {' '.join(str(e).split())[:160]}")

    for out_type in ("CUDA_R_32F", "CUDA_R_16BF"):
        for first in (True, False):
            attempt(f"out {out_type}, scale pointers set {'before' if first else 'after'} the heuristic",
                    out_type, first)
        attempt(f"out {out_type}, no scale pointers", out_type, True, with_scales=False)
        attempt(f"out {out_type}, scale pointers 4 bytes past a 16-byte boundary", out_type, True, offset=4)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
