"""The library's ``Diagonal`` element (what ``bppsa.Newton(quasi=True)`` scans) through every
algorithm, against a Python loop, and the quasi-Newton forward solved by each method's scan."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import bppsa
from bppsa.scan._algorithms import aggregate, blelloch, sequential
from bppsa.scan._chunked import chunked
from bppsa.scan._elements import Diagonal
from tests.helpers import NEWTON_RTOL, assert_trees_close

ALGORITHMS = {
    "blelloch": blelloch,
    "sequential": sequential,
    "chunked": functools.partial(chunked, chunks=3),
}


def python_loop(g, d, b):
    """``g_{t-1} = d_t * g_t + b_t`` from ``t = T``; returns ``g_0, ..., g_T``."""
    out = [g]
    for k in reversed(range(d.shape[0])):
        out.append(d[k] * out[-1] + b[k])
    return np.stack(out[::-1])


@pytest.mark.parametrize("name", sorted(ALGORITHMS))
@pytest.mark.parametrize("length", [1, 4, 7])
@pytest.mark.parametrize("batch", [(), (2,)])
def test_algorithms_over_diagonal_maps(x64, name, length, batch):
    rng = np.random.default_rng(length)
    n = 3
    d, b = rng.normal(size=(length, *batch, n)), rng.normal(size=(length, *batch, n))
    g = rng.normal(size=(*batch, n))
    out = ALGORITHMS[name](jnp.asarray(g), Diagonal(jnp.asarray(d)), jnp.asarray(b))
    assert_trees_close(out, python_loop(g, d, b), jnp.float64)


def test_aggregate_of_diagonal_maps(x64):
    rng = np.random.default_rng(0)
    d, b = rng.normal(size=(5, 2, 3)), rng.normal(size=(5, 2, 3))
    matrix, offset = aggregate(Diagonal(jnp.asarray(d)), jnp.asarray(b), jnp.zeros((2, 3)))
    np.testing.assert_allclose(offset, python_loop(np.zeros((2, 3)), d, b)[0], rtol=1e-12)
    expected = np.prod(d, axis=0)[..., :, None] * np.eye(3)
    np.testing.assert_allclose(matrix, expected, rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("method", [bppsa.Chunked(2), bppsa.SequentialScan()], ids=str)
def test_quasi_newton_with_the_methods_own_scan(x64, method):
    w = 0.4 * jax.random.normal(jax.random.key(0), (4, 4), jnp.float64)
    xs = jax.random.normal(jax.random.key(1), (11, 4), jnp.float64)
    body = lambda h, x: (jnp.tanh(w @ h + x), h)
    forward = bppsa.Newton(quasi=True)
    actual = jax.jit(lambda: bppsa.scan(body, jnp.zeros(4), xs, forward=forward, method=method))()
    expected = jax.lax.scan(body, jnp.zeros(4), xs)
    assert_trees_close(actual, expected, jnp.float64, NEWTON_RTOL)
