"""Every step of a scan with its transposed Jacobian, built in parallel over the steps."""

from __future__ import annotations

from collections.abc import Callable

import jax

from bppsa.scan._core import diagonal_paths, structure_check
from bppsa.scan._core.carry import Layout, unstacked
from bppsa.scan._core.structure import Structure, coloured_jacobian_t
from bppsa.scan._elements import Dense


def steps_with_jacobians(
    step: Callable,
    layout: Layout,
    analytic: bool,
    *,
    batched: bool = False,
    structure: Structure | None = None,
    check: bool | None = False,
    reverse: bool = False,
    jacobians: bool = True,
    diagonal: Structure | None = None,
) -> Callable:
    """``(consts, carries_before, xs) -> ((carries_after, ys), jac_t)`` over all steps at once.

    ``step(carry, x, *consts) -> (carry, y, analytic_jac_t | None)`` is one step. ``jac_t`` is
    the stack (time order) of transposed Jacobians ``(d carry_t / d carry_{t-1})^T``: the
    step's analytic element, or else one from VJPs on the packed carry: in the ``structure``
    found in the step (``Diagonal``, ``BlockDiagonal``: one VJP per colour), else ``Dense``
    (``jax.jacrev``). The
    result is meant for ``jax.vjp(..., has_aux=True)``, so the Jacobians come from the same
    evaluation of the steps as the VJP.

    ``batched``: every step serves a batch of examples (the carries and ``xs`` are
    ``(T, B, ...)``; the consts are shared), each with its own Jacobian (maps with a batch
    axis after the stack axis); ``layout`` is that of one example.

    ``check`` (with a ``structure``): also compare the structured Jacobians with the step's own
    derivative (:mod:`bppsa.scan._core.structure_check`): ``True`` densely at a few steps,
    ``None`` at the middle step on two vectors, ``False`` not at all (``reverse``: the stack
    runs from the end of ``xs``, for the step it names).

    ``jacobians=False``: the steps alone, ``jac_t`` ``None`` (for a backward given the
    Jacobians by the forward).

    ``diagonal`` (for quasi-Newton, an autodiff step without a ``structure``): only the
    diagonals of the Jacobians, from the step's element-aligned paths
    (:mod:`bppsa.scan._core.diagonal_paths`), whose derivative has this structure.
    """
    checked = check is not False and jacobians and structure is not None and not analytic
    compare = structure_check.check if check else structure_check.sampled

    def carry_map_at(consts, carry, x):
        def carry_map(vector):
            return layout.pack(step(layout.unpack_into(vector, carry), x, *consts)[0])

        return carry_map

    def one(consts, carry, x):
        new_carry, y, jac_t = step(carry, x, *consts)
        if not jacobians or not any(layout.float_mask):  # no Jacobians asked, or none to form
            return (new_carry, y), None
        if not analytic:
            carry_map = carry_map_at(consts, carry, x)
            point = layout.pack(carry)
            if diagonal is not None:
                aligned = diagonal_paths.diagonal(carry_map)
                jac_t = coloured_jacobian_t(aligned, point, diagonal).diagonal()
            elif structure is None:
                jac_t = Dense(jax.jacrev(carry_map)(point).T)
            else:
                jac_t = coloured_jacobian_t(carry_map, point, structure)
        return (new_carry, y), jac_t

    def check_steps(jac_t, consts, carries, xs, examples):
        if checked and jac_t is not None:
            compare(
                carry_map_at,
                layout.pack,
                jac_t,
                consts,
                carries,
                xs,
                examples=examples,
                reverse=reverse,
            )

    def over_steps(consts, carries, xs):  # one leading axis of steps, consts shared
        outputs = _stacked(one, consts, carries, xs)[0]
        check_steps(outputs[1], consts, carries, xs, None)
        return outputs

    def over_steps_and_examples(consts, carries, xs):
        # (T, B, ...) as one axis of T * B steps: the VJP's products for the consts then
        # contract over one axis (over two, XLA copies a transposed operand first on CPUs).
        lead = jax.tree.leaves((carries, xs))[0].shape[:2]
        merged = jax.tree.map(lambda a: a.reshape(-1, *a.shape[2:]), (carries, xs))

        def split(axis, outputs):  # an out_axes entry and the outputs it stacked
            if axis is None:
                return outputs
            return jax.tree.map(lambda a: a.reshape(*lead, *a.shape[1:]), outputs)

        outputs, axes = _stacked(one, consts, *merged)
        check_steps(outputs[1], consts, *merged, lead[1])
        return jax.tree.map(split, axes, outputs, is_leaf=_is_none)

    return over_steps_and_examples if batched else over_steps


def _stacked(fn, consts, carries, xs):
    """``(outputs, out_axes)``: ``fn`` vmapped over the leading axis of the carries and xs
    (consts shared), and the ``out_axes`` it was vmapped with: every output stacked, and the
    Jacobian's per-step fields (its shared ones not)."""
    example = jax.eval_shape(fn, consts, *jax.tree.map(unstacked, (carries, xs)))
    out_axes = ((0, 0), None if example[1] is None else example[1].stack_axes())
    return jax.vmap(fn, in_axes=(None, 0, 0), out_axes=out_axes)(consts, carries, xs), out_axes


def _is_none(x) -> bool:
    return x is None
