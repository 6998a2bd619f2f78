"""An optax training loop on an equinox GRU: three Adam steps with ``bppsa.value_and_grad``
reach the parameters (and losses) of three steps with ``jax.value_and_grad``, to rounding."""

import jax
import jax.numpy as jnp
import optax
import pytest

pytest.importorskip("equinox")

import equinox as eqx

import bppsa
from tests.helpers import assert_trees_close

H, I, T, B, STEPS = 4, 2, 17, 2, 3


def train(value_and_grad, scan):
    keys = jax.random.split(jax.random.key(0), 4)
    model = (
        eqx.nn.GRUCell(I, H, dtype=jnp.float64, key=keys[0]),
        eqx.nn.Linear(H, 1, dtype=jnp.float64, key=keys[1]),
    )
    params, static = eqx.partition(model, eqx.is_inexact_array)
    xs = jax.random.normal(keys[2], (B, T, I), jnp.float64)
    targets = jax.random.normal(keys[3], (B, 1), jnp.float64)

    def loss(params, xs, targets):
        cell, head = eqx.combine(params, static)

        def predict(x):
            h, _ = scan(lambda h, x: (cell(x, h), None), jnp.zeros(H), x)
            return head(h)

        return jnp.mean((jax.vmap(predict)(xs) - targets) ** 2)

    optimizer = optax.adam(1e-2)

    @jax.jit
    def step(params, state):
        value, grads = value_and_grad(loss)(params, xs, targets)
        updates, state = optimizer.update(grads, state, params)
        return optax.apply_updates(params, updates), state, value

    state, losses = optimizer.init(params), []
    for _ in range(STEPS):
        params, state, value = step(params, state)
        losses.append(value)
    return params, jnp.stack(losses)


def test_adam_steps_match_back_propagation(x64):
    blelloch = lambda f: bppsa.value_and_grad(f, method=bppsa.Blelloch())
    params, losses = train(blelloch, bppsa.scan)
    expected_params, expected_losses = train(jax.value_and_grad, jax.lax.scan)
    assert losses[-1] < losses[0]  # it trains
    assert_trees_close(losses, expected_losses, jnp.float64)
    assert_trees_close(params, expected_params, jnp.float64)
