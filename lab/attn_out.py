"""The lab's rungs of andrea_numba/kernels/attn_out.py: every numbered version the engine does not run,
beside the engine's own (imported from the engine module), and the VERSIONS table of the ladder.

v1 runs the kernels on matmul v2's tiles, v2 on the SIMT warp tiles of matmul v3, v3 on the 3xTF32
tensor-core warp tiles of matmul v4, v4-v6 on those of matmul v5-v7, the engine's v7 on matmul v8's
(the kernels' text is the same; the tile functions differ), v8 on matmul v9's, v9 on matmul v10's,
the engine's v10 on matmul v11's (fp16), v11 on matmul v12's; the engine's v12 runs products of
matmul v13. v13: v12 through matmul v16 (out and dy on v15's wgmma, dW_O on v13), dout rounded to
bf16 once for both backward products (operands.HELD), where v12 rounded it for each; v14 the same
on matmul v17; the engine's v15 (attn_out_fwd_bf16_wgmma) on v18.
"""
from andrea_numba.kernels.attn_out import *  # noqa: F401,F403  (the engine's rungs and helpers)
from andrea_numba.kernels.attn_out import _bwd_held, _bwd_warp, _fwd_warp  # noqa: F401
from lab.matmul import (HALF_OP_TILES, MN_TILES, RING_TILES, SIMT2_TILES, SPLIT_TILES, WARP_TILES,
                        matmul_bf16_wgmma_cp_async, matmul_v3, matmul_v4, matmul_v5, matmul_v6, matmul_v7, matmul_v9,
                        matmul_v10, matmul_v12, matmul_v16)


@blocks(**WARP_TILES)
def attn_out_fwd_v2(out, y, w_o, *, block, stream=0):
    """v1 on SIMT warp tiles; block = (BM, BN, BK, WM, WN)."""
    _fwd_warp(matmul_v3, out, y, w_o, block, stream)


@blocks(**WARP_TILES)
def attn_out_bwd_v2(dy, dw_o, work, dout, y, w_o, *, block, stream=0):
    """v1 on SIMT warp tiles, dW_O split over K into work."""
    _bwd_warp(matmul_v3, dy, dw_o, work, dout, y, w_o, block, stream)


@blocks(**WARP_TILES)
def attn_out_fwd_v3(out, y, w_o, *, block, stream=0):
    """v1 on 3xTF32 tensor-core warp tiles."""
    _fwd_warp(matmul_v4, out, y, w_o, block, stream)


@blocks(**WARP_TILES)
def attn_out_bwd_v3(dy, dw_o, work, dout, y, w_o, *, block, stream=0):
    """v1 on 3xTF32 tensor-core warp tiles, dW_O split over K into work."""
    _bwd_warp(matmul_v4, dy, dw_o, work, dout, y, w_o, block, stream)


@blocks(**SPLIT_TILES)
def attn_out_fwd_v4(out, y, w_o, *, block, stream=0):
    """v1 on the split tiles of matmul v5 (3xTF32, parts made once, BK = 16)."""
    _fwd_warp(matmul_v5, out, y, w_o, block, stream)


@blocks(**SPLIT_TILES)
def attn_out_bwd_v4(dy, dw_o, work, dout, y, w_o, *, block, stream=0):
    """v1 on the split tiles of matmul v5, dW_O split over K into work."""
    _bwd_warp(matmul_v5, dy, dw_o, work, dout, y, w_o, block, stream)


@blocks(**KMAJOR_TILES)
def attn_out_fwd_v5(out, y, w_o, *, block, stream=0):
    """v1 on the k-major tiles of matmul v6 (3xTF32, split as read, BK = 16)."""
    _fwd_warp(matmul_v6, out, y, w_o, block, stream)


@blocks(**KMAJOR_TILES)
def attn_out_bwd_v5(dy, dw_o, work, dout, y, w_o, *, block, stream=0):
    """v1 on the k-major tiles of matmul v6, the weight gradients split over K into work."""
    _bwd_warp(matmul_v6, dy, dw_o, work, dout, y, w_o, block, stream)


@blocks(**KMAJOR_TILES)
def attn_out_fwd_v6(out, y, w_o, *, block, stream=0):
    """v5 on the tiles of matmul v7 (the small parts truncated by the tensor core)."""
    _fwd_warp(matmul_v7, out, y, w_o, block, stream)


@blocks(**KMAJOR_TILES)
def attn_out_bwd_v6(dy, dw_o, work, dout, y, w_o, *, block, stream=0):
    """v5 on the tiles of matmul v7, the weight gradients split over K into work."""
    _bwd_warp(matmul_v7, dy, dw_o, work, dout, y, w_o, block, stream)


@blocks(**SIMT2_TILES)
def attn_out_fwd_v8(out, y, w_o, *, block, stream=0):
    """v1 on the SIMT tiles of matmul v9 (no tensor cores: fp32 multiply-adds, 128-bit shared reads)."""
    _fwd_warp(matmul_v9, out, y, w_o, block, stream)


@blocks(**SIMT2_TILES)
def attn_out_bwd_v8(dy, dw_o, work, dout, y, w_o, *, block, stream=0):
    """v1 on the SIMT tiles of matmul v9, dW_O split over K into work."""
    _bwd_warp(matmul_v9, dy, dw_o, work, dout, y, w_o, block, stream)


# bf16 products (the first rung in bf16): the kernels of the tf32x3w version on matmul v10's tiles,
# every product's inputs rounded to bf16 as its fragments are read, fp32 sums. .precision tells the
# harness to check them against the twin at that precision (check.py, low_precision_reference).
@blocks(**KMAJOR_TILES)
def attn_out_fwd_v9(out, y, w_o, *, block, stream=0):
    """v7 with bf16 products (matmul v10's tiles)."""
    _fwd_warp(matmul_v10, out, y, w_o, block, stream)


@blocks(**KMAJOR_TILES)
def attn_out_bwd_v9(dy, dw_o, work, dout, y, w_o, *, block, stream=0):
    """v7's backward with bf16 products, dW_O split over K into work."""
    _bwd_warp(matmul_v10, dy, dw_o, work, dout, y, w_o, block, stream)


attn_out_fwd_v9.precision = attn_out_bwd_v9.precision = "bf16"


# bf16 products on matmul v12's tiles (kernels/half_tile.py): each operand rounded to bf16 once, on
# its way into shared memory, the fragments read with ldmatrix; the same kernels as v9 (same math,
# other order of the sums).
@blocks(**HALF_OP_TILES)
def attn_out_fwd_v11(out, y, w_o, *, block, stream=0):
    """v9 on matmul v12's tiles (bf16 shared tiles, ldmatrix)."""
    _fwd_warp(matmul_v12, out, y, w_o, block, stream)


@blocks(**HALF_OP_TILES)
def attn_out_bwd_v11(dy, dw_o, work, dout, y, w_o, *, block, stream=0):
    """v9's backward on matmul v12's tiles, dW_O split over K into work."""
    _bwd_warp(matmul_v12, dy, dw_o, work, dout, y, w_o, block, stream)


attn_out_fwd_v11.precision = attn_out_bwd_v11.precision = "bf16"


@blocks(**RING_TILES)
def attn_out_fwd_v13(out, y, w_o, *, block, stream=0):
    """out = y @ W_O through matmul v16 (v15's wgmma)."""
    matmul_v16(out, None, y, w_o, block=block, stream=stream)


@blocks(**RING_TILES)
def attn_out_bwd_v13(dy, dw_o, work, dout, y, w_o, *, block, stream=0):
    """dy = dout @ W_O^T (v15), dW_O += y^T @ dout (v13, split over K into work), through matmul v16;
    dout rounded to bf16 once (operands.HELD)."""
    _bwd_held(matmul_v16, dy, dw_o, work, dout, y, w_o, block, stream)


# v14: v13 on matmul v17 (wgmma for both backward products, dW_O's operands read as stored).
@blocks(**MN_TILES)
def attn_out_fwd_v14(out, y, w_o, *, block, stream=0):
    """out = y @ W_O through matmul v17."""
    matmul_bf16_wgmma_cp_async(out, None, y, w_o, block=block, stream=stream)


@blocks(**MN_TILES)
def attn_out_bwd_v14(dy, dw_o, work, dout, y, w_o, *, block, stream=0):
    """v13's backward with both products on matmul v17."""
    _bwd_held(matmul_bf16_wgmma_cp_async, dy, dw_o, work, dout, y, w_o, block, stream)


attn_out_fwd_v13.precision = attn_out_bwd_v13.precision = "bf16"


attn_out_fwd_v14.precision = attn_out_bwd_v14.precision = "bf16"


VERSIONS = {"attn_out_fwd": {1: attn_out_fwd, 2: attn_out_fwd_v2, 3: attn_out_fwd_v3, 4: attn_out_fwd_v4, 5: attn_out_fwd_v5, 6: attn_out_fwd_v6, 7: attn_out_fwd_tf32x3,
                             8: attn_out_fwd_v8, 9: attn_out_fwd_v9, 10: attn_out_fwd_fp16, 11: attn_out_fwd_v11, 12: attn_out_fwd_bf16, 13: attn_out_fwd_v13, 14: attn_out_fwd_v14, 15: attn_out_fwd_bf16_wgmma,
                             16: attn_out_fwd_tf32x3_wgmma},
            "attn_out_bwd": {1: attn_out_bwd, 2: attn_out_bwd_v2, 3: attn_out_bwd_v3, 4: attn_out_bwd_v4, 5: attn_out_bwd_v5, 6: attn_out_bwd_v6, 7: attn_out_bwd_tf32x3,
                             8: attn_out_bwd_v8, 9: attn_out_bwd_v9, 10: attn_out_bwd_fp16, 11: attn_out_bwd_v11, 12: attn_out_bwd_bf16, 13: attn_out_bwd_v13, 14: attn_out_bwd_v14, 15: attn_out_bwd_bf16_wgmma,
                             16: attn_out_bwd_tf32x3_wgmma}}
