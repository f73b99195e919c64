"""Lesson 06: checkpoints and bit-exact resume. Stop a run, start a new trainer, get the same bits.

What it teaches
    1. Run A: a tiny Trainer runs 3 optimiser steps without stopping. At step 2 the lesson copies
       its run directory: the copy, run B, is exactly what a run stopped at step 2 leaves on disk.
    2. Run B: a NEW Trainer, in a fresh state, resumes from B's checkpoint (setup(resume=True)) and
       finishes, while nothing of A's trainer survives in it.
    3. The two loss columns side by side are identical to the last bit, and so are the final
       checkpoints: their sha256 are equal.
    4. Why: the data order is a pure function of (seed, step); the learning rate is a function of
       the step; the checkpoint holds the step, the weights and Adam's m and v; and every kernel
       is deterministic (fixed summation order, no float atomics), so the same inputs give the
       same bits.
    5. The checkpoint's bytes: the 8-byte header (int32 step, int32 n_params), then float32s.
    6. The loss curve of the run (andrea_numba.plot.plot_run).

How to run (the kernels run in Numba's CUDA simulator without a GPU: about 25 s on a 2-core CPU
for the 3 + 1 steps; each step is one microbatch of 1 x 8 tokens)

    python lessons/06_checkpoints_and_resume.py                        # runs in <tmp>/andrea-lessons/06-runs
    python lessons/06_checkpoints_and_resume.py --out runs/lesson06    # keep them (must not exist yet)
    python lessons/06_checkpoints_and_resume.py --microbatches 2       # as tests/test_train.py (slower)
    python lessons/06_checkpoints_and_resume.py --interactive --figures figs/

Open it in Jupyter or VS Code as a notebook: the `# %%` lines are cells.
"""
# %%
import _common as C


def options(ap):
    ap.add_argument("--out", metavar="DIR", help="where the two run directories go (default: andrea-lessons/06-runs in the system's temporary "
                    "folder, replaced by each run)")
    ap.add_argument("--steps", type=int, default=3, help="optimiser steps of each run (default 3)")
    ap.add_argument("--stop", type=int, default=2, help="run B stops after this many steps (default 2)")
    ap.add_argument("--microbatches", type=int, default=1, help="microbatches per step (default 1: fast)")


args = C.start(__doc__, options)

import hashlib  # noqa: E402
import shutil  # noqa: E402
import struct  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

from andrea_numba import data as D  # noqa: E402
from andrea_numba.atomic import file_sha256  # noqa: E402
from andrea_numba.config import config_from_dict, load_config  # noqa: E402
from andrea_numba.layout import n_params  # noqa: E402
from andrea_numba.plot import plot_run  # noqa: E402
from andrea_numba.runlog import CHECKPOINT_FILE as CHECKPOINT, read_loss, read_state  # noqa: E402
from andrea_numba.train import Trainer  # noqa: E402

if not 0 < args.stop < args.steps:
    sys.exit(f"error: --stop ({args.stop}) must lie between 0 and --steps ({args.steps}), exclusive")
out = Path(args.out) if args.out else C.default_dir() / "06-runs"
if not args.out:                        # the lesson's own default folder: the last run's runs go
    shutil.rmtree(out, ignore_errors=True)
dir_a, dir_b, data_dir = out / "A-uninterrupted", out / "B-stopped-and-resumed", out / "data"
for d in (dir_a, dir_b):
    if d.exists():
        sys.exit(f"error: {d} already exists: choose another --out (the lesson never overwrites a run)")

# The small simulator-friendly config of tests/test_train.py: ANDREA-tiny, microbatches of 1 x 8
# tokens; evaluation, samples and periodic checkpoints pushed out of the way (the trainer still
# evaluates and checkpoints at the last step of every run() call).
raw = load_config("tiny").to_dict()
raw["name"] = "ANDREA-tiny-lesson06"
raw["train"].update(batch_size=1, seq_len=8, n_microbatches=args.microbatches, steps=args.steps, lr=3e-2,
                    min_lr=3e-3, warmup_steps=1, eval_interval=1000, eval_batches=1, checkpoint_interval=1000,
                    sample_interval=1000, sample_tokens=0)
cfg = config_from_dict(raw, origin="lesson 06")
t = cfg.train


def log(line):
    for part in str(line).splitlines():
        print(f"    | {part}")


# %%
C.step(f"Run A, its first {args.stop} steps; a copy of its run directory is run B")
C.say(f"""
    {cfg.name}: {n_params(cfg.model):,} parameters, {t.n_microbatches} microbatch(es) of {t.batch_size} x {t.seq_len}
    tokens per step, AdamW at lr {t.lr} with warm-up and cosine decay, seed {t.seed}. The data is
    the default corpus (the Python standard library's source, as bytes), prepared once into
    {data_dir}. The trainer's own log lines are shown with "|".
""")
trainer = Trainer(cfg, dir_a, data_dir, log=log, log_every=1)
trainer.setup()
trainer.run(steps=args.stop)
shutil.copytree(dir_a, dir_b)
C.say(f"""
    trainer.run(steps={args.stop}) ends the loop at step {args.stop} and, because that is the last step of
    this call, evaluates and writes {dir_a / CHECKPOINT}. A signal does the same on a real run
    (SIGTERM or Ctrl-C: checkpoint at the next step boundary, exit 0), and the process ends:
    these files are all a stopped run leaves behind. We copy them to {dir_b}: run B is a
    run stopped at step {args.stop}.
""")

# %%
C.step(f"Run A carries on to step {t.steps} without stopping")
trainer.run()
C.say("""
    The same trainer continues: its weights, gradients and Adam state never left the GPU. Run A
    is the uninterrupted run. Now we throw this trainer away, with its device buffers and
    everything else it held in memory.
""")
del trainer

# %%
C.step("The checkpoint file, byte by byte")
ck = dir_b / CHECKPOINT
raw_bytes = ck.read_bytes()
step, n = struct.unpack("<ii", raw_bytes[:8])
N = n_params(cfg.model)
hexs = lambda b: " ".join(f"{x:02x}" for x in b)
C.table([("0-3", hexs(raw_bytes[0:4]), f"int32 step = {step}"),
         ("4-7", hexs(raw_bytes[4:8]), f"int32 n_params = {n:,}"),
         ("8-11", hexs(raw_bytes[8:12]), f"float32 weights[0] = {np.frombuffer(raw_bytes[8:12], '<f4')[0]:.8f}"),
         ("12-15", hexs(raw_bytes[12:16]), f"float32 weights[1] = {np.frombuffer(raw_bytes[12:16], '<f4')[0]:.8f}"),
         (f"{8 + 4 * N:,}-", hexs(raw_bytes[8 + 4 * N:8 + 4 * N + 4]),
          f"float32 m[0] = {np.frombuffer(raw_bytes[8 + 4 * N:12 + 4 * N], '<f4')[0]:.3e}"),
         (f"{8 + 8 * N:,}-", hexs(raw_bytes[8 + 8 * N:8 + 8 * N + 4]),
          f"float32 v[0] = {np.frombuffer(raw_bytes[8 + 8 * N:12 + 8 * N], '<f4')[0]:.3e}")],
        header=("bytes", "hex (little-endian)", "meaning"))
state = read_state(dir_b)
C.say(f"""
    {len(raw_bytes):,} bytes = 8 + 3 x 4 x {N:,}: the step, the number of parameters, then the
    weights, Adam's m and Adam's v in the flat layout of lesson 04. No names, no config, no
    checksum inside: the run directory's .state.json holds the config and the file's sha256
    ({state['checkpoint_sha256'][:16]}...), which the trainer checks before it trusts the file.
    The file was written to a temporary name, flushed, then renamed over the old one, so a kill
    at any moment leaves the old checkpoint or the new one, never half of one.
""")
assert step == args.stop and n == N and len(raw_bytes) == 8 + 12 * N
assert hashlib.sha256(raw_bytes).hexdigest() == state["checkpoint_sha256"]

# %%
C.step("Run B: a NEW Trainer resumes from the checkpoint and finishes")
trainer = Trainer(cfg, dir_b, data_dir, log=log, log_every=1)
trainer.setup(resume=True)
C.say(f"""
    setup(resume=True) read .state.json, checked the sha256 of the token files and of the
    checkpoint against its records, and loaded step {trainer.step}, the weights, m and v into freshly
    allocated device buffers. Nothing else survives from A's trainer. Continue to step {t.steps}:
""")
trainer.run()
del trainer

# %%
C.step("Side by side: the same losses, to the last bit")
rows_a, rows_b = read_loss(dir_a), read_loss(dir_b)
table = []
for ra, rb in zip(rows_a, rows_b):
    same = ra["train_loss"] == rb["train_loss"] and ra["grad_norm"] == rb["grad_norm"]
    who = "A's trainer, then copied" if rb["step"] <= args.stop else "resumed trainer"
    table.append((rb["step"], repr(ra["train_loss"]), repr(rb["train_loss"]), who,
                  f"{ra['grad_norm']:.6f}", f"{rb['grad_norm']:.6f}", "yes" if same else "NO"))
C.table(table, header=("step", "A: train loss", "B: train loss", "B's step ran in", "A: grad norm",
                       "B: grad norm", "bit-equal"))
assert [r["step"] for r in rows_a] == [r["step"] for r in rows_b] == list(range(1, t.steps + 1))
assert all(r[-1] == "yes" for r in table)
sha_a, sha_b = file_sha256(dir_a / CHECKPOINT), file_sha256(dir_b / CHECKPOINT)
print(f"    sha256 of A's final checkpoint: {sha_a}")
print(f"    sha256 of B's final checkpoint: {sha_b}")
print()
if sha_a == sha_b:
    print(f"    The checkpoints are identical: {sha_a == sha_b} (every one of the {len(raw_bytes):,} bytes)")
else:
    print("    The checkpoints DIFFER: resume is not bit-exact here")
print()
assert sha_a == sha_b

# %%
C.step("Why the bits are the same")
x_a, y_a = D.get_batch(D.load(data_dir)[0], t.batch_size, t.seq_len, t.seed, args.stop, 0)
x_b, y_b = D.get_batch(D.load(data_dir)[0], t.batch_size, t.seq_len, t.seed, args.stop, 0)
C.say(f"""
    A step is a function of (weights, m, v, step, data). Resume is exact when each of them is
    the same after the restart, and when the function gives the same bits for the same inputs.

    1. The data order is a pure function of (seed, step, microbatch): data.get_batch seeds its
       generator with them and draws the windows. Nothing depends on how many steps this
       PROCESS has run. Step {args.stop + 1}'s first microbatch (get_batch(..., step={args.stop}, micro=0)), asked
       twice: {bytes(x_a[0].astype(np.uint8))!r} and {bytes(x_b[0].astype(np.uint8))!r}.

    2. The learning rate is a function of the step (warm-up, then cosine), and AdamW's bias
       correction 1 - beta^t uses the step too: the checkpoint holds the step.

    3. The weights, m and v are in the checkpoint as float32, exactly as they were on the device.
       The gradient is not: it is zero at every step boundary. Drop m and v and the resumed run
       would take different (larger) first steps.

    4. Every kernel is deterministic: each sum has a fixed order (a loop in one thread, or a
       shared-memory tree whose shape depends only on the block size), and no kernel uses float
       atomics. Float addition is not associative, (a + b) + c != a + (b + c) in the last bit, so
       atomics, which add in whatever order threads arrive, would make two runs drift apart by
       rounding even with the same data. Here the same inputs give the same outputs, bit for bit,
       on every launch.

    Together: the resumed trainer computes step {args.stop + 1} from the same bits as the uninterrupted one,
    so it gets the same bits out, and so on to the end.
""")
assert np.array_equal(x_a, x_b)

# %%
C.step("The loss curve")
fig_b = plot_run(dir_b, C.figures_dir() / "06_loss_resumed_run.png")
C.record_figure(fig_b)
fig_a = plot_run(dir_a, C.figures_dir() / "06_loss_uninterrupted_run.png")
C.record_figure(fig_a)
C.say(f"""
    andrea_numba.plot.plot_run draws the train loss (and its moving average), the validation loss
    where it was measured, the learning rate and the gradient norm. The two pictures show the same
    training curve: B's log holds the lines of A's first {args.stop} steps, copied with the run directory,
    then the resumed trainer's; both have a validation point at step {args.stop}, where run() ended once.
    {t.steps} steps of a tiny model only start the descent: run
    `python -m andrea_numba.train --size tiny --steps 20` for more.
""")
if args.out:
    print(f"    The run directories are in {out}.")
else:                                   # keep the temporary run directories, drop the 20 MB of tokens
    shutil.rmtree(data_dir, ignore_errors=True)
    print(f"    The run directories are in {out} (the prepared tokens were removed).")

C.finish()
