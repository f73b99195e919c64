"""The lab's rungs of andrea_numba/kernels/attn_flash_v3.py: every numbered version the engine does not run,
beside the engine's own (imported from the engine module), and the VERSIONS table of the ladder.
"""
from andrea_numba.kernels.attn_flash_v3 import *  # noqa: F401,F403  (the engine's rungs and helpers)
from andrea_numba.kernels.attn_flash_v3 import _bwd, _fwd, _launchers, _named  # noqa: F401


# v4 (one plane of own values, module docstring point 5): what now fits 48 KiB at hs = 64
FLASH_V4_FWD_BLOCKS = dict(gpu=((4, 32), (4, 16), (2, 32)), sim=((1, 8), (2, 16)))


FLASH_V4_BWD_BLOCKS = dict(gpu=((2, 32), (4, 8), (2, 16)), sim=((1, 8), (2, 16)))


@blocks(**FLASH_V3_FWD_BLOCKS)
def attn_flash_fwd_v3(y, lse, q, k, v, n_head, dropout_p=0.0, dropout_key=0, *, block, stream=0):
    """y [B, T, C] and lse [B, H, T]. Grid (T / (16 WARPS) query tiles, B*H), 32 WARPS threads;
    block = (WARPS, BKV)."""
    _fwd(2, y, lse, q, k, v, n_head, dropout_p, dropout_key, block, stream)


@blocks(**FLASH_V3_BWD_BLOCKS)
def attn_flash_bwd_v3(dq, dk, dv, d_rowdot, dy, q, k, v, y, lse, n_head, dropout_p=0.0, dropout_key=0, *,
                      block, stream=0):
    """d_rowdot [B, H, T] receives D = dy . y (v1's k_attn_flash_bwd_rowdot_v1), then the dq and
    the dk/dv kernels on grid (T / (16 WARPS) tiles, B*H), 32 WARPS threads; block = (WARPS, BKV)."""
    _bwd(2, dq, dk, dv, d_rowdot, dy, q, k, v, y, lse, n_head, dropout_p, dropout_key, block, stream)


@blocks(**FLASH_V4_FWD_BLOCKS)
def attn_flash_fwd_v4(y, lse, q, k, v, n_head, dropout_p=0.0, dropout_key=0, *, block, stream=0):
    """As v3 with the own tile's values in one plane, split as read: twice the key tile fits."""
    _fwd(1, y, lse, q, k, v, n_head, dropout_p, dropout_key, block, stream)


@blocks(**FLASH_V4_BWD_BLOCKS)
def attn_flash_bwd_v4(dq, dk, dv, d_rowdot, dy, q, k, v, y, lse, n_head, dropout_p=0.0, dropout_key=0, *,
                      block, stream=0):
    """As v3 with the own tiles' values in one plane each, split as read."""
    _bwd(1, dq, dk, dv, d_rowdot, dy, q, k, v, y, lse, n_head, dropout_p, dropout_key, block, stream)


# v5: v3 with matmul v7's split in the loop (kernels/matmul.py): each inner-tile value (and each
# ds or p f value) is split into big = tf32(x) and x - big, which the tensor core truncates to
# TF32, three instructions instead of five. The own tiles' planes are split once per block, as in
# v3. The products' inner steps issue about 7.5 instructions a mma.sync (p f @ V at hs = 64: 20
# splits of A and B values at five instructions, 24 mma); v5 removes 2 of every 5 split ones.
@blocks(**FLASH_V3_FWD_BLOCKS)
def attn_flash_fwd_v5(y, lse, q, k, v, n_head, dropout_p=0.0, dropout_key=0, *, block, stream=0):
    """As v3 with the small parts truncated by the tensor core."""
    _fwd(2, y, lse, q, k, v, n_head, dropout_p, dropout_key, block, stream, trunc=True)


@blocks(**FLASH_V3_BWD_BLOCKS)
def attn_flash_bwd_v5(dq, dk, dv, d_rowdot, dy, q, k, v, y, lse, n_head, dropout_p=0.0, dropout_key=0, *,
                      block, stream=0):
    """As v3 with the small parts truncated by the tensor core."""
    _bwd(2, dq, dk, dv, d_rowdot, dy, q, k, v, y, lse, n_head, dropout_p, dropout_key, block, stream, trunc=True)


# v6: v5 with swizzled inner tiles. The K, V, Q and dY tiles are read two ways: as the B operand of
# an s-like product, row n = key (or query) at columns k = channel (step_own: 8 lanes g on 8 rows,
# 4 lanes t on 4 columns), and as the B operand of p f @ V, ds @ K, (P f)^T @ dY and ds^T @ Q,
# row k = key at columns n = channel (step_nn: 4 lanes t on 4 rows, 8 lanes g on 8 columns).
# v3's pitch HS8 + 4 (4 banks further a row) makes the first conflict-free and the second two to a
# bank (Nsight Compute on the H200: shared loads 1.9-way). No pitch serves both. v6 keeps rows of
# HS8 floats (a multiple of 32: every row starts at bank 0) and stores column c of row r at
# c ^ col_swizzle(r) = c ^ (8 (r & 3) + 4 ((r >> 2) & 1)):
#   step_own, rows g = 0..7 at columns kk + t:   (kk + t) ^ (8 (g & 3) + 4 (g >> 2))  32 banks
#   step_nn,  rows kk + t at columns 8 ni + g:   (8 ni + g) ^ 8 t                       32 banks
#             rows kk + t + 4:                   (8 ni + g) ^ (8 t + 4)                 32 banks
#   the copy, 16 lanes along a row in 4-float chunks: chunk ^ (a multiple of 4)    conflict-free
# The XOR changes bits 2..4 of a column only, so a column stays in its row and a 4-float chunk
# stays whole (128-bit copies as before). The same values meet the same arithmetic: v6 gives v5's
# bits. At a head size whose rows are not a multiple of 32 floats v6 keeps v3's pad (it is v5).
@blocks(**FLASH_V3_FWD_BLOCKS)
def attn_flash_fwd_v6(y, lse, q, k, v, n_head, dropout_p=0.0, dropout_key=0, *, block, stream=0):
    """As v5 with swizzled inner tiles."""
    _fwd(2, y, lse, q, k, v, n_head, dropout_p, dropout_key, block, stream, trunc=True, swizzle=True)


@blocks(**FLASH_V3_BWD_BLOCKS)
def attn_flash_bwd_v6(dq, dk, dv, d_rowdot, dy, q, k, v, y, lse, n_head, dropout_p=0.0, dropout_key=0, *,
                      block, stream=0):
    """As v5 with swizzled inner tiles."""
    _bwd(2, dq, dk, dv, d_rowdot, dy, q, k, v, y, lse, n_head, dropout_p, dropout_key, block, stream,
         trunc=True, swizzle=True)


# v7: v5 with its indices through common.nonneg. Numba types cuda.threadIdx.x and cuda.blockIdx as
# signed integers and keeps Python's meaning for a signed index (a[-1] is the last element; // and
# % round toward minus infinity), so every shared-memory read of v5's inner steps, sb[n, kk + t]
# with n and t from the lane, compiled to a test "if index < 0: index += size" for each of its
# two indices, and lane // 4, lane % 4 to fix-ups for negative lanes. v7 reads every thread and
# block index, and the loop counters it indexes with, through nonneg (int64(uint32(i)): the same
# number, now known to be >= 0), and the compiler drops those tests: in the dk/dv kernel (PTX for
# sm_90, hs = 64, block (2, 16)) the loop over the channels' k steps went from 192 to 171
# instructions for its 12 mma.sync, the loop over a tile's queries from 513 to 429 for 48 (the
# forward: 169 to 128 and 287 to 220). On the H200 that was 0-4% of the time (docs/kernels.md).
# Nothing else changes: the same elements meet the same arithmetic in the same order, so v7 gives
# v5's bits.
@blocks(**FLASH_V3_FWD_BLOCKS)
def attn_flash_fwd_v7(y, lse, q, k, v, n_head, dropout_p=0.0, dropout_key=0, *, block, stream=0):
    """As v5 with indices the compiler knows are >= 0."""
    _fwd(2, y, lse, q, k, v, n_head, dropout_p, dropout_key, block, stream, trunc=True, nonneg=True)


@blocks(**FLASH_V3_BWD_BLOCKS)
def attn_flash_bwd_v7(dq, dk, dv, d_rowdot, dy, q, k, v, y, lse, n_head, dropout_p=0.0, dropout_key=0, *,
                      block, stream=0):
    """As v5 with indices the compiler knows are >= 0."""
    _bwd(2, dq, dk, dv, d_rowdot, dy, q, k, v, y, lse, n_head, dropout_p, dropout_key, block, stream,
         trunc=True, nonneg=True)


@blocks(**FLASH_V3_BWD_BLOCKS)
def attn_flash_bwd_v8(dq, dk, dv, d_rowdot, dy, q, k, v, y, lse, n_head, dropout_p=0.0, dropout_key=0, *,
                      block, stream=0):
    """As v7 on the grid (B*H, tiles): the longest tiles first."""
    _bwd(2, dq, dk, dv, d_rowdot, dy, q, k, v, y, lse, n_head, dropout_p, dropout_key, block, stream,
         trunc=True, nonneg=True, heavy=True)


# v9: v8 without the launch of k_attn_flash_bwd_rowdot_v1. D[t] = sum_d dy[t, d] y[t, d] (the
# softmax backward's row sum, module docstring of attn_flash.py) is needed by the dq kernel for its
# query rows and by the dk/dv kernel for every query, and the dq kernel runs first. So v9's dq
# kernel works out D for its own tile's rows, one thread a row summing in channel order as the
# rowdot kernel does (the same sum: v8's bits), keeps them in shared memory for its own use and
# writes them to d_rowdot for the dk/dv kernel. The rowdot kernel read dy and y with a thread a row:
# 0.031 ms a call at 12M (14 a step), about 0.8 TB/s.
@blocks(**FLASH_V3_BWD_BLOCKS)
def attn_flash_bwd_v9(dq, dk, dv, d_rowdot, dy, q, k, v, y, lse, n_head, dropout_p=0.0, dropout_key=0, *,
                      block, stream=0):
    """As v8 with D = dy . y worked out in the dq kernel (no rowdot launch)."""
    _bwd(2, dq, dk, dv, d_rowdot, dy, q, k, v, y, lse, n_head, dropout_p, dropout_key, block, stream,
         trunc=True, nonneg=True, heavy=True, rowdot=1)


_f, _b = _launchers("bf16")
attn_flash_fwd_v11 = _named(_f, "attn_flash_fwd_v11", """As v8 with bf16 products (mma.sync m16n8k16, inputs
    rounded as fragments are formed) and the online softmax in base 2 with an integer maximum.""", "bf16")


attn_flash_bwd_v11 = _named(_b, "attn_flash_bwd_v11", """As v10 with bf16 products (mma.sync m16n8k16,
    inputs rounded as fragments are formed).""", "bf16")
