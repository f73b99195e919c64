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

v3, k_embed_bwd_sort_v3 + k_embed_bwd_v3: v2's sums, bit for bit, without its two slow parts.
On real text a few tokens are very common (in the default corpus, Python's standard library read
as bytes, the space is 30% of the positions), so v2's block for such a token walks a list of
thousands of positions, each step a load that waits for the one before (the next link); and v2's
link kernel scans up to N tokens per position. On the H200, 12M (N = 8192 positions of the default
corpus), v2 took 2.6 ms a backward, more than the whole forward's attention; v3 0.76 ms
(docs/kernels.md). v3 finds each token's positions by sorting instead:
  1. cut the N positions into chunks of SORT_CHUNK positions; one block sorts a chunk's keys
        key = token * SORT_CHUNK + (position - chunk start)
     in shared memory (a bitonic sort: a fixed network of compare-swaps, so it is deterministic).
     In a sorted chunk a token's positions sit side by side, in position order.
  2. one block per (chunk p, sorted slot r); it works only when slot r starts its token's run
     in chunk p and the token is absent from chunks 0..p-1 (binary searches): the block of the
     token's first position. Each thread (a channel c) then finds the token's run in chunks
     p, p+1, ... by binary search and sums those rows of dout in chunk order, and in each run in
     position order: the positions in order, as v2 adds them, so the bits are v2's. The loads of
     8 rows go out before their adds (which keep their order), so a long run is not one load
     latency a row.
The sorted keys live in the first row of v2's links buffer: no new memory.

v4 (the engine's before v5), k_embed_bwd_sort_v3 + k_embed_bwd_v4: v3 with one thread per channel and 16
loads in flight. On the H200 v3's sums took 0.72 ms a call at 12M; the block of the most common
token was the likely cause: its 256 threads for C = 384 channels walk 2,400 rows twice, 8 loads at
a time. v4's block has a thread for every channel (C rounded up to a warp, at most `block`), so
the run is walked once, 16 rows of loads ahead of their adds. The same sums in the same order:
v2's bits. Measured on the H200 (lab/bench/kernels.py embed, text-like ids, whole backward): 12M
v3 0.47 -> v4 0.24 ms; 120M (C = 768) 0.77 -> 0.54 ms with 512 threads, 0.65 ms with 768.

v5 (the engine's), k_embed_bwd_sort_v3 + k_embed_bwd_v5: v4 with each block's binary searches done
once, one thread a chunk, instead of by every thread in turn (the comment above k_embed_bwd_v5).
v3, v4 and v5 sum a run with one device function (_run_adder): v2's bits.

Every version gets dwpe from k_embed_bwd_wpe_v1.
"""
from numba import cuda, float32, int32

from .common import blocks, cdiv, jit_as, rung, SIMULATOR


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


@rung(1)
@blocks(gpu=(256, 64), sim=(4, 2))
def embed_fwd(out, tokens, wte, wpe, *, block, stream=0):
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


@rung(1)
@blocks(gpu=(128, 32), sim=(8, 4))
def embed_bwd(dwte, dwpe, dout, tokens, vocab_size, context_length, *, block, stream=0):
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


# ---------------------------------------------------------------------------------------------
# backward v3: sort each chunk of positions by token, then sum each token's runs in order

SORT_CHUNK = 8 if SIMULATOR else 1024       # positions a sorting block holds (a power of two)
KEY_PAD = 2**31 - 1                         # sorts after every key: the slots past the last position


@cuda.jit
def k_embed_bwd_sort_v3(order, tokens):
    """tokens [N]. Block p sorts the keys of positions p*S .. p*S + S - 1 (S = SORT_CHUNK):
        key(i) = tokens[i] * S + (i - p*S)
    ascending, and writes them to order[p*S ...] (the chunk's own positions only).
    Bitonic sort with S/2 threads: for k = 2, 4, ..., S (the length of the sorted runs being
    merged) and j = k/2, ..., 1 (the distance of a compare-swap), thread t compares slots
    i = 2j (t // j) + t % j and i + j, ascending where i & k == 0, descending elsewhere; a barrier
    after each of the log2(S) (log2(S) + 1) / 2 rounds. The keys are distinct, so no ties."""
    sh = cuda.shared.array(SORT_CHUNK, int32)
    tid, N = cuda.threadIdx.x, tokens.shape[0]
    start = cuda.blockIdx.x * SORT_CHUNK
    for r in range(tid, SORT_CHUNK, cuda.blockDim.x):
        i = start + r
        sh[r] = tokens[i] * SORT_CHUNK + r if i < N else KEY_PAD
    cuda.syncthreads()
    k = 2
    while k <= SORT_CHUNK:
        j = k // 2
        while j > 0:
            for t in range(tid, SORT_CHUNK // 2, cuda.blockDim.x):
                i = 2 * j * (t // j) + t % j
                a, b = sh[i], sh[i + j]
                if (a > b) == ((i & k) == 0):
                    sh[i], sh[i + j] = b, a
            cuda.syncthreads()
            j //= 2
        k *= 2
    for r in range(tid, min(SORT_CHUNK, N - start), cuda.blockDim.x):
        order[start + r] = sh[r]


@cuda.jit(device=True, inline=True)
def _first_at_least(order, lo, hi, key):
    """The first index in [lo, hi) of the sorted order[lo:hi] whose value is >= key (hi if none)."""
    while lo < hi:
        mid = (lo + hi) // 2
        if order[mid] < key:
            lo = mid + 1
        else:
            hi = mid
    return lo


def _run_adder(unroll):
    """add_run(s, dout, order, k, hi, row0, c): s plus dout[row0 + order[j], c] for j = k .. hi - 1, in
    that order, `unroll` loads in flight before their adds (the sum of one run of a token's positions)."""
    @cuda.jit(device=True)
    def add_run(s, dout, order, k, hi, row0, c):
        a = cuda.local.array(unroll, float32)        # registers, once the loops over it are unrolled
        while k + unroll <= hi:                      # `unroll` loads in flight, then their adds in order
            for u in range(unroll):
                a[u] = dout[row0 + order[k + u], c]
            for u in range(unroll):
                s += a[u]
            k += unroll
        while k < hi:
            s += dout[row0 + order[k], c]
            k += 1
        return s
    return add_run


def _make_run_sums(unroll):
    """k_embed_bwd_v3's kernel with `unroll` rows of dout loaded before their adds (v3: 8, v4: 16)."""
    add_run = _run_adder(unroll)

    def k_embed_bwd(dwte, dout, order):
        """dout [N, C]; order [N]: every chunk's sorted keys (k_embed_bwd_sort_v3). One block per
        slot q = p*S + r. Its token v = order[q] // S works here only if slot q begins v's run in
        chunk p and v is in none of the chunks before p: then, for its channels c,
            s = sum over chunks p' = p, p+1, ... of the rows dout[p'*S + key - v*S, c] of v's run
                [first key >= v*S, first key >= (v+1)*S) in chunk p'
        in that order (the positions of v in order, as v2), and dwte[v, c] += s."""
        q, N, C = cuda.blockIdx.x, dout.shape[0], dout.shape[1]
        S = SORT_CHUNK
        p = q // S
        start = p * S
        v = order[q] // S
        if q > start and order[q - 1] // S == v:
            return                                   # not the start of v's run in this chunk
        for e in range(p):                           # v seen in an earlier chunk: its block is there
            lo = _first_at_least(order, e * S, e * S + S, v * S)
            if lo < e * S + S and order[lo] // S == v:
                return
        n_chunks = (N + S - 1) // S
        for c in range(cuda.threadIdx.x, C, cuda.blockDim.x):
            s = float32(0.0)
            for e in range(p, n_chunks):
                base, end = e * S, min(e * S + S, N)
                lo = _first_at_least(order, base, end, v * S)
                hi = _first_at_least(order, lo, end, (v + 1) * S)
                s = add_run(s, dout, order, lo, hi, base - v * S, c)     # position = base - v S + key
            dwte[v, c] += s
    return k_embed_bwd


def _sorted_sums(kernel, threads, dwte, dwpe, links, dout, tokens, vocab_size, context_length, stream):
    """v3's and v4's launches: k_embed_bwd_sort_v3, one block of SORT_CHUNK / 2 threads per chunk;
    `kernel`, one block of `threads` per position; k_embed_bwd_wpe_v1."""
    _check_sizes(dwte, dwpe, vocab_size, context_length)
    assert vocab_size * SORT_CHUNK < KEY_PAD, f"vocab_size {vocab_size} is too large for 32-bit sort keys"
    B, T, C = dout.shape
    N = B * T
    order = links[0]
    k_embed_bwd_sort_v3[cdiv(N, SORT_CHUNK), SORT_CHUNK // 2, stream](order, tokens.reshape(N))
    kernel[N, threads, stream](dwte, dout.reshape(N, C), order)
    k_embed_bwd_wpe_v1[cdiv(T * C, WPE_THREADS), WPE_THREADS, stream](dwpe, dout)


UNROLL_V4 = 16
k_embed_bwd_v4 = jit_as(_make_run_sums(UNROLL_V4), 4)       # launched with a thread per channel
WARP = 4 if SIMULATOR else 32               # v4's threads: the channels rounded up to this


# v5: v4 with each block's searches done once, in parallel, instead of by every thread in turn. A
# block of v4 finds its token's run in each chunk by two binary searches, a chain of about
# 2 log2(SORT_CHUNK) = 20 dependent loads a chunk, and every thread (a channel) repeats them, one
# chunk after another: first through chunks 0..p-1 (is the token there? then this block is not its
# first), then p..n-1 for the sums. At 120M (N = 8192 positions, 8 chunks of 1024) that is some 160
# loads, each waiting for the one before, in each of the N blocks: 1.15 ms on the H200 for 25 MB of
# dout (a profile of the training step). In v5, thread e searches chunk e (all chunks at once: one chain
# of 20 loads), writes the run's bounds [lo, hi) to shared memory and flags a run in a chunk before
# p; after one barrier the channels sum the runs as v4 does. The same rows in the same order: v2's bits.
MAX_CHUNKS = 1024                   # chunks a v5 block keeps the bounds of (N up to 1024 x SORT_CHUNK)


def _make_run_sums_v5(unroll):
    add_run = _run_adder(unroll)

    def k_embed_bwd(dwte, dout, order):
        """v4's sums (k_embed_bwd_v4's docstring), the runs' bounds found by one thread a chunk."""
        run_lo = cuda.shared.array(MAX_CHUNKS, int32)
        run_hi = cuda.shared.array(MAX_CHUNKS, int32)
        earlier = cuda.shared.array(1, int32)
        q, N, C = cuda.blockIdx.x, dout.shape[0], dout.shape[1]
        S = SORT_CHUNK
        p = q // S
        v = order[q] // S
        if q > p * S and order[q - 1] // S == v:
            return                                   # not the start of v's run in chunk p (every thread)
        if cuda.threadIdx.x == 0:
            earlier[0] = 0
        cuda.syncthreads()
        n_chunks = (N + S - 1) // S
        for e in range(cuda.threadIdx.x, n_chunks, cuda.blockDim.x):   # v's run in chunk e: [lo, hi)
            base, end = e * S, min(e * S + S, N)
            lo = _first_at_least(order, base, end, v * S)
            hi = _first_at_least(order, lo, end, (v + 1) * S)
            run_lo[e], run_hi[e] = lo, hi
            if e < p and lo < hi:
                earlier[0] = 1                       # v is in an earlier chunk: its block is there
        cuda.syncthreads()
        if earlier[0] == 1:
            return
        for c in range(cuda.threadIdx.x, C, cuda.blockDim.x):
            s = float32(0.0)
            for e in range(p, n_chunks):
                s = add_run(s, dout, order, run_lo[e], run_hi[e], e * S - v * S, c)   # v4's sums of the runs
            dwte[v, c] += s
    return k_embed_bwd


k_embed_bwd_v5 = jit_as(_make_run_sums_v5(UNROLL_V4), 5)


@rung(5)
@blocks(gpu=(512, 1024), sim=(8, 4))
def embed_bwd_sorted(dwte, dwpe, links, dout, tokens, vocab_size, context_length, *, block, stream=0):
    """v4 (v2's bits) with each block's binary searches done once, one thread a chunk
    (k_embed_bwd_v5); past MAX_CHUNKS chunks, v4's kernel."""
    B, T, C = dout.shape
    threads = min(block, cdiv(C, WARP) * WARP)
    kernel = k_embed_bwd_v5 if cdiv(B * T, SORT_CHUNK) <= MAX_CHUNKS else k_embed_bwd_v4
    _sorted_sums(kernel, threads, dwte, dwpe, links, dout, tokens, vocab_size, context_length, stream)


