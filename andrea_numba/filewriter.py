"""The run's file writer: best.bin, checkpoint.bin and their records, written while training goes on.

A step that saves copies the weights, m and v into pinned host buffers (the one wait for the GPU),
checks them, and hands the writing to one background thread: the sha256 and the atomic write of
each file, the .state.json records around them, in the same order as a synchronous save. The main
thread trains on. A checkpoint of ANDREA-12M (146 MB) took about 0.4 s to write on the H200
machine, and the default 12M run writes 20 such files (docs/kernels.md, 2026-12-02).

Rules that keep it as safe as writing synchronously:
  - one job at a time: start() waits for the last one, and so does every reader of what a job
    changes (the trainer waits before it compares a validation loss with best.bin's record, before
    writing .state.json itself, before it copies into the host buffers again, and before it stops);
  - a job touches no GPU: it writes from the host copies it was given, made for its own step;
  - a job's error (a full disk, a refused file) is raised in the main thread at its next poll() or
    wait(), as the same exception; its log lines are printed there too, in order.
"""
from __future__ import annotations

import threading


class FileWriter:
    def __init__(self, log):
        self.log = log                          # the main thread's log: lines are printed from there
        self.thread = None
        self.error = None
        self.lines = []

    def start(self, job, name="run files"):
        """Run job(say) in the background, after the previous job; say(line) logs a line."""
        self.wait()

        def run():
            try:
                job(self.lines.append)
            except BaseException as e:          # re-raised in the main thread
                self.error = e
        self.thread = threading.Thread(target=run, name=name)
        self.thread.start()

    def in_job(self) -> bool:
        return self.thread is not None and threading.current_thread() is self.thread

    def busy(self) -> bool:
        return self.thread is not None and self.thread.is_alive()

    def poll(self):
        """Between steps: when the job has ended, its lines and its error (raised here)."""
        if self.thread is not None and not self.thread.is_alive():
            self.wait()

    def wait(self):
        """Until the job has ended; then its lines, and its error raised here."""
        if self.thread is None:
            return
        self.thread.join()
        self.thread = None
        lines, self.lines = self.lines, []
        for line in lines:
            self.log(line)
        if self.error is not None:
            error, self.error = self.error, None
            raise error
