"""The benchmarks' interleaved rounds: every call once per round, the order turned every round."""

from experiments import _timing


def test_every_call_takes_every_place_in_turn():
    order = []
    calls = {name: (lambda name=name: order.append(name)) for name in ("fwd", "bp", "auto")}
    times = _timing.interleaved(calls, rounds=4)
    assert order == [
        *("fwd", "bp", "auto"),
        *("bp", "auto", "fwd"),
        *("auto", "fwd", "bp"),
        *("fwd", "bp", "auto"),
    ]
    assert {name: len(ts) for name, ts in times.items()} == {"fwd": 4, "bp": 4, "auto": 4}
    assert all(t >= 0 for ts in times.values() for t in ts)


def test_no_calls_or_no_rounds_time_nothing():
    assert _timing.interleaved({}, rounds=3) == {}
    assert _timing.interleaved({"a": lambda: None}, rounds=0) == {"a": []}
