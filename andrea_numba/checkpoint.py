"""Checkpoints: the step, the weights and Adam's m and v in one file.

The file, little-endian and packed, nothing else in it:

    int32 step | int32 n_params | n_params x float32 weights | n_params x float32 m | n_params x float32 v

`step` is the number of optimiser steps done. The three vectors use the flat layout of
andrea_numba.layout. With the data order a pure function of (seed, step), this is all a run needs
to continue bit-exactly.

Writes are atomic (andrea_numba.atomic): the bytes go to a temporary file in the same directory,
are flushed to disk, then renamed over the old file, so a kill at any moment leaves either the old
checkpoint or the new one, never half of one. The format has no checksum, so the trainer records
the file's sha256 in .state.json and checks it on resume. A checkpoint is never written with a
NaN or infinite value in it (save_checkpoint refuses), so a file that holds one is damaged.
"""
from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np

from .atomic import atomic_write

HEADER = np.dtype([("step", "<i4"), ("n_params", "<i4")])


class CheckpointError(ValueError):
    """A checkpoint that cannot be used; str(err) is one line: what is wrong and what to do."""


def checkpoint_bytes(n_params: int) -> int:
    return HEADER.itemsize + 3 * 4 * n_params


def save_checkpoint(path, step: int, params, m, v, before_replace=None) -> str:
    """Write a checkpoint atomically from three host float32 vectors; returns its sha256.
    before_replace(sha256) runs once the new file is on disk, before it replaces the old one
    (the trainer records the new checksum there, keeping the old one, so that every moment has
    a checkpoint whose checksum is on record)."""
    n = params.size
    assert params.shape == m.shape == v.shape == (n,)
    for name, a in (("weights", params), ("Adam m", m), ("Adam v", v)):
        if not np.all(np.isfinite(a)):
            raise CheckpointError(f"refusing to write {path}: the {name} of step {step} hold NaN or infinite "
                                  f"values (the run diverged); the file on disk was left as it was")
    header = np.array([(step, n)], dtype=HEADER)
    digest = hashlib.sha256()

    def write(f):
        # the vectors' own bytes (little-endian float32 already on the machines we run on: no copy)
        for part in (header.tobytes(), *(memoryview(np.ascontiguousarray(a, dtype="<f4")).cast("B")
                                         for a in (params, m, v))):
            digest.update(part)
            f.write(part)

    atomic_write(path, write, None if before_replace is None else lambda: before_replace(digest.hexdigest()))
    return digest.hexdigest()


def load_checkpoint(path, n_params: int, sha256=None):
    """Read and validate a checkpoint for a model of n_params parameters; sha256 is the
    checksum on record (or a collection of accepted ones), None to skip that check.
    Returns (step, params, m, v, sha256): three host float32 arrays and the file's checksum;
    raises CheckpointError otherwise."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint {path} not found: start a new run without --resume, "
                              f"or point --resume at a run directory that has one")
    size, want = path.stat().st_size, checkpoint_bytes(n_params)
    if size == 0:
        raise CheckpointError(f"checkpoint {path} is empty (0 bytes; a checkpoint of this model has {want:,}): "
                              f"it is truncated or was never written; restore a copy or start anew")
    if size < HEADER.itemsize:
        raise CheckpointError(f"checkpoint {path} is truncated ({size} bytes, not even its 8-byte header; a "
                              f"checkpoint of this model has {want:,}): it is not usable; restore a copy or start anew")
    raw = np.fromfile(path, dtype=np.uint8)
    header = raw[:HEADER.itemsize].view(HEADER)[0]
    step, n = int(header["step"]), int(header["n_params"])
    if n != n_params and n > 0 and step >= 0 and size == checkpoint_bytes(n):
        # a whole, well-formed file of another size: the one case where the header is believable
        raise CheckpointError(f"checkpoint {path} holds {n:,} parameters but the config needs {n_params:,}: "
                              f"it belongs to another model size; resume with the config it was written with")
    if n != n_params:
        raise CheckpointError(f"checkpoint {path} is corrupt: its header gives {n:,} parameters (step {step}) "
                              f"but the config needs {n_params:,} and the file's {size:,} bytes fit neither; "
                              f"restore a copy or start anew")
    if size < want:
        raise CheckpointError(f"checkpoint {path} is truncated: {size:,} bytes of the {want:,} that {n:,} parameters "
                              f"need; restore a copy or start anew")
    if size != want:
        raise CheckpointError(f"checkpoint {path} is {size:,} bytes but {n:,} parameters need {want:,}: it is "
                              f"corrupt; restore a copy or start anew")
    if step < 0:
        raise CheckpointError(f"checkpoint {path} is corrupt: its header gives a negative step ({step}); "
                              f"restore a copy or start anew")
    accepted = {sha256} if isinstance(sha256, str) else set(sha256 or ())
    digest = hashlib.sha256(raw.tobytes()).hexdigest()
    if accepted and digest not in accepted:
        raise CheckpointError(f"checkpoint {path} does not match the sha256 recorded in .state.json: "
                              f"it was changed or damaged after it was written; restore a copy or start anew")
    body = raw[HEADER.itemsize:].view("<f4").astype(np.float32)
    params, m, v = body[:n], body[n:2 * n], body[2 * n:]
    if not (np.all(np.isfinite(params)) and np.all(np.isfinite(m)) and np.all(np.isfinite(v))):
        raise CheckpointError(f"checkpoint {path} is corrupt: it holds NaN or infinite values, which no checkpoint "
                              f"is written with; restore a copy or start anew")
    return step, params.copy(), m.copy(), v.copy(), digest
