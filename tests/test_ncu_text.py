"""lab/bench/ncu_text.py reads Nsight Compute's text report: one row a kernel, its name, launch shape,
duration, issue rate, occupancy and the stalls its rules name."""
import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("ncu_text", ROOT / "lab" / "bench" / "ncu_text.py")
ncu_text = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ncu_text)

REPORT = """==PROF== Connected to process 1
  cudapy::andrea_numba::kernels::decode::k_decode_matvec_add[abi:v1,cw51c](Array<float, 1, C, mutable, aligned>, bool) (48, 1, 1)x(8, 128, 1), Context 1, Stream 13, Device 0, CC 9.0
    Section: GPU Speed Of Light Throughput
    Duration                      usecond         7.04
    Section: Warp State Statistics
    Warp Cycles Per Issued Instruction             cycle        45.23
    OPT   Estimated Speedup: 50%
          On average, each warp of this kernel spends 20.1 cycles being stalled waiting for sibling warps at a CTA
          barrier. This represents about 44.4% of the total.
          On average, each warp of this kernel spends 9.5 cycles being stalled waiting for a scoreboard dependency
          on a L1TEX (local, global, surface, texture) operation. Find the instruction producing the data.
    Section: Occupancy
    Achieved Occupancy                                 %        40.12
  cudapy::lab::bench::decode_parts::_k_empty(Array<float>) (48, 1, 1)x(8, 128, 1), Context 1, Stream 13, Device 0, CC 9.0
    Duration                      nsecond         1984
"""


def test_one_row_a_kernel_with_its_figures_and_stalls():
    rows = ncu_text.kernels(REPORT)
    assert [r[0] for r in rows] == ["k_decode_matvec_add", "_k_empty"]
    name, grid, blk, dur, unit, cyc, occ, stalls = rows[0]
    assert (grid, blk, dur, unit, cyc, occ) == ("(48, 1, 1)", "(8, 128, 1)", "7.04", "usecond", "45.23", "40.12")
    assert stalls.startswith("20.1 cyc waiting for sibling warps at a CTA barrier; 9.5 cyc waiting for a scoreboard")
    assert rows[1][3:] == ("1984", "nsecond", "-", "-", "-")


def test_the_table_prints_every_kernel(tmp_path, capsys):
    (tmp_path / "r.txt").write_text(REPORT)
    assert ncu_text.main([str(tmp_path / "r.txt")]) == 0
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 3 and "7.04 us" in out[1] and "1984 ns" in out[2]
