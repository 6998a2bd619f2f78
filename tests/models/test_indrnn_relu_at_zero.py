"""IndRNN with relu where pre-activations are exactly 0 (zero-padded inputs, a zero state, zero
biases, and values on a dyadic grid): the slope there is 0, as ``jax.nn.relu``'s derivative, so
gradients through ``bppsa.scan`` (analytic Jacobians, and autodiff ones) are ``jax.grad``'s
through ``lax.scan``, w.r.t. the parameters and ``h0``."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import bppsa
from bppsa.jacobians import indrnn_jacobian_t
from bppsa.models import IndRNN, indrnn_cell
from tests.helpers import assert_trees_close

H, I, T = 5, 3, 9
PADDING = 3  # leading steps whose input is 0


def padded_problem():
    """Two examples, their inputs zero on the first PADDING steps; biases 0; ``h0`` zero in
    example 0 and zero, negative and positive in units of example 1."""
    keys = jax.random.split(jax.random.key(0), 3)
    params = IndRNN().init(I, H, key=keys[0], dtype=jnp.float64)
    assert not np.any(params["bias"])  # b = 0: a zero state with a zero input gives a = 0
    xs = jax.random.normal(keys[1], (2, T, I), jnp.float64).at[:, :PADDING].set(0.0)
    h0 = jnp.array([[0.0] * H, [0.7, 0.0, -0.4, 0.0, 1.2]], jnp.float64)
    heads = tuple(jax.random.normal(k, (H,), jnp.float64) for k in jax.random.split(keys[2]))
    return params, xs, h0, heads


def grid_problem():
    """Parameters, inputs and ``h0`` on a dyadic grid (multiples of 1/4, ``u`` in {1/2, 1}), so
    every pre-activation is computed exactly and many land on 0 (18 with this seed), also right
    after a step where the unit was positive (``a = 0`` with ``h > 0``: 8), every input nonzero."""
    rng = np.random.default_rng(0)
    params = {
        "weight_ih": rng.choice([-0.5, -0.25, 0.25, 0.5], (H, I)),
        "recurrent": rng.choice([0.5, 1.0], H),
        "bias": rng.choice([-0.25, 0.0, 0.25], H),
    }
    xs = rng.choice([-1.0, 1.0], (4, T, I))
    h0 = rng.choice([-0.5, 0.0, 0.5, 1.0], (4, H))
    heads = tuple(rng.standard_normal((2, H)))
    return jax.tree.map(lambda a: jnp.asarray(a, jnp.float64), (params, xs, h0, heads))


def loss_fn(cell, scan, **options):
    """Cotangents on the final state and on every step's state; one scan per example."""

    def loss(params, xs, h0, heads):
        head, head_every = heads

        def one(x, h):
            h, ys = scan(lambda h, x_t: (cell(params, h, x_t),) * 2, h, x, **options)
            return jnp.sin(h) @ head + (jnp.tanh(ys) @ head_every).sum()

        return jax.vmap(one)(xs, h0).sum()

    return loss


def pre_activations(params, xs, h0):
    """``a_t`` of every step, ``(B, T, H)``, and the state before it, by ``lax.scan``."""

    def body(h, x):
        a = params["weight_ih"] @ x + params["bias"] + params["recurrent"] * h
        return jax.nn.relu(a), (a, h)

    return jax.vmap(lambda x, h: jax.lax.scan(body, h, x)[1])(xs, h0)


def back_propagation(args):
    return jax.jit(jax.grad(loss_fn(IndRNN(), jax.lax.scan), argnums=(0, 2)))(*args)


def test_the_slope_at_a_zero_pre_activation_is_zero(x64):
    params, _, h0, _ = padded_problem()
    x = jnp.zeros((2, I), jnp.float64)
    d = indrnn_jacobian_t(params, h0, x).d
    expected = jax.vmap(jax.grad(lambda h, x: indrnn_cell(params, h, x).sum()))(h0, x)
    np.testing.assert_array_equal(d, expected)  # diagonal J: the row sums are its entries
    np.testing.assert_array_equal(d[0], 0.0)
    np.testing.assert_array_equal(d[1] != 0, np.asarray(h0[1]) > 0)


@pytest.mark.parametrize("method", [bppsa.Blelloch(), bppsa.SequentialScan()])
def test_gradients_through_zero_padded_steps(method, x64):
    """The padded steps have ``a = u h0`` (``x = 0``, ``b = 0``): the gradient w.r.t. ``h0`` is 0
    exactly where ``h0 <= 0`` and nonzero where ``h0 > 0``, and everything is ``jax.grad``'s."""
    args = padded_problem()
    a, _ = pre_activations(args[0], args[1], args[2])
    assert np.sum(np.asarray(a) == 0) >= 3 * PADDING  # the premise: exact zeros, 3 units x 3
    with bppsa.trace_plans() as plans:
        actual = jax.jit(bppsa.grad(loss_fn(IndRNN(), bppsa.scan), argnums=(0, 2), method=method))(
            *args
        )
    assert [plan.jacobians for plan in plans] == ["analytic, diagonal"]
    expected = back_propagation(args)
    d_h0 = np.asarray(actual[1])
    np.testing.assert_array_equal(d_h0 != 0, np.asarray(args[2]) > 0)
    assert_trees_close(actual, expected, jnp.float64)


@pytest.mark.parametrize(
    "cell, jacobians",
    [(IndRNN(), "analytic, diagonal"), (indrnn_cell.__wrapped__, "autodiff, diagonal")],
    ids=["analytic", "autodiff"],
)
def test_gradients_where_a_positive_unit_hits_zero(cell, jacobians, x64):
    """On the dyadic grid the exact zeros also come after positive steps, where the cotangent
    they stop would have reached the parameters of earlier steps. ``indrnn_cell.__wrapped__``
    is the cell without its analytic Jacobian: the scan builds the Jacobians by autodiff."""
    args = grid_problem()
    a, h_before = pre_activations(args[0], args[1], args[2])
    a, h_before = np.asarray(a), np.asarray(h_before)
    assert np.sum(a == 0) >= 10 and np.sum((a == 0) & (h_before > 0)) >= 3  # the premise
    with bppsa.trace_plans() as plans:
        actual = jax.jit(
            bppsa.grad(loss_fn(cell, bppsa.scan), argnums=(0, 2), method=bppsa.Blelloch())
        )(*args)
    assert [plan.jacobians for plan in plans] == [jacobians]
    assert_trees_close(actual, back_propagation(args), jnp.float64)
