"""``bppsa.Fused()``: the forward loop of a scan in one GPU kernel (Pallas), any cell.

The step is split (:mod:`~bppsa.scan._core.fused.split`): what does not depend on the carry runs
before the loop for all steps at once, outputs ``ys`` that are not carries run after it for all
steps at once, and only the carry's dependence cone runs in the kernel
(:mod:`~bppsa.scan._core.fused.kernel`), on arrays padded as the profile's backend pads them
(:mod:`~bppsa.scan._core.fused.backend`; Triton: powers of two with masks). The platform is
chosen when the program is lowered (:mod:`~bppsa.scan._core.fused.dispatch`): on the backend's
platform its kernel, on the CPU the same kernel in Pallas' interpreter, elsewhere
``lax.scan``. A scan the kernel cannot run (:meth:`Fused.why_not`) runs
``lax.scan``, the same values: never an error, but asked for explicitly (``forward="fused"``,
``forward=Fused(...)``) a :class:`bppsa.FallbackWarning` with the reason, once per trace.

The backend, its launch and the envelope (the largest arrays the kernel takes) are data of the
profile (:class:`~bppsa.scan._profile.Kernels`' ``fused_backend``, ``fused_programs``,
``fused_lanes``, ``fused_max_tile``, ...): the scan's decision calls :meth:`Fused.prepare` once
with its profile and hands the plan to :meth:`Fused.__call__`; nothing is looked up again.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, ClassVar

import jax
import jax.numpy as jnp
from jax.extend.core import Literal

from bppsa.scan._core.forward import Forward, run_sequentially
from bppsa.scan._core.fused import dispatch
from bppsa.scan._core.fused.backend import AUTO, CANNOT, check_options, launch_fields
from bppsa.scan._core.fused.kernel import carries_after
from bppsa.scan._core.fused.plan import Loop, no_backend, plan_loop, with_backend
from bppsa.scan._core.fused.split import residuals, shapes_of, split_scan_step
from bppsa.scan._core.jaxprs.walk import run_equations
from bppsa.scan._profile import Kernels

if TYPE_CHECKING:
    from bppsa.scan._core.fused.split import Split
    from bppsa.scan._core.problem import Problem
    from bppsa.scan._profile import Profile

KERNEL_NAME = "bppsa_fused_forward"


@dataclasses.dataclass(frozen=True, eq=False)
class FusedPlan:
    """What :meth:`Fused.prepare` makes of a scan: its loop and the tree of its outputs."""

    loop: Loop
    ys_tree: Any

    @property
    def split(self) -> Split:
        return self.loop.split

    @property
    def tiled(self):
        return self.loop.tiled

    @property
    def step_latency(self) -> float | None:
        """The kernel lab's static estimate of a step of the loop (its program's)."""
        return self.loop.step_latency


@dataclasses.dataclass(frozen=True)
class Fused(Forward):
    """The forward loop in one Pallas kernel launch, the carry on chip.

    Where the kernel cannot run the scan (:meth:`why_not`: float64 or complex values, a
    primitive without a rule, arrays beyond the profile's envelope, a platform whose profile
    has no fused backend, the backend absent from JAX), the scan runs ``lax.scan``, with the
    same values, and warns once per trace with the reason (:class:`bppsa.FallbackWarning`;
    ``warnings.simplefilter("error", bppsa.FallbackWarning)`` makes it an error).
    ``bppsa.AutoForward()``'s own choice of the kernel does not warn: it records the reason in
    :func:`bppsa.trace_plans`' ``forward_because``.

    Attributes:
        num_warps: warps per program (``"auto"``: those of the first of the profile's
            ``fused_programs`` that holds the loop, the fewest).
        lanes: lanes of the carry per program where they are independent (a diagonal or
            block-diagonal cell, found in its jaxpr: :mod:`~bppsa.scan._core.fused.lanes`);
            ``None``: one program per example (under ``jax.vmap``) always; ``"auto"``: the
            profile's ``fused_lanes``.
        backend: the kernel backend (``"auto"``: the profile's ``fused_backend``, the first
            of them that runs the loop; ``"triton"``, ``"mosaic_gpu"``: that one alone, its
            refusal in :meth:`why_not`).

    Example:
        >>> from bppsa.models import RNN, rnn_cell
        >>> params = RNN().init(3, 20, key=jax.random.key(0))
        >>> body = lambda h, x: (rnn_cell(params, h, x), h)
        >>> h, ys = bppsa.scan(body, jnp.zeros(20), jnp.ones((50, 3)), forward="fused")
        >>> ys.shape
        (50, 20)
    """

    num_warps: int | str = AUTO
    lanes: int | str | None = AUTO
    backend: str = AUTO
    name: ClassVar[str] = "fused"

    def __post_init__(self):
        check_options("Fused", self.num_warps, self.lanes)
        dispatch.check_backend("Fused", self.backend)

    def prepare(self, problem: Problem, profile: Profile | None = None) -> FusedPlan | str:
        """The plan of ``problem``'s fused loop on ``profile``'s backend and within its envelope
        (``None``: the defaults, ``Kernels()``'s), or why the kernel cannot run it; the scan's
        decision makes it once and hands it to :meth:`__call__`."""
        kernels = with_backend(Kernels() if profile is None else profile.kernels, self.backend)
        if (reason := no_backend(profile)) is not None:
            return reason
        if problem.length < 1:
            return "an empty scan (length 0)"
        try:
            split, ys_tree = split_scan_step(problem)
        except CANNOT as err:
            return f"the step could not be split: {type(err).__name__}: {err}"

        def build(loop):
            init = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), problem.init)
            plan = FusedPlan(loop, ys_tree)
            jax.eval_shape(
                lambda c, i, x: _run(plan, problem.length, c, i, x, True),
                shapes_of(problem.body.consts),
                init,
                problem.xs,
            )

        loop = plan_loop(split, kernels, self.num_warps, self.lanes, build)
        return loop if isinstance(loop, str) else FusedPlan(loop, ys_tree)

    def why_not(self, problem: Problem, profile: Profile | None = None) -> str | None:
        """Why the kernel cannot run ``problem``'s scan (``None``: it can) on ``profile``'s
        backend and within its envelope (``None``: the defaults, ``Kernels()``'s)."""
        plan = self.prepare(problem, profile)
        return plan if isinstance(plan, str) else None

    def __call__(self, problem, consts, init, xs, *, keep, prepared=None):
        plan = self.prepare(problem) if prepared is None else prepared
        if isinstance(plan, str):
            return run_sequentially(problem.body.step, consts, init, xs, problem.length, keep)

        def kernel(runner):
            return lambda c, i, x: _run(plan, problem.length, c, i, x, keep, runner)

        def sequential(c, i, x):
            return run_sequentially(problem.body.step, c, i, x, problem.length, keep)

        return dispatch.dispatch(plan.loop.backend, kernel, sequential, list(consts), init, xs)

    def __repr__(self) -> str:
        return f"Fused({', '.join(launch_fields(self.num_warps, self.lanes, self.backend))})"


def _run(plan: FusedPlan, length, consts, init, xs, keep, runner=None):
    """The fused forward, as :class:`Forward` returns it (``runner``: the backend or its
    interpreter; ``None``: the interpreter)."""
    loop = plan.loop.interpreted if runner is None else plan.loop.on(runner)
    split = loop.split
    carry_tree: Any  # jaxlib's PyTreeDef, unresolved to type checkers
    carry_leaves, carry_tree = jax.tree.flatten(init)
    x_leaves = jax.tree.leaves(xs)
    env, x_vars, constant_values, steps = residuals(split, consts, x_leaves, length)
    after = carries_after(
        split,
        length,
        carry_leaves,
        constant_values,
        steps,
        backend=loop.backend,
        launch=loop.launch,
        name=KERNEL_NAME,
        tiled=loop.tiled,
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
