"""``bppsa.Fused()``: the forward loop of a scan in one GPU kernel (Pallas), any cell.

The step is split (:mod:`~bppsa.scan._core.fused.split`): what does not depend on the carry runs
before the loop for all steps at once, outputs ``ys`` that are not carries run after it for all
steps at once, and only the carry's dependence cone runs in the kernel
(:mod:`~bppsa.scan._core.fused.kernel`), on arrays padded to powers of two with masks
(:mod:`~bppsa.scan._core.fused.padded`). The platform is chosen when the program is lowered
(``lax.platform_dependent``): on CUDA the kernel (Triton), on the CPU the same kernel in Pallas'
interpreter, elsewhere ``lax.scan``. A scan the kernel cannot run (:meth:`Fused.why_not`) runs
``lax.scan``, the same values: never an error, but asked for explicitly (``forward="fused"``,
``forward=Fused(...)``) a :class:`bppsa.FallbackWarning` with the reason, once per trace.

The envelope, the largest arrays the kernel takes, is data of the profile
(:class:`~bppsa.scan._profile.Kernels`' ``fused_max_tile`` and ``fused_max_resident``): the
decision passes its profile to :meth:`Fused.why_not`, and the kernel reads the same
:class:`~bppsa.scan._profile.Kernels` when it is traced, from the decision's
:meth:`~bppsa.scan._core.decision.Decision.library` context (:mod:`bppsa.scan._kernels`).
"""

from __future__ import annotations

import dataclasses
import math
import weakref
from typing import TYPE_CHECKING, Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.extend.core import Literal

from bppsa.scan import _kernels
from bppsa.scan._core.forward import Forward, run_sequentially
from bppsa.scan._core.fused import padded
from bppsa.scan._core.fused.kernel import carries_after, check_options
from bppsa.scan._core.fused.lanes import LANES, Tiled, split_lanes
from bppsa.scan._core.fused.split import Split, residuals, shapes_of, split_scan_step
from bppsa.scan._core.jaxprs.walk import run_equations

if TYPE_CHECKING:
    from bppsa.scan._core.problem import Problem
    from bppsa.scan._profile import Kernels, Profile


def envelope(kernels: Kernels) -> tuple[int, int]:
    """``(fused_max_tile, fused_max_resident)`` of ``kernels``: all a plan depends on of them
    (the key of the plans' caches beside the problem)."""
    return kernels.fused_max_tile, kernels.fused_max_resident


@dataclasses.dataclass(frozen=True, eq=False)
class _Plan:
    split: Split
    ys_tree: Any
    tiled: Tiled | None = None


_PLANS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


@dataclasses.dataclass(frozen=True)
class Fused(Forward):
    """The forward loop in one Pallas kernel launch, the carry on chip.

    Where the kernel cannot run the scan (:meth:`why_not`: float64 or complex values, a
    primitive without a rule, arrays beyond the profile's envelope), the scan runs ``lax.scan``,
    with the same values, and warns once per trace with the reason
    (:class:`bppsa.FallbackWarning`; ``warnings.simplefilter("error", bppsa.FallbackWarning)``
    makes it an error). ``bppsa.AutoForward()``'s own choice of the kernel does not warn: it
    records the reason in :func:`bppsa.trace_plans`' ``forward_because``.

    Attributes:
        num_warps: Triton warps per program.
        lanes: lanes of the carry per program where they are independent (a diagonal or
            block-diagonal cell, found in its jaxpr: :mod:`~bppsa.scan._core.fused.lanes`);
            ``None``: one program per example (under ``jax.vmap``) always.

    Example:
        >>> from bppsa.models import RNN, rnn_cell
        >>> params = RNN().init(3, 20, key=jax.random.key(0))
        >>> body = lambda h, x: (rnn_cell(params, h, x), h)
        >>> h, ys = bppsa.scan(body, jnp.zeros(20), jnp.ones((50, 3)), forward="fused")
        >>> ys.shape
        (50, 20)
    """

    num_warps: int = 4
    lanes: int | None = LANES
    name: ClassVar[str] = "fused"

    def __post_init__(self):
        check_options("Fused", self.num_warps, self.lanes)

    def why_not(self, problem: Problem, profile: Profile | None = None) -> str | None:
        """Why the kernel cannot run ``problem``'s scan (``None``: it can) within the envelope
        of ``profile``'s kernels (``None``: the defaults, ``Kernels()``'s)."""
        kernels = _kernels.DEFAULT if profile is None else profile.kernels
        plan = self._plan(problem, kernels)
        return plan if isinstance(plan, str) else None

    def __call__(self, problem, consts, init, xs, *, keep):
        plan = self._plan(problem, _kernels.current())  # the decision's: see the module
        if isinstance(plan, str):
            return run_sequentially(problem.body.step, consts, init, xs, problem.length, keep)

        def kernel(interpret):
            return lambda c, i, x: _run(plan, problem.length, c, i, x, keep, interpret, self)

        def sequential(c, i, x):
            return run_sequentially(problem.body.step, c, i, x, problem.length, keep)

        return lax.platform_dependent(
            list(consts), init, xs, cpu=kernel(True), cuda=kernel(False), default=sequential
        )

    def _plan(self, problem: Problem, kernels: Kernels) -> _Plan | str:
        plans = _PLANS.setdefault(problem, {})
        key = (self.lanes, *envelope(kernels))
        if key not in plans:  # a plan made under other limits or lanes is another entry
            plans[key] = _make_plan(problem, self, kernels)
        return plans[key]

    def __repr__(self) -> str:
        fields = [f"num_warps={self.num_warps}"] if self.num_warps != 4 else []
        fields += [f"lanes={self.lanes}"] if self.lanes != LANES else []
        return f"Fused({', '.join(fields)})"


def _make_plan(problem: Problem, forward: Fused, kernels: Kernels) -> _Plan | str:
    """The split step of ``problem``, or why the kernel cannot run it (within the envelope of
    ``kernels``)."""
    if problem.length < 1:
        return "an empty scan (length 0)"
    try:
        split, ys_tree = split_scan_step(problem)
    except Exception as err:  # any failure of the split falls back
        return f"the step could not be split: {type(err).__name__}: {err}"
    tiled = split_lanes(split, forward.lanes)
    reason = _unsupported(split if tiled is None else tiled, kernels)
    if reason is not None:
        return reason
    plan = _Plan(split, ys_tree, tiled)
    try:  # build the interpreted kernel once, abstractly: any error of the rules falls back
        init = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), problem.init)
        jax.eval_shape(
            lambda c, i, x: _run(plan, problem.length, c, i, x, True, True, forward),
            shapes_of(problem.body.consts),
            init,
            problem.xs,
        )
    except Exception as err:  # any error of the rules falls back
        return f"the kernel could not be built: {type(err).__name__}: {err}"
    return plan


def _unsupported(split: Split | Tiled, kernels: Kernels) -> str | None:
    """Why the kernel cannot run the loop of ``split`` (or of its tile): a type, a primitive
    without a padded rule, or arrays beyond the envelope of ``kernels`` (``None``: it can)."""
    for v in split.carry_in:
        dtype = np.dtype(v.aval.dtype)
        if dtype.itemsize == 8 or jnp.issubdtype(dtype, jnp.complexfloating):
            return f"a carry of {dtype.name} (the kernel runs 32-bit and narrower types)"
    for eqn in split.recurrence:
        reason = padded.unsupported(eqn)
        if reason is not None:
            return reason
        tile = padded.largest_tile(eqn)
        if tile > kernels.fused_max_tile:
            return (
                f"the primitive {eqn.primitive.name!r} forms {tile} entries after padding "
                f"(the envelope's fused_max_tile: {kernels.fused_max_tile})"
            )
    resident = sum(
        math.prod(padded.padded_shape(v.aval.shape))
        for v in [*split.constant_residuals, *split.carry_in]
    )
    if resident > kernels.fused_max_resident:
        return (
            f"its constants and carry hold {resident} entries after padding (the envelope's "
            f"fused_max_resident: {kernels.fused_max_resident})"
        )
    return None


def _run(plan: _Plan, length, consts, init, xs, keep, interpret, forward: Fused):
    """The fused forward, as :class:`Forward` returns it."""
    split = plan.split
    carry_leaves, carry_tree = jax.tree.flatten(init)
    x_leaves = jax.tree.leaves(xs)
    env, x_vars, constant_values, steps = residuals(split, consts, x_leaves, length)
    after = carries_after(
        split,
        length,
        carry_leaves,
        constant_values,
        steps,
        interpret=interpret,
        num_warps=forward.num_warps,
        tiled=plan.tiled,
    )
    before = [
        jnp.concatenate([c[None].astype(a.dtype), a[:-1]]) for c, a in zip(carry_leaves, after)
    ]
    ys = _outputs(split, length, env, x_vars, x_leaves, steps, before, after)
    final = carry_tree.unflatten([a[-1] for a in after])
    ys = plan.ys_tree.unflatten(ys)
    if keep:
        return final, (ys, carry_tree.unflatten(before))
    return final, ys


def _outputs(split: Split, length, env, x_vars, x_leaves, steps, before, after) -> list:
    """The ``ys`` leaves for all steps: carries where they are carries, else evaluated after
    the loop for all steps at once from the carries that entered each step."""
    carry_in, carry_out = split.carry_in, split.carry_out
    ys: list[Any] = [None] * len(split.ys_out)
    rest = []
    for i, v in enumerate(split.ys_out):
        if not isinstance(v, Literal) and v in carry_out:
            ys[i] = after[carry_out.index(v)]
        elif not isinstance(v, Literal) and v in carry_in:
            ys[i] = before[carry_in.index(v)]
        else:
            rest.append(i)
    if rest:
        wanted = [split.ys_out[i] for i in rest]
        known = {*env, *carry_in, *x_vars, *split.step_residuals}
        eqns = _needed(split.jaxpr.jaxpr.eqns, wanted, known)

        def post(carry, x, step_values):
            local = dict(env)
            local.update(zip(carry_in, carry))
            local.update(zip(x_vars, x))
            local.update(zip(split.step_residuals, step_values))
            run_equations(eqns, local)
            return [v.val if isinstance(v, Literal) else local[v] for v in wanted]

        values = jax.vmap(post, axis_size=length)(before, x_leaves, steps)
        for i, value in zip(rest, values):
            ys[i] = value
    return ys


def _needed(eqns, outvars, known) -> list:
    """The equations of ``eqns`` that ``outvars`` need, given the variables ``known``."""
    needed = {v for v in outvars if not isinstance(v, Literal) and v not in known}
    kept = []
    for eqn in reversed(eqns):
        if any(v in needed for v in eqn.outvars):
            kept.append(eqn)
            needed.update(v for v in eqn.invars if not isinstance(v, Literal) and v not in known)
    return kept[::-1]
