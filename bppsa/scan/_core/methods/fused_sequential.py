"""``FusedSequential()``: back-propagation's reverse loop in one kernel, no Jacobians formed."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, ClassVar

import jax
import jax.numpy as jnp

from bppsa.scan import _algorithms
from bppsa.scan._core import backward, cost, debug
from bppsa.scan._core.cost import Cost
from bppsa.scan._core.fused import backward as fused_backward
from bppsa.scan._core.fused.backend import AUTO, check_options, launch_fields
from bppsa.scan._core.fused.dispatch import check_backend
from bppsa.scan._core.fused.plan import no_backend, with_backend
from bppsa.scan._core.memory import SPAN_STATES
from bppsa.scan._core.methods.base import Method, Supports, because, require
from bppsa.scan._core.methods.sequential_scan import SequentialScan
from bppsa.scan._profile import Kernels

if TYPE_CHECKING:
    from bppsa.scan._core.problem import Problem
    from bppsa.scan._profile import Profile

SEQUENTIAL_SCAN = SequentialScan()


@dataclasses.dataclass(frozen=True)
class FusedCost(Cost):
    """A :class:`Cost` of which ``fused`` dependent steps run inside one kernel, each at the
    fused step latency where the profile prices one (:func:`~bppsa.scan._core.cost.fused_step`:
    its measured ``fused_step_latency``, else ``fused_step``, the kernel lab's static estimate
    of the loop's program), else as the other ``steps`` (which count them too, so that a sum
    of costs, which keeps only the fields of :class:`Cost`, errs on the slow side)."""

    fused: float = 0.0
    fused_step: float | None = None

    def seconds(self, profile: Profile) -> float:
        seconds = super().seconds(profile)
        latency = cost.fused_step(profile, self.fused_step)
        if latency is None:
            return seconds
        return seconds + self.fused * (latency - profile.rates.step_latency)

    def times(self, blocks: float) -> FusedCost:
        scaled = super().times(blocks)
        return FusedCost(
            scaled.steps,
            scaled.flops,
            scaled.bytes,
            fused=self.fused * blocks,
            fused_step=self.fused_step,
        )


@dataclasses.dataclass(frozen=True)
class FusedSequential(Method):
    """Back-propagation's reverse loop over the cell's VJP in one Pallas kernel launch.

    The cotangent of the carry stays on chip for all ``T`` steps: each step applies the VJP of
    the step's carry cone at the carry the forward kept (its linear part only: the factors it
    multiplies by, such as ``1 - tanh^2``, are evaluated for all steps at once before the loop),
    and adds what the step's output sends. No Jacobian is formed. The cotangents of the
    constants and ``xs`` then come from one VJP of all steps at once, given every carry
    cotangent (as for the parallel methods). Algorithm: :mod:`bppsa.scan._core.fused.backward`.

    On the CPU the kernel runs in Pallas' interpreter (exact, slow: for tests); on NVIDIA GPUs
    it is a Triton kernel; elsewhere, and where the kernel cannot run the step's VJP
    (:meth:`why_not`: a primitive without a padded rule, a float64 carry, the envelope), the
    same reverse loop runs in ``lax.scan``. A step whose VJP cannot be traced at all falls back
    to :class:`SequentialScan`'s backward. Never an error: asked for explicitly (alone or in
    :class:`~bppsa.Blocked`), a fallback warns once per trace with the reason
    (:class:`bppsa.FallbackWarning`, which ``warnings.simplefilter("error", ...)`` makes an
    error); ``bppsa.Auto()`` never picks it where the kernel cannot run the step.

    Forward mode (``jax.jvp``) solves the tangent recurrence sequentially over the Jacobians
    formed for it, and a derivative of the backward itself (a Hessian) differentiates the same
    loop in ``lax.scan``: no kernel in either.

    Attributes:
        num_warps: warps per program (``"auto"``: those of the first of the profile's
            ``fused_programs`` that holds the loop, the fewest).
        lanes: lanes of the carry per program where they are independent (diagonal and
            block-diagonal cells, as for :class:`bppsa.Fused`); ``None``: one program per
            example (under ``jax.vmap``) always; ``"auto"``: the profile's ``fused_lanes``.
        backend: the kernel backend (as for :class:`bppsa.Fused`).

    Example:
        >>> from bppsa.models import RNN, rnn_cell
        >>> params = RNN().init(3, 20, key=jax.random.key(0))
        >>> def loss(p, xs):
        ...     return bppsa.scan(lambda h, x: (rnn_cell(p, h, x), h), jnp.zeros(20), xs)[0].sum()
        >>> grads = bppsa.grad(loss, method=bppsa.FusedSequential())(params, jnp.ones((50, 3)))
    """

    num_warps: int | str = AUTO
    lanes: int | str | None = AUTO
    backend: str = AUTO
    name: ClassVar[str] = "fused-sequential"
    # It needs the carries the forward kept, as the Jacobian methods do, but forms no
    # Jacobians, and so takes none from the forward.
    forms_jacobians: ClassVar[bool] = False
    kernel_loop: ClassVar[bool] = True
    supports: ClassVar[Supports] = Supports(forward_jacobians=False)

    def __post_init__(self):
        check_options("FusedSequential", self.num_warps, self.lanes)
        check_backend("FusedSequential", self.backend)

    def prepare(self, problem: Problem, profile: Profile | None = None):
        """The plan of ``problem``'s backward (its step and reverse steps split, their loops
        on ``profile``'s backend within its envelope; ``None``: the defaults, ``Kernels()``'s),
        or why the step's VJP cannot be traced (the backward is then
        :class:`SequentialScan`'s). The scan's decision makes it once and hands it to
        :meth:`backward`."""
        kernels = with_backend(Kernels() if profile is None else profile.kernels, self.backend)
        return no_backend(profile) or fused_backward.plan(
            problem, kernels, self.num_warps, self.lanes
        )

    def why_not(self, problem: Problem, profile: Profile | None = None) -> str | None:
        """Why the kernel cannot run ``problem``'s backward loop (``None``: it can) on
        ``profile``'s backend and within its envelope (``None``: the defaults,
        ``Kernels()``'s); the loop then runs in ``lax.scan`` (or, if the step's VJP cannot be
        traced, the backward is :class:`SequentialScan`'s). The scan's decision records it
        (``bppsa.trace_plans()``'s ``backward_because``)."""
        return because(self.prepare(problem, profile))

    def scan(self, g_last, maps, offsets):
        # Called only for forward mode's tangent recurrence, over the Jacobians formed for it.
        return _algorithms.sequential(g_last, maps, offsets)

    def backward(
        self,
        problem,
        consts,
        carries_before,
        xs,
        g_last,
        ct_ys,
        *,
        check,
        jacobians=None,
        prepared=None,
    ):
        if jacobians is not None:
            require(self, "forward_jacobians")
        made = self.prepare(problem) if prepared is None else prepared
        if isinstance(made, str):
            return SEQUENTIAL_SCAN.backward(
                problem, consts, carries_before, xs, g_last, ct_ys, check=check
            )
        layout = problem.layout
        _, offsets, vjp, ct_ys = backward.linearize_steps(
            problem.all_steps(jacobians=False), layout, consts, carries_before, xs, ct_ys
        )

        def one_example(before, xs, g_last, offsets):
            return fused_backward.carry_cotangents(
                made, problem.example_layout, consts, before, xs, g_last, offsets
            )

        if problem.batched:  # (T, B, ...): the kernel's programs over the examples
            one_example = jax.vmap(one_example, in_axes=(1, 1, 0, 1), out_axes=1)
        g = one_example(carries_before, xs, g_last, offsets)  # [g_0, ..., g_{T-1}]
        g = jnp.concatenate([g, g_last[None].astype(g.dtype)])
        ct_consts, ct_xs = vjp((layout.unpack(g[1:], carries_before, stacked=True), ct_ys))
        flags = debug.step_flags(None, g, offsets) if check else None
        return g[0], ct_consts, ct_xs, flags

    def memory(self, fp):
        # The carries the forward keeps (as back-propagation), and per step: the cotangents,
        # the factors hoisted out of the loop (a few carries' worth), the inputs, and the
        # arrays of the one VJP of all steps.
        per_step = (SPAN_STATES + 3) * fp.state + fp.inputs
        return fp.bytes(fp.residual_floats() + fp.length * per_step)

    def cost(self, fp):
        # The loop: T dependent steps of a matrix-vector product, in one kernel; the factors
        # and the VJP of all steps: two evaluations of all steps at once.
        loop = cost.Cost(
            steps=fp.length,
            flops=2 * fp.length * fp.batch * fp.dense,
            bytes=fp.itemsize * fp.length * fp.batch * 4 * fp.state,
        )
        steps = cost.Cost(
            steps=2,
            flops=4 * fp.length * fp.batch * fp.dense,
            bytes=3 * fp.itemsize * fp.length * fp.batch * 4 * fp.state,
        )
        total = cost.plus(loop, steps)
        return FusedCost(
            total.steps,
            total.flops,
            total.bytes,
            fused=fp.length,
            fused_step=fp.fused_backward_step,
        )

    def __repr__(self) -> str:
        fields = launch_fields(self.num_warps, self.lanes, self.backend)
        return f"FusedSequential({', '.join(fields)})"
