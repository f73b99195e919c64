"""Lesson 10: number formats below fp32, and which parts of training may use them.

What it teaches
    1. fp32, tf32, bf16 and fp16 bit by bit: how many exponent and mantissa bits each keeps, and
       what follows: the largest value, the smallest normal one, the gap between neighbours at 1.0
       (u, the unit roundoff, is half of it). bf16 keeps fp32's range with 8 significant bits;
       fp16 keeps 11 bits in a much smaller range.
    2. Rounding to nearest, ties to even, on the bit pattern (reference/precision.py), checked on
       the cases where it matters.
    3. Why the weights and AdamW stay fp32: an update a thousand times smaller than the weight
       vanishes in bf16 (the weight's neighbours are 2^-7 apart), so a bf16 master copy stops
       learning. The products may round their inputs; the running state may not.
    4. Why sums stay fp32: a long sum in bf16 stops growing once each new term is smaller than
       half a gap (swamping); the softmax's sum over the vocabulary and the loss's mean are such sums.
    5. Loss scaling for fp16: small gradients fall below fp16's smallest value and become 0.
       Multiplying the loss by S (2^16 here) moves every gradient up by S; the optimiser divides by
       S in fp32. Too large an S overflows to inf: the step is skipped and S halved, and after a
       run of good steps S doubles again (dynamic loss scaling), traced on made-up gradients.
    6. One bf16 tensor-core instruction traced by hand: mma.sync.m16n8k16 takes two bf16 values
       in each 32-bit register (the lower k in the low half: cvt.rn.bf16x2.f32, ptx.bf16x2). The
       lesson packs the 32 lanes' registers, runs the instruction's math lane by lane, and gets
       A @ B of the rounded values; then the k renaming of matmul v10, where a lane's four values
       of k in shared memory fill its two registers.
    7. ldmatrix, the instruction that fills those registers in matmul v12 and fast GEMMs: each lane
       names one 16-byte row of a bf16 tile in shared memory, and every lane receives the values
       the mma expects, the same registers as packing them by hand.
    8. wgmma, Hopper's warpgroup product (matmul v14): 128 threads, one 64 x N tile, A and B read
       straight from shared memory through 64-bit descriptors; a tile laid out in core matrices,
       its descriptors, and which thread holds which element of D.
    9. wgmma's transpose bits (matmul v17): a weight gradient's operand read M-major, as it is
       stored, instead of copied transposed first; the same bytes read without the bit are wrong.
   10. How matmul v18 feeds the tensor cores: one thread copies a whole tile with TMA, already
       swizzled as wgmma reads it, and mbarriers (a phase, arrivals and bytes still due) tell the
       consumers a stage has landed and the producer it is free again; a two-stage ring traced.

How to run (no GPU needed; a few seconds)

    python lessons/10_number_formats.py
    python lessons/10_number_formats.py --interactive --figures figs/

Open it in Jupyter or VS Code as a notebook: the `# %%` lines are cells.
"""
# %%
import _common as C

args = C.start(__doc__)

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from andrea_numba.kernels.ptx import tf32_round  # noqa: E402
from reference.precision import round_bf16  # noqa: E402

f32 = np.float32


def bits(x) -> str:
    """sign | exponent | mantissa of a float32."""
    b = format(int(np.array(x, dtype=f32).view(np.uint32)), "032b")
    return f"{b[0]} {b[1:9]} {b[9:]}"


def tf32(x):
    return np.vectorize(lambda v: float(tf32_round(f32(v))), otypes=[f32])(x)


def fp16(x):
    with np.errstate(over="ignore"):                   # past 65504 is inf, which is the point
        return np.asarray(x, f32).astype(np.float16).astype(f32)


def bits16(x) -> str:
    """sign | exponent | mantissa of an fp16."""
    b = format(int(np.array(x, dtype=np.float16).view(np.uint16)), "016b")
    return f"{b[0]} {b[1:6]} {b[6:]}"


# %%
C.step("Four formats, bit by bit")
# (name, exponent bits, mantissa bits kept) -> largest finite, smallest normal, gap at 1.0
FORMATS = [("fp32", 8, 23), ("tf32", 8, 10), ("bf16", 8, 7), ("fp16", 5, 10)]
rows = []
for name, e, m in FORMATS:
    bias = 2 ** (e - 1) - 1
    largest = (2 - 2.0 ** -m) * 2.0 ** bias            # all exponent bits but the last set, mantissa all ones
    smallest = 2.0 ** (1 - bias)                       # the smallest normal number
    rows.append((name, e, m, m + 1, f"{largest:.4g}", f"{smallest:.3g}", f"2^-{m} = {2.0 ** -m:.2e}"))
C.table(rows, header=("format", "exponent bits", "mantissa bits", "significant bits", "largest",
                      "smallest normal", "gap at 1.0"))
# the same edges measured with the formats' own rounding, not only derived
assert fp16(65504.0) == 65504.0 and np.isinf(fp16(70000.0))
bf16_max = (2 - 2.0 ** -7) * 2.0 ** 127
assert round_bf16(f32(bf16_max)) == f32(bf16_max) and np.isinf(round_bf16(np.finfo(f32).max))
x = f32(np.pi)
C.table([("fp32", bits(x), f"{float(x):.9f}"), ("tf32", bits(tf32(x)), f"{float(tf32(x)):.9f}"),
         ("bf16", bits(round_bf16(x)), f"{float(round_bf16(x)):.9f}"), ("fp16", bits16(x), f"{float(fp16(x)):.9f}")],
        header=("pi in", "sign exponent mantissa", "value"))
C.say("""
    bf16 is fp32 with the last 16 bits dropped: the same exponent, so the same range (about
    3.4e38 down to 1.2e-38), and 8 significant bits: neighbours 2^-7 apart at 1.0, so rounding
    moves a value by up to u = 2^-8 of itself (0.4%). fp16 keeps 11 significant bits (u = 2^-11)
    but only 5 exponent bits: nothing above 65504, nothing normal below 6.1e-5. 70000 in fp16 is inf.
""")

# %%
C.step("Rounding to nearest, ties to even, on the bit pattern")
gap = 2.0 ** -7
cases = [("1 + gap/2 (a tie)", 1 + gap / 2), ("1 + 3 gap/2 (a tie)", 1 + 3 * gap / 2),
         ("1 + gap/2 + 2^-20", 1 + gap / 2 + 2 ** -20), ("1 + gap/2 - 2^-20", 1 + gap / 2 - 2 ** -20)]
C.table([(name, f"{v:.10f}", f"{float(round_bf16(f32(v))):.10f}") for name, v in cases],
        header=("x", "x", "bf16(x)"))
C.say("""
    bits += 0x7FFF + (bit 16 of bits); bits &= 0xFFFF0000. Past the halfway point the add carries
    into the kept bits (round up); below it, it does not (round down); exactly at it, it carries
    only when the kept part is odd, so a tie goes to the even neighbour: 1 + gap/2 rounds down to
    1, 1 + 3 gap/2 up to 1 + 2 gap. The GPU's cvt.rn.bf16x2.f32 does the same (matmul v10).
""")

# %%
C.step("Why the weights and the optimiser stay fp32")
w16, w32 = round_bf16(f32(1.0)), f32(1.0)
update = 1e-3                                          # lr x (m / sqrt(v)): about lr, here 1e-3
trace16, trace32 = [], []
for _ in range(1000):
    w16 = round_bf16(f32(w16 + f32(update)))           # a bf16 master weight
    w32 = f32(w32 + f32(update))
    trace16.append(float(w16))
    trace32.append(float(w32))
C.say(f"""
    A weight of 1.0 and an AdamW update of 1e-3 a step, for 1000 steps: fp32 gets to
    {trace32[-1]:.4f}; a bf16 weight stays at {trace16[-1]:.4f}, because 1.0 + 1e-3 rounds back to
    1.0 (its neighbours are 2^-7 = 7.8e-3 apart) every single step. Updates are about lr times the
    weight's scale, far below bf16's resolution: so the master weights, the gradients' sum over
    microbatches and AdamW's m and v stay fp32, and only a product's inputs are rounded.
""")

# %%
C.step("Why long sums stay fp32")
terms = np.full(4096, 1e-3, np.float64)
s16 = f32(0.0)
stalled = None
for i, t in enumerate(terms):
    new = round_bf16(f32(s16 + f32(t)))
    if new == s16 and stalled is None:
        stalled = i
    s16 = new
C.say(f"""
    4096 terms of 1e-3 (exactly 4.096 in all), summed into a bf16 total: the total stops growing
    after {stalled} terms at {float(s16):.4f}: there bf16's neighbours are 2^-8 = {2.0 ** -8:.4f} apart,
    a term is less than half of that, and the total plus a term rounds back to the total (swamping). In fp32 the sum is {float(np.sum(terms.astype(f32))):.4f}.
    The softmax sums 256 (12M) or 50,304 (120M) exponentials per row and the loss averages 8,192
    positions: those sums, and the kernels' product sums, stay fp32.
""")

# %%
C.step("Loss scaling for fp16")
rng = np.random.default_rng(10)
grads = np.exp(rng.normal(np.log(3e-6), 2.5, 200_000))        # gradients spread over many decades
tiny = 2.0 ** -24                                              # fp16's smallest subnormal, 6.0e-8
lost = np.mean(fp16(grads) == 0)
lost_bf16 = np.mean(round_bf16(grads) == 0)
S = 2.0 ** 16
lost_scaled = np.mean(fp16(grads * S) == 0)
over_scaled = np.mean(np.isinf(fp16(grads * S)))
C.say(f"""
    Made-up gradients around 3e-6, spread over many decades: in fp16, {lost:.1%} of them are below
    its smallest value ({tiny:.1e}) and become 0; in bf16 {lost_bf16:.1%} do (its range is fp32's). Scale the
    loss by S = 2^16 before the backward: every gradient is S times larger, {lost_scaled:.1%} are
    lost and {over_scaled:.3%} overflow; the optimiser divides by S in fp32 before it uses them.
""")
scale, good, log = 2.0 ** 24, 0, []
for step in range(12):
    g = np.exp(rng.normal(np.log(3e-6), 2.5, 20_000)) * (50 if step == 7 else 1)   # step 7: a spike
    if np.any(np.isinf(fp16(g * scale))):
        log.append((step, f"2^{int(np.log2(scale))}", "inf in the scaled gradients: skip the step, halve S"))
        scale, good = scale / 2, 0
        continue
    good += 1
    note = "apply the step with g = (scaled g) / S, in fp32"
    if good == 4:                                       # a run of good steps: try a larger S again
        note += "; 4 good in a row: double S"
    log.append((step, f"2^{int(np.log2(scale))}", note))
    if good == 4:
        scale, good = scale * 2, 0
C.table(log, header=("step", "S", "decision"))
C.say("""
    Dynamic loss scaling: start with a large S; a step whose scaled gradients hold an inf is
    skipped (the weights stay as they were) and S halves; after a run of good steps S doubles.
    Every decision is logged, and S belongs in the run's state so that a resumed run makes the
    same ones. The trainer does exactly this with --precision fp16 (andrea_numba/loss_scale.py);
    bf16 needs none of it, its range being fp32's.
""")

# %%
C.step("mma.sync.m16n8k16 in bf16, one warp, traced by hand")


def pack(lo, hi):
    """Two bf16 in one 32-bit register, lo in the low half (cvt.rn.bf16x2.f32 hi, lo)."""
    b = round_bf16(np.array([lo, hi], f32)).view(np.uint32) >> 16
    return int(b[0]) | (int(b[1]) << 16)


def unpack(r):
    return (np.array([r & 0xFFFF, r >> 16], np.uint32) << 16).view(f32)


A = rng.standard_normal((16, 16)).astype(f32)
B = rng.standard_normal((16, 8)).astype(f32)
regs_a, regs_b = {}, {}
for lane in range(32):
    g, t = lane >> 2, lane & 3
    regs_a[lane] = [pack(A[g, 2 * t], A[g, 2 * t + 1]), pack(A[g + 8, 2 * t], A[g + 8, 2 * t + 1]),
                    pack(A[g, 2 * t + 8], A[g, 2 * t + 9]), pack(A[g + 8, 2 * t + 8], A[g + 8, 2 * t + 9])]
    regs_b[lane] = [pack(B[2 * t, g], B[2 * t + 1, g]), pack(B[2 * t + 8, g], B[2 * t + 9, g])]
# the instruction: every lane's C entries from all lanes' registers (a warp-wide product)
Ab = np.zeros((16, 16), f32)
Bb = np.zeros((16, 8), f32)
for lane in range(32):
    g, t = lane >> 2, lane & 3
    for (r, c), reg in zip(((g, 2 * t), (g + 8, 2 * t), (g, 2 * t + 8), (g + 8, 2 * t + 8)), regs_a[lane]):
        Ab[r, c:c + 2] = unpack(reg)
    for (k, n), reg in zip(((2 * t, g), (2 * t + 8, g)), regs_b[lane]):
        Bb[k:k + 2, n] = unpack(reg)
D = np.zeros((16, 8), f32)
for lane in range(32):
    g, t = lane >> 2, lane & 3
    for r, c in ((g, 2 * t), (g, 2 * t + 1), (g + 8, 2 * t), (g + 8, 2 * t + 1)):   # c0..c3 of this lane
        D[r, c] = f32(np.dot(Ab[r].astype(np.float64), Bb[:, c].astype(np.float64)))
exact = round_bf16(A).astype(np.float64) @ round_bf16(B).astype(np.float64)
lane5 = regs_a[5]
C.say(f"""
    Lane 5 (g = 1, t = 1) holds A[1, 2:4], A[9, 2:4], A[1, 10:12], A[9, 10:12] as four registers:
    {', '.join(f'0x{r:08x}' for r in lane5)}; the first unpacks to {unpack(lane5[0])} (A[1, 2:4] =
    {A[1, 2:4]} rounded). Put back together from the 32 lanes, the 16 x 8 result D differs from
    the float64 product of the rounded inputs by {np.max(np.abs(D - exact)):.1e} (every product of
    two bf16 is exact; only the fp32 sum rounds), and from the product of the unrounded inputs by
    {np.max(np.abs(D - A.astype(np.float64) @ B.astype(np.float64))) / np.max(np.abs(exact)):.1e}
    of the scale (the inputs' rounding).
""")
perm = {4 * t + j: (2 * t + j if j < 2 else 2 * t + 8 + j - 2) for t in range(4) for j in range(4)}
C.say(f"""
    matmul v10 renames k: in shared memory lane t's run of a row is k = 4t .. 4t + 3 (one 128-bit
    read), and it names them fragment k {[perm[4 + j] for j in range(4)]} for t = 1: its two
    registers (a0 and a2 of A, b0 and b1 of B). An mma sums its 16 values of k in any order, so
    A and B renamed alike give the same product; the four lanes t = 0..3 cover k 0..15 once:
    {sorted(perm.values()) == list(range(16))}.
""")

# %%
C.step("ldmatrix: one instruction loads those registers from shared memory (matmul v12)")
# the 16 x 16 tile of A in shared memory as bf16: 16 rows of 8 words (two values a word, lower column low)
shared = np.array([[pack(A[r, c], A[r, c + 1]) for c in range(0, 16, 2)] for r in range(16)], np.uint32)
# ldmatrix.x4: four 8 x 8 matrices; lanes 8i .. 8i + 7 each name one row (16 bytes) of matrix i.
# Matrices 0..3 are the tile's quarters: rows 8 (i % 2) + 0..7, columns 8 (i // 2) + 0..7.
row_of = [lane % 8 + 8 * ((lane // 8) % 2) for lane in range(32)]
col_of = [8 * (lane // 16) for lane in range(32)]
regs_ld = {}
for lane in range(32):
    g, t = lane >> 2, lane & 3
    # what the instruction returns: register i of lane 4 g + t = word t (values 2t, 2t + 1) of row g
    # of matrix i, the row that lane 8 i + g named
    regs_ld[lane] = [int(shared[row_of[8 * i + g], col_of[8 * i + g] // 2 + t]) for i in range(4)]
C.say(f"""
    Each lane gives one address, 32 rows of 16 bytes in all, and each lane receives four registers:
    lane 5 gets {', '.join(f'0x{r:08x}' for r in regs_ld[5])}, the registers packed by hand above
    ({regs_ld[5] == regs_a[5]}; all 32 lanes alike: {all(regs_ld[l] == regs_a[l] for l in range(32))}). One
    instruction replaces four 32-bit shared loads a lane, and the tile is rounded to bf16 once, as
    it is stored (matmul v12), where v10 rounds every value each time a lane reads it. The .trans
    form hands each 8 x 8 matrix over transposed: how v12 reads an operand whose k runs down its
    columns (a^T, b), so that no copy has to transpose it first.
""")

# %%
C.step("wgmma: four warps, one 64 x N product, operands read from shared memory (matmul v14)")
# Hopper's warpgroup instruction wgmma.mma_async.m64nNk16: 128 threads (a warpgroup) compute one
# 64 x N tile 16 deep. No lane hands A or B over in registers: the instruction reads both from
# shared memory, each described by a 64-bit "matrix descriptor" (kernels/wgmma.py). One k16 step
# of A (64 x 16 bf16) is 8 x 2 "core matrices" of 8 rows x 8 values, each 8 rows of 16 bytes stored
# one after another (128 bytes). The descriptor says where core matrix (i, j) starts:
#     start + i * SBO  (the next 8 rows)  +  j * LBO  (the next 8 values of k)
# Here A's two core matrices of each 8-row group sit side by side (LBO = 128, SBO = 256), B's too.
from andrea_numba.kernels import wgmma as WG  # noqa: E402

N_W = 8
Aw = round_bf16(rng.standard_normal((64, 16)).astype(f32))
Bw = round_bf16(rng.standard_normal((16, N_W)).astype(f32))
image = np.zeros(4096, np.uint8)                 # shared memory, byte by byte
halves = image.view(np.uint16)
B_START = 2048                                   # where B's tile starts (bytes)
r, k = np.arange(64)[:, None], np.arange(16)[None, :]
halves[WG.kmajor_offset(r, k, 64, WG.SWIZZLE_NONE, 128, 256) // 2] = WG.bf16_bits(Aw)    # A, K-major
n = np.arange(N_W)[:, None]
halves[(B_START + WG.kmajor_offset(n, k, N_W, WG.SWIZZLE_NONE, 128, 256)) // 2] = WG.bf16_bits(Bw.T)   # B^T, K-major
desc_a = WG.pack_desc(0, 128, 256, WG.SWIZZLE_NONE)
desc_b = WG.pack_desc(B_START, 128, 256, WG.SWIZZLE_NONE)
regs = WG.wgmma_warpgroup(image, desc_a, desc_b, N_W, scale_d=0)     # [128 threads, N/2 registers]
Dw = WG.fragment_to_matrix(regs)
rows_w, cols_w = WG.fragment_rows_cols(N_W)
C.say(f"""
    The descriptor of A: {desc_a:#018x} (start 0, LBO 128, SBO 256, no swizzle); of B: {desc_b:#018x}.
    The warpgroup's registers give A @ B of the rounded values: max |D - A @ B| / max |A @ B| = \
{np.abs(Dw - Aw.astype(np.float64) @ Bw).max() / np.abs(Aw.astype(np.float64) @ Bw).max():.1e}, \
within fp32 rounding: {bool(np.abs(Dw - Aw.astype(np.float64) @ Bw).max() <= 1e-6 * np.abs(Aw.astype(np.float64) @ Bw).max())}. Each warp owns 16 rows of D and holds them as an
    mma.sync m16n8 fragment once per 8 columns: thread 37 (warp 1, g = 1, t = 1) holds D{list(zip(rows_w[37].tolist(), cols_w[37].tolist()))}.
    This is NumPy's model of the instruction (wgmma.wgmma_warpgroup); on the H200
    (lab/bench/wgmma_probe.py, 2026-12-02) the instruction itself gave the same A @ B for this layout and
    13 others, swizzled ones included, to 5e-8-1.4e-7 of the scale. matmul v14 runs it from Numba:
    two warpgroups a 128 x 128 tile, the operands copied into shared memory by cp.async in v13's
    64-byte swizzle, which is one of wgmma's layouts (mode 2).
""")

# %%
C.step("The transpose bits: a weight gradient's operands read as they are stored (matmul v17)")
# A weight gradient dW = x^T @ dy sums over the tokens: k runs down the columns of x [tokens, d] and
# of dy. A K-major tile wants each row of A (an m) to hold its k values side by side, so v14 and v15
# first copied x and dy transposed, a copy as large as the activations. wgmma has a bit per operand
# (imm-trans-a, imm-trans-b) that says "this one is M-major" (N-major for B): each k then holds its
# m values side by side, which is how x^T's rows arrive from memory. The 128-byte swizzle's atom is
# the same 8 rows of 128 bytes, now 8 values of k of 64 values of m:
#     element (m, k) at  swizzle(start + (m // 64) LBO + (k // 8) SBO + (k % 8) 128 + (m % 64) 2)
# LBO steps along M (the next 64 values of m), SBO along K: the roles K-major gave them, swapped.
At = round_bf16(rng.standard_normal((16, 64)).astype(f32))      # x^T's tile as stored: [k, m]
image_t = np.zeros(16384, np.uint8)              # (room for the wrong reading below too)
halves_t = image_t.view(np.uint16)
kk, mm = np.arange(16)[:, None], np.arange(64)[None, :]
halves_t[WG.mnmajor_offset(mm, kk, 16, WG.SWIZZLE_128B) // 2] = WG.bf16_bits(At)           # A, M-major
halves_t[(B_START + WG.kmajor_offset(n, k, N_W, WG.SWIZZLE_NONE, 128, 256)) // 2] = WG.bf16_bits(Bw.T)
lbo_t, sbo_t = WG.mnmajor_lbo_sbo(16, WG.SWIZZLE_128B)
desc_t = WG.pack_desc(0, lbo_t, sbo_t, WG.SWIZZLE_128B)
Dt = WG.fragment_to_matrix(WG.wgmma_warpgroup(image_t, desc_t, desc_b, N_W, scale_d=0, trans_a=1))
ref_t = At.T.astype(np.float64) @ Bw
plain = WG.fragment_to_matrix(WG.wgmma_warpgroup(image_t, desc_t, desc_b, N_W, scale_d=0, trans_a=0))
C.say(f"""
    x^T's tile is stored as it arrives, [k, m], M-major with the 128-byte swizzle (LBO {lbo_t}, SBO
    {sbo_t}). With the transpose bit set, the warpgroup gives A @ B: max |D - A @ B| / max |A @ B| = \
{np.abs(Dt - ref_t).max() / np.abs(ref_t).max():.1e} (the M-major read is right: \
{bool(np.abs(Dt - ref_t).max() <= 1e-6 * np.abs(ref_t).max())}). With the bit clear the same bytes are read as a K-major \
tile: {np.abs(plain - ref_t).max() / np.abs(ref_t).max():.1e} of the scale off (right: \
{bool(np.abs(plain - ref_t).max() <= 1e-6 * np.abs(ref_t).max())}).
    On the H200 (lab/bench/wgmma_probe.py, 2026-12-02) the instruction agreed with this model on 9
    MN-major layouts (A, B or both, with the 128-, 64- and 32-byte swizzles and without), and the
    controls (a bit clear, LBO and SBO swapped) failed as it predicts. matmul v17 reads every operand so:
    the 120M weight gradient dW_1 += x^T @ dh went from 105 TFLOP/s (v15, two transposed copies)
    to 184 (docs/precision.md).
""")

# %%
C.step("TMA and mbarriers: how matmul v18 keeps the tensor cores fed")


class Mbarrier:
    """What the hardware's mbarrier counts in shared memory (kernels/tma.py): the current phase,
    the arrivals it still waits for (re-armed to `count` when a phase ends), and the bytes of the
    copies it still waits for. A phase ends when both reach zero."""

    def __init__(self, count):
        self.phase, self.count, self.arrivals, self.bytes = 0, count, count, 0

    def _maybe_flip(self):
        if self.arrivals == 0 and self.bytes == 0:
            self.phase, self.arrivals = self.phase + 1, self.count

    def arrive(self, expect_bytes=0):          # mbarrier.arrive[.expect_tx]
        self.bytes += expect_bytes
        self.arrivals -= 1
        self._maybe_flip()

    def landed(self, nbytes):                   # a TMA copy's complete_tx
        self.bytes -= nbytes
        self._maybe_flip()

    def try_wait(self, parity):                 # mbarrier.try_wait.parity: is the phase of this parity over?
        return self.phase % 2 != parity


STAGES, STAGE_BYTES = 2, 48 * 1024              # v18's 128 x 256 tile: 48 KiB a stage (4 in v18)
full = [Mbarrier(1) for _ in range(STAGES)]     # the producer's one arrival + the stage's bytes
empty = [Mbarrier(1) for _ in range(STAGES)]    # one consumer warp here (v18: 8)
trace = []
for g in range(5):                              # use g of the ring: stage g % STAGES, parity (g // STAGES) & 1
    st, par = g % STAGES, (g // STAGES) & 1
    assert empty[st].try_wait(par ^ 1)          # producer: the stage's last use is done (passes at once at first)
    full[st].arrive(STAGE_BYTES)                # expect_tx: my arrival, 48 KiB to come
    ready_early = full[st].try_wait(par)        # the copies have not landed yet: a consumer would wait
    full[st].landed(STAGE_BYTES // 3)           # A's box (16 KiB) ...
    full[st].landed(2 * STAGE_BYTES // 3)       # ... and B's (32 KiB)
    assert full[st].try_wait(par)               # consumer: the stage is in shared memory
    empty[st].arrive()                          # consumer: done with it (v18 waits one use later)
    trace.append(f"use {g}: stage {st}, parity {par}; ready before the bytes landed: {ready_early}; "
                 f"full[{st}] now in phase {full[st].phase}")
for line in trace:
    C.say(line)

box = np.arange(8 * 8).reshape(8, 8)            # 8 rows of a box, 8 chunks of 16 bytes a row
swizzled = np.empty_like(box)
for r in range(8):
    for q in range(8):
        swizzled[r, q ^ r] = box[r, q]          # TMA's 128-byte swizzle: chunk q of row r at q ^ (r & 7)
C.say(f"""
    A phase is over when its arrivals and its bytes are all in; a waiter names the phase by its
    parity, so a fresh barrier (phase 0) lets a wait on parity 1 through at once: that is how the
    producer's first {STAGES} waits on the empty barriers pass before any consumer has let go of anything.
    The copy engine writes each 128-byte row of a box with its 16-byte chunks permuted (row r: chunk
    q at q ^ (r & 7)), the layout wgmma's 128-byte swizzle mode reads without bank conflicts. The
    chunks of rows 0-7 as they land (each number is a chunk's place in the plain row-major box):
{chr(10).join("        " + " ".join(f"{v:2d}" for v in row) for row in swizzled)}
    On the H200 (docs/precision.md, 2026-12-03) v18 gives v17's bits and runs the 120M MLP's
    x @ W_1 at 382 TFLOP/s with its operand copies (v17: 217) and the logits at 505 (v17: 233); the
    120M bf16 forward + backward went from 38.1 ms (v17) to 26.4 (v18, with the other kernels of that date).
""")

# %%
C.step("The formats' resolution across their ranges")
fig, ax = plt.subplots(figsize=(7, 4))
for name, e, m in FORMATS:
    bias = 2 ** (e - 1) - 1
    exps = np.arange(1 - bias, bias + 1)
    ax.loglog(2.0 ** exps.astype(float), 2.0 ** (exps - m).astype(float), label=f"{name} (gap = 2^(e-{m}))")
ax.set_xlabel("magnitude of the value")
ax.set_ylabel("gap to the next value")
ax.set_title("Where each format can and cannot represent a number")
ax.legend()
C.savefig(fig, "10_number_formats.png")
C.finish()
