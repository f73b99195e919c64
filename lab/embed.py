"""The lab's rungs of andrea_numba/kernels/embed.py: every numbered version the engine does not run,
beside the engine's own (imported from the engine module), and the VERSIONS table of the ladder.
"""
from numba import cuda, float32, int32
from andrea_numba.kernels.embed import *  # noqa: F401,F403  (the engine's rungs and helpers)
from andrea_numba.kernels.embed import _check_sizes, _make_run_sums, _sorted_sums  # noqa: F401


@cuda.jit
def k_embed_bwd_v2(dwte, dout, tokens, links):
    """dout [N, C], tokens [N]. One block per position i; only the head of a token's list works:
    its threads stride over the channels, and each walks the list i -> links[0, i] -> ... -> -1,
        s = dout[i, c] + dout[next, c] + ...     (position order)
    then adds once: dwte[tokens[i], c] += s."""
    i = cuda.blockIdx.x
    if links[1, i] == 0:
        return                               # not a first occurrence: the head's block has it
    tok = tokens[i]
    for c in range(cuda.threadIdx.x, dout.shape[1], cuda.blockDim.x):
        s = float32(0.0)
        j = i
        while j >= 0:
            s += dout[j, c]
            j = links[0, j]
        dwte[tok, c] += s


@blocks(gpu=(256, 64), sim=(4, 2))
def embed_bwd_v2(dwte, dwpe, links, dout, tokens, vocab_size, context_length, *, block, stream=0):
    """The result of v1 (sums rounded in another order, equally deterministic); links is an int32
    scratch buffer [2, B*T] that the caller allocates once.
    Launch: k_embed_bwd_links_v2, one thread per position (WPE_THREADS per block);
    k_embed_bwd_v2, one block of `block` threads per position; k_embed_bwd_wpe_v1."""
    _check_sizes(dwte, dwpe, vocab_size, context_length)
    B, T, C = dout.shape
    N = B * T
    flat_tokens = tokens.reshape(N)          # contiguous: views, no copies
    flat_dout = dout.reshape(N, C)
    k_embed_bwd_links_v2[cdiv(N, WPE_THREADS), WPE_THREADS, stream](links, flat_tokens)
    k_embed_bwd_v2[N, block, stream](dwte, flat_dout, flat_tokens, links)
    k_embed_bwd_wpe_v1[cdiv(T * C, WPE_THREADS), WPE_THREADS, stream](dwpe, dout)


UNROLL = 8                                  # rows of dout whose loads go out together


k_embed_bwd_v3 = jit_as(_make_run_sums(UNROLL), 3)


@blocks(gpu=(256, 128), sim=(4, 2))
def embed_bwd_v3(dwte, dwpe, links, dout, tokens, vocab_size, context_length, *, block, stream=0):
    """v2's result, bit for bit; links [2, B*T] int32 as v2's (v3 uses its first row for the sorted
    keys). k_embed_bwd_v3 runs `block` threads a block."""
    _sorted_sums(k_embed_bwd_v3, block, dwte, dwpe, links, dout, tokens, vocab_size, context_length, stream)


@blocks(gpu=(512, 1024), sim=(8, 4))
def embed_bwd_v4(dwte, dwpe, links, dout, tokens, vocab_size, context_length, *, block, stream=0):
    """v3 (v2's bits) with a thread per channel: k_embed_bwd_v4 runs min(block, C rounded up to a
    warp) threads a block, so each thread walks a token's runs once."""
    threads = min(block, cdiv(dout.shape[2], WARP) * WARP)
    _sorted_sums(k_embed_bwd_v4, threads, dwte, dwpe, links, dout, tokens, vocab_size, context_length, stream)


VERSIONS = {"embed_fwd": {1: embed_fwd},
            "embed_bwd": {1: embed_bwd, 2: embed_bwd_v2, 3: embed_bwd_v3, 4: embed_bwd_v4, 5: embed_bwd_sorted}}
