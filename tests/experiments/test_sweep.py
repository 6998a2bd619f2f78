"""The sweep's times: every phase the median of its own program's timings (the forward of
``jax.vjp``, its pullback, the whole gradient, the update), never a difference of two timings,
so that a backward faster than the timings' noise is still a measurement with a speedup."""

import pytest

from experiments._report import sweep_table, timing_table
from experiments._sweep import compare


def _rows(grads, forwards, backwards, update=1e-4):
    return [
        dict(
            kind="step",
            iteration=i,
            grad_s=g,
            forward_s=f,
            backward_s=b,
            update_s=update,
            step_s=g + update,
        )
        for i, (g, f, b) in enumerate(zip(grads, forwards, backwards, strict=True))
    ]


def test_each_phase_is_the_median_of_its_own_timings():
    runs = {
        "bp": _rows([5e-3, 5.2e-3, 4.9e-3], [1.2e-3, 1.1e-3, 1.3e-3], [4e-3, 4.2e-3, 3.9e-3]),
        "bppsa": _rows([3e-3, 3.1e-3, 2.9e-3], [1.0e-3, 1.1e-3, 0.9e-3], [2e-3, 1.9e-3, 2.2e-3]),
    }
    out = compare(runs)
    assert out["backward"] == "pullback" and "forward_s" not in out  # each method's own forward
    bp, ours = out["methods"]["bp"], out["methods"]["bppsa"]
    assert (bp["forward_s"], ours["forward_s"]) == (pytest.approx(1.2e-3), pytest.approx(1e-3))
    assert (bp["backward_s"], ours["backward_s"]) == (pytest.approx(4e-3), pytest.approx(2e-3))
    assert ours["grad_s"] == pytest.approx(3e-3) and ours["update_s"] == pytest.approx(1e-4)
    assert ours["step_s"] == pytest.approx(3e-3 + 1e-4)
    assert ours["backward_speedup"] == pytest.approx(4e-3 / 2e-3)
    assert ours["overall_speedup"] == pytest.approx(bp["step_s"] / ours["step_s"])
    assert bp["backward_speedup"] == pytest.approx(1.0)
    assert set(ours["quartiles"]) == {"forward_s", "backward_s", "grad_s", "update_s", "step_s"}
    assert ours["quartiles"]["backward_s"]["q1"] <= 2e-3 <= ours["quartiles"]["backward_s"]["q3"]


def test_a_backward_below_the_forwards_noise_is_still_a_measurement():
    # A gradient inside the forward's spread made "grad - forward" meaningless; a backward
    # timed as its own program is divided whatever the forward's spread.
    forwards = [1.0e-3, 1.3e-3, 0.8e-3]
    runs = {
        "bp": _rows([1.1e-3] * 3, forwards, [2e-4, 2.1e-4, 1.9e-4]),
        "bppsa": _rows([1.05e-3] * 3, forwards, [5e-5, 6e-5, 4e-5]),
    }
    out = compare(runs)
    ours = out["methods"]["bppsa"]
    assert ours["backward_s"] == pytest.approx(5e-5)
    assert ours["backward_speedup"] == pytest.approx(2e-4 / 5e-5)


def test_iterations_without_the_extra_calls_and_skipped_ones_are_left_out():
    rows = _rows([5e-3, 1.0, 3e-3, 3e-3], [9.0, 1e-3, None, 2e-3], [9.0, 2e-3, None, 4e-3])
    ours = compare({"bppsa": rows}, skip=1)["methods"]["bppsa"]
    assert ours["iterations"] == 3
    assert ours["forward_s"] == pytest.approx(1.5e-3) and ours["backward_s"] == pytest.approx(3e-3)
    assert "backward_speedup" not in ours  # no baseline


def test_the_tables_say_how_the_backward_was_timed():
    runs = {
        "bp": _rows([5e-3], [1e-3], [4e-3]),
        "bppsa": _rows([3e-3], [1e-3], [2e-3]),
    }
    out = compare(runs)
    table = sweep_table([dict(out, point={"sweep": "T", "length": 8, "batch": 4})])
    assert "2.00x" in table and "pullback" in table
    assert "4.00" in timing_table(out) and "pullback" in timing_table(out)
    assert "not value_and_grad - forward" in timing_table(out)
