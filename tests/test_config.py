"""Configs load, validate and refuse bad input with one clear line and exit code 2."""
import json
import subprocess
import sys

import pytest

from andrea_numba.config import SIZES, ConfigError, load_config
from andrea_numba.layout import n_params


@pytest.mark.parametrize("size", list(SIZES))
def test_bundled_configs_load(size):
    cfg = load_config(size)
    assert cfg.name == SIZES[size]
    assert cfg.model.d_model % cfg.model.n_head == 0


def test_parameter_counts_of_the_three_sizes():
    assert 1_000 <= n_params(load_config("tiny").model) <= 10_000          # a few thousand
    assert 11_000_000 <= n_params(load_config("12M").model) <= 13_000_000
    big = load_config("120M").model
    assert (big.d_model, big.n_layer, big.n_head, big.context_length, big.vocab_size) == (768, 12, 12, 1024, 50304)
    # GPT-2 small without linear biases, vocab padded to 50304: 124,392,960
    assert n_params(big) == 124_392_960


def _write(tmp_path, mutate):
    raw = json.loads(json.dumps(load_config("tiny").to_dict()))
    mutate(raw)
    p = tmp_path / "bad.json"
    p.write_text(json.dumps(raw))
    return str(p)


BAD = [
    (lambda r: r["model"].pop("d_model"), "missing field 'model.d_model'"),
    (lambda r: r["model"].update(n_head=3), "must divide model.d_model"),
    (lambda r: r["train"].update(lr="fast"), "field 'train.lr' must be float"),
    (lambda r: r["train"].update(steps=2.5), "field 'train.steps' must be int"),
    (lambda r: r["train"].update(steps=True), "field 'train.steps' must be int"),
    (lambda r: r["model"].update(n_layers=2), "unknown field 'model.n_layers' (did you mean 'n_layer'?)"),
    (lambda r: r["train"].update(seq_len=64), "exceeds model.context_length"),
    (lambda r: r["data"].update(tokenizer="sentencepiece"), "field 'data.tokenizer' must be one of"),
    (lambda r: r["model"].update(vocab_size=100), "bytes tokenizer needs 256"),
    (lambda r: r.pop("train"), "missing section 'train'"),
    # sizes the engine cannot store: the checkpoint's int32 parameter count and step, uint16 token ids
    (lambda r: r["model"].update(d_model=1_000_000_000), "field 'model.d_model' is 1000000000, beyond 65,536"),
    (lambda r: r["model"].update(d_model=4096, n_head=16, n_layer=12), "more than the checkpoint's int32 count"),
    (lambda r: r["model"].update(vocab_size=70_000), "token ids are stored as uint16"),
    (lambda r: r["model"].update(context_length=10 ** 6), "field 'model.context_length' is 1000000"),
    (lambda r: r["model"].update(n_layer=10 ** 5), "field 'model.n_layer' is 100000"),
    (lambda r: r["model"].update(n_head=16), "field 'model.n_head' (16) exceeds model.d_model (8)"),
    (lambda r: r["train"].update(steps=2 ** 31), "field 'train.steps' is 2147483648, beyond 2,147,483,647"),
    (lambda r: r["train"].update(seed=-2 ** 40), "field 'train.seed' is -1099511627776"),
    (lambda r: r["train"].update(lr=float("inf")), "field 'train.lr' must be a finite number, got Infinity"),
    (lambda r: r["train"].update(eps=float("nan")), "field 'train.eps' must be a finite number, got NaN"),
    (lambda r: r["train"].update(lr=10 ** 400), "field 'train.lr' must be a finite number"),
    (lambda r: r["model"].update(ln_eps=False), "field 'model.ln_eps' must be float, got false (bool)"),
    (lambda r: r["train"].update(dropout=1.0), "field 'train.dropout' must lie in [0, 1)"),
    (lambda r: r.update(name="../escape"), "field 'name' must be at most 100 printable characters without /"),
    (lambda r: r["data"].update(source="a\nb"), "field 'data.source' holds a control character"),
]


@pytest.mark.parametrize("mutate,message", BAD)
def test_bad_config_is_refused_with_a_clear_message(tmp_path, mutate, message):
    with pytest.raises(ConfigError) as e:
        load_config(_write(tmp_path, mutate))
    assert message in str(e.value)
    assert "\n" not in str(e.value)


def test_unknown_size_and_bad_json(tmp_path):
    with pytest.raises(ConfigError, match="unknown size '7B': choose one of tiny, 12M, 120M"):
        load_config("7B")
    p = tmp_path / "broken.json"
    p.write_text("{\"name\": ")
    with pytest.raises(ConfigError, match="is not valid JSON"):
        load_config(str(p))
    with pytest.raises(ConfigError, match="not found"):
        load_config(str(tmp_path / "missing.json"))
    with pytest.raises(ConfigError, match="is a directory, not a config file"):
        load_config(str(tmp_path))
    for text, why in (("[" * 100_000, "nested too deeply"), ('{"name": ' + "9" * 5000 + "}", "thousands of digits")):
        p.write_text(text)
        with pytest.raises(ConfigError, match=why):
            load_config(str(p))


def test_command_line_refuses_with_exit_code_2_and_no_traceback(tmp_path):
    bad = _write(tmp_path, lambda r: r["model"].update(n_head=3))
    for args in (["--config", bad], ["--size", "7B"]):
        p = subprocess.run([sys.executable, "-m", "andrea_numba.config", *args], capture_output=True, text=True)
        assert p.returncode == 2
        assert "Traceback" not in p.stderr
        assert len(p.stderr.strip().splitlines()) == 1 and p.stderr.startswith("error: ")
    ok = subprocess.run([sys.executable, "-m", "andrea_numba.config", "--size", "12M"], capture_output=True, text=True)
    assert ok.returncode == 0 and "12,692,736 parameters" in ok.stdout
