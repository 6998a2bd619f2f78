"""The Newton forward hands the Jacobians of its final trajectory to the backward: exact
gradients of every order, and one evaluation of the Jacobians fewer."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import bppsa
from bppsa.scan._core import backward
from bppsa.scan._core.problem import prepare
from tests.core.test_newton import _cells, _info_recorder, _xs
from tests.helpers import assert_trees_close, compiled_flops, spread

NAMES = ("rnn", "gru", "lstm", "autodiff")
WHOLE = [bppsa.Blelloch(), bppsa.SequentialScan(), bppsa.Chunked(3)]


@pytest.fixture
def given(monkeypatch):
    """Records, for every span the backward runs, whether the forward's Jacobians came with it."""
    seen = []
    span = backward.span_backward

    def spy(*args, **kwargs):
        seen.append(args[9] is not None if len(args) > 9 else False)
        return span(*args, **kwargs)

    monkeypatch.setattr(backward, "span_backward", spy)
    return seen


def _loss(scan, xs, names=NAMES, **kw):
    cells = _cells(jnp.float64)
    total = 0.0
    for name in names:
        body, init = cells[name]
        carry, ys = scan(body, init, xs, **kw)
        total += sum(jnp.sum(jnp.sin(leaf)) for leaf in jax.tree.leaves((carry, ys)))
    return total


REFERENCE = functools.partial(_loss, jax.lax.scan)


@pytest.mark.parametrize("method,iterations", spread(WHOLE, [100, 1]))
def test_gradients_with_the_forwards_jacobians_equal_jax_grad(x64, given, method, iterations):
    # iterations=1: the forward falls back after one iteration, and the sequential continuation
    # forms the Jacobians of the steps it computes.
    infos, record = _info_recorder()
    newton = bppsa.Newton(max_iterations=iterations, callback=record)
    scan = functools.partial(bppsa.scan, method=method, forward=newton)
    xs = _xs(23, jnp.float64)
    actual = jax.jit(jax.grad(functools.partial(_loss, scan)))(xs)
    assert_trees_close(actual, jax.grad(REFERENCE)(xs), jnp.float64)
    assert given and all(given), given  # every scan's backward got the forward's Jacobians
    assert any(info["fallback_steps"] > 0 for info in infos) == (iterations == 1), infos


OUTER = {
    "hessian": lambda f, xs: jax.hessian(f)(xs[:5]),
    "grad of grad": lambda f, xs: jax.grad(lambda x: jnp.sum(jnp.cos(jax.grad(f)(x))))(xs[:6]),
    "jvp of grad": lambda f, xs: jax.jvp(jax.grad(f), (xs,), (jnp.ones_like(xs),))[1],
    "vmap of grad": lambda f, xs: jax.vmap(jax.grad(f))(jnp.stack([xs, 0.5 * xs])),
}


@pytest.mark.parametrize("outer", list(OUTER))
def test_outer_derivatives_through_the_shared_jacobians_are_exact(x64, given, outer):
    # The shared Jacobians are an output of the forward with their own tangent (the JVP of their
    # builder) and cotangent (its VJP): with a zero tangent the Hessian and the JVP of the
    # gradient are off by O(1), without the cotangent the gradient of a gradient is.
    scan = functools.partial(bppsa.scan, method=bppsa.Blelloch(), forward=bppsa.Newton())
    loss = functools.partial(_loss, scan, names=("rnn", "autodiff"))
    xs = _xs(17, jnp.float64)
    reference = functools.partial(_loss, jax.lax.scan, names=("rnn", "autodiff"))
    actual = OUTER[outer](loss, xs)
    assert_trees_close(actual, OUTER[outer](reference, xs), jnp.float64)
    assert given and all(given)


def test_the_backward_forms_no_jacobians_of_its_own(x64):
    # XLA's count of the compiled gradient: sharing removes (nearly) all the work of forming
    # the Jacobians of all steps once (counted by compiling that alone).
    h, length = 16, 64
    w = jax.random.normal(jax.random.key(0), (h, h), jnp.float64) / np.sqrt(h)
    cell = lambda c, x: (jnp.tanh(w @ c + x), c)  # autodiff Jacobians: h VJPs per step
    xs = jax.random.normal(jax.random.key(1), (length, h), jnp.float64)

    def grad_flops(share):
        newton = bppsa.Newton(share_jacobians=share)
        scan = lambda xs: bppsa.scan(cell, jnp.zeros(h), xs, method="blelloch", forward=newton)
        return compiled_flops(jax.grad(lambda xs: jnp.sum(scan(xs)[1])), xs)

    problem, _ = prepare(cell, jnp.zeros(h), xs, None, reverse=False, batch=None)
    before, consts = jnp.zeros((length, h)), problem.body.consts
    with_jacobians = compiled_flops(lambda b, x: problem.all_steps()(consts, b, x), before, xs)
    steps_alone = compiled_flops(lambda b, x: problem.all_steps(False)(consts, b, x)[0], before, xs)
    saved = grad_flops(False) - grad_flops(True)
    assert saved >= 0.9 * (with_jacobians - steps_alone), (saved, with_jacobians, steps_alone)


def test_the_backward_forms_its_own_where_it_must(x64, given):
    body, init = _cells(jnp.float64)["gru"]
    xs = _xs(19, jnp.float64)
    expected = jax.grad(lambda xs: jnp.sum(jax.lax.scan(body, init, xs)[1]))(xs)

    def grad(method, newton, **kw):
        scan = functools.partial(bppsa.scan, body, init, method=method, forward=newton, **kw)
        given.clear()
        actual = jax.grad(lambda xs: jnp.sum(scan(xs)[1]))(xs)
        assert_trees_close(actual, expected, jnp.float64)
        return list(given)

    assert grad(bppsa.Blelloch(), bppsa.Newton()) == [True]
    with bppsa.trace_plans() as plans:
        grad(bppsa.Blelloch(), bppsa.Newton())
    assert plans[0].forward_jacobians is True
    # a time-blocked backward forms one block's Jacobians at a time (the loop over the full
    # blocks and the shorter first block: two spans traced)
    assert grad(bppsa.Blocked(bppsa.Blelloch(), 4), bppsa.Newton()) == [False, False]
    with bppsa.trace_plans() as plans:
        assert grad(bppsa.Blelloch(), bppsa.Newton(share_jacobians=False)) == [False]
    assert plans[0].forward_jacobians is False
    # a memory limit that fits the backward but not one more stack of Jacobians
    need = bppsa.estimate_memory(body, init, xs, method=bppsa.Blelloch())
    assert grad(bppsa.Blelloch(), bppsa.Newton(), memory_limit=need) == [False]
    with pytest.raises(TypeError, match="share_jacobians must be a bool"):
        bppsa.Newton(share_jacobians=1)
