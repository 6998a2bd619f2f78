"""The options of bppsa.grad (method, memory limit, finiteness check) are the ones that run,
also when the function is already jax.jit-compiled, and the innermost setting wins."""

import math

import jax
import jax.numpy as jnp
import pytest

import bppsa
from tests.helpers import assert_trees_close

XS = jnp.linspace(-1.0, 1.0, 40).reshape(20, 2)


def body_of(w):
    return lambda h, x: (jnp.tanh(w @ h + x), None)


def plain(w):
    return jax.lax.scan(body_of(w), jnp.ones(2), XS)[0].sum()


def with_bppsa(w):
    return bppsa.scan(body_of(w), jnp.ones(2), XS)[0].sum()


W = jnp.array([[0.5, -0.3], [0.2, 0.4]])


def test_a_jitted_loss_gets_the_method_of_each_grad():
    loss = jax.jit(lambda w: with_bppsa(w))
    expected = jax.grad(plain)(W)
    cases = [
        ("blelloch", bppsa.Blelloch()),
        ("sequential", bppsa.Sequential()),
        (bppsa.Chunked(3), bppsa.Chunked(3)),
        (bppsa.Blocked(bppsa.Blelloch(), 4), bppsa.Blocked(bppsa.Blelloch(), 4)),
    ]
    for method, runs in cases:
        with bppsa.trace_plans() as plans:
            actual = bppsa.grad(loss, method=method)(W)
        assert [plan.method for plan in plans] == [runs], method
        assert_trees_close(actual, expected, jnp.float32)
    with bppsa.trace_plans() as plans:  # the same options again: jit's cache serves them
        bppsa.grad(loss, method="blelloch")(W)
    assert plans == []


def test_a_jitted_function_inside_the_loss_gets_the_method():
    inner = jax.jit(lambda w: with_bppsa(w))  # a function of its own: nothing cached yet

    def loss(w):
        return 2.0 * inner(w)

    for method, runs in (("blelloch", bppsa.Blelloch()), ("sequential", bppsa.Sequential())):
        with bppsa.trace_plans() as plans:
            jax.jit(bppsa.grad(loss, method=method))(W)
        assert [plan.method for plan in plans] == [runs]


def test_a_jitted_loss_gets_the_memory_limit():
    loss = jax.jit(lambda w: with_bppsa(w))
    bppsa.grad(loss, method="blelloch", memory_limit=math.inf)(W)
    with pytest.raises(bppsa.MemoryLimitError):
        bppsa.grad(loss, method="blelloch", memory_limit=1e3)(W)


def test_a_jitted_loss_gets_the_finiteness_check():
    def with_nan(w):
        xs = XS.at[7, 0].set(jnp.nan)
        return bppsa.scan(body_of(w), jnp.ones(2), xs, method="blelloch")[0].sum()

    loss = jax.jit(with_nan)
    assert not jnp.isfinite(bppsa.grad(loss)(W)).all()  # unchecked: NaNs propagate
    with pytest.raises(Exception, match=r"Jacobian is that of time step xs\[7\]"):
        jax.block_until_ready(bppsa.grad(loss, check_finite=True)(W))


def test_the_innermost_setting_wins():
    def inner_loss(w, method=None):
        return bppsa.scan(body_of(w), jnp.ones(2), XS, method=method)[0].sum()

    def outer(w, inner_method, scan_method):
        g = bppsa.grad(lambda w: inner_loss(w, scan_method), method=inner_method)(w)
        return jnp.sum(g**2)

    cases = [
        ((None, None), bppsa.Chunked(2)),  # both inherit the outer grad's method
        (("blelloch", None), bppsa.Blelloch()),  # the inner grad's method
        (("blelloch", "sequential"), bppsa.Sequential()),  # the scan's own method
    ]
    for (inner_method, scan_method), runs in cases:
        with bppsa.trace_plans() as plans:
            bppsa.grad(outer, method=bppsa.Chunked(2))(W, inner_method, scan_method)
        assert {plan.method for plan in plans} == {runs}, (inner_method, scan_method)
