"""The lab's rungs of andrea_numba/kernels/layernorm.py: every numbered version the engine does not run,
beside the engine's own (imported from the engine module), and the VERSIONS table of the ladder.
The figures were measured on the H200 (docs/kernels.md gives the dates and the raw files).

layernorm_fwd and layernorm_bwd (v1 and v2 of the forward are the shapes of the backward's dx kernel,
without the dg, db):
    v1  (layernorm_fwd, layernorm_bwd, the lessons') k_layernorm_bwd (dx, a block per row) +
        k_layernorm_bwd_params: one thread per channel sums its whole column. Only C threads work
        (768 at 120M for 8192 rows: 2.2 ms a call on an H200).
    v2  the same dx kernel + k_layernorm_bwd_params_tree: RY threads share a column, each summing
        every RY-th row, and meet in a fixed tree.
    v3  v2 with k_layernorm_bwd_multirow: RW rows a block of RW x TPR threads, one tree's barriers
        for all of them (layernorm_fwd_v2 likewise). They agree, and were no faster.
    v4  (layernorm_bwd_two_stage, the engine's) v3's dx kernel + the parameter sums in two stages:
        k_layernorm_bwd_params_partial cuts the rows into R chunks as well as the channels into
        blocks of CX, each block writing its chunk's partial sums to a work buffer, and
        k_layernorm_bwd_params_sum adds the R partials of a channel in chunk order into dg, db. v2
        launches only cdiv(C, 32) blocks (12 at C = 384, 24 at C = 768): the GPU idles (0.0875 ms a
        call for 8192 rows on an H200, about 575 GB/s of 4.8 TB/s). v4 takes the split-K work
        buffer (free between the products). On the H200 a call takes 0.030 + 0.008 ms at C = 768
        (2026-12-01).

residual_layernorm_fwd and residual_layernorm_bwd (the residual add fused with the LayerNorm after it):
    fwd v1, bwd v1  (the engine's residual_layernorm_fwd; the lessons' bwd) a RW x TPR block of rows,
        the sum written as it is made; the backward's dg, db from k_layernorm_bwd_params_tree.
    bwd v2  v1 with the two-stage params of layernorm_bwd v4.
    fwd v2, bwd v3  the row in registers (below), v1's and v2's bits; bwd v3's stage 2 with its loads
        ahead (k_layernorm_bwd_params_sum_unroll4).
    bwd v4  (residual_layernorm_bwd_two_stage, the engine's fallback) v2's dx kernel with v3's
        stage 2. v2's dx kernel ran faster on the H200 than v3's register rows (0.030 against 0.041
        ms a call in the 12M training step), v3's stage 2 faster than v2's (0.0067 against 0.0134
        ms: k_layernorm_bwd_params_sum waits on one load per chunk, one after the other; 13 us a
        call for R = 44 at C = 384, longer than stage 1's 22 us). v2's bits.
    fwd v3  (residual_layernorm_fwd_vec4, the bf16 recipes') v2's row in registers, read and
        written four channels at a time, and the output written as bf16 where the model saves it
        so. On the H200 at 120M (a profile of the training step) v1's forward took 0.062 ms a call
        for 8192 rows of 768: 100 MB moved at 1.6 TB/s, a warp a row with one 4-byte load a lane at
        a time; with bf16 products the output then went through an fp32 scratch and a copy kernel
        into its bf16 buffer (0.28 ms a step).
    bwd v5  (residual_layernorm_bwd_partials, the engine's) stage 1 of the parameter sums fused
        into the dx kernel. On the H200 at 120M (8192 rows of C = 768, block (32, 8)) v4 takes, a
        call, k_residual_layernorm_bwd 0.053 ms + k_layernorm_bwd_params_partial 0.029 ms + stage 2
        0.005 ms; 24 calls a training step, 2.1 ms in all, and stage 1 reads dout and x again (50 MB)
        right after the dx kernel read them. v5's dx and df are v4's bits; its stage 2 adds R = 1024
        partials a channel, not v4's 22 (k_layernorm_bwd_params_sum_unroll4 would wait on 256 rounds
        of 4 loads; v4's stage 2 took 0.0066 ms for R = 44 at 12M: 11 rounds), so it gives a
        channel RY threads and a tree (k_layernorm_bwd_params_sum_tree). ptxas (sm_90): 32
        registers a thread (v1's dx kernel: 40), 8 blocks of 256 threads an SM; written without
        nonneg, its loop of windows around a loop of channels held 72.
    bwd v6  (residual_layernorm_bwd_bf16, the bf16-hopper recipe's) v5 writing dx's bf16 copy too,
        for the two bf16 products that read it next (their operand copy, cublaslt.round_into, was a
        pass of [N, C] fp32 in and bf16 out). v5's bits. The store is chosen when the kernel is
        compiled: a kernel argument switching it held 36 registers a thread, the kernel 32 as v5
        (ptxas, sm_90; at 36, 6 blocks of 256 threads an SM instead of 8).

The row in registers (residual_layernorm fwd v2, bwd v3). On the H200 (12M training step,
2026-12-01) the fused residual + LayerNorm kernels moved their bytes at about 1.5 TB/s: v1's forward
writes resid, then reads it back from memory twice (the variance pass and the output pass), and the
backward reads dout and x twice (the row sums, then dx). Here a lane keeps its NPL = cdiv(C, TPR)
values of the row in registers (a local array the compiler keeps in registers: its indices are
known when the loops are unrolled), loads each input element once and writes each output element
once:
    forward   read x, f; write resid, out           (v1: + two reads of resid)
    backward  read dresid, dout, x; write dx (df)   (v1: + a second read of dout and x)
The lanes visit the same channels in the same order (c = tx, tx + TPR, ...) and do the same float32
operations as v1, so the row sums, the means and every output are v1's bits (the harness and
tests/test_layernorm_rows.py check it). One kernel is built per NPL (12 at C = 384, 24 at C = 768
with TPR = 32). Measured on the H200 (12M training step, Nsight Compute, a call): the forward
0.0334 ms against v1's 0.0337, the backward's dx 0.0411 ms against v1's 0.0296. The re-reads come
from L2 at no visible cost, and the backward's two register arrays a lane cost more than they save:
neither is the engine's. They stay as the measured rung.
"""
from numba import cuda, float32
import math
from andrea_numba.kernels.common import jit_as
from andrea_numba.kernels.layernorm import *  # noqa: F401,F403  (the engine's rungs and helpers)


@blocks(gpu=(256, 64, 1024), sim=(4, 2))
def layernorm_bwd_v2(dx, dg, db, dout, x, mean, rstd, g, *, block, stream=0):
    """As v1; dg, db from k_layernorm_bwd_params_tree (blocks of PARAM_CX x PARAM_RY threads)."""
    N, C = x.shape
    k_layernorm_bwd[N, block, stream](dx, dout, x, mean, rstd, g)
    k_layernorm_bwd_params_tree[cdiv(C, PARAM_CX), (PARAM_CX, PARAM_RY), stream](dg, db, dout, x, mean, rstd)


@cuda.jit
def k_layernorm_fwd_v2(out, mean, rstd, x, g, b, eps):
    """k_layernorm_fwd with RW rows a block: row = blockIdx.x * RW + threadIdx.y, its TPR lanes
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
    """v2 with dx from k_layernorm_bwd_multirow (RW rows of TPR threads a block)."""
    N, C = x.shape
    tpr, rw = block
    k_layernorm_bwd_multirow[cdiv(N, rw), (tpr, rw), stream](dx, dout, x, mean, rstd, g)
    k_layernorm_bwd_params_tree[cdiv(C, PARAM_CX), (PARAM_CX, PARAM_RY), stream](dg, db, dout, x, mean, rstd)


@blocks(**ROW_BLOCKS)
def residual_layernorm_bwd_v2(dx, df, dg, db, work, dresid, dout, resid, mean, rstd, g, *, block, stream=0):
    """v1 with dg, db in two stages (layernorm_bwd_params_two_stage, as layernorm_bwd_two_stage). work:
    float32 [n] scratch, at least 2 C floats (the engine passes its split-K buffer)."""
    N = resid.shape[0]
    tpr, rw = block
    k_residual_layernorm_bwd[cdiv(N, rw), (tpr, rw), stream](dx, df, dresid, dout, resid, mean, rstd, g,
                                                             df is not dx)
    layernorm_bwd_params_two_stage(dg, db, work, dout, resid, mean, rstd, stream)


def _row_kernels(NPL):
    def k_residual_layernorm_fwd(resid, out, mean, rstd, x, f, g, b, eps):
        """resid = x + f, out = layernorm(resid), mean and rstd saved, as k_residual_layernorm_fwd,
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
        k_residual_layernorm_bwd, lane tx holding dxhat = dout g and x - mean of its NPL
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
    (k_layernorm_bwd_params_sum_unroll4). work: float32 [n] scratch, at least 2 C floats."""
    N, C = resid.shape
    tpr, rw = block
    _, bwd = row_kernels(C, tpr)
    bwd[cdiv(N, rw), (tpr, rw), stream](dx, df, dresid, dout, resid, mean, rstd, g, df is not dx)
    layernorm_bwd_params_two_stage(dg, db, work, dout, resid, mean, rstd, stream, stage2=k_layernorm_bwd_params_sum_unroll4)


VERSIONS = {"layernorm_fwd": {1: layernorm_fwd, 2: layernorm_fwd_v2},
            "layernorm_bwd": {1: layernorm_bwd, 2: layernorm_bwd_v2, 3: layernorm_bwd_v3, 4: layernorm_bwd_two_stage},
            "residual_layernorm_fwd": {1: residual_layernorm_fwd, 2: residual_layernorm_fwd_v2, 3: residual_layernorm_fwd_vec4},
            "residual_layernorm_bwd": {1: residual_layernorm_bwd, 2: residual_layernorm_bwd_v2,
                                       3: residual_layernorm_bwd_v3, 4: residual_layernorm_bwd_two_stage,
                                       5: residual_layernorm_bwd_partials, 6: residual_layernorm_bwd_bf16}}
