"""The derivatives of a Jacobian-based scan: a forward slot, a tangent scan, the method's backward.

:func:`jacobian_scan` wires a scan as ``(consts, init, xs) -> (carry, ys)`` with the library's
one differentiable wrapper (:func:`bppsa.scan._core.linear.differentiable`, which chains of
layers use too). Its JVP rule runs the forward (:mod:`bppsa.scan._core.forward`), keeping the
carry that entered every step, and returns the tangents through
:func:`bppsa.scan._core.linear.linear_map`:

* evaluated (``jax.jvp``, ``jax.jacfwd``, ``jax.linearize``), the map is the tangent recurrence
  ``dh_t = J_t dh_{t-1} + u_t`` (``u_t`` what the step's inputs and parameters send), solved by
  the method's own linear scan over the steps' Jacobians, in time order (:func:`tangents`);
* transposed (``jax.grad``, ``jax.vjp``, ``jax.jacrev``), it is the method's backward: the
  method of the scan's decision (:mod:`bppsa.scan._core.decision`: the policy's pick for this
  scan's footprint and memory limit) back-propagates the cotangents (:func:`cotangents`).

Higher orders compose: the rule calls the scan itself for its primal (a variant that also
returns the carries), so an outer derivative goes through the same rule again. That is why a
scan over time wraps two functions: the scan (carry and outputs only, what a forward-only
program computes) and that variant (also the carries, and the forward's Jacobians where it
shares them), each with the same rule; a scan defined as a slice of the variant would keep
every carry in programs that never differentiate it.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import TYPE_CHECKING

import jax
import jax.numpy as jnp

from bppsa.scan._core import backward, debug, linear
from bppsa.scan._core.carry import floats_only, zero_cotangent, zeros_for_none
from bppsa.scan._core.methods.base import Method, require

if TYPE_CHECKING:
    from bppsa.scan._core.decision import Decision
    from bppsa.scan._core.plans import ScanPlan
    from bppsa.scan._core.problem import Problem


def differentiable(decision: Decision, problem: Problem, plan: ScanPlan | None = None):
    """The scan as a differentiable ``(consts, init, xs) -> (carry, ys)`` (``xs`` in time
    order) as ``decision`` says: ``lax.scan`` itself for plain back-propagation, else
    :func:`jacobian_scan`."""
    if decision.plain:

        def run(consts, init, xs):  # JAX differentiates the lax.scan itself
            return _checked_forward(decision, problem, consts, init, xs)

        return run
    return jacobian_scan(decision, problem, plan)


def jacobian_scan(decision: Decision, problem: Problem, plan: ScanPlan | None = None):
    """``(consts, init, xs) -> (carry, ys)`` (``xs`` in time order) with BPPSA derivatives.

    Args:
        decision: what the scan runs (its backward method, forward, precision, kernels;
            :mod:`bppsa.scan._core.decision`).
        problem: the prepared scan.
        plan: where to record the backward's method, if recording.
    """
    setup = _Setup(decision, problem, plan)
    forward = decision.forward

    def keep_primal(consts, init, xs):  # also returns the carry that entered every step
        setup.warn_unused_cell(forward.forms_jacobians(problem))
        with setup.library():
            if decision.shares_jacobians:  # and the steps' Jacobians there, for the backward
                carry, (ys, before, jac_t) = forward.with_jacobians(problem, consts, init, xs)
                return carry, ys, before, jac_t
            carry, (ys, before) = decision.run_forward(problem, consts, init, xs, keep=True)
        return carry, ys, before

    def primal(consts, init, xs):  # a scan that is only run (a derivative takes evaluate)
        setup.warn_unused_cell(forward.forms_jacobians(problem))
        with setup.library():
            return _checked_forward(decision, problem, consts, init, xs)

    def evaluate(consts, init, xs):
        out = run_keep(consts, init, xs)
        jac_t = out[3] if len(out) > 3 else None
        return out, (consts, out[2], xs, jac_t)  # consts, carries before, xs, Jacobians

    def evaluate_without_jacobians(consts, init, xs):
        out, res = evaluate(consts, init, xs)
        return out[:3], res

    rules: dict[str, Callable] = dict(
        transpose=setup.cotangents, batched_transpose=setup.batched_cotangents
    )
    run_keep = linear.differentiable(  # every output, the shared Jacobians too
        keep_primal, evaluate, functools.partial(setup.tangents, jacobians=True), **rules
    )
    return linear.differentiable(
        primal,
        evaluate_without_jacobians,
        setup.tangents,
        outputs=lambda out: out[:2],
        **rules,
    )


@dataclasses.dataclass(frozen=True, eq=False)
class _Setup:
    """What the tangent map and its transpose need of the scan."""

    decision: Decision
    problem: Problem
    plan: ScanPlan | None

    def library(self):
        """The context of the library's own work for this scan (the decision's)."""
        return self.decision.library()

    @property
    def fitted(self) -> Method:
        """The method of this scan's backward (the decision's; raises its memory error)."""
        return self.decision.backward_method()

    @property
    def check_finite(self) -> bool:
        return self.decision.check_finite

    def warn_unused_cell(self, builds: bool = True) -> None:
        """Where the Jacobians are built (``builds``): the body's warning if a cell it calls
        does not give them (:meth:`bppsa.scan._core.body.Body.warn_unused_cell`)."""
        if builds and self.problem.differentiable_carry:
            self.problem.body.warn_unused_cell()

    def tangents(self, res, lin, jacobians=False):
        """``(dcarry, dys, dbefore)`` from ``lin = (dconsts, dinit, dxs)``: the tangent
        recurrence, solved in time order by the method's linear scan (float leaves only);
        with ``jacobians``, where the forward shares its Jacobians, also their tangent
        ``djac_t`` (the JVP of their builder along the tangent trajectory: what makes outer
        derivatives through them exact)."""
        self.warn_unused_cell()
        with self.library():
            return self._tangents(res, lin, jacobians)

    def _tangents(self, res, lin, jacobians):
        consts, before, xs, given = res
        init = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape[1:], a.dtype), before)
        dconsts, dinit, dxs = (
            zeros_for_none(t, like) for t, like in zip(lin, (consts, init, xs), strict=True)
        )
        problem, layout = self.problem, self.problem.layout
        steps = problem.all_steps(jacobians=given is None)
        _, f_jvp, jac_t = jax.linearize(steps, consts, before, xs, has_aux=True)
        jac_t = jac_t if given is None else given
        dbefore = jax.tree.map(zero_cotangent, before)
        if problem.differentiable_carry:
            method = self.fitted
            require(method, "tangents")
            inputs_dot, _ = f_jvp(dconsts, dbefore, dxs)
            h = method.forward_scan(  # [dh_0, ..., dh_T]
                layout.pack(dinit), jac_t, layout.pack(inputs_dot, stacked=True)
            )
            dbefore = layout.unpack(h[:-1], before, stacked=True)
            dcarry = layout.unpack(h[-1], init)
        else:
            dcarry = jax.tree.map(zero_cotangent, init)
        _, dys = f_jvp(dconsts, dbefore, dxs)
        if given is None or not jacobians:
            return floats_only((dcarry, dys, dbefore))
        _, djac_t = jax.jvp(
            _jacobians_of(problem.all_steps()), (consts, before, xs), (dconsts, dbefore, dxs)
        )
        return floats_only((dcarry, dys, dbefore, djac_t))

    def cotangents(self, res, cts):
        """``(ct_consts, ct_init, ct_xs)`` from the cotangents of ``(carry, ys, before)`` (and
        of the shared Jacobians; ``None`` where none arrives): the method's backward."""
        self.warn_unused_cell()
        with self.library():
            return self._backward(self.problem, self.fitted, res, cts)

    def batched_cotangents(self, res, res_axes, cts, lin_axes):
        """:meth:`cotangents` of a whole ``jax.vmap`` batch at once (see
        :func:`bppsa.scan._core.linear.linear_map`), or ``None`` where the examples must be done
        one by one: the backward runs on :meth:`Problem.batched_problem`, ``(T, B, ...)``
        arrays, so that the cotangents of the shared consts come out of one product over steps
        and examples. It needs consts shared by the batch (their values and tangents), and it
        leaves the finiteness check (which reports per example) to the one-by-one path."""
        self.warn_unused_cell()
        with self.library():
            return self._batched_cotangents(res, res_axes, cts, lin_axes)

    def _batched_cotangents(self, res, res_axes, cts, lin_axes):
        consts, before, xs, jac_t = res
        const_axes, before_axes, xs_axes, jac_axes = res_axes
        const_lin_axes, init_lin_axes, xs_lin_axes = lin_axes
        if self.check_finite or _any_batched(const_axes) or _any_batched(const_lin_axes):
            return None
        if len(cts) > 3 and not _all_none(cts[3]):  # an outer derivative of the Jacobians
            return None
        method = self.fitted
        if not method.supports.whole_batch:
            return None
        size = _batch_size(res, res_axes, cts)

        def time_major(a, axis):  # (B, T, ...), or an unbatched (T, ...), to (T, B, ...)
            if axis is None:
                return jnp.broadcast_to(a[:, None], (a.shape[0], size, *a.shape[1:]))
            return jnp.swapaxes(a, 0, 1)

        before, xs = (
            _map_axes(time_major, axes, tree)
            for axes, tree in ((before_axes, before), (xs_axes, xs))
        )
        if jac_t is not None:  # per-step fields (T, B, ...) as the batched problem forms them
            if _any_batched(list(jac_axes.shared().values())):
                return None
            jac_t = jac_t.with_per_step(
                **{
                    name: time_major(a, jac_axes.per_step()[name])
                    for name, a in jac_t.per_step().items()
                    if a is not None
                }
            )
        ct_carry, ct_ys, ct_before = cts[:3]
        ct_ys, ct_before = (
            jax.tree.map(_batch_first, t, is_leaf=_none) for t in (ct_ys, ct_before)
        )
        problem = self.problem.batched_problem()
        ct_consts, ct_init, ct_xs = self._backward(
            problem, method, (consts, before, xs, jac_t), (ct_carry, ct_ys, ct_before)
        )
        ct_xs = jax.tree.map(_batch_first, ct_xs, is_leaf=_none)

        def per_example(ct, axis):  # an unbatched linear argument gets the batch's sum
            return ct if ct is None or axis is not None else ct.sum(0)

        ct_init, ct_xs = (
            _map_axes(per_example, axes, tree)
            for axes, tree in ((init_lin_axes, ct_init), (xs_lin_axes, ct_xs))
        )
        return ct_consts, ct_init, ct_xs

    def _backward(self, problem, method, res, cts):
        consts, before, xs, jac_t = res
        layout = problem.layout
        ct_carry, ct_ys, ct_before = cts[:3]
        extra = None
        if len(cts) > 3 and not _all_none(cts[3]):
            # An outer derivative of the shared Jacobians: the VJP of their builder, whose
            # cotangent of the carries joins theirs.
            all_steps = problem.all_steps()
            _, jac_vjp = jax.vjp(_jacobians_of(all_steps), consts, before, xs)
            extra = jac_vjp(zeros_for_none(cts[3], jac_t))
            ct_before = _add(ct_before, extra[1])
        if _all_none(ct_before):
            ct_ys = None if _all_none(ct_ys) else ct_ys
        else:  # an outer derivative of the carries themselves: they become outputs too
            problem = problem.keeping_carries()
            ct_ys = (ct_ys, ct_before)
        all_steps = problem.all_steps()
        (_, ys_shape), _ = jax.eval_shape(all_steps, consts, before, xs)
        if ct_ys is not None:
            ct_ys = zeros_for_none(ct_ys, ys_shape)
        init_shape = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape[1:], a.dtype), before)
        if not problem.differentiable_carry:
            # Nothing in the carry is differentiable (no float leaves, or only empty ones): the
            # cotangents come from the outputs alone.
            ct_consts, ct_xs = backward.steps_vjp(all_steps, consts, before, xs, ct_ys)
            return floats_only((ct_consts, layout.zeros(init_shape), ct_xs))
        g_last = layout.pack(zeros_for_none(ct_carry, init_shape))
        if self.plan is not None:
            self.plan.backward, self.plan.whole_batch = method, problem.batched
            self.plan.forward_jacobians = jac_t is not None
        given = {} if jac_t is None else {"jacobians": jac_t}
        if self.decision.backward_prepared is not None:  # only to a method that prepares
            given["prepared"] = self.decision.backward_prepared
        g_first, ct_consts, ct_xs, flags = method.backward(
            problem,
            consts,
            before,
            xs,
            g_last,
            ct_ys,
            check=self.check_finite,
            **given,
        )
        if self.check_finite:
            debug.report(flags, g_last, problem.reverse)
        if extra is not None:
            ct_consts, ct_xs = _add(ct_consts, extra[0]), _add(ct_xs, extra[2])
        return floats_only((ct_consts, layout.unpack(g_first, init_shape), ct_xs))


def _checked_forward(decision: Decision, problem: Problem, consts, init, xs):
    """The forward's ``(carry, ys)``; with ``check_finite``, its steps are checked too (see
    :func:`bppsa.scan._core.debug.check_forward`)."""
    if not decision.check_finite:
        return decision.run_forward(problem, consts, init, xs, keep=False)
    carry, (ys, before) = decision.run_forward(problem, consts, init, xs, keep=True)
    debug.check_forward(init, before, carry, ys, problem.reverse)
    return carry, ys


def _jacobians_of(all_steps):
    """``(consts, carries_before, xs) -> jac_t``: the Jacobians ``all_steps`` forms."""
    return lambda consts, before, xs: all_steps(consts, before, xs)[1]


def _add(a, b):
    """Leafwise sum of two cotangent trees (``None`` in ``a``: ``b``'s; ``float0``: kept)."""

    def add(x, y):
        if x is None:
            return y
        if y is None or y.dtype == jax.dtypes.float0:
            return x
        return x + y

    return jax.tree.map(add, a, b, is_leaf=_none)


def _none(x) -> bool:
    return x is None


def _batch_first(a):
    """``(B, T, ...)`` from ``(T, B, ...)`` and back (``None`` stays)."""
    return None if a is None else jnp.swapaxes(a, 0, 1)


def _map_axes(fn, axes, tree):
    """``fn(leaf, axis)`` over ``tree`` and the batch ``axes`` (``0`` or ``None``) of its leaves."""
    return jax.tree.map(lambda axis, leaf: fn(leaf, axis), axes, tree, is_leaf=_none)


def _any_batched(axes) -> bool:
    return any(axis is not None for axis in jax.tree.leaves(axes, is_leaf=_none))


def _batch_size(res, res_axes, cts) -> int:
    """The size of the batch: the leading axis of any batched leaf (every output is)."""
    for leaf in jax.tree.leaves(cts):
        return leaf.shape[0]
    pairs = zip(jax.tree.leaves(res_axes, is_leaf=_none), jax.tree.leaves(res), strict=True)
    return next(leaf.shape[0] for axis, leaf in pairs if axis is not None)


def _all_none(tree) -> bool:
    return all(leaf is None for leaf in jax.tree.leaves(tree, is_leaf=_none))
