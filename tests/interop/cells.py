"""The cells of the interop tests, one per library and kind, and the loss they are tested in.

Each cell is a triple ``(params, step, carry)``: ``params`` the pytree that is differentiated
(an equinox module's float arrays, a flax params dict, an nnx ``State`` of ``nnx.Param``s),
``step(params, carry, x)`` one step of the recurrence through the library's own API, and
``carry`` one example's initial state.
"""

from __future__ import annotations

import equinox as eqx
import flax.linen as linen
import jax
import jax.numpy as jnp
from flax import nnx

H, I, B = 3, 2, 2  # hidden, input, batch


def equinox_gru(key):
    """``eqx.nn.GRUCell``, partitioned into its float arrays and the rest."""
    cell = eqx.nn.GRUCell(I, H, dtype=jnp.float64, key=key)
    params, static = eqx.partition(cell, eqx.is_inexact_array)
    return params, lambda p, h, x: eqx.combine(p, static)(x, h), jnp.zeros(H)


def equinox_lstm(key):
    cell = eqx.nn.LSTMCell(I, H, dtype=jnp.float64, key=key)
    params, static = eqx.partition(cell, eqx.is_inexact_array)
    return params, lambda p, hc, x: eqx.combine(p, static)(x, hc), (jnp.zeros(H), jnp.zeros(H))


def _linen(module, key):
    carry = module.initialize_carry(key, (I,))
    params = module.init(key, carry, jnp.zeros(I))
    return params, lambda p, c, x: module.apply(p, c, x)[0], carry


def linen_gru(key):
    """``flax.linen.GRUCell`` through ``apply``, its params an argument of the loss."""
    return _linen(linen.GRUCell(H, dtype=jnp.float64, param_dtype=jnp.float64), key)


def linen_lstm(key):
    return _linen(linen.OptimizedLSTMCell(H, dtype=jnp.float64, param_dtype=jnp.float64), key)


def nnx_lstm(key):
    """``flax.nnx.LSTMCell`` through ``nnx.split`` / ``nnx.merge``."""
    cell = nnx.LSTMCell(
        I, H, dtype=jnp.float64, param_dtype=jnp.float64, rngs=nnx.Rngs(jax.random.key_data(key))
    )
    graphdef, params = nnx.split(cell)
    carry = (jnp.zeros(H), jnp.zeros(H))
    return params, lambda p, c, x: nnx.merge(graphdef, p)(c, x)[0], carry


CELLS = {
    "equinox-GRUCell": equinox_gru,
    "equinox-LSTMCell": equinox_lstm,
    "linen-GRUCell": linen_gru,
    "linen-OptimizedLSTMCell": linen_lstm,
    "nnx-LSTMCell": nnx_lstm,
}


def problem(make, length, seed=0):
    """``(params, step, init, xs)``: a batch of ``B`` non-zero initial carries (so that their
    cotangents are not those of zero) and inputs ``(B, length, I)``, in float64."""
    keys = jax.random.split(jax.random.key(seed), 3)
    params, step, carry = make(keys[0])
    leaves, treedef = jax.tree.flatten(carry)
    init = treedef.unflatten(
        [
            0.5 * jax.random.normal(k, (B, *leaf.shape), jnp.float64)
            for k, leaf in zip(jax.random.split(keys[1], len(leaves)), leaves)
        ]
    )
    xs = jax.random.normal(keys[2], (B, length, I), jnp.float64)
    return params, step, init, xs


def loss_fn(scan, step):
    """``loss(params, init, xs)``: one scan per example, vmapped over the batch; cotangents enter
    on every output and on the final carry."""

    def loss(params, init, xs):
        def one(carry, x):
            def body(carry, x_t):
                carry = step(params, carry, x_t)
                return carry, jnp.sin(jax.tree.leaves(carry)[0]).sum()

            carry, ys = scan(body, carry, x)
            return sum((leaf**2).sum() for leaf in jax.tree.leaves(carry)) + ys.sum()

        return jax.vmap(one)(init, xs).sum()

    return loss
