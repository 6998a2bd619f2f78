"""A new backward method is one class: its scan, memory and cost. Defined here, outside the
library, it runs through ``bppsa.grad`` in both modes, in time blocks, and the memory guard, the
policy's cost model and the check of what it supports handle it without a change to them."""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import pytest

import bppsa
from bppsa.models import GRU, Chain, Linear, ReLU, gru_cell
from bppsa.scan import Method, Supports
from bppsa.scan._core import cost
from bppsa.scan._profile import GPU
from tests.helpers import assert_trees_close

SEQUENTIAL_SCAN = bppsa.SequentialScan()


@dataclasses.dataclass(frozen=True)
class Reversed(Method):
    """``method``'s backward, solved as the forward recurrence of the transposed maps in
    reversed time (``forward_scan``): the same cotangents through a flipped copy of the maps."""

    method: Method = SEQUENTIAL_SCAN
    supports = Supports()  # over time steps only

    def scan(self, g_last, maps, offsets):
        if offsets is None:
            offsets = jnp.zeros((len(maps), *g_last.shape), g_last.dtype)
        flipped = maps.transpose().flip()
        return self.method.forward_scan(g_last, flipped, offsets[::-1])[::-1]

    def memory(self, fp):
        return self.method.memory(fp) + fp.bytes(fp.length * fp.element)  # the flipped copy

    def cost(self, fp):
        copy = cost.Cost(1, 0, 2 * fp.itemsize * fp.length * fp.batch * fp.element)
        return cost.plus(self.method.cost(fp), copy)


def gru_params(dtype):
    return GRU().init(2, 3, key=jax.random.key(0), dtype=dtype)


def loss(scan, params, xs, h0):
    carry, ys = scan(lambda h, x: (gru_cell(params, h, x), h), h0, xs)
    return jnp.sum(carry**2) + jnp.sum(jnp.sin(ys))


@pytest.mark.parametrize(
    "method",
    [Reversed(), Reversed(bppsa.Blelloch()), bppsa.Blocked(Reversed(bppsa.Chunked(2)), 4)],
    ids=repr,
)
def test_it_gives_lax_scans_gradients_and_tangents(x64, method):
    xs = jax.random.normal(jax.random.key(1), (11, 2), jnp.float64)
    h0 = jnp.linspace(-0.5, 0.5, 3)
    params = gru_params(jnp.float64)
    args = (params, xs, h0)
    with bppsa.trace_plans() as plans:
        actual = jax.jit(bppsa.grad(functools.partial(loss, bppsa.scan), (0, 1, 2), method=method))(
            *args
        )
    assert [plan.backward for plan in plans] == [method]
    expected = jax.grad(functools.partial(loss, jax.lax.scan), (0, 1, 2))(*args)
    assert_trees_close(actual, expected, jnp.float64)
    # Forward mode solves the tangent recurrence with the same scan.
    tangent = jax.tree.map(jnp.ones_like, args)
    scan = functools.partial(bppsa.scan, method=method)
    jvp = jax.jvp(lambda *a: loss(scan, *a), args, tangent)[1]
    assert_trees_close(
        jvp, jax.jvp(lambda *a: loss(jax.lax.scan, *a), args, tangent)[1], jnp.float64
    )
    # A batch: the whole-batch backward runs it with a batch axis after the step axis.
    batch = jnp.stack([xs, -xs, 0.5 * xs])
    grad = bppsa.grad(lambda p, x: jax.vmap(lambda x: loss(scan, p, x, h0))(x).sum())
    reference = jax.grad(lambda p, x: jax.vmap(lambda x: loss(jax.lax.scan, p, x, h0))(x).sum())
    assert_trees_close(grad(params, batch), reference(params, batch), jnp.float64)


def test_the_memory_guard_weighs_its_own_estimate():
    xs = jnp.ones((64, 2), jnp.float32)
    params = gru_params(jnp.float32)
    body = lambda h, x: (gru_cell(params, h, x), None)
    method = Reversed()
    need = bppsa.estimate_memory(body, jnp.zeros(3), xs, method=method)
    assert need > bppsa.estimate_memory(body, jnp.zeros(3), xs, method=bppsa.SequentialScan())

    def run(limit):
        fn = lambda p: bppsa.scan(
            lambda h, x: (gru_cell(p, h, x), None), jnp.zeros(3), xs, method=method,
            memory_limit=limit,
        )[0].sum()  # fmt: skip
        return jax.grad(fn)(params)

    run(need)  # exactly its estimate fits
    with pytest.raises(bppsa.MemoryLimitError, match=r"method=Reversed\(") as error:
        run(need - 1)
    assert error.value.estimate == need
    assert all(b <= need - 1 for _, b in error.value.alternatives)


def test_the_policy_ranks_it_by_its_cost():
    """Auto's cost model ranks any candidate by its ``cost``: on the accelerator profile the
    new method wraps Blelloch() at the price of one copy, so it wins over back-propagation
    where Blelloch() does and loses to Blelloch() itself."""
    new = Reversed(bppsa.Blelloch())
    auto = bppsa.Auto(profile=GPU, candidates=(bppsa.Sequential(), new))
    assert auto.choose(10_000, 20, batch=16, element=20) == new
    assert bppsa.Auto(profile=GPU).choose(10_000, 20, batch=16, element=20) == bppsa.Blelloch()
    times = bppsa.Auto(profile=GPU, candidates=(bppsa.Blelloch(), new)).predictions(
        10_000, 20, batch=16, element=20
    )
    assert times[bppsa.Blelloch()] < times[new]
    # With the Jacobians required (the finiteness check), it is picked over BP regardless.
    assert auto.choose(10, 1024, batch=256, jacobians=True) == new
    assert auto.choose(10, 1024, batch=256) == bppsa.Sequential()


def test_what_it_does_not_support_is_refused_before_tracing():
    chain = Chain([Linear(4, 3), ReLU(), Linear(3, 2)])
    layers = chain.init(jax.random.key(0))
    x = jnp.ones((2, 4))
    grad = bppsa.grad(lambda p: chain.apply(p, x).sum(), method=Reversed())
    with pytest.raises(TypeError, match=r"Reversed\(.*does not apply to a chain of layers"):
        grad(layers)
    with pytest.raises(TypeError, match=r"carry has complex leaves \(complex64\[2\]\)"):
        bppsa.scan(lambda h, x: (h * x, None), jnp.ones(2, jnp.complex64), jnp.ones(3),
                   method=Reversed())  # fmt: skip
