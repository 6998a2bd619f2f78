"""The ReLU RNN's analytic Jacobian where the pre-activation is exactly 0, as it is for
zero-padded inputs from a zero state without biases: the slope there is 0, as in ``jax.grad``,
for the Jacobian and for the gradient of a scan that uses it."""

import jax
import jax.numpy as jnp
import numpy as np

import bppsa
from bppsa.jacobians import rnn_jacobian_t
from bppsa.models import RNN, rnn_cell
from tests.helpers import assert_trees_close

H, I, T = 5, 3, 6


def params_without_bias(dtype):
    params = RNN(nonlinearity="relu").init(I, H, key=jax.random.key(0), dtype=dtype)
    return {k: jnp.zeros_like(v) if k.startswith("bias") else v for k, v in params.items()}


def test_slope_at_a_zero_pre_activation_is_zero(x64):
    params = params_without_bias(jnp.float64)
    h = jnp.zeros((2, H), jnp.float64)
    x = jnp.stack([jnp.zeros(I), jnp.linspace(-1.0, 1.0, I)])  # example 0: z == 0 exactly
    jac_t = rnn_jacobian_t(params, h, x, nonlinearity="relu").to_dense().a
    expected = jax.vmap(lambda h, x: jax.jacrev(lambda h: rnn_cell(params, h, x, "relu"))(h).T)
    np.testing.assert_array_equal(np.asarray(jac_t[0]), 0.0)
    assert_trees_close(jac_t, expected(h, x), jnp.float64)


def test_gradient_through_zero_padded_steps(x64):
    params = params_without_bias(jnp.float64)
    xs = jax.random.normal(jax.random.key(1), (T, I), jnp.float64).at[:3].set(0.0)  # padding
    head = jnp.linspace(1.0, 2.0, H, dtype=jnp.float64)

    def loss(scan, params, h0, **kw):
        body = lambda h, x: (RNN(nonlinearity="relu")(params, h, x), jnp.sum(h))
        h, ys = scan(body, h0, xs, **kw)
        return h @ head + jnp.sum(ys)

    h0 = jnp.zeros(H, jnp.float64)
    with bppsa.trace_plans() as plans:
        actual = jax.jit(
            jax.grad(lambda p, h: loss(bppsa.scan, p, h, method="blelloch"), argnums=(0, 1))
        )(params, h0)
    assert [p.jacobians for p in plans] == ["analytic"]
    expected = jax.grad(lambda p, h: loss(jax.lax.scan, p, h), argnums=(0, 1))(params, h0)
    assert_trees_close(actual, expected, jnp.float64)
