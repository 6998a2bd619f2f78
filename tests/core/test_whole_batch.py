"""The backward of a vmapped batch as one array (``Problem.batched_problem``): taken where the
examples share the scan's parameters, refused where they do not, and always BP's gradients."""

import jax
import jax.numpy as jnp
import pytest

import bppsa
from bppsa.models import RNN, rnn_cell
from tests.helpers import assert_trees_close

T, B, H = 13, 3, 4
METHODS = [bppsa.Auto(), bppsa.Blelloch(), bppsa.Chunked(3), bppsa.Blocked(bppsa.Blelloch(), 5)]


def setup(dtype):
    params = RNN().init(1, H, key=jax.random.key(0), dtype=dtype)
    xs = jax.random.normal(jax.random.key(1), (B, T, 1), dtype)
    h0 = jax.random.normal(jax.random.key(2), (B, H), dtype)
    return params, xs, h0


def grads(scan, loss, params, *args, **options):
    def total(params, *args):
        return loss(params, *args, scan=scan)

    if scan is jax.lax.scan:
        return jax.jit(jax.grad(total))(params, *args)
    with bppsa.trace_plans() as plans:
        out = jax.jit(bppsa.grad(total, **options))(params, *args)
    return out, plans


def last_state_loss(params, xs, h0, *, scan):
    def one(x, h):
        h, _ = scan(lambda h, x_t: (rnn_cell(params, h, x_t), None), h, x)
        return jnp.sum(jnp.sin(h))

    return jnp.sum(jax.vmap(one)(xs, h0))


@pytest.mark.parametrize("method", METHODS, ids=repr)
def test_the_whole_batch_gives_bps_gradients(method, dtype):
    params, xs, h0 = setup(dtype)
    (actual, plans) = grads(bppsa.scan, last_state_loss, params, xs, h0, method=method)
    assert [p.whole_batch for p in plans] == [True]
    assert_trees_close(actual, grads(jax.lax.scan, last_state_loss, params, xs, h0), dtype)


def every_output_loss(params, xs, h0, *, scan):
    """Outputs at every step, an integer counter in the carry, the batch on axis 1 of ``xs``,
    one input sequence shared by the batch in ``shift``."""

    def one(x, h, shift):
        def body(carry, x_t):
            h, k = carry
            h = rnn_cell(params, h, x_t[0] + x_t[1])
            return (h, k + 1), jnp.cos(h) * k

        (h, k), ys = scan(body, (h, 0), (x, shift))
        return jnp.sum(ys**2) + jnp.sum(h) * k

    shift = jnp.linspace(0.0, 1.0, T, dtype=xs.dtype)[:, None]
    return jnp.sum(jax.vmap(one, in_axes=(1, 0, None))(jnp.swapaxes(xs, 0, 1), h0, shift))


def test_outputs_counters_and_shared_inputs():
    params, xs, h0 = setup(jnp.float32)
    (actual, plans) = grads(bppsa.scan, every_output_loss, params, xs, h0, method="blelloch")
    assert [p.whole_batch for p in plans] == [True]
    expected = grads(jax.lax.scan, every_output_loss, params, xs, h0)
    assert_trees_close(actual, expected, jnp.float32)


def test_inputs_and_initial_states_get_per_example_cotangents():
    params, xs, h0 = setup(jnp.float32)

    def loss(xs, h0, scan):
        return last_state_loss(params, xs, h0, scan=scan)

    actual = jax.jit(jax.grad(lambda xs, h0: loss(xs, h0, bppsa.scan), argnums=(0, 1)))(xs, h0)
    expected = jax.grad(lambda xs, h0: loss(xs, h0, jax.lax.scan), argnums=(0, 1))(xs, h0)
    assert_trees_close(actual, expected, jnp.float32)


def test_autodiff_jacobians():
    params, xs, h0 = setup(jnp.float32)
    w = params["weight_hh"]

    def loss(w, xs, h0, *, scan):
        def one(x, h):
            h, _ = scan(lambda h, x_t: (0.9 * jnp.tanh(w @ h + x_t), None), h, x)
            return jnp.sum(h**2)

        return jnp.sum(jax.vmap(one)(xs, h0))

    (actual, plans) = grads(bppsa.scan, loss, w, xs, h0, method="blelloch")
    assert plans[0].jacobians == "autodiff" and plans[0].whole_batch
    assert_trees_close(actual, grads(jax.lax.scan, loss, w, xs, h0), jnp.float32)


def test_per_example_parameters_go_example_by_example():
    """Parameters batched with the examples are not shared: no product over the batch."""
    params, xs, h0 = setup(jnp.float32)
    batched = jax.tree.map(lambda p: jnp.stack([p * (1 + 0.1 * i) for i in range(B)]), params)

    def loss(params, xs, h0, *, scan):
        def one(params, x, h):
            h, _ = scan(lambda h, x_t: (rnn_cell(params, h, x_t), None), h, x)
            return jnp.sum(jnp.sin(h))

        return jnp.sum(jax.vmap(one)(params, xs, h0))

    (actual, plans) = grads(bppsa.scan, loss, batched, xs, h0, method="blelloch")
    assert [p.whole_batch for p in plans] == [False]
    assert_trees_close(actual, grads(jax.lax.scan, loss, batched, xs, h0), jnp.float32)


def test_the_finiteness_check_goes_example_by_example():
    params, xs, h0 = setup(jnp.float32)
    (actual, plans) = grads(
        bppsa.scan, last_state_loss, params, xs, h0, method="blelloch", check_finite=True
    )
    assert [p.whole_batch for p in plans] == [False]
    assert_trees_close(actual, grads(jax.lax.scan, last_state_loss, params, xs, h0), jnp.float32)


def test_per_example_gradients_under_vmap_of_grad():
    params, xs, h0 = setup(jnp.float32)

    def one(params, x, h, scan):
        h, _ = scan(lambda h, x_t: (rnn_cell(params, h, x_t), None), h, x)
        return jnp.sum(jnp.sin(h))

    got = jax.jit(jax.vmap(jax.grad(lambda p, x, h: one(p, x, h, bppsa.scan)), (None, 0, 0)))
    want = jax.vmap(jax.grad(lambda p, x, h: one(p, x, h, jax.lax.scan)), (None, 0, 0))
    assert_trees_close(got(params, xs, h0), want(params, xs, h0), jnp.float32)
