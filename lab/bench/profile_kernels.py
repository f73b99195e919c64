"""The GPU time of every kernel of one forward + backward, measured by Nsight Compute, by op.

    ncu --profile-from-start off --metrics gpu__time_duration.sum --csv --clock-control none \\
        python lab/bench/profile_kernels.py run --size 12M --log launches.json > ncu.csv
    python lab/bench/profile_kernels.py table --log launches.json --ncu ncu.csv --markdown profile.md

`run` builds the engine's model (GPUModel, the config's B x T), runs one forward + backward to
compile, then a second one between cuda.profile_start() and cuda.profile_stop(), so Nsight Compute
times exactly that step's kernels. `run --train-step DIR` profiles a whole training step instead:
the trainer's (andrea_numba.train.Trainer, the size's config, its corpus prepared under DIR, eager
launches), every microbatch's forward + backward, the gradient norm, clipping and AdamW; the sum
of its kernels against a replay of the captured step says how much of the step is gaps. Every
kernel launch of that step is logged in order, with the launcher of andrea_numba that made it
(the outermost engine function on the call stack), its grid and its block. `table` joins the log with Nsight Compute's CSV (the i-th profiled kernel is the
i-th logged launch; their names are checked to match) and prints the GPU time by launcher and by
kernel. Unlike lab/bench/profile_step.py, which times each launcher from the CPU with a synchronise
around it (so the 12M step's launch cost is inside its figures), these are the kernels' own
durations: their sum is the step's GPU time with no launch gaps, what a CUDA graph replay can reach.
"""
from __future__ import annotations

import csv
import json
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from andrea_numba import cli  # noqa: E402

ENGINE = str(ROOT / "andrea_numba")
WRAPPERS = {"with_default"}          # common.blocks' wrapper around every launcher: not a launcher itself


def launcher_name():
    """The outermost function of andrea_numba/kernels on the call stack (the model calls it): the
    launcher that made this launch."""
    f, name = sys._getframe(2), "?"
    while f is not None:
        path = f.f_code.co_filename
        if path.startswith(ENGINE) and "kernels" in Path(path).parts and f.f_code.co_name not in WRAPPERS:
            name = f.f_code.co_name
        f = f.f_back
    return name


def logging_launches(log):
    """Patch numba's launch so that every kernel launch appends (launcher, kernel, grid, block) to
    log; returns the function that undoes it."""
    from numba.cuda import dispatcher
    call = dispatcher._LaunchConfiguration.__call__

    def logged(self, *a):
        log.append({"launcher": launcher_name(), "kernel": getattr(getattr(self.dispatcher, "py_func", None), "__name__", "?"),
                    "grid": list(self.griddim) if isinstance(self.griddim, tuple) else self.griddim,
                    "block": list(self.blockdim) if isinstance(self.blockdim, tuple) else self.blockdim})
        return call(self, *a)
    dispatcher._LaunchConfiguration.__call__ = logged

    def undo():
        dispatcher._LaunchConfiguration.__call__ = call
    return undo


def run_train_step(args):
    """One training step of the trainer, profiled (eager); then the same step captured as a CUDA
    graph and replayed, its GPU time printed beside it."""
    from numba import cuda
    from andrea_numba import train as tr
    from andrea_numba.config import load_config
    cfg = load_config(args.size)
    trainer = tr.Trainer(cfg, args.train_step, log=lambda s: None, graph=False)
    trainer.setup()
    trainer.train_step(0)                  # compile every kernel
    log = []
    undo = logging_launches(log)
    cuda.profile_start()
    trainer.train_step(1)
    cuda.profile_stop()
    undo()
    t = cfg.train
    replay = tr.StepGraph(trainer.stream, trainer.step_work).replay_ms(10)
    with open(args.log, "w") as f:
        json.dump({"size": args.size, "B": t.batch_size, "T": t.seq_len, "recipe": trainer.model.recipe.name,
                   "what": f"one training step ({t.n_microbatches} microbatches, norm, clipping, AdamW)",
                   "graph_replay_ms": replay, "launches": log}, f, indent=0)
    print(f"{len(log)} launches logged in one training step of {cfg.name}; its graph replays in "
          f"{replay:.3f} ms", file=sys.stderr)


def run(args):
    from andrea_numba.kernels.common import SIMULATOR
    if SIMULATOR:
        cli.fail("lab/bench/profile_kernels.py run times kernels on a GPU, with Nsight Compute (the simulator "
                 "logs no launches): run it on a machine with a CUDA GPU")
    if args.train_step:
        return run_train_step(args)
    import numpy as np
    from numba import cuda
    from andrea_numba.config import load_config
    from andrea_numba.gpu_model import GPUModel
    from andrea_numba.layout import init_params
    from lab.recipes import get, variant

    cfg = load_config(args.size)
    m, B, T = cfg.model, cfg.train.batch_size, cfg.train.seq_len
    model = GPUModel(m, B, T, recipe=variant(get(args.recipe), args.mlp_version))
    model.params.copy_to_device(init_params(m, 0))
    rng = np.random.default_rng(0)
    x = cuda.to_device(rng.integers(0, m.vocab_size, (B, T)).astype(np.int32))
    y = cuda.to_device(rng.integers(0, m.vocab_size, (B, T)).astype(np.int32))
    model.forward(x, y)                    # compile every kernel
    model.backward()
    cuda.synchronize()
    log = []
    undo = logging_launches(log)
    cuda.profile_start()
    model.forward(x, y)
    model.backward()
    cuda.synchronize()
    cuda.profile_stop()
    undo()
    with open(args.log, "w") as f:
        json.dump({"size": args.size, "B": B, "T": T, "recipe": args.recipe, "launches": log}, f, indent=0)
    print(f"{len(log)} launches logged in one forward + backward of {cfg.name}, B={B} T={T}", file=sys.stderr)


def ncu_rows(path):
    """(kernel name, ms) per profiled kernel from Nsight Compute's --csv output, in launch order."""
    rows = []
    with open(path, newline="") as f:
        lines = [ln for ln in f if ln.startswith('"')]      # ncu prints its own notes before the CSV
    for r in csv.DictReader(lines):
        if r.get("Metric Name") != "gpu__time_duration.sum":
            continue
        v, unit = float(r["Metric Value"].replace(",", "")), r["Metric Unit"]
        ms = v * {"ns": 1e-6, "nsecond": 1e-6, "us": 1e-3, "usecond": 1e-3, "ms": 1.0, "msecond": 1.0, "s": 1e3, "second": 1e3}[unit]
        rows.append((int(r["ID"]), r["Kernel Name"], ms))
    return [(n, ms) for _, n, ms in sorted(rows)]


def with_library_kernels(launches, timed):
    """The launch log with a row for each kernel that a library launched (cuBLASLt's products are
    not numba launches, so the log lacks them): walking Nsight Compute's kernels in order, one whose
    name is not the next logged kernel's is the library's, put down to the launcher of the numba
    launch before it (the engine function that called the library)."""
    out, i = [], 0
    for name, _ in timed:
        if i < len(launches) and launches[i]["kernel"] in name:
            out.append(launches[i])
            i += 1
        else:
            before = out[-1]["launcher"] if out else "?"
            out.append({"launcher": before, "kernel": "library: " + name.split("(")[0][:60], "grid": "-", "block": "-"})
    return out if i == len(launches) else launches


def table(args):
    try:
        with open(args.log) as f:
            meta = json.load(f)
        launches, timed = meta["launches"], ncu_rows(args.ncu)
    except (ValueError, KeyError, TypeError) as e:
        cli.fail(f"{args.log} is not a launch log of `run`, or {args.ncu} not Nsight Compute's --csv "
                 f"output with gpu__time_duration.sum ({type(e).__name__}: {e})")
    if len(timed) > len(launches):
        launches = with_library_kernels(launches, timed)
    if len(timed) != len(launches):
        cli.fail(f"{args.ncu} has {len(timed)} kernels but {args.log} logged {len(launches)} launches; "
                 "profile and log must come from the same run")
    odd = [i for i, (la, (name, _)) in enumerate(zip(launches, timed)) if la["kernel"] not in name]
    if odd:
        i = odd[0]
        print(f"warning: {len(odd)} kernel names differ between the files, the first at {i}: "
              f"{timed[i][0]!r} against {launches[i]['kernel']!r}", file=sys.stderr)
    total = sum(ms for _, ms in timed)
    by_launcher, by_kernel = defaultdict(lambda: [0, 0.0]), defaultdict(lambda: [0, 0.0])
    for la, (_, ms) in zip(launches, timed):
        for d, key in ((by_launcher, la["launcher"]), (by_kernel, (la["launcher"], la["kernel"], str(la["grid"]), str(la["block"])))):
            d[key][0] += 1
            d[key][1] += ms
    what = meta.get("what", "one forward + backward")
    replay = meta.get("graph_replay_ms")
    out = [f"{meta['size']}, B={meta['B']} T={meta['T']}, recipe {meta.get('recipe', meta.get('products'))}: {what}, "
           f"{len(launches)} kernels, {total:.2f} ms of GPU time (Nsight Compute, gpu__time_duration)"
           + (f"; the same step as a CUDA graph replays in {replay:.2f} ms" if replay else ""), "",
           "| launcher | kernels | ms | share |", "|---|---|---|---|"]
    for k, (n, ms) in sorted(by_launcher.items(), key=lambda kv: -kv[1][1]):
        out.append(f"| {k} | {n} | {ms:.3f} | {ms / total:.1%} |")
    out += ["", "| launcher | kernel | grid | block | launches | ms | ms each |", "|---|---|---|---|---|---|---|"]
    for (la, k, g, b), (n, ms) in sorted(by_kernel.items(), key=lambda kv: -kv[1][1]):
        out.append(f"| {la} | {k} | {g} | {b} | {n} | {ms:.3f} | {ms / n:.4f} |")
    text = "\n".join(out)
    print(text)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(text + "\n")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({**{k: meta.get(k) for k in ("size", "B", "T", "recipe")}, "what": what, "gpu_ms": total,
                       "graph_replay_ms": replay,
                       "launchers": {k: {"kernels": n, "ms": ms} for k, (n, ms) in by_launcher.items()}}, f, indent=1)


def main(argv=None):
    from lab import mlp as lab_mlp
    from lab.recipes import NAMES
    ap = cli.Parser(prog="python lab/bench/profile_kernels.py", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="one step between profile_start/stop, with its launches logged")
    r.add_argument("--size", type=cli.config, default="12M")
    r.add_argument("--recipe", choices=NAMES, default="fp32", help="the engine's recipe or a lab rung")
    r.add_argument("--log", type=cli.file_to_write(".json"), required=True, help="the launch log to write")
    r.add_argument("--mlp-version", type=int, choices=sorted(v for v in lab_mlp.VERSIONS["mlp_fwd"] if v >= 5),
                   help="the MLP's launchers of this version")
    r.add_argument("--train-step", type=cli.dir_to_write, metavar="DIR",
                   help="profile one training step of the trainer instead (its run directory: DIR)")
    t = sub.add_parser("table", help="join the launch log with Nsight Compute's CSV")
    t.add_argument("--log", type=cli.existing_file, required=True)
    t.add_argument("--ncu", type=cli.existing_file, required=True)
    t.add_argument("--markdown", type=cli.file_to_write(".md"))
    t.add_argument("--json", type=cli.file_to_write(".json"))
    args = ap.parse_args(argv)
    run(args) if args.cmd == "run" else table(args)


if __name__ == "__main__":
    main()
