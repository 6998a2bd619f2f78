"""The batching rule of the scan's tangent map (bppsa.scan._core.linear) with the batch on an
axis other than 0 or 1: ``jax.vmap`` of a ``jax.jvp`` through bppsa.scan equals the same through
lax.scan when the tangents (and the primals) carry the batch on axis 2 or on the last axis.

With a batch on axis 0 or 1, moving it to the front and moving the front to it are the same
permutation, so only a later axis tells them apart."""

import functools

import jax
import jax.numpy as jnp
import pytest

import bppsa
from tests.helpers import assert_trees_close

H, I, T, B = 3, 2, 7, 4


@pytest.fixture
def problem(x64):
    keys = jax.random.split(jax.random.key(11), 4)
    w = jax.random.normal(keys[0], (H, H), jnp.float64) / H
    u = jax.random.normal(keys[1], (H, I, 2), jnp.float64)
    xs = jax.random.normal(keys[2], (T, I, 2), jnp.float64)  # rank 3: axis 2 is not the last
    h0 = jax.random.normal(keys[3], (H,), jnp.float64)
    return (w, u), h0, xs


def run(scan, params, h0, xs, **kw):
    w, u = params

    def body(h, x):
        h = jnp.tanh(w @ h + jnp.einsum("hij,ij->h", u, x))
        return h, h * x[0, 0]

    return scan(body, h0, xs, **kw)


def tangents(shape, axis):
    """``B`` distinct tangents of an array of ``shape``, stacked on ``axis``."""
    n = 1
    for s in shape:
        n *= s
    base = jnp.arange(n, dtype=jnp.float64).reshape(shape) / n - 0.3
    return jnp.stack([jnp.cos((k + 1) * base) for k in range(B)], axis=axis)


METHODS = ["blelloch", bppsa.Chunked(2), bppsa.SequentialScan()]


@pytest.mark.parametrize("method", METHODS, ids=str)
@pytest.mark.parametrize("axis", [2, -1])
def test_vmapped_tangents_on_a_late_axis(problem, method, axis):
    """The primals are shared; the tangents of ``xs``, ``h0`` and the parameters are batched on
    ``axis`` (2 or the last; ``h0``'s tangent has rank 2 with the batch, so -1 is axis 1)."""
    params, h0, xs = problem
    dxs = tangents(xs.shape, axis)
    dh0 = tangents(h0.shape, -1)
    dparams = (tangents(params[0].shape, -1), tangents(params[1].shape, axis))

    def jvp(scan, **kw):
        def one(dparams, dh0, dxs):
            f = functools.partial(run, scan, **kw)
            return jax.jvp(f, (params, h0, xs), (dparams, dh0, dxs))

        return jax.vmap(one, in_axes=((-1, axis), -1, axis))(dparams, dh0, dxs)

    actual = jax.jit(lambda: jvp(bppsa.scan, method=method))()
    expected = jvp(jax.lax.scan)
    assert_trees_close(actual, expected, jnp.float64)


@pytest.mark.parametrize("method", METHODS[:2], ids=str)
def test_vmapped_primals_and_tangents_on_the_last_axis(problem, method):
    """Both the primal ``xs`` (a residual of the tangent map) and its tangent carry the batch
    on the last axis."""
    params, h0, _ = problem
    batch_xs = tangents((T, I, 2), -1)
    dxs = tangents((T, I, 2), -1)[::-1]

    def jvp(scan, **kw):
        def one(xs, dxs):
            return jax.jvp(lambda xs: run(scan, params, h0, xs, **kw), (xs,), (dxs,))

        return jax.vmap(one, in_axes=(-1, -1))(batch_xs, dxs)

    actual = jax.jit(lambda: jvp(bppsa.scan, method=method))()
    expected = jvp(jax.lax.scan)
    assert_trees_close(actual, expected, jnp.float64)
