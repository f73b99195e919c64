"""The lab's rungs of andrea_numba/kernels/layernorm.py: every numbered version the engine does not run,
beside the engine's own (imported from the engine module), and the VERSIONS table of the ladder.
"""
from numba import cuda, float32
import math
from andrea_numba.kernels.layernorm import *  # noqa: F401,F403  (the engine's rungs and helpers)


@blocks(gpu=(256, 64, 1024), sim=(4, 2))
def layernorm_bwd_v2(dx, dg, db, dout, x, mean, rstd, g, *, block, stream=0):
    """As v1; dg, db from k_layernorm_bwd_params_v2 (blocks of PARAM_CX x PARAM_RY threads)."""
    N, C = x.shape
    k_layernorm_bwd_v1[N, block, stream](dx, dout, x, mean, rstd, g)
    k_layernorm_bwd_params_v2[cdiv(C, PARAM_CX), (PARAM_CX, PARAM_RY), stream](dg, db, dout, x, mean, rstd)


@cuda.jit
def k_layernorm_fwd_v2(out, mean, rstd, x, g, b, eps):
    """k_layernorm_fwd_v1 with RW rows a block: row = blockIdx.x * RW + threadIdx.y, its TPR lanes
    striding over the C channels: the sum pass, then normalise_row."""
    buf = cuda.shared.array(MAX_BLOCK, float32)
    row = cuda.blockIdx.x * cuda.blockDim.y + cuda.threadIdx.y
    live = row < x.shape[0]
    s = float32(0.0)
    if live:
        for c in range(cuda.threadIdx.x, x.shape[1], cuda.blockDim.x):
            s += x[row, c]
    mu = rows_sum(buf, s) * (float32(1.0) / float32(x.shape[1]))
    normalise_row(buf, out, mean, rstd, x, g, b, eps, row, live, mu)


@blocks(**ROW_BLOCKS)
def layernorm_fwd_v2(out, mean, rstd, x, g, b, eps, *, block, stream=0):
    """As v1, RW rows of TPR threads a block: cdiv(N, RW) blocks of (TPR, RW) threads."""
    tpr, rw = block
    k_layernorm_fwd_v2[cdiv(x.shape[0], rw), (tpr, rw), stream](out, mean, rstd, x, g, b, float32(eps))


@blocks(**ROW_BLOCKS)
def layernorm_bwd_v3(dx, dg, db, dout, x, mean, rstd, g, *, block, stream=0):
    """v2 with dx from k_layernorm_bwd_v2 (RW rows of TPR threads a block)."""
    N, C = x.shape
    tpr, rw = block
    k_layernorm_bwd_v2[cdiv(N, rw), (tpr, rw), stream](dx, dout, x, mean, rstd, g)
    k_layernorm_bwd_params_v2[cdiv(C, PARAM_CX), (PARAM_CX, PARAM_RY), stream](dg, db, dout, x, mean, rstd)


@blocks(**ROW_BLOCKS)
def residual_layernorm_bwd_v2(dx, df, dg, db, work, dresid, dout, resid, mean, rstd, g, *, block, stream=0):
    """v1 with dg, db in two stages (layernorm_bwd_params_two_stage, as layernorm_bwd_two_stage). work:
    float32 [n] scratch, at least 2 C floats (the engine passes its split-K buffer)."""
    N = resid.shape[0]
    tpr, rw = block
    k_residual_layernorm_bwd_v1[cdiv(N, rw), (tpr, rw), stream](dx, df, dresid, dout, resid, mean, rstd, g,
                                                                df is not dx)
    layernorm_bwd_params_two_stage(dg, db, work, dout, resid, mean, rstd, stream)


def _row_kernels(NPL):
    def k_residual_layernorm_fwd(resid, out, mean, rstd, x, f, g, b, eps):
        """resid = x + f, out = layernorm(resid), mean and rstd saved, as k_residual_layernorm_fwd_v1,
        lane tx of row threadIdx.y holding resid[row, tx + i TPR] in v[i], i < NPL."""
        buf = cuda.shared.array(MAX_BLOCK, float32)
        v = cuda.local.array(NPL, float32)
        row = cuda.blockIdx.x * cuda.blockDim.y + cuda.threadIdx.y
        tx, tpr = cuda.threadIdx.x, cuda.blockDim.x
        C = x.shape[1]
        live = row < x.shape[0]
        s = float32(0.0)
        for i in range(NPL):                       # resid = x + f: the row's only loads
            c = tx + i * tpr
            v[i] = float32(0.0)
            if live and c < C:
                v[i] = x[row, c] + f[row, c]
                resid[row, c] = v[i]
                s += v[i]
        mu = rows_sum(buf, s) * (float32(1.0) / float32(C))
        s = float32(0.0)
        for i in range(NPL):                       # the variance, from the registers
            if live and tx + i * tpr < C:
                d = v[i] - mu
                s += d * d
        r = float32(1.0) / math.sqrt(rows_sum(buf, s) * (float32(1.0) / float32(C)) + eps)
        if live:
            for i in range(NPL):
                c = tx + i * tpr
                if c < C:
                    out[row, c] = (v[i] - mu) * r * g[c] + b[c]
            if tx == 0:
                mean[row] = mu
                rstd[row] = r

    def k_residual_layernorm_bwd(dx, df, dresid, dout, x, mean, rstd, g, write_df):
        """dx = dresid + LayerNorm grad_input (and df = dx when write_df), as
        k_residual_layernorm_bwd_v1, lane tx holding dxhat = dout g and x - mean of its NPL
        channels in registers. dx may be dresid itself (each element is read by the thread that
        writes it)."""
        buf = cuda.shared.array(MAX_BLOCK, float32)
        dxh = cuda.local.array(NPL, float32)
        xm = cuda.local.array(NPL, float32)
        row = cuda.blockIdx.x * cuda.blockDim.y + cuda.threadIdx.y
        tx, tpr = cuda.threadIdx.x, cuda.blockDim.x
        C = x.shape[1]
        inv_c = float32(1.0) / float32(C)
        live = row < x.shape[0]
        mu = mean[row] if live else float32(0.0)
        r = rstd[row] if live else float32(0.0)
        s1 = float32(0.0)
        s2 = float32(0.0)
        for i in range(NPL):                       # dxhat and x - mean: the row's only loads of dout, x
            c = tx + i * tpr
            dxh[i] = float32(0.0)
            xm[i] = float32(0.0)
            if live and c < C:
                dxh[i] = dout[row, c] * g[c]
                xm[i] = x[row, c] - mu
                s1 += dxh[i]
                s2 += dxh[i] * xm[i] * r
        m1 = rows_sum(buf, s1) * inv_c
        m2 = rows_sum(buf, s2) * inv_c
        if live:
            for i in range(NPL):
                c = tx + i * tpr
                if c < C:
                    xhat = xm[i] * r
                    val = dresid[row, c] + r * (dxh[i] - m1 - xhat * m2)
                    dx[row, c] = val
                    if write_df:
                        df[row, c] = val

    return jit_as(k_residual_layernorm_fwd, 2), jit_as(k_residual_layernorm_bwd, 2)      # cuda.jit, named _v2


_ROW_KERNELS = {}      # NPL -> (k_residual_layernorm_fwd_v2, k_residual_layernorm_bwd_v2)


def row_kernels(C: int, tpr: int):
    """The register-row kernels for rows of C channels and TPR lanes a row (NPL = cdiv(C, TPR))."""
    npl = cdiv(C, tpr)
    if npl not in _ROW_KERNELS:
        _ROW_KERNELS[npl] = _row_kernels(npl)        # numba compiles each on its first launch
    return _ROW_KERNELS[npl]


@blocks(**ROW_BLOCKS)
def residual_layernorm_fwd_v2(resid, out, mean, rstd, x, f, g, b, eps, *, block, stream=0):
    """v1's result, bit for bit, with the row in registers (k_residual_layernorm_fwd_v2);
    cdiv(N, RW) blocks of (TPR, RW) threads."""
    tpr, rw = block
    fwd, _ = row_kernels(x.shape[1], tpr)
    fwd[cdiv(x.shape[0], rw), (tpr, rw), stream](resid, out, mean, rstd, x, f, g, b, float32(eps))


@blocks(**ROW_BLOCKS)
def residual_layernorm_bwd_v3(dx, df, dg, db, work, dresid, dout, resid, mean, rstd, g, *, block, stream=0):
    """v2's result, bit for bit: dx (and df) with the row in registers (k_residual_layernorm_bwd_v2),
    then dg, db in v2's two stages with stage 2's loads ahead of its adds
    (k_layernorm_bwd_params_sum_v2). work: float32 [n] scratch, at least 2 C floats."""
    N, C = resid.shape
    tpr, rw = block
    _, bwd = row_kernels(C, tpr)
    bwd[cdiv(N, rw), (tpr, rw), stream](dx, df, dresid, dout, resid, mean, rstd, g, df is not dx)
    layernorm_bwd_params_two_stage(dg, db, work, dout, resid, mean, rstd, stream, stage2=k_layernorm_bwd_params_sum_v2)


VERSIONS = {"layernorm_fwd": {1: layernorm_fwd, 2: layernorm_fwd_v2},
            "layernorm_bwd": {1: layernorm_bwd, 2: layernorm_bwd_v2, 3: layernorm_bwd_v3, 4: layernorm_bwd_two_stage},
            "residual_layernorm_fwd": {1: residual_layernorm_fwd, 2: residual_layernorm_fwd_v2, 3: residual_layernorm_fwd_vec4},
            "residual_layernorm_bwd": {1: residual_layernorm_bwd, 2: residual_layernorm_bwd_v2,
                                       3: residual_layernorm_bwd_v3, 4: residual_layernorm_bwd_two_stage,
                                       5: residual_layernorm_bwd_partials, 6: residual_layernorm_bwd_bf16}}
