"""The single-sequence benchmark: for BP and bppsa's default, the three quantities of the
gradient, each its own program (a clock whose durations are all odd: no time is the difference
of two others); no timing is asserted."""

import json

from benchmarks import total
from tests.benchmarks.odd_clock import QUANTITIES, OddClock, odd_seconds


def test_each_quantity_is_its_own_programs_time():
    row = total.measure(5, 3, 1, "gru", clock=OddClock())
    assert (row["cell"], row["length"], row["hidden"], row["batch"], row["rounds"]) == (
        "gru",
        5,
        3,
        1,
        1,
    )
    assert row["ran"].startswith("Blocked(method=SequentialScan()")  # Auto() on a CPU
    for name in ("bp", "bppsa"):
        for quantity in QUANTITIES:
            assert odd_seconds(row[f"{name}_{quantity}_ms"])
        assert not odd_seconds(row[f"{name}_total_ms"] - row[f"{name}_forward_ms"])
        assert row[f"{name}_backward_kernel_ms"] is None  # on a GPU only
        assert set(row[f"{name}_compile_s"]) == set(QUANTITIES)
    assert row["overall_speedup"] == row["bp_total_ms"] / row["bppsa_total_ms"]
    assert row["backward_speedup"] == row["bp_backward_ms"] / row["bppsa_backward_ms"]


def test_the_command_writes_rows_that_say_the_backward_is_a_pullback(tmp_path, capsys):
    out = tmp_path / "total.json"
    assert total.main(["--lengths", "3", "--hidden", "2", "--repeats", "1", "--out", str(out)]) == 0
    payload = json.loads(out.read_text())
    assert payload["backward"] == "pullback"
    (row,) = payload["rows"]
    assert row["length"] == 3 and row["ran"] == "Sequential()"  # Auto() for one short sequence
    for name in ("bp", "bppsa"):
        for quantity in QUANTITIES:
            assert 0 < row[f"{name}_{quantity}_min_ms"] <= row[f"{name}_{quantity}_ms"]
    assert "bwd" in capsys.readouterr().out
