"""The test suite's own helpers: ``spread`` keeps every value of every axis in the default suite."""

import itertools

from tests.helpers import marked_slow, spread


def test_spread_crosses_the_first_axes_rotates_the_rest_and_marks_the_others_slow():
    axes = (["a", "b", "c"], [(1, "x"), (2, "y")], [10, 20, 30, 40])
    params = spread(*axes, crossed=2)
    assert [p.values for p in params] == [(c, n, w, k) for c, (n, w), k in itertools.product(*axes)]
    default = [p.values for p in params if not p.marks]
    assert {v[:3] for v in default} == {(c, n, w) for c in "abc" for n, w in axes[1]}
    assert {v[3] for v in default} == {10, 20, 30, 40}
    assert len(default) == 6
    assert all(m.name == "slow" for p in params if p.marks for m in p.marks)
    # An axis longer than the crossed combinations still has each of its values once.
    assert {p.values[1] for p in spread(["a"], [1, 2, 3]) if not p.marks} == {1, 2, 3}


def test_marked_slow():
    (param,) = marked_slow("blelloch")
    assert param.values == ("blelloch",) and [m.name for m in param.marks] == ["slow"]
