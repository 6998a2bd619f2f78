"""Cells follow PyTorch's formulas and layout (checked against NumPy written from the
documented equations), take leading batch dims, and initialize like PyTorch."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bppsa.models import GRU, LSTM, RNN, gru_cell, init_params, lstm_cell, rnn_cell
from tests.helpers import assert_trees_close

H, I = 5, 3


def sigmoid(z):
    return 1 / (1 + np.exp(-z))


def numpy_rnn(p, h, x, act):
    return act(p["weight_ih"] @ x + p["bias_ih"] + p["weight_hh"] @ h + p["bias_hh"])


def numpy_gru(p, h, x):
    w_ir, w_iz, w_in = np.split(p["weight_ih"], 3)
    w_hr, w_hz, w_hn = np.split(p["weight_hh"], 3)
    b_ir, b_iz, b_in = np.split(p["bias_ih"], 3)
    b_hr, b_hz, b_hn = np.split(p["bias_hh"], 3)
    r = sigmoid(w_ir @ x + b_ir + w_hr @ h + b_hr)
    z = sigmoid(w_iz @ x + b_iz + w_hz @ h + b_hz)
    n = np.tanh(w_in @ x + b_in + r * (w_hn @ h + b_hn))
    return (1 - z) * n + z * h


def numpy_lstm(p, state, x):
    h, c = state
    gates = p["weight_ih"] @ x + p["bias_ih"] + p["weight_hh"] @ h + p["bias_hh"]
    i, f, g, o = np.split(gates, 4)
    c = sigmoid(f) * c + sigmoid(i) * np.tanh(g)
    return sigmoid(o) * np.tanh(c), c


CASES = {
    "rnn_tanh": (1, lambda p, s, x: rnn_cell(p, s, x), lambda p, s, x: numpy_rnn(p, s, x, np.tanh)),
    "rnn_relu": (
        1,
        lambda p, s, x: rnn_cell(p, s, x, nonlinearity="relu"),
        lambda p, s, x: numpy_rnn(p, s, x, lambda z: np.maximum(z, 0)),
    ),
    "gru": (3, gru_cell, numpy_gru),
    "lstm": (4, lstm_cell, numpy_lstm),
}


@pytest.mark.parametrize("case", CASES)
def test_matches_pytorch_formulas_with_batch_dims(case, x64):
    gates, cell, reference = CASES[case]
    keys = jax.random.split(jax.random.key(0), 4)
    params = init_params(gates, I, H, key=keys[0], dtype=jnp.float64)
    x = jax.random.normal(keys[1], (2, 4, I), jnp.float64)
    h = jax.random.normal(keys[2], (2, 4, H), jnp.float64)
    state = (h, jax.random.normal(keys[3], (2, 4, H), jnp.float64)) if case == "lstm" else h
    out = cell(params, state, x)
    np_params = {k: np.asarray(v) for k, v in params.items()}
    for b in np.ndindex(2, 4):
        one_state = jax.tree.map(lambda a, b=b: np.asarray(a[b]), state)
        expected = reference(np_params, one_state, np.asarray(x[b]))
        assert_trees_close(jax.tree.map(lambda a, b=b: a[b], out), expected, jnp.float64)


@pytest.mark.parametrize("cell,gates", [(RNN(), 1), (GRU(), 3), (LSTM(), 4)])
def test_initialization_like_pytorch(cell, gates):
    params = cell.init(I, 20, key=jax.random.key(0))
    bound = 1 / np.sqrt(20)
    shapes = {
        "weight_ih": (gates * 20, I),
        "weight_hh": (gates * 20, 20),
        "bias_ih": (gates * 20,),
        "bias_hh": (gates * 20,),
    }
    assert {k: v.shape for k, v in params.items()} == shapes
    for value in params.values():
        assert value.dtype == jnp.float32
        assert np.all(np.abs(value) <= bound)
        assert np.max(np.abs(value)) > 0.8 * bound  # uniform over the whole range
    again = cell.init(I, 20, key=jax.random.key(0))
    assert all(np.array_equal(params[k], again[k]) for k in params)


def test_state_shapes_and_bad_nonlinearity():
    assert LSTM().initial_state(4)[1].shape == (4,)
    assert RNN().initial_state(4).shape == (4,)
    with pytest.raises(ValueError, match="nonlinearity must be one of"):
        RNN("sigmoid")
    params = init_params(1, I, H, key=jax.random.key(0))
    with pytest.raises(ValueError, match="nonlinearity must be one of"):
        rnn_cell(params, jnp.zeros(H), jnp.zeros(I), nonlinearity="gelu")
