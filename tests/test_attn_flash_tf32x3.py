"""The engine's flash attention kernels written out (kernels/attn_flash_tf32x3.py) give the bits of
the lab's flag-built kernels they were written from (lab/attn_flash_v3.py: v8's forward and v10's
backward for 3xTF32, v12 for fp16), np.array_equal on y, lse, dq, dk, dv and d_rowdot, on the same
inputs. The shapes walk two key tiles, end inside a tile and run two warps a block:

    hs = 8,  T = 13, dropout   block (1, 8): two key tiles of 8, the second ragged (5 keys)
    hs = 12, T = 21, no drop   block (2, 16) and (1, 16): two key or query tiles of 16, the second
                               ragged; hs zero-padded to the k step (two TF32 steps, one fp16)
    hs = 12, T = 16, dropout   T a multiple of every tile: the last tile full

and both builds run each of their simulator blocks, (2, 16) for fp16 too (two warps), and the
128-bit copy path (aligned_rows, never taken in the simulator unless asked). About 8 s in the
simulator."""
import numpy as np
import pytest
from numba import cuda

from andrea_numba.kernels import attn_flash_tf32x3 as E
from lab import attn_flash_v3 as lab_v3

pytestmark = [pytest.mark.xdist_group("attn_flash")]
KEY = 0x5EED1234

ENGINE = {"tf32x3": (E.attn_flash_fwd_tf32x3, E.attn_flash_bwd_tf32x3),
          "fp16": (E.attn_flash_fwd_fp16, E.attn_flash_bwd_fp16)}
FACTORY = {"tf32x3": (lab_v3._factory_fwd_v8, lab_v3._factory_bwd_v10),      # the flag-built v8, v10, v12
           "fp16": (lab_v3._factory_fwd_v12, lab_v3._factory_bwd_v12)}

# (B, T, C, H, dropout p)
SHORT = (2, 13, 16, 2, 0.25)         # hs = 8
LONG = (1, 21, 24, 2, 0.0)           # hs = 12
EVEN = (1, 16, 24, 2, 0.25)          # hs = 12, T a multiple of every tile: the last tile full


def _inputs(shape, seed):
    B, T, C = shape[:3]
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((B, T, C)).astype(np.float32) for _ in range(4)]      # q, k, v, dy


def _run(pair, block, q, k, v, dy, n_head, p):
    """Forward, then backward on the forward's y and lse; every output poisoned with NaN first."""
    fwd, bwd = pair
    B, T, C = q.shape
    nan = lambda *shape: cuda.to_device(np.full(shape, np.nan, np.float32))
    q_d, k_d, v_d, dy_d = (cuda.to_device(a) for a in (q, k, v, dy))
    y, lse = nan(B, T, C), nan(B, n_head, T)
    fwd(y, lse, q_d, k_d, v_d, n_head, p, KEY, block=block)
    dq, dk, dv, d_rowdot = nan(B, T, C), nan(B, T, C), nan(B, T, C), nan(B, n_head, T)
    bwd(dq, dk, dv, d_rowdot, dy_d, q_d, k_d, v_d, y, lse, n_head, p, KEY, block=block)
    outs = dict(y=y, lse=lse, dq=dq, dk=dk, dv=dv, d_rowdot=d_rowdot)
    return {name: a.copy_to_host() for name, a in outs.items()}


def _same_bits(fmt, shape, block, seed):
    q, k, v, dy = _inputs(shape, seed)
    H, p = shape[3], shape[4]
    ours, theirs = (_run(pairs[fmt], block, q, k, v, dy, H, p) for pairs in (ENGINE, FACTORY))
    for name in ours:
        assert np.isfinite(ours[name]).all(), (fmt, block, name)
        assert np.array_equal(ours[name], theirs[name]), (fmt, shape, block, name)


CASES = [("tf32x3", SHORT, (1, 8)), ("tf32x3", LONG, (2, 16)), ("tf32x3", EVEN, (1, 8)),
         ("fp16", SHORT, (1, 8)), ("fp16", LONG, (1, 16)), ("fp16", LONG, (2, 16)), ("fp16", EVEN, (1, 16))]


@pytest.mark.parametrize("fmt, shape, block", CASES, ids=[f"{f}-T{s[1]}-{b[0]}x{b[1]}" for f, s, b in CASES])
def test_written_out_kernels_give_the_factorys_bits(fmt, shape, block):
    _same_bits(fmt, shape, block, seed=len(fmt) + shape[1])


def test_every_simulator_block_is_covered():
    """The cases above run each simulator block of each launcher (the blocks they declare)."""
    for fmt, (fwd, bwd) in ENGINE.items():
        assert set(fwd.blocks) | set(bwd.blocks) <= {block for f, _, block in CASES if f == fmt}, fmt


def test_128_bit_copies_give_the_factorys_bits(monkeypatch):
    """With aligned_rows forced true (the GPU's path where every row starts on a 16-byte boundary),
    the copies go 4 floats at a time and the dq kernel reads dy and y 4 channels a load for D, in
    both the engine's kernels and the factory's, through ptx.py's twins of load4 / store4. Block
    (1, 16) at hs = 8: a K tile of 16 x 8 floats is one 4-float chunk a thread."""
    for module in (E, lab_v3):
        monkeypatch.setattr(module, "aligned_rows", lambda hs, *arrays: True)
    _same_bits("tf32x3", SHORT, (1, 16), seed=7)
    assert (8, 1, 16, True, "tf32x3") in E._KERNELS


def test_the_launchers_declare_their_rungs_and_precision():
    assert [f.rung for f in ENGINE["tf32x3"]] == [8, 10] and [f.rung for f in ENGINE["fp16"]] == [12, 12]
    assert [getattr(f, "precision", None) for pair in ENGINE.values() for f in pair] == [None, None, "fp16", "fp16"]
    assert [f.__name__ for f in E.kernels(12, (1, 8), False, E.FP16)] == \
        ["k_attn_flash_fwd_fp16", "k_attn_flash_bwd_dq_fp16", "k_attn_flash_bwd_dkdv_fp16"]
    for fmt, (fwd, bwd) in ENGINE.items():           # the engine's blocks are the factory's
        assert (fwd.blocks, bwd.blocks) == (FACTORY[fmt][0].blocks, FACTORY[fmt][1].blocks), fmt


def test_the_gpu_blocks_fit_and_a_block_that_does_not_is_refused():
    """The declared GPU blocks take the bytes of the module docstring's table at hs = 64 (3xTF32,
    fp16), all within 48 KiB; a block that does not fit is refused before any launch."""
    table = {"fwd": {(4, 16): (47616, 23040), (2, 32): (38912, 26624), (2, 16): (28160, 15872)},
             "bwd": {(2, 16): (46720, 22144), (1, 16): (27776, 15488), (2, 8): (40256, 15680)}}
    declared = {"fwd": (E.TF32X3_FWD_BLOCKS, E.FP16_FWD_BLOCKS), "bwd": (E.TF32X3_BWD_BLOCKS, E.FP16_BWD_BLOCKS)}
    for direction, rows in table.items():
        assert all(list(b["gpu"]) == list(rows) for b in declared[direction]), direction
        for block, want in rows.items():
            got = tuple(E.shared_bytes(64, *block, fmt, forward_only=direction == "fwd")
                        for fmt in (E.TF32X3, E.FP16))
            assert got == want and max(got) <= E.SHARED_LIMIT, (direction, block, got)
    x, lse = np.zeros((1, 16, 128), np.float32), np.zeros((1, 2, 16), np.float32)
    with pytest.raises(ValueError, match="84608 bytes"):      # four warps: their own tiles' planes alone are 64 KiB
        E.attn_flash_bwd_tf32x3(x, x, x, lse, x, x, x, x, x, lse, 2, block=(4, 16))
    with pytest.raises(ValueError, match="does not split"):
        E.attn_flash_fwd_fp16(x, lse, x, x, x, 2, block=(1, 12))
