"""Analytic transposed Jacobians of the cells against autodiff (jax.jacrev), and when the scan
uses them."""

import jax
import jax.numpy as jnp
import pytest

from bppsa.jacobians import gru_jacobian_t, has_analytic_jacobian, lstm_jacobian_t, rnn_jacobian_t
from bppsa.models import gru_cell, init_params, lstm_cell, rnn_cell
from tests.helpers import assert_trees_close, distinct_state, spread

H, I = 7, 3


def autodiff_jacobian_t(cell, params, state, x):
    """J^T from jax.jacrev for one example; the LSTM state (h, c) as one vector."""
    if isinstance(state, tuple):

        def flat(v):
            h, c = cell(params, (v[:H], v[H:]), x)
            return jnp.concatenate([h, c])

        return jax.jacrev(flat)(jnp.concatenate(state)).T
    return jax.jacrev(lambda h: cell(params, h, x))(state).T


CASES = {
    "rnn_tanh": (lambda p, h, x: rnn_cell(p, h, x), lambda p, h, x: rnn_jacobian_t(p, h, x), 1),
    "rnn_relu": (
        lambda p, h, x: rnn_cell(p, h, x, nonlinearity="relu"),
        lambda p, h, x: rnn_jacobian_t(p, h, x, nonlinearity="relu"),
        1,
    ),
    "gru": (gru_cell, gru_jacobian_t, 3),
    "lstm": (lstm_cell, lstm_jacobian_t, 4),
}


# Batch shapes are tuples: each is wrapped so that it fills one argument.
@pytest.mark.parametrize("case,batch", spread(list(CASES), [((),), ((2, 3),)]))
def test_matches_autodiff(case, batch, dtype):
    cell, builder, gates = CASES[case]
    keys = jax.random.split(jax.random.key(0), 4)
    params = init_params(gates, I, H, key=keys[0], dtype=dtype)
    # Larger weights than the default init, so that every gate is away from saturation and
    # linear regime alike (and ReLU units are both on and off).
    params = jax.tree.map(lambda w: 3 * w, params)
    x = jax.random.normal(keys[1], (*batch, I), dtype)
    h = jax.random.normal(keys[2], (*batch, H), dtype)
    state = (h, jax.random.normal(keys[3], (*batch, H), dtype)) if case == "lstm" else h
    jac_t = builder(params, state, x).to_dense().a
    n = 2 * H if case == "lstm" else H
    assert jac_t.shape == (*batch, n, n)
    flat = jac_t.reshape(-1, n, n)
    one = lambda s, x: autodiff_jacobian_t(cell, params, s, x)
    states = jax.tree.map(lambda a: a.reshape(-1, H), state)
    expected = jax.vmap(one)(states, x.reshape(-1, I))
    assert_trees_close(flat, expected, dtype)


def test_scan_uses_them_only_for_the_whole_carry_map():
    params = init_params(1, I, H, key=jax.random.key(1))
    h, x = jnp.zeros(H), jnp.zeros(I)
    assert has_analytic_jacobian(lambda h, x: (rnn_cell(params, h, x), h), h, x)
    gru_params = init_params(3, I, H, key=jax.random.key(2))
    assert has_analytic_jacobian(lambda h, x: (gru_cell(gru_params, h, x), None), h, x)
    lstm_params = init_params(4, I, H, key=jax.random.key(3))
    state = distinct_state((h, h), jax.random.key(4))  # h and c apart
    assert has_analytic_jacobian(lambda s, x: (lstm_cell(lstm_params, s, x), None), state, x)
    # Not the whole carry map, or inputs that depend on the carry: autodiff instead.
    assert not has_analytic_jacobian(lambda h, x: (2 * rnn_cell(params, h, x), h), h, x)
    assert not has_analytic_jacobian(lambda h, x: (rnn_cell(params, h, x + h[:I]), h), h, x)
    scaled = lambda h: jax.tree.map(lambda w: w * h.sum(), params)
    assert not has_analytic_jacobian(lambda h, x: (rnn_cell(scaled(h), h, x), h), h, x)
    assert not has_analytic_jacobian(lambda c, x: ((rnn_cell(params, c[0], x), c[1]), 0), (h, h), x)
    assert not has_analytic_jacobian(lambda h, x: (jnp.tanh(params["weight_hh"] @ h), h), h, x)
    # Shared parts built from x would be wrong to share across steps: refused.
    from_x = lambda x: params | {"weight_hh": params["weight_hh"] * x.sum()}
    assert not has_analytic_jacobian(lambda h, x: (rnn_cell(from_x(x), h, x), h), h, x)
    # An integer step counter beside the state is fine: it has no cotangent.
    counter = lambda c, x: ((rnn_cell(params, c[0], x), c[1] + 1), None)
    assert has_analytic_jacobian(counter, (h, jnp.int32(0)), x)
