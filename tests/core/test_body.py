"""The body is traced once; an analytic cell that cannot be used says so; batch= overrides the
vmap batch that Auto() weighs."""

import warnings

import jax
import jax.numpy as jnp
import pytest

import bppsa
from bppsa.models import RNN, rnn_cell
from tests.helpers import assert_trees_close

XS = jnp.linspace(-1.0, 1.0, 30).reshape(10, 3)
PARAMS = RNN().init(3, 4, key=jax.random.key(0))


@pytest.mark.parametrize(
    "method",
    [
        "auto",
        "blelloch",
        bppsa.Chunked(3),
        bppsa.Blocked(bppsa.Chunked(2), 4),
        bppsa.SequentialScan(),
        "sequential",
    ],
    ids=str,
)
def test_the_body_is_traced_once(method):
    calls = []

    def body(h, x):
        calls.append(1)
        return rnn_cell(PARAMS, h, x), h.sum()

    def loss(h0):
        h, ys = bppsa.scan(body, h0, XS, method=method)
        return jnp.sum(h) + jnp.sum(ys)

    jax.jit(jax.grad(loss))(jnp.ones(4))
    assert len(calls) == 1
    calls.clear()
    bppsa.scan(body, jnp.ones(4), XS, method=method)  # forward only, outside jit
    assert len(calls) == 1


def test_a_cell_that_cannot_be_used_warns_and_falls_back_to_autodiff():
    def body(h, x):
        return 2.0 * rnn_cell(PARAMS, h, x), None  # not the whole carry map

    def loss(scan, h0):
        return scan(body, h0, XS)[0].sum()

    with (
        bppsa.trace_plans() as plans,
        pytest.warns(bppsa.AnalyticJacobianWarning, match="rnn_cell"),
    ):
        actual = jax.grad(lambda h0: loss(bppsa.scan, h0))(jnp.ones(4))
    assert [plan.jacobians for plan in plans] == ["autodiff"]
    assert_trees_close(actual, jax.grad(lambda h0: loss(jax.lax.scan, h0))(jnp.ones(4)), "float32")


def test_a_cell_whose_parameters_depend_on_the_carry_warns():
    def body(h, x):
        params = dict(PARAMS, bias_hh=PARAMS["bias_hh"] + h)
        return rnn_cell(params, h, x), None

    with pytest.warns(bppsa.AnalyticJacobianWarning, match="parameters or input depend on"):
        jax.grad(lambda h0: bppsa.scan(body, h0, XS, method="blelloch")[0].sum())(jnp.ones(4))


def _unusable(h, x):
    return 2.0 * rnn_cell(PARAMS, h, x), h  # not the whole carry map


@pytest.mark.parametrize(
    "run",
    [
        lambda: bppsa.scan(_unusable, jnp.ones(4), XS, method="blelloch"),  # forward only
        lambda: jax.jit(lambda h0: bppsa.scan(_unusable, h0, XS)[0])(jnp.ones(4)),
        lambda: jax.grad(  # plain back-propagation builds no Jacobian
            lambda h0: bppsa.scan(_unusable, h0, XS, method="sequential")[0].sum()
        )(jnp.ones(4)),
    ],
    ids=["forward", "jitted forward", "sequential backward"],
)
def test_a_cell_that_cannot_be_used_warns_only_where_jacobians_are_built(run):
    with warnings.catch_warnings():
        warnings.simplefilter("error", bppsa.AnalyticJacobianWarning)
        run()


def test_a_carry_of_the_wrong_type_raises_before_any_warning():
    with warnings.catch_warnings():
        warnings.simplefilter("error", bppsa.AnalyticJacobianWarning)
        with pytest.raises(TypeError, match="input carry init has type int32"):
            jax.grad(lambda w: bppsa.scan(_unusable, jnp.ones(4, jnp.int32), w * XS)[0].sum())(1.0)


def test_the_warning_points_at_the_line_that_takes_the_gradient():
    with pytest.warns(bppsa.AnalyticJacobianWarning) as record:
        jax.grad(lambda h0: bppsa.scan(_unusable, h0, XS, method="blelloch")[0].sum())(jnp.ones(4))
    assert [warning.filename for warning in record] == [__file__]


def test_a_matched_cell_does_not_warn():
    with bppsa.trace_plans() as plans, warnings.catch_warnings():
        warnings.simplefilter("error", bppsa.AnalyticJacobianWarning)
        bppsa.scan(lambda h, x: (rnn_cell(PARAMS, h, x), None), jnp.ones(4), XS)
    assert [plan.jacobians for plan in plans] == ["analytic"]


def test_batch_overrides_the_vmap_batch():
    body = lambda h, x: (rnn_cell(PARAMS, h, x), None)
    for batch in (None, 1, 512):
        with bppsa.trace_plans() as plans:
            bppsa.scan(body, jnp.ones(4), XS, batch=batch)
        (plan,) = plans
        assert plan.batch == (batch or 1)
        # Outside jax.vmap, one example (batch None or 1) is a single sequence.
        single = (batch or 1) == 1
        assert plan.method == bppsa.Auto().choose(10, 4, batch=batch or 1, element=4, single=single)
    with bppsa.trace_plans() as plans:
        jax.vmap(lambda xs: bppsa.scan(body, jnp.ones(4), xs)[0])(jnp.stack([XS] * 6))
    assert plans[0].batch == 6
    with pytest.raises(ValueError, match="batch must be a positive int"):
        bppsa.scan(body, jnp.ones(4), XS, batch=0)
