"""A live loss dashboard in the browser, served by the standard library alone.

    python -m andrea_numba.dashboard runs/12M                 # then open http://127.0.0.1:8000/
    python -m andrea_numba.dashboard runs/12M --port 8080 --open

The server answers four routes and nothing else (every other path is a 404; no file on disk is
ever served by name):

    /               the page: HTML with inline JavaScript, no external libraries, no network
    /loss.json      andrea_numba.runlog.read_loss(RUN_DIR) as a JSON array
    /samples.json   read_samples(RUN_DIR) as a JSON array
    /state.json     read_state(RUN_DIR) as a JSON object (null before the first save)

Every 2 seconds the page fetches the three JSON routes and redraws its <canvas> charts (train and
validation loss, learning rate, gradient norm, tokens/s against step), the step counter, ETA, the
latest text sample and the state. The files are re-read on every request, so the page follows a
run while it trains, and shows "waiting for the first step" before the trainer has written anything.

    server = make_server("runs/12M", "127.0.0.1", 0)   # port 0: any free port (tests)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    ...; server.shutdown(); server.server_close()
"""
from __future__ import annotations

import argparse
import errno
import ipaddress
import json
import math
import socket
import sys
import webbrowser
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlsplit

from andrea_numba import cli
from andrea_numba.runlog import read_loss, read_samples, read_state

PAGE = r"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>andrea-numba dashboard</title>
<style>
 body { font: 14px system-ui, sans-serif; margin: 0; background: #f6f7f9; color: #222; }
 header { background: #fff; border-bottom: 1px solid #ddd; padding: 12px 24px; }
 h1 { font-size: 18px; margin: 0 0 8px; }
 #stats { display: flex; flex-wrap: wrap; gap: 24px; color: #555; }
 #stats b { color: #111; font-variant-numeric: tabular-nums; }
 main { display: grid; grid-template-columns: repeat(auto-fit, minmax(420px, 1fr)); gap: 16px; padding: 16px 24px; }
 .card { background: #fff; border: 1px solid #ddd; border-radius: 6px; padding: 10px 12px; }
 .card h2 { font-size: 13px; margin: 0 0 6px; color: #444; font-weight: 600; }
 canvas { width: 100%; height: 240px; display: block; }
 pre { white-space: pre-wrap; word-break: break-word; margin: 0; max-height: 260px; overflow: auto; font-size: 12px; }
 #status.waiting { color: #b26b00; } #status.error { color: #c0392b; }
</style></head><body>
<header><h1 id="title">andrea-numba</h1><div id="stats">
 <span>status <b id="status">loading</b></span><span>step <b id="step">-</b></span>
 <span>train loss <b id="loss">-</b></span><span>val loss <b id="val">-</b></span>
 <span>tokens/s <b id="tps">-</b></span><span>ETA <b id="eta">-</b></span></div></header>
<main>
 <div class="card"><h2>loss</h2><canvas id="c_loss"></canvas></div>
 <div class="card"><h2>learning rate</h2><canvas id="c_lr"></canvas></div>
 <div class="card"><h2>gradient norm</h2><canvas id="c_gn"></canvas></div>
 <div class="card"><h2>tokens / s</h2><canvas id="c_tps"></canvas></div>
 <div class="card"><h2 id="sample_h">latest sample</h2><pre id="sample">no sample yet</pre></div>
 <div class="card"><h2>state</h2><pre id="state">no state yet</pre></div>
</main>
<script>
const $ = id => document.getElementById(id);
const fin = v => typeof v === "number" && isFinite(v);
let last = {loss: [], samples: [], state: null};

function fmt(v, digits = 1) {     // short tick / stat label; more digits tell close ticks apart
  if (!fin(v)) return "-";
  const a = Math.abs(v);
  if (a !== 0 && (a < 1e-2 || a >= 1e6)) return v.toExponential(digits);
  return a >= 100 ? v.toFixed(0) : +v.toPrecision(digits + 2) + "";
}
function tickLabels(ts) {         // the fewest digits that give every tick a label of its own
  for (let d = 1; d < 6; d++) {
    const labels = ts.map(t => fmt(t, d));
    if (new Set(labels).size === labels.length) return labels;
  }
  return ts.map(t => String(t));
}
function niceTicks(lo, hi, n) {    // about n round numbers (1, 2, 5 x 10^k) covering [lo, hi]
  const raw = (hi - lo) / n, p = Math.pow(10, Math.floor(Math.log10(raw)));
  const step = [1, 2, 5, 10].map(m => m * p).find(s => s >= raw);
  const out = [];
  for (let t = Math.ceil(lo / step) * step; t <= hi + 1e-9 * step; t += step) out.push(t);
  return out;
}
function ema(ys, beta) {           // bias-corrected exponential moving average
  let m = 0; return ys.map((y, i) => (m = beta * m + (1 - beta) * y) / (1 - Math.pow(beta, i + 1)));
}
function pick(rows, key) {         // [[step, value]] of the rows with a finite value under key
  return rows.filter(r => fin(r[key])).map(r => [r.step, r[key]]);
}

// series: [{pts: [[x, y]], color, width, dots, label}]
function chart(canvas, series, ylabel) {
  const dpr = window.devicePixelRatio || 1, W = canvas.clientWidth, H = canvas.clientHeight;
  canvas.width = W * dpr; canvas.height = H * dpr;
  const g = canvas.getContext("2d"); g.scale(dpr, dpr); g.clearRect(0, 0, W, H);
  g.font = "11px system-ui, sans-serif";
  const all = series.flatMap(s => s.pts);
  canvas.dataset.points = series.map(s => s.pts.length).join(" ");   // what was drawn: tests/test_dashboard_browser.py
  canvas.dataset.lastStep = "";
  if (!all.length) { g.fillStyle = "#999"; g.fillText("waiting for the first step", W / 2 - 70, H / 2); return; }
  let x0 = Infinity, x1 = -Infinity, y0 = Infinity, y1 = -Infinity;
  for (const [x, y] of all) { x0 = Math.min(x0, x); x1 = Math.max(x1, x); y0 = Math.min(y0, y); y1 = Math.max(y1, y); }
  canvas.dataset.lastStep = x1;
  if (x1 === x0) { x0 -= 1; x1 += 1; }
  if (y1 === y0) { const d = Math.abs(y0) * 0.1 || 1; y0 -= d; y1 += d; }
  const pad = (y1 - y0) * 0.05; y0 -= pad; y1 += pad;
  const L = 58, R = 12, T = 10, B = 34, pw = W - L - R, ph = H - T - B;
  const X = x => L + (x - x0) / (x1 - x0) * pw, Y = y => T + (1 - (y - y0) / (y1 - y0)) * ph;
  g.strokeStyle = "#e5e5e5"; g.fillStyle = "#555"; g.lineWidth = 1;
  g.textAlign = "right"; g.textBaseline = "middle";
  const yt = niceTicks(y0, y1, 5), yl = tickLabels(yt);
  canvas.dataset.yTicks = yl.join(" ");
  yt.forEach((t, i) => {
    g.beginPath(); g.moveTo(L, Y(t)); g.lineTo(L + pw, Y(t)); g.stroke(); g.fillText(yl[i], L - 6, Y(t));
  });
  g.textAlign = "center"; g.textBaseline = "top";
  for (const t of niceTicks(x0, x1, 6)) {
    if (t !== Math.round(t)) continue;
    g.beginPath(); g.moveTo(X(t), T); g.lineTo(X(t), T + ph); g.stroke(); g.fillText(fmt(t), X(t), T + ph + 4);
  }
  g.strokeStyle = "#888"; g.strokeRect(L, T, pw, ph);
  g.fillText("step", L + pw / 2, H - 14);
  g.save(); g.translate(12, T + ph / 2); g.rotate(-Math.PI / 2); g.fillText(ylabel, 0, -6); g.restore();
  g.save(); g.beginPath(); g.rect(L, T, pw, ph); g.clip();
  for (const s of series) {
    g.strokeStyle = g.fillStyle = s.color; g.lineWidth = s.width || 1.5;
    if (s.dots) { for (const [x, y] of s.pts) { g.beginPath(); g.arc(X(x), Y(y), 3, 0, 7); g.fill(); } continue; }
    g.beginPath(); s.pts.forEach(([x, y], i) => i ? g.lineTo(X(x), Y(y)) : g.moveTo(X(x), Y(y))); g.stroke();
  }
  g.restore();
  let ly = T + 8; g.textAlign = "right"; g.textBaseline = "middle";   // legend, top right
  for (const s of series.filter(s => s.label)) {
    g.fillStyle = s.color; g.fillRect(L + pw - 8, ly - 4, 8, 8);
    g.fillStyle = "#333"; g.fillText(s.label, L + pw - 12, ly); ly += 14;
  }
}

function duration(sec) {
  if (!fin(sec) || sec < 0) return "-";
  const h = Math.floor(sec / 3600), m = Math.floor(sec % 3600 / 60), s = Math.floor(sec % 60);
  return h ? `${h}h ${m}m` : m ? `${m}m ${s}s` : `${s}s`;
}

function render() {
  const {loss: rows, samples, state} = last;
  const cfg = (state && state.config) || {}, total = cfg.train && cfg.train.steps;
  if (cfg.name) { $("title").textContent = cfg.name; document.title = cfg.name + " - andrea-numba"; }
  const train = pick(rows, "train_loss"), val = pick(rows, "val_loss");
  const smooth = ema(train.map(p => p[1]), train.length < 2000 ? 0.9 : 0.98).map((y, i) => [train[i][0], y]);
  chart($("c_loss"), [
    {pts: train, color: "rgba(31,119,180,0.3)", width: 1, label: "train"},
    {pts: smooth, color: "#1f77b4", width: 2, label: "train (EMA)"},
    {pts: val, color: "#ff7f0e", dots: true, label: "validation"}], "loss");
  chart($("c_lr"), [{pts: pick(rows, "lr"), color: "#2ca02c"}], "lr");
  chart($("c_gn"), [{pts: pick(rows, "grad_norm"), color: "#d62728"}], "grad norm");
  chart($("c_tps"), [{pts: pick(rows, "tokens_per_s"), color: "#9467bd"}], "tokens/s");
  const st = $("status");
  if (!rows.length) { st.textContent = "waiting for the first step"; st.className = "waiting"; }
  else {
    const r = rows[rows.length - 1], age = Date.now() / 1000 - r.time;
    st.textContent = age > 120 ? `idle (last step ${duration(age)} ago)` : "training"; st.className = "";
    $("step").textContent = r.step + (total ? ` / ${total}` : "");
    $("loss").textContent = fin(r.train_loss) ? r.train_loss.toFixed(4) : "-";
    $("val").textContent = val.length ? `${val[val.length - 1][1].toFixed(4)} (step ${val[val.length - 1][0]})` : "-";
    $("tps").textContent = fin(r.tokens_per_s) ? Math.round(r.tokens_per_s).toLocaleString("en") : "-";
    const a = rows[Math.max(0, rows.length - 21)];                    // seconds per step, last ~20 steps
    const sps = (r.time - a.time) / (r.step - a.step);
    $("eta").textContent = total && r.step >= total ? "done" : total && fin(sps) ? duration((total - r.step) * sps) : "-";
  }
  if (samples.length) {
    const s = samples[samples.length - 1];
    $("sample_h").textContent = `latest sample (step ${s.step})`;
    $("sample").textContent = `prompt ${JSON.stringify(s.prompt || "")}\n\n${s.text || ""}`;
  }
  if (state) $("state").textContent = JSON.stringify(state, null, 2);
}

async function poll() {
  try {
    const get = p => fetch(p, {cache: "no-store"}).then(r => r.json());
    const [loss, samples, state] = await Promise.all(["/loss.json", "/samples.json", "/state.json"].map(get));
    last = {loss, samples, state}; render();
  } catch (e) { $("status").textContent = "server unreachable"; $("status").className = "error"; }
  setTimeout(poll, 2000);
}
window.addEventListener("resize", render);
poll();
</script></body></html>
"""


def _finite(obj):
    """obj with NaN and +-inf replaced by None: they are not valid JSON, and JSON.parse rejects them."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_finite(v) for v in obj]
    return obj


class DashboardHandler(BaseHTTPRequestHandler):
    """GET of the four routes; everything else is a 404. The run directory is self.server.run_dir."""

    ROUTES = {"/loss.json": read_loss, "/samples.json": read_samples, "/state.json": read_state}

    def do_GET(self):
        path = urlsplit(self.path).path               # drop a ?query (cache busting)
        if path in ("/", "/index.html"):
            self._send(200, "text/html; charset=utf-8", PAGE.encode())
        elif path in self.ROUTES:
            data = _finite(self.ROUTES[path](self.server.run_dir))
            self._send(200, "application/json", json.dumps(data, allow_nan=False).encode())
        else:
            self._send(404, "text/plain; charset=utf-8", b"not found\n")

    def _send(self, code: int, ctype: str, body: bytes):
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format, *args):             # quiet: the page polls every 2 seconds
        pass


class _Server6(ThreadingHTTPServer):
    address_family = socket.AF_INET6


def make_server(run_dir, host: str = "127.0.0.1", port: int = 8000) -> ThreadingHTTPServer:
    """A dashboard server for `run_dir`, bound but not yet serving (call serve_forever).
    An IPv6 host (::1) gets an IPv6 socket. OSError if the address cannot be bound."""
    cls = _Server6 if ":" in host else ThreadingHTTPServer
    server = cls((host, port), DashboardHandler)
    server.daemon_threads = True                      # an open browser tab must not block exit
    server.run_dir = Path(run_dir)
    return server


def _free_port(host: str, near: int) -> int | None:
    """A port after `near` that can be bound on `host` right now (None if none of the next 50)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    for p in range(near + 1, min(near + 51, 65536)):
        with socket.socket(family, socket.SOCK_STREAM) as s:
            try:
                s.bind((host, p))
                return p
            except OSError:
                continue
    return None


def _bind_error(e: OSError, host: str, port: int) -> str:
    """One line for a server that could not be bound: what happened and what to do."""
    if e.errno == errno.EADDRINUSE:
        free = _free_port(host, port)
        hint = f"pick another with --port {free}" if free else "pick another with --port"
        return f"port {port} on {host} is in use (another dashboard or server?): {hint}"
    if e.errno == errno.EACCES:
        return (f"no permission to listen on port {port} of {host} (ports below 1024 need root): "
                f"pick another with --port 8000")
    if e.errno == errno.EADDRNOTAVAIL:
        return (f"cannot listen on {host}: it is not an address of this machine; use --host 127.0.0.1 "
                f"(this machine only) or --host 0.0.0.0 --public (every interface)")
    return f"cannot listen on {host} port {port} ({e.strerror or e}): try another --host or --port"


def _run_dir(value: str) -> Path:
    """A run directory, which may not exist yet (the trainer creates it), but not a file."""
    p = Path(value)
    if p.exists() and not p.is_dir():
        raise argparse.ArgumentTypeError(f"{value!r} is a file, not a run directory")
    return p


def loopback_only(host: str) -> bool:
    """Whether every address `host` resolves to is this machine's loopback (127.0.0.1, ::1)."""
    try:
        addresses = {info[4][0] for info in socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)}
        return all(ipaddress.ip_address(a.split("%")[0]).is_loopback for a in addresses)
    except (OSError, ValueError):
        return False


def main(argv=None) -> None:
    p = cli.Parser(prog="python -m andrea_numba.dashboard", description=__doc__.splitlines()[0])
    p.add_argument("run_dir", type=_run_dir, help="the run directory (it may not exist yet)")
    p.add_argument("--port", type=cli.port, default=8000, help="TCP port, 1 to 65535 (default 8000)")
    p.add_argument("--host", type=cli.host, default="127.0.0.1", help="127.0.0.1: this machine only")
    p.add_argument("--public", action="store_true", help="allow a --host other machines can reach (the page "
                   "has no password: anyone who can reach the port sees the run)")
    p.add_argument("--open", action="store_true", help="open the page in a web browser")
    args = p.parse_args(argv)
    reachable = not loopback_only(args.host)         # by other machines
    if reachable:
        if not args.public:
            cli.fail(f"--host {args.host} would serve the run to other machines, and the page has no password: "
                     "add --public if that is meant, or use 127.0.0.1 (this machine only)")
    try:
        server = make_server(args.run_dir, args.host, args.port)
    except OSError as e:
        cli.fail(_bind_error(e, args.host, args.port))
    if reachable:
        print(f"warning: serving {args.run_dir} on {args.host}, where other machines can reach it; the page has "
              "no authentication", file=sys.stderr, flush=True)
    shown = f"[{args.host}]" if ":" in args.host else args.host
    url = f"http://{shown}:{server.server_address[1]}/"
    print(f"dashboard of {args.run_dir} at {url}  (Ctrl-C to stop)", flush=True)
    if args.open:
        webbrowser.open(url)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()


if __name__ == "__main__":
    main()
