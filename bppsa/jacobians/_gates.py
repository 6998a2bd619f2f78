"""Gate values of the recurrent cells (PyTorch's formulas), shared by the cells in
:mod:`bppsa.models` and their analytic Jacobians in :mod:`bppsa.jacobians`."""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import Array

Params = dict[str, Array]


def pre_activations(params: Params, h: Array, x: Array) -> tuple[Array, Array]:
    """``(W_ih x + b_ih, W_hh h + b_hh)`` for ``h: (*B, H)``, ``x: (*B, I)``."""
    gi = x @ params["weight_ih"].T + params["bias_ih"]
    gh = h @ params["weight_hh"].T + params["bias_hh"]
    return gi, gh


class GRUGates(NamedTuple):
    r: Array
    z: Array
    n: Array
    h_n: Array  # W_hn h + b_hn


def gru_gates(params: Params, h: Array, x: Array) -> GRUGates:
    """Gate order r, z, n; ``n = tanh(W_in x + b_in + r * (W_hn h + b_hn))``."""
    gi, gh = pre_activations(params, h, x)
    i_r, i_z, i_n = jnp.split(gi, 3, axis=-1)
    h_r, h_z, h_n = jnp.split(gh, 3, axis=-1)
    r = jax.nn.sigmoid(i_r + h_r)
    z = jax.nn.sigmoid(i_z + h_z)
    return GRUGates(r=r, z=z, n=jnp.tanh(i_n + r * h_n), h_n=h_n)


class LSTMGates(NamedTuple):
    i: Array
    f: Array
    g: Array
    o: Array
    c_new: Array


def lstm_gates(params: Params, state: tuple[Array, Array], x: Array) -> LSTMGates:
    """Gate order i, f, g, o; ``c' = f c + i g``."""
    h, c = state
    gi, gh = pre_activations(params, h, x)
    pre_i, pre_f, pre_g, pre_o = jnp.split(gi + gh, 4, axis=-1)
    i, f, o = jax.nn.sigmoid(pre_i), jax.nn.sigmoid(pre_f), jax.nn.sigmoid(pre_o)
    g = jnp.tanh(pre_g)
    return LSTMGates(i=i, f=f, g=g, o=o, c_new=f * c + i * g)
