"""The carry cotangents of a scan's backward, the reverse loop in one Pallas kernel.

Algorithm summary. Back-propagation's recurrence is ``g_t = J_t^T g_{t+1} + o_t`` (``g_t`` the
cotangent of the carry that entered step ``t``, ``g_T`` that of the final carry, ``o_t`` what
step ``t``'s output ``y_t`` sends to its carry). Nothing forms ``J_t``:

1. the step is split as the fused forward splits it (:func:`~bppsa.scan._core.fused.split.
   split_step`): its carry cone ``c_{t+1} = cone(c_t, k, s_t)`` (``k`` the values hoisted
   once, ``s_t`` those hoisted per step), its calls with their own derivative rules
   (``custom_jvp``, ``custom_vjp``) kept whole, so that the next item applies each rule;
2. one *reverse step* ``g_t = vjp(cone(., k, s_t), c_t)(g_{t+1}) + o_t`` is traced with JAX's
   own ``jax.vjp`` and split again, its cotangent ``g`` in the carry's place and
   ``(c_t, s_t, o_t)`` in ``x``'s: what does not depend on ``g`` (the cone's primal values at
   ``c_t``, ``1 - tanh^2``, ``W^T``) is evaluated before the loop, for all steps at once; only
   the cotangent's cone, linear in ``g`` (products with ``W^T``, products with the per-step
   factors, sums), runs in the loop, with each chain of elementwise scalings folded into one
   product (:mod:`~bppsa.scan._core.fused.factors`);
3. that loop runs from ``t = T - 1`` down to ``0`` in one kernel
   (:func:`~bppsa.scan._core.fused.kernel.carries_after`, ``reverse=True``): the cotangent on
   chip, the per-step factors streamed in, every ``g_t`` streamed out, on the profile's backend
   (:mod:`~bppsa.scan._core.fused.dispatch`; on the CPU in Pallas' interpreter); on other
   platforms, or where the kernel cannot run the reverse step (:attr:`Plan.reason`: within the
   envelope of the profile's :class:`~bppsa.scan._profile.Kernels`, as for the fused forward),
   the same reverse step runs in ``lax.scan``.

:func:`plan` builds all of it once (both reverse steps, with and without the outputs'
cotangents, and their kernels, abstractly), for the scan's decision to carry; a reverse step the
tracer cannot build (:func:`plan`'s reason string) is left to the caller.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
from jax import lax
from jax.extend.core import Literal

from bppsa.scan._core.fused import dispatch
from bppsa.scan._core.fused.backend import CANNOT
from bppsa.scan._core.fused.factors import fold_scalings
from bppsa.scan._core.fused.kernel import carries_after
from bppsa.scan._core.fused.plan import Loop, plan_loop
from bppsa.scan._core.fused.split import (
    Split,
    residuals,
    shapes_of,
    split_scan_step,
    split_step,
)
from bppsa.scan._core.jaxprs.walk import evaluate, flat_jaxpr, run_equations

if TYPE_CHECKING:
    from bppsa.scan._core.carry import Layout
    from bppsa.scan._core.problem import Problem
    from bppsa.scan._profile import Kernels

KERNEL_NAME = "bppsa_fused_backward"


@dataclasses.dataclass(frozen=True, eq=False)
class Reverse:
    """The reverse step of a scan's step, split, and how its loop runs.

    Attributes:
        split: ``(g_after, (carry, step residuals, offsets), constant residuals) -> g_before``
            over the float carry leaves (``offsets`` only where the outputs send cotangents).
        loop: the kernel's plan for it, or why the kernel cannot run it (then ``lax.scan``
            runs the same reverse step).
    """

    split: Split
    loop: Loop | str


@dataclasses.dataclass(frozen=True, eq=False)
class Plan:
    """A scan's step and its reverse steps, split and planned: what the backward runs.

    Attributes:
        step: the step's split (its carry cone and what is hoisted out of it).
        float_mask: which carry leaves get cotangents.
        with_offsets, without_offsets: the reverse step where the outputs send cotangents to
            the carries and where they send none.
    """

    step: Split
    float_mask: tuple[bool, ...]
    with_offsets: Reverse
    without_offsets: Reverse

    def reverse(self, offsets: bool) -> Reverse:
        return self.with_offsets if offsets else self.without_offsets

    @property
    def reason(self) -> str | None:
        """Why the kernel cannot run the reverse loop (``None``: it can), for outputs that
        send cotangents to the carries."""
        loop = self.with_offsets.loop
        return loop if isinstance(loop, str) else None

    @property
    def step_latency(self) -> float | None:
        """The kernel lab's static estimate of a step of the reverse loop: the slower of the
        two reverse loops' programs' (which one runs depends on the outputs' cotangents);
        ``None``: neither loop runs in the kernel, or their programs have no estimate."""
        loops = (self.with_offsets.loop, self.without_offsets.loop)
        estimates = [lp.step_latency for lp in loops if not isinstance(lp, str)]
        known = [e for e in estimates if e is not None]
        return max(known) if known else None


def plan(
    problem: Problem, kernels: Kernels, num_warps: int | str, lanes: int | str | None
) -> Plan | str:
    """The split step and reverse steps of ``problem`` (one example's shapes) and their loops
    on the backend of ``kernels`` (``num_warps``, ``lanes``: as for
    :func:`~bppsa.scan._core.fused.plan.plan_loop`), or why the reverse step cannot be traced
    (the backward is then another method's)."""
    if problem.length < 1:
        return "an empty scan (length 0)"
    try:
        forward, _ = split_scan_step(problem, rules=True)  # differentiated: rules kept
        mask = tuple(jnp.issubdtype(v.aval.dtype, jnp.inexact) for v in forward.carry_in)
        reverses = [_reverse(forward, mask, offsets) for offsets in (True, False)]
    except CANNOT as err:  # the caller falls back
        return f"the reverse step could not be traced: {type(err).__name__}: {err}"
    planned = [
        Reverse(split, _plan_loop(split, problem.length, kernels, num_warps, lanes))
        for split in reverses
    ]
    made = Plan(forward, mask, *planned)
    try:  # what the run builds besides the kernels (the hoisted parts), abstractly
        _build(made, problem)
    except CANNOT as err:
        return f"the backward could not be built: {type(err).__name__}: {err}"
    return made


def _build(made: Plan, problem: Problem) -> None:
    """Traces :func:`carry_cotangents` of ``made`` for one example of ``problem``, with and
    without offsets, its loops in ``lax.scan`` (the kernels were built by their plans)."""
    scanned = Plan(
        made.step,
        made.float_mask,
        Reverse(made.with_offsets.split, "traced"),
        Reverse(made.without_offsets.split, "traced"),
    )
    layout, length = problem.example_layout, problem.length
    before = jax.tree.map(lambda a: jax.ShapeDtypeStruct((length, *a.shape), a.dtype), problem.init)
    g_last = jax.eval_shape(layout.pack, problem.init)
    offsets = jax.ShapeDtypeStruct((length, *g_last.shape), g_last.dtype)
    for sent in (offsets, None):
        jax.eval_shape(
            lambda c, b, x, g, o: carry_cotangents(scanned, layout, c, b, x, g, o),
            shapes_of(problem.body.consts),
            before,
            problem.xs,
            g_last,
            sent,
        )


def _avals(variables) -> list:
    return [jax.ShapeDtypeStruct(jnp.shape(v.aval), v.aval.dtype) for v in variables]


def _reverse(forward: Split, mask: tuple[bool, ...], offsets: bool) -> Split:
    floats = [v for v, f in zip(forward.carry_in, mask) if f]
    x = _avals([*forward.carry_in, *forward.step_residuals])
    x += _avals(floats) if offsets else []
    g, k = _avals(floats), _avals(forward.constant_residuals)
    reverse_step = _folded(_reverse_step(forward, mask, offsets), g, x, k)
    return split_step(reverse_step, g, x, k)


def _plan_loop(reverse: Split, length: int, kernels: Kernels, num_warps, lanes) -> Loop | str:
    const_shapes = _avals(reverse.constant_residuals)
    step_shapes = [
        jax.ShapeDtypeStruct((length, *v.aval.shape), v.aval.dtype) for v in reverse.step_residuals
    ]

    def build(loop):
        jax.eval_shape(
            lambda g, k, s: _loop(loop, length, g, k, s),
            _avals(reverse.carry_in),
            const_shapes,
            step_shapes,
        )

    return plan_loop(reverse, kernels, num_warps, lanes, build, backward=True)


def _cone(split: Split, carry, constants, steps) -> list:
    """The new carry's leaves from the carry's, by the step's recurrence alone."""
    jaxpr = split.jaxpr.jaxpr
    env = dict(zip(jaxpr.constvars, split.jaxpr.consts))
    env.update(zip(split.carry_in, carry))
    env.update(zip(split.constant_residuals, constants))
    env.update(zip(split.step_residuals, steps))
    run_equations(split.recurrence, env)
    return [_literal(v) if isinstance(v, Literal) else env[v] for v in split.carry_out]


def _literal(v: Literal):
    """A literal output's value as an array of its shape and type."""
    aval: Any = v.aval  # a ShapedArray (typed as its base class)
    return jnp.full(aval.shape, v.val, aval.dtype)


def _reverse_step(forward: Split, mask, offsets: bool):
    """``(g_after, x, constants) -> (g_before, [])`` for :func:`split_step`: ``x`` holds the
    carry that entered the step (all leaves), the step's residuals and, with ``offsets``, the
    cotangents its output sends to the float carry leaves."""
    nc, ns = len(mask), len(forward.step_residuals)

    def reverse_step(g_after, x, constants):
        carry, steps, sent = x[:nc], x[nc : nc + ns], x[nc + ns :]

        def float_map(floats):
            it = iter(floats)
            full = [next(it) if f else c for c, f in zip(carry, mask)]
            out = _cone(forward, full, constants, steps)
            return [o for o, f in zip(out, mask) if f]

        floats = [c for c, f in zip(carry, mask) if f]
        _, vjp = jax.vjp(float_map, floats)
        (g_before,) = vjp(list(g_after))
        if offsets:
            g_before = [g + o for g, o in zip(g_before, sent)]
        return list(g_before), []

    return reverse_step


def _folded(reverse_step, g, x, k):
    """``reverse_step`` with its scalings of the cotangent folded
    (:func:`~bppsa.scan._core.fused.factors.fold_scalings`)."""
    ng, nx = len(g), len(x)

    def flat(*args):
        return reverse_step(args[:ng], args[ng : ng + nx], args[ng + nx :])[0]

    closed = fold_scalings(flat_jaxpr(flat, *g, *x, *k), ng)

    def folded(g, x, k):
        return evaluate(closed.jaxpr, closed.consts, *g, *x, *k), []

    return folded


def _loop(loop: Loop, length, g_last, constants, steps):
    """``[g_0 .. g_{T-1}]`` leaves by ``loop``'s kernel (a program per tile of its lanes)."""
    return carries_after(
        loop.split,
        length,
        g_last,
        constants,
        steps,
        backend=loop.backend,
        launch=loop.launch,
        reverse=True,
        name=KERNEL_NAME,
        tiled=loop.tiled,
    )


def _scanned(split: Split, length, g_last, constants, steps):
    """``[g_0 .. g_{T-1}]`` leaves by ``lax.scan`` (the same reverse step, unpadded)."""
    jaxpr = split.jaxpr.jaxpr
    env = dict(zip(jaxpr.constvars, split.jaxpr.consts))
    env.update(zip(split.constant_residuals, constants))

    def body(g, step):
        local = dict(env)
        local.update(zip(split.carry_in, g))
        local.update(zip(split.step_residuals, step))
        run_equations(split.recurrence, local)
        new = [
            jnp.full(old.shape, v.val, old.dtype)
            if isinstance(v, Literal)
            else local[v].astype(old.dtype)
            for v, old in zip(split.carry_out, g)
        ]
        return new, new

    _, out = lax.scan(body, list(g_last), list(steps), length=length, reverse=True)
    return out


def carry_cotangents(made: Plan, layout: Layout, consts, carries_before, xs, g_last, offsets):
    """``(T, n)``: the packed cotangents ``g_0 .. g_{T-1}`` of the carries that entered the
    steps, of one example.

    Args:
        made: the problem's :func:`plan`.
        layout: how one example's carry packs.
        consts: the body's constants.
        carries_before: ``(T, ...)`` leaves: the carry that entered each step.
        xs: the steps' inputs (time order).
        g_last: ``(n,)``, the final carry's cotangent.
        offsets: ``(T, n)``, what each step's output sends to its carry, or ``None``.
    """
    step, planned = made.step, made.reverse(offsets is not None)
    reverse = planned.split
    length = jax.tree.leaves(carries_before)[0].shape[0]
    before = jax.tree.leaves(carries_before)
    _, _, k_step, s_step = residuals(step, list(consts), jax.tree.leaves(xs), length)
    inputs = [*before, *s_step]
    if offsets is not None:
        inputs += layout.float_leaves(layout.unpack(offsets, carries_before, stacked=True))
    g_end = layout.float_leaves(layout.unpack(g_last, jax.tree.map(lambda a: a[0], carries_before)))
    g_end = [g.astype(v.aval.dtype) for g, v in zip(g_end, reverse.carry_in)]
    _, _, constants, steps = residuals(reverse, k_step, inputs, length)

    def scanned(g, k, s):
        return _scanned(reverse, length, g, k, s)

    loop = planned.loop
    if isinstance(loop, str):
        out = scanned(g_end, constants, steps)
    else:

        def kernel(runner):
            return lambda g, k, s: _loop(loop.on(runner), length, g, k, s)

        @jax.custom_jvp
        def run(g, k, s):
            return dispatch.dispatch(loop.backend, kernel, scanned, g, k, s)

        # JAX cannot differentiate the kernel (its loop writes refs): a derivative of the
        # backward itself (a Hessian) differentiates the same loop in lax.scan.
        run.defjvp(lambda primals, tangents: jax.jvp(scanned, primals, tangents))
        out = run(g_end, constants, steps)
    it = iter(out)
    treedef: Any = jax.tree.structure(carries_before)  # jaxlib's, unresolved to type checkers
    tree = treedef.unflatten([next(it) if f else b for b, f in zip(before, made.float_mask)])
    return layout.pack(tree, stacked=True)
