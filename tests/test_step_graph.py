"""The training step as one CUDA graph, in the simulator: what a step reads that changes from step
to step lives in device buffers written before it (token batches, dropout keys, AdamW's lr and
bias corrections), so that a step recorded once and replayed equals a step launched kernel by
kernel, bit for bit. The simulator has no CUDA graphs; here a stand-in records the launches a
real capture would record (every launch of the step, given the builder as its stream) and
replays them with the arguments they were recorded with, as a graph does. The sampler runs on
the training model's buffers, and the memory plan counts every byte the trainer allocates."""
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from numba import cuda

import reference as R
from andrea_numba import data as D
from andrea_numba import train as tr
from andrea_numba.gpu_model import GPUModel
from andrea_numba.kernels import optim, residual
from andrea_numba.kernels.common import SIMULATOR

sys.path.insert(0, str(Path(__file__).parent))
from test_train import corpus_text, small_config  # noqa: E402

pytestmark = [pytest.mark.skipif(not SIMULATOR, reason="the stand-in graph records the simulator's launches"),
              pytest.mark.xdist_group("step_graph")]   # one worker of `pytest -n` runs the module: its module fixture once
STEPS = 2                      # step 0 eager (then the capture), step 1 replayed


class FakeGraphBuilder:
    """Stands for cuda.core's GraphBuilder: a kernel launched with it as its stream is recorded."""

    def __init__(self):
        self.launches = []


class FakeStepGraph:
    """tr.StepGraph's stand-in: records work(builder)'s launches, replays them on the run's stream."""
    captured = []

    def __init__(self, stream, work):
        self.stream, self.builder = stream, FakeGraphBuilder()
        work(self.builder)
        assert self.builder.launches, "the capture recorded no launch"
        FakeStepGraph.captured.append(self)

    def launch(self):
        for kernel, config, args in self.builder.launches:
            RECORDER.launch(kernel, (config[0], config[1], self.stream, *config[3:]))(*args)


class Recorder:
    """Patches the simulator: launches given a FakeGraphBuilder are recorded, not run; any launch on
    another stream, and any copy, while a capture is open fails the test."""

    def patch(self, mp):
        from numba.cuda.simulator.cudadrv.devicearray import FakeCUDAArray
        from numba.cuda.simulator.kernel import FakeCUDAKernel
        self.launch = FakeCUDAKernel.__getitem__
        self.capturing = None

        def configure(kernel, config):
            stream = config[2] if len(config) > 2 else 0
            if isinstance(stream, FakeGraphBuilder):
                return lambda *args: stream.launches.append((kernel, config, args))
            assert self.capturing is None, f"{kernel.fn.__name__} launched on {stream} during a capture"
            return self.launch(kernel, config)

        def no_copy_while_capturing(method):
            def copy(arr, *a, **k):
                assert self.capturing is None, "a copy during a capture"
                return method(arr, *a, **k)
            return copy
        mp.setattr(FakeCUDAKernel, "__getitem__", configure)
        for name in ("copy_to_device", "copy_to_host"):
            mp.setattr(FakeCUDAArray, name, no_copy_while_capturing(getattr(FakeCUDAArray, name)))

        def capture(stream, work):
            self.capturing = True
            try:
                return FakeStepGraph(stream, work)
            finally:
                self.capturing = None
        mp.setattr(tr, "StepGraph", capture)
        mp.setattr(tr, "GRAPHS", True)


RECORDER = Recorder()


def trained(root, graph, steps=STEPS, **train):
    """A Trainer of the small config (dropout 0.1) after `steps` steps: (trainer, [(loss, norm, lr)])."""
    corpus = root / "corpus.txt"
    if not corpus.exists():
        corpus.write_text(corpus_text())
    _, cfg = small_config(root, f"{graph}.json", corpus, dropout=0.1, seq_len=4, **train)
    trainer = tr.Trainer(cfg, root / ("graph" if graph else "eager"), data_dir=root / "data", log=lambda s: None,
                         graph=graph)
    trainer.setup()
    return trainer, [trainer.train_step(step) for step in range(steps)]


def host(trainer):
    return [a.copy_to_host() for a in (trainer.model.params, trainer.adam_m, trainer.adam_v, trainer.model.grads)]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("graph")
    eager = trained(root, graph=False)
    with pytest.MonkeyPatch.context() as mp:
        RECORDER.patch(mp)
        FakeStepGraph.captured.clear()
        graph = trained(root, graph=True)
        captured = list(FakeStepGraph.captured)
    return SimpleNamespace(root=root, eager=eager, graph=graph, captured=captured)


@pytest.mark.slow
def test_replayed_steps_equal_eager_steps_bit_for_bit(runs):
    (eager, e_log), (graph, g_log) = runs.eager, runs.graph
    assert eager.launches == "eager" and eager.graph is None
    assert graph.launches == "graph" and len(runs.captured) == 1 and graph.graph is runs.captured[0]
    assert e_log == g_log                                       # losses, norms, lrs: the same floats
    for a, b in zip(host(eager), host(graph)):
        assert a.tobytes() == b.tobytes()
    assert not host(graph)[3].any()                             # AdamW v2 cleared the gradient


@pytest.mark.slow
def test_the_eager_step_is_the_step_of_before_bit_for_bit(runs):
    """The step before the graph work, written out: token ids copied into the model, dropout keys as
    numbers, AdamW v1 with lr and t from the host, then k_zero. The trainer's step (device
    buffers, device keys, AdamW v2 clearing the gradient) gives the same bits."""
    trainer, log = runs.eager
    cfg, t = trainer.cfg, trainer.cfg.train
    model = GPUModel(cfg.model, t.batch_size, t.seq_len, dropout=t.dropout)
    params = tr.init_params(cfg.model, t.seed)
    model.params.copy_to_device(params)
    m, v = (cuda.to_device(np.zeros(params.size, np.float32)) for _ in range(2))
    decay = cuda.to_device(tr.decay_mask(cfg.model, np.uint8))
    partial = cuda.device_array(optim.NORM_BLOCKS, np.float32)
    stats = cuda.device_array(2, np.float32)
    tokens = D.load(trainer.data_dir)[0]
    for step in range(STEPS):
        optim.zero(stats)
        for micro in range(t.n_microbatches):
            x, y = D.get_batch(tokens, t.batch_size, t.seq_len, t.seed, step, micro)
            model.forward(x, y, dropout_key=R.dropout_key(t.seed, step, micro))
            model.backward()
            residual.residual_add(stats[0:1], stats[0:1], model.buf["loss"])
        optim.grad_scale(model.grads, stats[1:2], 0.0, 1.0 / t.n_microbatches)
        optim.grad_norm(stats[1:2], partial, model.grads)
        optim.grad_scale(model.grads, stats[1:2], t.clip_norm, 1.0)
        optim.adamw_grid_stride(model.params, model.grads, m, v, decay, step + 1, trainer.lr(step), t.beta1, t.beta2, t.eps,
                       t.weight_decay, stats)
        optim.zero(model.grads)
        loss, norm = stats.copy_to_host()
        assert (float(loss) / t.n_microbatches, float(norm)) == log[step][:2]
    for a, b in zip((model.params, m, v), host(trainer)):
        assert a.copy_to_host().tobytes() == b.tobytes()


def test_the_sampler_runs_on_the_training_model_buffers(tmp_path):
    """No second set of activations: every buffer of the sampler's whole forward is a view of the
    training model's; its decoder (fp32) has its cache and rows of its own, on the same weights; and
    the memory plan is every byte the trainer allocated on the device."""
    trainer, _ = trained(tmp_path, graph=False, steps=0)
    model, sampler, decoder = trainer.model, trainer.sampler, trainer.decoder
    assert (sampler.B, sampler.T) == (1, trainer.cfg.train.seq_len) and sampler.params is model.params
    for name, buf in sampler.buf.items():
        assert np.shares_memory(buf._ary, model.buf[name]._ary), name           # the simulator's arrays
    assert decoder.T == trainer.cfg.train.seq_len and np.shares_memory(decoder.P["wte"]._ary, model.params._ary)
    owned = [*model.buf.values(), trainer.adam_m, trainer.adam_v, trainer.decay, trainer.partial, trainer.stats,
             trainer.batches, trainer.scalars, *decoder.buf.values()]
    assert sum(a.nbytes for a in owned) == trainer.planned_bytes
    # the text it samples is the text a model of its own samples
    own = GPUModel(trainer.cfg.model, 1, trainer.cfg.train.seq_len, training=False)
    own.params.copy_to_device(model.params.copy_to_host())
    from andrea_numba.sample import generate
    assert trainer.generate("the ", 2, seed=5) == generate(own, trainer.tokenizer, "the ", 2, seed=5)


@pytest.mark.slow
def test_a_failed_capture_trains_on_eagerly(tmp_path, monkeypatch):
    """A capture the driver refuses leaves the run eager, said in the log and the state."""
    def refuse(stream, work):
        raise RuntimeError("CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED")
    monkeypatch.setattr(tr, "GRAPHS", True)
    monkeypatch.setattr(tr, "StepGraph", refuse)
    lines = []
    (tmp_path / "c.txt").write_text(corpus_text())
    _, cfg = small_config(tmp_path, corpus=tmp_path / "c.txt", n_microbatches=1, seq_len=4)
    trainer = tr.Trainer(cfg, tmp_path / "run", log=lines.append)
    trainer.setup()
    assert "launches: CUDA graph" in "\n".join(lines)
    trainer.train_step(0)
    assert trainer.launches == "eager" and trainer.graph is None
    assert "the CUDA graph capture failed: CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED" in lines[-1]
    import json
    state = json.loads((tmp_path / "run" / ".state.json").read_text())
    assert state["launches"].startswith("eager (the CUDA graph capture failed")



@pytest.mark.slow
def test_the_sampler_replays_its_forward_as_a_graph_and_samples_the_eager_text(runs):
    """In graph mode the sampler's decoder (while the text fits seq_len) and its whole forward (past
    it) each run eagerly the first time, are captured once the second time (the decoder's step reads
    its token ids and position from the device, the forward its token buffer) and are replayed from
    then on: the same text as an eager trainer's, and a second generate replays the same graphs. A
    capture that fails leaves that one eager (said in the log), with the same text, and the step's
    graph as it was."""
    (eager, _), (trainer, _) = runs.eager, runs.graph
    want = [eager.generate("the ", 3, seed=3), eager.generate("a", 1, seed=4), eager.generate("an ", 3, seed=5)]
    with pytest.MonkeyPatch.context() as mp:
        RECORDER.patch(mp)
        FakeStepGraph.captured.clear()
        assert trainer.graph is runs.captured[0] and trainer.sampler_graph is None and trainer.decoder.graph is None
        # "the " fills the window (seq_len 4): the first token on the decoder (4 steps: eager, then
        # captured, then replayed), the next two past the window on the whole forward (eager, captured)
        got = [trainer.generate("the ", 3, seed=3), trainer.generate("a", 1, seed=4)]
        assert FakeStepGraph.captured == [trainer.decoder.graph, trainer.sampler_graph]
        decode, forward = ({k.fn.__name__ for k, _, _ in g.builder.launches} for g in FakeStepGraph.captured)
        assert got == want[:2]
        assert decode == {"k_decode_qkv", "k_decode_attention", "k_decode_matvec_add", "k_decode_mlp_up",
                          "k_decode_logits", "k_decode_draw"}
        assert forward >= {"k_embed_fwd", "k_loss_fwd"}                        # the whole forward

        lines, step_graph = [], trainer.graph
        trainer.log = trainer.decoder.log = lines.append
        trainer.sampler_graph = trainer.decoder.graph = None                  # as before their capture

        def refuse(stream, work):
            raise RuntimeError("CUDA_ERROR_STREAM_CAPTURE_INVALIDATED")
        mp.setattr(tr, "StepGraph", refuse)
        assert trainer.generate("an ", 3, seed=5) == want[2]
    assert trainer.sampler_graph is False and trainer.decoder.graph is False      # no second try
    assert trainer.graph is step_graph
    assert lines == ["sampling: the decoder runs eagerly (its CUDA graph capture failed: "
                     "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED)",
                     "sampling: eager (the sampler's CUDA graph capture failed: CUDA_ERROR_STREAM_CAPTURE_INVALIDATED)"]
