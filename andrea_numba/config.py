"""Configs: one JSON per model size, loaded and validated.

    cfg = load_config("12M")              # a size name: tiny, 12M, 120M
    cfg = load_config("configs/my.json")  # or a file
    cfg.model.d_model, cfg.train.lr, cfg.data.tokenizer

A config has three sections. `model` is the shape of the network, `train` how to train it, `data`
where the text comes from and how it becomes tokens. Every field is required and typed; a wrong
config raises ConfigError with one line that names the field and the fix. Command-line tools catch
it, print that line and exit with code 2 (see `exit_on_config_error`).

    python -m andrea_numba.config --size 12M     # print a config and its parameter count
"""
from __future__ import annotations

import argparse
import dataclasses
import difflib
import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path

# size name -> config file name (without .json)
SIZES = {
    "tiny": "ANDREA-tiny",
    "12M": "ANDREA-12M-TRAIN",
    "120M": "ANDREA-120M-TRAIN",
}


class ConfigError(ValueError):
    """A config that cannot be used; str(err) is one line saying what is wrong and how to fix it."""


@dataclass(frozen=True)
class ModelConfig:
    vocab_size: int        # V: number of token ids (bytes: 256)
    context_length: int    # T_max: rows of the position embedding wpe
    n_layer: int           # L: transformer blocks
    n_head: int            # H: attention heads, must divide d_model
    d_model: int           # C: width of the residual stream
    ln_eps: float          # added to the variance inside every LayerNorm

    @property
    def head_size(self) -> int:
        return self.d_model // self.n_head

    @property
    def n_params(self) -> int:
        """Learnable parameters: the embeddings wte [V, C] and wpe [T, C]; per block two LayerNorms
        (2C each), W_Q, W_K, W_V, W_O (C x C each) and the MLP (C x 4C and 4C x C); the final
        LayerNorm (2C). andrea_numba.layout lays them out in this order; its tests check the count."""
        V, T, L, C = self.vocab_size, self.context_length, self.n_layer, self.d_model
        return V * C + T * C + L * (4 * C + 4 * C * C + 8 * C * C) + 2 * C


@dataclass(frozen=True)
class TrainConfig:
    batch_size: int            # B: sequences in one microbatch
    seq_len: int               # T: tokens per sequence, at most context_length
    n_microbatches: int        # microbatches accumulated into one optimiser step
    steps: int                 # optimiser steps of a run
    lr: float                  # peak learning rate, reached after warmup_steps
    min_lr: float              # learning rate at the end of the decay
    warmup_steps: int          # linear warm-up from 0 to lr
    lr_decay: str              # "cosine" (to min_lr at `steps`) or "constant"
    beta1: float               # AdamW first-moment decay
    beta2: float               # AdamW second-moment decay
    eps: float                 # AdamW epsilon
    weight_decay: float        # decoupled weight decay, applied to 2-D weights only
    clip_norm: float           # global gradient-norm clip (0 turns clipping off)
    dropout: float             # probability of zeroing an activation (attention probabilities, attention
                               # and MLP outputs) during training; 0 turns dropout off
    eval_interval: int         # steps between validation-loss evaluations
    eval_batches: int          # microbatches averaged for one validation loss
    early_stop: int            # stop after this many evaluations in a row without a better validation
                               # loss (best.bin keeps the best); 0: train all `steps`
    checkpoint_interval: int   # steps between checkpoints
    sample_interval: int       # steps between text samples
    sample_tokens: int         # tokens generated per sample
    seed: int                  # seeds initialisation and the data order
    precision: str             # of the products (linear ops, attention): "fp32" (the reference), "bf16" or "fp16"
                               # (inputs rounded to it, fp32 sums; fp16 with loss scaling); the rest stays fp32;
                               # "fp8-fwd", "fp8-e5m2", "fp8-all": the linear layers' products in FP8 at that
                               # scope (kernels/fp8_products.py; products "cublas" only), the rest bf16
    products: str              # who computes them: "numba" (our kernels) or "cublas" (cuBLASLt through
                               # nvmath-python: pip install -e ".[cublas]", a GPU only)


@dataclass(frozen=True)
class DataConfig:
    source: str            # "stdlib" (the embedded default corpus) or a path to a UTF-8 text file
    tokenizer: str         # "bytes" (vocab 256) or "bpe" (trained on the corpus at prepare time)
    val_fraction: float    # share of the tokens held out for validation


@dataclass(frozen=True)
class Config:
    name: str
    model: ModelConfig
    train: TrainConfig
    data: DataConfig

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


SECTIONS = {"model": ModelConfig, "train": TrainConfig, "data": DataConfig}
# fields added after runs were already written with configs that lack them: (section, field) ->
# the value that gives those runs' behaviour (a config file should still name every field)
DEFAULTS = {("train", "dropout"): 0.0, ("train", "early_stop"): 0, ("train", "precision"): "fp32",
            ("train", "products"): "numba"}
PRECISIONS = ("fp32", "bf16", "fp16", "fp8-fwd", "fp8-e5m2", "fp8-all")   # fp8-*: FP8 products (cuBLASLt only)
PRODUCT_ROUTES = ("numba", "cublas")
LR_DECAYS = ("cosine", "constant")
INT32_MAX = 2 ** 31 - 1      # the checkpoint stores the step and the parameter count as int32
# the largest value of an int field, and why: the engine stores ints as int32 (token ids, the
# checkpoint's step and parameter count); a few fields have a tighter bound
INT_LIMITS = {
    ("model", "vocab_size"): (65536, "token ids are stored as uint16"),
    ("model", "context_length"): (65536, "attention holds T x T scores per head"),
    ("model", "n_layer"): (1024, "a limit against typos"),
    ("model", "n_head"): (1024, "a limit against typos"),
    ("model", "d_model"): (65536, "a limit against typos"),
    ("train", "batch_size"): (65536, "a limit against typos"),
    ("train", "n_microbatches"): (65536, "a limit against typos"),
    ("train", "eval_batches"): (65536, "a limit against typos"),
    ("train", "sample_tokens"): (1_000_000, "a limit against typos"),
}
NAME_MAX = 100
TOKENIZERS = ("bytes", "bpe")


def _parse_section(section: str, cls, raw) -> object:
    if not isinstance(raw, dict):
        raise ConfigError(f"'{section}' must be a JSON object of fields, not {type(raw).__name__}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    for key in raw:
        if key not in fields:
            close = difflib.get_close_matches(key, fields, n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            raise ConfigError(f"unknown field '{section}.{key}'{hint}: remove it or fix its name")
    values = {}
    for name, f in fields.items():
        if name not in raw and (section, name) in DEFAULTS:
            values[name] = DEFAULTS[section, name]
            continue
        if name not in raw:
            raise ConfigError(f"missing field '{section}.{name}': add it to the config")
        v = raw[name]
        want = {"int": int, "float": float, "str": str}[f.type]
        # JSON has one number type: an int is a fine float, a bool is never a number
        ok = (isinstance(v, want) and not isinstance(v, bool)) or (
            want is float and isinstance(v, int) and not isinstance(v, bool))
        if not ok:
            raise ConfigError(
                f"field '{section}.{name}' must be {f.type}, got {_show(v)} ({type(v).__name__})")
        if want is float:
            try:
                v = float(v)
            except OverflowError:
                v = math.inf
            if not math.isfinite(v):
                hint = " (JSON reads 1e400 as infinity)" if math.isinf(v) else ""
                raise ConfigError(f"field '{section}.{name}' must be a finite number, got {_show(v)}{hint}: "
                                  f"write an ordinary number")
        elif want is int:
            hi, why = INT_LIMITS.get((section, name), (INT32_MAX, "the engine stores it as int32"))
            if abs(v) > hi:
                raise ConfigError(f"field '{section}.{name}' is {_show(v)}, beyond {hi:,} ({why}): "
                                  f"use a smaller value")
        elif not v.isprintable():
            raise ConfigError(f"field '{section}.{name}' holds a control character (such as a newline): "
                              f"remove it")
        values[name] = v
    return cls(**values)


def _show(v) -> str:
    """A JSON value for a message, short and on one line."""
    try:
        text = json.dumps(v)
    except ValueError:               # an int of more digits than Python will print
        text = "a very long number"
    return text if len(text) <= 40 else text[:37] + "..."


def _require(cond: bool, msg: str) -> None:
    if not cond:
        raise ConfigError(msg)


def validate(cfg: Config) -> Config:
    """Check the relations between fields; raise ConfigError naming the first that is wrong."""
    m, t, d = cfg.model, cfg.train, cfg.data
    for name in ("vocab_size", "context_length", "n_layer", "n_head", "d_model"):
        _require(getattr(m, name) > 0, f"field 'model.{name}' must be positive, got {getattr(m, name)}")
    _require(m.n_head <= m.d_model, f"field 'model.n_head' ({m.n_head}) exceeds model.d_model ({m.d_model}): "
             f"a head needs at least one channel; lower n_head")
    _require(m.d_model % m.n_head == 0,
             f"field 'model.n_head' ({m.n_head}) must divide model.d_model ({m.d_model}): "
             f"pick a divisor such as {max(h for h in range(1, m.n_head + 1) if m.d_model % h == 0)}")
    _require(m.ln_eps > 0, f"field 'model.ln_eps' must be positive, got {m.ln_eps}")
    _require(m.n_params <= INT32_MAX,
             f"model has {m.n_params:,} parameters, more than the checkpoint's int32 count holds "
             f"({INT32_MAX:,}): lower model.d_model, n_layer, vocab_size or context_length")
    for name in ("batch_size", "seq_len", "n_microbatches", "steps", "eval_interval", "eval_batches",
                 "checkpoint_interval", "sample_interval"):
        _require(getattr(t, name) > 0, f"field 'train.{name}' must be positive, got {getattr(t, name)}")
    for name in ("warmup_steps", "sample_tokens", "seed", "early_stop"):
        _require(getattr(t, name) >= 0, f"field 'train.{name}' must be >= 0, got {getattr(t, name)}")
    _require(t.seq_len <= m.context_length,
             f"field 'train.seq_len' ({t.seq_len}) exceeds model.context_length ({m.context_length}): "
             f"lower seq_len or raise context_length")
    _require(t.lr > 0, f"field 'train.lr' must be positive, got {t.lr}")
    _require(0 <= t.min_lr <= t.lr, f"field 'train.min_lr' must lie in [0, train.lr], got {t.min_lr}")
    _require(t.lr_decay in LR_DECAYS,
             f"field 'train.lr_decay' must be one of {', '.join(LR_DECAYS)}, got '{t.lr_decay}'")
    for name in ("beta1", "beta2"):
        _require(0 <= getattr(t, name) < 1, f"field 'train.{name}' must lie in [0, 1), got {getattr(t, name)}")
    _require(t.eps > 0, f"field 'train.eps' must be positive, got {t.eps}")
    _require(t.weight_decay >= 0, f"field 'train.weight_decay' must be >= 0, got {t.weight_decay}")
    _require(0 <= t.dropout < 1, f"field 'train.dropout' must lie in [0, 1), got {t.dropout}")
    _require(t.precision in PRECISIONS,
             f"field 'train.precision' must be one of {', '.join(PRECISIONS)}, got '{t.precision}'")
    _require(t.products in PRODUCT_ROUTES,
             f"field 'train.products' must be one of {', '.join(PRODUCT_ROUTES)}, got '{t.products}'")
    _require(not t.precision.startswith("fp8") or t.products == "cublas",
             f"field 'train.precision' is '{t.precision}', whose FP8 products run through cuBLASLt: set "
             f"train.products to 'cublas' (on the command line: --products cublas)")
    _require(t.clip_norm >= 0, f"field 'train.clip_norm' must be >= 0 (0 = no clipping), got {t.clip_norm}")
    _require(d.tokenizer in TOKENIZERS,
             f"field 'data.tokenizer' must be one of {', '.join(TOKENIZERS)}, got '{d.tokenizer}'")
    if d.tokenizer == "bytes":
        _require(m.vocab_size >= 256,
                 f"field 'model.vocab_size' is {m.vocab_size} but the bytes tokenizer needs 256: set it to 256")
    _require(0 < d.val_fraction < 1, f"field 'data.val_fraction' must lie in (0, 1), got {d.val_fraction}")
    _require(d.source != "", "field 'data.source' is empty: use \"stdlib\" or the path of a UTF-8 text file")
    return cfg


def config_from_dict(raw, origin: str = "config") -> Config:
    if not isinstance(raw, dict):
        raise ConfigError(f"{origin}: the top level must be a JSON object")
    for key in raw:
        if key not in ("name", *SECTIONS):
            raise ConfigError(f"{origin}: unknown top-level field '{key}': "
                              f"allowed are name, {', '.join(SECTIONS)}")
    name = raw.get("name")
    if not isinstance(name, str) or not name:
        raise ConfigError(f"{origin}: missing field 'name': add a string such as \"ANDREA-12M-TRAIN\"")
    if len(name) > NAME_MAX or not name.isprintable() or any(c in name for c in "/\\") or name in (".", ".."):
        raise ConfigError(f"{origin}: field 'name' must be at most {NAME_MAX} printable characters without "
                          f"/ or \\ (it names the default run directory), got {_show(name)}")
    sections = {}
    for section, cls in SECTIONS.items():
        if section not in raw:
            raise ConfigError(f"{origin}: missing section '{section}': add it as a JSON object")
        try:
            sections[section] = _parse_section(section, cls, raw[section])
        except ConfigError as e:
            raise ConfigError(f"{origin}: {e}") from None
    try:
        return validate(Config(name=name, **sections))
    except ConfigError as e:
        raise ConfigError(f"{origin}: {e}") from None


def config_dir() -> Path:
    """configs/ of a checkout (beside the package), or the copy an installed wheel carries inside it."""
    here = Path(__file__).resolve().parent
    for d in (here.parent / "configs", here / "configs"):
        if (d / f"{SIZES['tiny']}.json").is_file():
            return d
    raise ConfigError("the bundled configs are missing: reinstall andrea-numba (pip install andrea-numba)")


def _bundled(stem: str) -> str:
    return (config_dir() / f"{stem}.json").read_text(encoding="utf-8")


def load_config(size_or_path: str) -> Config:
    """Load a config by size name ("tiny", "12M", "120M", or a full name such as "ANDREA-12M-TRAIN")
    or by the path of a JSON file, and validate it."""
    names = {**SIZES, **{v: v for v in SIZES.values()}}
    if size_or_path in names:
        origin = f"{names[size_or_path]}.json"
        text = _bundled(names[size_or_path])
    else:
        path = Path(size_or_path)
        if not size_or_path.strip():
            raise ConfigError(f"unknown size '{size_or_path}': choose one of {', '.join(SIZES)} "
                              f"or give the path of a config JSON file")
        if path.is_dir():
            raise ConfigError(f"'{path}' is a directory, not a config file: give the path of a JSON file, "
                              f"or a size ({', '.join(SIZES)})")
        if path.suffix != ".json" and not path.exists():
            raise ConfigError(f"unknown size '{size_or_path}': choose one of {', '.join(SIZES)} "
                              f"or give the path of a config JSON file")
        if not path.is_file():
            raise ConfigError(f"config file '{path}' not found: check the path, or use a size "
                              f"({', '.join(SIZES)})")
        origin = str(path)
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise ConfigError(f"cannot read config file '{path}': {e}") from None
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as e:
        raise ConfigError(f"{origin} is not valid JSON (line {e.lineno}, column {e.colno}: {e.msg})") from None
    except (ValueError, RecursionError) as e:      # an integer of thousands of digits; nesting too deep
        why = "nested too deeply" if isinstance(e, RecursionError) else "a number of thousands of digits"
        raise ConfigError(f"{origin} is not a usable config ({why}): fix the file") from None
    return config_from_dict(raw, origin)


def exit_on_config_error(fn):
    """Decorator for command-line mains: a ConfigError becomes one line on stderr and exit code 2."""
    def wrapped(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except ConfigError as e:
            print(f"error: {e}", file=sys.stderr)
            sys.exit(2)
    wrapped.__name__ = fn.__name__
    wrapped.__doc__ = fn.__doc__
    return wrapped


class _Arguments(argparse.ArgumentParser):
    """The parser of this module's command line: a bad argument raises ConfigError, which main's
    decorator turns into one line on stderr and exit code 2, as cli.Parser does for the package's
    other command lines (cli imports this module, to check a --size or --config when it is parsed)."""

    def error(self, message):
        raise ConfigError(f"{message} (see {self.prog} --help)")


@exit_on_config_error
def main(argv=None) -> int:
    ap = _Arguments(prog="python -m andrea_numba.config",
                    description="Validate a config and print it with its parameter count.")
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--size", default="tiny", help=f"one of {', '.join(SIZES)} (default tiny)")
    g.add_argument("--config", help="path of a config JSON file")
    args = ap.parse_args(argv)
    cfg = load_config(args.config or args.size)            # a bad size or file: ConfigError, one line
    print(json.dumps(cfg.to_dict(), indent=2))
    print(f"{cfg.name}: {cfg.model.n_params:,} parameters")
    return 0


if __name__ == "__main__":
    sys.exit(main())
