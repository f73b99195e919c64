"""Lesson 08: flash attention. A softmax over a row computed tile by tile, and a backward that
never saw the T x T matrix.

What it teaches
    1. The online softmax: walking a row of scores in tiles, keeping only a running maximum m and
       a running sum l of exp(s - m). When m grows, the sum so far is rescaled by exp(m_old - m).
       At the end l is the row's sum, and lse = m + log(l) its log-sum-exp.
    2. Attention the same way: the output accumulator is rescaled with l, so y = acc / l without
       ever storing the row of probabilities. What is saved for the backward: y and lse, one
       number a row instead of T.
    3. The backward recomputes P = exp(s - lse) tile by tile, and needs one more number a row,
       D = dy . y (the softmax backward's row sum). reference.attn_flash_bwd gives the gradients
       of reference.attn_bwd, which read the stored probabilities.
    4. What it saves at ANDREA-120M: the probabilities of every layer against lse, from the
       engine's buffer list.
    5. The kernels (the engine's fp32 flash attention, attn_flash_fwd_tf32x3 and
       attn_flash_bwd_tf32x3 in andrea_numba/kernels/attn_flash_tf32x3.py: warps of 16 query rows,
       the next key tile fetched during the products, 3xTF32 products on tensor cores and the
       longest causal tiles first; lab/attn_flash_mma.py is the same tiling without the prefetch)
       against the twin.

How to run (no GPU needed; a few seconds)

    python lessons/08_flash_attention.py
    python lessons/08_flash_attention.py --interactive --figures figs/

Open it in Jupyter or VS Code as a notebook: the `# %%` lines are cells.
"""
# %%
import _common as C

args = C.start(__doc__)

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

import reference as R  # noqa: E402

rng = np.random.default_rng(8)

# %%
C.step("The online softmax of one row, tile by tile")
s = rng.standard_normal(24) * 3.0
s[13] = 9.0                                              # a large score in the second half
TILE = 6
m, l = -np.inf, 0.0
rows = []
for u0 in range(0, s.size, TILE):
    tile = s[u0:u0 + TILE]
    m_new = max(m, tile.max())
    alpha = np.exp(m - m_new)                            # 0 at the first tile (m = -inf)
    l = l * alpha + np.exp(tile - m_new).sum()
    rows.append((f"{u0}..{u0 + TILE - 1}", tile.max(), m_new, alpha, l))
    m = m_new
C.say(f"""
    A row of {s.size} scores, walked in tiles of {TILE}. The state is two numbers: m, the largest
    score so far, and l, the sum of exp(s - m) so far. A new tile may raise m; then every term
    already in l was computed against the old maximum, and multiplying l by
    alpha = exp(m_old - m_new) moves them all to the new one at once:
""")
C.table(rows, header=("tile", "tile max", "m", "alpha", "l"), fmt=("", ".4f", ".4f", ".4f", ".4f"))
lse = m + np.log(l)
full = np.exp(s - s.max()) / np.exp(s - s.max()).sum()
online = np.exp(s - lse)
C.say(f"""
    lse = m + log(l) = {lse:.6f}; numpy's log-sum-exp: {np.log(np.exp(s - s.max()).sum()) + s.max():.6f}.
    The probabilities are exp(s - lse): largest difference from the two-pass softmax
    {np.abs(online - full).max():.1e}. Nothing but m and l crossed from one tile to the next.
""")

# %%
C.step("Attention without the probabilities")
B, T, H, hs = 1, 16, 2, 8
Cc = H * hs
q, k, v = (rng.standard_normal((B, T, Cc)) for _ in range(3))
y_ref, att = R.attn_fwd(q, k, v, H)
y_flash, lse_flash = R.attn_flash_fwd(q, k, v, H)
C.say(f"""
    For attention the same walk also carries the output: per query row, acc = sum_u exp(s - m) v[u]
    over the keys seen, rescaled by alpha whenever m grows; at the end y = acc / l. attn_fwd keeps
    att, the probabilities, [B, H, T, T] = {list(att.shape)}; attn_flash_fwd keeps lse [B, H, T] =
    {list(lse_flash.shape)}. The outputs: largest |y_flash - y| = {np.abs(y_flash - y_ref).max():.1e}.
""")

# %%
C.step("The backward from y and lse")
dy = rng.standard_normal((B, T, Cc))
g_ref = R.attn_bwd(dy, q, k, v, att, H)
g_flash = R.attn_flash_bwd(dy, q, k, v, y_flash, lse_flash, H)
C.say("""
    The softmax backward needs, per row, sum_u P[t, u] datt[t, u] with datt = dy[t] . v[u]. With
    P = exp(s - lse) recomputed that sum is dy[t] . (sum_u P[t, u] v[u]) = dy[t] . y[t]: one dot
    product of two saved rows, D[t]. Then ds = P (datt - D), dq = scale ds k, dk = scale ds^T q,
    dv = P^T dy, tile by tile. The gradients against attn_bwd's (which read att):
""")
C.table([(name, np.abs(a - b).max()) for name, a, b in zip(("dq", "dk", "dv"), g_flash, g_ref)],
        header=("gradient", "largest |flash - plain|"), fmt=("", ".1e"))

# %%
C.step("What it saves at ANDREA-120M")
from andrea_numba.config import load_config  # noqa: E402
from andrea_numba.gpu_model import buffer_specs  # noqa: E402

cfg = load_config("120M")
Bt, Tt = cfg.train.batch_size, cfg.train.seq_len
GiB, MiB = 2.0 ** 30, 2.0 ** 20
plain = {sp.name: sp.nbytes for sp in buffer_specs(cfg.model, Bt, Tt, flash=False)}
flash = {sp.name: sp.nbytes for sp in buffer_specs(cfg.model, Bt, Tt, flash=True)}
rows = [("att (probabilities, every layer)", plain["att"] / MiB, 0.0),
        ("d_scores (one layer's, backward)", plain["d_scores"] / MiB, 0.0),
        ("lse (every layer)", 0.0, flash["lse"] / MiB),
        ("d_rowdot (D, backward)", 0.0, flash["d_rowdot"] / MiB),
        ("all buffers of the model", sum(plain.values()) / MiB, sum(flash.values()) / MiB)]
C.table(rows, header=(f"{cfg.name}, {Bt} x {Tt}", "plain MiB", "flash MiB"), fmt=("", ",.1f", ",.1f"))
C.say("""
    The probabilities grow with T squared; lse with T. The price is time: the backward computes
    the scores again. On an H200 flash attention v2 was still faster than attention v2 at 12M and
    120M, and v3, which loads the next tile while it multiplies the current one, is 2.6 to 3.9
    times faster than v2. The engine's fp32 kernels (attn_flash_fwd_tf32x3, rungs 8 and 10 of
    the ladder) are v3 with matmul v7's cheaper split, launched so that every head's longest
    causal tiles start first, which made the backward a quarter faster at 12M on the H200
    (docs/kernels.md).
""")

# %%
C.step("The kernels against the twin")
from numba import cuda  # noqa: E402

from andrea_numba.kernels import attn_flash  # noqa: E402

f32 = np.float32
dq_, dk_, dv_ = (cuda.device_array((B, T, Cc), f32) for _ in range(3))
yd, lsed, rowdot = cuda.device_array((B, T, Cc), f32), cuda.device_array((B, H, T), f32), cuda.device_array((B, H, T), f32)
qd, kd, vd, dyd = (cuda.to_device(a.astype(f32)) for a in (q, k, v, dy))
attn_flash.attn_flash_fwd_tf32x3(yd, lsed, qd, kd, vd, H)
attn_flash.attn_flash_bwd_tf32x3(dq_, dk_, dv_, rowdot, dyd, qd, kd, vd, yd, lsed, H)
out = {"y": (yd, y_flash), "lse": (lsed, lse_flash), "dq": (dq_, g_flash[0]), "dk": (dk_, g_flash[1]),
       "dv": (dv_, g_flash[2])}
C.table([(name, np.abs(d.copy_to_host() - ref).max() / np.abs(ref).max()) for name, (d, ref) in out.items()],
        header=(f"{attn_flash.attn_flash_fwd_tf32x3.__name__} / _bwd against the twin", "max |err| / max |ref|"),
        fmt=("", ".1e"))
where = "in the CUDA simulator" if C.SIMULATED else "on the GPU"
C.say(f"""
    The kernels ran {where}: float32 against the twin's float64, agreeing to float32 rounding.
    Each block owns a tile of query rows (16 a warp); its warps walk the key tiles, fetching the
    next tile while they multiply the current one, the products on the tensor-core step of
    lesson 07.
""")

fig, ax = plt.subplots(1, 2, figsize=(11, 4), layout="constrained")
ax[0].plot(range(s.size), s, "o-", color="gray", label="scores s")
m = -np.inf
for u0 in range(0, s.size, TILE):
    m = max(m, s[u0:u0 + TILE].max())
    ax[0].hlines(m, u0 - 0.5, u0 + TILE - 0.5, color="tab:red", label="running max m after the tile" if u0 == 0 else None)
    ax[0].axvline(u0 - 0.5, color="lightgray", lw=0.8)
ax[0].set_xlabel("key u")
ax[0].legend(frameon=False)
ax[0].set_title("online softmax: the state after each tile")
ax[1].bar(["att + d_scores", "lse + d_rowdot"], [(plain["att"] + plain["d_scores"]) / GiB,
                                                (flash["lse"] + flash["d_rowdot"]) / GiB],
          color=["tab:red", "tab:green"])
ax[1].set_yscale("log")
ax[1].set_ylabel("GiB")
ax[1].set_title(f"{cfg.name} at {Bt} x {Tt}: what attention keeps")
C.savefig(fig, "08_flash_attention.png")

C.finish()
