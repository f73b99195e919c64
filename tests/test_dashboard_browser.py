"""The live dashboard in a real browser: headless Chromium loads the page from a server on 127.0.0.1,
runs its fetches and draws; the tests read what it drew from the DOM (each canvas records the points
of its series in data-points, its last step in data-last-step and its y-axis labels in data-y-ticks)
and from a screenshot.

Without a Chromium the tests are skipped, except in CI (CI=true), where that is a failure: .ci/run
installs one (Debian's chromium package).
"""
import html.parser
import json
import math
import os
import shutil
import signal
import subprocess
import threading
import time

import matplotlib.image
import numpy as np
import pytest

from andrea_numba.atomic import atomic_write_json
from andrea_numba.dashboard import make_server
from andrea_numba.runlog import LOSS_FILE, SAMPLES_FILE, STATE_FILE

pytestmark = [pytest.mark.xdist_group("browser")]   # one worker of `pytest -n` runs the module: its module fixture once

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
IN_CI = os.environ.get("CI", "").lower() in ("true", "1", "yes")
BROWSER_TIMEOUT_S = 60           # wall seconds for the whole browser run (it takes about 2)
VIRTUAL_TIME_MS = 3000           # page time before the DOM and the screenshot are taken: two polls
WINDOW = (1280, 1000)            # CSS pixels, at a device scale factor of 1

STEPS, TOTAL, EVAL_EVERY, SKIPPED, SECONDS_PER_STEP = 47, 200, 10, 13, 0.55
# the colour of each chart's line (the page's), in the screenshot
LINE_COLOURS = {"c_loss": "#1f77b4", "c_lr": "#2ca02c", "c_gn": "#d62728", "c_tps": "#9467bd"}
VAL_COLOUR = "#ff7f0e"           # the validation dots of the loss chart


def chromium() -> str:
    """The path of a Chromium; a skip without one, or a failure in CI."""
    for name in BROWSERS:
        path = shutil.which(name)
        if path:
            return path
    if IN_CI:
        pytest.fail(f"no Chromium on PATH (looked for {', '.join(BROWSERS)}): CI tests the dashboard in a "
                    "browser; .ci/run installs Debian's chromium package")
    pytest.skip(f"no Chromium on PATH (looked for {', '.join(BROWSERS)}): apt-get install chromium to run "
                "the dashboard in a browser")


def write_run(run_dir, now: float):
    """A run 47 steps into 200, as the trainer writes it: a loss line per step (validation every 10
    steps; step 13 was skipped by the loss scaler, so it has no gradient norm), two samples, a state.
    The last step was 1 second ago: the page shows it as training."""
    rows = []
    for s in range(1, STEPS + 1):
        row = {"step": s, "train_loss": 2.1 + 8.8 * math.exp(-s / 12) + 0.03 * math.sin(s),
               "lr": 1e-3, "grad_norm": None if s == SKIPPED else 0.4 + 3.0 / s,
               "tokens_per_s": 31000.0 + 900.0 * math.sin(s / 5) + 0.37,
               "time": now - 1.0 - (STEPS - s) * SECONDS_PER_STEP}
        if s % EVAL_EVERY == 0:
            row["val_loss"] = row["train_loss"] + 0.07
        if s == SKIPPED:
            row["skipped"] = True
        row["elapsed_s"] = round(s * SECONDS_PER_STEP, 3)
        rows.append(row)
    (run_dir / LOSS_FILE).write_text("".join(json.dumps(r) + "\n" for r in rows))
    samples = [{"step": 20, "prompt": "ROMEO:", "text": " What, ho!", "time": now - 15},
               {"step": 40, "prompt": "ROMEO:", "text": " O, she doth <b>teach</b> the torches & burn bright!\n"
                                                       "JULIET: é", "time": now - 4}]
    (run_dir / SAMPLES_FILE).write_text("".join(json.dumps(s) + "\n" for s in samples))
    state = {"step": 40, "config": {"name": "browser-test", "train": {"steps": TOTAL, "batch_size": 8, "seq_len": 64}},
             "tokens_seen": 40 * 8 * 64, "checkpoint": "checkpoint.bin",
             "best": {"file": "best.bin", "step": 40, "val_loss": rows[39]["val_loss"]}, "time": now - 4}
    atomic_write_json(run_dir / STATE_FILE, state)
    return rows, samples, state


def run_browser(browser: str, url: str, profile, screenshot) -> str:
    """The page's DOM after VIRTUAL_TIME_MS of page time, and its screenshot written to `screenshot`.
    Chromium is kept off every address but the page's: no background services, and every host name
    resolves to nothing. The browser's processes are killed if it outlives BROWSER_TIMEOUT_S."""
    args = [browser, "--headless=new", "--disable-gpu", f"--user-data-dir={profile}",
            "--no-first-run", "--no-default-browser-check", "--disable-extensions", "--disable-sync",
            "--disable-background-networking", "--disable-component-update",
            "--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE 127.0.0.1",
            f"--window-size={WINDOW[0]},{WINDOW[1]}", "--force-device-scale-factor=1", "--hide-scrollbars",
            f"--virtual-time-budget={VIRTUAL_TIME_MS}", f"--screenshot={screenshot}", "--dump-dom", url]
    if os.geteuid() == 0:
        args.insert(2, "--no-sandbox")           # Chromium refuses to run as root with its sandbox
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)   # its own process group: the renderers go with it
    try:
        out, err = proc.communicate(timeout=BROWSER_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate(timeout=10)
        pytest.fail(f"Chromium did not finish in {BROWSER_TIMEOUT_S} s")
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)      # any process of the browser still running
        except ProcessLookupError:
            pass
    assert proc.returncode == 0 and "</html>" in out, f"Chromium exited with {proc.returncode}:\n{err[-3000:]}"
    return out


class Elements(html.parser.HTMLParser):
    """The text and the attributes of every element with an id (none of the page's nest)."""

    def __init__(self, dom: str):
        super().__init__()
        self.text, self.attrs, self.open = {}, {}, None
        self.feed(dom)

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if "id" in attrs:
            self.open = attrs["id"]
            self.text[self.open], self.attrs[self.open] = "", attrs

    def handle_endtag(self, tag):
        self.open = None

    def handle_data(self, data):
        if self.open:
            self.text[self.open] += data


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    """The run's files, the page's elements and the path of its screenshot, from one browser run."""
    browser = chromium()
    run_dir = tmp_path_factory.mktemp("run")
    rows, samples, state = write_run(run_dir, time.time())
    server = make_server(run_dir, "127.0.0.1", 0)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    screenshot = run_dir / "page.png"
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/"
        dom = run_browser(browser, url, tmp_path_factory.mktemp("profile"), screenshot)
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
    assert not thread.is_alive()
    return {"rows": rows, "samples": samples, "state": state, "page": Elements(dom), "screenshot": screenshot}


def duration(sec: float) -> str:
    """The page's duration(): 1h 2m, 3m 4s, 5s."""
    h, m, s = int(sec // 3600), int(sec % 3600 // 60), int(sec % 60)
    return f"{h}h {m}m" if h else f"{m}m {s}s" if m else f"{s}s"


def test_the_page_shows_the_run(page):
    rows, samples, state, text = page["rows"], page["samples"], page["state"], page["page"].text
    last, val = rows[-1], [r for r in rows if "val_loss" in r][-1]
    assert text["title"] == "browser-test"
    assert text["status"] == "training"
    assert text["step"] == f"{STEPS} / {TOTAL}"
    assert text["loss"] == f"{last['train_loss']:.4f}"
    assert val["step"] == 40 and text["val"] == f"{val['val_loss']:.4f} (step 40)"
    assert text["tps"] == f"{math.floor(last['tokens_per_s'] + 0.5):,}"
    first = rows[-21]                              # the page's speed: seconds per step over the last 20 steps
    eta = (TOTAL - last["step"]) * (last["time"] - first["time"]) / (last["step"] - first["step"])
    assert text["eta"] == duration(eta) == "1m 24s"
    sample = samples[-1]
    assert text["sample_h"] == f"latest sample (step {sample['step']})"
    assert text["sample"] == f"prompt {json.dumps(sample['prompt'])}\n\n{sample['text']}"   # as text, not markup
    assert json.loads(text["state"]) == state


def test_each_chart_drew_every_point(page):
    attrs = page["page"].attrs
    n_val = STEPS // EVAL_EVERY
    drawn = {"c_loss": f"{STEPS} {STEPS} {n_val}",   # train, its moving average, validation
             "c_lr": f"{STEPS}", "c_gn": f"{STEPS - 1}", "c_tps": f"{STEPS}"}   # the skipped step has no norm
    for canvas, points in drawn.items():
        assert attrs[canvas].get("data-points") == points, canvas
        assert attrs[canvas].get("data-last-step") == str(STEPS), canvas
        ticks = attrs[canvas].get("data-y-ticks", "").split()      # a flat learning rate's too: 1e-3 at every step
        assert len(ticks) >= 3 and len(set(ticks)) == len(ticks), (canvas, ticks)


def pixels_of(image: np.ndarray, colour: str, tol: float = 0.05) -> np.ndarray:
    """A mask of the pixels of `image` (H, W, 3 in [0, 1]) that are `colour` laid over the white of a
    card with an opacity of at least one half (a line's antialiased edges included): p = a c + (1 - a)."""
    c = np.array([int(colour[i:i + 2], 16) / 255 for i in (1, 3, 5)])
    a = ((1 - image[:, :, :3]) * (1 - c)).sum(axis=2) / ((1 - c) ** 2).sum()      # least squares
    residual = np.abs(1 - a[:, :, None] * (1 - c) - image[:, :, :3]).max(axis=2)
    return (residual <= tol) & (a >= 0.5)


def test_the_screenshot_shows_the_charts(page):
    """Each chart's line crosses most of its plot (about 500 pixels wide at this window size), and the
    loss chart has its validation dots: the colours are the page's, drawn nowhere else but in the
    legend's 8 x 8 squares."""
    image = matplotlib.image.imread(page["screenshot"])
    assert image.shape[:2] == (WINDOW[1], WINDOW[0])
    for canvas, colour in LINE_COLOURS.items():
        mask = pixels_of(image, colour)
        columns = np.flatnonzero(mask.any(axis=0))
        assert mask.sum() > 300 and columns.size and columns[-1] - columns[0] > 350, \
            f"{canvas}: {mask.sum()} pixels of {colour} in columns {columns[:1]}..{columns[-1:]}"
    dots = pixels_of(image, VAL_COLOUR).sum() - 8 * 8
    assert dots > 15 * (STEPS // EVAL_EVERY), f"{dots} pixels of the validation dots"
