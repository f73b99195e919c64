"""The simulator's blocks as kernels/common.py runs them (one simulated thread at a time, handing on
at barriers): barriers hold with threads that leave early, shared memory is shared, an error in one
thread stops the launch with that thread's name and the next launch runs, and a block whose threads
wait where no barrier can open raises instead of hanging."""
import numpy as np
import pytest
from numba import cuda, float32

from andrea_numba.kernels.common import SIMULATOR

pytestmark = pytest.mark.skipif(not SIMULATOR, reason="the simulator's own block runner")

T = 64


@cuda.jit
def _reverse_twice(out, x, live):
    """Threads t >= live return at once. The others write x into shared memory, pass a barrier,
    read their mirror image, pass another, write it back shifted by one, pass a third, read again:
    every read sees only what the barriers let it see."""
    s = cuda.shared.array(T, float32)
    t = cuda.threadIdx.x
    i = cuda.blockIdx.x * T + t
    if t >= live:
        return
    s[t] = x[i]
    cuda.syncthreads()
    v = s[live - 1 - t]
    cuda.syncthreads()
    s[(t + 1) % live] = v
    cuda.syncthreads()
    out[i] = s[t]


def _expected(x, live):
    out = np.full_like(x, np.nan)
    for b in range(x.size // T):
        row = x[b * T:b * T + live]
        mirrored = row[::-1]
        out[b * T:b * T + live] = np.roll(mirrored, 1)
    return out


def _reverse_twice_agrees(blocks, live):
    """_reverse_twice on `blocks` blocks gives what _expected works out (outputs poisoned first)."""
    x = np.arange(blocks * T, dtype=np.float32)
    out = cuda.to_device(np.full(blocks * T, np.nan, np.float32))
    _reverse_twice[blocks, T](out, cuda.to_device(x), live)
    np.testing.assert_array_equal(out.copy_to_host(), _expected(x, live))


@pytest.mark.parametrize("live", [T, 40])
def test_barriers_pass_every_live_thread_and_shared_memory_is_the_blocks(live):
    _reverse_twice_agrees(3, live)


@cuda.jit
def _fails_in_one_thread(out):
    t = cuda.threadIdx.x
    cuda.syncthreads()
    if t == 5 and cuda.blockIdx.x == 1:
        raise ValueError("planted")
    cuda.syncthreads()
    out[cuda.blockIdx.x * T + t] = t


def test_an_error_names_its_thread_and_the_next_launch_runs():
    out = cuda.to_device(np.zeros(2 * T, np.float32))
    with pytest.raises(ValueError, match=r"tid=\[5, 0, 0\] ctaid=\[1, 0, 0\]: planted"):
        _fails_in_one_thread[2, T](out)
    _reverse_twice_agrees(2, T)


@cuda.jit
def _half_a_warp_meets(out):
    from andrea_numba.kernels.ptx import warp_gather
    t = cuda.threadIdx.x
    if t < 16:                          # a meeting of the warp's 32 lanes that 16 come to
        out[t] = warp_gather(float32(t), 0, t)[0]


def test_a_meeting_that_cannot_complete_raises_a_deadlock():
    out = cuda.to_device(np.zeros(32, np.float32))
    with pytest.raises(RuntimeError, match="deadlock"):
        _half_a_warp_meets[1, 32](out)


@cuda.jit
def _warp_sum(out, x):
    from andrea_numba.kernels.ptx import warp_gather
    t = cuda.threadIdx.x
    lanes = warp_gather(x[t], t // 32, t % 32)
    out[t] = lanes.sum()


def test_warps_meet_apart_and_a_meeting_is_reused():
    x = np.arange(64, dtype=np.float32)
    out = cuda.to_device(np.zeros(64, np.float32))
    for _ in range(2):
        _warp_sum[1, 64](out, cuda.to_device(x))
        got = out.copy_to_host()
        np.testing.assert_array_equal(got[:32], np.full(32, x[:32].sum()))
        np.testing.assert_array_equal(got[32:], np.full(32, x[32:].sum()))


@cuda.jit
def _tree_sum(out, x, barrier):
    """out[block] = sum of the block's T values by a shared-memory tree; barrier False leaves out the
    syncthreads between the levels (a student's missing barrier)."""
    s = cuda.shared.array(T, float32)
    t = cuda.threadIdx.x
    s[t] = x[cuda.blockIdx.x * T + t]
    if barrier:
        cuda.syncthreads()
    stride = T // 2
    while stride > 0:
        if t < stride:
            s[t] += s[t + stride]
        if barrier:
            cuda.syncthreads()
        stride //= 2
    if t == 0:
        out[cuda.blockIdx.x] = s[0]


def test_a_missing_barrier_gives_a_wrong_sum_on_every_run():
    """Threads run one at a time until they wait: thread 0 climbs the whole tree before thread 1 has
    stored its value, so a tree without its barriers reads slots that nobody has written yet (what
    an earlier array left in that memory, as on a GPU) on every run, where threads that all ran at
    once could hide it; with the barriers, the sum."""
    x = np.arange(2 * T, dtype=np.float32)
    right = [x[:T].sum(), x[T:].sum()]
    for _ in range(3):
        out = cuda.to_device(np.zeros(2, np.float32))
        _tree_sum[2, T](out, cuda.to_device(x), False)
        assert not np.array_equal(out.copy_to_host(), right)
    out = cuda.to_device(np.zeros(2, np.float32))
    _tree_sum[2, T](out, cuda.to_device(x), True)
    np.testing.assert_array_equal(out.copy_to_host(), right)


@pytest.mark.skipif(not hasattr(__import__("os"), "fork"), reason="fork")
def test_a_forked_child_runs_kernels_on_threads_of_its_own():
    """The grader forks a job a file from a warm process: a child whose parent has run kernels
    (its pool holds the parent's threads, which the child does not have) still runs them."""
    import subprocess
    import sys
    code = """if True:
        import os, numpy as np
        from numba import cuda
        @cuda.jit
        def k(out):
            t = cuda.threadIdx.x
            cuda.syncthreads()
            out[t] = t
        import andrea_numba.kernels.common
        k[1, 32](cuda.to_device(np.zeros(32, np.float32)))        # the parent's pool
        pid = os.fork()
        if pid == 0:
            o = cuda.to_device(np.zeros(32, np.float32))
            k[1, 32](o)
            os._exit(0 if (o.copy_to_host() == np.arange(32)).all() else 1)
        raise SystemExit(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
    """
    p = subprocess.run([sys.executable, "-c", code], env={**__import__("os").environ, "NUMBA_ENABLE_CUDASIM": "1"},
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr[-500:]


@cuda.jit
def _ones(out):
    out[cuda.threadIdx.x] = 1


def test_the_pooled_threads_keep_no_launchs_arrays_alive():
    """After a launch its threads wait in the pool for the next block: what the launch was given is
    freed with its last reference, not held until another launch (a training run's buffers)."""
    import gc
    import weakref
    d = cuda.to_device(np.zeros(T, np.float32))
    _ones[1, T](d)
    held = weakref.ref(d._ary)                # the simulator's array behind the device array
    del d
    gc.collect()
    assert held() is None


def test_an_error_whose_type_wants_other_arguments_still_ends_the_launch():
    """The runner rewords a thread's error with the thread's name; an exception type that cannot be
    built from one message is said as a RuntimeError instead of stopping the thread before it hands
    the turn on (the launch would wait for it for ever: run in a process with a time limit)."""
    import subprocess
    import sys
    code = """if True:
        import numpy as np
        from numba import cuda
        import andrea_numba.kernels.common
        class TwoArgs(Exception):
            def __init__(self, a, b):
                super().__init__(f"{a} and {b}")
        @cuda.jit
        def k(out):
            if cuda.threadIdx.x == 3:
                raise TwoArgs(1, 2)
            out[cuda.threadIdx.x] = 1
        try:
            k[1, 64](cuda.to_device(np.zeros(64, np.float32)))
        except RuntimeError as e:
            print(e)
    """
    p = subprocess.run([sys.executable, "-c", code], env={**__import__("os").environ, "NUMBA_ENABLE_CUDASIM": "1"},
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and "tid=[3, 0, 0] ctaid=[0, 0, 0]: TwoArgs: 1 and 2" in p.stdout, (p.stdout, p.stderr[-500:])
