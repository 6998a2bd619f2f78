"""Modules with leaves that are not float arrays (an equinox module's activation function, an
nnx model's RNG key and counter): ``bppsa.grad`` fails on them exactly as ``jax.grad`` does,
and the libraries' own filters (``eqx.partition``, ``eqx.filter_grad``, ``nnx.split(model,
nnx.Param, ...)``, ``nnx.grad``) work with ``bppsa.scan`` as they do with ``jax.lax.scan``."""

from collections.abc import Callable

import jax
import jax.numpy as jnp
import pytest

pytest.importorskip("equinox")
pytest.importorskip("flax")

import equinox as eqx
from flax import nnx

import bppsa
from tests.helpers import assert_trees_close

H, I, T, B = 3, 2, 5, 2
METHOD = bppsa.Blelloch()


def batch(seed=1):
    return jax.random.normal(jax.random.key(seed), (B, T, I), jnp.float64)


class Elman(eqx.Module):
    """An equinox cell with a non-array leaf (its activation function)."""

    linear: eqx.nn.Linear
    activation: Callable = jnp.tanh

    def __call__(self, x, h):
        return self.activation(self.linear(jnp.concatenate([x, h])))


def equinox_loss(scan, **options):
    def loss(cell, xs):
        def one(x):
            h, ys = scan(lambda h, x: (cell(x, h), h[0]), jnp.ones(H), x, **options)
            return (h**2).sum() + ys.sum()

        return jax.vmap(one)(xs).sum()

    return loss


def test_an_equinox_module_of_arrays_is_differentiated_directly(x64):
    cell = eqx.nn.GRUCell(I, H, dtype=jnp.float64, key=jax.random.key(0))  # arrays only
    xs = batch()
    actual = jax.jit(bppsa.grad(equinox_loss(bppsa.scan), method=METHOD))(cell, xs)
    expected = jax.jit(jax.grad(equinox_loss(jax.lax.scan)))(cell, xs)
    assert isinstance(actual, eqx.nn.GRUCell)
    assert_trees_close(actual, expected, jnp.float64)


def test_an_equinox_module_with_a_function_leaf_is_partitioned(x64):
    cell = Elman(eqx.nn.Linear(I + H, H, dtype=jnp.float64, key=jax.random.key(0)))
    xs = batch()
    with pytest.raises(TypeError, match="not a valid JAX type"):  # as jax.grad
        bppsa.grad(equinox_loss(bppsa.scan), method=METHOD)(cell, xs)
    with pytest.raises(TypeError, match="not a valid JAX type"):
        jax.grad(equinox_loss(jax.lax.scan))(cell, xs)

    params, static = eqx.partition(cell, eqx.is_inexact_array)

    def partitioned(scan):
        return lambda params, xs: equinox_loss(scan)(eqx.combine(params, static), xs)

    actual = jax.jit(bppsa.grad(partitioned(bppsa.scan), method=METHOD))(params, xs)
    expected = jax.jit(jax.grad(partitioned(jax.lax.scan)))(params, xs)
    assert_trees_close(actual, expected, jnp.float64)
    # eqx.filter_grad does the partitioning; the scan is then told its method itself.
    with bppsa.trace_plans() as plans:
        filtered = eqx.filter_jit(eqx.filter_grad(equinox_loss(bppsa.scan, method=METHOD)))(
            cell, xs
        )
    assert [plan.backward for plan in plans] == [METHOD]
    assert_trees_close(eqx.filter(filtered, eqx.is_inexact_array), actual, jnp.float64)


class Model(nnx.Module):
    """An nnx model with RNG state (a dropout, here in evaluation mode): a key and a count."""

    def __init__(self, rngs):
        kw = dict(dtype=jnp.float64, param_dtype=jnp.float64)
        self.cell = nnx.LSTMCell(I, H, rngs=rngs, **kw)
        self.dropout = nnx.Dropout(0.5, deterministic=True, rngs=rngs)
        self.head = nnx.Linear(H, 1, rngs=rngs, **kw)

    def loss(self, scan, xs, **options):
        def one(x):
            carry = (jnp.ones(H), jnp.zeros(H))
            (_, h), _ = scan(lambda c, x: self.cell(c, x), carry, x, **options)
            return h

        return (self.head(self.dropout(jax.vmap(one)(xs))) ** 2).sum()


def test_an_nnx_model_with_rng_state_is_split_by_param(x64):
    model, xs = Model(nnx.Rngs(0, dropout=1)), batch()
    graphdef, state = nnx.split(model)
    dtypes = {leaf.dtype for leaf in jax.tree.leaves(state)}
    assert jnp.dtype("uint32") in dtypes  # the RNG count (and a key): not differentiable

    def whole(scan):
        return lambda state, xs: nnx.merge(graphdef, state).loss(scan, xs)

    with pytest.raises(TypeError, match="grad requires real- or complex-valued inputs"):
        bppsa.grad(whole(bppsa.scan), method=METHOD)(state, xs)  # as jax.grad

    graphdef, params, rest = nnx.split(model, nnx.Param, ...)

    def by_param(scan):
        return lambda params, xs: nnx.merge(graphdef, params, rest).loss(scan, xs)

    actual = jax.jit(bppsa.grad(by_param(bppsa.scan), method=METHOD))(params, xs)
    expected = jax.jit(jax.grad(by_param(jax.lax.scan)))(params, xs)
    assert_trees_close(actual, expected, jnp.float64)
    # nnx.grad differentiates the nnx.Param variables only; the scan is told its method.
    grads = nnx.jit(nnx.grad(lambda m, xs: m.loss(bppsa.scan, xs, method=METHOD)))(model, xs)
    assert_trees_close(nnx.state(grads, nnx.Param), actual, jnp.float64)
