"""Token + position embedding: k_embed_fwd / k_embed_bwd. NumPy twin: reference/embed.py.

    out[b, t, c] = wte[tokens[b, t], c] + wpe[t, c]

Backward: tokens are integers, so there is no grad_input; the gradient flows into the rows that
were looked up, and a token id that occurs n times gets the sum of its n rows of dout:
    dwte[v, c] += sum over positions (b, t) with tokens[b, t] == v of dout[b, t, c]
    dwpe[t, c] += sum over b of dout[b, t, c]                 (rows t >= T are untouched)

Many positions add into the same row of dwte. Atomics would make the order of those additions
(and so the rounding) change from run to run; instead every sum here has a fixed order, and only
one thread writes each element.

    k_embed_fwd          a block per position (b, t), its threads striding over the C channels
    k_embed_bwd_wpe      dwpe: a thread per (t, c), summing over b in order
    k_embed_bwd          the lessons' dwte: a thread per channel c walks all B*T positions in
                         order, adding each row into dwte. Only C threads work, each through B*T
                         dependent steps.
    k_embed_bwd_sort     the engine's dwte, first launch: each chunk of positions sorted by
                         (token, position)
    k_embed_bwd_sorted   the engine's dwte, second launch: a block per token sums its rows, in
                         position order (k_embed_bwd_sorted_thread_search past MAX_CHUNKS chunks)

Why sort. On real text a few tokens are very common: in the default corpus (Python's standard
library read as bytes) the space is 30% of the positions, about 2,400 of a 12M batch's 8,192.
The time of a backward is then the time of its most common token: it must find that token's
positions without scanning or following links one load at a time, and add its rows with many
loads in flight (lesson 09; docs/kernels.md has the ladder, measured on the default corpus).

The engine's backward (embed_bwd_sorted), N = B*T positions:
  1. k_embed_bwd_sort cuts the positions into chunks of SORT_CHUNK; one block sorts a chunk's keys
        key = token * SORT_CHUNK + (position - chunk start)
     in shared memory (a bitonic sort: a fixed network of compare-swaps, so it is deterministic).
     In a sorted chunk a token's positions sit side by side, in position order. The sorted keys
     go to the first row of the launcher's int32 scratch `links` [2, N].
  2. k_embed_bwd_sorted runs one block per slot q = p * SORT_CHUNK + r (chunk p, sorted slot r).
     Slot q's token v is summed by the block of v's first position only: slot q must start v's
     run in chunk p, and v must be in none of the chunks 0..p-1; every other block returns at
     once. The block's threads find v's run in every chunk, thread e binary-searching chunk e
     (one chain of about 2 log2(SORT_CHUNK) dependent loads for all the chunks at once), and keep
     the runs' bounds [lo, hi) in shared memory; a run in a chunk before p means the block is not
     v's first, and it returns. After a barrier each thread takes a channel c (the block has a
     thread for every channel, C rounded up to a warp, at most `block`) and adds
        s = sum over chunks e = p, p+1, ... of dout[e * SORT_CHUNK + key_k - v * SORT_CHUNK, c]
            for the slots k of v's run in chunk e, in order
     that is, v's rows in position order; then dwte[v, c] += s, once. The loads of UNROLL rows go
     out before their adds (which keep their order), so a run of thousands of rows does not wait
     one load latency a row.
  Past MAX_CHUNKS chunks (more than the shared bounds hold) k_embed_bwd_sorted_thread_search
  runs instead: the same sums, each thread doing the binary searches itself, chunk after chunk.
Both add a run with one device function (_run_adder): the same rows in the same order, so the
two give the same bits, and so do the lab's rungs 2 to 4 (tests/test_embed_bwd.py). The lessons'
k_embed_bwd adds each row straight into dwte: another rounding, equally deterministic.
Every launcher gets dwpe from k_embed_bwd_wpe.
"""
from numba import cuda, float32, int32

from .common import blocks, cdiv, rung, SIMULATOR


# ---------------------------------------------------------------------------------------------
# forward

@cuda.jit
def k_embed_fwd(out, tokens, wte, wpe):
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
    k_embed_fwd[B * T, block, stream](out, tokens, wte, wpe)


# ---------------------------------------------------------------------------------------------
# backward, dwpe (every launcher)

@cuda.jit
def k_embed_bwd_wpe(dwpe, dout):
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


WPE_THREADS = 32 if SIMULATOR else 256      # k_embed_bwd_wpe: one thread per element of dwpe[:T]


# ---------------------------------------------------------------------------------------------
# backward, the lessons' dwte: one thread per channel

@cuda.jit
def k_embed_bwd(dwte, dout, tokens):
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
    Launch: one thread per channel, `block` per block; then k_embed_bwd_wpe."""
    _check_sizes(dwte, dwpe, vocab_size, context_length)
    B, T, C = dout.shape
    k_embed_bwd[cdiv(C, block), block, stream](dwte, dout, tokens)
    k_embed_bwd_wpe[cdiv(T * C, WPE_THREADS), WPE_THREADS, stream](dwpe, dout)


# ---------------------------------------------------------------------------------------------
# backward, the engine's dwte: sort each chunk of positions by token, then sum each token's runs in order

SORT_CHUNK = 8 if SIMULATOR else 1024       # positions a sorting block holds (a power of two)
KEY_PAD = 2**31 - 1                         # sorts after every key: the slots past the last position


@cuda.jit
def k_embed_bwd_sort(order, tokens):
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


UNROLL = 16                         # rows of dout whose loads go out before their adds
WARP = 4 if SIMULATOR else 32       # a block's threads: the channels rounded up to this (at most `block`)
MAX_CHUNKS = 1024                   # chunks whose runs' bounds k_embed_bwd_sorted keeps (N up to 1024 x SORT_CHUNK)


def _make_sorted_sums(unroll):
    """k_embed_bwd_sorted with `unroll` rows of dout loaded before their adds."""
    add_run = _run_adder(unroll)

    def k_embed_bwd_sorted(dwte, dout, order):
        """dout [N, C]; order [N]: every chunk's sorted keys (k_embed_bwd_sort), S = SORT_CHUNK.
        One block per slot q = p*S + r, token v = order[q] // S. The block works only if slot q
        begins v's run in chunk p and v is in none of the chunks before p; then, for its channels c,
            s = sum over chunks e = p, p+1, ... of the rows dout[e*S + key - v*S, c] of v's run
                [first key >= v*S, first key >= (v+1)*S) in chunk e
        in that order (v's positions in order), and dwte[v, c] += s. The runs' bounds are found
        first, thread e binary-searching chunk e, into run_lo, run_hi in shared memory (and
        `earlier` set where v has a run before chunk p); after a barrier every thread reads them."""
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
                s = add_run(s, dout, order, run_lo[e], run_hi[e], e * S - v * S, c)   # v's run in chunk e, in order
            dwte[v, c] += s
    return cuda.jit(k_embed_bwd_sorted)


def _make_run_sums(unroll, name):
    """The kernel of k_embed_bwd_sorted's sums with every thread doing the binary searches itself,
    chunk after chunk (no shared bounds: any number of chunks); `unroll` rows of dout loaded before
    their adds; `name` the kernel's name (the lab's rung 3 builds it too)."""
    add_run = _run_adder(unroll)

    def k_embed_bwd(dwte, dout, order):
        """dout [N, C]; order [N]: every chunk's sorted keys (k_embed_bwd_sort). One block per
        slot q = p*S + r. Its token v = order[q] // S works here only if slot q begins v's run in
        chunk p and v is in none of the chunks before p (each thread searches chunks 0..p-1): then,
        for its channels c,
            s = sum over chunks p' = p, p+1, ... of the rows dout[p'*S + key - v*S, c] of v's run
                [first key >= v*S, first key >= (v+1)*S) in chunk p'
        in that order (v's positions in order, as k_embed_bwd_sorted), and dwte[v, c] += s."""
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
    k_embed_bwd.__name__ = k_embed_bwd.__qualname__ = name     # the name profilers and errors show
    return cuda.jit(k_embed_bwd)


k_embed_bwd_sorted = _make_sorted_sums(UNROLL)
k_embed_bwd_sorted_thread_search = _make_run_sums(UNROLL, "k_embed_bwd_sorted_thread_search")


def _sorted_dwte(kernel, threads, dwte, links, dout, tokens, vocab_size, stream):
    """The sorted backward's dwte: k_embed_bwd_sort, one block of SORT_CHUNK / 2 threads per chunk,
    into links[0]; then `kernel`, one block of `threads` per position."""
    assert vocab_size * SORT_CHUNK < KEY_PAD, f"vocab_size {vocab_size} is too large for 32-bit sort keys"
    B, T, C = dout.shape
    N = B * T
    order = links[0]
    k_embed_bwd_sort[cdiv(N, SORT_CHUNK), SORT_CHUNK // 2, stream](order, tokens.reshape(N))
    kernel[N, threads, stream](dwte, dout.reshape(N, C), order)


def _sorted_sums(kernel, threads, dwte, dwpe, links, dout, tokens, vocab_size, context_length, stream):
    """The sorted backward's launches: dwte's (_sorted_dwte), then k_embed_bwd_wpe."""
    _check_sizes(dwte, dwpe, vocab_size, context_length)
    _sorted_dwte(kernel, threads, dwte, links, dout, tokens, vocab_size, stream)
    B, T, C = dout.shape
    k_embed_bwd_wpe[cdiv(T * C, WPE_THREADS), WPE_THREADS, stream](dwpe, dout)


@rung(5)
@blocks(gpu=(512, 1024), sim=(8, 4))
def embed_bwd_sorted(dwte, dwpe, links, dout, tokens, vocab_size, context_length, *, block, stream=0):
    """dwte [V, C] += ...; dwpe [T_max, C] += ...; links: int32 scratch [2, B*T] (its first row
    receives the sorted keys); dout [B, T, C]; tokens [B, T] int32. Launch: k_embed_bwd_sort, one
    block of SORT_CHUNK / 2 threads per chunk; k_embed_bwd_sorted, one block per position of
    min(block, C rounded up to a warp) threads (a thread a channel), or past MAX_CHUNKS chunks
    k_embed_bwd_sorted_thread_search (the same sums); then k_embed_bwd_wpe."""
    _check_sizes(dwte, dwpe, vocab_size, context_length)
    embed_bwd_sorted_dwte(dwte, links, dout, tokens, vocab_size, block=block, stream=stream)
    B, T, C = dout.shape
    k_embed_bwd_wpe[cdiv(T * C, WPE_THREADS), WPE_THREADS, stream](dwpe, dout)


@blocks(gpu=(512, 1024), sim=(8, 4))
def embed_bwd_sorted_dwte(dwte, links, dout, tokens, vocab_size, *, block, stream=0):
    """embed_bwd_sorted's dwte alone, with its launches and its bits; dwpe is left to another
    kernel (a student's k_embed_bwd_wpe, when the trainer is given one: andrea_numba/your_kernels.py)."""
    B, T, C = dout.shape
    threads = min(block, cdiv(C, WARP) * WARP)
    kernel = k_embed_bwd_sorted if cdiv(B * T, SORT_CHUNK) <= MAX_CHUNKS else k_embed_bwd_sorted_thread_search
    _sorted_dwte(kernel, threads, dwte, links, dout, tokens, vocab_size, stream)
