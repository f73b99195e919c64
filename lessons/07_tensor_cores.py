"""Lesson 07: how a tensor core multiplies, and how to get fp32 accuracy out of it (3xTF32).

What it teaches
    1. TF32: the tensor core reads an fp32 number with only 10 of its 23 mantissa bits (the
       rounding `cvt.rna.tf32.f32`, here its NumPy twin from andrea_numba/kernels/ptx.py). One
       TF32 product is off by up to 2^-11 relative: a thousand times fp32's rounding.
    2. One instruction, one warp: `mma.sync.m16n8k8` multiplies a 16 x 8 tile by an 8 x 8 tile.
       No thread holds a whole row: the 32 lanes each hold 4 values of A, 2 of B and 4 of C, in
       the layout the PTX manual fixes. The lesson builds those registers lane by lane, runs the
       instruction's math, and puts C back together: it equals A @ B.
    3. 3xTF32: split x = big + small (big = tf32(x), small = tf32(x - big)); then
       a b ~ small_a big_b + big_a small_b + big_a big_b carries about 21 bits of each operand.
       Three tensor-core products give the accuracy of one fp32 product; small may be left
       unrounded for the tensor core to truncate (matmul v7).
    4. Where the sums go: summing 8-deep tensor-core products into an fp32 accumulator with an
       ordinary fp32 add (what matmul v4 does) against a chain that never leaves the tensor core.
    5. The warp tile of matmul v3/v4 (andrea_numba/kernels/warp_tile.py): which lane of which
       warp owns which output, run as a kernel (in the simulator its SIMT twin) and checked
       against NumPy.
    6. Renaming k (matmul v6, andrea_numba/kernels/split_tile.py): an mma sums its 8 values of k
       in any order, so a kernel may choose which k each fragment slot holds. Chosen well, each
       lane's values for two k-steps sit side by side in shared memory: one 128-bit read instead
       of four. Checked here with the lane-by-lane model of step 2, then run as a kernel.
    7. Waves: a GPU runs only so many blocks at once; a launch of few, long blocks (a weight
       gradient) leaves it idle in its last wave. How matmul.splitk picks its slices of K.
    8. Bank conflicts and a swizzle (matmul v8): which shared-memory bank each lane's access
       hits, for the fragment reads and the three ways of storing a tile, with and without v8's
       row swizzle phys(r) = r ^ ((r >> 2) & 1).

How to run (no GPU needed; a few seconds)

    python lessons/07_tensor_cores.py
    python lessons/07_tensor_cores.py --interactive --figures figs/

Open it in Jupyter or VS Code as a notebook: the `# %%` lines are cells.
"""
# %%
import _common as C

args = C.start(__doc__)

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from andrea_numba.kernels.ptx import tf32_round  # noqa: E402

f32 = np.float32
tf32 = np.vectorize(lambda x: float(tf32_round(f32(x))), otypes=[np.float32])   # the twin, elementwise


def bits(x) -> str:
    """sign | exponent | mantissa of a float32, the mantissa's last 13 bits set apart."""
    b = format(int(np.array(x, dtype=f32).view(np.uint32)), "032b")
    return f"{b[0]} {b[1:9]} {b[9:19]} {b[19:]}"


# %%
C.step("TF32: fp32 with 10 mantissa bits")
x = f32(np.pi)
C.say("""
    A float32 is 1 sign bit, 8 exponent bits and 23 mantissa bits. A tensor core in TF32 mode
    reads only the first 10 mantissa bits: `cvt.rna.tf32.f32` rounds to the nearest such value
    (ties away from zero) and leaves the last 13 bits zero. (The kernels get the same rounding
    from two integer instructions on the bit pattern: add 0x1000, clear the low 13 bits.)
""")
C.table([("pi in float32", bits(x), f"{float(x):.9f}"), ("tf32(pi)", bits(tf32(x)), f"{float(tf32(x)):.9f}")],
        header=("", "sign exponent mantissa(10) low 13 bits", "value"))
rng = np.random.default_rng(7)
v = rng.standard_normal(100_000).astype(f32)
rel = np.abs(tf32(v).astype(np.float64) - v) / np.abs(v)
C.say(f"""
    Over 100,000 random numbers the largest relative change is {rel.max():.2e}, about 2^-11 =
    {2.0 ** -11:.2e} (fp32 itself keeps 2^-24 = {2.0 ** -24:.1e}). A product of two TF32 numbers is
    exact inside the tensor core, but its inputs were already off by that much.
""")

# %%
C.step("mma.sync.m16n8k8: one warp, 32 lanes, one 16 x 8 x 8 product")
A = tf32(rng.standard_normal((16, 8)))          # TF32 values, so the instruction's math is exact here
B = tf32(rng.standard_normal((8, 8)))
C0 = np.zeros((16, 8), f32)
regs = []                                       # what each lane holds in its registers
for lane in range(32):
    g, t = lane >> 2, lane & 3
    a = (A[g, t], A[g + 8, t], A[g, t + 4], A[g + 8, t + 4])
    b = (B[t, g], B[t + 4, g])
    c = (C0[g, 2 * t], C0[g, 2 * t + 1], C0[g + 8, 2 * t], C0[g + 8, 2 * t + 1])
    regs.append((a, b, c))
C.say("""
    Lane = 4 g + t (g = lane >> 2 is 0..7, t = lane & 3 is 0..3). The PTX manual fixes which
    elements each lane brings (kernels/ptx.py has the same table):

        A (16 x 8):  a0 = A[g, t]   a1 = A[g+8, t]   a2 = A[g, t+4]   a3 = A[g+8, t+4]
        B (8 x 8):   b0 = B[t, g]   b1 = B[t+4, g]
        C (16 x 8):  c0 = C[g, 2t]  c1 = C[g, 2t+1]  c2 = C[g+8, 2t]  c3 = C[g+8, 2t+1]

    The first lanes' registers:
""")
C.table([(lane, f"g={lane >> 2} t={lane & 3}", " ".join(f"{v:+.3f}" for v in regs[lane][0]),
          " ".join(f"{v:+.3f}" for v in regs[lane][1])) for lane in range(5)],
        header=("lane", "", "a0 a1 a2 a3", "b0 b1"))


def mma_m16n8k8(regs):
    """The instruction's math from the 32 lanes' registers: gather A and B, D = A @ B + C, and
    scatter D back into each lane's d0..d3 (what the hardware does in one step)."""
    A_, B_, C_ = np.zeros((16, 8), np.float64), np.zeros((8, 8), np.float64), np.zeros((16, 8), np.float64)
    for lane, (a, b, c) in enumerate(regs):
        g, t = lane >> 2, lane & 3
        A_[g, t], A_[g + 8, t], A_[g, t + 4], A_[g + 8, t + 4] = a
        B_[t, g], B_[t + 4, g] = b
        C_[g, 2 * t], C_[g, 2 * t + 1], C_[g + 8, 2 * t], C_[g + 8, 2 * t + 1] = c
    D_ = (A_ @ B_ + C_).astype(f32)
    return [(D_[lane >> 2, 2 * (lane & 3)], D_[lane >> 2, 2 * (lane & 3) + 1],
             D_[(lane >> 2) + 8, 2 * (lane & 3)], D_[(lane >> 2) + 8, 2 * (lane & 3) + 1]) for lane in range(32)]


d = mma_m16n8k8(regs)
D = np.zeros((16, 8), f32)
for lane in range(32):
    g, t = lane >> 2, lane & 3
    D[g, 2 * t], D[g, 2 * t + 1], D[g + 8, 2 * t], D[g + 8, 2 * t + 1] = d[lane]
err = np.abs(D - A.astype(np.float64) @ B).max()
C.say(f"""
    Put back together from the 32 lanes' d0..d3, D equals A @ B: largest difference {err:.1e}.
    No lane ever held a whole row of A or a whole column of B: the warp as a whole multiplies.
    That is why an `mma.sync` kernel is written per warp, and why its simulator twin cannot be one
    lane's arithmetic (in the simulator matmul v4 runs a NumPy twin of the 8-deep step: step 5).
""")

# %%
C.step("3xTF32: three tensor-core products, fp32 accuracy")


def split(x):
    big = tf32(x)
    return big, tf32(x.astype(f32) - big)


K = 4096
a = rng.standard_normal(K).astype(f32)
b = rng.standard_normal(K).astype(f32)
exact = float(a.astype(np.float64) @ b.astype(np.float64))
ab, as_ = split(a)
bb, bs = split(b)
one = float(np.dot(tf32(a).astype(np.float64), tf32(b).astype(np.float64)))            # products exact, sum in float64
three = float(np.dot(as_.astype(np.float64), bb) + np.dot(ab.astype(np.float64), bs) + np.dot(ab.astype(np.float64), bb))
fp32 = float(np.float32(0.0) + np.sum(a * b, dtype=f32))
rows = [("TF32: tf32(a) . tf32(b)", one, abs(one - exact) / abs(exact)),
        ("3xTF32: small.big + big.small + big.big", three, abs(three - exact) / abs(exact)),
        ("fp32 multiply-adds", fp32, abs(fp32 - exact) / abs(exact)),
        ("exact (float64)", exact, 0.0)]
C.table(rows, header=("a . b over K = 4096", "value", "relative error"), fmt=("", ".8f", ".1e"))
C.say(f"""
    Each float splits into big = tf32(x) and small = tf32(x - big): together about 21 of its 24
    bits. Of the four products of (big + small)(big + small) the smallest, small * small, is
    about 2^-22 of the whole and is left out. The small products come first, so they are not lost
    against the large one. The result lands within a few times fp32's own error ({rows[1][2]:.1e}
    against {rows[2][2]:.1e} here), where TF32 alone is a thousand times worse. The tensor cores do
    three times the work, and on an H200 still beat the SIMT multiply-adds: 37 against 20 TFLOP/s
    at 4096^3 (docs/kernels.md).
""")
# the tensor core reads a TF32 operand's top 19 bits only: handed x - big unrounded, it truncates it
trunc = lambda x: (np.asarray(x, f32).view(np.uint32) & np.uint32(0xFFFFE000)).view(f32)   # noqa: E731
as_t, bs_t = trunc(a - ab), trunc(b - bb)
three_t = float(np.dot(as_t.astype(np.float64), bb) + np.dot(ab.astype(np.float64), bs_t) + np.dot(ab.astype(np.float64), bb))
C.table([("small = tf32(x - big), rounded (matmul v6)", abs(three - exact) / abs(exact)),
         ("small = x - big, truncated by the tensor core (v7)", abs(three_t - exact) / abs(exact))],
        header=("3xTF32 over K = 4096", "relative error"), fmt=("", ".1e"))
C.say("""
    Rounding small costs two integer instructions a value, and the kernels split every value they
    read. A tensor core reads a TF32 operand from its top 19 bits and ignores the rest, so matmul
    v7 hands it x - big as it is: the tensor core truncates it, toward zero instead of to nearest,
    an error below 2^-21 |x| instead of 2^-22, next to the 2^-22 of the small * small product left
    out anyway. Three instructions a split instead of five; the same accuracy in practice.
""")

# %%
C.step("Where the sums go: the accumulator")
C.say("""
    A long product is a chain of 8-deep mma steps. The first matmul v4 passed each step's result
    back into the next instruction as its C, so all of K was summed inside the tensor core. On the
    H200 its error grew with K: 3.4e-6 at K = 384, 3.0e-5 at K = 4096, ten times the SIMT
    kernel's. An error that grows with the length of the chain is what an adder that does not
    round to nearest leaves (its small errors lean one way instead of cancelling). The fix: each
    8-deep step starts from C = 0 and its result is added to the thread's fp32 accumulator with
    an ordinary add. Errors fell to 2.6e-7 .. 9.7e-7, at or below the SIMT kernel's. The model
    below truncates the running sum to 24 bits (a stand-in: NVIDIA does not document the tensor
    core's adder) and compares the two ways:
""")


def _trunc(x):
    """x cut (towards zero) to a 24-bit mantissa instead of rounded to the nearest float32."""
    m, e = np.frexp(x)
    return float(np.ldexp(np.trunc(m * 2.0 ** 24) / 2.0 ** 24, e))


terms = (as_.astype(np.float64) * bb + ab.astype(np.float64) * bs + ab.astype(np.float64) * bb)
inside, outside = 0.0, f32(0.0)
for k0 in range(0, K, 8):
    step8 = 0.0
    for k in range(k0, k0 + 8):
        step8 = _trunc(step8 + terms[k])
        inside = _trunc(inside + terms[k])
    outside = f32(outside + f32(step8))                     # fp32 add, round to nearest
C.table([("all of K inside the tensor core (truncating adds)", inside, abs(inside - exact) / abs(exact)),
         ("8 at a time, then fp32 adds (matmul v4)", float(outside), abs(float(outside) - exact) / abs(exact))],
        header=("sum of the 3xTF32 terms", "value", "relative error"), fmt=("", ".8f", ".1e"))

# %%
C.step("The warp tile of matmul v3 / v4: which lane owns which output")
from numba import cuda  # noqa: E402

from lab import matmul as MM  # noqa: E402  (the whole ladder: v3, v4, v6 are the lab's rungs)

BM, BN, BK, WM, WN = MM.matmul_v4.blocks[0]
C.say(f"""
    A block computes a {BM} x {BN} tile of out = a @ b; its {(BM // WM) * (BN // WN)} warp(s) own
    {WM} x {WN} pieces. Inside a warp, lane 4 g + t owns the C-fragment places of every 16 x 8
    fragment: rows g and g + 8, columns 2t and 2t + 1 (kernels/warp_tile.py, row(i) and col(j)).
    The map below is one warp's piece, each output labelled by the lane that sums it.
""")
owner = np.zeros((WM, WN), int)
for lane in range(32):
    g, t = lane >> 2, lane & 3
    for mi in range(WM // 16):
        for ni in range(WN // 8):
            for h in range(2):
                for c in range(2):
                    owner[16 * mi + 8 * h + g, 8 * ni + 2 * t + c] = lane
print("    " + "\n    ".join(" ".join(f"{v:2d}" for v in row[:16]) for row in owner[:16]))
print()
M_, K_, N_ = 40, 24, 36
x = rng.standard_normal((M_, K_)).astype(f32)
w = rng.standard_normal((K_, N_)).astype(f32)
outs = {}
for name, launch in (("v3 (SIMT)", MM.matmul_v3), ("v4 (3xTF32)", MM.matmul_v4)):
    out = cuda.to_device(np.zeros((M_, N_), f32))
    launch(out, None, cuda.to_device(x), cuda.to_device(w))
    outs[name] = out.copy_to_host()
ref = x.astype(np.float64) @ w
C.table([(name, np.abs(o - ref).max() / np.abs(ref).max()) for name, o in outs.items()],
        header=(f"out = x @ w, {M_} x {K_} @ {K_} x {N_}", "max |err| / max |ref|"), fmt=("", ".1e"))
where = ("in the CUDA simulator, where v4's 8-deep product is a NumPy twin of the mma (one lane "
         "cannot run it)") if C.SIMULATED else "on the GPU"
C.say(f"""
    Both kernels ran {where}. Same tiles, same owners, same order of the K steps: only the inner
    8-deep step differs, multiply-adds in v3, three mma.sync per fragment in v4.
""")

# %%
C.step("Renaming k: matmul v6 reads two k-steps of a fragment at once")
A16 = tf32(rng.standard_normal((16, 16)))       # one fragment's rows over a stage of 16 values of k
B16 = tf32(rng.standard_normal((16, 8)))
Bt16 = np.ascontiguousarray(B16.T)              # B kept with k along its rows too: Bt16[n, k]
slots = []
c_regs = [(f32(0),) * 4 for _ in range(32)]
for ks in range(2):                             # two 8-deep mma steps cover the 16 values of k
    regs_k = []
    for lane in range(32):
        g, t = lane >> 2, lane & 3
        ra, ra8, rb = A16[g, 4 * t:4 * t + 4], A16[g + 8, 4 * t:4 * t + 4], Bt16[g, 4 * t:4 * t + 4]
        u, v_ = 2 * ks, 2 * ks + 1              # slot t <- k = 4t + 2ks, slot t + 4 <- k = 4t + 2ks + 1
        regs_k.append(((ra[u], ra8[u], ra[v_], ra8[v_]), (rb[u], rb[v_]), c_regs[lane]))
        if lane < 4:
            slots.append((ks, lane, f"k = {4 * t + u}", f"k = {4 * t + v_}"))
    c_regs = mma_m16n8k8(regs_k)
D16 = np.zeros((16, 8), f32)
for lane in range(32):
    g, t = lane >> 2, lane & 3
    D16[g, 2 * t], D16[g, 2 * t + 1], D16[g + 8, 2 * t], D16[g + 8, 2 * t + 1] = c_regs[lane]
C.table(slots, header=("k-step", "lane (g = 0)", "slot t holds", "slot t + 4 holds"))
err16 = np.abs(D16 - A16.astype(np.float64) @ B16).max()
C.say(f"""
    Lane 4 g + t reads A[g, 4t .. 4t+3], A[g+8, 4t .. 4t+3] and B^T[g, 4t .. 4t+3]: three runs
    of 4 contiguous floats, one 128-bit read each, for both k-steps of a 16-deep stage. The
    mma's slot t (and t + 4) no longer means k = t: it means whatever k the lane put there. A and
    B put the same k in the same slot, so the sum over k is the same sum: the two chained mma
    give A @ B, largest difference {err16:.1e}. matmul v4 read those 12 values with 12 scalar
    reads. On an H200 this (with one fp32 add per 16-deep stage instead of one per 8) took the
    120M MLP product from 38 to 49 TFLOP/s, cuBLAS SGEMM's speed (docs/kernels.md):
    shared-memory traffic, not the tensor cores, had set v4's time.
""")
out6 = cuda.to_device(np.zeros((M_, N_), f32))
MM.matmul_v6(out6, None, cuda.to_device(x), cuda.to_device(w))
C.table([("v6 (3xTF32, k renamed)", np.abs(out6.copy_to_host() - ref).max() / np.abs(ref).max())],
        header=(f"out = x @ w, {M_} x {K_} @ {K_} x {N_}", "max |err| / max |ref|"), fmt=("", ".1e"))

# %%
C.step("Waves: how many blocks run at once, and how many slices of K to cut")
SMS, PER_SM = 132, 2          # the H200's multiprocessors; blocks of matmul v6 (128 x 64) on each
RESIDENT = SMS * PER_SM
C.say(f"""
    A GPU does not run every block of a launch at once. A multiprocessor holds as many blocks as
    its registers and shared memory allow: matmul v6's 128 x 64 block uses 242 registers in each
    of its 128 threads, so {PER_SM} fit, and the H200 runs {RESIDENT} at a time (the CUDA occupancy API
    tells the launcher: matmul.resident_blocks). A launch of n equal blocks runs in waves of
    {RESIDENT}, and the last wave may be nearly empty. A weight gradient has few output tiles and a
    long K (K = B*T), so split-K cuts K into S slices, S times the blocks, each S times shorter,
    and matmul.splitk picks the S of fewest wave-stages (a stage: 16 values of k).
""")
rows7 = []
for label, Mw, Nw in (("120M dW_1 (768 x 3072)", 768, 3072), ("120M dW_O (768 x 768)", 768, 768),
                      ("12M dW_O (384 x 384)", 384, 384)):
    Kw, tiles = 8192, -(-Mw // 128) * -(-Nw // 64)
    workw = np.zeros(MM.splitk_work(768 if label.startswith("120M") else 384), f32)
    for S in (1, 4, None):
        if S is None:
            S, ksplit = MM.splitk(Mw, Nw, Kw, 1, (128, 64, 16, 64, 32), workw, RESIDENT)
            how = "splitk's choice"
        else:
            how, ksplit = "S = 1 (whole K)" if S == 1 else "S = 4", -(-Kw // S)
        waves = -(-tiles * S // RESIDENT)
        stages = -(-ksplit // 16)                 # a slice's stages of 16 values of k
        rows7.append((label, how, S, tiles * S, waves, waves * stages, tiles * Kw / 16 / (waves * stages * RESIDENT)))
C.table(rows7, header=("product, K = 8192", "slices", "S", "blocks", "waves", "wave-stages", "GPU busy"),
        fmt=("", "", "d", "d", "d", "d", ".0%"))
C.say("""
    Whole, the 120M dW_1 is 288 blocks: one full wave and a second of 24 blocks, the GPU 55% busy.
    splitk's 8 slices make 9 full waves. On the H200 (Nsight Compute, docs/kernels.md) this
    took dW_1 from 1.68 to 0.97 ms and the 768 x 768 weight gradients from 0.41 to 0.24 ms. The
    slices' partial tiles are then added in a fixed order by a second kernel: no atomics, the same
    bits on every run.
""")

# %%
C.step("Bank conflicts: why matmul v8 swizzles its shared rows")
C.say("""
    Shared memory has 32 banks of 4 bytes. A warp's 32-bit access is one pass if its 32 lanes hit
    32 different banks; two lanes on one bank (at different addresses) cost a second pass. A
    128-bit access is served 8 lanes at a time, one pass when the 8 lanes' 16-byte groups
    (address / 16 mod 8) differ. The k-major tile keeps tile row r's 16 values of k in shared row r
    (64 bytes: two rows to a 128-byte line). v8 moves tile row r to shared row
    phys(r) = r ^ ((r >> 2) & 1). Below: the passes each access needs, counted from the addresses.
""")


def passes(addr_bytes, vec):
    """Passes of one warp access: 128-bit (vec) in quarter-warps of 8 lanes, or 32-bit."""
    addr = np.asarray(addr_bytes)
    if not vec:
        banks = (addr // 4) % 32
        return max(np.bincount(banks, minlength=32))
    return sum(max(np.bincount((addr[q:q + 8] // 16) % 8, minlength=8)) for q in range(0, 32, 8))


lanes = np.arange(32)
g8, t8 = lanes >> 2, lanes & 3
ident = lambda r: r                                  # noqa: E731
swz = lambda r: r ^ ((r >> 2) & 1)                   # noqa: E731
patterns = [
    ("fragment read: row g, k = 4t..4t+3 (128-bit)", lambda ph: [passes(4 * (16 * ph(g8) + 4 * t8), True)]),
    ("straight copy: row e // 4, k = 4 (e % 4).. (128-bit)", lambda ph: [passes(4 * (16 * ph(lanes // 4) + 4 * (lanes % 4)), True)]),
    ("v6's transposed copy: k = e % 16 down rows 4 (e // 16) + i (32-bit, x4)",
     lambda ph: [passes(4 * (16 * ph(4 * (lanes // 16) + i) + lanes % 16), False) for i in range(4)]),
    ("v8's 4 x 4 block: row 4 (b // 4) + i, k = 4 (b % 4).. (128-bit, x4)",
     lambda ph: [passes(4 * (16 * ph(4 * (lanes // 4) + i) + 4 * (lanes % 4)), True) for i in range(4)]),
]
rows8 = []
for name, f in patterns:
    plain, swizzled = f(ident), f(swz)
    ideal = len(plain) * (4 if "128" in name else 1)
    rows8.append((name, sum(plain), sum(swizzled), ideal))
C.table(rows8, header=("access of one warp", "passes, rows as they are", "with phys(r)", "passes at best"),
        fmt=("", "d", "d", "d"))
C.say("""
    Without the swizzle the fragment reads and the straight copy are already at their best, but
    v6's transposed copy (16 lanes down one tile row's column, 16 down the row four further on)
    puts two lanes on every bank, and a 4 x 4 block store puts two lanes' groups together: rows
    r and r + 4 have the same parity, so they share the same half of a 128-byte line. The swizzle
    swaps rows 4..7 of every 8 in pairs: rows r and r + 4 then differ in parity, and every access
    above needs the fewest passes. The swizzle costs one XOR per thread (a warp's fragment rows
    are a multiple of 16 plus g). On the H200 v8's 4 x 4 blocks and swizzle took the weight
    gradients at 120M from 80-85% of cuBLAS SGEMM's speed to 100-107% (docs/kernels.md).
""")
out8 = cuda.to_device(np.zeros((K_, K_), f32))
MM.matmul_tf32x3(out8, None, cuda.to_device(x), cuda.to_device(x), trans_a=True)
ref8 = x.T.astype(np.float64) @ x
C.table([("v8 (swizzled tiles), x^T @ x", np.abs(out8.copy_to_host() - ref8).max() / np.abs(ref8).max())],
        header=(f"out = x^T @ x, {K_} x {M_} @ {M_} x {K_}", "max |err| / max |ref|"), fmt=("", ".1e"))

fig, ax = plt.subplots(1, 2, figsize=(11, 4.2), layout="constrained")
im = ax[0].imshow(owner, cmap="tab20", interpolation="nearest")
ax[0].set_title(f"lane owning each output of one warp's {WM} x {WN} piece")
ax[0].set_xlabel("column")
ax[0].set_ylabel("row")
fig.colorbar(im, ax=ax[0], fraction=0.046)
names = ["TF32", "3xTF32", "fp32"]
ax[1].bar(names, [max(r[2], 1e-12) for r in rows[:3]], color=["tab:red", "tab:green", "tab:blue"])
ax[1].set_yscale("log")
ax[1].set_ylabel(f"relative error of a . b, K = {K}")
ax[1].set_title("one product of TF32 against three")
C.savefig(fig, "07_tensor_cores.png")

C.finish()
