"""kernels/wgmma.py without a GPU: the descriptor bits, the swizzle, the accumulator fragment
layout, and the NumPy twin of one warpgroup product reading A and B out of an image of shared
memory in each canonical K-major layout (lab/bench/wgmma_probe.py asks the H200 the same questions).
Plain NumPy: no simulated launch.
"""
import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

from andrea_numba.kernels import wgmma as W
from lab import wgmma as lab_wgmma
from andrea_numba.kernels.common import SIMULATOR
from reference.precision import round_bf16

ROOT = Path(__file__).resolve().parents[1]


# ------------------------------------------------------------------------------------------------
# the descriptor

def test_descriptor_fields_sit_where_the_ptx_isa_puts_them():
    # start 0x400 >> 4 = 0x40 in bits 0-13, LBO 128 >> 4 = 8 in bits 16-29, SBO 256 >> 4 = 16 in 32-45
    assert W.pack_desc(0x400, 128, 256, 0) == 0x0000_0010_0008_0040
    # CUTLASS's 128B-swizzled K-major operand: LBO field 1 (16 bytes), SBO field 64 (1024 bytes), mode 1
    assert W.pack_desc(0, 16, 1024, W.SWIZZLE_128B) == 0x4000_0040_0001_0000
    assert W.pack_desc(0, 0, 0, W.SWIZZLE_64B) == 1 << 63          # mode 2: bit 63
    assert W.pack_desc(0, 0, 0, W.SWIZZLE_32B) == 3 << 62          # mode 3: bits 62 and 63
    # 14 bits of (x & 0x3FFFF) >> 4: the low 4 bits are dropped, 256 KiB wraps to 0
    assert W.pack_desc(0x40000 + 0x1230 + 0xF, 0, 0, 0) == 0x123
    assert W.pack_desc(0x3FFF0, 0x3FFF0, 0x3FFF0, 0) == 0x3FFF | (0x3FFF << 16) | (0x3FFF << 32)


def test_unpack_is_the_inverse_of_pack():
    rng = np.random.default_rng(0)
    for _ in range(200):
        start, lbo, sbo = (int(x) * 16 for x in rng.integers(0, 1 << 14, 3))
        mode = int(rng.integers(0, 4))
        assert W.unpack_desc(W.pack_desc(start, lbo, sbo, mode)) == (start, lbo, sbo, 0, mode)
    # a descriptor that went through an int64 on the GPU (bit 63 set: negative) reads the same
    assert W.unpack_desc(np.uint64(W.pack_desc(32, 128, 256, 2)).view(np.int64)) == (32, 128, 256, 0, 2)


@pytest.mark.skipif(not SIMULATOR, reason="the simulator's twin of smem_desc (NUMBA_ENABLE_CUDASIM=1)")
def test_simulator_smem_desc_counts_bytes_from_the_array_start():
    words = np.zeros(1024, np.int32)
    assert W.shared_address(words, 8) == 32
    assert W.smem_desc(words, 8, 128, 256, 0) == W.pack_desc(32, 128, 256, 0)
    halves = np.zeros(1024, np.uint16)
    assert W.smem_desc(halves, 512, 16, 1024, 1) == W.pack_desc(1024, 16, 1024, 1)


# ------------------------------------------------------------------------------------------------
# the layouts

@pytest.mark.parametrize("mode", [W.SWIZZLE_128B, W.SWIZZLE_64B, W.SWIZZLE_32B])
def test_a_swizzle_permutes_16_byte_chunks_within_each_atom(mode):
    addr = np.arange(0, 4096, 2)
    sw = W.swizzle_address(addr, mode)
    assert sorted(sw.tolist()) == addr.tolist()                    # a permutation ...
    assert (sw & 15).tolist() == (addr & 15).tolist()              # ... of whole chunks
    assert (sw >> 7 == addr >> 7).all()                            # ... inside each 128-byte line
    assert (W.swizzle_address(sw, mode) == addr).all()             # its own inverse


def test_128b_swizzle_puts_chunk_c_of_row_r_at_c_xor_r():
    for r in range(16):
        for k in range(0, 64, 8):
            c = k // 8
            assert W.kmajor_offset(r, k, 64, W.SWIZZLE_128B) == (r // 8) * 1024 + (r % 8) * 128 + 16 * (c ^ (r % 8))
    assert W.kmajor_offset(1, 0, 64, W.SWIZZLE_128B) == 144
    assert W.kmajor_offset(3, 9, 64, W.SWIZZLE_128B) == 384 + 32 + 2
    # 64-byte swizzle: rows of 32 values, two rows a 128-byte line share the pattern (address bits 7, 8)
    assert W.kmajor_offset(2, 0, 64, W.SWIZZLE_64B) == 128 + 16
    assert W.kmajor_offset(1, 0, 64, W.SWIZZLE_64B) == 64


def test_no_swizzle_core_matrices_are_lbo_apart_along_k_and_sbo_along_rows():
    addr = W.kmajor_read_addresses(W.pack_desc(0, 128, 256, 0), 64)
    assert addr[0, 0] == 0 and addr[1, 1] == 16 + 2                # rows 16 bytes apart in a core matrix
    assert addr[0, 8] == 128 and addr[8, 0] == 256 and addr[8, 8] == 384
    core = addr[:8, :8]
    assert sorted(core.reshape(-1).tolist()) == list(range(0, 128, 2))   # one core matrix: 128 contiguous bytes
    assert (W.kmajor_offset(np.arange(64)[:, None], np.arange(16)[None, :], 64, 0, 128, 256) == addr).all()


# ------------------------------------------------------------------------------------------------
# the accumulator fragment

def test_fragment_layout_is_the_documented_one():
    rows, cols = W.fragment_rows_cols(64)
    assert rows.shape == cols.shape == (128, 32)
    for thread in (0, 1, 5, 33, 70, 127):
        w, g, t = thread // 32, (thread % 32) // 4, thread % 4
        for j in range(8):
            assert (rows[thread, 4 * j], cols[thread, 4 * j]) == (16 * w + g, 8 * j + 2 * t)
            assert (rows[thread, 4 * j + 1], cols[thread, 4 * j + 1]) == (16 * w + g, 8 * j + 2 * t + 1)
            assert (rows[thread, 4 * j + 2], cols[thread, 4 * j + 2]) == (16 * w + g + 8, 8 * j + 2 * t)
            assert (rows[thread, 4 * j + 3], cols[thread, 4 * j + 3]) == (16 * w + g + 8, 8 * j + 2 * t + 1)
    flat = rows * 64 + cols
    assert sorted(flat.reshape(-1).tolist()) == list(range(64 * 64))          # every element once
    d = np.arange(64 * 24, dtype=np.float32).reshape(64, 24)
    assert (W.fragment_to_matrix(W.matrix_to_fragment(d)) == d).all()


# ------------------------------------------------------------------------------------------------
# the twin of the product, over each canonical layout

def _image(a, bt, layout):
    """Shared-memory image (uint16) with A at 0 and B^T at the next 1024-byte boundary after it, in
    a canonical layout; returns it and the descriptor (start, lbo, sbo, mode) lists per k16 step
    for A and B."""
    K = a.shape[1]
    mode = {"kpair": 0, "mfirst": 0, "sw128": 1, "sw64": 2, "sw32": 3}[layout]
    w = W.SWIZZLE_BYTES[mode]
    row_bytes = 2 * K if mode == 0 else w * -(-2 * K // w)         # swizzled rows take whole atom rows
    b_base = -(-64 * row_bytes // 1024) * 1024
    slack = 8192                                                   # zeros past B: the controls read there
    image = np.zeros((-(-(b_base + bt.shape[0] * row_bytes) // 1024) * 1024 + slack) // 2, np.uint16)
    steps = []
    for x, base in ((a, 0), (bt, b_base)):
        rows = x.shape[0]
        lbo, sbo = {"kpair": (128, 16 * K), "mfirst": (16 * rows, 128)}.get(layout, (16, 8 * W.SWIZZLE_BYTES[mode]))
        r, k = np.meshgrid(np.arange(rows), np.arange(K), indexing="ij")
        off = W.kmajor_offset(r, k, rows, mode, lbo, sbo)
        assert len(np.unique(off)) == off.size
        image[(base + off) // 2] = W.bf16_bits(x)
        steps.append([(base + lab_wgmma.kmajor_step_offset(s, rows, mode, lbo), lbo, sbo, mode) for s in range(K // 16)])
    return image, steps


def _product(image, steps, n, swap=False):
    acc = None
    for s, (sa, sb) in enumerate(zip(*steps)):
        da, db = (W.pack_desc(st, *((sbo, lbo) if swap else (lbo, sbo)), m) for st, lbo, sbo, m in (sa, sb))
        acc = W.wgmma_warpgroup(image, da, db, n, acc, scale_d=int(s > 0))
    return W.fragment_to_matrix(acc)


def _operands(n, K, seed=0):
    rng = np.random.default_rng(seed)
    a = round_bf16(rng.standard_normal((64, K)).astype(np.float32))
    bt = round_bf16(rng.standard_normal((n, K)).astype(np.float32))
    return a, bt, a.astype(np.float64) @ bt.astype(np.float64).T


@pytest.mark.parametrize("layout", ["kpair", "mfirst", "sw128", "sw64", "sw32"])
@pytest.mark.parametrize("n, K", [(8, 16), (64, 16), (64, 64), (24, 64), (256, 32)])
def test_the_twin_reads_each_canonical_layout_back_as_a_at_b(layout, n, K):
    a, bt, ref = _operands(n, K)
    image, steps = _image(a, bt, layout)
    out = _product(image, steps, n)
    assert np.abs(out - ref).max() <= 1e-6 * np.abs(ref).max()


@pytest.mark.parametrize("layout", ["kpair", "mfirst"])
def test_exchanging_lbo_and_sbo_reads_another_matrix(layout):
    """The control of the probe: the same memory, the descriptor's two offsets the other way round."""
    a, bt, ref = _operands(64, 16)
    image, steps = _image(a, bt, layout)
    out = _product(image, steps, 64, swap=True)
    assert np.abs(out - ref).max() > 0.1 * np.abs(ref).max()


def test_unswizzled_data_under_a_swizzled_descriptor_reads_another_matrix():
    a, bt, ref = _operands(64, 64)
    image, steps = _image(a, bt, "sw128")
    assert np.abs(_product(image, steps, 64) - ref).max() <= 1e-6 * np.abs(ref).max()
    plain = image[W.swizzle_address(np.arange(image.size) * 2, W.SWIZZLE_128B) // 2]   # the rows unswizzled
    assert np.abs(_product(plain, steps, 64) - ref).max() > 0.1 * np.abs(ref).max()


def test_scale_d_chooses_between_overwrite_and_accumulate():
    a, bt, ref = _operands(16, 16)
    image, steps = _image(a, bt, "kpair")
    (sa,), (sb,) = steps
    da, db = W.pack_desc(*sa), W.pack_desc(*sb)
    acc = W.matrix_to_fragment(np.full((64, 16), 3.0, np.float32))
    assert np.allclose(W.fragment_to_matrix(W.wgmma_warpgroup(image, da, db, 16, acc, scale_d=0)), ref, atol=1e-5)
    assert np.allclose(W.fragment_to_matrix(W.wgmma_warpgroup(image, da, db, 16, acc, scale_d=1)), ref + 3, atol=1e-5)
    with pytest.raises(IndexError):                                # a descriptor past the image
        W.wgmma_warpgroup(image, W.pack_desc(image.nbytes, 128, 256, 0), db, 16)
    with pytest.raises(ValueError):
        W.wgmma_warpgroup(image, da, db, 12)


def _a_registers(a):
    """The 128 threads' a0 .. a3 (int32, two bf16 a register, the lower k low) of a 64 x 16 bf16
    matrix, written out from the PTX ISA's register fragment of A (thread 32 w + 4 g + t: a0 = A[16w
    + g, 2t:2t+2], a1 = A[16w + g + 8, 2t:2t+2], a2 = A[16w + g, 2t+8:2t+10], a3 = A[16w + g + 8, ...]),
    not from the twin's own layout tables."""
    bits = W.bf16_bits(a).astype(np.uint32)
    regs = np.zeros((128, 4), np.uint32)
    for thread in range(128):
        w, g, t = thread // 32, (thread % 32) // 4, thread % 4
        for i in range(4):
            r, k = 16 * w + g + 8 * (i & 1), 2 * t + 8 * (i >> 1)
            regs[thread, i] = bits[r, k] | (bits[r, k + 1] << 16)
    return regs.view(np.int32)


@pytest.mark.parametrize("n, trans_b", [(64, 0), (64, 1), (16, 0), (128, 1)])
def test_the_register_a_twin_multiplies_the_documented_a_fragment(n, trans_b):
    """wgmma_warpgroup_rs: A from the threads' registers in the ISA's fragment, B from the image K-major
    (a k-pairs tile) or N-major (the 128-byte swizzled tile of mnmajor_offset), accumulate or not."""
    rng = np.random.default_rng(3)
    a = round_bf16(rng.standard_normal((64, 16)).astype(np.float32))
    b = round_bf16(rng.standard_normal((16, n)).astype(np.float32))              # B [k, n]
    image = np.zeros(16 * n * 2 + 8192, np.uint16)
    kk, nn = np.meshgrid(np.arange(16), np.arange(n), indexing="ij")
    if trans_b:
        off = W.mnmajor_offset(nn, kk, 16, W.SWIZZLE_128B)
        desc = W.pack_desc(0, *W.mnmajor_lbo_sbo(16, W.SWIZZLE_128B), W.SWIZZLE_128B)
    else:
        off = W.kmajor_offset(nn, kk, n, 0, 128, 256)
        desc = W.pack_desc(0, 128, 256, 0)
    image[off // 2] = W.bf16_bits(b)
    ref = a.astype(np.float64) @ b.astype(np.float64)
    regs = _a_registers(a)
    assert (W.register_a_matrix(regs) == a).all()
    out = W.fragment_to_matrix(W.wgmma_warpgroup_rs(regs, image, desc, n, trans_b=trans_b))
    assert np.abs(out - ref).max() <= 1e-6 * np.abs(ref).max()
    acc = W.matrix_to_fragment(np.full((64, n), 2.0, np.float32))
    out = W.fragment_to_matrix(W.wgmma_warpgroup_rs(regs, image, desc, n, acc, scale_d=1, trans_b=trans_b))
    assert np.abs(out - ref - 2).max() <= 1e-5 * np.abs(ref).max()
    wrong = W.fragment_to_matrix(W.wgmma_warpgroup_rs(regs, image, desc, n, trans_b=1 - trans_b))
    assert np.abs(wrong - ref).max() > 0.1 * np.abs(ref).max()          # the other orientation: another B


def test_an_accumulator_packed_in_pairs_is_the_next_register_a_operand():
    """FlashAttention's P: the m64n16 accumulators d[2i], d[2i + 1] of a thread, rounded and packed,
    are its A register i (the A fragment is the accumulator's layout at N = 16)."""
    rng = np.random.default_rng(4)
    p = round_bf16(rng.standard_normal((64, 16)).astype(np.float32))
    d = W.matrix_to_fragment(p)                                                   # [128, 8]
    bits = W.bf16_bits(d).astype(np.uint32)
    regs = (bits[:, 0::2] | (bits[:, 1::2] << 16)).view(np.int32)
    assert (regs == _a_registers(p)).all()


def test_the_probe_variants_are_right_or_wrong_as_the_twin_says():
    """lab/bench/wgmma_probe.py's host side: every layout variant is A @ B through the twin, every
    control is not, and each operand fits its region of the image."""
    spec = importlib.util.spec_from_file_location("wgmma_probe", ROOT / "lab" / "bench" / "wgmma_probe.py")
    probe = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = probe                                 # its dataclass looks itself up there
    try:
        spec.loader.exec_module(probe)
    finally:
        del sys.modules[spec.name]
    assert len({v.name for v in probe.VARIANTS}) == len(probe.VARIANTS)
    for v in probe.VARIANTS:
        inp = probe.build(v)
        ref = inp["a"].astype(np.float64) @ inp["bt"].astype(np.float64).T
        twin = probe.twin_registers(v, inp)
        assert twin is not None, v.name
        err = probe.rel_err(W.fragment_to_matrix(twin), ref)
        assert (err < 1e-6) if v.expect_right else (err > 1e-2), (v.name, err)
        assert inp["image"].nbytes == probe.image_bytes(v.n)
