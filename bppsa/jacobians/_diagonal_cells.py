"""Gates and analytic transposed Jacobians of the cells with a diagonal recurrence.

Every unit of these cells sees only its own past (``u * h``, not ``W_hh h``), so ``J^T`` is
diagonal (:class:`bppsa.scan.Diagonal`: the diagonal GRU, IndRNN) or, for a carry of two leaves
per unit, 2x2 block-diagonal over the pairs ``(h_i, c_i)`` (:class:`bppsa.scan.BlockDiagonal`:
the CIFG LSTM), and stays so through every product of the scan. Parameters are documented with
the cells in :mod:`bppsa.models`; shapes: ``h, c: (*B, H)``, ``x: (*B, I)``.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import Array

from bppsa.scan._blocks import BlockDiagonal, block_grouping
from bppsa.scan._elements import Diagonal

Params = dict[str, Array]

NONLINEARITIES = ("relu", "tanh")


def input_terms(params: Params, x: Array, gates: int) -> list[Array]:
    """``W x + b`` split into its ``gates`` blocks of ``H``."""
    return jnp.split(x @ params["weight_ih"].T + params["bias"], gates, axis=-1)


class DiagonalGRUGates(NamedTuple):
    z: Array  # update gate: the weight of the candidate n in h'
    r: Array  # reset gate
    n: Array  # candidate


def diagonal_gru_gates(params: Params, h: Array, x: Array) -> DiagonalGRUGates:
    """Gate order z, r, n; ``n = tanh(W_n x + b_n + u_n * (r * h))``."""
    x_z, x_r, x_n = input_terms(params, x, 3)
    u_z, u_r, u_n = jnp.split(params["recurrent"], 3, axis=-1)
    z = jax.nn.sigmoid(x_z + u_z * h)
    r = jax.nn.sigmoid(x_r + u_r * h)
    return DiagonalGRUGates(z=z, r=r, n=jnp.tanh(x_n + u_n * (r * h)))


def diagonal_gru_jacobian_t(params: Params, h: Array, x: Array) -> Diagonal:
    """Diagonal GRU: ``J^T = diag(dh'/dh)`` with, for ``h' = (1 - z) h + z n``,
    ``dh'/dh = (1 - z) + (n - h) z (1 - z) u_z + z (1 - n^2) u_n (r + h r (1 - r) u_r)``."""
    z, r, n = diagonal_gru_gates(params, h, x)
    u_z, u_r, u_n = jnp.split(params["recurrent"], 3, axis=-1)
    dr = r * (1 - r) * u_r
    d = (1 - z) + (n - h) * z * (1 - z) * u_z + z * (1 - n**2) * u_n * (r + h * dr)
    return Diagonal(d)


def indrnn_pre_activation(params: Params, h: Array, x: Array) -> Array:
    """``W x + b + u * h``."""
    return x @ params["weight_ih"].T + params["bias"] + params["recurrent"] * h


def indrnn_jacobian_t(params: Params, h: Array, x: Array, nonlinearity: str = "relu") -> Diagonal:
    """IndRNN: ``J^T = diag(act'(a) u)`` with ``a = W x + b + u * h`` (``relu'(0) = 0``, as
    ``jax.nn.relu``'s)."""
    a = indrnn_pre_activation(params, h, x)
    slope = (a > 0).astype(a.dtype) if nonlinearity == "relu" else 1 - jnp.tanh(a) ** 2
    return Diagonal(slope * params["recurrent"])


class CIFGGates(NamedTuple):
    f: Array  # forget gate; the input gate is 1 - f
    g: Array  # candidate cell
    o: Array  # output gate (its peephole reads c_new)
    c_new: Array


def cifg_lstm_gates(params: Params, state: tuple[Array, Array], x: Array) -> CIFGGates:
    """Gate order f, g, o; ``c' = f c + (1 - f) g`` with peepholes ``p_f * c`` on ``f`` and
    ``p_o * c'`` on ``o``."""
    h, c = state
    x_f, x_g, x_o = input_terms(params, x, 3)
    u_f, u_g, u_o = jnp.split(params["recurrent"], 3, axis=-1)
    p_f, p_o = jnp.split(params["peephole"], 2, axis=-1)
    f = jax.nn.sigmoid(x_f + u_f * h + p_f * c)
    g = jnp.tanh(x_g + u_g * h)
    c_new = f * c + (1 - f) * g
    o = jax.nn.sigmoid(x_o + u_o * h + p_o * c_new)
    return CIFGGates(f=f, g=g, o=o, c_new=c_new)


def cifg_lstm_jacobian_t(params: Params, state: tuple[Array, Array], x: Array) -> BlockDiagonal:
    """CIFG LSTM: one 2x2 block per unit over ``(h_i, c_i)`` (the carry packed ``[h, c]``).

    With ``s_f = f (1 - f)``, ``s_o = o (1 - o)``, ``k = o (1 - tanh(c')^2)``:
    ``dc'/dc = f + (c - g) s_f p_f``, ``dc'/dh = (c - g) s_f u_f + (1 - f)(1 - g^2) u_g``,
    and ``h' = o tanh(c')`` gives ``dh'/dh = m dc'/dh + tanh(c') s_o u_o`` and
    ``dh'/dc = m dc'/dc`` with ``m = k + tanh(c') s_o p_o`` (``o`` reads ``c'``).
    Block ``i`` of ``J^T`` is ``[[dh'/dh, dc'/dh], [dh'/dc, dc'/dc]]`` (the transpose of
    ``J``'s block, rows the cotangents of ``h_i, c_i``).
    """
    h, c = state
    f, g, o, c_new = cifg_lstm_gates(params, state, x)
    u_f, u_g, u_o = jnp.split(params["recurrent"], 3, axis=-1)
    p_f, p_o = jnp.split(params["peephole"], 2, axis=-1)
    s_f, s_o = f * (1 - f), o * (1 - o)
    tanh_c = jnp.tanh(c_new)
    dc_dc = f + (c - g) * s_f * p_f
    dc_dh = (c - g) * s_f * u_f + (1 - f) * (1 - g**2) * u_g
    m = o * (1 - tanh_c**2) + tanh_c * s_o * p_o
    dh_dh = m * dc_dh + tanh_c * s_o * u_o
    dh_dc = m * dc_dc
    blocks = jnp.stack([jnp.stack([dh_dh, dc_dh], -1), jnp.stack([dh_dc, dc_dc], -1)], -2)
    return BlockDiagonal(blocks, block_grouping((h.shape[-1], h.shape[-1])))
