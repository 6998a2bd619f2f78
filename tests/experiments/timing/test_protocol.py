"""The protocol: each timed call right after an untimed call of itself, rounds interleaved,
the budget, and the summaries of the times (a fake clock: every duration known exactly)."""

import pytest

from experiments.timing import interleaved, min_median, ms_fields, quartiles, timed
from tests.experiments.timing.fake_clock import FakeClock


def test_timed_returns_the_result_and_the_seconds_of_the_call():
    clock = FakeClock()
    step = clock.call("a", [0.25])
    assert timed(lambda x: (step(), 2 * x)[1], 3, clock=clock) == (6, 0.25)


def test_every_timed_call_follows_an_untimed_call_of_itself_round_by_round():
    clock = FakeClock()
    # untimed, timed per round: the first untimed call (the compilation) is long.
    calls = {
        "fwd": clock.call("fwd", [8.0, 0.5, 1.0, 0.75, 1.0, 0.25]),
        "bp": clock.call("bp", [9.0, 2.0, 1.0, 1.5, 1.0, 1.0]),
    }
    times = interleaved(calls, rounds=3, clock=clock)
    assert clock.order == ["fwd", "fwd", "bp", "bp"] * 3
    assert times == {"fwd": [0.5, 0.75, 0.25], "bp": [2.0, 1.5, 1.0]}
    assert ms_fields(times) == {
        "fwd_ms": 500.0,
        "fwd_min_ms": 250.0,
        "bp_ms": 1500.0,
        "bp_min_ms": 1000.0,
    }
    assert min_median(times) == {
        "fwd_min_s": 0.25,
        "fwd_median_s": 0.5,
        "bp_min_s": 1.0,
        "bp_median_s": 1.5,
    }


def test_no_calls_or_no_rounds_time_nothing():
    assert interleaved({}, rounds=3) == {}
    assert interleaved({"a": lambda: None}, rounds=0) == {"a": []}
    assert ms_fields({"a": []}) == {"a_ms": None, "a_min_ms": None}


@pytest.mark.parametrize(
    "seconds,min_rounds,expected",
    [
        (None, 1, 10),  # no budget: every round
        (12.0, 1, 3),  # rounds of 4 s: the 4th would end at 16 s
        (11.9, 1, 2),  # the 3rd would end at 12 s
        (0.0, 1, 1),
        (0.0, 3, 3),  # the rounds run whatever the budget
        (100.0, 1, 10),  # never more than ``rounds``
    ],
)
def test_the_budget_starts_no_round_that_would_end_past_it(seconds, min_rounds, expected):
    clock = FakeClock()
    calls = {name: clock.call(name, [1.0]) for name in ("a", "b")}
    times = interleaved(calls, 10, seconds=seconds, min_rounds=min_rounds, clock=clock)
    assert {name: len(ts) for name, ts in times.items()} == {"a": expected, "b": expected}
    assert clock.now == 4.0 * expected


def test_the_budget_after_a_compiling_first_round():
    clock = FakeClock()
    times = interleaved(
        {"a": clock.call("a", [10.0, 1.0])}, 10, seconds=16.0, min_rounds=2, clock=clock
    )
    # 11 s + 2 s + 2 s = 15 s; a 4th round would end at 17 s. Judged by the mean round (6.5 s
    # after two), the compilation would have stopped it after two.
    assert times == {"a": [1.0, 1.0, 1.0]}


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(rounds=-1), "rounds"),
        (dict(rounds=2, min_rounds=0), "min_rounds"),
        (dict(rounds=2, seconds=-1.0), "seconds"),
    ],
)
def test_invalid_arguments_are_named(kwargs, match):
    with pytest.raises(ValueError, match=match):
        interleaved({"a": lambda: None}, **kwargs)


def test_quartiles_of_none_one_and_several_timings():
    assert quartiles([]) == {"median": None, "q1": None, "q3": None}
    assert quartiles([2.0]) == {"median": 2.0, "q1": 2.0, "q3": 2.0}
    assert quartiles([1.0, 2.0, 3.0, 4.0, 5.0]) == {"median": 3.0, "q1": 2.0, "q3": 4.0}
