"""An optional check of a structured step Jacobian against the step itself.

With ``check_structure=True`` (on :func:`bppsa.scan`, :func:`bppsa.grad` or
:func:`bppsa.value_and_grad`), wherever a scan builds its steps' transposed Jacobians in a
structure found in the cell's jaxpr (diagonal, block-diagonal), it also differentiates a few
steps densely (one JVP per carry element: the first, the middle and the last step) and compares
the whole Jacobian with the structured one. It raises ``ValueError`` naming the structure
claimed, the step (as an index into ``xs``) and the largest entry the structure misses: a
nonzero of the true Jacobian outside the claimed blocks, or a block entry that differs from the
true one by more than ``sqrt(eps)`` of the largest entry.

The check runs on the device (a ``jax.debug.callback`` with a few scalars per checked step).
Outside ``jax.jit`` the ``ValueError`` reaches the caller; under ``jax.jit`` JAX re-raises it
as its runtime error, with the same message inside. Off (the default), nothing of it is traced.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax import Array

from bppsa.scan._elements import MapStack


def checked_steps(count: int) -> list[int]:
    """The steps (of ``count``, in the stack's order) the check differentiates densely."""
    return sorted({0, count // 2, count - 1}) if count else []


def check(
    carry_map_at: Callable[[object, object, object], Callable[[Array], Array]],
    pack: Callable[[object], Array],
    jac_t: MapStack,
    consts,
    carries,
    xs,
    *,
    examples: int | None,
    reverse: bool,
) -> None:
    """Compares ``jac_t`` with dense Jacobians of a few steps; raises (through a callback) on
    a missed entry.

    Args:
        carry_map_at: ``(consts, carry, x) -> (vector -> vector)``, the step on the packed
            carry at that step's inputs.
        pack: the packed carry of one step's carry.
        jac_t: the stacked structured transposed Jacobians (``m`` maps, stack order).
        consts, carries, xs: the steps' shared inputs and stacked per-step inputs (``m``).
        examples: ``B`` when the stack is ``T * B`` steps of a batch (step ``t * B + b``);
            ``None`` for ``T`` steps of one example.
        reverse: whether the stack runs from the end of ``xs`` (indices are reported into
            ``xs``).
    """
    count = len(jac_t)
    steps = checked_steps(count)
    if not steps:
        return
    index = np.asarray(steps)
    consts, carries, xs = jax.lax.stop_gradient((consts, carries, xs))
    chosen = jax.tree.map(lambda a: a[index], (carries, xs))
    claimed = jac_t.map_per_step(lambda a: jax.lax.stop_gradient(a)[index])
    dense = claimed.to_dense().a  # (s, n, n): claimed J^T
    # where the claimed maps may be nonzero: their pattern (the elements built here, Diagonal
    # and BlockDiagonal, hold their entries as per-step fields)
    inside = claimed.map_per_step(jnp.ones_like).to_dense().a != 0

    def true_jacobian_t(carry, x):
        return jax.jacfwd(carry_map_at(consts, carry, x))(pack(carry)).T

    truth = jax.vmap(true_jacobian_t)(*chosen)  # (s, n, n): J^T
    n = truth.shape[-1]
    flat = truth.reshape(len(steps), -1)
    missed = jnp.where(inside, 0, jnp.abs(truth)).reshape(len(steps), -1)
    wrong = jnp.where(inside, jnp.abs(truth - dense), 0).reshape(len(steps), -1)
    scale = jnp.abs(flat).max(-1)
    tolerance = float(np.sqrt(np.finfo(truth.dtype).eps)) * jnp.maximum(scale, 1e-30)
    worst_wrong = wrong.max(-1)
    where_missed, where_wrong = missed.argmax(-1), wrong.argmax(-1)
    report = functools.partial(
        _raise,
        steps=tuple(steps),
        n=n,
        examples=examples,
        count=count,
        reverse=reverse,
        structure=jac_t.structure or type(jac_t).__name__,
    )
    jax.debug.callback(
        report,
        missed.max(-1),
        where_missed,
        jnp.take_along_axis(flat, where_missed[:, None], -1)[:, 0],
        worst_wrong,
        worst_wrong > tolerance,
        where_wrong,
        jnp.take_along_axis(flat, where_wrong[:, None], -1)[:, 0],
        jnp.take_along_axis(dense.reshape(len(steps), -1), where_wrong[:, None], -1)[:, 0],
    )


def _raise(
    missed,
    where_missed,
    missed_value,
    wrong,
    too_wrong,
    where_wrong,
    true_value,
    claimed_value,
    *,
    steps,
    n,
    examples,
    count,
    reverse,
    structure,
):
    missed, wrong, too_wrong = np.asarray(missed), np.asarray(wrong), np.asarray(too_wrong)
    bad = (missed > 0) | too_wrong
    if not bad.any():
        return
    # the step whose worst entry is largest, among the failing ones
    worst = int(np.argmax(np.where(bad, np.maximum(missed, np.where(too_wrong, wrong, 0)), -1)))
    length = count // examples if examples else count

    def where(step: int) -> str:
        t, b = divmod(step, examples) if examples else (step, None)
        at = f"xs[{length - 1 - t if reverse else t}]"
        return at if b is None else f"{at} (example {b})"

    if missed[worst] > 0:
        col, row = divmod(int(np.asarray(where_missed)[worst]), n)  # J^T[col, row] = J[row, col]
        entry = (
            f"the largest entry it misses is d new_carry[{row}] / d carry[{col}] = "
            f"{float(np.asarray(missed_value)[worst]):.6g}, outside the claimed blocks"
        )
    else:
        col, row = divmod(int(np.asarray(where_wrong)[worst]), n)
        entry = (
            f"the largest wrong entry is d new_carry[{row}] / d carry[{col}] = "
            f"{float(np.asarray(true_value)[worst]):.6g}, built as "
            f"{float(np.asarray(claimed_value)[worst]):.6g}"
        )
    checked = ", ".join(where(step) for step in steps)
    raise ValueError(
        f"bppsa.scan (check_structure=True): the step Jacobian was built as {structure}, but "
        f"at time step {where(steps[worst])} {entry} (indices into the packed carry: its "
        "float leaves flattened and concatenated in jax.tree.leaves order; steps checked: "
        f"{checked}). The structure analysis misread the cell: please report the cell; "
        "meanwhile method='sequential' back-propagates without Jacobians."
    )
