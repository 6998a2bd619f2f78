"""A real carry driven by complex inputs and parameters: the complex leaves get cotangents and
tangents too (they are inexact, like floats), through a Jacobian method, as through lax.scan.

(A complex CARRY is another matter: the Jacobian methods refuse it, tests/test_properties.py.)"""

import functools

import jax
import jax.numpy as jnp
import pytest

import bppsa
from tests.helpers import assert_trees_close

T, H = 7, 3


@pytest.fixture
def problem(x64):
    keys = jax.random.split(jax.random.key(0), 4)
    w = jax.random.normal(keys[0], (H, H), jnp.float64) / H
    c = jax.random.normal(keys[1], (H,), jnp.complex128)
    xs = jax.random.normal(keys[2], (T, H), jnp.complex128)
    h0 = jax.random.normal(keys[3], (H,), jnp.float64)
    return w, c, xs, h0


def as_real(tree):
    """Complex leaves as their real and imaginary parts (the tolerance helper compares reals)."""
    return jax.tree.map(lambda a: jnp.stack([a.real, a.imag]) if jnp.iscomplexobj(a) else a, tree)


def loss(scan, w, c, xs, h0, **kw):
    def body(h, x):
        h = jnp.tanh(w @ h + jnp.real(c * x) + 0.5 * jnp.imag(x))
        return h, jnp.abs(x * h) ** 2

    h, ys = scan(body, h0, xs, **kw)
    return jnp.sum(h**2) + jnp.sum(ys)


@pytest.mark.parametrize("method", ["blelloch", bppsa.Chunked(2)], ids=str)
def test_gradients_and_tangents_of_complex_leaves(problem, method):
    args = problem
    argnums = (0, 1, 2, 3)
    with bppsa.trace_plans() as plans:
        actual = jax.jit(
            bppsa.grad(functools.partial(loss, bppsa.scan), argnums=argnums, method=method)
        )(*args)
    assert plans and all(p.method.keeps_carries for p in plans)
    expected = jax.grad(functools.partial(loss, jax.lax.scan), argnums=argnums)(*args)
    assert_trees_close(as_real(actual), as_real(expected), jnp.float64)

    tangents = tuple(jnp.ones_like(a) * (1 + 0.5j if jnp.iscomplexobj(a) else 1) for a in args)
    actual = jax.jvp(functools.partial(loss, bppsa.scan, method=method), args, tangents)
    expected = jax.jvp(functools.partial(loss, jax.lax.scan), args, tangents)
    assert_trees_close(as_real(actual), as_real(expected), jnp.float64)
