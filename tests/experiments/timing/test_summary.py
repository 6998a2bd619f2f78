"""The summaries of timings are medians and minima by value: each case's mean, first, last and
middle-of-the-unsorted values differ from its median (a summary computed as a mean, or from the
rounds' order, fails here)."""

import pytest

from experiments.timing import min_median, ms_fields, quartiles

# (seconds of the rounds, median, minimum): mean 13/3 and 4 s, not the medians.
CASES = [
    ([1.0, 2.0, 10.0], 2.0, 1.0),
    ([10.0, 1.0, 2.0], 2.0, 1.0),  # in the rounds' order: the middle round is no median
    ([1.0, 2.0, 3.0, 10.0], 2.5, 1.0),  # even: the mean of the middle two
]


@pytest.mark.parametrize(("seconds", "median", "minimum"), CASES)
def test_ms_fields_are_the_median_and_the_minimum_in_milliseconds(seconds, median, minimum):
    assert ms_fields({"x": seconds}) == {"x_ms": 1e3 * median, "x_min_ms": 1e3 * minimum}
    assert sum(seconds) / len(seconds) != median  # the case tells a mean from a median


@pytest.mark.parametrize(("seconds", "median", "minimum"), CASES)
def test_min_median_is_the_minimum_and_the_median_in_seconds(seconds, median, minimum):
    assert min_median({"x": seconds}) == {"x_min_s": minimum, "x_median_s": median}


def test_every_name_is_summarized_on_its_own():
    times = {"forward": [1.0, 2.0, 10.0], "backward": [3.0, 30.0, 4.0]}
    assert ms_fields(times) == {
        "forward_ms": 2000.0,
        "forward_min_ms": 1000.0,
        "backward_ms": 4000.0,
        "backward_min_ms": 3000.0,
    }


def test_quartiles_are_the_median_and_quartiles_not_the_mean():
    assert quartiles([10.0, 1.0, 2.0]) == {"median": 2.0, "q1": 1.5, "q3": 6.0}
    assert quartiles([1.25, 2.0, 10.0], digits=1) == {"median": 2.0, "q1": 1.6, "q3": 6.0}
