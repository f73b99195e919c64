"""The run-directory readers, the PNG plot and the live dashboard server, on a synthetic run."""
import http.client
import json
import subprocess
import sys
import threading

import pytest

from andrea_numba import runlog
from andrea_numba.dashboard import make_server
from andrea_numba.plot import plot_run

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _row(step, loss, **extra):
    return {"step": step, "train_loss": loss, "lr": 1e-3 * min(1, step / 5), "grad_norm": 1.0 / step,
            "tokens_per_s": 1000.0 + step, "time": 1.7e9 + step, **extra}


@pytest.fixture
def run_dir(tmp_path):
    """Steps 1..12, evaluation every 4 steps; a resume from step 8 rewrites steps 9 and 10;
    the last line is half-written."""
    rows = [_row(s, 10.0 - 0.5 * s, **({"val_loss": 10.5 - 0.5 * s} if s % 4 == 0 else {}))
            for s in range(1, 11)]
    rows += [_row(9, 5.0), _row(10, 4.5), _row(11, 4.0), _row(12, 3.5, val_loss=3.9)]  # the resumed run
    lines = [json.dumps(r) for r in rows] + ['{"step": 13, "train_loss": 3.']
    (tmp_path / ".loss.json").write_text("\n".join(lines))
    samples = [{"step": 6, "prompt": "Once", "text": " upon a", "time": 1.7e9},
               {"step": 12, "prompt": "Once", "text": " upon a time", "time": 1.7e9 + 12}]
    (tmp_path / ".samples.json").write_text("".join(json.dumps(s) + "\n" for s in samples) + '{"step": 1')
    state = {"step": 12, "config": {"name": "ANDREA-test", "model": {}, "train": {"steps": 100}},
             "tokens_seen": 12 * 4096}
    (tmp_path / ".state.json").write_text(json.dumps(state))
    return tmp_path


def test_read_loss_last_line_per_step_wins(run_dir):
    rows = runlog.read_loss(run_dir)
    assert [r["step"] for r in rows] == list(range(1, 13))          # sorted, unique, truncated 13 gone
    assert rows[8]["train_loss"] == 5.0 and rows[9]["train_loss"] == 4.5   # the resumed lines won
    assert [r["step"] for r in rows if "val_loss" in r] == [4, 8, 12]


def test_read_samples_and_state(run_dir, tmp_path_factory):
    samples = runlog.read_samples(run_dir)
    assert [s["step"] for s in samples] == [6, 12]
    assert runlog.read_state(run_dir)["config"]["name"] == "ANDREA-test"
    empty = tmp_path_factory.mktemp("empty")
    assert runlog.read_loss(empty) == [] and runlog.read_samples(empty) == []
    assert runlog.read_state(empty) is None
    assert runlog.read_loss(empty / "missing") == []


def test_read_run_state_refuses_with_one_line(run_dir, tmp_path_factory):
    assert runlog.read_run_state(run_dir)["step"] == 12
    bad = tmp_path_factory.mktemp("bad")
    for text, message in ((None, "has no .state.json: it is not a run directory"),
                          ('{"step": ', "is not valid JSON"), ('{"step": 3}', "holds no run config")):
        if text is not None:
            (bad / ".state.json").write_text(text)
        with pytest.raises(runlog.RunDirError) as e:
            runlog.read_run_state(bad)
        assert message in str(e.value) and "\n" not in str(e.value)


def test_the_data_directory_on_record(tmp_path):
    run = tmp_path / "run"
    assert runlog.data_dir_record(run, run / "data") == "data"               # moves with the run
    assert runlog.data_dir_record(run, tmp_path / "shared") == str((tmp_path / "shared").resolve())
    assert runlog.data_dir_of(run, {"data": {"dir": "data"}}) == run / "data"
    assert runlog.data_dir_of(run, {"data": {"dir": str(tmp_path / "shared")}}) == tmp_path / "shared"
    assert runlog.data_dir_of(run, None) == run / runlog.DATA_DIR


def test_plot_run_writes_png(run_dir, tmp_path):
    path = plot_run(run_dir)
    assert path == run_dir / "loss.png"
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE and len(data) > 5000
    out = plot_run(run_dir, tmp_path / "sub" / "log.png", log=True)
    assert out.read_bytes()[:8] == PNG_SIGNATURE


def test_plot_cli_without_log_exits_2(tmp_path):
    (tmp_path / ".loss.json").write_text('{"step": 1, "train_lo')   # present but nothing parses
    for d, message in ((tmp_path, "error: no training log in "),
                       (tmp_path / "missing", "error: argument run_dir: directory ")):
        proc = subprocess.run([sys.executable, "-m", "andrea_numba.plot", str(d)],
                              capture_output=True, text=True, timeout=60)
        assert proc.returncode == 2
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(message), lines
        assert "python -m andrea_numba.train" in lines[0] or "does not exist" in lines[0]
        assert not (d / "loss.png").exists()


@pytest.fixture
def serve():
    """serve(run_dir) -> get(path) -> (status, content_type, body); servers are shut down after the test."""
    servers = []

    def start(run_dir):
        server = make_server(run_dir, "127.0.0.1", 0)
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        servers.append((server, thread))

        def get(path):
            conn = http.client.HTTPConnection("127.0.0.1", server.server_address[1], timeout=5)
            conn.request("GET", path)                 # the raw path: no client-side normalising of ../
            resp = conn.getresponse()
            out = resp.status, resp.getheader("Content-Type"), resp.read()
            conn.close()
            return out
        return get

    yield start
    for server, thread in servers:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
        assert not thread.is_alive()


def test_dashboard_routes(run_dir, serve):
    get = serve(run_dir)
    status, ctype, body = get("/")
    assert status == 200 and ctype.startswith("text/html")
    assert b"<canvas" in body and b"/loss.json" in body and b"<script src" not in body
    status, ctype, body = get("/loss.json?t=1")
    assert status == 200 and ctype == "application/json"
    assert json.loads(body) == runlog.read_loss(run_dir)
    assert json.loads(get("/samples.json")[2])[-1]["text"] == " upon a time"
    assert json.loads(get("/state.json")[2])["step"] == 12
    for path in ("/../pyproject.toml", "/pyproject.toml", "/.loss.json", "/.state.json",
                 "/loss.json/../.state.json", "//etc/passwd", "/%2e%2e/pyproject.toml", "/favicon.ico"):
        assert get(path)[0] == 404, path


def test_dashboard_before_the_first_step_and_nan(tmp_path, serve):
    get = serve(tmp_path / "not-yet")                 # the trainer has not created the directory yet
    assert json.loads(get("/loss.json")[2]) == []
    assert json.loads(get("/samples.json")[2]) == []
    assert json.loads(get("/state.json")[2]) is None
    assert b"waiting for the first step" in get("/")[2]
    (tmp_path / "not-yet").mkdir()
    (tmp_path / "not-yet" / ".loss.json").write_text('{"step": 1, "train_loss": NaN, "lr": Infinity}\n')
    rows = json.loads(get("/loss.json")[2])           # strict JSON: NaN and inf become null
    assert rows == [{"step": 1, "train_loss": None, "lr": None}]


def test_the_dashboard_serves_other_machines_only_when_told_and_then_warns(tmp_path, monkeypatch, capsys):
    """The page has no authentication: a --host other machines can reach (0.0.0.0) is refused in one
    line without --public, and served with a warning with it; loopback needs neither."""
    from andrea_numba import dashboard as D
    assert D.loopback_only("127.0.0.1") and D.loopback_only("localhost") and not D.loopback_only("0.0.0.0")

    class Served:
        server_address = ("0.0.0.0", 8123)

        def serve_forever(self):
            raise KeyboardInterrupt

        def server_close(self):
            pass
    bound = []
    monkeypatch.setattr(D, "make_server", lambda run_dir, host, port: bound.append(host) or Served())
    with pytest.raises(SystemExit) as e:
        D.main([str(tmp_path), "--host", "0.0.0.0"])
    assert e.value.code != 0 and bound == []
    assert "add --public" in capsys.readouterr().err
    D.main([str(tmp_path), "--host", "0.0.0.0", "--public"])
    out = capsys.readouterr()
    assert bound == ["0.0.0.0"] and "warning:" in out.err and "no authentication" in out.err
    D.main([str(tmp_path)])
    assert bound == ["0.0.0.0", "127.0.0.1"] and "warning" not in capsys.readouterr().err
