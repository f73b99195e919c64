"""Token + position embedding: k_embed_fwd / k_embed_bwd. NumPy twin: reference/embed.py.

    out[b, t, c] = wte[tokens[b, t], c] + wpe[t, c]

Backward: tokens are integers, so there is no grad_input; the gradient flows into the rows that
were looked up, and a token id that occurs n times gets the sum of its n rows of dout:
    dwte[v, c] += sum over positions (b, t) with tokens[b, t] == v of dout[b, t, c]
    dwpe[t, c] += sum over b of dout[b, t, c]                 (rows t >= T are untouched)

Many positions may add into the same row of dwte. Atomics would make the order of those additions
(and so the rounding) change from run to run; instead every sum here has a fixed order.

v1, k_embed_bwd_v1: one thread per channel c walks all B*T positions in order and adds each row
of dout into its token's row of dwte. Simple and deterministic, but only C threads work, each
through B*T dependent steps.

v2, k_embed_bwd_links_v2 + k_embed_bwd_v2: first link every position to the next position holding
the same token (a linked list per token id, in position order). Then one block per position: the
block at the FIRST occurrence of a token walks its list, sums those rows of dout in position order
and adds the sum into dwte once. Blocks of the other positions return at once. All the distinct
tokens work in parallel; a token's list is walked by one block, in order: still deterministic.

Both versions get dwpe from k_embed_bwd_wpe_v1.
"""
from numba import cuda, float32

from .common import SIMULATOR, blocks, cdiv


# ---------------------------------------------------------------------------------------------
# forward

@cuda.jit
def k_embed_fwd_v1(out, tokens, wte, wpe):
    """out[b, t, c] = wte[tokens[b, t], c] + wpe[t, c]: one block per position (b, t), its
    threads stride over the C channels (consecutive threads read consecutive addresses)."""
    T = tokens.shape[1]
    pos = cuda.blockIdx.x
    b, t = pos // T, pos % T
    tok = tokens[b, t]
    for c in range(cuda.threadIdx.x, out.shape[2], cuda.blockDim.x):
        out[b, t, c] = wte[tok, c] + wpe[t, c]


@blocks(gpu=(256, 64), sim=(4, 2))
def embed_fwd_v1(out, tokens, wte, wpe, *, block, stream=0):
    """out [B, T, C]; tokens [B, T] int32; wte [V, C]; wpe [T_max, C].
    Launch: B*T blocks of `block` threads."""
    B, T, C = out.shape
    k_embed_fwd_v1[B * T, block, stream](out, tokens, wte, wpe)


# ---------------------------------------------------------------------------------------------
# backward, dwpe (both versions)

@cuda.jit
def k_embed_bwd_wpe_v1(dwpe, dout):
    """dwpe[t, c] += sum_b dout[b, t, c]: one thread per (t, c), summing over b in order."""
    i = cuda.grid(1)
    B, T, C = dout.shape
    if i >= T * C:
        return
    t, c = i // C, i % C
    s = float32(0.0)
    for b in range(B):
        s += dout[b, t, c]
    dwpe[t, c] += s


def _check_sizes(dwte, dwpe, vocab_size, context_length):
    assert dwte.shape[0] == vocab_size and dwpe.shape[0] == context_length, \
        f"dwte {dwte.shape} / dwpe {dwpe.shape} do not match vocab_size {vocab_size}, context_length {context_length}"


WPE_THREADS = 32 if SIMULATOR else 256      # k_embed_bwd_wpe_v1: one thread per element of dwpe[:T]


# ---------------------------------------------------------------------------------------------
# backward v1: one thread per channel (for lessons)

@cuda.jit
def k_embed_bwd_v1(dwte, dout, tokens):
    """dwte[tokens[b, t], c] += dout[b, t, c] for every position, in position order: one thread
    per channel c, so no two threads ever touch the same element of dwte."""
    c = cuda.grid(1)
    B, T, C = dout.shape
    if c >= C:
        return
    for b in range(B):
        for t in range(T):
            dwte[tokens[b, t], c] += dout[b, t, c]


@blocks(gpu=(128, 32), sim=(8, 4))
def embed_bwd_v1(dwte, dwpe, dout, tokens, vocab_size, context_length, *, block, stream=0):
    """dwte [V, C] += ...; dwpe [T_max, C] += ...; dout [B, T, C]; tokens [B, T] int32.
    Launch: one thread per channel, `block` per block; then k_embed_bwd_wpe_v1."""
    _check_sizes(dwte, dwpe, vocab_size, context_length)
    B, T, C = dout.shape
    k_embed_bwd_v1[cdiv(C, block), block, stream](dwte, dout, tokens)
    k_embed_bwd_wpe_v1[cdiv(T * C, WPE_THREADS), WPE_THREADS, stream](dwpe, dout)


# ---------------------------------------------------------------------------------------------
# backward v2: a linked list per token id, one block per distinct token

@cuda.jit
def k_embed_bwd_links_v2(links, tokens):
    """tokens [N] (flattened positions). For each position i:
        links[0, i] = the smallest j > i with tokens[j] == tokens[i], or -1 if none
        links[1, i] = 1 if no j < i has tokens[j] == tokens[i] (i is the token's first
                      occurrence, the head of its list), else 0
    One thread per position scanning all N tokens (a warp reads the same tokens[j]: a broadcast)."""
    i = cuda.grid(1)
    N = tokens.shape[0]
    if i >= N:
        return
    tok = tokens[i]
    head = 1
    for j in range(i):
        if tokens[j] == tok:
            head = 0
            break
    nxt = -1
    for j in range(i + 1, N):
        if tokens[j] == tok:
            nxt = j
            break
    links[0, i] = nxt
    links[1, i] = head


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


VERSIONS = {"embed_fwd": {1: embed_fwd_v1}, "embed_bwd": {1: embed_bwd_v1, 2: embed_bwd_v2}}
embed_fwd, embed_bwd = embed_fwd_v1, embed_bwd_v2          # what the engine uses
