"""The data pipeline: corpus, tokenizers, prepare/load, pure batches, one-line errors, download, CLI."""
import json
import subprocess
import sys

import numpy as np
import pytest

from andrea_numba import data
from andrea_numba.data import (
    ByteTokenizer,
    DataError,
    check_prepared,
    download,
    get_batch,
    load,
    load_tokenizer,
    prepare,
    stdlib_corpus,
)

TEXT = "def hello(name):\n    return f'héllo, {name} ✓'\n\n" * 200     # ~9 KB, with non-ASCII


def _one_line(err) -> str:
    msg = str(err.value)
    assert "\n" not in msg and msg
    return msg


@pytest.fixture
def text_file(tmp_path):
    path = tmp_path / "corpus.txt"
    path.write_text(TEXT, encoding="utf-8")
    return path


def test_stdlib_corpus_is_deterministic_and_hashed():
    import hashlib
    text, sha, n_files = stdlib_corpus()
    assert n_files > 300 and len(text) > 5_000_000
    assert sha == hashlib.sha256(text.encode("utf-8")).hexdigest()
    assert "\n# ---- os.py ----\n" in text
    assert "/test/" not in "".join(line for line in text.splitlines() if line.startswith("# ---- "))
    assert "site-packages" not in text.split("\n# ---- ", 2)[1]
    assert stdlib_corpus()[1] == sha


def test_byte_tokenizer_round_trip():
    tok = ByteTokenizer()
    s = "héllo wörld ✓ 日本 🙂"
    ids = tok.encode(s)
    assert tok.vocab_size == 256 and max(ids) < 256
    assert len(ids) == len(s.encode("utf-8"))
    assert tok.decode(ids) == s
    assert tok.decode(ids[:2]) == "h\ufffd"     # a cut character decodes to U+FFFD, no exception


def test_prepare_writes_splits_meta_and_reuses(tmp_path, text_file):
    out = tmp_path / "prep"
    lines = []
    meta = prepare(str(text_file), "bytes", 256, 0.1, out, progress=lines.append)
    n = len(TEXT.encode("utf-8"))
    assert meta["n_val"] == round(n * 0.1) and meta["n_train"] + meta["n_val"] == n
    assert meta["vocab_size"] == 256 and meta["tokenizer"] == "bytes" and meta["dtype"] == "uint16"
    assert json.loads((out / "meta.json").read_text()) == meta
    assert lines
    train, val, meta2 = load(out)
    assert meta2 == meta and train.dtype == np.uint16 and len(train) == meta["n_train"]
    raw = np.frombuffer(TEXT.encode("utf-8"), np.uint8)
    assert np.array_equal(train, raw[:meta["n_train"]]) and np.array_equal(val, raw[meta["n_train"]:])
    assert (out / "train.bin").read_bytes()[:2] == bytes([raw[0], 0])    # little-endian uint16
    assert isinstance(load_tokenizer(out), ByteTokenizer)

    mtime = (out / "train.bin").stat().st_mtime_ns
    lines.clear()
    assert prepare(str(text_file), "bytes", 256, 0.1, out, progress=lines.append) == meta
    assert any("reusing" in line for line in lines)
    assert (out / "train.bin").stat().st_mtime_ns == mtime
    assert not list(out.glob(".*.tmp"))


def test_prepare_records_checksums_and_a_resumed_run_checks_them(tmp_path, text_file):
    import hashlib
    out = tmp_path / "prep"
    meta = prepare(str(text_file), "bytes", 256, 0.1, out)
    for split in ("train", "val"):
        assert meta[f"{split}_sha256"] == hashlib.sha256((out / f"{split}.bin").read_bytes()).hexdigest()
    assert check_prepared(out, meta) == meta
    tokens = bytearray((out / "val.bin").read_bytes())
    tokens[0] ^= 1
    (out / "val.bin").write_bytes(bytes(tokens))
    with pytest.raises(DataError) as e:
        check_prepared(out, meta)
    assert "val.bin' does not match the sha256 recorded" in _one_line(e)
    with pytest.raises(DataError) as e:
        check_prepared(out, {**meta, "source_sha256": "0" * 64})
    assert "source_sha256 differs" in _one_line(e)


def test_prepare_refuses_a_corpus_that_changed_and_writes_nothing(tmp_path, text_file):
    meta = prepare(str(text_file), "bytes", 256, 0.1, tmp_path / "first")
    text_file.write_text(TEXT + "one more line\n", encoding="utf-8")
    with pytest.raises(DataError) as e:
        prepare(str(text_file), "bytes", 256, 0.1, tmp_path / "again", expect_sha256=meta["source_sha256"])
    assert "changed since the run was prepared" in _one_line(e)
    assert not (tmp_path / "again").exists()


def test_get_batch_is_pure_and_shifted():
    tokens = np.arange(1000, dtype=np.uint16)
    x, y = get_batch(tokens, 4, 16, seed=1, step=7, micro=0)
    assert x.shape == y.shape == (4, 16) and x.dtype == y.dtype == np.int32
    assert np.array_equal(x[:, 1:], y[:, :-1]) and np.array_equal(y, x + 1)
    x2, y2 = get_batch(tokens, 4, 16, seed=1, step=7, micro=0)
    assert np.array_equal(x, x2) and np.array_equal(y, y2)
    for other in ({"step": 8, "micro": 0}, {"step": 7, "micro": 1}):
        assert not np.array_equal(x, get_batch(tokens, 4, 16, seed=1, **other)[0])
    assert not np.array_equal(x, get_batch(tokens, 4, 16, 1, 7, 0, split="val")[0])
    # the smallest split that fits: the only window is the start
    x, y = get_batch(np.arange(18, dtype=np.uint16), 3, 16, 0, 0, 0)
    assert (x[:, 0] == 0).all() and y.max() == 16


def test_error_missing_file(tmp_path):
    with pytest.raises(DataError) as e:
        prepare(str(tmp_path / "nope.txt"), "bytes", 256, 0.1, tmp_path / "out")
    assert "not found" in _one_line(e) and "nope.txt" in str(e.value)


def test_error_not_utf8(tmp_path):
    path = tmp_path / "latin1.txt"
    path.write_bytes(b"abc caf" + "é".encode("latin-1") + b" more")
    with pytest.raises(DataError) as e:
        prepare(str(path), "bytes", 256, 0.1, tmp_path / "out")
    msg = _one_line(e)
    assert "not UTF-8" in msg and "offset 7" in msg and "0xe9" in msg


def test_error_corpus_too_small(tmp_path):
    path = tmp_path / "small.txt"
    path.write_text("x" * 100, encoding="utf-8")
    with pytest.raises(DataError) as e:
        prepare(str(path), "bytes", 256, 0.1, tmp_path / "out", seq_len=16)
    msg = _one_line(e)
    assert "val split has 10 tokens" in msg and "at least 18" in msg
    with pytest.raises(DataError) as e:
        get_batch(np.zeros(17, np.uint16), 2, 16, 0, 0, 0)
    assert "train split has 17 tokens" in _one_line(e)


def test_error_truncated_bin_and_missing_meta(tmp_path, text_file):
    out = tmp_path / "prep"
    meta = prepare(str(text_file), "bytes", 256, 0.1, out)
    with open(out / "val.bin", "r+b") as f:
        f.truncate(10)
    with pytest.raises(DataError) as e:
        load(out)
    msg = _one_line(e)
    assert "val.bin" in msg and "10 bytes" in msg and f"{meta['n_val']:,} tokens" in msg
    # prepare notices the damage and prepares again instead of reusing
    prepare(str(text_file), "bytes", 256, 0.1, out)
    assert len(load(out)[1]) == meta["n_val"]
    with pytest.raises(DataError) as e:
        load(tmp_path)
    assert "meta.json" in _one_line(e)


def _cli(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "andrea_numba.data", *args],
                          capture_output=True, text=True, cwd=cwd, check=False)


def test_cli_missing_file_exits_2_with_one_line(tmp_path):
    r = _cli("prepare", "--size", "tiny", "--data", str(tmp_path / "missing.txt"), "--out", str(tmp_path / "o"))
    assert r.returncode == 2
    assert r.stderr.count("\n") == 1 and r.stderr.startswith("error: ") and "does not exist" in r.stderr
    assert not (tmp_path / "o").exists()


def test_prepare_writes_nothing_until_every_check_passed(tmp_path, text_file):
    out = tmp_path / "prep"
    meta = prepare(str(text_file), "bytes", 256, 0.1, out)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    small, empty = tmp_path / "small.txt", tmp_path / "empty.txt"
    small.write_text("tiny text")
    empty.write_bytes(b"")
    for source, message in ((small, "needs at least 18"), (empty, "is empty"), (tmp_path, "is a directory")):
        with pytest.raises(DataError) as e:
            prepare(str(source), "bytes", 256, 0.1, out, seq_len=16)
        assert message in _one_line(e)
        assert {p.name: p.read_bytes() for p in out.iterdir()} == before     # the old meta.json is still there
    with pytest.raises(DataError):
        prepare(str(small), "bytes", 256, 0.1, tmp_path / "new" / "dir", seq_len=16)
    assert not (tmp_path / "new").exists()
    assert load(out)[2] == meta


def test_download_file_url_then_prepare(tmp_path, text_file):
    out = tmp_path / "dl"
    path = download("shakespeare", out, url=text_file.as_uri())
    assert path.read_text(encoding="utf-8") == TEXT
    record = json.loads((out / "download.json").read_text())
    assert record["bytes"] == len(TEXT.encode("utf-8")) and record["sha256_checked"] is False
    meta = prepare(str(path), "bytes", 256, 0.1, out)
    assert meta["source_sha256"] == record["sha256"]
    # the command line does both
    r = _cli("download", "shakespeare", "--out", str(tmp_path / "cli"), "--url", text_file.as_uri())
    assert r.returncode == 0, r.stderr
    assert load(tmp_path / "cli")[2]["n_train"] == meta["n_train"]


def test_download_errors_are_one_line(tmp_path):
    with pytest.raises(DataError) as e:
        download("shakespeare", tmp_path, url=(tmp_path / "absent.txt").as_uri())
    assert "--data" in _one_line(e)
    assert not list(tmp_path.glob("*.txt")) and not list(tmp_path.glob(".*.tmp"))
    with pytest.raises(DataError):                     # the directories it made are removed again
        download("shakespeare", tmp_path / "a" / "b", url=(tmp_path / "absent.txt").as_uri())
    assert not (tmp_path / "a").exists()
    with pytest.raises(DataError) as e:
        download("nope", tmp_path)
    assert "shakespeare" in _one_line(e)


def test_bpe_train_round_trip_and_prepare(tmp_path, text_file):
    pytest.importorskip("tokenizers")
    tok = data.BPETokenizer.train(TEXT, 300)
    assert 256 < tok.vocab_size <= 300
    ids = tok.encode(TEXT)
    assert len(ids) < len(TEXT.encode("utf-8")) and tok.decode(ids) == TEXT
    # encoding in pieces (cut before a newline) gives exactly the ids of the whole text
    pieces = data._chunks(TEXT, size=100)
    assert len(pieces) > 10 and "".join(pieces) == TEXT
    assert [i for p in pieces for i in tok.encode(p)] == ids

    out = tmp_path / "bpe"
    meta = prepare(str(text_file), "bpe", 300, 0.1, out)
    assert meta["tokenizer"] == "bpe" and meta["vocab_size"] <= 300
    train, val, _ = load(out)
    tok2 = load_tokenizer(out)
    assert tok2.decode(list(train) + list(val)) == TEXT
    assert max(train.max(), val.max()) < meta["vocab_size"]


def test_bpe_missing_dependency_says_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "tokenizers", None)      # import tokenizers -> ImportError
    with pytest.raises(DataError) as e:
        data.BPETokenizer.train("abc", 300)
    assert "pip install tokenizers" in _one_line(e)
