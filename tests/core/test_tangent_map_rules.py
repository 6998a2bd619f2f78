"""Rules of the scan's tangent map (bppsa.scan._core.linear) that first-order use does not reach,
against the same through lax.scan:

* its JVP in the tangents alone (the residuals fixed): ``jax.grad`` or ``jax.jvp`` of a JVP
  with respect to its tangent, where the map's derivative is the map itself;
* the whole-batch backward's cotangent of an argument that the vmapped examples share (not
  batched): the sum over the examples."""

import functools

import jax
import jax.numpy as jnp
import pytest

import bppsa
from bppsa.models import RNN, rnn_cell
from tests.helpers import assert_trees_close

T, B, H = 9, 3, 4


@pytest.fixture
def problem(x64):
    params = RNN().init(2, H, key=jax.random.key(0), dtype=jnp.float64)
    xs = jax.random.normal(jax.random.key(1), (B, T, 2), jnp.float64)
    h0 = jax.random.normal(jax.random.key(2), (B, H), jnp.float64)
    return params, xs, h0


def outputs(scan, params, xs, h0, **kw):
    """The final state and every step's output of one example."""
    h, ys = scan(lambda h, x: (rnn_cell(params, h, x), jnp.sin(h)), h0, xs, **kw)
    return h, ys


@pytest.mark.parametrize("method", ["blelloch", bppsa.Chunked(2)], ids=str)
def test_derivatives_of_a_jvp_in_its_tangent(problem, method):
    params, xs, h0 = problem
    x, v, w = xs[0], jnp.cos(xs[1]), xs[2]

    def jvp_in(scan, **kw):
        f = functools.partial(outputs, scan, params, h0=h0[0], **kw)
        return lambda v: jax.jvp(f, (x,), (v,))[1]

    def both(scan, **kw):
        tangent = jvp_in(scan, **kw)
        forward = jax.jvp(tangent, (v,), (w,))  # (J v, J w)
        reverse = jax.grad(lambda v: sum(jnp.sum(t**2) for t in tangent(v)))(v)
        return forward, reverse

    actual = jax.jit(lambda: both(bppsa.scan, method=method))()
    assert_trees_close(actual, both(jax.lax.scan), jnp.float64)


@pytest.mark.parametrize("method", ["blelloch", bppsa.Chunked(2)], ids=str)
@pytest.mark.parametrize("shared", ["xs", "h0"])
def test_whole_batch_cotangent_of_a_shared_argument_is_the_sum(problem, method, shared):
    params, xs, h0 = problem
    in_axes = (None, 0) if shared == "xs" else (0, None)
    xs, h0 = (xs[0], h0) if shared == "xs" else (xs, h0[0])

    def loss(scan, xs, h0, **kw):
        def one(xs, h0):
            h, ys = outputs(scan, params, xs, h0, **kw)
            return jnp.sum(h**3) + jnp.sum(ys * jnp.arange(T)[:, None])

        return jnp.sum(jax.vmap(one, in_axes=in_axes)(xs, h0))

    with bppsa.trace_plans() as plans:
        actual = jax.jit(
            bppsa.grad(functools.partial(loss, bppsa.scan), argnums=(0, 1), method=method)
        )(xs, h0)
    assert [p.whole_batch for p in plans] == [True]  # the batched transpose ran
    expected = jax.grad(functools.partial(loss, jax.lax.scan), argnums=(0, 1))(xs, h0)
    assert_trees_close(actual, expected, jnp.float64)
