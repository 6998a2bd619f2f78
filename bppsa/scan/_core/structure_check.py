"""Checks of a structured step Jacobian against the step itself.

Wherever a scan builds its steps' transposed Jacobians in a structure found in the cell's jaxpr
(diagonal, block-diagonal), a check compares them with the step's own derivative (the
``check_structure`` option of :func:`bppsa.scan`, :func:`bppsa.grad` and
:func:`bppsa.value_and_grad`):

* by default (:func:`sampled`), at the middle step: the structured ``J^T`` applied to two fixed
  pseudo-random vectors against the step's VJP of the same vectors, the cost of two VJPs of one
  step. A structure that misses an entry mixes the columns of the colours it was built from,
  which shows in ``J^T u`` for almost every ``u``. It raises ``ValueError`` naming the structure,
  the step (as an index into ``xs``) and the carry element where ``J^T u`` differs most, past
  ``4 sqrt(eps)`` of ``|J^T| |u|`` (room for the library's products at a lower precision);
* with ``check_structure=True`` (:func:`check`), the first, middle and last steps are
  differentiated densely (one JVP per carry element) and the whole Jacobian is compared with
  the structured one, the error naming the largest entry the structure misses: a nonzero of the
  true Jacobian outside the claimed blocks, or a block entry that differs from the true one by
  more than ``sqrt(eps)`` of the largest entry.

Both run on the device (a ``jax.debug.callback`` with a few values per checked step; the
sampled check calls the host only on a mismatch). Outside ``jax.jit`` the ``ValueError``
reaches the caller (:func:`bppsa.scan._core.debug.readable_errors`); under the user's
``jax.jit`` JAX re-raises it as its runtime error, with the same message at its end. With
``check_structure=False``, nothing of either is traced.
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


SAMPLES = 2  # vectors the sampled check applies the step's J^T to
PREFIX = "bppsa.scan (check_structure"  # how both checks' messages begin


def sampled(
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
    """Compares ``jac_t`` at the middle step with the step's VJP on :data:`SAMPLES` fixed
    vectors; raises (through a callback) where they differ. Arguments as for :func:`check`."""
    count = len(jac_t)
    if not count:
        return
    step = count // 2
    consts, carries, xs = jax.lax.stop_gradient((consts, carries, xs))
    carry, x = jax.tree.map(lambda a: a[step], (carries, xs))
    claimed = jac_t.map_per_step(lambda a: jax.lax.stop_gradient(a)[step : step + 1])
    point = pack(carry)
    n = point.shape[-1]
    # fixed vectors: the check is the same on every run (no randomness a test could trip on)
    u = jax.random.normal(jax.random.key(0), (SAMPLES, n), point.dtype)
    _, pullback = jax.vjp(carry_map_at(consts, carry, x), point)
    truth = jax.vmap(lambda v: pullback(v)[0])(u)  # (SAMPLES, n): J^T u
    built = claimed.apply(u[None])[0]
    scale = claimed.map_per_step(jnp.abs).apply(jnp.abs(u)[None])[0]
    eps = float(np.finfo(truth.dtype).eps)
    tolerance = 4 * np.sqrt(eps) * jnp.maximum(scale.max(), np.finfo(truth.dtype).tiny)
    difference = jnp.abs(truth - built).max(0)  # (n,)
    where = difference.argmax()
    report = functools.partial(
        _raise_sampled,
        step=step,
        examples=examples,
        count=count,
        reverse=reverse,
        structure=jac_t.structure or type(jac_t).__name__,
    )
    bad = difference[where] > tolerance
    # the host is called only on a mismatch (a callback on every run costs the backward of a
    # small scan a fifth of its time; under jax.vmap both branches run, as they would anyway)
    jax.lax.cond(
        bad,
        lambda *args: jax.debug.callback(report, *args),
        lambda *args: None,
        difference[where],
        bad,
        where,
        scale.max(),
    )


def _raise_sampled(difference, bad, where, scale, *, step, examples, count, reverse, structure):
    bad = np.asarray(bad)
    if not bad.any():
        return
    # under jax.vmap the arguments carry the batch: report the worst example
    worst = int(np.argmax(np.where(bad, np.asarray(difference), -1).reshape(-1)))
    difference, where, scale = (
        np.asarray(a).reshape(-1)[worst] for a in (difference, where, scale)
    )
    raise ValueError(
        f"bppsa.scan (check_structure): the step Jacobian was built as {structure}, but at "
        f"time step {_step_name(step, examples, count, reverse)} it does not match the step's "
        f"own derivative: for fixed vectors u, J^T u differs from the step's VJP of u by "
        f"{float(difference):.6g} at carry element {int(where)} (|J^T| |u| is at most "
        f"{float(scale):.6g}; indices into the packed carry: its float leaves flattened and "
        "concatenated in jax.tree.leaves order). The structure analysis misread the cell: "
        "please report the cell; check_structure=True names the entry it misses, "
        "check_structure=False turns the check off, and method='sequential' back-propagates "
        "without Jacobians."
    )


def _step_name(step: int, examples: int | None, count: int, reverse: bool) -> str:
    """Step ``step`` of a stack of ``count`` (``T * B`` steps of a batch with ``examples``) as
    an index into ``xs``."""
    length = count // examples if examples else count
    t, b = divmod(step, examples) if examples else (step, None)
    at = f"xs[{length - 1 - t if reverse else t}]"
    return at if b is None else f"{at} (example {b})"


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

    def where(step: int) -> str:
        return _step_name(step, examples, count, reverse)

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
