"""On an H200: can Numba drive Hopper's warpgroup product wgmma.mma_async, and which shared-memory
layout (descriptor LBO / SBO / swizzle) does it read? (kernels/wgmma.py has the instructions, the
layouts and the NumPy twin.)

One kernel of 128 threads (one warpgroup) per accumulator width N: it copies an image of shared
memory built on the host (A 64 x K and B^T N x K, bf16 bits, K-major, in one layout) into a shared
array at a 1024-byte boundary, fences it for the async proxy, and runs K/16 wgmma m64nNk16 steps
(scale-d 0, then 1) with descriptors built on the device; the 128 threads write their N/2
accumulator registers, and the host reads them through the documented fragment layout. Each
variant is one layout hypothesis:

    kpair     no swizzle, an 8-row group's core matrices side by side along K: LBO 128, SBO 16 K
    mfirst    no swizzle, all rows' k 0..7 core matrices first: LBO 16 R (R rows), SBO 128
    sw128/64/32   the 128/64/32-byte swizzle, rows of 64/32/16 values, SBO 8 W
    *_swapped     control: the same memory, the descriptor's LBO and SBO exchanged (must fail)
    *_unswizzled  control: the sw128 descriptor over unswizzled data (must fail)
    mn_*          operands stored MN-major (A as [K, 64] with m contiguous, B as [K, N]), read with
                  the instruction's transpose bits set (imm-trans-a / imm-trans-b = 1): mn_a, mn_b,
                  mn_ab say which; the tile of wgmma.mnmajor_offset (blocks of W/2 values of m or n,
                  one W-byte row per k) in the 128/64/32-byte swizzle, or none ("plain": the
                  interleave, core matrices of 8 k x 8 m); descriptors from wgmma.mnmajor_lbo_sbo:
                  swizzled LBO = K W (the next block along M/N), SBO = 8 W (the next 8 k); plain LBO
                  = 128 (the next 8 k), SBO = 16 K (the next 8 m)
    *_untransposed  control: an MN-major image read with the transpose bits 0 (must fail)

Two errors a variant, both max |out - ref| / max |ref|:
    err_ab    against the float64 product A @ B of the same bf16 values: ~1e-7 when the layout is
              right, O(1) when wrong
    err_twin  against kernels/wgmma.py's twin, which reads the same image through the same
              descriptors as the PTX ISA describes them: ~1e-7 for EVERY variant (the controls
              too) when the twin models the hardware; n/a when the twin's reads leave the image

Reading it: kpair and mfirst PASS with their *_swapped controls failing = LBO is the K-direction
offset and SBO the M/N one (the PTX ISA's and CUTLASS's reading); the other way round (controls
"UNEXPECTED", mains FAIL) = the roles are exchanged. The mn_* variants PASS with their controls
failing = the transpose bits read MN-major tiles as wgmma.py's docstring says: for the swizzled
ones LBO along M/N and SBO along K (mn_sw128_ab_n128_k64 and _n256 have two and four 64-wide
blocks along N, so LBO is used), for the plain one LBO along K and SBO along M/N; mn_sw128_*
at K = 64 and 32 are matmul v17's stages (BK = 64, 32: LBO 8192, 4096; SBO 1024). For a wrong
answer the JSON also holds sorted_err (small: right values in wrong places, i.e. the fragment layout), zero_frac (1: nothing
read) and the raw registers. Each variant runs in its own process (a faulting wgmma would end the
CUDA context for the rest): about 5 s a variant.

    python lab/bench/wgmma_probe.py --json out.json    # on the GPU: every variant, each in its own process
    python lab/bench/wgmma_probe.py --ptx ptx/         # anywhere: compile each kernel for sm_90a, run ptxas
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from andrea_numba import cli  # noqa: E402
from andrea_numba.kernels import wgmma as W  # noqa: E402
from lab import wgmma as lab_wgmma
from reference.precision import round_bf16  # noqa: E402

A_BYTES = 64 * 64 * 2                 # A's region of the image: 64 rows of up to K = 64 bf16
K_MAX = 64
RIGHT, WRONG = 1e-5, 1e-2             # err below RIGHT: the product; above WRONG: another product
CHILD_TIMEOUT_S = 240
MARK = "WGMMA_PROBE_RESULT "          # a child's result line on stdout


@dataclass(frozen=True)
class Variant:
    name: str
    n: int                   # N of m64nNk16
    k: int                   # K of the whole product: k / 16 wgmma steps
    layout: str              # kpair, mfirst, sw128, sw64, sw32
    control: str = ""        # "", "swapped" (descriptor LBO <-> SBO), "unswizzled" (data not swizzled),
    #                          "untransposed" (MN-major data, transpose bits 0)
    scalar: bool = False     # N = 8 through wgmma_bf16_m64n8k16 (four separate accumulators)
    mn: str = ""             # the operands stored MN-major: "", "a", "b" or "ab"

    @property
    def expect_right(self):
        return not self.control

    @property
    def trans(self):
        """The instruction's (imm-trans-a, imm-trans-b): 1 for an MN-major operand (0 for all of an
        untransposed control)."""
        if self.control == "untransposed":
            return 0, 0
        return int("a" in self.mn), int("b" in self.mn)


VARIANTS = [
    # one k16 step, N = 64: which offset is which, no swizzle
    Variant("kpair_n64", 64, 16, "kpair"),
    Variant("kpair_n64_swapped", 64, 16, "kpair", "swapped"),
    Variant("mfirst_n64", 64, 16, "mfirst"),
    Variant("mfirst_n64_swapped", 64, 16, "mfirst", "swapped"),
    # the swizzles, one step from the start of the tile
    Variant("sw128_n64", 64, 16, "sw128"),
    Variant("sw64_n64", 64, 16, "sw64"),
    Variant("sw32_n64", 64, 16, "sw32"),
    Variant("sw128_n64_unswizzled", 64, 16, "sw128", "unswizzled"),
    # chains of four k16 steps (K = 64), scale-d 0 then 1
    Variant("kpair_n64_k64", 64, 64, "kpair"),
    Variant("mfirst_n64_k64", 64, 64, "mfirst"),
    Variant("sw128_n64_k64", 64, 64, "sw128"),
    Variant("sw64_n64_k64", 64, 64, "sw64"),
    Variant("sw32_n64_k64", 64, 64, "sw32"),
    # other widths: the four-register intrinsic, N = 16, and the widest, N = 256 (128 registers)
    Variant("kpair_n8_scalar", 8, 16, "kpair", scalar=True),
    Variant("kpair_n16_k64", 16, 64, "kpair"),
    Variant("sw128_n128_k64", 128, 64, "sw128"),
    Variant("sw128_n256_k64", 256, 64, "sw128"),
    # MN-major operands through the transpose bits (matmul v17): A alone, B alone (two blocks along
    # N: LBO used), both; v17's two stage depths (K = 64, 32) and the widest N; the other swizzles
    # and the plain interleave (whose LBO and SBO swap roles: its _swapped control proves which)
    Variant("mn_sw128_a_n64_k64", 64, 64, "sw128", mn="a"),
    Variant("mn_sw128_b_n128_k64", 128, 64, "sw128", mn="b"),
    Variant("mn_sw128_ab_n128_k64", 128, 64, "sw128", mn="ab"),
    Variant("mn_sw128_ab_n128_k32", 128, 32, "sw128", mn="ab"),
    Variant("mn_sw128_ab_n256_k64", 256, 64, "sw128", mn="ab"),
    Variant("mn_sw64_ab_n64_k64", 64, 64, "sw64", mn="ab"),
    Variant("mn_sw32_ab_n64_k64", 64, 64, "sw32", mn="ab"),
    Variant("mn_plain_ab_n64_k64", 64, 64, "kpair", mn="ab"),
    Variant("mn_sw128_ab_n128_k64_swapped", 128, 64, "sw128", "swapped", mn="ab"),
    Variant("mn_sw128_ab_n64_k16", 64, 16, "sw128", mn="ab"),
    Variant("mn_sw128_ab_n64_k16_untransposed", 64, 16, "sw128", "untransposed", mn="ab"),
    Variant("mn_sw128_ab_n128_k64_unswizzled", 128, 64, "sw128", "unswizzled", mn="ab"),
    Variant("mn_plain_ab_n64_k64_swapped", 64, 64, "kpair", "swapped", mn="ab"),
]
BY_NAME = {v.name: v for v in VARIANTS}
SWIZZLE = {"kpair": W.SWIZZLE_NONE, "mfirst": W.SWIZZLE_NONE, "sw128": W.SWIZZLE_128B,
           "sw64": W.SWIZZLE_64B, "sw32": W.SWIZZLE_32B}


def image_bytes(n):
    """Bytes of the shared image (and of the kernel's shared region) for width n: A, then B^T."""
    return A_BYTES + n * K_MAX * 2


def operand_layout(v, rows, mn_major=False):
    """(store swizzle, lbo, sbo) of one operand of `rows` rows in variant v's layout, as stored
    (mn_major: wgmma.mnmajor_offset's tile, K deep; kpair then means the plain interleave)."""
    sw = SWIZZLE[v.layout]
    if mn_major:
        return (sw, *W.mnmajor_lbo_sbo(v.k, sw))
    if v.layout == "kpair":
        return sw, 128, 16 * v.k
    if v.layout == "mfirst":
        return sw, 16 * rows, 128
    return sw, 16, 8 * W.SWIZZLE_BYTES[sw]                # swizzled: LBO unused (CUTLASS writes 16 bytes)


def build(v, seed=0):
    """The inputs of variant v: a [64, k], bt [n, k] (bf16 values as float32), the image (int32
    words), per-step byte offsets of A and B, and the descriptor fields."""
    rng = np.random.default_rng(seed)
    a = round_bf16(rng.standard_normal((64, v.k)).astype(np.float32))
    bt = round_bf16(rng.standard_normal((v.n, v.k)).astype(np.float32))
    image = np.zeros(image_bytes(v.n) // 2, np.uint16)
    desc, offsets = {}, {}
    for name, x, base in (("a", a, 0), ("b", bt, A_BYTES)):
        rows = x.shape[0]
        mn_major = name in v.mn
        sw, lbo, sbo = operand_layout(v, rows, mn_major)
        r, k = np.meshgrid(np.arange(rows), np.arange(v.k), indexing="ij")
        off = W.mnmajor_offset(r, k, v.k, sw) if mn_major else W.kmajor_offset(r, k, rows, sw, lbo, sbo)
        if v.control == "unswizzled":
            off = W.swizzle_address(off, sw)               # its own inverse: the plain rows
        assert off.max() + 2 <= (A_BYTES if name == "a" else image.nbytes - A_BYTES)
        assert len(np.unique(off)) == off.size, "two elements at one address"
        image[(base + off) // 2] = W.bf16_bits(x)
        d_lbo, d_sbo = (sbo, lbo) if v.control == "swapped" else (lbo, sbo)
        desc[name] = (d_lbo, d_sbo)
        steps = range(v.k // 16)
        if mn_major:                                       # whole atoms down the k rows
            offsets[name] = np.array([base + W.mnmajor_step_offset(s, sw) for s in steps], np.int32)
        else:
            offsets[name] = np.array([base + lab_wgmma.kmajor_step_offset(s, rows, sw, lbo) for s in steps], np.int32)
    return dict(a=a, bt=bt, image=image.view(np.int32), a_offs=offsets["a"], b_offs=offsets["b"],
                a_lbo=desc["a"][0], a_sbo=desc["a"][1], b_lbo=desc["b"][0], b_sbo=desc["b"][1],
                swizzle=SWIZZLE[v.layout])


def twin_registers(v, inp):
    """What the twin says the kernel's registers [128, n/2] are (None if it reads off the image)."""
    acc = None
    try:
        for s in range(v.k // 16):
            da = W.pack_desc(int(inp["a_offs"][s]), inp["a_lbo"], inp["a_sbo"], inp["swizzle"])
            db = W.pack_desc(int(inp["b_offs"][s]), inp["b_lbo"], inp["b_sbo"], inp["swizzle"])
            acc = W.wgmma_warpgroup(inp["image"], da, db, v.n, acc, scale_d=int(s > 0), trans_a=v.trans[0],
                                    trans_b=v.trans[1])
    except IndexError:
        return None
    return acc


def rel_err(out, ref):
    scale = float(np.abs(ref).max())
    return float(np.abs(out.astype(np.float64) - ref).max() / max(scale, 1e-30))


# ------------------------------------------------------------------------------------------------
# the kernels (compiled on first use: a failure is reported for the variant that asked)

_KERNELS = {}


def kernel(n, scalar, trans=(0, 0)):
    """The probe kernel for accumulator width n (scalar: the four-register intrinsic, n = 8); trans:
    the wgmma's (imm-trans-a, imm-trans-b), (0, 0) through wgmma_bf16, else wgmma_bf16_trans."""
    key = (n, scalar, trans)
    if key in _KERNELS:
        return _KERNELS[key]
    from numba import cuda, float32, int32

    from andrea_numba.kernels.wgmma import (fence_proxy_async, shared_address, smem_desc, wgmma_acc_zeros,
                                            wgmma_bf16, wgmma_bf16_m64n8k16, wgmma_bf16_trans, wgmma_commit,
                                            wgmma_fence, wgmma_keep, wgmma_wait0)
    words = image_bytes(n) // 4 + 256                       # + 1024 bytes: room to align the start
    nregs = n // 2
    TA, TB = trans                                          # constants of the kernel: the immediates

    if trans != (0, 0):
        assert not scalar, "the transposed probes use the accumulator tuple"

        @cuda.jit
        def k_wgmma_probe_t(regs, info, image, a_offs, b_offs, a_lbo, a_sbo, b_lbo, b_sbo, swizzle):
            """k_wgmma_probe with the wgmma's transpose bits (TA, TB): MN-major operands."""
            s = cuda.shared.array(words, int32)
            tid = cuda.threadIdx.x
            pad = ((1024 - (shared_address(s, 0) & 1023)) & 1023) // 4
            for i in range(tid, image.shape[0], 128):
                s[pad + i] = image[i]
            fence_proxy_async()
            cuda.syncthreads()
            acc = wgmma_keep(wgmma_acc_zeros(n))
            wgmma_fence()
            for step in range(a_offs.shape[0]):
                da = smem_desc(s, pad + a_offs[step] // 4, a_lbo, a_sbo, swizzle)
                db = smem_desc(s, pad + b_offs[step] // 4, b_lbo, b_sbo, swizzle)
                acc = wgmma_bf16_trans(acc, da, db, step > 0, TA, TB)    # D = A B, then D += A B
            wgmma_commit()
            wgmma_wait0()
            acc = wgmma_keep(acc)
            for r in range(nregs):
                regs[tid, r] = acc[r]
            if tid == 0:
                info[0] = shared_address(s, pad)
                info[1] = smem_desc(s, pad + a_offs[0] // 4, a_lbo, a_sbo, swizzle)
                info[2] = smem_desc(s, pad + b_offs[0] // 4, b_lbo, b_sbo, swizzle)
        _KERNELS[key] = k_wgmma_probe_t
        return k_wgmma_probe_t

    if not scalar:
        @cuda.jit
        def k_wgmma_probe(regs, info, image, a_offs, b_offs, a_lbo, a_sbo, b_lbo, b_sbo, swizzle):
            """regs[128, n/2]: every thread's accumulators after len(a_offs) wgmma k16 steps on the
            image; info: the shared address of the image, step 0's two descriptors."""
            s = cuda.shared.array(words, int32)
            tid = cuda.threadIdx.x
            pad = ((1024 - (shared_address(s, 0) & 1023)) & 1023) // 4      # words to a 1024-byte boundary
            for i in range(tid, image.shape[0], 128):
                s[pad + i] = image[i]
            fence_proxy_async()                  # this thread's st.shared, visible to the async proxy
            cuda.syncthreads()                   # ... and every thread's
            acc = wgmma_keep(wgmma_acc_zeros(n))
            wgmma_fence()
            for step in range(a_offs.shape[0]):
                da = smem_desc(s, pad + a_offs[step] // 4, a_lbo, a_sbo, swizzle)
                db = smem_desc(s, pad + b_offs[step] // 4, b_lbo, b_sbo, swizzle)
                acc = wgmma_bf16(acc, da, db, step > 0)                    # D = A B, then D += A B
            wgmma_commit()
            wgmma_wait0()
            acc = wgmma_keep(acc)
            for r in range(nregs):
                regs[tid, r] = acc[r]
            if tid == 0:
                info[0] = shared_address(s, pad)
                info[1] = smem_desc(s, pad + a_offs[0] // 4, a_lbo, a_sbo, swizzle)
                info[2] = smem_desc(s, pad + b_offs[0] // 4, b_lbo, b_sbo, swizzle)
        k = k_wgmma_probe
    else:
        @cuda.jit
        def k_wgmma_probe_n8(regs, info, image, a_offs, b_offs, a_lbo, a_sbo, b_lbo, b_sbo, swizzle):
            """k_wgmma_probe at N = 8 through the four-register intrinsic."""
            s = cuda.shared.array(words, int32)
            tid = cuda.threadIdx.x
            pad = ((1024 - (shared_address(s, 0) & 1023)) & 1023) // 4
            for i in range(tid, image.shape[0], 128):
                s[pad + i] = image[i]
            fence_proxy_async()
            cuda.syncthreads()
            d0, d1, d2, d3 = wgmma_keep((float32(0), float32(0), float32(0), float32(0)))
            wgmma_fence()
            for step in range(a_offs.shape[0]):
                da = smem_desc(s, pad + a_offs[step] // 4, a_lbo, a_sbo, swizzle)
                db = smem_desc(s, pad + b_offs[step] // 4, b_lbo, b_sbo, swizzle)
                d0, d1, d2, d3 = wgmma_bf16_m64n8k16(d0, d1, d2, d3, da, db, step > 0)
            wgmma_commit()
            wgmma_wait0()
            d0, d1, d2, d3 = wgmma_keep((d0, d1, d2, d3))
            regs[tid, 0] = d0
            regs[tid, 1] = d1
            regs[tid, 2] = d2
            regs[tid, 3] = d3
            if tid == 0:
                info[0] = shared_address(s, pad)
                info[1] = smem_desc(s, pad + a_offs[0] // 4, a_lbo, a_sbo, swizzle)
                info[2] = smem_desc(s, pad + b_offs[0] // 4, b_lbo, b_sbo, swizzle)
        k = k_wgmma_probe_n8
    _KERNELS[key] = k
    return k


def signature(n):
    from numba import float32, int32, int64, types
    return types.void(float32[:, ::1], int64[::1], int32[::1], int32[::1], int32[::1],
                      int64, int64, int64, int64, int64)


def run_variant(v, seed=0):
    """Run one variant on the GPU: a dict of the results (status ok, compile error or launch error)."""
    from numba import cuda
    row = asdict(v) | {"expect_right": v.expect_right, "trans": list(v.trans)}
    inp = build(v, seed)
    ref = inp["a"].astype(np.float64) @ inp["bt"].astype(np.float64).T
    twin = twin_registers(v, inp)
    row.update(a_lbo=inp["a_lbo"], a_sbo=inp["a_sbo"], b_lbo=inp["b_lbo"], b_sbo=inp["b_sbo"],
               swizzle=inp["swizzle"], twin_vs_ab=None if twin is None else rel_err(W.fragment_to_matrix(twin), ref))
    t0 = time.perf_counter()
    try:                                      # Numba to PTX (NVVM), then PTX to machine code (the linker's ptxas)
        k = kernel(v.n, v.scalar, v.trans)
        kern = k.compile(signature(v.n))
        row["regs_per_thread"] = kern.regs_per_thread     # asks for the loaded function: assembles it
        row["local_bytes"] = kern.local_mem_per_thread
    except Exception as e:  # noqa: BLE001 - any compiler failure is the finding
        return row | {"status": "compile error", "error": cli.one_line(f"{type(e).__name__}: {e}")[:2000]}
    row["compile_s"] = round(time.perf_counter() - t0, 2)
    ptx = kern.inspect_asm(None)              # None: the device's own target, sm_90a (as the launch used)
    row["ptx_wgmma"] = ptx.count("wgmma.mma_async")
    row["ptx_target"] = next((ln.split()[1] for ln in ptx.splitlines() if ln.startswith(".target")), None)
    try:
        regs = cuda.to_device(np.full((128, v.n // 2), np.nan, np.float32))
        info = cuda.to_device(np.zeros(4, np.int64))
        args = [cuda.to_device(inp[x]) for x in ("image", "a_offs", "b_offs")]
        k[1, 128](regs, info, *args, inp["a_lbo"], inp["a_sbo"], inp["b_lbo"], inp["b_sbo"], inp["swizzle"])
        cuda.synchronize()
        regs, info = regs.copy_to_host(), info.copy_to_host()
    except Exception as e:  # noqa: BLE001
        return row | {"status": "launch error", "error": cli.one_line(f"{type(e).__name__}: {e}")[:2000]}
    out = W.fragment_to_matrix(regs)
    base = int(info[0])
    want_a = W.pack_desc(base + int(inp["a_offs"][0]), inp["a_lbo"], inp["a_sbo"], inp["swizzle"])
    want_b = W.pack_desc(base + int(inp["b_offs"][0]), inp["b_lbo"], inp["b_sbo"], inp["swizzle"])
    got_a, got_b = (int(x) & (2**64 - 1) for x in info[1:3])       # the int64 bits as unsigned
    row.update(status="ok", smem_base=base, desc_a=f"{got_a:#018x}", desc_b=f"{got_b:#018x}",
               desc_matches_pack_desc=bool(got_a == want_a and got_b == want_b),
               nan_out=int(np.isnan(out).sum()), err_ab=rel_err(out, ref),
               err_twin=None if twin is None else rel_err(out, W.fragment_to_matrix(twin).astype(np.float64)),
               # for a wrong answer: the right values in the wrong places (sorted_err small) point at the
               # fragment layout; all zeros (zero_frac 1) at reads from the wrong place, or none at all
               sorted_err=rel_err(np.sort(out.reshape(-1)), np.sort(ref.reshape(-1))),
               zero_frac=float(np.mean(out == 0)))
    if row["err_ab"] >= RIGHT and (v.expect_right or row["err_twin"] is None or row["err_twin"] >= RIGHT):
        row["regs"] = regs.tolist()          # what came back, for a look afterwards (inputs: build(v, seed))
    return row


def verdict(row):
    if row.get("status") != "ok":
        return row.get("status", "?").upper()
    e, t = row["err_ab"], row.get("err_twin")
    twin_ok = t is not None and t < RIGHT
    if row["expect_right"]:
        return "PASS" if e < RIGHT else ("FAIL (twin agrees)" if twin_ok else "FAIL")
    if e > WRONG:                                    # a control: the wrong layout must give another product
        return "PASS (control, twin agrees)" if twin_ok else "PASS (control)"
    return "UNEXPECTED (control gave A @ B)"


def _fmt(x):
    return "n/a" if x is None else f"{x:.1e}"


def table(rows):
    lines = ["| variant | N | K | layout | desc A (LBO, SBO) | desc B (LBO, SBO) | swz | err_ab | err_twin "
             "| verdict |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        layout = (f"mn-{r['mn']} " if r.get("mn") else "") + r["layout"] + ("/" + r["control"] if r["control"] else "")
        lines.append(f"| {r['name']} | {r['n']} | {r['k']} | {layout} | ({r.get('a_lbo')}, {r.get('a_sbo')}) "
                     f"| ({r.get('b_lbo')}, {r.get('b_sbo')}) | {r.get('swizzle')} | {_fmt(r.get('err_ab'))} "
                     f"| {_fmt(r.get('err_twin'))} | {r['verdict']} |")
    return "\n".join(lines)


def _child(name, seed, timeout):
    """Run one variant in a fresh process (a wgmma fault would poison this process's CUDA context)."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--variant", name, "--seed", str(seed)]
    t0 = time.perf_counter()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"status": "timeout", "error": f"no result within {timeout} s"}
    for line in p.stdout.splitlines():
        if line.startswith(MARK):
            return json.loads(line[len(MARK):]) | {"wall_s": round(time.perf_counter() - t0, 1)}
    tail = " ".join((p.stderr or p.stdout).strip().splitlines()[-6:])
    return {"status": f"crashed (exit {p.returncode})", "error": tail[-2000:]}


def run_all(names, seed, inline, timeout):
    rows = []
    for name in names:
        v = BY_NAME[name]
        if inline:
            row = run_variant(v, seed)
        else:
            row = _child(name, seed, timeout)
            row = asdict(v) | {"expect_right": v.expect_right} | row
        row["verdict"] = verdict(row)
        rows.append(row)
        err = f"  {row['error'][:300]}" if row.get("error") else ""
        print(f"{name}: {row['verdict']} err_ab {_fmt(row.get('err_ab'))} err_twin {_fmt(row.get('err_twin'))}{err}",
              file=sys.stderr, flush=True)
    return rows


# ------------------------------------------------------------------------------------------------
# compile only: PTX for sm_90a without a GPU, assembled by ptxas when one is on the PATH

def ptx_only(out_dir: Path):
    """Compile each kernel for sm_90a (cuda.compile_ptx with cc=(9, 0, "a"): numba-cuda 0.30 passes
    the "a" on to NVVM as compute_90a) and assemble it with every ptxas found. One line a kernel."""
    from numba import cuda
    out_dir.mkdir(parents=True, exist_ok=True)
    ptxases = []
    pip_ptxas = None                          # the nvidia-cuda-nvcc wheel's, if installed
    try:
        import nvidia.cuda_nvcc
        pip_ptxas = str(Path(list(nvidia.cuda_nvcc.__path__)[0]) / "bin" / "ptxas")
    except ImportError:
        pass
    for p in (shutil.which("ptxas"), pip_ptxas):
        if p and os.path.exists(p) and os.path.realpath(p) not in [os.path.realpath(q) for q in ptxases]:
            ptxases.append(p)
    rows, ok = [], True
    for n, scalar, trans in sorted({(v.n, v.scalar, v.trans) for v in VARIANTS}):
        name = f"n{n}{'_scalar' if scalar else ''}" + (f"_trans{trans[0]}{trans[1]}" if trans != (0, 0) else "")
        row = {"kernel": name}
        try:
            ptx, _ = cuda.compile_ptx(kernel(n, scalar, trans).py_func, signature(n).args, cc=(9, 0, "a"))
        except Exception as e:  # noqa: BLE001
            ok = False
            rows.append(row | {"compile": cli.one_line(f"{type(e).__name__}: {e}")[:500]})
            print(f"{name}: compile error {rows[-1]['compile']}")
            continue
        path = out_dir / f"wgmma_probe_{name}.ptx"
        path.write_text(ptx)
        target = next((ln.split()[1] for ln in ptx.splitlines() if ln.startswith(".target")), "?")
        row.update(compile="ok", target=target, wgmma=ptx.count("wgmma.mma_async"), local=ptx.count(".local"))
        for px in ptxases:
            p = subprocess.run([px, "-arch=sm_90a", "-v", str(path), "-o", str(path.with_suffix(".cubin"))],
                               capture_output=True, text=True)
            ver = subprocess.run([px, "--version"], capture_output=True, text=True).stdout
            ver = next((ln.split("release")[1].split(",")[0].strip() for ln in ver.splitlines()
                        if "release" in ln), "?")
            msg = "; ".join(ln.replace("ptxas info    :", "").strip() for ln in (p.stderr + p.stdout).splitlines()
                            if "Used" in ln or "warning" in ln.lower() or "error" in ln.lower() or "spill" in ln)
            ok &= p.returncode == 0
            row.setdefault("ptxas", []).append({"ptxas": ver, "rc": p.returncode, "report": msg})
        rows.append(row)
        print(f"{name}: {target}, {row['wgmma']} wgmma.mma_async in the PTX; "
              + ("; ".join(f"ptxas {q['ptxas']} -arch=sm_90a: rc {q['rc']}, {q['report']}"
                           for q in row.get("ptxas", [])) or "no ptxas found"))
    return rows, ok


def main(argv=None):
    p = cli.Parser(prog="python lab/bench/wgmma_probe.py", description=__doc__.splitlines()[0])
    p.add_argument("--json", type=cli.file_to_write(".json"), help="write every variant's results to this file")
    p.add_argument("--variant", choices=sorted(BY_NAME), help="run only this variant, in this process "
                   "(prints one result line; what the default mode runs in a child process)")
    p.add_argument("--only", type=str, help="comma-separated variants to run (default: all)")
    p.add_argument("--inline", action="store_true", help="run every variant in this process (faster; "
                   "a fault in one then ends the rest)")
    p.add_argument("--seed", type=cli.nonneg_int, default=0, help="seed of the random A and B (default 0)")
    p.add_argument("--timeout", type=cli.positive_int, default=CHILD_TIMEOUT_S,
                   help=f"seconds a variant's process may take (default {CHILD_TIMEOUT_S})")
    p.add_argument("--ptx", type=cli.dir_to_write, help="compile only (no GPU needed): PTX for sm_90a into this "
                   "directory, assembled with ptxas when found")
    args = p.parse_args(argv)
    from numba import cuda

    from andrea_numba.kernels.common import SIMULATOR
    if SIMULATOR:
        cli.fail("lab/bench/wgmma_probe.py compiles for a real GPU: run it without NUMBA_ENABLE_CUDASIM=1")
    if args.ptx:
        rows, ok = ptx_only(args.ptx)
        if args.json:
            args.json.write_text(json.dumps({"ptx_only": rows}, indent=1))
        sys.exit(0 if ok else 1)
    if not cuda.is_available():
        cli.fail("lab/bench/wgmma_probe.py needs an NVIDIA GPU of compute capability 9.0 (H100/H200): no CUDA GPU "
                 "here (python lab/bench/wgmma_probe.py --ptx DIR compiles without one)", code=1)
    dev = cuda.get_current_device()
    if dev.compute_capability != (9, 0):
        cli.fail(f"lab/bench/wgmma_probe.py needs compute capability 9.0 (wgmma is sm_90a only); this GPU is "
                 f"{dev.name} with {dev.compute_capability}", code=1)
    if args.variant:
        row = run_variant(BY_NAME[args.variant], args.seed)
        print(MARK + json.dumps(row, default=str), flush=True)
        return
    names = [s.strip() for s in args.only.split(",")] if args.only else [v.name for v in VARIANTS]
    unknown = [s for s in names if s not in BY_NAME]
    if unknown:
        cli.fail(f"unknown variant(s) {', '.join(unknown)}; known: {', '.join(BY_NAME)}")
    import numba
    t0 = time.perf_counter()
    rows = run_all(names, args.seed, args.inline, args.timeout)
    print(table(rows))
    right = [r for r in rows if r["expect_right"]]
    controls = [r for r in rows if not r["expect_right"]]
    bad_desc = [r["name"] for r in rows if r.get("desc_matches_pack_desc") is False]
    descs = "all" if not bad_desc else "NOT in " + ", ".join(bad_desc)
    print(f"\n{sum(r['verdict'] == 'PASS' for r in right)}/{len(right)} layouts right, "
          f"{sum(r['verdict'].startswith('PASS') for r in controls)}/{len(controls)} controls wrong as they "
          f"should be; device descriptors equal pack_desc's: {descs}; {time.perf_counter() - t0:.0f} s")
    if args.json:
        meta = {"device": dev.name.decode() if isinstance(dev.name, bytes) else str(dev.name),
                "compute_capability": list(dev.compute_capability), "numba": numba.__version__,
                "numba_cuda": _version("numba-cuda"), "numpy": np.__version__, "seed": args.seed,
                "right_below": RIGHT, "wrong_above": WRONG}
        args.json.write_text(json.dumps({"meta": meta, "variants": rows}, indent=1, default=str))


def _version(dist):
    try:
        from importlib.metadata import version
        return version(dist)
    except Exception:  # noqa: BLE001
        return None


if __name__ == "__main__":
    main()
