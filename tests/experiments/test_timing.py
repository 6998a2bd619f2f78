"""The benchmarks' interleaved rounds: one timed call of each per round, after itself."""

from experiments import _timing


def test_every_timed_call_follows_an_untimed_call_of_itself():
    order = []
    calls = {name: (lambda name=name: order.append(name)) for name in ("fwd", "bp", "auto")}
    times = _timing.interleaved(calls, rounds=2)
    assert order == ["fwd", "fwd", "bp", "bp", "auto", "auto"] * 2
    assert {name: len(ts) for name, ts in times.items()} == {"fwd": 2, "bp": 2, "auto": 2}
    assert all(t >= 0 for ts in times.values() for t in ts)


def test_no_calls_or_no_rounds_time_nothing():
    assert _timing.interleaved({}, rounds=3) == {}
    assert _timing.interleaved({"a": lambda: None}, rounds=0) == {"a": []}
