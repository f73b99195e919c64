"""Files the runs depend on: atomic writes and checksums.

Atomic writes: a reader (or a run resumed after a kill) sees the old file or the whole new one,
never half of one. The bytes go to a temporary file in the same directory, are flushed to disk,
then renamed over the old file; os.replace is atomic on POSIX and Windows.

A write killed before its rename leaves its temporary file behind (`.NAME.XXXXXXXX.tmp`, next to
NAME); the trainer removes such leftovers when it starts (remove_stale_temporaries), holding the
run directory's lock, so none of them can belong to a write still in progress."""
from __future__ import annotations

import hashlib
import json
import os
import re
import tempfile
import time
from pathlib import Path

# `.NAME.XXXXXXXX.tmp`: mkstemp's name for a temporary of NAME (prefix ".NAME.", suffix ".tmp")
TEMPORARY = re.compile(r"^\.(?P<name>.+)\.[A-Za-z0-9_]+\.tmp$")


def _test_pause(path: Path) -> None:
    # Test hook (tests/test_run_dir.py kills the trainer in the middle of a write):
    # ANDREA_TEST_RENAME_PAUSE="SECONDS" or "SECONDS:NAME" sleeps after the temporary file is on disk
    # and before it is renamed into place (only for files called NAME when it is given).
    hook = os.environ.get("ANDREA_TEST_RENAME_PAUSE")
    if hook:
        seconds, _, name = hook.partition(":")
        if not name or name == path.name:
            time.sleep(float(seconds))


def atomic_write(path, write, before_replace=None) -> None:
    """Call write(file) on a temporary file beside `path`, fsync it, call before_replace() if
    given, then rename the file over `path`. `write` may also be bytes."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            if hasattr(os, "fchmod"):
                os.fchmod(f.fileno(), 0o644)          # mkstemp makes 0600; run files are for everyone
            if isinstance(write, (bytes, bytearray)):
                f.write(write)
            else:
                write(f)
            f.flush()
            os.fsync(f.fileno())
        _test_pause(path)
        if before_replace is not None:
            before_replace()
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    try:                                              # make the rename itself durable (POSIX)
        dfd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    except OSError:
        pass


def atomic_write_json(path, obj) -> None:
    """Write obj as indented JSON, atomically."""
    atomic_write(path, (json.dumps(obj, indent=1) + "\n").encode("utf-8"))


def file_sha256(path) -> str:
    """Hex sha256 of a file, read in 16 MB pieces."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 24), b""):
            h.update(chunk)
    return h.hexdigest()


def stale_temporaries(directory) -> list[Path]:
    """The temporary files of atomic writes in `directory` (not below it) that never got renamed."""
    try:
        entries = list(Path(directory).iterdir())
    except (FileNotFoundError, NotADirectoryError):
        return []
    return sorted(p for p in entries if TEMPORARY.match(p.name) and p.is_file() and not p.is_symlink())


def remove_stale_temporaries(directory) -> tuple[int, int]:
    """Delete what stale_temporaries finds: (files removed, bytes freed). Call it only while no
    write into `directory` can be in progress (the trainer holds the run directory's lock)."""
    count = freed = 0
    for p in stale_temporaries(directory):
        try:
            size = p.stat().st_size
            p.unlink()
        except FileNotFoundError:
            continue
        count, freed = count + 1, freed + size
    return count, freed
