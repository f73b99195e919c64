"""Nsight Compute's text report, one line a kernel.

    ncu --section SpeedOfLight --section WarpStateStats --section Occupancy python X.py > report.txt
    python lab/bench/ncu_text.py report.txt

For each kernel profiled, in launch order: its name (the last part of the demangled name), grid and
block, duration, warp cycles per issued instruction, achieved occupancy, and the stalls the report's
rules name ("each warp of this kernel spends N cycles being stalled waiting for ..."), shortened.
A value the report lacks prints as "-".
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from andrea_numba import cli  # noqa: E402

HEAD = re.compile(r"^  (\S.*?) (\(\d+, \d+, \d+\))x(\(\d+, \d+, \d+\)), Context")
UNITS = {"nsecond": "ns", "usecond": "us", "msecond": "ms", "second": "s"}
STALL = re.compile(r"spends ([\d.]+) cycles being stalled (.*?)\.(?:\s|$)")


def _name(full: str) -> str:
    """k_decode_matvec_add out of cudapy::lab::bench::...::k_decode_matvec_add[abi:...](Array<...>, ...)."""
    return re.split(r"[\[(<]", full, maxsplit=1)[0].split("::")[-1]


def _metric(lines, name: str) -> str:
    for ln in lines:
        if ln.strip().startswith(name + " "):
            return ln.split()[-1]
    return "-"


def kernels(text: str) -> list:
    """[(name, grid, block, duration, its unit, cycles a issued instruction, occupancy %, stalls)]."""
    out, block = [], None
    for ln in text.splitlines() + ["  end (0, 0, 0)x(0, 0, 0), Context"]:
        m = HEAD.match(ln)
        if m:
            if block is not None:
                out.append(block)
            block = [m.group(1), m.group(2), m.group(3), []]
        elif block is not None:
            block[3].append(ln)
    rows = []
    for full, grid, blk, lines in out:
        dur = next((ln.split()[-2:] for ln in lines if ln.strip().startswith("Duration ")), ["-", ""])
        prose = " ".join(ln.strip() for ln in lines)
        stalls = "; ".join(f"{c} cyc {why[:60]}" for c, why in STALL.findall(prose)) or "-"
        rows.append((_name(full), grid, blk, dur[1], dur[0], _metric(lines, "Warp Cycles Per Issued Instruction"),
                     _metric(lines, "Achieved Occupancy"), stalls))
    return rows


def main(argv=None) -> int:
    ap = cli.Parser(prog="python lab/bench/ncu_text.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("report", type=cli.existing_file, help="Nsight Compute's text output")
    args = ap.parse_args(argv)
    rows = kernels(Path(args.report).read_text(errors="replace"))
    if not rows:
        cli.fail(f"{args.report}: no profiled kernel in it (is it Nsight Compute's text output?)")
    print(f"{'kernel':<28} {'grid':<14} {'block':<14} {'time':>12} {'cyc/issue':>9} {'occ %':>6}  stalls")
    for name, grid, blk, dur, unit, cyc, occ, stalls in rows:
        print(f"{name[:28]:<28} {grid:<14} {blk:<14} {dur:>9} {UNITS.get(unit, unit):<2} {cyc:>9} {occ:>6}  {stalls}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
