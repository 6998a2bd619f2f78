"""The vmap batch size a scan sees, and the automatic method's use of it: under a large enough
``jax.vmap`` batch on CPU, ``Auto()`` makes ``bppsa.scan`` plain ``lax.scan``."""

import jax
import jax.numpy as jnp
import pytest

import bppsa
from bppsa.models import GRU, RNN, gru_cell, rnn_cell
from bppsa.scan._core.tracing import vmapped_batch_size
from tests.helpers import assert_trees_close


def seen_batch(fn, *args):
    seen = []

    def probe(*inner):
        seen.append(vmapped_batch_size(inner))
        return jnp.sum(inner[0])

    fn(probe)(*args)
    return seen[0]


def test_batch_size_through_vmap_jit_and_grad():
    x = jnp.ones((4, 5, 3))
    assert seen_batch(lambda f: f, x[0, 0]) == 1
    assert seen_batch(lambda f: jax.vmap(f), x[0]) == 5
    assert seen_batch(lambda f: jax.jit(jax.vmap(jax.vmap(f))), x) == 20
    assert seen_batch(lambda f: jax.grad(lambda v: jnp.sum(jax.vmap(f)(v))), x[0]) == 5
    assert seen_batch(lambda f: jax.vmap(jax.grad(f)), x[0]) == 5
    assert seen_batch(lambda f: jax.vmap(f, in_axes=1), x[0]) == 3
    # Only batched leaves count: an unbatched one beside a batched one.
    assert seen_batch(lambda f: jax.vmap(f, in_axes=(None, 0)), x[0, 0], jnp.ones(7)) == 7


def uses_custom_derivatives(fn, *args) -> bool:
    return "custom_jvp" in str(jax.make_jaxpr(fn)(*args))


@pytest.mark.parametrize(
    ("cell", "cell_fn", "element", "small", "large"),
    [(RNN(), rnn_cell, 20, 16, 256), (GRU(), gru_cell, 80, 4, 256)],
)
def test_auto_weighs_the_vmap_batch(cell, cell_fn, element, small, large):
    """Auto() runs what choose() says for the vmapped batch (on CPUs: a Jacobian method for the
    small batch, plain back-propagation, i.e. no custom derivatives, for the large one)."""
    hidden = 20
    params = cell.init(1, hidden, key=jax.random.key(0))

    def loss(params, xs, scan):
        def one(x):
            h, _ = scan(lambda h, x_t: (cell_fn(params, h, x_t), None), jnp.zeros(hidden), x)
            return jnp.sum(h**2)

        return jnp.sum(jax.vmap(one)(xs))

    for batch in (small, large):
        runs = bppsa.Auto().choose(30, hidden, batch=batch, element=element)
        xs = jax.random.normal(jax.random.key(batch), (batch, 30, 1))
        with bppsa.trace_plans() as plans:
            actual = jax.jit(jax.grad(lambda p, xs: loss(p, xs, bppsa.scan)))(params, xs)
        assert [(plan.batch, plan.method) for plan in plans] == [(batch, runs)]
        assert uses_custom_derivatives(lambda p, xs: loss(p, xs, bppsa.scan), params, xs) == (
            runs.keeps_carries
        )
        expected = jax.jit(jax.grad(lambda p, xs: loss(p, xs, jax.lax.scan)))(params, xs)
        assert_trees_close(actual, expected, jnp.float32)
    if jax.default_backend() == "cpu":  # the CPU rule: the large batch runs plain BP
        assert not bppsa.Auto().choose(30, hidden, batch=large, element=element).keeps_carries
