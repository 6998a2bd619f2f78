"""The sharded benchmark's worker on this process's one CPU device: for BP and every
``Sharded`` variant, the three quantities of the gradient, each its own program (a clock whose
durations are all odd: no time is the difference of two others), beside the step counts,
volumes and peak memory; no timing is asserted."""

import argparse
import functools
import json

from benchmarks import sharded
from experiments import timing
from tests.benchmarks.odd_clock import QUANTITIES, OddClock, odd_seconds


def test_every_gradient_is_timed_as_three_programs(monkeypatch, capsys):
    timed = functools.partial(timing.time_gradients, clock=OddClock())
    monkeypatch.setattr(timing, "time_gradients", timed)
    args = argparse.Namespace(lengths=[5], batch=2, hidden=3, repeats=1)
    sharded.worker(args)
    (row,) = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert (row["devices"], row["length"], row["backward"]) == (1, 5, "pullback")
    assert set(row["methods"]) == {"bp", "all_gather", "ppermute", "pipelined"}
    for entry in row["methods"].values():
        assert all(odd_seconds(entry[f"{quantity}_ms"]) for quantity in QUANTITIES), entry
        assert not odd_seconds(entry["total_ms"] - entry["forward_ms"])
        assert entry["backward_kernel_ms"] is None  # on a GPU only
        assert entry["critical_path_backward"] == 5 and entry["peak_bytes_per_device"] > 0
    sharded.print_row(row)
    assert "bwd" in capsys.readouterr().out
