"""Jobs in processes of their own, each forked from a warm process that has done the imports once.

    caller:          w = Warm([sys.executable, "-c", CODE]); ran = w.run({"...": ...}, timeout=120)
    the warm side:   CODE imports what the jobs need, then calls serve(job)

A warm process reads one JSON request per line on stdin. For each it forks; the fork runs
job(request, token, fd) and writes its result, as lines, to the pipe fd; the warm process reads
the pipe until it closes or the time limit comes, kills the fork if it still runs, and answers one
JSON line on stdout: Ran(token, text, timed_out, how, seconds). The token is new for each job and
goes only to the fork and the caller: a job's result line starts with it, so nothing else the fork
prints can pass for one. The fork closes the warm process's answer pipe first, so it cannot write
an answer either. The exercise grader (andrea_numba/exercises.py) grades each student file this
way: one warm process per parallel job, a fork of it per file (a few milliseconds, where a fresh
interpreter spends half a second importing numpy, numba and the engine).

Where the platform has no fork (Windows), run_once starts a fresh interpreter for the one job,
killed at the time limit plus GRACE.
"""
from __future__ import annotations

import json
import os
import secrets
import select
import signal
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass

FORK = hasattr(os, "fork")
GRACE = 60.0                    # seconds the caller waits past a job's time limit (a warm process's start)
MAX_OUTPUT = 1 << 22            # bytes of a job's output that are kept


class Lost(Exception):
    """The warm process died, could not start, or stopped answering."""


@dataclass
class Ran:
    token: str                  # the job's result line starts with it
    text: str                   # what the job wrote to its pipe (up to MAX_OUTPUT bytes)
    timed_out: bool             # the time limit came first (the job was killed)
    how: str                    # how the job's process ended, in words
    seconds: float              # from its start to its end


# ---------------------------------------------------------------------------------------------
# the warm process

def serve(job):
    """The warm process's loop (see the module's docstring). A request with "fork": false (a platform
    without fork, run_once) runs the job here, with the request's "token", and ends the loop."""
    answers = os.dup(1)
    os.dup2(2, 1)                                   # anything else printed goes to stderr
    send(answers, json.dumps({"ready": True}) + "\n")
    for line in sys.stdin:
        request = json.loads(line)
        if not request.get("fork", FORK):
            job(request, request["token"], answers)
            return
        send(answers, json.dumps(asdict(_fork(job, request, answers))) + "\n")


def send(fd: int, text: str):
    """Write all of text to fd."""
    data = text.encode()
    while data:
        data = data[os.write(fd, data):]


def _fork(job, request: dict, answers: int) -> Ran:
    token = secrets.token_hex(16)
    r, w = os.pipe()
    start = time.monotonic()
    pid = os.fork()
    if pid == 0:                                    # the job's process
        code = 0
        try:
            os.close(r)
            os.close(answers)                       # the answers to the caller are the warm process's alone
            job(request, token, w)
        except BaseException:  # noqa: BLE001  (whatever happens, never return into the warm process's loop)
            code = 70
        finally:
            os._exit(code)
    os.close(w)
    text, timed_out = _drain(r, start + request["timeout"])
    os.close(r)
    how, killed = _reap(pid, None if timed_out else start + request["timeout"])
    return Ran(token, text, timed_out or killed, how, time.monotonic() - start)


def _drain(fd: int, deadline: float):
    """What fd gives until its end or the deadline: (text, whether the deadline came first)."""
    chunks, size = [], 0
    while True:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            break
        chunk = os.read(fd, 65536)
        if not chunk:
            return b"".join(chunks).decode("utf-8", "replace"), False
        size += len(chunk)
        if size <= MAX_OUTPUT:
            chunks.append(chunk)
    return b"".join(chunks).decode("utf-8", "replace"), True


def _reap(pid: int, deadline):
    """Wait for a job's process to end, killing it at the deadline (None: now): (how it ended, in
    words; whether it was killed)."""
    killed = False
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if deadline is None or time.monotonic() >= deadline:
            os.kill(pid, signal.SIGKILL)
            _, status = os.waitpid(pid, 0)
            killed = True
            break
        time.sleep(0.005)
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        return f"killed by signal {sig} ({signal.Signals(sig).name})", killed
    return f"exit code {os.WEXITSTATUS(status)}", killed


# ---------------------------------------------------------------------------------------------
# the caller's side

class Warm:
    """One warm process, started on the first run (again if it died); one job at a time.
    echo: the warm process's and its jobs' stderr is this process's (else it goes nowhere)."""

    def __init__(self, command: list, echo: bool = True):
        self.command, self.echo = command, echo
        self.proc, self._buf = None, b""
        self._lock = threading.Lock()

    def run(self, request: dict, timeout: float) -> Ran:
        """Run one job (request: JSON, "timeout" added) and return how it ran. Raises Lost."""
        if not FORK:
            return run_once(self.command, request, timeout, self.echo)
        with self._lock:
            try:
                self._start()
                send(self.proc.stdin.fileno(), json.dumps({**request, "timeout": timeout}) + "\n")
                return Ran(**json.loads(self._line(time.monotonic() + timeout + GRACE)))
            except (OSError, EOFError, TimeoutError, ValueError, TypeError) as e:
                self.close()
                raise Lost(str(e)) from None

    def _start(self):
        if self.proc is not None and self.proc.poll() is None:
            return
        self._buf = b""
        self.proc = subprocess.Popen(self.command, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=None if self.echo else subprocess.DEVNULL,
                                     start_new_session=True, bufsize=0)
        hello = json.loads(self._line(time.monotonic() + GRACE))
        if "fatal" in hello:
            raise EOFError(f"it could not start: {hello['fatal']}")

    def _line(self, deadline: float) -> str:
        fd = self.proc.stdout.fileno()
        while b"\n" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                raise TimeoutError("it stopped answering")
            chunk = os.read(fd, 65536)
            if not chunk:
                raise EOFError("it ended")
            self._buf += chunk
        line, _, self._buf = self._buf.partition(b"\n")
        return line.decode()

    def close(self):
        """Stop the warm process and the job it may be running (its whole process group)."""
        proc, self.proc = self.proc, None
        if proc is None:
            return
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        proc.wait()
        proc.stdin.close()
        proc.stdout.close()


def run_once(command: list, request: dict, timeout: float, echo: bool = True) -> Ran:
    """The job in a fresh interpreter that runs `command` (a platform without fork), killed at the
    time limit plus GRACE (the interpreter's start)."""
    token = secrets.token_hex(16)
    line = json.dumps({**request, "timeout": timeout, "fork": False, "token": token}) + "\n"
    start = time.monotonic()
    try:
        p = subprocess.run(command, input=line.encode(), stdout=subprocess.PIPE,
                           stderr=None if echo else subprocess.DEVNULL, timeout=timeout + GRACE)
        out, timed_out, how = p.stdout, False, f"exit code {p.returncode}"
    except subprocess.TimeoutExpired as e:
        out, timed_out, how = e.stdout or b"", True, "killed at the time limit"
    text = out[:MAX_OUTPUT].decode("utf-8", "replace")
    return Ran(token, text, timed_out, how, time.monotonic() - start)
