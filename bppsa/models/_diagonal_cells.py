"""Cells with a diagonal recurrence, whose transposed Jacobians stay structured in a scan.

Each unit sees only its own past through a vector ``u`` (``u * h`` instead of ``W_hh h``), so
``J^T`` is diagonal, or 2x2 block-diagonal over ``(h_i, c_i)`` for the CIFG LSTM, and the
parallel scan costs ``O(H)`` (``O(H k^2)``) per step instead of ``O(H^3)``
(:mod:`bppsa.jacobians` builds them; :func:`bppsa.scan` uses them automatically). The two gated
cells are ParaRNN's (Danieli et al., "ParaRNN: Unlocking Parallel Training of Nonlinear RNNs for
Large Language Models", arXiv 2510.21450), with a dense input projection where ParaRNN's code
may split it into heads; IndRNN is Li et al., CVPR 2018.

Parameters (``G`` gate blocks of ``H`` rows, in the order given with each cell):

* ``"weight_ih": (G*H, I)``: the input projection ``W x``;
* ``"recurrent": (G*H,)``: the diagonal recurrence ``u`` of every gate;
* ``"bias": (G*H,)``;
* CIFG LSTM only, ``"peephole": (2*H,)``: ``p_f`` (on ``c``) then ``p_o`` (on ``c'``).

Cells take one example (``h: (H,)``, ``x: (I,)``) or leading batch dims.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
from jax import Array

from bppsa.jacobians._diagonal_cells import (
    NONLINEARITIES,
    cifg_lstm_gates,
    cifg_lstm_jacobian_t,
    diagonal_gru_gates,
    diagonal_gru_jacobian_t,
    indrnn_jacobian_t,
    indrnn_pre_activation,
)
from bppsa.models._cells import Cell
from bppsa.scan._core.capture import transposed_jacobian

Params = dict[str, Array]

RECURRENT_MAX = 0.9  # |u| of the gated cells at initialization (truncation of the normal)


@transposed_jacobian(diagonal_gru_jacobian_t)
def diagonal_gru_cell(params: Params, h: Array, x: Array) -> Array:
    """ParaRNN's GRU with diagonal recurrence (gate order z, r, n)::

        z  = sigmoid(W_z x + u_z * h + b_z)
        r  = sigmoid(W_r x + u_r * h + b_r)
        n  = tanh(W_n x + u_n * (r * h) + b_n)
        h' = (1 - z) * h + z * n

    ``z`` weighs the candidate, as in ParaRNN (PyTorch's GRU has ``z`` on ``h``: the same cell
    with ``z -> 1 - z``). ``J^T`` is diagonal.
    """
    z, _, n = diagonal_gru_gates(params, h, x)
    return (1 - z) * h + z * n


@transposed_jacobian(cifg_lstm_jacobian_t)
def cifg_lstm_cell(params: Params, state: tuple[Array, Array], x: Array) -> tuple[Array, Array]:
    """ParaRNN's LSTM with a coupled input/forget gate (CIFG), diagonal recurrence and diagonal
    peepholes (gate order f, g, o)::

        f  = sigmoid(W_f x + u_f * h + p_f * c + b_f)     # input gate i = 1 - f
        g  = tanh(W_g x + u_g * h + b_g)
        c' = f * c + (1 - f) * g
        o  = sigmoid(W_o x + u_o * h + p_o * c' + b_o)
        h' = o * tanh(c')

    ``state`` is ``(h, c)`` like :func:`bppsa.models.lstm_cell`'s (ParaRNN packs ``[c, h]``);
    returns ``(h', c')``. ``J^T`` is 2x2 block-diagonal over the pairs ``(h_i, c_i)``.
    """
    gates = cifg_lstm_gates(params, state, x)
    return gates.o * jnp.tanh(gates.c_new), gates.c_new


@transposed_jacobian(indrnn_jacobian_t)
def indrnn_cell(params: Params, h: Array, x: Array, nonlinearity: str = "relu") -> Array:
    """IndRNN: ``h' = act(W x + u * h + b)`` with ``act`` relu (the IndRNN paper's) or tanh.
    ``J^T`` is diagonal."""
    if nonlinearity not in NONLINEARITIES:
        raise ValueError(f"nonlinearity must be one of {NONLINEARITIES}, got {nonlinearity!r}.")
    a = indrnn_pre_activation(params, h, x)
    return jax.nn.relu(a) if nonlinearity == "relu" else jnp.tanh(a)


def input_weight(key: Array, gates: int, input_size: int, hidden_size: int, dtype) -> Array:
    """``U(-sqrt(3/I), sqrt(3/I))``: unit-variance pre-activations for unit-variance inputs."""
    bound = math.sqrt(3.0 / input_size)
    return jax.random.uniform(key, (gates * hidden_size, input_size), dtype, -bound, bound)


def gated_recurrent(key: Array, gates: int, hidden_size: int, dtype) -> Array:
    """A normal of std ``1/sqrt(H)`` truncated to ``|u| <= RECURRENT_MAX``."""
    std = 1.0 / math.sqrt(hidden_size)
    bound = RECURRENT_MAX / std
    return std * jax.random.truncated_normal(key, -bound, bound, (gates * hidden_size,), dtype)


@dataclasses.dataclass(frozen=True)
class DiagonalGRU(Cell):
    """ParaRNN's diagonal GRU (:func:`diagonal_gru_cell`), state ``(H,)``."""

    gates = 3

    def init(self, input_size: int, hidden_size: int, *, key: Array, dtype=jnp.float32):
        """Options of ParaRNN's code: ``u`` a normal of std ``1/sqrt(H)`` truncated to
        ``|u| <= 0.9`` (its ``xavier_gaussian``; bounded, unlike its default, a plain normal),
        ``W ~ U(-sqrt(3/I), sqrt(3/I))`` (its ``kaiming_uniform``) and the update gate's bias
        ``b_z = -linspace(0, 1, H)`` (its default), the other biases 0: every unit starts
        keeping at least half of ``h`` (``1 - z >= 1/2`` at ``W x + u * h = 0``), with
        timescales spread over the units.

        The state stays in ``[-1, 1]`` from any start there (``h'`` is a convex combination of
        ``h`` and ``n``), whatever the parameters.
        """
        k_w, k_u = jax.random.split(key)
        bias = jnp.zeros((3 * hidden_size,), dtype)
        bias = bias.at[:hidden_size].set(-jnp.linspace(0.0, 1.0, hidden_size, dtype=dtype))
        return {
            "weight_ih": input_weight(k_w, 3, input_size, hidden_size, dtype),
            "recurrent": gated_recurrent(k_u, 3, hidden_size, dtype),
            "bias": bias,
        }

    def __call__(self, params: Params, state, x: Array):
        return diagonal_gru_cell(params, state, x)


@dataclasses.dataclass(frozen=True)
class CIFGLSTM(Cell):
    """ParaRNN's CIFG LSTM (:func:`cifg_lstm_cell`), state ``(h, c)``, each ``(H,)``."""

    gates = 3

    def init(self, input_size: int, hidden_size: int, *, key: Array, dtype=jnp.float32):
        """``u`` and ``W`` as :meth:`DiagonalGRU.init` (ParaRNN's), peepholes 0, and a positive
        forget-gate bias ``b_f = linspace(1, 3, H)`` (a positive forget bias as in Jozefowicz
        et al., 2015, spread over the units; ParaRNN's code defaults to ``-linspace(0, 1)``):
        the units start with memory timescales ``1 / (1 - sigmoid(b_f))`` of ~4 to ~21 steps.

        ``c`` stays in ``[-1, 1]`` from any start there (``c'`` is a convex combination of ``c``
        and ``g``) and ``|h| <= 1``, whatever the parameters.
        """
        k_w, k_u = jax.random.split(key)
        bias = jnp.zeros((3 * hidden_size,), dtype)
        bias = bias.at[:hidden_size].set(jnp.linspace(1.0, 3.0, hidden_size, dtype=dtype))
        return {
            "weight_ih": input_weight(k_w, 3, input_size, hidden_size, dtype),
            "recurrent": gated_recurrent(k_u, 3, hidden_size, dtype),
            "peephole": jnp.zeros((2 * hidden_size,), dtype),
            "bias": bias,
        }

    def initial_state(self, hidden_size: int, dtype=jnp.float32):
        zeros = jnp.zeros((hidden_size,), dtype)
        return zeros, zeros

    def __call__(self, params: Params, state, x: Array):
        return cifg_lstm_cell(params, state, x)

    @staticmethod
    def output(state) -> Array:
        return state[0]


@dataclasses.dataclass(frozen=True)
class IndRNN(Cell):
    """IndRNN (:func:`indrnn_cell`), state ``(H,)``."""

    nonlinearity: str = "relu"
    gates = 1

    def __post_init__(self):
        if self.nonlinearity not in NONLINEARITIES:
            raise ValueError(
                f"nonlinearity must be one of {NONLINEARITIES}, got {self.nonlinearity!r}."
            )

    def init(self, input_size: int, hidden_size: int, *, key: Array, dtype=jnp.float32):
        """``u ~ U(0, 1)``: every unit decays (``0 <= u < 1``; the IndRNN paper bounds ``|u|``
        to keep gradients from exploding over long sequences), ``W ~ U(-sqrt(3/I),
        sqrt(3/I))``, ``b = 0``.

        With relu, ``0 <= h_t <= max(h_0, 0) + A min(t, 1 / (1 - max u))`` where ``A`` bounds
        ``relu(W x_s + b)`` over the steps: finite for every ``T``; with tanh, ``|h| < 1``.
        """
        k_w, k_u = jax.random.split(key)
        return {
            "weight_ih": input_weight(k_w, 1, input_size, hidden_size, dtype),
            "recurrent": jax.random.uniform(k_u, (hidden_size,), dtype),
            "bias": jnp.zeros((hidden_size,), dtype),
        }

    def __call__(self, params: Params, state, x: Array):
        return indrnn_cell(params, state, x, nonlinearity=self.nonlinearity)
