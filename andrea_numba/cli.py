"""What every command line of the package shares: a parser that reports a bad argument in one line
and exits with code 2, argument types that check a value when it is parsed, and `fail` /
`exits_on` for what can only be found wrong after parsing (a run directory's files, a busy port).

    ap = Parser(prog="python -m andrea_numba.sample", description="...")
    ap.add_argument("--tokens", type=positive_int, default=200)
    ap.add_argument("--port", type=port, default=8000)

A value that does not fit gives, on stderr, one line such as

    error: argument --tokens: must be a positive integer, got '-3' (see python -m andrea_numba.sample --help)

and exit code 2, before any work starts (argparse's usage block is left out: `--help` shows it).
A main decorated with `@exits_on(SomeError, OSError)` turns those exceptions, raised after
parsing, into the same one line and exit code 2.
"""
from __future__ import annotations

import argparse
import functools
import math
import os
import socket
import sys
from pathlib import Path
from urllib.parse import urlsplit

from .config import ConfigError, load_config

INT32_MAX = 2 ** 31 - 1     # the checkpoint's step and parameter count are int32; so are token ids


def one_line(message) -> str:
    """str(message) on one line: newlines (from an exception of another library) become spaces."""
    return " ".join(str(message).split("\n")).strip()


def fail(message, code: int = 2):
    """Print `error: message` as one line on stderr and exit with `code` (2: bad input)."""
    print(f"error: {one_line(message)}", file=sys.stderr, flush=True)
    sys.exit(code)


def exits_on(*errors):
    """Decorator for a command line's main: an exception of `errors` becomes one line on stderr and
    exit code 2; Ctrl-C exits with 130 and one line; a closed pipe (| head) exits quietly."""
    def deco(fn):
        @functools.wraps(fn)
        def wrapped(*args, **kwargs):
            try:
                return fn(*args, **kwargs)
            except errors as e:
                fail(e)
            except KeyboardInterrupt:
                fail("interrupted", 130)
            except BrokenPipeError:
                if sys.stdout is sys.__stdout__:          # the reader of our stdout went away: say no more
                    try:
                        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
                    except (OSError, ValueError):
                        pass
                sys.exit(141)
        return wrapped
    return deco


class Parser(argparse.ArgumentParser):
    """argparse.ArgumentParser whose errors are one line on stderr, then exit code 2."""

    def error(self, message):
        print(f"error: {one_line(message)} (see {self.prog} --help)", file=sys.stderr)
        sys.exit(2)


def _q(text) -> str:
    """A user's text quoted for a message: repr, so a newline or an odd character stays visible."""
    return repr(str(text))


def _int(text: str) -> int:
    try:
        return int(text, 10)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer, got {_q(text)}") from None


def _float(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number, got {_q(text)}") from None
    if not math.isfinite(v):
        raise argparse.ArgumentTypeError(f"must be a finite number, got {_q(text)}")
    return v


def positive_int(text: str) -> int:
    v = _int(text)
    if v <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {_q(text)}")
    return v


def nonneg_int(text: str) -> int:
    v = _int(text)
    if v < 0:
        raise argparse.ArgumentTypeError(f"must be an integer >= 0, got {_q(text)}")
    return v


def int_range(lo: int, hi: int):
    """The type of an integer from lo to hi (both included)."""
    def parse(text: str) -> int:
        v = _int(text)
        if not lo <= v <= hi:
            raise argparse.ArgumentTypeError(f"must be an integer from {lo:,} to {hi:,}, got {_q(text)}")
        return v
    parse.__name__ = f"integer from {lo} to {hi}"
    return parse


def one_of(options, what: str = "value"):
    """The type of a value from `options`, refused as "unknown <what> 'x': choose from a, b, c"."""
    options = list(options)

    def parse(value: str) -> str:
        if value not in options:
            raise argparse.ArgumentTypeError(f"unknown {what} {_q(value)}: choose from {', '.join(options)}")
        return value
    parse.__name__ = what
    return parse


seed = int_range(0, INT32_MAX)          # a seed: the generators take any integer in [0, 2^31)
seed.__name__ = "seed"


def positive_float(text: str) -> float:
    v = _float(text)
    if v <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive number, got {_q(text)}")
    return v


def fraction(text: str) -> float:
    """A number strictly between 0 and 1."""
    v = _float(text)
    if not 0 < v < 1:
        raise argparse.ArgumentTypeError(f"must lie strictly between 0 and 1, got {_q(text)}")
    return v


def port(text: str) -> int:
    """A TCP port: 1 to 65535 (0, 'any free port', is not offered: the page's address must be known)."""
    v = _int(text)
    if not 1 <= v <= 65535:
        raise argparse.ArgumentTypeError(f"must be a TCP port from 1 to 65535, got {_q(text)}")
    return v


def host(text: str) -> str:
    """A host name or address that resolves (127.0.0.1, localhost, 0.0.0.0, ::1, a name of this machine)."""
    try:
        socket.getaddrinfo(text, None, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError, ValueError) as e:
        why = getattr(e, "strerror", None) or e
        raise argparse.ArgumentTypeError(f"cannot resolve host {_q(text)} ({why}): use 127.0.0.1 (this "
                                         f"machine only), 0.0.0.0 (every interface) or a name of this machine") from None
    return text


def text(value: str) -> str:
    """Text that can be written as UTF-8 (a command line's undecodable bytes arrive as lone surrogates)."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as e:
        raise argparse.ArgumentTypeError(f"is not valid UTF-8 text (character {e.start}): "
                                         f"check the terminal's encoding") from None
    return value


def _path(value: str) -> Path:
    if not value:
        raise argparse.ArgumentTypeError("must be a path, got ''")
    text(value)
    return Path(value)


def existing_dir(value: str) -> Path:
    """A directory that exists."""
    p = _path(value)
    if not p.exists():
        raise argparse.ArgumentTypeError(f"directory {_q(value)} does not exist: check the path")
    if not p.is_dir():
        raise argparse.ArgumentTypeError(f"{_q(value)} is a file, not a directory: give a directory")
    return p


def existing_file(value: str) -> Path:
    """A file that exists and can be read (not a directory)."""
    p = _path(value)
    if not p.exists():
        raise argparse.ArgumentTypeError(f"file {_q(value)} does not exist: check the path")
    if p.is_dir():
        raise argparse.ArgumentTypeError(f"{_q(value)} is a directory, not a file: give a file")
    if not os.access(p, os.R_OK):
        raise argparse.ArgumentTypeError(f"file {_q(value)} cannot be read (permission denied)")
    return p


def _nearest_existing(p: Path) -> Path:
    p = Path(os.path.abspath(p))
    while not p.exists() and p != p.parent:
        p = p.parent
    return p


def dir_to_write(value: str) -> Path:
    """A directory to write into: one that exists, or one that can be created (no file in the way)."""
    p = _path(value)
    if p.exists() and not p.is_dir():
        raise argparse.ArgumentTypeError(f"{_q(value)} is a file, not a directory: give a directory "
                                         f"(it is created if missing)")
    base = _nearest_existing(p)
    if not base.is_dir():
        raise argparse.ArgumentTypeError(f"{_q(value)} cannot be created: {_q(base)} is a file")
    if not os.access(base, os.W_OK | os.X_OK):
        raise argparse.ArgumentTypeError(f"{_q(value)} cannot be written: no permission in {_q(base)}")
    return p


def file_to_write(suffix: str | None = None):
    """The type of a file to write: its directory exists, it is not a directory itself, and its name
    ends in `suffix` (such as '.png') when given."""
    def parse(value: str) -> Path:
        p = _path(value)
        if suffix and not p.name.lower().endswith(suffix):
            raise argparse.ArgumentTypeError(f"must be a file name ending in {suffix}, got {_q(value)}")
        if p.is_dir():
            raise argparse.ArgumentTypeError(f"{_q(value)} is a directory: give a file name")
        parent = p.parent
        if parent.exists() and not parent.is_dir():
            raise argparse.ArgumentTypeError(f"cannot write {_q(value)}: {_q(parent)} is a file, not a directory")
        if not parent.is_dir():
            raise argparse.ArgumentTypeError(f"the directory of {_q(value)} does not exist: create "
                                             f"{_q(parent)} first or write elsewhere")
        if not os.access(parent, os.W_OK | os.X_OK) or (p.exists() and not os.access(p, os.W_OK)):
            raise argparse.ArgumentTypeError(f"{_q(value)} cannot be written (permission denied)")
        return p
    parse.__name__ = f"{suffix or ''} file to write"
    return parse


def url(value: str) -> str:
    """An http://, https:// or file:// address."""
    text(value)
    try:
        parts = urlsplit(value)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"is not a valid address ({e}): got {_q(value)}") from None
    if parts.scheme not in ("http", "https", "file"):
        raise argparse.ArgumentTypeError(f"must be an http://, https:// or file:// address, got {_q(value)}")
    if parts.scheme != "file" and not parts.hostname:
        raise argparse.ArgumentTypeError(f"has no host name, got {_q(value)}")
    if parts.scheme == "file" and not parts.path:
        raise argparse.ArgumentTypeError(f"names no file, got {_q(value)}")
    return value


def config(value: str) -> str:
    """A size (tiny, 12M, 120M) or the path of a config JSON file that loads and validates; the text
    is returned as given (tools pass it on to load_config)."""
    try:
        load_config(value)
    except ConfigError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return value


def config_list(value: str) -> list[str]:
    """Comma-separated sizes or config files, each checked as `config`."""
    items = [v.strip() for v in value.split(",")]
    if not all(items):
        raise argparse.ArgumentTypeError(f"must be sizes separated by commas (tiny,12M), got {_q(value)}")
    return [config(v) for v in items]
