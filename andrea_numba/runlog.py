"""A run directory: the names of its files, in this one place, and how to read them.

    RUN_DIR/checkpoint.bin  step, weights, Adam m and v (andrea_numba.checkpoint), replaced atomically
    RUN_DIR/.loss.json      JSON Lines, one per optimiser step:
                            {"step", "train_loss", "lr", "grad_norm", "tokens_per_s", "time", "elapsed_s"}
                            plus "val_loss" at evaluation steps; elapsed_s: wall seconds since the run
                            was launched, summed over its resumes
    RUN_DIR/.samples.json   JSON Lines, one per text sample: {"step", "prompt", "text", "time"}
    RUN_DIR/.state.json     one JSON object: {"step", "config": {...}, "data": {...}, "tokens_seen",
                            "checkpoint_sha256", ...}, replaced atomically
    RUN_DIR/best.bin        the checkpoint of the lowest validation loss so far (same format), recorded
                            in .state.json as "best": {"file", "step", "val_loss", "sha256"}
    RUN_DIR/.lock           held (fcntl.flock) by the trainer working in the directory; holds its PID
    RUN_DIR/data/           the prepared token files (andrea_numba.data), unless the run was given others

Paths in .state.json (the data directory, a corpus file) are relative to the run directory when
they lie inside it, so the directory can be moved; other paths are absolute.

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

import errno
import json
import os
from pathlib import Path

try:
    import fcntl
except ImportError:                  # Windows
    fcntl = None

CHECKPOINT_FILE = "checkpoint.bin"
BEST_FILE = "best.bin"              # the checkpoint of the best validation loss so far (same format)
LOSS_FILE = ".loss.json"
SAMPLES_FILE = ".samples.json"
STATE_FILE = ".state.json"
FP8_FILE = ".fp8.json"         # FP8 runs: each quantized tensor's amax and underflow, every --log-every steps
LOCK_FILE = ".lock"
DATA_DIR = "data"


class RunDirError(ValueError):
    """A run directory that cannot be used; str(err) is one line: what is wrong and what to do."""


def read_run_state(run_dir) -> dict:
    """The state object of `run_dir` for a tool that needs it (resume, sample): RunDirError with
    one line when there is none, it does not parse or it holds no config."""
    path = Path(run_dir) / STATE_FILE
    if not Path(run_dir).exists():
        raise RunDirError(f"{run_dir} does not exist: give the directory of a run (the trainer makes one: "
                          f"python -m andrea_numba.train --out {run_dir})")
    if not path.is_file():
        raise RunDirError(f"{run_dir} has no {STATE_FILE}: it is not a run directory (the trainer makes "
                          f"one: python -m andrea_numba.train --out {run_dir})")
    try:
        state = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as e:
        raise RunDirError(f"cannot read {path} ({e}): restore it or start a new run") from None
    except json.JSONDecodeError as e:
        raise RunDirError(f"{path} is not valid JSON ({e.msg}): restore it or start a new run") from None
    if not isinstance(state, dict) or not isinstance(state.get("config"), dict):
        raise RunDirError(f"{path} holds no run config: restore it or start a new run")
    return state


def path_record(run_dir, path) -> str:
    """How the state records a path: relative to the run directory when inside it (the run
    directory can then move), else absolute."""
    run_dir, path = Path(run_dir).resolve(), Path(path).resolve()
    try:
        return path.relative_to(run_dir).as_posix()
    except ValueError:
        return str(path)


def path_of(run_dir, record: str) -> Path:
    """The path a record of path_record names (relative records are relative to the run directory)."""
    return Path(run_dir) / record


def data_dir_of(run_dir, state: dict | None = None) -> Path:
    """Where the run's prepared tokens are: the directory on record in the state (relative paths
    are relative to the run directory), else RUN_DIR/data."""
    record = ((state or {}).get("data") or {}).get("dir")
    return path_of(run_dir, record or DATA_DIR)


def data_dir_record(run_dir, data_dir) -> str:
    """How the state records a data directory (path_record)."""
    return path_record(run_dir, data_dir)


class RunLock:
    """The lock of a run directory: RUN_DIR/.lock, held with fcntl.flock for as long as a trainer
    works in the directory, with the trainer's PID written in it. The kernel drops the lock when the
    process ends, however it ends (SIGKILL too), so a lock is never left stale; the file itself
    stays. Without fcntl (Windows) msvcrt locks one byte of it, which also dies with the process.

        lock = RunLock(run_dir)
        lock.check()      # RunDirError naming the PID if another trainer holds it; changes nothing
        ...               # refusals go here: nothing in the directory has been touched
        lock.claim()      # create the file if needed, hold the lock, write our PID
        ...
        lock.release()
    """

    def __init__(self, run_dir):
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / LOCK_FILE
        self.fd = None

    def check(self) -> None:
        """Take the lock if the file exists (it is not written); RunDirError if another process has it."""
        if self.fd is None and self.path.is_file():
            self._take(os.open(self.path, os.O_RDWR))

    def claim(self) -> None:
        """Hold the lock (creating the file) and write this process's PID into it."""
        if self.fd is None:
            self._take(os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644))
        os.ftruncate(self.fd, 0)
        os.lseek(self.fd, 0, os.SEEK_SET)
        os.write(self.fd, f"{os.getpid()}\n".encode())

    def release(self) -> None:
        if self.fd is not None:
            try:
                if fcntl is not None:
                    fcntl.flock(self.fd, fcntl.LOCK_UN)
            finally:
                os.close(self.fd)
                self.fd = None

    def _take(self, fd: int) -> None:
        try:
            if fcntl is not None:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            else:
                _msvcrt_lock(fd)
        except OSError as e:
            if e.errno not in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK, errno.EDEADLK):
                os.close(fd)
                raise
            pid = self._holder(fd)
            os.close(fd)
            who = f"PID {pid}" if pid else "a process whose PID is not written yet"
            raise RunDirError(f"{self.run_dir} is in use by another trainer ({who}): wait for it to finish, "
                              f"or stop it (SIGTERM saves a checkpoint) and then --resume {self.run_dir}") from None
        self.fd = fd

    @staticmethod
    def _holder(fd: int) -> str:
        try:
            text = os.pread(fd, 64, 0).decode("ascii", "replace").strip() if hasattr(os, "pread") else ""
        except OSError:
            return ""
        return text if text.isdigit() else ""


def _msvcrt_lock(fd: int) -> None:
    """Lock one byte far beyond the PID (Windows locks are mandatory: the PID stays readable)."""
    import msvcrt
    os.lseek(fd, 1 << 20, os.SEEK_SET)
    msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)
    os.lseek(fd, 0, os.SEEK_SET)


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
