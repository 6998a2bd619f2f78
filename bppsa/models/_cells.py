"""Recurrent cells as pure functions over parameter dicts in PyTorch's layout.

Parameters are ``{"weight_ih": (G*H, I), "weight_hh": (G*H, H), "bias_ih": (G*H,),
"bias_hh": (G*H,)}`` with ``G`` gate blocks (RNN 1; GRU 3 in order r, z, n; LSTM 4 in order
i, f, g, o), as ``torch.nn.RNNCell``/``GRUCell``/``LSTMCell`` store them, so weights can be
compared with PyTorch. Cells take one example (``h: (H,)``, ``x: (I,)``) or leading batch dims
(``h: (*B, H)``, ``x: (*B, I)``). Inside :func:`bppsa.scan` their analytic transposed Jacobians
(:mod:`bppsa.jacobians`) are used automatically.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
from jax import Array

from bppsa.jacobians import gru_jacobian_t, lstm_jacobian_t, rnn_jacobian_t
from bppsa.jacobians._gates import gru_gates, lstm_gates, pre_activations
from bppsa.scan._core.capture import transposed_jacobian

Params = dict[str, Array]

NONLINEARITIES = ("tanh", "relu")


@transposed_jacobian(rnn_jacobian_t)
def rnn_cell(params: Params, h: Array, x: Array, nonlinearity: str = "tanh") -> Array:
    """Elman RNN: ``h' = act(W_ih x + b_ih + W_hh h + b_hh)`` with ``act`` tanh or relu."""
    if nonlinearity not in NONLINEARITIES:
        raise ValueError(f"nonlinearity must be one of {NONLINEARITIES}, got {nonlinearity!r}.")
    gi, gh = pre_activations(params, h, x)
    z = gi + gh
    return jnp.tanh(z) if nonlinearity == "tanh" else jax.nn.relu(z)


@transposed_jacobian(gru_jacobian_t)
def gru_cell(params: Params, h: Array, x: Array) -> Array:
    """GRU (PyTorch's): ``n = tanh(W_in x + b_in + r * (W_hn h + b_hn))``,
    ``h' = (1 - z) * n + z * h``."""
    gates = gru_gates(params, h, x)
    return (1 - gates.z) * gates.n + gates.z * h


@transposed_jacobian(lstm_jacobian_t)
def lstm_cell(params: Params, state: tuple[Array, Array], x: Array) -> tuple[Array, Array]:
    """LSTM (PyTorch's, gate order i, f, g, o): ``c' = f c + i g``, ``h' = o tanh(c')``.

    ``state`` is ``(h, c)``; returns ``(h', c')``.
    """
    gates = lstm_gates(params, state, x)
    return gates.o * jnp.tanh(gates.c_new), gates.c_new


def init_params(
    gates: int, input_size: int, hidden_size: int, *, key: Array, dtype=jnp.float32
) -> Params:
    """PyTorch's initialization: every parameter ``U(-1/sqrt(H), 1/sqrt(H))``."""
    bound = 1.0 / math.sqrt(hidden_size)
    shapes = {
        "weight_ih": (gates * hidden_size, input_size),
        "weight_hh": (gates * hidden_size, hidden_size),
        "bias_ih": (gates * hidden_size,),
        "bias_hh": (gates * hidden_size,),
    }
    keys = jax.random.split(key, len(shapes))
    return {
        name: jax.random.uniform(k, shape, dtype, -bound, bound)
        for k, (name, shape) in zip(keys, shapes.items())
    }


class Cell:
    """A cell type: how to initialize its parameters and state, and how to step it.

    Subclasses are small frozen dataclasses, so a cell is a hashable, comparable value that can
    be a static argument of ``jax.jit``.
    """

    gates: int

    def init(self, input_size: int, hidden_size: int, *, key: Array, dtype=jnp.float32):
        """Parameters in PyTorch's layout and initialization."""
        return init_params(self.gates, input_size, hidden_size, key=key, dtype=dtype)

    def initial_state(self, hidden_size: int, dtype=jnp.float32):
        """The zero state of one example."""
        return jnp.zeros((hidden_size,), dtype)

    def __call__(self, params: Params, state, x: Array):
        """One step: the new state."""
        raise NotImplementedError

    @staticmethod
    def output(state) -> Array:
        """The hidden vector a head reads from the state."""
        return state


@dataclasses.dataclass(frozen=True)
class RNN(Cell):
    """Elman RNN cell (:func:`rnn_cell`), state ``(H,)``."""

    nonlinearity: str = "tanh"
    gates = 1

    def __post_init__(self):
        if self.nonlinearity not in NONLINEARITIES:
            raise ValueError(
                f"nonlinearity must be one of {NONLINEARITIES}, got {self.nonlinearity!r}."
            )

    def __call__(self, params: Params, state, x: Array):
        return rnn_cell(params, state, x, nonlinearity=self.nonlinearity)


@dataclasses.dataclass(frozen=True)
class GRU(Cell):
    """GRU cell (:func:`gru_cell`), state ``(H,)``."""

    gates = 3

    def __call__(self, params: Params, state, x: Array):
        return gru_cell(params, state, x)


@dataclasses.dataclass(frozen=True)
class LSTM(Cell):
    """LSTM cell (:func:`lstm_cell`), state ``(h, c)``, each ``(H,)``."""

    gates = 4

    def initial_state(self, hidden_size: int, dtype=jnp.float32):
        zeros = jnp.zeros((hidden_size,), dtype)
        return zeros, zeros

    def __call__(self, params: Params, state, x: Array):
        return lstm_cell(params, state, x)

    @staticmethod
    def output(state) -> Array:
        return state[0]
