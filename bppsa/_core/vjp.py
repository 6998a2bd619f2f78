"""The custom VJP of a Jacobian-based scan: a forward slot, then the method's own backward.

:func:`jacobian_scan` wires a scan as ``(consts, init, xs) -> (carry, ys)`` with a
``jax.custom_vjp``: the forward (:mod:`bppsa._core.forward`) keeps the carry entering every
step; the backward asks the requested method, for this scan's footprint and memory limit, which
concrete method runs (``fit``), and hands it the residuals and cotangents (``backward``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import jax
from jax.custom_derivatives import SymbolicZero

from bppsa._core import backward, debug, tracing
from bppsa._core.carry import zero_cotangent
from bppsa._core.forward import Forward

if TYPE_CHECKING:
    from bppsa._core.methods.base import Method
    from bppsa._core.plans import ScanPlan
    from bppsa._core.problem import Problem


def jacobian_scan(
    requested: Method,
    problem: Problem,
    forward: Forward,
    *,
    memory_limit: float | None,
    check_finite: bool,
    plan: ScanPlan | None = None,
):
    """``(consts, init, xs) -> (carry, ys)`` (``xs`` in time order) with BPPSA as its VJP.

    Args:
        requested: the method the scan was asked for; its ``fit`` picks the concrete method of
            the backward when the backward is traced.
        problem: the prepared scan.
        forward: the forward slot.
        memory_limit: bytes (``None``: the default device's available memory).
        check_finite: report the first non-finite step (see :mod:`bppsa._core.debug`).
        plan: where to record the backward's method, if recording.
    """
    step, layout, num_steps = problem.body.step, problem.layout, problem.length
    init_shape = problem.init
    all_steps = problem.all_steps()

    @jax.custom_vjp
    def run(consts, init, xs):
        return forward(step, consts, init, xs, length=num_steps, keep=False)

    def run_fwd(consts, init, xs):
        consts, init, xs = jax.tree.map(lambda p: p.value, (consts, init, xs))
        carry, (ys, carries_before) = forward(step, consts, init, xs, length=num_steps, keep=True)
        return (carry, ys), (consts, xs, carries_before)

    def run_bwd(residuals, cotangents):
        consts, xs, carries_before = residuals
        ct_carry, ct_ys = cotangents
        (_, ys_shape), _ = jax.eval_shape(all_steps, consts, carries_before, xs)
        if all(isinstance(ct, SymbolicZero) for ct in jax.tree.leaves(ct_ys)):
            ct_ys = None  # only the final carry receives a cotangent
        else:
            ct_ys = _instantiate_tree(ct_ys, ys_shape)
        if not problem.differentiable_carry:
            # Nothing in the carry is differentiable (no float leaves, or only empty ones): the
            # cotangents come from the outputs alone.
            ct_consts, ct_xs = backward.steps_vjp(all_steps, consts, carries_before, xs, ct_ys)
            return ct_consts, layout.zeros(init_shape), ct_xs
        g_last = layout.pack(_instantiate_tree(ct_carry, init_shape))
        method = requested.fit(problem.footprint, memory_limit)
        if plan is not None:
            plan.backward = method
        g_first, ct_consts, ct_xs, flags = method.backward(
            problem, consts, carries_before, xs, g_last, ct_ys, check=check_finite
        )
        if check_finite:
            debug.report(flags, g_last, problem.reverse)
        return ct_consts, layout.unpack(g_first, init_shape), ct_xs

    run.defvjp(run_fwd, run_bwd, symbolic_zeros=True)

    def differentiable(consts, init, xs):
        if tracing.differentiated_forward((init, xs, consts)):
            raise TypeError(
                f"bppsa.scan with method={requested!r} has no forward-mode derivative "
                "(jax.jvp, jax.jacfwd, jax.linearize): its backward pass is a custom VJP. Use "
                "method='sequential' (plain jax.lax.scan, which supports every transformation) "
                "or reverse mode (jax.grad, jax.vjp, jax.jacrev)."
            )
        return run(consts, init, xs)

    return differentiable


def _instantiate(ct, like):
    """A real array for a symbolic-zero cotangent (``float0`` for integer leaves)."""
    return zero_cotangent(like) if isinstance(ct, SymbolicZero) else ct


def _instantiate_tree(cts, like):
    return jax.tree.map(_instantiate, cts, like, is_leaf=lambda x: isinstance(x, SymbolicZero))
