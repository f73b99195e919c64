"""No input a user can type gives a traceback: a table of bad inputs for every command line.

Each row calls a tool's main(argv) in this process and asserts: exit code 2, exactly one line on
stderr and it starts with "error:", no "Traceback" anywhere, the expected words in that line (so
the row failed for the reason it was written for), and no file or directory of the test's world
changed (every file hashed before and after). The world is built once: small text files, a run
directory of the tiny config written with the engine's own writers (prepared tokens, a checkpoint
and best.bin with their sha256 on record, a loss log), and one damaged copy of it per row that
needs one. Training it would take a minute in the CUDA simulator; sampling from it with --cpu
(the positive controls below) proves it is a run the tools accept.
"""
import hashlib
import http.server
import importlib.util
import json
import os
import shutil
import socket
from pathlib import Path

import numpy as np
import pytest

from andrea_numba import check, config, dashboard, data, exercises, gradcheck, kernel_cache, plot, sample, train
from andrea_numba.checkpoint import HEADER, save_checkpoint
from andrea_numba.config import load_config
from andrea_numba.layout import n_params
from andrea_numba.runlog import BEST_FILE, CHECKPOINT_FILE, LOSS_FILE, STATE_FILE

pytestmark = [pytest.mark.xdist_group("cli_fuzz")]   # one worker of `pytest -n` runs the module: its module fixture once

ROOT = Path(__file__).resolve().parent.parent
TEXT = "".join(f"line {i}: the quick brown fox jumps over the lazy dog\n" for i in range(60))


def _bench(name):
    spec = importlib.util.spec_from_file_location(f"bench_{name}", ROOT / "lab" / "bench" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


# ------------------------------------------------------------------------------------------------
# the world: files, a run directory and its damaged copies


def _tiny_dict():
    return json.loads(json.dumps(load_config("tiny").to_dict()))


def _config_variants() -> dict[str, str]:
    """name -> text of a config file that must be refused."""
    def mutate(fn):
        raw = _tiny_dict()
        fn(raw)
        return json.dumps(raw)
    good = json.dumps(_tiny_dict())
    return {
        "not_json": '{"name": "x", ',
        "empty": "",
        "top_list": "[1, 2]",
        "deep": "[" * 50_000 + "]" * 50_000,
        "huge_digits": good.replace('"lr": 0.01', '"lr": ' + "9" * 5000),
        "no_name": mutate(lambda r: r.pop("name")),
        "no_section": mutate(lambda r: r.pop("model")),
        "section_list": mutate(lambda r: r.update(train=[1])),
        "missing_field": mutate(lambda r: r["train"].pop("steps")),
        "unknown_field": mutate(lambda r: r["model"].update(n_layers=2)),
        "unknown_top": mutate(lambda r: r.update(extra=1)),
        "str_for_int": mutate(lambda r: r["model"].update(d_model="8")),
        "float_for_int": mutate(lambda r: r["train"].update(steps=2.5)),
        "null_for_float": mutate(lambda r: r["train"].update(lr=None)),
        "bool_int": mutate(lambda r: r["model"].update(n_layer=True)),
        "bool_float": mutate(lambda r: r["train"].update(dropout=False)),
        "d_model_1e9": mutate(lambda r: r["model"].update(d_model=1_000_000_000)),
        "params_past_int32": mutate(lambda r: r["model"].update(d_model=4096, n_head=16, n_layer=12)),
        "vocab_past_uint16": mutate(lambda r: r["model"].update(vocab_size=70_000)),
        "context_huge": mutate(lambda r: r["model"].update(context_length=10 ** 7)),
        "steps_past_int32": mutate(lambda r: r["train"].update(steps=2 ** 31)),
        "seed_past_int32": mutate(lambda r: r["train"].update(seed=2 ** 40)),
        "inf": good.replace('"lr": 0.01', '"lr": 1e400'),
        "nan": good.replace('"eps": 1e-08', '"eps": NaN'),
        "neg_inf": good.replace('"clip_norm": 1.0', '"clip_norm": -Infinity'),
        "negative_layers": mutate(lambda r: r["model"].update(n_layer=-1)),
        "negative_lr": mutate(lambda r: r["train"].update(lr=-0.1)),
        "zero_batch": mutate(lambda r: r["train"].update(batch_size=0)),
        "dropout_one": mutate(lambda r: r["train"].update(dropout=1.0)),
        "name_path": mutate(lambda r: r.update(name="../../x")),
        "head_not_divisor": mutate(lambda r: r["model"].update(n_head=3)),
    }


CONFIG_WORDS = {      # what the error line must say for each bad config
    "not_json": "is not valid JSON", "empty": "is not valid JSON", "top_list": "top level must be a JSON object",
    "deep": "nested too deeply", "huge_digits": "thousands of digits", "no_name": "missing field 'name'",
    "no_section": "missing section 'model'", "section_list": "'train' must be a JSON object",
    "missing_field": "missing field 'train.steps'", "unknown_field": "unknown field 'model.n_layers'",
    "unknown_top": "unknown top-level field 'extra'", "str_for_int": "field 'model.d_model' must be int",
    "float_for_int": "field 'train.steps' must be int", "null_for_float": "field 'train.lr' must be float",
    "bool_int": "field 'model.n_layer' must be int", "bool_float": "field 'train.dropout' must be float",
    "d_model_1e9": "field 'model.d_model' is 1000000000", "params_past_int32": "int32 count",
    "vocab_past_uint16": "uint16", "context_huge": "field 'model.context_length'",
    "steps_past_int32": "field 'train.steps' is 2147483648", "seed_past_int32": "field 'train.seed'",
    "inf": "field 'train.lr' must be a finite number", "nan": "field 'train.eps' must be a finite number",
    "neg_inf": "field 'train.clip_norm' must be a finite number", "negative_layers": "field 'model.n_layer' must be positive",
    "negative_lr": "field 'train.lr' must be positive", "zero_batch": "field 'train.batch_size' must be positive",
    "dropout_one": "field 'train.dropout' must lie in [0, 1)", "name_path": "field 'name'",
    "head_not_divisor": "must divide model.d_model",
}


def _flip(path: Path, byte: int, bit: int = 0):
    raw = bytearray(path.read_bytes())
    raw[byte] ^= 1 << bit
    path.write_bytes(bytes(raw))


def _edit_state(fn):
    def edit(run: Path):
        state = json.loads((run / STATE_FILE).read_text())
        fn(state)
        (run / STATE_FILE).write_text(json.dumps(state))
    return edit


def _nan_checkpoint(run: Path):
    """A checkpoint with a NaN weight whose sha256 is on record: only the NaN check can catch it."""
    raw = bytearray((run / CHECKPOINT_FILE).read_bytes())
    raw[HEADER.itemsize:HEADER.itemsize + 4] = np.array([np.nan], "<f4").tobytes()
    (run / CHECKPOINT_FILE).write_bytes(bytes(raw))
    _edit_state(lambda s: s.update(checkpoint_sha256=hashlib.sha256(bytes(raw)).hexdigest()))(run)


RUN_VARIANTS = {      # name -> how a copy of the good run is damaged
    "no_state": lambda r: (r / STATE_FILE).unlink(),
    "state_not_json": lambda r: (r / STATE_FILE).write_text('{"step": 2, "config": '),
    "state_binary": lambda r: (r / STATE_FILE).write_bytes(bytes(range(256))),
    "state_list": lambda r: (r / STATE_FILE).write_text("[]"),
    "state_no_config": _edit_state(lambda s: s.pop("config")),
    "state_bad_config": _edit_state(lambda s: s["config"]["model"].update(n_head=3)),
    "state_config_12M": _edit_state(lambda s: s.update(config=json.loads(json.dumps(load_config("12M").to_dict())))),
    "state_data_str": _edit_state(lambda s: s.update(data="data")),
    "state_data_dir_int": _edit_state(lambda s: s["data"].update(dir=5)),
    "no_data": lambda r: shutil.rmtree(r / "data"),
    "no_checkpoint": lambda r: (r / CHECKPOINT_FILE).unlink(),
    "checkpoint_dir": lambda r: ((r / CHECKPOINT_FILE).unlink(), (r / CHECKPOINT_FILE).mkdir()),
    "checkpoint_empty": lambda r: (r / CHECKPOINT_FILE).write_bytes(b""),
    "checkpoint_truncated": lambda r: (r / CHECKPOINT_FILE).write_bytes((r / CHECKPOINT_FILE).read_bytes()[:-100]),
    "checkpoint_random": lambda r: (r / CHECKPOINT_FILE).write_bytes(
        np.random.default_rng(1).bytes((r / CHECKPOINT_FILE).stat().st_size)),
    "checkpoint_bit_flipped": lambda r: _flip(r / CHECKPOINT_FILE, 1000, 3),
    "checkpoint_nan": _nan_checkpoint,
    "no_best": lambda r: ((r / BEST_FILE).unlink(), _edit_state(lambda s: s.pop("best"))(r)),
    "best_file_missing": lambda r: (r / BEST_FILE).unlink(),
    "best_bit_flipped": lambda r: _flip(r / BEST_FILE, 2000, 5),
    "best_record_bad": _edit_state(lambda s: s.update(best=5)),
    "no_log": lambda r: (r / LOSS_FILE).unlink(),
    "log_garbage": lambda r: (r / LOSS_FILE).write_text('{"step": 1, "train_lo\nnot json\n[1, 2]\n'),
}


def _build_world(root: Path) -> None:
    cfg = load_config("tiny")
    files = root / "files"
    files.mkdir()
    (files / "text.txt").write_text(TEXT)
    (files / "small.txt").write_text("too small")
    (files / "empty.txt").write_bytes(b"")
    (files / "binary.bin").write_bytes(bytes(range(256)) * 4)
    (files / "adir").mkdir()
    (files / "afile").write_text("a file, not a directory")
    (files / "d.png").mkdir()
    (files / "good.json").write_text(json.dumps(_tiny_dict()))
    for name, text in _config_variants().items():
        (files / f"cfg_{name}.json").write_text(text)

    run = root / "run"
    run.mkdir()
    meta = data.prepare(str(files / "text.txt"), "bytes", 256, 0.1, run / "data", seq_len=cfg.train.seq_len)
    n = n_params(cfg.model)
    rng = np.random.default_rng(0)
    params = (rng.standard_normal(n) * 0.05).astype(np.float32)
    m, v = np.zeros(n, np.float32), np.full(n, 1e-6, np.float32)
    sha = save_checkpoint(run / CHECKPOINT_FILE, 2, params, m, v)
    best_sha = save_checkpoint(run / BEST_FILE, 1, params * 0.5, m, v)
    state = {"step": 2, "config": cfg.to_dict(), "tokenizer": "bytes", "data": {**meta, "dir": "data"},
             "tokens_seen": 128, "n_params": n, "checkpoint": CHECKPOINT_FILE, "checkpoint_sha256": sha,
             "previous_checkpoint_sha256": None,
             "best": {"file": BEST_FILE, "step": 1, "val_loss": 5.41, "sha256": best_sha}}
    (run / STATE_FILE).write_text(json.dumps(state, indent=1))
    (run / LOSS_FILE).write_text("".join(json.dumps(
        {"step": s, "train_loss": 5.6 - 0.1 * s, "lr": 0.01, "grad_norm": 0.7, "tokens_per_s": 5.0,
         "time": 1.7e9 + s, **({"val_loss": 5.41} if s == 1 else {})}) + "\n" for s in (1, 2)))
    for name, damage in RUN_VARIANTS.items():
        shutil.copytree(run, root / name)
        damage(root / name)


def _snapshot(root: Path) -> dict:
    """Every directory and file under root, with each file's sha256 and mode."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        out[os.path.relpath(dirpath, root) + "/"] = os.stat(dirpath).st_mode
        for f in filenames:
            p = os.path.join(dirpath, f)
            out[os.path.relpath(p, root)] = (hashlib.sha256(Path(p).read_bytes()).hexdigest(), os.stat(p).st_mode)
    return out


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("world")
    _build_world(root)
    return root


@pytest.fixture(scope="module")
def busy_port():
    """A port on 127.0.0.1 that another socket holds, listening."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind(("127.0.0.1", 0))
    s.listen()
    yield s.getsockname()[1]
    s.close()


@pytest.fixture(scope="module")
def tools():
    return {"config": config.main, "sample": sample.main, "plot": plot.main, "dashboard": dashboard.main,
            "data": data.main, "check": check.main, "gradcheck": gradcheck.main, "exercises": exercises.main,
            "train": train.main, "kernel_cache": kernel_cache.main,
            **{f"lab/bench/{b}": _bench(b).main for b in ("kernels", "gpu_checks", "step_time", "profile_step",
                                                         "gpu_graph", "gemm", "tf32_check", "profile_kernels",
                                                         "gemm_ablate", "ncu_gemm", "precision_runs", "like_for_like",
                                                         "start_time", "splitk_sweep", "decode_speed", "flash_wgmma",
                                                         "decode_parts", "ncu_text")}}


# ------------------------------------------------------------------------------------------------
# the rows: (tool, argv, words the error line must hold); {W} is the world, {port} the busy port

S = "{W}/run"
K = ("--size", "tiny", "--out", "{W}/new")
ROWS = [
    # kernel_cache
    ("kernel_cache", ["--bogus"], "unrecognized arguments"),
    ("kernel_cache", ["--clear", "now"], "unrecognized arguments"),
    # config
    ("config", ["--size", "7B"], "unknown size '7B'"),
    ("config", ["--size", ""], "unknown size ''"),
    ("config", ["--config", "{W}/files/missing.json"], "not found"),
    ("config", ["--config", "{W}/files/adir"], "is a directory"),
    ("config", ["--config", "{W}/files/binary.bin"], "cannot read config file"),
    ("config", ["--size", "12M", "--config", "{W}/files/good.json"], "not allowed with argument"),
    ("config", ["--bogus"], "unrecognized arguments: --bogus"),
    *[("config", ["--config", f"{{W}}/files/cfg_{name}.json"], words) for name, words in CONFIG_WORDS.items()],
    *[("data", ["prepare", "--config", f"{{W}}/files/cfg_{name}.json", "--out", "{W}/new"], words)
      for name, words in CONFIG_WORDS.items() if name in ("deep", "d_model_1e9", "nan", "bool_int", "not_json")],
    *[("check", ["--size", f"{{W}}/files/cfg_{name}.json"], words)
      for name, words in CONFIG_WORDS.items() if name in ("inf", "params_past_int32", "unknown_field")],

    # sample: arguments
    ("sample", [S, "--tokens", "-3"], "argument --tokens"),
    ("sample", [S, "--tokens", "0"], "argument --tokens"),
    ("sample", [S, "--tokens", "1.5"], "must be an integer"),
    ("sample", [S, "--tokens", "10000000000"], "argument --tokens"),
    ("sample", [S, "--temperature", "0"], "argument --temperature: must be a positive number"),
    ("sample", [S, "--temperature", "-1"], "argument --temperature"),
    ("sample", [S, "--temperature", "nan"], "must be a finite number"),
    ("sample", [S, "--temperature", "inf"], "must be a finite number"),
    ("sample", [S, "--temperature", "hot"], "must be a number"),
    ("sample", [S, "--top-k", "-1"], "argument --top-k"),
    ("sample", [S, "--top-k", "1000000"], "argument --top-k"),
    ("sample", [S, "--top-k", "257"], "exceeds the model's vocabulary (256 tokens)"),
    ("sample", [S, "--seed", "-1"], "argument --seed"),
    ("sample", [S, "--seed", str(2 ** 31)], "argument --seed"),
    ("sample", [S, "--seed", "x"], "argument --seed"),
    ("sample", [S, "--prompt", "caf\udce9"], "argument --prompt: is not valid UTF-8"),
    ("sample", [S, "--bogus"], "unrecognized arguments"),
    ("sample", [], "the following arguments are required: run_dir"),
    ("sample", ["{W}/missing"], "does not exist"),
    ("sample", ["{W}/files/afile"], "is a file, not a directory"),
    ("sample", ["{W}/files/adir", "--cpu"], "has no .state.json"),
    # sample: state files
    ("sample", ["{W}/no_state", "--cpu"], "has no .state.json"),
    ("sample", ["{W}/state_not_json", "--cpu"], "is not valid JSON"),
    ("sample", ["{W}/state_binary", "--cpu"], ".state.json"),
    ("sample", ["{W}/state_list", "--cpu"], "holds no run config"),
    ("sample", ["{W}/state_no_config", "--cpu"], "holds no run config"),
    ("sample", ["{W}/state_bad_config", "--cpu"], "must divide model.d_model"),
    ("sample", ["{W}/state_config_12M", "--cpu"], "12,692,736"),
    ("sample", ["{W}/state_data_str", "--cpu"], "'data' must be an object"),
    ("sample", ["{W}/state_data_dir_int", "--cpu"], "'data.dir' must be a path"),
    ("sample", ["{W}/no_data", "--cpu"], "meta.json"),
    # sample: checkpoints
    ("sample", ["{W}/no_checkpoint", "--cpu"], "has no checkpoint.bin yet"),
    ("sample", ["{W}/checkpoint_dir", "--cpu"], "has no checkpoint.bin yet"),
    ("sample", ["{W}/checkpoint_empty", "--cpu"], "checkpoint.bin"),
    ("sample", ["{W}/checkpoint_truncated", "--cpu"], "checkpoint.bin"),
    ("sample", ["{W}/checkpoint_random", "--cpu"], "checkpoint.bin"),
    ("sample", ["{W}/checkpoint_bit_flipped", "--cpu"], "does not match the sha256"),
    ("sample", ["{W}/checkpoint_nan", "--cpu"], "NaN"),
    ("sample", ["{W}/no_best", "--best", "--cpu"], "has no best.bin yet"),
    ("sample", ["{W}/best_file_missing", "--best", "--cpu"], "has no best.bin yet"),
    ("sample", ["{W}/best_bit_flipped", "--best", "--cpu"], "best.bin does not match the sha256"),
    ("sample", ["{W}/best_record_bad", "--best", "--cpu"], "'best' has no sha256"),

    # plot
    ("plot", [], "the following arguments are required: run_dir"),
    ("plot", ["{W}/missing"], "does not exist"),
    ("plot", ["{W}/files/afile"], "is a file, not a directory"),
    ("plot", ["{W}/no_log"], "no training log"),
    ("plot", ["{W}/log_garbage"], "no training log"),
    ("plot", [S, "--out", "{W}/nodir/loss.png"], "does not exist"),
    ("plot", [S, "--out", "{W}/files/afile/loss.png"], "is a file, not a directory"),
    ("plot", [S, "--out", "{W}/loss.txt"], "ending in .png"),
    ("plot", [S, "--out", "{W}/files/d.png"], "is a directory"),
    ("plot", [S, "--out", ""], "must be a path"),
    ("plot", [S, "--log", "yes"], "unrecognized arguments"),

    # dashboard (serve_forever is patched to fail the row: a refused row never serves)
    ("dashboard", [S, "--port", "0"], "must be a TCP port from 1 to 65535"),
    ("dashboard", [S, "--port", "70000"], "must be a TCP port"),
    ("dashboard", [S, "--port", "-1"], "must be a TCP port"),
    ("dashboard", [S, "--port", "abc"], "must be an integer"),
    ("dashboard", [S, "--port", "80.5"], "must be an integer"),
    ("dashboard", [S, "--port", "{port}"], "is in use"),
    ("dashboard", [S, "--host", "no-such-host.invalid"], "cannot resolve host"),
    ("dashboard", [S, "--host", "192.0.2.1", "--public"], "not an address of this machine"),
    ("dashboard", [S, "--host", "0.0.0.0"], "add --public if that is meant"),
    ("dashboard", [S, "--host", "192.0.2.1"], "add --public if that is meant"),
    ("dashboard", ["{W}/files/afile"], "is a file, not a run directory"),
    ("dashboard", [], "the following arguments are required"),

    # data
    ("data", [], "the following arguments are required: cmd"),
    ("data", ["fetch"], "invalid choice: 'fetch'"),
    ("data", ["download", "nope", "--out", "{W}/new"], "invalid choice: 'nope'"),
    ("data", ["download", "shakespeare"], "the following arguments are required: --out"),
    ("data", ["download", "shakespeare", "--out", "{W}/files/afile"], "is a file, not a directory"),
    ("data", ["download", "shakespeare", "--out", "{W}/files/afile/sub"], "cannot be created"),
    ("data", ["download", "shakespeare", "--out", "{W}/new", "--url", "notaurl"], "must be an http://"),
    ("data", ["download", "shakespeare", "--out", "{W}/new", "--url", "ftp://example.org/x"], "must be an http://"),
    ("data", ["download", "shakespeare", "--out", "{W}/new", "--url", "http://"], "has no host name"),
    ("data", ["download", "shakespeare", "--out", "{W}/new/a", "--url", "file://{W}/files/missing.txt"],
     "cannot download shakespeare"),
    *[("data", ["download", "shakespeare", "--out", "{W}/new", "--val-fraction", v], "argument --val-fraction")
      for v in ("0", "1", "-0.5", "1.5", "nan", "inf", "abc")],
    ("data", ["prepare", "--out", "{W}/new"], "one of the arguments --size --config is required"),
    ("data", ["prepare", "--size", "7B", "--out", "{W}/new"], "unknown size '7B'"),
    ("data", ["prepare", "--size", "tiny", "--config", "{W}/files/good.json", "--out", "{W}/new"], "not allowed"),
    ("data", ["prepare", "--size", "tiny", "--data", "{W}/files/missing.txt", "--out", "{W}/new"], "does not exist"),
    ("data", ["prepare", "--size", "tiny", "--data", "{W}/files/adir", "--out", "{W}/new"], "is a directory"),
    ("data", ["prepare", "--size", "tiny", "--data", "{W}/files/binary.bin", "--out", "{W}/new"], "is not UTF-8"),
    ("data", ["prepare", "--size", "tiny", "--data", "{W}/files/empty.txt", "--out", "{W}/new"], "is empty"),
    ("data", ["prepare", "--size", "tiny", "--data", "{W}/files/small.txt", "--out", "{W}/new"], "needs at least"),
    ("data", ["prepare", "--size", "tiny", "--data", "{W}/files/small.txt", "--out", "{W}/run/data"], "needs at least"),
    ("data", ["prepare", "--size", "tiny", "--data", "{W}/files/text.txt", "--out", "{W}/files/afile"],
     "is a file, not a directory"),

    # check, gradcheck, exercises
    ("check", ["--seed", "-5"], "argument --seed"),
    ("check", ["--seed", str(2 ** 31)], "argument --seed"),
    ("check", ["--seed", "x"], "argument --seed"),
    ("check", ["--batch", "0"], "argument --batch"),
    ("check", ["--batch", "-1"], "argument --batch"),
    ("check", ["--batch", "two"], "argument --batch"),
    ("check", ["--batch", "1000000000"], "argument --batch"),
    ("check", ["--seq", "0"], "argument --seq"),
    ("check", ["--seq", "17"], "exceeds the model's context length (16)"),
    ("check", ["--op", "nope"], "argument --op: unknown op 'nope': choose from embed, layernorm"),
    ("check", ["--recipe", "nope"], "argument --recipe: unknown recipe 'nope'"),
    ("check", ["--compile-workers", "-1"], "argument --compile-workers"),
    ("check", ["--compile-workers", "65"], "argument --compile-workers"),
    ("check", ["--recipe", "bf16-ampere", "--op", "mlp"], "argument --recipe: picks the whole model's recipe"),
    ("check", ["--size", "7B"], "unknown size '7B'"),
    ("check", ["--size", "{W}/files/missing.json"], "not found"),
    ("gradcheck", ["--seed", "-1"], "argument --seed"),
    ("gradcheck", ["--seed", "x"], "argument --seed"),
    ("gradcheck", ["--seed", str(2 ** 31)], "argument --seed"),
    ("gradcheck", ["--seed", "1.5"], "argument --seed"),
    ("gradcheck", ["--bogus"], "unrecognized arguments"),
    ("exercises", [], "the following arguments are required: cmd"),
    ("exercises", ["grade"], "the following arguments are required: dir"),
    ("exercises", ["grade", "{W}/missing"], "does not exist"),
    ("exercises", ["grade", "{W}/files/text.txt"], "is a file, not a directory"),
    ("exercises", ["grade", "{W}/files/adir"], "no student folders in"),
    ("exercises", ["grade", "{W}/files"], "no exercise files in the student folders"),
    ("exercises", ["grade", "{W}/files", "--csv", "{W}/nodir/grades.csv"], "does not exist"),
    ("exercises", ["grade", "{W}/files", "--csv", "{W}/files/grades.txt"], "ending in .csv"),
    *[("exercises", ["grade", "{W}/files", "--timeout", v], "argument --timeout") for v in ("0", "-5", "nan", "x", "1e9")],
    *[("exercises", ["grade", "{W}/files", "--jobs", v], "argument --jobs") for v in ("0", "x", "1000")],
    ("exercises", ["check", "attn_bwd", "--timeout", "0"], "argument --timeout"),
    ("exercises", ["check", "nope"], "unknown exercise 'nope'"),
    ("exercises", ["check", "all", "--seed", "x"], "argument --seed"),
    ("exercises", ["check", "attn_bwd", "--seed", "-1"], "argument --seed"),
    ("exercises", ["check", "attn_bwd", "--file", "{W}/files/missing.py"], "does not exist"),
    ("exercises", ["check", "attn_bwd", "--file", "{W}/files/adir"], "is a directory"),
    ("exercises", ["check", "all", "--file", "{W}/files/text.txt"], "--file grades one exercise"),
    ("exercises", ["list", "--dir", "{W}/missing"], "does not exist"),

    # train --kernel EXERCISE=FILE: refused before a run directory is made (K: a new run's arguments)
    *[("train", [*K, "--kernel", flag], words) for flag, words in (
        ("k_loss_bwd", "argument --kernel: must be EXERCISE=FILE"),
        ("={W}/files/text.txt", "argument --kernel: must be EXERCISE=FILE"),
        ("k_nope={W}/files/text.txt", "unknown exercise 'k_nope': choose from k_layernorm_bwd, k_loss_bwd"),
        ("loss_bwd={W}/files/text.txt", "loss_bwd is a NumPy exercise"),
        ("k_residual_add_bwd={W}/files/text.txt", "k_residual_add_bwd cannot train"),
        ("k_loss_bwd={W}/files/missing.py", "does not exist"),
        ("k_loss_bwd={W}/files/adir", "is a directory, not a file"),
        ("k_loss_bwd={W}/files/text.txt", "does not pass the grader (error)"))],      # not Python: graded, refused
    ("train", [*K, "--precision", "bf16", "--kernel", "k_loss_bwd={W}/files/text.txt"], "the fp32 recipe only"),
    ("train", [*K, "--kernel", "k_loss_bwd={W}/files/text.txt", "--kernel", "k_loss_bwd={W}/files/text.txt"],
     "--kernel k_loss_bwd is given twice"),
    ("train", ["--resume", S, "--kernel", "k_loss_bwd={W}/files/text.txt"], "--kernel cannot be given with --resume"),

    # bench
    ("lab/bench/kernels", ["nope"], "unknown op 'nope': choose from all, embed"),
    ("lab/bench/kernels", ["attn", "--seed", "-1"], "argument --seed"),
    ("lab/bench/kernels", ["attn", "--shape", "0,4"], "argument --shape"),
    ("lab/bench/kernels", ["attn", "--shape", "1,2,3"], "argument --shape"),
    ("lab/bench/kernels", ["attn", "--shape", "abc"], "argument --shape"),
    ("lab/bench/kernels", ["attn", "--sizes", "7B"], "unknown size '7B'"),
    ("lab/bench/kernels", ["attn", "--sizes", "tiny,,12M"], "argument --sizes"),
    ("lab/bench/kernels", ["attn", "--json", "{W}/nodir/out.json"], "does not exist"),
    ("lab/bench/kernels", ["attn", "--markdown", "{W}/out.txt"], "ending in .md"),
    ("lab/bench/gpu_checks", [], "the following arguments are required: --out"),
    ("lab/bench/gpu_checks", ["--out", "{W}/files/afile"], "is a file, not a directory"),
    ("lab/bench/gpu_checks", ["--out", "{W}/new", "--ops", "nope"], "unknown op 'nope'"),
    ("lab/bench/gpu_checks", ["--out", "{W}/new", "--check", "7B"], "unknown size '7B'"),
    ("lab/bench/gpu_checks", ["--out", "{W}/new", "--seed", "x"], "argument --seed"),
    ("lab/bench/step_time", ["--iters", "0"], "argument --iters"),
    ("lab/bench/step_time", ["--sizes", "7B"], "invalid choice: '7B'"),
    ("lab/bench/step_time", ["--json", "{W}/nodir/x.json"], "does not exist"),
    ("lab/bench/step_time", ["--recipe", "fp8"], "invalid choice: 'fp8'"),
    ("lab/bench/step_time", ["--flash-version", "1"], "invalid choice: 1"),
    ("lab/bench/step_time", ["--mlp-version", "4"], "invalid choice: 4"),
    ("lab/bench/profile_kernels", ["run", "--log", "{W}/l.json", "--mlp-version", "4"], "invalid choice: 4"),
    ("lab/bench/splitk_sweep", ["--json", "{W}/out.txt"], "ending in .json"),
    ("lab/bench/splitk_sweep", [], "the simulator has nothing to time"),
    ("lab/bench/decode_speed", ["--size", "7B"], "7B"),
    ("lab/bench/decode_speed", ["--tokens", "0"], "argument --tokens"),
    ("lab/bench/decode_speed", ["--json", "{W}/nodir/d.json"], "does not exist"),
    ("lab/bench/decode_speed", [], "needs a CUDA GPU"),
    ("lab/bench/decode_speed", ["--precision", "fp8"], "argument --precision"),
    ("lab/bench/decode_speed", ["--precision", "bf16"], "with --no-blocks"),
    ("lab/bench/decode_speed", ["--once"], "goes with --kernels"),
    ("lab/bench/decode_parts", ["--size", "7B"], "7B"),
    ("lab/bench/decode_parts", ["--json", "{W}/nodir/d.json"], "does not exist"),
    ("lab/bench/decode_parts", [], "needs a CUDA GPU"),
    ("lab/bench/decode_parts", ["--once", "--size", "7B"], "7B"),
    ("lab/bench/ncu_text", [], "the following arguments are required: report"),
    ("lab/bench/ncu_text", ["{W}/none.txt"], "does not exist"),
    ("lab/bench/ncu_text", ["{W}/files/text.txt"], "no profiled kernel in it"),
    ("lab/bench/flash_wgmma", ["--repeats", "0"], "argument --repeats"),
    ("lab/bench/flash_wgmma", ["--markdown", "{W}/out.txt"], "ending in .md"),
    ("lab/bench/flash_wgmma", ["--sizes", "7B"], "invalid choice"),
    ("lab/bench/start_time", ["--repeats", "0"], "argument --repeats"),
    ("lab/bench/start_time", ["--size", "7B"], "7B"),
    ("lab/bench/start_time", ["--out", "{W}/out.txt"], "ending in .json"),
    ("lab/bench/start_time", ["--precision", "fp64"], "argument --precision"),
    ("lab/bench/start_time", [], "the simulator compiles nothing"),
    ("lab/bench/like_for_like", ["--iters", "0"], "argument --iters"),
    ("lab/bench/like_for_like", ["--repeats", "1"], "argument --repeats"),
    ("lab/bench/like_for_like", ["--sizes", "7B"], "invalid choice: '7B'"),
    ("lab/bench/like_for_like", ["--precisions", "fp16"], "invalid choice: 'fp16'"),
    ("lab/bench/like_for_like", ["--markdown", "{W}/out.txt"], "ending in .md"),
    ("lab/bench/like_for_like", ["--json", "{W}/nodir/x.json"], "does not exist"),
    ("lab/bench/like_for_like", [], "lab/bench/like_for_like.py needs"),     # PyTorch, or a GPU: neither here
    ("lab/bench/gemm", ["--timing", "wall"], "invalid choice: 'wall'"),
    ("lab/bench/profile_kernels", [], "the following arguments are required: cmd"),
    ("lab/bench/profile_kernels", ["run", "--size", "7B", "--log", "{W}/l.json"], "unknown size '7B'"),
    ("lab/bench/profile_kernels", ["run"], "the following arguments are required: --log"),
    ("lab/bench/profile_kernels", ["table", "--log", "{W}/none.json", "--ncu", "{W}/none.csv"], "does not exist"),
    ("lab/bench/profile_kernels", ["table", "--log", "{W}/files/good.json", "--ncu", "{W}/files/text.txt"], "is not a launch log"),
    ("lab/bench/gemm", ["--versions", "2,x"], "argument --versions"),
    ("lab/bench/gemm", ["--versions", "99"], "argument --versions"),
    ("lab/bench/gemm", ["--versions", "9"], "times the products on a GPU"),      # valid, but the simulator has no GPU
    ("lab/bench/gemm", ["--json", "{W}/nodir/x.json"], "does not exist"),
    ("lab/bench/gemm_ablate", ["--bogus"], "unrecognized arguments: --bogus"),
    ("lab/bench/ncu_gemm", [], "the following arguments are required: --shape"),
    ("lab/bench/ncu_gemm", ["--shape", "nope"], "no shape matches ['nope']"),
    ("lab/bench/ncu_gemm", ["--shape", "4096", "--version", "99"], "no matmul version 99"),
    ("lab/bench/tf32_check", ["--fast"], "unrecognized arguments: --fast"),
    ("lab/bench/profile_step", ["--size", "7B"], "unknown size '7B'"),
    ("lab/bench/profile_step", ["--iters", "-1"], "argument --iters"),
    ("lab/bench/gpu_graph", [], "the following arguments are required: --out"),
    ("lab/bench/gpu_graph", ["--out", "{W}/files/afile"], "is a file, not a directory"),
    ("lab/bench/gpu_graph", ["--out", "{W}/new", "--steps", "2"], "argument --steps"),
    ("lab/bench/gpu_graph", ["--out", "{W}/new", "--sizes", "7B"], "unknown size '7B'"),
    ("lab/bench/gpu_graph", ["--out", "{W}/new", "--dropout", "0,1"], "argument --dropout"),
    ("lab/bench/gpu_graph", ["--out", "{W}/new", "--dropout", "x"], "argument --dropout"),
    ("lab/bench/precision_runs", [], "the following arguments are required: --out"),
    ("lab/bench/precision_runs", ["--out", "{W}/new", "--precisions", "fp32,fp8"], "argument --precisions"),
    ("lab/bench/precision_runs", ["--out", "{W}/new", "--precisions", "bf16,bf16"], "argument --precisions"),
    ("lab/bench/precision_runs", ["--out", "{W}/new", "--steps", "0"], "argument --steps"),
    ("lab/bench/precision_runs", ["--out", "{W}/files/afile"], "is a file, not a directory"),
]


def _row_id(row):
    tool, argv, _ = row
    text = " ".join(a.replace("{W}/files/", "").replace("{W}/", "") for a in argv)
    return f"{tool} {text}"[:80]


@pytest.mark.parametrize("row", ROWS, ids=[_row_id(r) for r in ROWS])
def test_bad_input_is_one_line_and_exit_2_and_changes_nothing(row, world, busy_port, tools, capsys, monkeypatch):
    tool, argv, words = row
    argv = [a.replace("{W}", str(world)).replace("{port}", str(busy_port)) for a in argv]
    if "192.0.2.1" in argv:                          # a machine may own a test address: then it is no error
        with socket.socket() as s:
            try:
                s.bind(("192.0.2.1", 0))
                pytest.skip("this machine can bind 192.0.2.1")
            except OSError:
                pass

    def never(*a, **k):
        raise AssertionError("the dashboard started serving: the row was not refused")
    monkeypatch.setattr(http.server.ThreadingHTTPServer, "serve_forever", never)
    before = _snapshot(world)
    try:
        code = tools[tool](argv)
    except SystemExit as e:
        code = e.code
    out, err = capsys.readouterr()
    lines = err.splitlines()
    assert code == 2, (code, out, err)
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert words in lines[0], lines[0]
    assert "Traceback" not in out + err
    assert _snapshot(world) == before


# ------------------------------------------------------------------------------------------------
# positive controls: the world's run is one the tools accept, so the refusals above are the rows'


def test_the_world_run_samples_and_plots(world, tmp_path, capsys):
    run = world / "run"
    for extra, what in (([], "latest checkpoint at step 2"), (["--best"], "best checkpoint, val loss 5.4100 at step 1")):
        code = sample.main([str(run), "--cpu", "--tokens", "3", "--prompt", "the ", "--seed", "1", *extra])
        out, err = capsys.readouterr()
        assert code == 0 and out.startswith("the ") and what in err, err
    out_png = tmp_path / "loss.png"
    plot.main([str(run), "--out", str(out_png)])
    assert out_png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert config.main(["--size", "tiny"]) == 0
    assert data.main(["prepare", "--size", "tiny", "--data", str(world / "files" / "text.txt"),
                      "--out", str(tmp_path / "prep")]) == 0


def test_a_checkpoint_written_again_is_accepted_under_the_previous_sha(world, tmp_path, capsys):
    """While the trainer replaces checkpoint.bin, .state.json holds the new and the previous sha256:
    sample accepts either, as resume does."""
    run = tmp_path / "run"
    shutil.copytree(world / "run", run)
    state = json.loads((run / STATE_FILE).read_text())
    state["previous_checkpoint_sha256"], state["checkpoint_sha256"] = state["checkpoint_sha256"], "0" * 64
    (run / STATE_FILE).write_text(json.dumps(state))
    assert sample.main([str(run), "--cpu", "--tokens", "2"]) == 0
    capsys.readouterr()


# ------------------------------------------------------------------------------------------------
# the benchmarks as the docs write them: python lab/bench/NAME.py from a checkout's root, with
# nothing on PYTHONPATH (the project installed, lab/ not): each finds lab/ itself

@pytest.mark.parametrize("script", sorted(p.name for p in (ROOT / "lab" / "bench").glob("*.py")))
def test_every_benchmark_answers_help_as_the_docs_run_it(script):
    """Its usage and exit 0, or one `error:` line and exit 2 (a library or a GPU it needs is missing
    here): never a traceback."""
    import subprocess
    import sys
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["NUMBA_ENABLE_CUDASIM"] = "1"
    p = subprocess.run([sys.executable, f"lab/bench/{script}", "--help"], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=120)
    assert "Traceback" not in p.stderr, p.stderr[-800:]
    assert (p.returncode == 0 and "usage:" in p.stdout) or \
        (p.returncode == 2 and p.stderr.startswith("error: ") and len(p.stderr.strip().splitlines()) == 1), \
        (p.returncode, p.stdout[-300:], p.stderr[-300:])
