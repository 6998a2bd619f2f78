"""The forward pass is a swappable part: another forward runs under the same backward."""

import dataclasses

import jax
import jax.numpy as jnp
import pytest

import bppsa
from bppsa.models import RNN, rnn_cell
from bppsa.scan._core.forward import Forward
from tests.helpers import assert_trees_close

XS = jnp.linspace(-1.0, 1.0, 33).reshape(11, 3)
PARAMS = RNN().init(3, 4, key=jax.random.key(0))


@dataclasses.dataclass(frozen=True)
class PythonLoopForward(Forward):
    """A forward of its own: a Python loop over the steps (stands in for a parallel forward)."""

    calls: list = dataclasses.field(default_factory=list, compare=False, hash=False)

    def __call__(self, problem, consts, init, xs, *, keep, method=None):
        self.calls.append(keep)
        step, length = problem.body.step, problem.length
        carry, ys, before = init, [], []
        for t in range(length):
            x = jax.tree.map(lambda a, t=t: a[t], xs)
            before.append(carry)
            carry, y, *_ = step(carry, x, *consts)
            ys.append(y)
        stack = lambda trees: jax.tree.map(lambda *a: jnp.stack(a), *trees)
        return carry, ((stack(ys), stack(before)) if keep else stack(ys))


@pytest.mark.parametrize("method", ["blelloch", bppsa.Blocked(bppsa.Chunked(2), 4)], ids=str)
def test_another_forward_runs_under_the_same_backward(method):
    forward = PythonLoopForward()

    def loss(scan, params, h0):
        h, ys = scan(lambda h, x: (rnn_cell(params, h, x), h.sum()), h0, XS)
        return jnp.sum(h**2) + jnp.sum(ys)

    args = (PARAMS, 0.2 * jnp.ones(4))
    actual = bppsa.grad(
        lambda p, h: loss(bppsa.scan, p, h), argnums=(0, 1), method=method, forward=forward
    )(*args)
    assert forward.calls == [True]  # the forward kept the carries for the backward
    expected = jax.grad(lambda p, h: loss(jax.lax.scan, p, h), argnums=(0, 1))(*args)
    assert_trees_close(actual, expected, jnp.float32)
