"""The lab's rungs of andrea_numba/kernels/embed.py: every numbered version the engine does not run,
beside the engine's own (imported from the engine module), and the VERSIONS table of the ladder.

The ladder of embed_bwd (dwte; every rung gets dwpe from the engine's k_embed_bwd_wpe), measured on
the H200 (docs/kernels.md has the dates and raw files; lesson 09 walks through v2 and v3):

v1 (embed_bwd, the lessons'): one thread per channel c walks all B*T positions in order and adds
    each row of dout into its token's row of dwte. Simple and deterministic, but only C threads
    work, each through B*T dependent steps.
v2 (k_embed_bwd_links_v2 + k_embed_bwd_v2): first link every position to the next position holding
    the same token (a linked list per token id, in position order). Then one block per position:
    the block at the FIRST occurrence of a token walks its list, sums those rows of dout in
    position order and adds the sum into dwte once. Blocks of the other positions return at once.
    All the distinct tokens work in parallel; a token's list is walked by one block, in order:
    still deterministic.
v3 (the engine's k_embed_bwd_sort + k_embed_bwd_v3, here): v2's sums, bit for bit, without its
    two slow parts. On real text a few tokens are very common (in the default corpus, Python's standard
    library read as bytes, the space is 30% of the positions), so v2's block for such a token walks
    a list of thousands of positions, each step a load that waits for the one before (the next
    link); and v2's link kernel scans up to N tokens per position. On the H200, 12M (N = 8192
    positions of the default corpus), v2 took 2.6 ms a backward, more than the whole forward's
    attention; v3 0.76 ms. v3 finds each token's positions by sorting instead:
      1. cut the N positions into chunks of SORT_CHUNK positions; one block sorts a chunk's keys
            key = token * SORT_CHUNK + (position - chunk start)
         in shared memory (a bitonic sort: a fixed network of compare-swaps, so deterministic).
      2. one block per (chunk p, sorted slot r); it works only when slot r starts its token's run
         in chunk p and the token is absent from chunks 0..p-1 (binary searches): the block of the
         token's first position. Each thread (a channel c) then finds the token's run in chunks
         p, p+1, ... by binary search and sums those rows of dout in chunk order, and in each run
         in position order: the positions in order, as v2 adds them, so the bits are v2's. The
         loads of 8 rows (UNROLL_V3) go out before their adds (which keep their order).
    The sorted keys live in the first row of v2's links buffer: no new memory.
v4 (k_embed_bwd_sort + the engine's k_embed_bwd_sorted_thread_search): v3 with one thread per
    channel and 16 loads in flight. On the H200 v3's sums took 0.72 ms a call at 12M; the block of
    the most common token was the likely cause: its 256 threads for C = 384 channels walk 2,400
    rows twice, 8 loads at a time. v4's block has a thread for every channel (C rounded up to a
    warp, at most `block`), so the run is walked once, 16 rows of loads ahead of their adds. The
    same sums in the same order: v2's bits. Measured on the H200 (lab/bench/kernels.py embed,
    text-like ids, whole backward): 12M v3 0.47 -> v4 0.24 ms; 120M (C = 768) 0.77 -> 0.54 ms with
    512 threads, 0.65 ms with 768. The engine keeps v4's kernel for more than MAX_CHUNKS chunks.
v5 (embed_bwd_sorted, the engine's: k_embed_bwd_sort + k_embed_bwd_sorted): v4 with each block's
    searches done once, in parallel, instead of by every thread in turn. A block of v4 finds its
    token's run in each chunk by two binary searches, a chain of about 2 log2(SORT_CHUNK) = 20
    dependent loads a chunk, and every thread (a channel) repeats them, one chunk after another:
    first through chunks 0..p-1 (is the token there? then this block is not its first), then
    p..n-1 for the sums. At 120M (N = 8192 positions, 8 chunks of 1024) that is some 160 loads,
    each waiting for the one before, in each of the N blocks: 1.15 ms on the H200 for 25 MB of dout
    (a profile of the training step). In v5, thread e searches chunk e (all chunks at once: one
    chain of 20 loads), writes the run's bounds [lo, hi) to shared memory and flags a run in a
    chunk before p; after one barrier the channels sum the runs as v4 does. The same rows in the
    same order: v2's bits.
v3, v4 and v5 sum a run with one device function (the engine's _run_adder): v2's bits.
"""
from numba import cuda, float32
from andrea_numba.kernels.embed import *  # noqa: F401,F403  (the engine's rungs and helpers)
from andrea_numba.kernels.embed import _check_sizes, _make_run_sums, _sorted_sums  # noqa: F401


# ---------------------------------------------------------------------------------------------
# v2: a linked list per token id, one block per distinct token

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
    k_embed_bwd_v2, one block of `block` threads per position; k_embed_bwd_wpe."""
    _check_sizes(dwte, dwpe, vocab_size, context_length)
    B, T, C = dout.shape
    N = B * T
    flat_tokens = tokens.reshape(N)          # contiguous: views, no copies
    flat_dout = dout.reshape(N, C)
    k_embed_bwd_links_v2[cdiv(N, WPE_THREADS), WPE_THREADS, stream](links, flat_tokens)
    k_embed_bwd_v2[N, block, stream](dwte, flat_dout, flat_tokens, links)
    k_embed_bwd_wpe[cdiv(T * C, WPE_THREADS), WPE_THREADS, stream](dwpe, dout)


# ---------------------------------------------------------------------------------------------
# v3 and v4: the engine's sorted sums with every thread searching every chunk

UNROLL_V3 = 8                               # rows of dout whose loads go out together


k_embed_bwd_v3 = _make_run_sums(UNROLL_V3, "k_embed_bwd_v3")


@blocks(gpu=(256, 128), sim=(4, 2))
def embed_bwd_v3(dwte, dwpe, links, dout, tokens, vocab_size, context_length, *, block, stream=0):
    """v2's result, bit for bit; links [2, B*T] int32 as v2's (v3 uses its first row for the sorted
    keys). k_embed_bwd_v3 runs `block` threads a block."""
    _sorted_sums(k_embed_bwd_v3, block, dwte, dwpe, links, dout, tokens, vocab_size, context_length, stream)


@blocks(gpu=(512, 1024), sim=(8, 4))
def embed_bwd_v4(dwte, dwpe, links, dout, tokens, vocab_size, context_length, *, block, stream=0):
    """v3 (v2's bits) with a thread per channel: k_embed_bwd_sorted_thread_search (UNROLL = 16
    loads ahead) runs min(block, C rounded up to a warp) threads a block, so each thread walks a
    token's runs once."""
    threads = min(block, cdiv(dout.shape[2], WARP) * WARP)
    _sorted_sums(k_embed_bwd_sorted_thread_search, threads, dwte, dwpe, links, dout, tokens, vocab_size, context_length, stream)


VERSIONS = {"embed_fwd": {1: embed_fwd},
            "embed_bwd": {1: embed_bwd, 2: embed_bwd_v2, 3: embed_bwd_v3, 4: embed_bwd_v4, 5: embed_bwd_sorted}}
