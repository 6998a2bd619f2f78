"""A method defined outside the library: one class with a linear scan over a stack or a list of
maps runs on both chains, scans over time steps and over layers, in both modes."""

from __future__ import annotations

import dataclasses
import functools
import typing

import jax
import jax.numpy as jnp

import bppsa
from bppsa.models import GRU, Chain, Conv2d, Flatten, Linear, ReLU, gru_cell
from bppsa.scan import Method, Supports, blelloch, sequential
from bppsa.scan._core import cost
from tests.helpers import assert_trees_close


@dataclasses.dataclass(frozen=True)
class HalfAndHalf(Method):
    """The modified Blelloch scan over a stack of steps, the sequential one over a list of
    layers; records what it scanned (at trace time)."""

    seen: typing.ClassVar[list] = []
    supports: typing.ClassVar[Supports] = Supports(layers=True)

    def scan(self, g_last, maps, offsets):
        self.seen.append(type(maps).__name__)
        if isinstance(maps, list):
            return sequential(g_last, maps, offsets)
        return blelloch(g_last, maps, offsets)

    def memory(self, fp):
        return fp.span_bytes(fp.span_floats(fp.length))

    def cost(self, fp):
        return cost.plus(cost.jacobians(fp, fp.length), cost.blelloch_scan(fp, fp.length))


def test_a_method_defined_here_runs_on_both_chains(x64):
    HalfAndHalf.seen.clear()
    params = GRU().init(2, 3, key=jax.random.key(0), dtype=jnp.float64)
    xs = jax.random.normal(jax.random.key(1), (9, 2), jnp.float64)

    def over_time(scan, params):
        carry, ys = scan(lambda h, x: (gru_cell(params, h, x), h), jnp.zeros(3), xs)
        return jnp.sum(carry**2) + jnp.sum(jnp.sin(ys))

    chain = Chain([Conv2d(1, 2, 3), ReLU(), Flatten(), Linear(8, 2)])
    layers = jax.tree.map(lambda a: a.astype(jnp.float64), chain.init(jax.random.key(2)))
    images = jax.random.normal(jax.random.key(3), (2, 1, 4, 4), jnp.float64)

    def over_layers(apply, layers):
        return jnp.sum(jnp.tanh(apply(layers, images)))

    method = HalfAndHalf()
    with bppsa.trace_plans() as plans:
        time_grad = jax.jit(bppsa.grad(functools.partial(over_time, bppsa.scan), method=method))
        layer_grad = jax.jit(bppsa.grad(functools.partial(over_layers, chain.apply), method=method))
        actual = (time_grad(params), layer_grad(layers))
    expected = (
        jax.grad(functools.partial(over_time, jax.lax.scan))(params),
        jax.grad(functools.partial(over_layers, chain.forward))(layers),
    )
    assert_trees_close(actual, expected, jnp.float64)
    assert [plan.backward for plan in plans] == [method, method]
    assert set(HalfAndHalf.seen) == {"list", "Structured"}
    # Forward mode over time solves the tangent recurrence with the same scan.
    HalfAndHalf.seen.clear()
    tangent = jax.tree.map(jnp.ones_like, params)
    jvp = jax.jvp(functools.partial(over_time, functools.partial(bppsa.scan, method=method)),
                  (params,), (tangent,))[1]  # fmt: skip
    reference = jax.jvp(functools.partial(over_time, jax.lax.scan), (params,), (tangent,))[1]
    assert_trees_close(jvp, reference, jnp.float64)
    assert HalfAndHalf.seen
