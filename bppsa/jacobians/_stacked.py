"""Every step of a scan with its transposed Jacobian, built in parallel over the steps."""

from __future__ import annotations

from collections.abc import Callable

import jax

from bppsa._core.carry import Layout, unstacked
from bppsa.scan._elements import Dense


def steps_with_jacobians(step: Callable, layout: Layout, analytic: bool) -> Callable:
    """``(consts, carries_before, xs) -> ((carries_after, ys), jac_t)`` over all steps at once.

    ``step(carry, x, *consts) -> (carry, y, analytic_jac_t | None)`` is one step. ``jac_t`` is
    the stack (time order) of transposed Jacobians ``(d carry_t / d carry_{t-1})^T``: the
    step's analytic element, or a ``Dense`` one from ``jax.jacrev`` on the packed carry. The
    result is meant for ``jax.vjp(..., has_aux=True)``, so the Jacobians come from the same
    evaluation of the steps as the VJP.
    """

    def one(consts, carry, x):
        new_carry, y, jac_t = step(carry, x, *consts)
        if not any(layout.float_mask):  # nothing to differentiate in the carry
            return (new_carry, y), None
        if not analytic:

            def carry_map(vector):
                return layout.pack(step(layout.unpack_into(vector, carry), x, *consts)[0])

            jac_t = Dense(jax.jacrev(carry_map)(layout.pack(carry)).T)
        return (new_carry, y), jac_t

    def all_steps(consts, carries_before, xs):
        example = jax.eval_shape(one, consts, *jax.tree.map(unstacked, (carries_before, xs)))
        out_axes = ((0, 0), None if example[1] is None else example[1].stack_axes())
        return jax.vmap(one, in_axes=(None, 0, 0), out_axes=out_axes)(consts, carries_before, xs)

    return all_steps
