"""The file writer's rules (order, errors and lines reach the main thread) and compile-ahead's
plumbing that runs without a GPU (worker count, the simulator's no-op, the recording of launches).
The compiling itself needs a GPU: lab/bench/compile_ahead_check.py checks it there."""
import threading
import time

import pytest

from andrea_numba import precompile
from andrea_numba.filewriter import FileWriter
from andrea_numba.kernels.common import SIMULATOR


def test_jobs_run_one_at_a_time_in_order_and_their_lines_reach_the_log():
    lines, order = [], []
    w = FileWriter(lines.append)
    gate = threading.Event()            # b holds until the test has looked (no race with a busy CPU)

    def job(tag, pause, hold=None):
        def run(say):
            time.sleep(pause)
            if hold is not None:
                hold.wait(5)
            order.append(tag)
            say(f"wrote {tag}")
        return run
    w.start(job("a", 0.05))
    assert w.busy()
    w.start(job("b", 0.0, gate))        # waits for a first
    assert order == ["a"] and lines == ["wrote a"]
    gate.set()
    w.wait()
    assert order == ["a", "b"] and lines == ["wrote a", "wrote b"] and not w.busy()


def test_a_jobs_error_is_raised_in_the_main_thread_once():
    w = FileWriter(lambda s: None)

    def bad(say):
        raise OSError(28, "No space left on device")
    w.start(bad)
    deadline = time.time() + 5
    while w.busy() and time.time() < deadline:
        time.sleep(0.01)
    with pytest.raises(OSError, match="No space left"):
        w.poll()
    w.wait()                            # raised once: nothing left
    w.poll()


def test_in_job_is_true_only_inside_the_writers_thread():
    w = FileWriter(lambda s: None)
    seen = []
    w.start(lambda say: seen.append(w.in_job()))
    w.wait()
    assert seen == [True] and not w.in_job()


def test_workers_are_bounded_by_tasks_request_and_free_gpu_memory():
    gib = precompile.WORKER_GPU_BYTES
    assert precompile.plan_workers(33, 16, 100 * gib) == 16
    assert precompile.plan_workers(5, 16, 100 * gib) == 5
    assert precompile.plan_workers(33, 16, 3 * gib + 1) == 3
    assert precompile.plan_workers(33, 0, 100 * gib) == 0
    assert 1 <= precompile.default_workers() <= precompile.MAX_WORKERS


@pytest.mark.skipif(not SIMULATOR, reason="the simulator's no-op")
def test_compile_ahead_does_nothing_in_the_simulator():
    class Disp:                          # what compile_ahead reads of a dispatcher
        overloads = {}
        py_func = staticmethod(lambda: None)
    report = precompile.compile_ahead([(Disp(), ("sig",))], workers=4)
    assert report["ahead"] == report["workers"] == 0 and report["kernels"] == 1 and report["failed"] == []


def test_the_trainer_refuses_a_negative_worker_count():
    from andrea_numba import train as tr
    with pytest.raises(SystemExit):
        tr.parser().parse_args(["--compile-workers", "-2"])
    assert tr.parser().parse_args(["--compile-workers", "0"]).compile_workers == 0
    assert tr.compile_workers(tr.parser().parse_args([])) == precompile.default_workers()
