"""Lesson 09: one sum per token, on real text. The embedding backward, and why a kernel is
measured on the data it will see.

What it teaches
    1. The op: dwte[v] += the sum of the rows of dout at the positions holding token v. No float
       atomics (their order, and so the rounding, changes from run to run): every sum has a fixed
       order, the positions in order.
    2. Real text is skewed. In the default corpus (the Python standard library, read as bytes) the
       space is 30% of the bytes: in a 12M training batch one token owns thousands of positions,
       where uniform ids give a few dozen each.
    3. embed_bwd v2 links each position to the next one with the same token and lets one block walk
       each list. Its time is the longest list: on random ids it looked fast; in training it took
       10% of the 12M step on the H200.
    4. embed_bwd v3 sorts each chunk of positions by (token, position) with a bitonic network (a
       fixed sequence of compare-swaps: deterministic), so a token's positions sit side by side in
       order, found by binary search instead of a walk from link to link. The same sums in the
       same order: v2's bits, checked here.

How to run (no GPU needed; a few seconds)

    python lessons/09_skewed_sums.py
    python lessons/09_skewed_sums.py --interactive --figures figs/

Open it in Jupyter or VS Code as a notebook: the `# %%` lines are cells.
"""
# %%
import _common as C

args = C.start(__doc__)

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

import reference as R  # noqa: E402
from andrea_numba import data as D  # noqa: E402

rng = np.random.default_rng(9)

# %%
C.step("The op, and why its order is fixed")
C.say("""
    The token embedding is a lookup, x[pos] = wte[tokens[pos]] + wpe[t]. Its backward sends each
    row of dout back to the row of wte it came from; a token at n positions gets the sum of n rows:
        dwte[v, c] += sum over positions p with tokens[p] == v of dout[p, c]
    Float addition is not associative: the same numbers added in another order round differently.
""")
vals = (rng.standard_normal(1000) * 10).astype(np.float32)
fwd, back = np.float32(0), np.float32(0)
for x in vals:
    fwd = np.float32(fwd + x)
for x in vals[::-1]:
    back = np.float32(back + x)
C.table([("positions in order", f"{fwd:.9g}", fwd.view(np.uint32)), ("positions in reverse", f"{back:.9g}", back.view(np.uint32))],
        header=("1,000 float32 rows of one channel, added", "sum", "its bits"), fmt=("", "", "08x"))
C.say("""
    Atomic adds from many threads would add in whatever order the threads arrive: another rounding
    on every run, and a resumed training run that drifts from the one it continues. So every
    version here adds a token's rows in position order, and only one thread adds into each element.
""")

# %%
C.step("Real text is skewed")
text = D.stdlib_corpus()[0]
data = np.frombuffer(text.encode("utf-8", "replace") if isinstance(text, str) else text, np.uint8)
counts = np.bincount(data, minlength=256)
order = np.argsort(-counts)
C.table([(repr(chr(b)), f"{counts[b] / data.size:.1%}") for b in order[:6]],
        header=(f"the default corpus: {data.size:,} bytes, most common", "share"), fmt=("", ""))
B, T = 16, 512                                      # ANDREA-12M-TRAIN's microbatch
N = B * T
starts = rng.integers(0, data.size - T, B)
batch = data[starts[:, None] + np.arange(T)].reshape(-1)
uniform = rng.integers(0, 256, N)
longest_text, longest_uniform = np.bincount(batch).max(), np.bincount(uniform).max()
C.table([("from the corpus", f"{longest_text:,}"), ("uniform over the 256 bytes", f"{longest_uniform:,}")],
        header=(f"a batch of {B} x {T} token ids", "positions of its most common token"), fmt=("", ""))
C.say(f"""
    A training batch of {B} x {T} = {N:,} positions from the corpus: its most common token holds
    {longest_text:,} of them. With ids drawn uniformly from the 256 bytes the most common one holds
    {longest_uniform}. A kernel timed on uniform ids was timed on the wrong problem.
""")

# %%
C.step("v2: a linked list per token, one block walks it")
from numba import cuda  # noqa: E402

from andrea_numba.kernels import embed  # noqa: E402
from lab import embed as lab_embed

Bs, Ts, Cs, V = 2, 12, 4, 256                       # a small batch the simulator runs in a moment
small = data[rng.integers(0, data.size - Ts, Bs)[:, None] + np.arange(Ts)].astype(np.int32)
flat = small.reshape(-1)
links = cuda.to_device(np.full((2, flat.size), -1, np.int32))
lab_embed.k_embed_bwd_links_v2[1, flat.size](links, cuda.to_device(flat))
nxt, head = links.copy_to_host()
rows = []
for i in np.flatnonzero(head):
    walk, j = [], i
    while j >= 0:
        walk.append(int(j))
        j = nxt[j]
    rows.append((repr(chr(flat[i])), " -> ".join(map(str, walk)), len(walk)))
rows.sort(key=lambda r: -r[2])
C.table(rows[:5], header=("token", "its list (positions, as links[0] chains them)", "steps"), fmt=("", "", ""))
C.say(f"""
    k_embed_bwd_links_v2 gave each position the next position with the same token (-1 at the end)
    and marked each token's first position as the head of its list. k_embed_bwd_v2 then runs one
    block per position; only the heads work, and each walks its list, adding the rows it visits.
    Every step waits for a load (the next link) before it knows where to go. The kernel takes as
    long as its longest list: here {rows[0][2]} steps, in the 12M batch above {longest_text:,}.
    On the H200 at 12M: 2.06 ms a call on the default corpus, 0.05 ms on uniform ids
    (docs/kernels.md).
""")

# %%
C.step("v3: sort each chunk by (token, position), then sum the runs")
S = embed.SORT_CHUNK
order_d = cuda.to_device(np.zeros(flat.size, np.int32))
embed.k_embed_bwd_sort[embed.cdiv(flat.size, S), S // 2](order_d, cuda.to_device(flat))
keys = order_d.copy_to_host()
shown = min(S, 8, flat.size)
chunk = [(p, flat[p], int(flat[p]) * S + p) for p in range(shown)]
C.table([(p, repr(chr(t)), k, int(keys[r]), repr(chr(keys[r] // S)), keys[r] % S)
         for r, (p, t, k) in enumerate(chunk)],
        header=("position", "token", "key = token*S + position", "sorted key", "its token", "its position"),
        fmt=("", "", "", "", "", ""))
C.say(f"""
    The first {shown} slots of the first chunk (S = {S} positions a chunk here: 8 in the simulator,
    1,024 on a GPU), keys before and after the sort. A key holds the token above the position, so
    sorting the keys puts a token's positions side by side and, among them, in position order. The sort is a bitonic network: log2(S) (log2(S) + 1) / 2
    rounds of compare-swaps, the same pairs whatever the data, a barrier after each round.
    Then one block per token finds its run in every chunk by binary search and adds the rows in
    that order: the positions in order, as v2 did, so the sums round the same way.
""")
dout = rng.standard_normal((Bs, Ts, Cs)).astype(np.float32)
dwte0 = rng.standard_normal((V, Cs)).astype(np.float32)
out = {}
for version in (2, 3):
    dwte, dwpe = cuda.to_device(dwte0), cuda.to_device(np.zeros((Ts, Cs), np.float32))
    lab_embed.VERSIONS["embed_bwd"][version](dwte, dwpe, cuda.device_array((2, flat.size), np.int32), cuda.to_device(dout),
                                         cuda.to_device(small), V, Ts)
    out[version] = dwte.copy_to_host()
ref = R.embed_bwd(dout.astype(np.float64), small, V, Ts)[0]
same = out[2].tobytes() == out[3].tobytes()
C.table([("v2 and v3 bit for bit", "identical" if same else "DIFFERENT"),
         ("v3 against the float64 twin", f"{np.abs(out[3] - dwte0 - ref).max():.1e}")],
        header=("dwte", ""), fmt=("", ""))
C.say("""
    On the H200, in the 12M training step (two microbatches of 16 x 512 from the default corpus):
    embed_bwd went from 5.27 ms to 1.53 ms a step and the step from 50.7 to 47.1 ms. v3's block for
    the space still adds its thousands of rows one after the other (the order is the price of the
    bits); v4, not yet timed, gives it a thread per channel and more loads in flight.
""")

# %%
runs = np.sort(np.bincount(batch))[::-1]
per_chunk = max(np.bincount(batch[p:p + 1024]).max() for p in range(0, N, 1024))
fig, ax = plt.subplots(1, 2, figsize=(11, 4), layout="constrained")
ax[0].bar(range(20), counts[order[:20]] / data.size, color="tab:blue")
ax[0].set_xticks(range(20), [repr(chr(b))[1:-1] or "?" for b in order[:20]], fontsize=8)
ax[0].set_ylabel("share of the corpus")
ax[0].set_title("the default corpus: the 20 most common bytes")
ax[1].bar(["text: v2's longest list", "uniform ids: v2's longest list", "text: longest run in a chunk of 1,024"],
          [longest_text, longest_uniform, per_chunk], color=["tab:red", "tab:gray", "tab:green"])
ax[1].set_ylabel("positions of one token")
ax[1].set_title(f"one {B} x {T} batch: the longest serial walk")
ax[1].tick_params(axis="x", labelsize=8)
C.savefig(fig, "09_skewed_sums.png")

C.finish()
