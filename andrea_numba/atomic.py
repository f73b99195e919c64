"""Files the runs depend on: atomic writes and checksums.

Atomic writes: a reader (or a run resumed after a kill) sees the old file or the whole new one,
never half of one. The bytes go to a temporary file in the same directory, are flushed to disk,
then renamed over the old file; os.replace is atomic on POSIX and Windows."""
from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path


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
