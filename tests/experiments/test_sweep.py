"""The sweep's backward times: a difference of two medians, divided only where it is resolved
(clear of the timings' spread), so that a busy machine changes a number, never the structure."""

import pytest

from experiments._report import sweep_table, timing_table
from experiments._sweep import compare


def _rows(grads, forwards, update=1e-4):
    return [
        dict(kind="step", iteration=i, grad_s=g, forward_s=f, update_s=update, step_s=g + update)
        for i, (g, f) in enumerate(zip(grads, forwards, strict=True))
    ]


def test_a_backward_clear_of_the_spread_gets_a_speedup():
    forwards = [1.0e-3, 1.1e-3, 0.9e-3, 1.0e-3, 1.05e-3]
    runs = {
        "bp": _rows([5e-3, 5.2e-3, 4.9e-3, 5.1e-3, 5e-3], forwards),
        "bppsa": _rows([3e-3, 3.1e-3, 2.9e-3, 3e-3, 3.05e-3], forwards),
    }
    out = compare(runs)
    bp, ours = out["methods"]["bp"], out["methods"]["bppsa"]
    assert out["forward_s"] == pytest.approx(1.0e-3)
    assert bp["backward_resolved"] and ours["backward_resolved"]
    assert ours["backward_s"] == pytest.approx(3e-3 - 1e-3)
    assert ours["backward_speedup"] == pytest.approx((5e-3 - 1e-3) / (3e-3 - 1e-3))
    assert ours["overall_speedup"] == pytest.approx(bp["step_s"] / ours["step_s"])
    assert "not resolved" not in sweep_table([dict(out, point=_point())])


@pytest.mark.parametrize("grad", [0.95e-3, 1.02e-3, 1.2e-3])  # below, inside, barely above
def test_a_backward_inside_the_spread_is_recorded_but_not_divided(grad):
    forwards = [1.0e-3, 1.3e-3, 0.8e-3, 1.0e-3, 1.25e-3]
    runs = {
        "bp": _rows([5e-3] * 5, forwards),
        "bppsa": _rows([grad * s for s in (1.0, 1.01, 0.99, 1.0, 1.02)], forwards),
    }
    out = compare(runs)
    ours = out["methods"]["bppsa"]
    assert not ours["backward_resolved"]
    assert ours["backward_s"] == pytest.approx(ours["grad_s"] - out["forward_s"])  # as measured
    assert ours["backward_speedup"] is None
    assert ours["overall_speedup"] is not None
    table = sweep_table([dict(out, point=_point())])
    assert "*" in table.splitlines()[1] and "not resolved" in table
    assert "not resolved" in timing_table(out)


def _point():
    return {"sweep": "T", "length": 8, "batch": 4}
