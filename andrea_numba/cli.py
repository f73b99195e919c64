"""What every command line of the package shares: a parser that reports a bad argument in one line
and exits with code 2, and argument types that check a value when it is parsed.

    ap = Parser(prog="python -m andrea_numba.sample", description="...")
    ap.add_argument("--tokens", type=positive_int, default=200)
    ap.add_argument("--port", type=port, default=8000)

A value that does not fit gives, on stderr, one line such as

    error: argument --tokens: must be a positive integer, got '-3'

and exit code 2, before any work starts (argparse's usage block is left out: `--help` shows it).
"""
from __future__ import annotations

import argparse
import math
import sys


class Parser(argparse.ArgumentParser):
    """argparse.ArgumentParser whose errors are one line on stderr, then exit code 2."""

    def error(self, message):
        print(f"error: {message} (see {self.prog} --help)", file=sys.stderr)
        sys.exit(2)


def _int(text: str) -> int:
    try:
        return int(text, 10)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer, got '{text}'") from None


def _float(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number, got '{text}'") from None
    if not math.isfinite(v):
        raise argparse.ArgumentTypeError(f"must be a finite number, got '{text}'")
    return v


def positive_int(text: str) -> int:
    v = _int(text)
    if v <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got '{text}'")
    return v


def nonneg_int(text: str) -> int:
    v = _int(text)
    if v < 0:
        raise argparse.ArgumentTypeError(f"must be an integer >= 0, got '{text}'")
    return v


def seed(text: str) -> int:
    """A seed: an integer in [0, 2^31)."""
    v = _int(text)
    if not 0 <= v < 2 ** 31:
        raise argparse.ArgumentTypeError(f"must be an integer in [0, 2147483647], got '{text}'")
    return v


def positive_float(text: str) -> float:
    v = _float(text)
    if v <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive number, got '{text}'")
    return v


def fraction(text: str) -> float:
    """A number strictly between 0 and 1."""
    v = _float(text)
    if not 0 < v < 1:
        raise argparse.ArgumentTypeError(f"must lie strictly between 0 and 1, got '{text}'")
    return v


def port(text: str) -> int:
    """A TCP port: 1 to 65535 (0, 'any free port', is not offered: the page's address must be known)."""
    v = _int(text)
    if not 1 <= v <= 65535:
        raise argparse.ArgumentTypeError(f"must be a TCP port from 1 to 65535, got '{text}'")
    return v
