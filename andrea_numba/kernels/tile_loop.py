"""The K loop that every warp-tile product kernel shares (matmul v3 to v9, kernels/warp_tile.py,
split_tile.py and simt_tile.py): a block walks K in steps of BK, two shared-memory stages
alternating, the next step's tiles loaded from global memory while the current one is multiplied.
The tile files supply what differs: how a tile is copied (fetch into registers, put into shared
memory) and how one stage is multiplied.
"""
from numba import cuda, float32

WARP = 32


@cuda.jit(device=True, inline="always")
def add_fragment(acc, mi, ni, c0, c1, c2, c3):
    """acc += one 16 x 8 mma.sync result, held in the accumulator layout (ptx.py's docstring):
    c0 C[g, 2t], c1 C[g, 2t+1], c2 C[g+8, 2t], c3 C[g+8, 2t+1] of fragment (mi, ni) go to
    acc[2 mi, 2 ni], acc[2 mi, 2 ni + 1], acc[2 mi + 1, 2 ni], acc[2 mi + 1, 2 ni + 1] (row(i), col(j)
    of the tile). Every tensor-core stage of the products ends with it."""
    i, j = 2 * mi, 2 * ni
    acc[i, j] += c0
    acc[i, j + 1] += c1
    acc[i + 1, j] += c2
    acc[i + 1, j + 1] += c3


def make_load(trans_a, trans_b, fetch_a, fetch_b):
    """load(ra, rb, a, b, k0, ke, row0, col0, M, N): fetch the op(a) tile at rows row0.., k0.. and
    the op(b) tile at k0.., col0.. into registers, each from the matrix as it is stored."""
    @cuda.jit(device=True)
    def load(ra, rb, a, b, k0, ke, row0, col0, M, N):
        if trans_a:
            fetch_a(ra, a, k0, row0, ke, M)
        else:
            fetch_a(ra, a, row0, k0, M, ke)
        if trans_b:
            fetch_b(rb, b, col0, k0, N, ke)
        else:
            fetch_b(rb, b, k0, col0, ke, N)
    return load


def make_pipeline(trans_a, trans_b, BM, BN, BK, WM, WN, copy_a, copy_b, stage):
    """tile_mma(acc, a, b, kb, ke): the K loop every warp-tile product shares (matmul v3 to v9).
    copy_a, copy_b = (fetch, put, values per thread, shape of one shared stage) of each operand;
    stage(acc, sa, sb, wm0, wn0, g, t) adds one stage's BK-deep product into acc. Two shared
    stages alternate: the next tiles' global loads are issued before the current stage is
    multiplied (in flight during the arithmetic), stored to the other stage after it, and one
    barrier a step keeps the stages apart."""
    fetch_a, put_a, EA, SA = copy_a
    fetch_b, put_b, EB, SB = copy_b
    SA, SB = (2, *SA), (2, *SB)                            # two stages of each
    WARPS_N = BN // WN
    load = make_load(trans_a, trans_b, fetch_a, fetch_b)

    @cuda.jit(device=True)
    def tile_mma(acc, a, b, kb, ke):
        sa = cuda.shared.array(SA, float32, alignment=16)  # 16-byte rows for st.v4
        sb = cuda.shared.array(SB, float32, alignment=16)
        ra = cuda.local.array(EA, float32)                 # the next tiles, on their way in
        rb = cuda.local.array(EB, float32)
        tid = cuda.threadIdx.x
        warp, lane = tid // WARP, tid % WARP
        g, t = lane >> 2, lane & 3
        wm0, wn0 = (warp // WARPS_N) * WM, (warp % WARPS_N) * WN
        row0, col0 = cuda.blockIdx.y * BM, cuda.blockIdx.x * BN
        M = a.shape[1] if trans_a else a.shape[0]
        N = b.shape[0] if trans_b else b.shape[1]
        n_steps = (ke - kb + BK - 1) // BK
        load(ra, rb, a, b, kb, ke, row0, col0, M, N)
        put_a(sa[0], ra)
        put_b(sb[0], rb)
        cuda.syncthreads()
        for s in range(n_steps):
            st = s & 1
            if s + 1 < n_steps:                            # next tiles: loads in flight during the math
                load(ra, rb, a, b, kb + (s + 1) * BK, ke, row0, col0, M, N)
            stage(acc, sa[st], sb[st], wm0, wn0, g, t)
            if s + 1 < n_steps:                            # the other stage was last read before the
                put_a(sa[1 - st], ra)                      # previous barrier: free to overwrite
                put_b(sb[1 - st], rb)
            cuda.syncthreads()
    return tile_mma
