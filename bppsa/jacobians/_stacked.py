"""The transposed Jacobians of every step of a scan, built in parallel over the steps."""

from __future__ import annotations

import jax

from bppsa._carry import Layout
from bppsa.scan import Dense
from bppsa.scan._elements import vmap_out_axes


def transposed_jacobians(step, consts, carries_before, xs, layout: Layout, analytic: bool):
    """``J_t^T`` for every step, as a stack in time order (vmapped over t)."""
    if analytic:
        one_step = jax.tree.map(_unstacked, (carries_before, xs))
        example = jax.eval_shape(lambda c, x: step(c, x, *consts)[2], *one_step)
        return jax.vmap(lambda c, x: step(c, x, *consts)[2], out_axes=vmap_out_axes(example))(
            carries_before, xs
        )

    def one(carry, x):
        def carry_map(vector):
            new_carry, _, _ = step(layout.unpack_into(vector, carry), x, *consts)
            return layout.pack(new_carry)

        return jax.jacrev(carry_map)(layout.pack(carry)).T

    return Dense(jax.vmap(one)(carries_before, xs))


def _unstacked(a):
    return jax.ShapeDtypeStruct(a.shape[1:], a.dtype)
