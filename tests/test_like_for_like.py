"""lab/bench/like_for_like.py's arithmetic, without a GPU or PyTorch: the ratio of each repeat,
the spread, the verdict (parity whenever the repeats' ratios straddle 1) and the table's row."""
import importlib.util
from pathlib import Path

spec = importlib.util.spec_from_file_location(
    "like_for_like", Path(__file__).resolve().parent.parent / "lab" / "bench" / "like_for_like.py")
L = importlib.util.module_from_spec(spec)
spec.loader.exec_module(L)


def test_verdict_is_parity_when_the_spread_holds_1():
    assert L.verdict([0.95, 1.2, 1.1]) == "parity"
    assert L.verdict([1.0, 1.3]) == "parity"             # a repeat at exactly 1: no win
    assert L.verdict([1.01, 1.3, 1.2]) == "faster"      # every repeat's ratio above 1: ours faster
    assert L.verdict([0.7, 0.99]) == "slower"


def test_summarize_pairs_the_repeats_and_takes_median_and_extremes():
    s = L.summarize([10.0, 10.0, 20.0], [12.0, 9.0, 22.0])      # ratios 1.2, 0.9, 1.1
    assert s["ours_ms"] == [10.0, 10.0, 20.0]
    assert s["theirs_ms"] == [12.0, 9.0, 22.0]
    assert s["ratio"] == [1.1, 0.9, 1.2]
    assert s["verdict"] == "parity"
    assert L.summarize([10.0, 10.0], [11.0, 12.0])["verdict"] == "faster"


def test_table_row_prints_median_spread_and_verdict():
    r = {"size": "12M", "recipe": "fp32", "torch": "fp32, TF32 off", "row": "fwd+bwd, eager vs eager",
         **L.summarize([10.0, 11.0, 12.0], [8.0, 9.0, 9.5])}
    head, rule, row = L.table([r])
    assert head.count("|") == rule.count("|") == row.count("|") == 8
    assert "| 11.00 [10.00-12.00] | 9.00 [8.00-9.50] | 0.800 [0.792-0.818] | slower |" in row


def test_per_iter_ms_calls_n_times_between_two_syncs():
    calls = []
    ms = L.per_iter_ms(lambda: calls.append("call"), 4, lambda: calls.append("sync"))
    assert calls == ["sync"] + ["call"] * 4 + ["sync"] and ms >= 0
