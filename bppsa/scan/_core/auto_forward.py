"""The forward pass's policy: ``lax.scan`` where Newton does not pay, a bounded Newton where it can.

``forward=None`` (the default of :func:`bppsa.scan`, :func:`bppsa.grad` and
:func:`bppsa.value_and_grad`) and ``forward="auto"`` (:class:`AutoForward`) choose the forward
of each scan once, in the scan's decision (:mod:`bppsa.scan._core.decision`), from the scan's
footprint, the backward method, Newton's solver and the profile, nothing else (no record of
earlier runs: the same scan gets the same forward in every trace), and
:func:`bppsa.trace_plans` records the choice and why (``forward``, ``forward_because``):

1. ``lax.scan`` where the backward is plain back-propagation (JAX differentiates that
   ``lax.scan``);
2. ``lax.scan`` on a profile with measured rules (CPUs: the Newton forward was measured 51-76x
   slower there, ``benchmarks/results/newton_cpu_timing.jsonl``);
3. elsewhere the best sequential forward is the fused kernel (``bppsa.Fused()``, where the
   profile prices its step, :func:`~bppsa.scan._core.cost.fused_rated`: a measured
   ``fused_step_latency``, else the kernel lab's static estimate of the program the scan's
   plan launches, the footprint's ``fused_forward_step``; and the kernel runs the cell:
   :meth:`~bppsa.Fused.why_not`), else
   ``lax.scan``; the cost model (:mod:`bppsa.scan._core.cost`, the profile's rates) bounds
   Newton's iterations (:func:`budget`): a run that does not converge within the bound
   finishes with ``lax.scan`` (certified: the step is not lost), and with the iterations it
   tried it costs at most ``1 + OVERRUN`` times the best sequential forward; a run that
   converges within it costs less than ``lax.scan`` (the bound is below the break-even count,
   :func:`break_even`). A bound under :data:`MIN_ITERATIONS` (the fewest iterations measured
   scans converge in): the best sequential forward. Where the fused kernel runs, no bound
   keeps Newton within 1.25x of it as long as its fallback is ``lax.scan``;
4. otherwise ``Newton(max_iterations=bound)``.

What adapts to a cell's convergence is the caller's: ``Newton(callback=...)`` reports every
run's :class:`bppsa.NewtonInfo`, and ``forward="sequential"`` or ``forward=bppsa.Newton(...)``
choose explicitly.
"""

from __future__ import annotations

import dataclasses
import math
from typing import ClassVar

from bppsa.scan._core import cost
from bppsa.scan._core.forward import Forward, SequentialForward
from bppsa.scan._core.fused import Fused
from bppsa.scan._core.memory import Footprint
from bppsa.scan._core.methods import Auto, Method
from bppsa.scan._core.newton import Newton
from bppsa.scan._core.profiles import profile_of
from bppsa.scan._profile import Profile

SEQUENTIAL = SequentialForward()
# The fewest iterations a Newton run is allowed: benchmarks/newton.py measured 2-5 for the
# paper's RNN at initialization and its GRU (float32, B = 16), so with a bound below 4 most
# scans would fall back after paying for the iterations.
MIN_ITERATIONS = 4
# What a run that does not converge may cost over lax.scan's forward (its iterations; the
# sequential continuation is lax.scan's own work): a jitted training step whose cell never
# converges runs at most 1.25x the sequential forward.
OVERRUN = 0.25


def _seconds(fp: Footprint, profile: Profile, solver: Method, shared: bool):
    """Predicted seconds of ``lax.scan``, of Newton's final evaluation, and of one iteration."""
    sequential = cost.sequential_forward(fp).seconds(profile)
    final = cost.newton_forward(fp, 0, solver, shared).seconds(profile)
    iteration = cost.newton_forward(fp, 1, solver, shared).seconds(profile) - final
    return sequential, final, iteration


def break_even(fp: Footprint, profile: Profile, solver: Method, *, shared: bool) -> int:
    """The most Newton iterations that, with the final evaluation, the cost model predicts
    faster than ``lax.scan`` for a scan of footprint ``fp`` on ``profile`` with ``solver``
    (``0``: none); ``shared``: the backward takes the final evaluation's Jacobians, so that
    evaluation is free (see :func:`bppsa.scan._core.cost.newton_forward`). An iteration costs
    at least one dependent step, so it is never free."""
    sequential, final, iteration = _seconds(fp, profile, solver, shared)
    return max(math.floor((sequential - final) / iteration), 0)


def budget(
    fp: Footprint, profile: Profile, solver: Method, *, shared: bool, best: float | None = None
) -> int:
    """The iteration bound of the forward's policy: the most iterations whose predicted cost,
    with the final evaluation and a ``lax.scan`` of all steps after them (a run that stops
    there and finishes sequentially), stays within ``1 + OVERRUN`` times the best sequential
    forward's (``best`` seconds, at most ``lax.scan``'s; ``None``: ``lax.scan``'s, then within
    ``OVERRUN`` times ``lax.scan``). Below :func:`break_even`, since ``OVERRUN < 1``."""
    sequential, final, iteration = _seconds(fp, profile, solver, shared)
    best = sequential if best is None else min(best, sequential)
    return max(math.floor(((1 + OVERRUN) * best - sequential - final) / iteration), 0)


@dataclasses.dataclass(frozen=True)
class AutoForward:
    """The forward's policy: the best sequential forward (the fused kernel where it runs,
    else ``lax.scan``), or the certified Newton forward bounded so that a run that never
    converges costs at most ``1 + OVERRUN`` (1.25) times the best sequential forward, where
    the cost model says it can pay (see :mod:`bppsa.scan._core.auto_forward`); the default
    forward of every scan. Stateless: the same scan gets the same forward in every trace.

    Example:
        >>> bppsa.AutoForward().choose(10_000, 20, "gpu", batch=16)
        Fused()
        >>> bppsa.AutoForward().choose(10_000, 20, "cpu", batch=16)
        'sequential'
    """

    name: ClassVar[str] = "auto"
    kernel: ClassVar[Fused] = Fused()  # the fused forward it considers

    def forward_for(
        self,
        fp: Footprint,
        method: Method,
        solver: Method | None,
        profile: Profile,
        fused: str | None = "no scan to check",
    ) -> tuple[Forward, str]:
        """The forward of a scan of footprint ``fp`` whose backward runs ``method``, with
        ``solver`` for Newton's recurrences (``None``: none fits the scan's memory limit), on
        ``profile``, and why (see the module docstring); ``fused``: why the fused kernel
        cannot run the scan (``None``: it can; :meth:`bppsa.Fused.why_not`); a step of it
        costs :func:`bppsa.scan._core.cost.fused_step` of ``fp.fused_forward_step``."""
        if not method.keeps_carries:
            why = "the backward is plain back-propagation, which differentiates lax.scan"
            return SEQUENTIAL, why
        if profile.measured_rules:
            return SEQUENTIAL, "measured: the Newton forward is slower than lax.scan on CPUs"
        best: Forward = SEQUENTIAL
        best_seconds, name = None, "lax.scan"
        fused_seconds = cost.fused_forward(fp, profile)
        if fused_seconds is None:
            fused = "the profile prices no step of a fused kernel"
        elif fused is None and fused_seconds < cost.sequential_forward(fp).seconds(profile):
            best, best_seconds, name = Fused(), fused_seconds, "the fused kernel"
        if fused is not None:
            name = f"lax.scan (fused kernel: {fused})"
        if solver is None:
            return best, f"{name}: no solver of the Newton iterations fits the memory limit"
        shared = method.supports.forward_jacobians
        bound = budget(fp, profile, solver, shared=shared, best=best_seconds)
        if bound < MIN_ITERATIONS:
            return best, (
                f"predicted: {name}; {MIN_ITERATIONS} Newton iterations and a lax.scan after "
                f"them cost more than {1 + OVERRUN:g}x it over {fp.length} steps"
            )
        why = (
            f"predicted: Newton pays up to {break_even(fp, profile, solver, shared=shared)} "
            f"iterations; "
            f"bounded at {bound}, so that a run that does not converge (then finished "
            f"sequentially, certified) costs at most {1 + OVERRUN:g}x {name}"
        )
        return Newton(max_iterations=bound, solver=solver), why

    def choose(
        self,
        length: int,
        size: int,
        backend: str | None = None,
        *,
        batch: int = 1,
        element: int | None = None,
        width: int | None = None,
    ) -> Forward:
        """The forward for ``length`` steps of a carry of ``size`` floats, ``batch`` examples
        (``element``, ``width``: the Jacobians' structure, as for :meth:`bppsa.Auto.choose`)
        with ``bppsa.Auto()``'s Jacobian backward, on ``backend``'s profile, for a cell the
        fused kernel runs (where the profile prices its step: a measured rate, else the
        slowest of the programs' static estimates, no plan saying which program)."""
        fp = cost.footprint_of(length, size, batch, element, width)
        profile = profile_of(backend)
        method = Auto().scan_method(fp, math.inf, profile=profile, jacobians=True)
        return self.forward_for(fp, method, method, profile, fused=None)[0]

    def predictions(
        self,
        length: int,
        size: int,
        backend: str | None = None,
        *,
        batch: int = 1,
        element: int | None = None,
        width: int | None = None,
        iterations: int | None = None,
    ) -> dict[Forward, float]:
        """Predicted seconds of ``lax.scan`` and of Newton with ``iterations`` iterations
        (default: the policy's bound, :func:`budget`) on ``backend``'s profile (Newton's net
        of the Jacobians it hands to a backward that takes them)."""
        fp = cost.footprint_of(length, size, batch, element, width)
        profile = profile_of(backend)
        method = Auto().scan_method(fp, math.inf, profile=profile, jacobians=True)
        shared = method.supports.forward_jacobians
        k = budget(fp, profile, method, shared=shared) if iterations is None else iterations
        return {
            SEQUENTIAL: cost.sequential_forward(fp).seconds(profile),
            Newton(): cost.newton_forward(fp, k, method, shared).seconds(profile),
        }

    def __repr__(self) -> str:
        return "'auto'"
