"""Data: from text to the token batches the trainer eats.

    text  --tokenizer-->  token ids  --split-->  train.bin, val.bin (uint16)  --get_batch-->  x, y

The default corpus needs no network: it is the source code of the running Python's standard
library (about 30 MB of text), so every machine with the same Python version gets the same bytes
and the same sha256. Any UTF-8 text file works too, and `download` fetches one public corpus.

    meta = prepare("stdlib", "bytes", 256, 0.05, "data/stdlib")   # tokenise once, write the .bin files
    train, val, meta = load("data/stdlib")                        # memory-mapped uint16 arrays
    x, y = get_batch(train, B=16, T=512, seed=1337, step=0, micro=0)

Two tokenizers: "bytes" (a token is one UTF-8 byte, vocab 256) and "bpe" (byte-level BPE trained on
the corpus at prepare time with the HuggingFace `tokenizers` library, an optional dependency).

get_batch is a pure function of its arguments: the random offsets of a batch come from a generator
seeded with (seed, step, micro, split), so a resumed run sees exactly the batches it would have seen.

    python -m andrea_numba.data prepare --size 12M --out data/stdlib
    python -m andrea_numba.data prepare --size tiny --data my.txt --out data/mine
    python -m andrea_numba.data download shakespeare --out data/shakespeare
"""
from __future__ import annotations

import hashlib
import http.client
import json
import os
import platform
import sys
import sysconfig
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np

from . import cli
from .atomic import atomic_write, atomic_write_json, file_sha256
from .config import ConfigError, load_config

DTYPE = np.dtype("<u2")            # token ids on disk: little-endian uint16, so vocab <= 65536
META = "meta.json"
TOKENIZER_FILE = "tokenizer.json"

# directories of the standard library that are not the library itself, or differ between installs
STDLIB_SKIP_DIRS = {"site-packages", "dist-packages", "test", "tests", "idle_test", "__pycache__"}

# corpora that `download` knows: name -> address, file name, expected sha256 and size (None: unknown)
CORPORA = {
    "shakespeare": {
        "url": "https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt",
        "file": "input.txt",
        "sha256": "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed",
        "bytes": 1_115_394,
    },
}


class DataError(ValueError):
    """Data that cannot be used; str(err) is one line saying what is wrong and how to fix it."""


# ----------------------------------------------------------------------------------------------
# the default corpus: the standard library's source


def _stdlib_files(root: Path) -> list[Path]:
    """The standard library's *.py files under root, as relative paths in sorted (posix) order."""
    files = []
    for dirpath, dirnames, filenames in os.walk(root):
        rel_dir = Path(dirpath).relative_to(root)
        # prune in place so os.walk never descends into skipped directories;
        # config-3.x-<platform>/ is the build configuration, different on every platform
        dirnames[:] = [d for d in dirnames if d not in STDLIB_SKIP_DIRS and not d.startswith("config-")]
        for name in filenames:
            # _sysconfigdata_*.py records the build's paths and flags: it differs between installs
            if name.endswith(".py") and not name.startswith("_sysconfigdata"):
                files.append(rel_dir / name)
    return sorted(files, key=lambda p: p.as_posix())


def stdlib_corpus() -> tuple[str, str, int]:
    """The source text of the running Python's standard library: (text, sha256 hex, number of files).

    Every *.py file under sysconfig's stdlib directory, without site-packages, the test suites and
    __pycache__, in sorted relative-path order, each preceded by a line `# ---- <path> ----`.
    A file that is not valid UTF-8 is skipped (the same files on every run, so still deterministic).
    The hash is the sha256 of the text's exact UTF-8 bytes.
    """
    root = Path(sysconfig.get_paths()["stdlib"])
    parts = []
    for rel in _stdlib_files(root):
        try:
            body = (root / rel).read_bytes().decode("utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        parts.append(f"\n# ---- {rel.as_posix()} ----\n")
        parts.append(body)
    text = "".join(parts)
    return text, hashlib.sha256(text.encode("utf-8")).hexdigest(), len(parts) // 2


def missing_corpus(path) -> DataError:
    """The error for a corpus file that is not there: for the path `download` writes one of CORPORA
    to (DIR/<name>/<file>), the command that fetches it; else where to look."""
    path = Path(path)
    for name, entry in CORPORA.items():
        if path.name == entry["file"] and path.parent.name == name:
            return DataError(f"data file '{path}' not found: fetch it with python -m andrea_numba.data "
                             f"download {name} --out {path.parent}")
    return DataError(f"data file '{path}' not found: check the path, or use the default corpus "
                     f"(data.source \"stdlib\")")


def read_text_file(path) -> tuple[str, str]:
    """Read a UTF-8 text file: (text, sha256 hex of its bytes). DataError if missing or not UTF-8."""
    path = Path(path)
    if path.is_dir():
        raise DataError(f"data file '{path}' is a directory: give a UTF-8 text file")
    if not path.is_file():
        raise missing_corpus(path)
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise DataError(f"cannot read data file '{path}' ({e.strerror or e}): check its permissions") from None
    if not raw:
        raise DataError(f"data file '{path}' is empty: give a UTF-8 text file with some text in it")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise DataError(f"data file '{path}' is not UTF-8: byte 0x{raw[e.start]:02x} at offset {e.start} "
                        f"({e.reason}); convert it, e.g. iconv -f latin1 -t utf-8") from None
    return text, hashlib.sha256(raw).hexdigest()


# ----------------------------------------------------------------------------------------------
# tokenizers


class ByteTokenizer:
    """The simplest tokenizer: a token is one byte of the text's UTF-8 encoding (vocab 256)."""

    name = "bytes"
    vocab_size = 256

    def encode(self, text: str) -> list[int]:
        """Text -> the list of its UTF-8 bytes."""
        return list(text.encode("utf-8"))

    def encode_array(self, text: str) -> np.ndarray:
        """Text -> uint16 array of its UTF-8 bytes (fast path for a whole corpus)."""
        return np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(DTYPE)

    def decode(self, ids) -> str:
        """Token ids -> text; a cut multi-byte character becomes U+FFFD (the model may emit one)."""
        return bytes(int(i) for i in ids).decode("utf-8", errors="replace")


def _import_tokenizers():
    """Import the optional HuggingFace `tokenizers` package, or say how to install it."""
    try:
        import tokenizers
    except ImportError:
        raise DataError("the bpe tokenizer needs the 'tokenizers' package: pip install tokenizers "
                        "(or pip install andrea-numba[bpe])") from None
    return tokenizers


def _chunks(text: str, size: int = 1 << 20) -> list[str]:
    """Cut text into pieces of about `size` characters, each cut just before a newline that is
    followed by a non-space character. The byte-level pre-tokenizer always splits there, so
    encoding the pieces one by one gives exactly the ids of encoding the whole text at once
    (and the pieces can be encoded in parallel)."""
    pieces, start = [], 0
    while len(text) - start > size:
        cut = text.find("\n", start + size)
        while cut != -1 and cut + 1 < len(text) and text[cut + 1].isspace():
            cut = text.find("\n", cut + 1)
        if cut == -1 or cut + 1 >= len(text):
            break
        pieces.append(text[start:cut])
        start = cut
    pieces.append(text[start:])
    return pieces


class BPETokenizer:
    """Byte-level BPE (GPT-2 style) from the HuggingFace `tokenizers` library.

    The text is first seen as UTF-8 bytes (so any text encodes, no unknown token); training then
    merges the most frequent adjacent pairs into new tokens until the vocabulary reaches its target.
    """

    name = "bpe"

    def __init__(self, tk):
        """Wrap a trained `tokenizers.Tokenizer`."""
        self.tk = tk

    @classmethod
    def train(cls, text: str, vocab_size: int, progress=None) -> BPETokenizer:
        """Train on text up to vocab_size tokens (fewer if the text runs out of pairs to merge)."""
        tokenizers = _import_tokenizers()
        from tokenizers import decoders, models, pre_tokenizers, trainers

        tk = tokenizers.Tokenizer(models.BPE())
        # add_prefix_space=False: decode(encode(text)) gives back text exactly
        tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tk.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(vocab_size=vocab_size, show_progress=False,
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
        if progress:
            progress(f"training BPE tokenizer: target vocab {vocab_size:,} on {len(text):,} characters")
        t0 = time.time()
        tk.train_from_iterator(_chunks(text), trainer=trainer)
        if progress:
            progress(f"trained BPE tokenizer: vocab {tk.get_vocab_size():,} in {time.time() - t0:.1f} s")
        return cls(tk)

    @classmethod
    def from_file(cls, path) -> BPETokenizer:
        """Load a tokenizer saved with save()."""
        tokenizers = _import_tokenizers()
        return cls(tokenizers.Tokenizer.from_file(str(path)))

    def to_str(self) -> str:
        """The tokenizer as JSON text (what tokenizer.json holds)."""
        return self.tk.to_str()

    @property
    def vocab_size(self) -> int:
        """Number of token ids (ids are 0 .. vocab_size - 1)."""
        return self.tk.get_vocab_size()

    def encode(self, text: str) -> list[int]:
        """Text -> token ids."""
        return self.tk.encode(text).ids

    def encode_array(self, text: str, progress=None) -> np.ndarray:
        """Text -> uint16 array of token ids, encoding ~1 MB pieces in parallel batches."""
        pieces = _chunks(text)
        out, t0 = [], time.time()
        group = 8
        for i in range(0, len(pieces), group):
            for enc in self.tk.encode_batch(pieces[i:i + group]):
                out.append(np.asarray(enc.ids, dtype=np.int64))
            if progress:
                done = min(i + group, len(pieces))
                progress(f"tokenising: {done}/{len(pieces)} pieces, {time.time() - t0:.1f} s")
        ids = np.concatenate(out) if out else np.zeros(0, np.int64)
        return ids.astype(DTYPE)

    def decode(self, ids) -> str:
        """Token ids -> text (bytes that do not form valid UTF-8 become U+FFFD)."""
        return self.tk.decode([int(i) for i in ids])


def load_tokenizer(data_dir):
    """The tokenizer a prepared data directory was made with (read from its meta.json)."""
    data_dir = Path(data_dir)
    meta = _read_meta(data_dir)
    if meta["tokenizer"] == "bytes":
        return ByteTokenizer()
    path = data_dir / TOKENIZER_FILE
    if not path.is_file():
        raise DataError(f"'{path}' is missing: prepare the data again (python -m andrea_numba.data prepare ...)")
    return BPETokenizer.from_file(path)


# ----------------------------------------------------------------------------------------------
# prepare: text -> train.bin, val.bin, meta.json


def _too_small(split: str, n: int, T: int | None) -> DataError:
    """The error for a split with fewer than T + 2 tokens (T None: fewer than 2)."""
    need = f"seq_len {T} needs at least {T + 2:,}" if T is not None else "training needs at least 2"
    return DataError(f"the {split} split has {n:,} tokens but {need}: "
                     f"use a larger corpus, a larger val_fraction, or a smaller train.seq_len")


def prepare(source: str, tokenizer: str, vocab_size: int, val_fraction: float, out_dir,
            progress=None, *, seq_len: int | None = None, expect_sha256: str | None = None) -> dict:
    """Tokenise a corpus into out_dir/train.bin, val.bin (uint16) and meta.json; return the meta.

    source: "stdlib" or the path of a UTF-8 text file. tokenizer: "bytes" or "bpe" (trained here,
    saved as tokenizer.json, at most vocab_size tokens). The last val_fraction of the tokens is the
    validation split. If out_dir already holds the same corpus (by sha256) prepared the same way,
    nothing is redone. seq_len, if given, checks that each split can hold one sequence.
    expect_sha256, if given, is the sha256 the corpus must have (a resumed run's record): a corpus
    that changed is refused before anything is written. progress: optional callable(str) for
    progress lines. The meta records the sha256 of the corpus and of each token file.
    """
    say = progress or (lambda msg: None)
    out_dir = Path(out_dir)
    if tokenizer not in ("bytes", "bpe"):
        raise DataError(f"unknown tokenizer '{tokenizer}': use bytes or bpe")
    if tokenizer == "bytes" and vocab_size < 256:
        raise DataError(f"the bytes tokenizer needs vocab_size 256, got {vocab_size}: set model.vocab_size to 256")
    if tokenizer == "bpe" and not 256 < vocab_size <= 65536:
        raise DataError(f"bpe vocab_size must lie in (256, 65536] (ids are stored as uint16), got {vocab_size}")
    if not 0 < val_fraction < 1:
        raise DataError(f"val_fraction must lie in (0, 1), got {val_fraction}")

    # 1. the text and its fingerprint
    t0 = time.time()
    meta = {"source": source}
    if source == "stdlib":
        text, sha, n_files = stdlib_corpus()
        meta.update(source_sha256=sha, python_version=platform.python_version(), n_files=n_files)
        say(f"stdlib corpus: {n_files:,} files, {len(text):,} characters, sha256 {sha[:12]}... "
            f"({time.time() - t0:.1f} s)")
    else:
        text, sha = read_text_file(source)
        meta.update(source_sha256=sha)
        say(f"{source}: {len(text):,} characters, sha256 {sha[:12]}...")
    if expect_sha256 is not None and sha != expect_sha256:
        raise DataError(f"the corpus {source} changed since the run was prepared: its sha256 is {sha[:16]}..., "
                        f"the run's record {expect_sha256[:16]}...; restore the original text or start a new run")
    meta.update(tokenizer=tokenizer, vocab_target=vocab_size, val_fraction=val_fraction)

    # 2. already prepared the same way? then reuse it
    old = _try_read_meta(out_dir)
    if old is not None and all(old.get(k) == meta[k] for k in
                               ("source_sha256", "tokenizer", "vocab_target", "val_fraction")):
        try:
            _check_bins(out_dir, old)
            if tokenizer == "bpe" and not (out_dir / TOKENIZER_FILE).is_file():
                raise DataError("tokenizer.json is missing")
            say(f"{out_dir} already holds this corpus prepared the same way: reusing it")
            _check_seq_len(old, seq_len)
            return old
        except DataError:
            pass  # damaged: prepare again

    # 3. tokenise (in memory: nothing is written before every check has passed)
    if tokenizer == "bytes":
        tok = ByteTokenizer()
        ids = tok.encode_array(text)
    else:
        tok = BPETokenizer.train(text, vocab_size, progress)
        if tok.vocab_size > vocab_size:
            raise DataError(f"the trained BPE vocab has {tok.vocab_size:,} tokens, more than model.vocab_size "
                            f"{vocab_size:,}: raise model.vocab_size")
        say(f"tokenising {len(text):,} characters")
        t1 = time.time()
        ids = tok.encode_array(text, progress)
        say(f"tokenised into {len(ids):,} tokens in {time.time() - t1:.1f} s "
            f"({len(text.encode('utf-8')) / max(len(ids), 1):.2f} bytes per token)")
    if len(ids) and int(ids.max()) >= tok.vocab_size:
        raise DataError(f"token id {int(ids.max())} exceeds the vocab ({tok.vocab_size}): prepare again")

    # 4. split: the first part trains, the last val_fraction validates
    n_val = round(len(ids) * val_fraction)
    n_train = len(ids) - n_val
    for split, n in (("train", n_train), ("val", n_val)):
        if n < 2:
            raise _too_small(split, n, seq_len)
    meta.update(vocab_size=tok.vocab_size, n_train=n_train, n_val=n_val, dtype="uint16")
    _check_seq_len(meta, seq_len)

    # 5. write: the old meta.json goes first (so that a kill below never pairs it with new .bin
    # files), then the tokenizer and the data, and the new meta.json last (its presence says the
    # directory is complete)
    out_dir.mkdir(parents=True, exist_ok=True)
    if (out_dir / META).exists():
        os.remove(out_dir / META)
    if tokenizer == "bpe":
        atomic_write(out_dir / TOKENIZER_FILE, tok.to_str().encode("utf-8"))
    for split, part in (("train", ids[:n_train]), ("val", ids[n_train:])):
        raw = part.tobytes()
        atomic_write(out_dir / f"{split}.bin", raw)
        meta[f"{split}_sha256"] = hashlib.sha256(raw).hexdigest()
    atomic_write_json(out_dir / META, meta)
    say(f"wrote {out_dir}: {n_train:,} train and {n_val:,} val tokens, vocab {tok.vocab_size:,} "
        f"({time.time() - t0:.1f} s)")
    return meta


def _check_seq_len(meta: dict, seq_len: int | None) -> None:
    """DataError if either split is too short for one sequence of seq_len tokens plus its target."""
    if seq_len is not None:
        for split in ("train", "val"):
            if meta[f"n_{split}"] < seq_len + 2:
                raise _too_small(split, meta[f"n_{split}"], seq_len)


# ----------------------------------------------------------------------------------------------
# load and batches


META_KEYS = ("source", "source_sha256", "tokenizer", "vocab_size", "n_train", "n_val", "dtype",
             "train_sha256", "val_sha256")


def _try_read_meta(data_dir: Path) -> dict | None:
    """meta.json as a dict, or None if absent, unreadable or incomplete."""
    meta = _try_json(data_dir / META)
    if meta is None or not all(k in meta for k in META_KEYS) or meta["dtype"] != "uint16":
        return None
    return meta


def _read_meta(data_dir: Path) -> dict:
    """meta.json as a dict, or DataError saying how to make it."""
    meta = _try_read_meta(data_dir)
    if meta is None:
        raise DataError(f"'{data_dir}' has no complete {META}: prepare it first "
                        f"(python -m andrea_numba.data prepare --size 12M --out {data_dir})")
    return meta


def _check_bins(data_dir: Path, meta: dict) -> None:
    """DataError unless train.bin and val.bin exist with the sizes meta.json records."""
    for split in ("train", "val"):
        path = data_dir / f"{split}.bin"
        want = meta[f"n_{split}"] * DTYPE.itemsize
        if not path.is_file():
            raise DataError(f"'{path}' is missing: prepare the data again")
        have = path.stat().st_size
        if have != want:
            raise DataError(f"'{path}' has {have:,} bytes but meta.json says {meta[f'n_{split}']:,} tokens "
                            f"({want:,} bytes): the file is truncated or stale, prepare the data again")


def check_prepared(data_dir, record: dict) -> dict:
    """The prepared data directory of a run being resumed, checked against the run's record (the
    meta it started with): the same corpus and tokenizer, and token files with the recorded
    sha256. Returns the meta; DataError with one line otherwise. Nothing is read from the corpus
    itself, so a resumed run does not depend on its source text still being there unchanged."""
    data_dir = Path(data_dir)
    meta = _read_meta(data_dir)
    _check_bins(data_dir, meta)
    for key in ("source_sha256", "tokenizer", "vocab_size", "n_train", "n_val"):
        if key in record and meta[key] != record[key]:
            raise DataError(f"'{data_dir}' holds other data than the run was trained on ({key} differs from "
                            f"the record in .state.json): restore the run's tokens, or delete '{data_dir}' "
                            f"to prepare them again from the same corpus")
    for split in ("train", "val"):
        want = record.get(f"{split}_sha256")
        if want is not None and file_sha256(data_dir / f"{split}.bin") != want:
            raise DataError(f"'{data_dir / f'{split}.bin'}' does not match the sha256 recorded in .state.json: "
                            f"the run's tokens changed; restore them, or delete '{data_dir}' to prepare "
                            f"them again from the same corpus")
    return meta


def load(data_dir) -> tuple[np.memmap, np.memmap, dict]:
    """A prepared data directory: (train tokens, val tokens, meta), tokens as read-only uint16 memmaps."""
    data_dir = Path(data_dir)
    meta = _read_meta(data_dir)
    _check_bins(data_dir, meta)
    train = np.memmap(data_dir / "train.bin", dtype=DTYPE, mode="r")
    val = np.memmap(data_dir / "val.bin", dtype=DTYPE, mode="r")
    return train, val, meta


def get_batch(tokens, B: int, T: int, seed: int, step: int, micro: int, split: str = "train"):
    """B random windows of T + 1 tokens: (x, y), int32 arrays [B, T], y[b, t] = x[b, t + 1]'s token.

    A pure function: the offsets come from a generator seeded with (seed, step, micro, split), so the
    same arguments always give the same batch; to resume a run, only the step is needed.
    """
    if split not in ("train", "val"):
        raise ValueError(f"split must be 'train' or 'val', got '{split}'")
    n = len(tokens)
    if n < T + 2:
        raise _too_small(split, n, T)
    rng = np.random.default_rng([seed, step, micro, 0 if split == "train" else 1])
    starts = rng.integers(0, n - T - 1, size=B)
    window = np.asarray(tokens[starts[:, None] + np.arange(T + 1)], dtype=np.int32)  # [B, T + 1]
    return np.ascontiguousarray(window[:, :-1]), np.ascontiguousarray(window[:, 1:])


# ----------------------------------------------------------------------------------------------
# download one public corpus


def download(name: str, out_dir, url: str | None = None, progress=None) -> Path:
    """Download a corpus of CORPORA into out_dir; return the path of the text file.

    The body is streamed to a temp file and renamed into place only when complete; download.json
    records the address, size and sha256. With the registry's own address the sha256 is checked
    against the known one; `url` overrides the address (a mirror, or a file:// URL for tests),
    and then the hash is only recorded. A file already there with the recorded hash is reused.
    """
    say = progress or (lambda msg: None)
    if name not in CORPORA:
        raise DataError(f"unknown corpus '{name}': choose one of {', '.join(CORPORA)}")
    entry = CORPORA[name]
    src = url or entry["url"]
    expect = entry["sha256"] if url is None else None
    out_dir = Path(out_dir)
    dest = out_dir / entry["file"]
    record = _try_json(out_dir / "download.json")
    if dest.is_file() and record and record.get("url") == src and file_sha256(dest) == record.get("sha256"):
        say(f"{dest} already downloaded: reusing it")
        return dest
    made = [d for d in (out_dir, *out_dir.parents) if not d.exists()]    # removed again if the download fails
    out_dir.mkdir(parents=True, exist_ok=True)
    try:
        return _download(name, src, expect, out_dir, dest, say)
    except BaseException:
        for d in made:                                     # innermost first; only empty ones
            try:
                d.rmdir()
            except OSError:
                break
        raise


def _download(name, src, expect, out_dir: Path, dest: Path, say) -> Path:
    """download's body, into the directory out_dir that exists."""
    say(f"downloading {name} from {src}")
    fd, tmp = tempfile.mkstemp(dir=out_dir, prefix=f".{dest.name}.", suffix=".tmp")
    h, n = hashlib.sha256(), 0
    try:
        with os.fdopen(fd, "wb") as f:
            if hasattr(os, "fchmod"):
                os.fchmod(f.fileno(), 0o644)
            try:
                req = urllib.request.Request(src, headers={"User-Agent": "andrea-numba"})
                with urllib.request.urlopen(req, timeout=30) as resp:
                    for block in iter(lambda: resp.read(1 << 16), b""):
                        f.write(block)
                        h.update(block)
                        n += len(block)
            except (urllib.error.URLError, http.client.HTTPException, OSError, ValueError) as e:
                reason = getattr(e, "reason", None) or e
                raise DataError(f"cannot download {name} from {src} ({reason}): without network, "
                                f"pass --data with a local UTF-8 text file instead") from None
            f.flush()
            os.fsync(f.fileno())
        sha = h.hexdigest()
        if expect is not None and sha != expect:
            raise DataError(f"{name} from {src} has sha256 {sha}, expected {expect}: the download is damaged "
                            f"or the file changed; try again, or pass --data with a local copy")
        os.replace(tmp, dest)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    atomic_write_json(out_dir / "download.json", {"name": name, "url": src, "file": dest.name, "bytes": n,
                                            "sha256": sha, "sha256_checked": expect is not None})
    say(f"downloaded {n:,} bytes to {dest} (sha256 {sha[:12]}...)")
    return dest


def _try_json(path: Path) -> dict | None:
    """A JSON file as a dict, or None if absent or unreadable."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


# ----------------------------------------------------------------------------------------------
# command line


def _say(msg: str) -> None:
    """Progress line on stdout, flushed at once."""
    print(msg, flush=True)


@cli.exits_on(DataError, ConfigError, OSError)
def main(argv=None) -> int:
    """python -m andrea_numba.data prepare ... | download ..."""
    ap = cli.Parser(prog="python -m andrea_numba.data",
                    description="Prepare token files for training, or download a corpus.")
    sub = ap.add_subparsers(dest="cmd", required=True)

    p = sub.add_parser("prepare", help="tokenise a corpus into DIR/train.bin, val.bin, meta.json")
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--size", type=cli.config, help="a config size: tiny, 12M, 120M")
    g.add_argument("--config", type=cli.config, help="path of a config JSON file")
    p.add_argument("--data", type=cli.existing_file, help="a UTF-8 text file (overrides the config's data.source)")
    p.add_argument("--out", type=cli.dir_to_write, required=True, help="output directory")

    d = sub.add_parser("download", help="download a public corpus, then prepare it with the bytes tokenizer")
    d.add_argument("name", choices=list(CORPORA), help=f"one of {', '.join(CORPORA)}")
    d.add_argument("--out", type=cli.dir_to_write, required=True, help="output directory")
    d.add_argument("--url", type=cli.url, help="download from this address instead (also file://)")
    d.add_argument("--val-fraction", type=cli.fraction, default=0.1, help="validation share (default 0.1)")
    d.add_argument("--no-prepare", action="store_true", help="only download")
    args = ap.parse_args(argv)

    if args.cmd == "prepare":
        cfg = load_config(args.config or args.size)
        meta = prepare(str(args.data) if args.data else cfg.data.source, cfg.data.tokenizer, cfg.model.vocab_size,
                       cfg.data.val_fraction, args.out, progress=_say, seq_len=cfg.train.seq_len)
    else:
        path = download(args.name, args.out, url=args.url, progress=_say)
        if args.no_prepare:
            return 0
        meta = prepare(str(path), "bytes", 256, args.val_fraction, args.out, progress=_say)
    print(json.dumps(meta))
    return 0


if __name__ == "__main__":
    sys.exit(main())
