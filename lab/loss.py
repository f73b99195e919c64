"""The lab's rungs of andrea_numba/kernels/loss.py: every numbered version the engine does not run,
beside the engine's own (imported from the engine module), and the VERSIONS table of the ladder.

v1 takes its products from matmul's shared tiles; v2 from matmul v3 (SIMT warp tiles), v3 from
matmul v4 (3xTF32), v4-v6 from matmul v5-v7, the backward's engine v7 (and the forward's v7) from
matmul v8, v8 from matmul v9; the forward's engine v9 puts the softmax rows on as few threads as
they need. In 16 bits the products of matmul v10 (forward v10, backward v9), the engine's fp16 pair
on matmul v11 (forward v11, backward v10), matmul v12 (v12, v11), the engine's bf16 pair on matmul
v13 (v13, v12), then v16's (v14, v13), v17's (v15, v14) and v18's (v16, v15; the engine's v17 and
v18 forward and v16 backward).
"""
from andrea_numba.kernels.loss import *  # noqa: F401,F403  (the engine's rungs and helpers)
from andrea_numba.kernels.loss import _bwd_bf16, _bwd_warp, _fwd_warp  # noqa: F401
from lab.matmul import (matmul_bf16_wgmma_cp_async, matmul_v3, matmul_v4, matmul_v5, matmul_v6, matmul_v7, matmul_v9,
                        matmul_v10, matmul_v12, matmul_v16)


@blocks(gpu=(1024, 256), sim=(4, 2))
def loss_fwd_v2(loss, losses, probs, x, wte, targets, *, block, stream=0):
    """v1 with the logits from matmul v3 (SIMT warp tiles); block: threads per row."""
    _fwd_warp(matmul_v3, loss, losses, probs, x, wte, targets, block, stream)


@blocks(gpu=(256, 1024), sim=(4, 2))
def loss_bwd_v2(dx, dwte, dlogits, work, dloss, x, wte, probs, targets, *, block, stream=0):
    """v1 with its products from matmul v3, dwte split over K into work."""
    _bwd_warp(matmul_v3, dx, dwte, dlogits, work, dloss, x, wte, probs, targets, block, stream)


@blocks(gpu=(1024, 256), sim=(4, 2))
def loss_fwd_v3(loss, losses, probs, x, wte, targets, *, block, stream=0):
    """v1 with the logits from matmul v4 (3xTF32 tensor cores)."""
    _fwd_warp(matmul_v4, loss, losses, probs, x, wte, targets, block, stream)


@blocks(gpu=(256, 1024), sim=(4, 2))
def loss_bwd_v3(dx, dwte, dlogits, work, dloss, x, wte, probs, targets, *, block, stream=0):
    """v1 with its products from matmul v4, dwte split over K into work."""
    _bwd_warp(matmul_v4, dx, dwte, dlogits, work, dloss, x, wte, probs, targets, block, stream)


@blocks(gpu=(1024, 256), sim=(4, 2))
def loss_fwd_v4(loss, losses, probs, x, wte, targets, *, block, stream=0):
    """v1 with the logits from matmul v5 (3xTF32 on split tiles)."""
    _fwd_warp(matmul_v5, loss, losses, probs, x, wte, targets, block, stream)


@blocks(gpu=(256, 1024), sim=(4, 2))
def loss_bwd_v4(dx, dwte, dlogits, work, dloss, x, wte, probs, targets, *, block, stream=0):
    """v1 with its products from matmul v5, dwte split over K into work."""
    _bwd_warp(matmul_v5, dx, dwte, dlogits, work, dloss, x, wte, probs, targets, block, stream)


@blocks(gpu=(1024, 256), sim=(4, 2))
def loss_fwd_v5(loss, losses, probs, x, wte, targets, *, block, stream=0):
    """v1 with the logits from matmul v6 (3xTF32 on k-major tiles split as read)."""
    _fwd_warp(matmul_v6, loss, losses, probs, x, wte, targets, block, stream)


@blocks(gpu=(256, 1024), sim=(4, 2))
def loss_bwd_v5(dx, dwte, dlogits, work, dloss, x, wte, probs, targets, *, block, stream=0):
    """v1 with its products from matmul v6, dwte split over K into work."""
    _bwd_warp(matmul_v6, dx, dwte, dlogits, work, dloss, x, wte, probs, targets, block, stream)


@blocks(gpu=(1024, 256), sim=(4, 2))
def loss_fwd_v6(loss, losses, probs, x, wte, targets, *, block, stream=0):
    """v1 with the logits from matmul v7 (v6 with the small parts truncated by the tensor core)."""
    _fwd_warp(matmul_v7, loss, losses, probs, x, wte, targets, block, stream)


@blocks(gpu=(256, 1024), sim=(4, 2))
def loss_bwd_v6(dx, dwte, dlogits, work, dloss, x, wte, probs, targets, *, block, stream=0):
    """v1 with its products from matmul v7, dwte split over K into work."""
    _bwd_warp(matmul_v7, dx, dwte, dlogits, work, dloss, x, wte, probs, targets, block, stream)


@blocks(gpu=(1024, 256), sim=(4, 2))
def loss_fwd_v7(loss, losses, probs, x, wte, targets, *, block, stream=0):
    """v1 with the logits from matmul v8 (v7 on swizzled tiles)."""
    _fwd_warp(matmul_tf32x3, loss, losses, probs, x, wte, targets, block, stream)


@blocks(gpu=(1024, 256), sim=(4, 2))
def loss_fwd_v8(loss, losses, probs, x, wte, targets, *, block, stream=0):
    """v1 with the logits from matmul v9 (SIMT products on k-major tiles, 128-bit shared reads)."""
    _fwd_warp(matmul_v9, loss, losses, probs, x, wte, targets, block, stream)


@blocks(gpu=(256, 1024), sim=(4, 2))
def loss_bwd_v8(dx, dwte, dlogits, work, dloss, x, wte, probs, targets, *, block, stream=0):
    """v1 with its products from matmul v9, dwte split over K into work."""
    _bwd_warp(matmul_v9, dx, dwte, dlogits, work, dloss, x, wte, probs, targets, block, stream)


# bf16 products (the first rung in bf16): the kernels of the tf32x3w version on matmul v10's tiles,
# every product's inputs rounded to bf16 as its fragments are read, fp32 sums. .precision tells the
# harness to check them against the twin at that precision (check.py, low_precision_reference).
# The loss forward's bf16 version is v10 (v9's softmax rows), the backward's v9 (v7's form).
@blocks(gpu=(1024, 256), sim=(4, 2))
def loss_fwd_v10(loss, losses, probs, x, wte, targets, *, block, stream=0):
    """v9 with the logits from bf16 products (matmul v10); the softmax and the loss in fp32."""
    _fwd_warp(matmul_v10, loss, losses, probs, x, wte, targets, row_threads(probs.shape[1], block), stream)


@blocks(gpu=(256, 1024), sim=(4, 2))
def loss_bwd_v9(dx, dwte, dlogits, work, dloss, x, wte, probs, targets, *, block, stream=0):
    """v7 with bf16 products (matmul v10), dwte split over K into work."""
    _bwd_warp(matmul_v10, dx, dwte, dlogits, work, dloss, x, wte, probs, targets, block, stream)


loss_fwd_v10.precision = loss_bwd_v9.precision = "bf16"


# bf16 products on matmul v12's tiles (bf16 shared tiles read with ldmatrix; kernels/half_tile.py).
@blocks(gpu=(1024, 256), sim=(4, 2))
def loss_fwd_v12(loss, losses, probs, x, wte, targets, *, block, stream=0):
    """v10 with the logits from matmul v12; the softmax and the loss in fp32."""
    _fwd_warp(matmul_v12, loss, losses, probs, x, wte, targets, row_threads(probs.shape[1], block), stream)


@blocks(gpu=(256, 1024), sim=(4, 2))
def loss_bwd_v11(dx, dwte, dlogits, work, dloss, x, wte, probs, targets, *, block, stream=0):
    """v9 with its products from matmul v12, dwte split over K into work."""
    _bwd_warp(matmul_v12, dx, dwte, dlogits, work, dloss, x, wte, probs, targets, block, stream)


loss_fwd_v12.precision = loss_bwd_v11.precision = "bf16"


def _fwd_two_pass(mm, loss, losses, probs, x, wte, targets, block, stream):
    N, V = probs.shape
    mm(probs, None, x, wte, trans_b=True, stream=stream)         # logits = x @ wte^T, into probs
    k_loss_fwd_online[N, row_threads(V, block), stream](losses, probs, targets, wide_rows(probs))
    k_loss_mean[1, MEAN_THREADS, stream](loss, losses)


@blocks(gpu=(1024, 256), sim=(4, 2))
def loss_fwd_v14(loss, losses, probs, x, wte, targets, *, block, stream=0):
    """The logits from matmul v16 (bf16 products); the softmax in two passes over a row
    (k_loss_fwd_online, on v9's row_threads), the loss in fp32."""
    _fwd_two_pass(matmul_v16, loss, losses, probs, x, wte, targets, block, stream)


@blocks(gpu=(256, 1024), sim=(4, 2))
def loss_bwd_v13(dx, dwte, dlogits, work, dloss, x, wte, probs, targets, *, block, stream=0):
    """dlogits written as bf16 into the operand scratch (k_loss_bwd_bf16; the fp32 dlogits buffer is
    unused), then dx = dlogits @ wte and dwte += dlogits^T @ x (split over K into work) by matmul v16."""
    _bwd_bf16(matmul_v16, dx, dwte, work, dloss, x, wte, probs, targets, block, stream)


# v15 forward, v14 backward: v14 and v13 with the products on matmul v17 (wgmma for all three, wte and
# dlogits read as stored: no transposed copy of either).
@blocks(gpu=(1024, 256), sim=(4, 2))
def loss_fwd_v15(loss, losses, probs, x, wte, targets, *, block, stream=0):
    """v14 with the logits from matmul v17."""
    _fwd_two_pass(matmul_bf16_wgmma_cp_async, loss, losses, probs, x, wte, targets, block, stream)


@blocks(gpu=(256, 1024), sim=(4, 2))
def loss_bwd_v14(dx, dwte, dlogits, work, dloss, x, wte, probs, targets, *, block, stream=0):
    """v13 with both products on matmul v17."""
    _bwd_bf16(matmul_bf16_wgmma_cp_async, dx, dwte, work, dloss, x, wte, probs, targets, block, stream)


# v16 forward, v15 backward: v15 and v14 with the products on matmul v18 (each at its own tile).
@blocks(gpu=(1024, 256), sim=(4, 2))
def loss_fwd_v16(loss, losses, probs, x, wte, targets, *, block, stream=0):
    """v15 with the logits from matmul v18."""
    _fwd_two_pass(matmul_bf16_wgmma, loss, losses, probs, x, wte, targets, block, stream)


@blocks(gpu=(256, 1024), sim=(4, 2))
def loss_bwd_v15(dx, dwte, dlogits, work, dloss, x, wte, probs, targets, *, block, stream=0):
    """v14 with both products on matmul v18."""
    _bwd_bf16(matmul_bf16_wgmma, dx, dwte, work, dloss, x, wte, probs, targets, block, stream)


loss_fwd_v14.precision = loss_bwd_v13.precision = "bf16"


loss_fwd_v16.precision = loss_bwd_v15.precision = "bf16"


loss_fwd_v15.precision = loss_bwd_v14.precision = "bf16"


VERSIONS = {"loss_fwd": {1: loss_fwd, 2: loss_fwd_v2, 3: loss_fwd_v3, 4: loss_fwd_v4, 5: loss_fwd_v5, 6: loss_fwd_v6, 7: loss_fwd_v7, 8: loss_fwd_v8, 9: loss_fwd_tf32x3,
                         10: loss_fwd_v10, 11: loss_fwd_fp16, 12: loss_fwd_v12, 13: loss_fwd_bf16, 14: loss_fwd_v14, 15: loss_fwd_v15, 16: loss_fwd_v16, 17: loss_fwd_bf16_wgmma_probs,
                         18: loss_fwd_bf16_wgmma, 19: loss_fwd_tf32x3_wgmma},
            "loss_bwd": {1: loss_bwd, 2: loss_bwd_v2, 3: loss_bwd_v3, 4: loss_bwd_v4, 5: loss_bwd_v5, 6: loss_bwd_v6, 7: loss_bwd_tf32x3, 8: loss_bwd_v8,
                         9: loss_bwd_v9, 10: loss_bwd_fp16, 11: loss_bwd_v11, 12: loss_bwd_bf16, 13: loss_bwd_v13, 14: loss_bwd_v14, 15: loss_bwd_v15,
                         16: loss_bwd_bf16_wgmma, 17: loss_bwd_tf32x3_wgmma}}
