"""matmul v18 (kernels/wgmma_tma.py, kernels/tma.py): v17's wgmma stages copied by a TMA producer thread
over a ring of mbarrier-guarded stages, persistent blocks, in the simulator (the TMA box copy and the
mbarriers are Python twins there, wgmma the NumPy twin).

v18 changes who copies and who waits, not the sums: every product is compared with v17's bits. The
simulator's v18 blocks are 160 threads (one consumer warpgroup and the producer warp) and a wait polls,
so the launches are few: the four forms, with edges in M, N and K and more work units than resident
blocks (the ring goes round across tiles, both tile orders of unit_range), and one split-K weight
gradient on the "auto" tile; the operands are bf16 bits already (uint16: no rounding kernel). The rest is plain Python: the mbarrier and box-copy twins, map_fits, pick_tile, the fallback
to v17, and the lab recipe bf16t (lab/recipes.py).
"""
import functools
import time

import numpy as np
import pytest
from numba import cuda

from andrea_numba import gpu_model as GM
from andrea_numba.kernels import attn_out, attn_qkv, loss, mlp
from lab import loss as lab_loss
from lab import attn_qkv as lab_attn_qkv
from lab import attn_out as lab_attn_out
from lab import mlp as lab_mlp
from andrea_numba.kernels import matmul as MM
from lab import matmul as lab_matmul
from lab import wgmma_tma as lab_tma
from andrea_numba.kernels import tma
from andrea_numba.kernels.common import SIMULATOR
from andrea_numba.recipes import RECIPES
from lab.recipes import LAB
from test_matmul_v12 import _bf16_product, _operands, _run
from test_matmul_v17 import _bits

sim_only = pytest.mark.skipif(not SIMULATOR, reason="the simulator's twins (NUMBA_ENABLE_CUDASIM=1)")
_v18 = functools.partial(_run, launch=MM.matmul_bf16_wgmma)
_v17 = functools.partial(_run, launch=MM.matmul_bf16_wgmma_cp_async)
TILE_64 = (64, 64, 64, 2)                                 # the simulator's v18 tile of 2 stages
V17_DYNAMIC = MM.MN_TILES["sim"][0]                       # (64, 128, 64, 64, 128, 4): other tile width, same sums


def _v17_must_not_run(*args, **kwargs):
    raise AssertionError("matmul v18 fell back to v17")


def _v18_only(monkeypatch, a, b, trans_a, trans_b, o0, **kwargs):
    """v18's out, with the fallback to v17 made an error (a map_fits failure would compare v17 with itself)."""
    with monkeypatch.context() as patch:
        patch.setattr(MM, "matmul_bf16_wgmma_cp_async", _v17_must_not_run)
        return _v18(a, b, trans_a, trans_b, o0, **kwargs)


# ------------------------------------------------------------------------------------------------
# the kernel: v17's bits

# Every form, edges in M, N and K (stored rows of 72 and 136 values: whole 16-byte chunks, so the
# tensor maps fit), more work units than the RESIDENT_BLOCKS = 4 persistent blocks:
#   (True, False) A M-major, B N-major; (False, True) both K-major: 72 x 136 (or 136 x 72) x 136
#     on 64 x 64 tiles with 2 stages: 6 units, 2 for blocks 0 and 1, 3 stages of k a tile (64, 64,
#     8), so such a block's second tile starts at stage 1 (its 6 ring uses wrap the ring's phases 3
#     times, across tiles); tiles walked down columns (tiles_m < tiles_n) and along rows (tiles_m >
#     tiles_n). (136 x 200 here before: 12 units, twice the simulator's time for the same paths.)
#   (False, False) on 64 x 128 with 3 stages (B two 64-wide N-major boxes a stage), 6 units;
#   (True, True) A M-major, B K-major on 64 x 64, 6 units; K = 72 for these two (cheaper).
FORMS = [(True, False, 72, 136, 136, TILE_64), (False, True, 136, 72, 136, TILE_64),
         (False, False, 136, 200, 72, MM.TMA_TILES["sim"][0]), (True, True, 72, 136, 72, TILE_64)]


@sim_only
@pytest.mark.slow
@pytest.mark.parametrize("trans_a, trans_b, M, N, K, block", FORMS)
def test_persistent_blocks_give_v17s_bits_with_edges_and_accumulate(trans_a, trans_b, M, N, K, block, monkeypatch):
    BM, BN = block[:2]
    assert MM.units_grid(M, N, 1, BM, BN, MM.RESIDENT_BLOCKS) == MM.RESIDENT_BLOCKS < MM.cdiv(M, BM) * MM.cdiv(N, BN)
    rng = np.random.default_rng(18)
    a, b = _operands(rng, M, N, K, trans_a, trans_b)
    a16, b16 = _bits(a), _bits(b)
    assert tma.map_fits(a16) and tma.map_fits(b16)
    o0 = rng.standard_normal((M, N)).astype(np.float32)
    out = _v18_only(monkeypatch, a16, b16, trans_a, trans_b, o0, accumulate=True, block=block)
    ref = o0 + _bf16_product(a, b, trans_a, trans_b)
    assert np.abs(out - ref).max() <= 1e-6 * np.abs(ref).max()           # every element, edges included
    assert np.array_equal(out, _v17(a16, b16, trans_a, trans_b, o0, accumulate=True, block=V17_DYNAMIC))


@sim_only
@pytest.mark.slow
def test_a_split_weight_gradient_gives_v17s_bits():
    """out += a^T @ b, M = N = 64, K = 512 with a work buffer, the tile left to v18 ("auto":
    pick_tile's 64 x 64): 4 slices of 128 (one unit a persistent block), partials in work[z], summed
    in slice order by k_splitk_sum; v17 splits the same way."""
    rng = np.random.default_rng(181)
    M, N, K = 64, 64, 512
    a, b = _operands(rng, M, N, K, True, False)
    a16, b16 = _bits(a), _bits(b)
    o0 = rng.standard_normal((M, N)).astype(np.float32)
    work = cuda.to_device(np.zeros(8 * M * N, np.float32))
    assert MM.pick_tile(M, N, K, work, MM.sm_count()) == TILE_64
    S, ksplit = MM.splitk(M, N, K, 1, TILE_64, work)
    assert S > 1 and (S, ksplit) == MM.splitk(M, N, K, 1, V17_DYNAMIC, work)
    out = _v18(a16, b16, True, False, o0, work=work, accumulate=True, block=None)      # blocks[0]: "auto"
    parts = work.copy_to_host()[:S * M * N].reshape(S, M, N)
    for z in range(S):                                    # each slice's partial product, none left over
        sl = slice(z * ksplit, min(K, (z + 1) * ksplit))
        ref = _bf16_product(a[sl], b[sl], True, False)
        assert np.abs(parts[z] - ref).max() <= 1e-6 * np.abs(ref).max()
    work17 = cuda.to_device(np.zeros(8 * M * N, np.float32))
    assert np.array_equal(out, _v17(a16, b16, True, False, o0, work=work17, accumulate=True, block=V17_DYNAMIC))


def _flag_built(out, work, a, b, trans_a=False, trans_b=False, accumulate=False, block=None):
    """The lab's flag-built v18 kernel (lab/wgmma_tma.py: make_tma_kernel at the engine's flags, epilogue
    None and fixup 0) through the launcher it had (tma_product), as matmul_bf16_wgmma is called."""
    lab_tma.tma_product(out, work, a, b, trans_a, trans_b, accumulate, MM.TMA_AUTO if block is None else block, 0)


@sim_only
@pytest.mark.slow
def test_the_written_out_kernel_gives_the_flag_built_kernels_bits(monkeypatch):
    """k_matmul_bf16_wgmma (the engine's, written out) against the lab's flag-built kernel it was
    written out from: both kernels' names, and the same bits in out (and in the split-K partials)
    on a K-major form with edges and accumulate (ring wrapped across tiles) and on a split weight
    gradient (A M-major, B N-major, the "auto" tile)."""
    kernel, _ = MM.tma_kernel(*TILE_64[:2], TILE_64[3], False, True)
    flag_kernel, _ = lab_tma.tma_kernel(*TILE_64[:2], TILE_64[3], False, True)
    assert kernel.fn.__name__ == "k_matmul_bf16_wgmma" and flag_kernel.fn.__name__ == "k_matmul_v18"
    rng = np.random.default_rng(182)
    trans_a, trans_b, M, N, K, block = FORMS[1]                 # both K-major, edges in M, N and K
    a, b = _operands(rng, M, N, K, trans_a, trans_b)
    a16, b16 = _bits(a), _bits(b)
    o0 = rng.standard_normal((M, N)).astype(np.float32)
    engine = _v18_only(monkeypatch, a16, b16, trans_a, trans_b, o0, accumulate=True, block=block)
    flags = _v18_only(monkeypatch, a16, b16, trans_a, trans_b, o0, accumulate=True, block=block, launch=_flag_built)
    assert np.array_equal(engine.view(np.uint32), flags.view(np.uint32))
    M, N, K = 64, 64, 512                                       # out += a^T @ b in 4 slices on 64 x 64
    a, b = _operands(rng, M, N, K, True, False)
    a16, b16 = _bits(a), _bits(b)
    o0 = rng.standard_normal((M, N)).astype(np.float32)
    works = [cuda.to_device(np.full(8 * M * N, np.nan, np.float32)) for _ in range(2)]
    outs = [_v18(a16, b16, True, False, o0, work=w, accumulate=True, launch=launch)
            for w, launch in zip(works, (MM.matmul_bf16_wgmma, _flag_built))]
    assert MM.splitk(M, N, K, 1, TILE_64, works[0])[0] > 1
    assert np.array_equal(outs[0].view(np.uint32), outs[1].view(np.uint32))
    parts = [w.copy_to_host().view(np.uint32) for w in works]
    assert np.array_equal(parts[0], parts[1])                   # the partials too (NaN where unwritten, in both)


@sim_only
def test_operands_a_tensor_map_cannot_read_go_to_v17(monkeypatch):
    """A stored row of 12 values (24 bytes: not whole 16-byte chunks): v17 gets the product, on the
    bf16 copies v18 made (uint16, the operands' shapes: v17 uses them where they are, no second
    rounding), and no v18 kernel is built."""
    calls = []
    with monkeypatch.context() as patch:
        patch.setattr(MM, "matmul_bf16_wgmma_cp_async", lambda *args, **kwargs: calls.append((args, kwargs)))
        patch.setattr(MM, "tma_kernel", _v17_must_not_run)
        a = cuda.to_device(np.zeros((16, 12), np.uint16))         # a^T: [K, M], M = 12
        b = cuda.to_device(np.zeros((16, 64), np.uint16))
        out = cuda.to_device(np.zeros((12, 64), np.float32))
        MM.matmul_bf16_wgmma(out, None, a, b, trans_a=True, accumulate=True, block=TILE_64)
    assert len(calls) == 1
    (args, kwargs), = calls
    assert args[0] is out and args[4:] == (True, False, True)
    assert args[2].dtype == np.uint16 and args[2].shape == a.shape and args[3].shape == b.shape


# ------------------------------------------------------------------------------------------------
# pick_tile

def test_pick_tile_picks_a_declared_tile():
    tiles = MM.TMA_TILES["sim" if SIMULATOR else "gpu"]
    work = cuda.to_device(np.zeros(8 * 256 * 256, np.float32))
    for M, N, K in [(8, 8, 8), (136, 200, 136), (64, 64, 512), (256, 256, 64)]:
        for w in (None, work):
            assert MM.pick_tile(M, N, K, w, MM.sm_count()) in tiles
    assert MM.matmul_bf16_wgmma.blocks[0] == MM.TMA_AUTO
    assert all(blocks[0] == MM.TMA_AUTO and len(blocks) >= 2 for blocks in MM.TMA_OP_TILES.values())
    assert set(MM.TMA_SPEED) >= {(t[0], t[1], t[3]) for t in MM.TMA_TILES["gpu"] + MM.TMA_TILES["sim"]}


@pytest.mark.parametrize("M, N, K, want", [(8192, 3072, 768, (128, 256, 64, 4)),     # 768 tiles of 128 x 256: 6 waves
                                           (8192, 768, 3072, (128, 128, 64, 4))])    # 192 of them: 2 waves, half empty
def test_pick_tile_on_the_h200_takes_the_tile_measured_fastest(M, N, K, want, monkeypatch):
    """The GPU's tiles (whichever table pick_tile reads here) on 132 multiprocessors."""
    gpu = MM.TMA_TILES["gpu"]
    monkeypatch.setattr(MM, "TMA_TILES", {"sim": gpu, "gpu": gpu})
    assert MM.pick_tile(M, N, K, None, 132) == want


# ------------------------------------------------------------------------------------------------
# the mbarrier and TMA twins (no kernel)

@sim_only
def test_mbarrier_twin_completes_a_phase_on_its_arrivals_and_flips_parity():
    bars = np.zeros(2, np.int64)
    tma.mbar_init(bars, 1, 2)
    assert tma.mbar_try_wait(bars, 1, 1)                 # the phase "before" phase 0 is over
    assert not tma.mbar_try_wait(bars, 1, 0)
    tma.mbar_arrive(bars, 1)
    assert not tma.mbar_try_wait(bars, 1, 0)             # one arrival of two
    tma.mbar_arrive(bars, 1)
    assert tma.mbar_try_wait(bars, 1, 0)                 # phase 0 over: re-armed for 2, in phase 1
    assert not tma.mbar_try_wait(bars, 1, 1)
    tma.mbar_arrive(bars, 1)
    tma.mbar_arrive(bars, 1)
    assert tma.mbar_try_wait(bars, 1, 1) and not tma.mbar_try_wait(bars, 1, 0)   # phase 2: parity 0 again
    tma.mbar_arrive(bars, 1)
    tma.mbar_arrive(bars, 1)
    assert tma.mbar_try_wait(bars, 1, 0)
    tma.mbar_init(bars, 0, 1)                            # a neighbour is another barrier
    assert not tma.mbar_try_wait(bars, 0, 0) and tma.mbar_try_wait(bars, 1, 0)
    tma.mbar_arrive(bars, 0)
    assert tma.mbar_try_wait(bars, 0, 0)


def _swizzled_box(src, c0, c1, rows):
    """The uint16 image of a box (rows x 64 values from row c1, column c0 of src) in the 128-byte
    swizzle, element by element: value e of chunk q of row r at 64 r + 8 (q ^ (r & 7)) + e."""
    img = np.zeros(rows * 64, np.uint16)
    for r in range(rows):
        for col in range(64):
            y, x = c1 + r, c0 + col
            v = src[y, x] if y < src.shape[0] and x < src.shape[1] else 0
            q, e = divmod(col, 8)
            img[64 * r + 8 * (q ^ (r & 7)) + e] = v
    return img


@sim_only
def test_a_box_copy_lands_swizzled_with_zeros_past_the_edges_and_completes_the_phase_by_its_bytes():
    rng = np.random.default_rng(3)
    src = rng.integers(1, 1 << 16, size=(20, 100), dtype=np.uint16)    # no zero inside: a zero is fill
    ring = np.full(1024, np.nan, np.float32)              # 4 KiB: boxes of 8 rows at words 256 and 512
    bars = np.zeros(1, np.int64)
    tma.mbar_init(bars, 0, 1)
    tma.mbar_expect_tx(bars, 0, 2 * 8 * 128)              # the producer's arrival and two boxes' bytes
    assert not tma.mbar_try_wait(bars, 0, 0)              # arrivals done, bytes due
    tma.tma_load_2d(ring, 256, src, 0, 64, 16, 8, bars, 0)   # rows 16..23, columns 64..127: 4 x 36 inside
    assert not tma.mbar_try_wait(bars, 0, 0)              # half the bytes
    tma.tma_load_2d(ring, 512, src, 0, 0, 8, 8, bars, 0)     # rows 8..15, columns 0..63: all inside
    assert tma.mbar_try_wait(bars, 0, 0)
    u16 = ring.view(np.uint16)
    edge, inside = u16[512:1024], u16[1024:1536]
    assert np.array_equal(edge, _swizzled_box(src, 64, 16, 8))
    assert np.count_nonzero(edge) == 4 * 36               # the zeros: exactly the box past the edges
    assert np.array_equal(inside, _swizzled_box(src, 0, 8, 8))
    assert not np.array_equal(inside, src[8:16, :64].reshape(-1))   # (the swizzle moved chunks)
    assert np.isnan(ring[:256]).all() and np.isnan(ring[768:]).all()   # nothing else written
    # a copy of more bytes than the phase expects is a protocol error
    tma.mbar_expect_tx(bars, 0, 64)
    with pytest.raises(AssertionError, match="more bytes"):
        tma.tma_load_2d(ring, 256, src, 0, 0, 0, 8, bars, 0)


@sim_only
def test_a_wait_that_never_completes_raises(monkeypatch):
    monkeypatch.setattr(tma, "MBAR_TIMEOUT_S", 0.05)
    bars = np.zeros(1, np.int64)
    tma.mbar_init(bars, 0, 1)
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match="never completed"):
        while not tma.mbar_try_wait(bars, 0, 0):
            assert time.monotonic() - t0 < 10, "the twin's wait did not time out"
    tma.mbar_arrive(bars, 0)
    assert tma.mbar_try_wait(bars, 0, 0)                  # (a true wait also clears this thread's clock)


# ------------------------------------------------------------------------------------------------
# map_fits

def test_map_fits_rows_of_whole_16_byte_chunks_of_bf16_only():
    x = cuda.to_device(np.zeros((5, 24), np.uint16))
    assert tma.map_fits(x)
    assert tma.map_fits(cuda.to_device(np.zeros((3, 8), np.uint16)))
    assert not tma.map_fits(cuda.to_device(np.zeros((5, 20), np.uint16)))      # 40-byte rows
    assert not tma.map_fits(cuda.to_device(np.zeros((5, 24), np.float32)))     # not bf16 bits
    assert not tma.map_fits(cuda.to_device(np.zeros((5, 24), np.float16)))
    assert not tma.map_fits(cuda.to_device(np.zeros(24, np.uint16)))           # not 2-D
    host = np.zeros((24, 16), np.uint16)
    assert tma.map_fits(host) and not tma.map_fits(host.T)                    # columns not contiguous
    flat = np.zeros(64 + 8 * 5 * 8, np.uint16)
    at = (-flat.ctypes.data % 16) // 2                                         # a 16-byte boundary ...
    assert tma.map_fits(flat[at:at + 40].reshape(5, 8))
    assert not tma.map_fits(flat[at + 1:at + 41].reshape(5, 8))               # ... and 2 bytes past it


# ------------------------------------------------------------------------------------------------
# products "bf16t"

def test_products_bf16t_are_the_linear_ops_on_v18():
    assert lab_matmul.VERSIONS["matmul"][18] is MM.matmul_bf16_wgmma
    assert attn_qkv.matmul_bf16_wgmma is attn_out.matmul_bf16_wgmma is mlp.matmul_bf16_wgmma is loss.matmul_bf16_wgmma \
        is MM.matmul_bf16_wgmma                            # the bf16-hopper ops' products
    assert MM.matmul_bf16_wgmma.precision == "bf16"
    bf16t = LAB["bf16t"]
    v = 15                                                 # attn_qkv, attn_out, loss_bwd v15
    assert bf16t.kernels["attn_qkv"] == (lab_attn_qkv.VERSIONS["attn_qkv_fwd"][v], lab_attn_qkv.VERSIONS["attn_qkv_bwd"][v])
    assert bf16t.kernels["mlp"][0] is lab_mlp.VERSIONS["mlp_fwd"][19]
    # loss_fwd v16 is v18's first registration; the recipe runs v17, v16's logits with the softmax
    # reading them once (k_loss_fwd_rows): both are on v18
    assert bf16t.kernels["loss"] == (lab_loss.VERSIONS["loss_fwd"][17], lab_loss.VERSIONS["loss_bwd"][v])
    for table, name, n in [(lab_attn_qkv, "attn_qkv_fwd", v), (lab_attn_qkv, "attn_qkv_bwd", v),
                           (lab_attn_out, "attn_out_fwd", v), (lab_attn_out, "attn_out_bwd", v),
                           (lab_mlp, "mlp_fwd", 19), (lab_mlp, "mlp_bwd", 19),
                           (lab_loss, "loss_fwd", 16), (lab_loss, "loss_fwd", 17), (lab_loss, "loss_bwd", v)]:
        assert n in table.VERSIONS[name], (name, n)
    assert bf16t.operand_copies and bf16t.bf16_saved and bf16t.held_copies and bf16t.tensor_maps
    assert {n for n, r in {**RECIPES, **LAB}.items() if r.tensor_maps} == {"bf16t", "bf16s", "bf16-hopper"}
    assert bf16t.precision == "bf16" and bf16t.needs_hopper and bf16t.elsewhere == "bf16-ampere"
    held = GM.products_scratch(bf16t, 64, 32, 96)
    assert held["tma_tensor_maps"] == tma.TensorMaps.SLOTS * tma.MAP_BYTES
    assert {"operands_16bit", "operands_held_16bit"} <= set(held)
    assert "tma_tensor_maps" not in GM.products_scratch(LAB["bf16m"], 64, 32, 96)
