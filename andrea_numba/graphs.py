"""CUDA graphs: a sequence of launches recorded once and replayed with one call.

    graph = StepGraph(stream, work)      # work(builder) launches its kernels on the builder: recorded
    graph.launch()                       # the recorded launches, replayed on `stream`

The trainer records its step, an evaluation batch and the sampler's forward this way
(andrea_numba/train.py); the KV-cache decoder its step, one replay a sampled token
(andrea_numba/decode.py). A recorded launch keeps its arguments, so whatever changes from replay
to replay lives in device buffers the kernels read. The simulator has no graphs (GRAPHS is False
there): everything runs eagerly.
"""
from __future__ import annotations

import numpy as np
from numba import cuda

from .kernels.common import SIMULATOR

GRAPHS = not SIMULATOR          # CUDA graphs need a GPU: the simulator runs every step eagerly
# While the capture is open this thread may not allocate, free or wait for the GPU: such a call
# fails the capture (and the run trains on eagerly) instead of leaving the graph pointing at
# memory that is freed later. ("relaxed" would allow them.)
CAPTURE_MODE = "thread_local"


class StepGraph:
    """A step (the trainer's, a decoder's) recorded once as a CUDA graph, then replayed. `work(stream)`
    launches the step's kernels on `stream`; here it gets a cuda.core GraphBuilder capturing the run's stream,
    and numba-cuda records each launch given that builder as its stream into the graph, without
    running it. launch() replays the whole step on the run's stream: one call instead of a few
    hundred launches."""

    def __init__(self, stream, work):
        from cuda.core import Stream as CoreStream
        self.numba_stream = stream
        self.stream = CoreStream.from_handle(int(stream.handle))    # the run's stream, as cuda.core sees it
        builder = self.stream.create_graph_builder()               # captures what is queued on that stream
        with cuda.defer_cleanup():          # numba frees no earlier garbage while the capture is open
            builder.begin_building(CAPTURE_MODE)
            try:
                work(builder)
                builder.end_building()
            except BaseException:
                try:
                    builder.close()         # ends the capture still open: the stream works again
                except Exception:
                    pass                    # (an invalidated capture ends with an error of its own)
                raise
        self.graph = builder.complete()     # instantiated: ready to launch
        builder.close()

    def launch(self):
        self.graph.launch(self.stream)

    def replay_ms(self, reps: int) -> float:
        """For the benchmarks: the median ms of one replay, after a first one, each timed between
        two CUDA events on the run's stream (the GPU's time; the host only queues it)."""
        s = self.numba_stream
        self.launch()
        s.synchronize()
        times = []
        for _ in range(reps):
            e0, e1 = cuda.event(), cuda.event()
            e0.record(stream=s)
            self.launch()
            e1.record(stream=s)
            e1.synchronize()
            times.append(cuda.event_elapsed_time(e0, e1))
        return float(np.median(times))
