"""A run directory: the names of its files, in this one place, and how to read them.

    RUN_DIR/checkpoint.bin  step, weights, Adam m and v (andrea_numba.checkpoint), replaced atomically
    RUN_DIR/.loss.json      JSON Lines, one per optimiser step:
                            {"step", "train_loss", "lr", "grad_norm", "tokens_per_s", "time"}
                            plus "val_loss" at evaluation steps
    RUN_DIR/.samples.json   JSON Lines, one per text sample: {"step", "prompt", "text", "time"}
    RUN_DIR/.state.json     one JSON object: {"step", "config": {...}, "data": {...}, "tokens_seen",
                            "checkpoint_sha256", ...}, replaced atomically
    RUN_DIR/data/           the prepared token files (andrea_numba.data), unless the run was given others

The trainer (andrea_numba.train) writes these files; sample, plot, dashboard and lesson 06 read
them. Two ways to read the state: read_run_state for a tool that cannot go on without it (resume,
sample: one clear error line), read_state for a viewer that shows what there is (None).

    rows = read_loss("runs/12M")     # [{"step": 1, "train_loss": 10.9, ...}, ...] sorted by step
    samples = read_samples("runs/12M")
    state = read_state("runs/12M")   # dict, or None before the first save

The logs are read while training appends to them, so a reader must be forgiving:
  - the last line may be half-written: a line that does not parse is skipped;
  - a resumed run appends again from its checkpoint, so a step may appear twice: the LAST line
    for a step wins (it belongs to the run that carried on);
  - a file that does not exist yet reads as empty.
"""
from __future__ import annotations

import json
from pathlib import Path

CHECKPOINT_FILE = "checkpoint.bin"
BEST_FILE = "best.bin"              # the checkpoint of the best validation loss so far (same format)
LOSS_FILE = ".loss.json"
SAMPLES_FILE = ".samples.json"
STATE_FILE = ".state.json"
DATA_DIR = "data"


class RunDirError(ValueError):
    """A run directory that cannot be used; str(err) is one line: what is wrong and what to do."""


def read_run_state(run_dir) -> dict:
    """The state object of `run_dir` for a tool that needs it (resume, sample): RunDirError with
    one line when there is none, it does not parse or it holds no config."""
    path = Path(run_dir) / STATE_FILE
    if not path.is_file():
        raise RunDirError(f"{run_dir} has no {STATE_FILE}: it is not a run directory; "
                          f"start a new run with --out {run_dir}")
    try:
        state = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as e:
        raise RunDirError(f"cannot read {path} ({e}): restore it or start a new run") from None
    except json.JSONDecodeError as e:
        raise RunDirError(f"{path} is not valid JSON ({e.msg}): restore it or start a new run") from None
    if not isinstance(state, dict) or not isinstance(state.get("config"), dict):
        raise RunDirError(f"{path} holds no run config: restore it or start a new run")
    return state


def data_dir_of(run_dir, state: dict | None = None) -> Path:
    """Where the run's prepared tokens are: the directory on record in the state (relative paths
    are relative to the run directory), else RUN_DIR/data."""
    record = ((state or {}).get("data") or {}).get("dir")
    return Path(run_dir) / (record or DATA_DIR)


def data_dir_record(run_dir, data_dir) -> str:
    """How the state records a data directory: relative to the run directory when inside it (the
    run directory can then move), else absolute."""
    run_dir, data_dir = Path(run_dir).resolve(), Path(data_dir).resolve()
    try:
        return data_dir.relative_to(run_dir).as_posix()
    except ValueError:
        return str(data_dir)


def _read_jsonl(path: Path) -> list[dict]:
    """Every line of `path` that parses as a JSON object, in file order; [] if there is no file."""
    try:
        # bytes, then decode: a half-written last line may end in the middle of a UTF-8 character
        text = path.read_bytes().decode("utf-8", errors="replace")
    except (FileNotFoundError, IsADirectoryError, PermissionError):
        return []
    rows = []
    for line in text.splitlines():
        line = line.strip()
        if not line:
            continue
        try:
            obj = json.loads(line)
        except ValueError:
            continue                      # half-written or corrupt: skip it
        if isinstance(obj, dict):
            rows.append(obj)
    return rows


def read_loss(run_dir) -> list[dict]:
    """The training log of `run_dir`: one dict per step, sorted by step, the last line per step winning.

    Lines that do not parse, and objects without an integer "step", are skipped.
    """
    by_step: dict[int, dict] = {}
    for row in _read_jsonl(Path(run_dir) / LOSS_FILE):
        step = row.get("step")
        if isinstance(step, bool) or not isinstance(step, int):
            continue
        by_step[step] = row               # a later line for the same step replaces the earlier one
    return [by_step[s] for s in sorted(by_step)]


def read_samples(run_dir) -> list[dict]:
    """The text samples of `run_dir` in the order they were written (unparsable lines skipped)."""
    return _read_jsonl(Path(run_dir) / SAMPLES_FILE)


def read_state(run_dir) -> dict | None:
    """The trainer's state object of `run_dir`, or None if there is none (yet) or it does not parse."""
    try:
        obj = json.loads((Path(run_dir) / STATE_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return obj if isinstance(obj, dict) else None


def config_name(state: dict | None) -> str | None:
    """state["config"]["name"] if present, else None."""
    cfg = (state or {}).get("config")
    name = cfg.get("name") if isinstance(cfg, dict) else None
    return name if isinstance(name, str) else None


def total_steps(state: dict | None) -> int | None:
    """state["config"]["train"]["steps"] if present, else None."""
    cfg = (state or {}).get("config")
    train = cfg.get("train") if isinstance(cfg, dict) else None
    steps = train.get("steps") if isinstance(train, dict) else None
    return steps if isinstance(steps, int) and not isinstance(steps, bool) else None
