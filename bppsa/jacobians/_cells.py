"""Analytic transposed Jacobians ``J^T = (d h_t / d h_{t-1})^T`` of the recurrent cells.

Each builder takes the cell's own arguments and returns one element of :mod:`bppsa.scan` acting
on the state (for the LSTM, ``h`` and ``c`` concatenated). Shapes: ``h: (*B, H)``.
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import Array

from bppsa.jacobians._gates import gru_gates, lstm_gates, pre_activations
from bppsa.scan._elements import Dense, Structured

Params = dict[str, Array]


def rnn_jacobian_t(params: Params, h: Array, x: Array, nonlinearity: str = "tanh") -> Structured:
    """Elman RNN: ``J^T = W_hh^T diag(act'(z))``; one ``(H, H)`` matrix shared by all steps."""
    gi, gh = pre_activations(params, h, x)
    z = gi + gh
    slope = 1 - jnp.tanh(z) ** 2 if nonlinearity == "tanh" else (z > 0).astype(z.dtype)
    return Structured(u=params["weight_hh"].T, d=slope)


def gru_jacobian_t(params: Params, h: Array, x: Array) -> Structured:
    """GRU: ``J^T v = W_hh^T ([c; a; b] * [v; v; v]) + z * v``.

    With ``h' = (1 - z) n + z h`` and the gate pre-activations linear in ``h`` through the
    blocks ``W_hr, W_hz, W_hn`` of ``W_hh``:
    ``J = diag(c) W_hr + diag(a) W_hz + diag(b) W_hn + diag(z)`` where
    ``a = (h - n) z (1 - z)``, ``b = (1 - z)(1 - n^2) r`` and
    ``c = (1 - z)(1 - n^2)(W_hn h + b_hn) r (1 - r)``.
    """
    r, z, n, h_n = gru_gates(params, h, x)
    dn = (1 - z) * (1 - n**2)
    a = (h - n) * z * (1 - z)
    b = dn * r
    c = dn * h_n * r * (1 - r)
    return Structured(u=params["weight_hh"].T, d=jnp.concatenate([c, a, b], -1), e=z, reps=3)


def lstm_jacobian_t(params: Params, state: tuple[Array, Array], x: Array) -> Dense:
    """LSTM: the ``(2H, 2H)`` matrix ``[[dh'/dh, dh'/dc], [dc'/dh, dc'/dc]]^T``, built in
    ``O(H^2)`` from ``W_hh`` and the gate derivatives (no autodiff).

    With ``c' = f c + i g`` and ``h' = o tanh(c')``, and ``k = o (1 - tanh(c')^2)``:
    ``dc'/dh = sum_gate diag(alpha_gate) W_h,gate`` over i, f, g with
    ``alpha = (g s_i, c s_f, i (1 - g^2))`` (``s`` the sigmoid slopes), ``dc'/dc = diag(f)``,
    ``dh'/dh = diag(k) dc'/dh + diag(tanh(c') s_o) W_ho`` and ``dh'/dc = diag(k f)``.
    """
    h, c = state
    i, f, g, o, c_new = lstm_gates(params, state, x)
    tanh_c = jnp.tanh(c_new)
    k = o * (1 - tanh_c**2)
    alpha_c = jnp.concatenate([g * i * (1 - i), c * f * (1 - f), i * (1 - g**2)], -1)
    alpha_o = tanh_c * o * (1 - o)
    hidden = h.shape[-1]
    w_t = params["weight_hh"].T  # (H, 4H): column block j is W_h,gate_j^T

    def sum_of_blocks(scales):  # sum_j W_j^T diag(scales_j), as (*B, H, H)
        scaled = w_t * scales[..., None, :]
        return scaled.reshape(*scaled.shape[:-1], -1, hidden).sum(-2)

    zeros = jnp.zeros_like(alpha_o)
    dc_dh_t = sum_of_blocks(jnp.concatenate([alpha_c, zeros], -1))
    dh_dh_t = sum_of_blocks(jnp.concatenate([jnp.concatenate([k] * 3, -1) * alpha_c, alpha_o], -1))
    eye = jnp.eye(hidden, dtype=h.dtype)
    top = jnp.concatenate([dh_dh_t, dc_dh_t], -1)  # rows: cotangent of h
    bottom = jnp.concatenate([(k * f)[..., :, None] * eye, f[..., :, None] * eye], -1)
    return Dense(jnp.concatenate([top, bottom], -2))
