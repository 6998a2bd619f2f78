"""The forward pass's policy: ``lax.scan`` where Newton does not pay, a bounded Newton where it can.

``forward=None`` (the default of :func:`bppsa.scan`, :func:`bppsa.grad` and
:func:`bppsa.value_and_grad`) and ``forward="auto"`` (:class:`AutoForward`) choose the forward
of each scan when it is traced (:func:`choose_forward`), and :func:`bppsa.trace_plans` records
the choice and why (``forward``, ``forward_because``):

1. ``lax.scan`` where the backward is plain back-propagation (JAX differentiates that
   ``lax.scan``) or where the method brings its own forward (``Sharded(forward="pipelined")``);
2. ``lax.scan`` on a profile with measured rules (CPUs: the Newton forward was measured 51-76x
   slower there, ``benchmarks/results/newton_cpu_timing.jsonl``);
3. elsewhere the cost model (:mod:`bppsa.scan._core.cost`, the policy's profile) gives the
   break-even count ``K``: the most Newton iterations (each one evaluation of all steps with
   their Jacobians, the residual check and the solver's scan) that, with the final evaluation
   (free where the backward takes its Jacobians: ``Newton(share_jacobians=True)``), still cost
   less than ``lax.scan``'s ``T`` dependent steps. ``K < 4`` (the fewest
   iterations measured scans converge in, :data:`MIN_ITERATIONS`): ``lax.scan``;
4. every certified Newton run that this policy starts reports its iterations and whether it
   converged to a record kept per scan (its call site and shapes, :data:`RECORDS`). Where the
   record says the scan needs ``K`` iterations or more on average, or its last run fell back,
   ``lax.scan``;
5. otherwise ``Newton(max_iterations=K)``. No iteration count is guessed: the bound is the
   break-even, so a scan that stops converging costs at most about ``lax.scan``'s time plus
   ``K`` iterations, finishes sequentially (certified, the step is not lost) and is recorded,
   so that its next trace runs ``lax.scan``.

A choice is made when a scan is traced: a function already compiled by ``jax.jit`` keeps it;
new records reach the next trace (:func:`forget` clears them).
"""

from __future__ import annotations

import dataclasses
import math
import threading
from collections.abc import Callable
from typing import Any, ClassVar

import numpy as np

from bppsa.scan._core import cost
from bppsa.scan._core.forward import Forward, SequentialForward
from bppsa.scan._core.memory import Footprint, MemoryLimitError
from bppsa.scan._core.methods import Auto, Method, Policy
from bppsa.scan._core.newton import Newton

SEQUENTIAL = SequentialForward()
# The fewest iterations a Newton run is allowed: benchmarks/newton.py measured 2-5 for the
# paper's RNN at initialization and its GRU (float32, B = 16), so with a bound below 4 most
# scans would fall back after paying for the iterations.
MIN_ITERATIONS = 4


@dataclasses.dataclass
class Record:
    """What a scan's certified Newton runs did (updated by each run's callback).

    Attributes:
        runs: runs reported (one per example under ``jax.vmap``).
        iterations: their mean iteration count.
        last_converged: whether the last run converged (else it finished sequentially).
    """

    runs: int = 0
    iterations: float = 0.0
    last_converged: bool = True

    def add(self, iterations: float, converged: bool) -> None:
        self.runs += 1
        self.iterations += (iterations - self.iterations) / self.runs
        self.last_converged = converged


RECORDS: dict[Any, Record] = {}  # per scan: its call site and shapes (scan_key)
_LOCK = threading.Lock()


def forget() -> None:
    """Clears every scan's record of its Newton runs."""
    with _LOCK:
        RECORDS.clear()


def recorder(key) -> Callable:
    """The callback of a Newton run that adds its iterations to ``key``'s record."""

    def callback(info) -> None:
        iterations = np.ravel(np.asarray(info.iterations))
        converged = np.ravel(np.asarray(info.converged))
        with _LOCK:
            record = RECORDS.setdefault(key, Record())
            for its, ok in zip(iterations, converged, strict=True):
                record.add(float(its), bool(ok))

    return callback


def scan_key(f, fp: Footprint, dtype) -> tuple:
    """A scan's identity for :data:`RECORDS`: the body's code (its call site) and the shapes."""
    fn = getattr(f, "func", f)  # a functools.partial's function
    code = getattr(fn, "__code__", None)
    site = (
        (code.co_filename, code.co_firstlineno, code.co_name)
        if code is not None
        else type(fn).__qualname__
    )
    return (site, fp.length, fp.size, fp.batch, fp.element, fp.width, str(dtype))


def break_even(
    fp: Footprint,
    policy: Policy | None = None,
    backend: str | None = None,
    solver=None,
    shared: bool = False,
) -> int:
    """The most Newton iterations that, with the final evaluation, the cost model predicts
    faster than ``lax.scan`` for a scan of footprint ``fp`` (``0``: none), on ``policy``'s
    profile with ``solver`` (default: the policy's pick; the policy default ``Auto()``);
    ``shared``: the backward takes the final evaluation's Jacobians (see
    :func:`bppsa.scan._core.cost.newton_forward`)."""
    policy = policy or Auto()
    profile = policy.profile_for(backend)
    solver = solver or Newton().solver_for(fp, backend, policy)
    sequential = cost.sequential_forward(fp).seconds(profile)
    final = cost.newton_forward(fp, 0, solver, shared).seconds(profile)
    iteration = cost.newton_forward(fp, 1, solver, shared).seconds(profile) - final
    if iteration <= 0:
        return 0
    return max(math.floor((sequential - final) / iteration), 0)


def choose_forward(
    policy: Policy,
    fp: Footprint,
    method: Method,
    backend: str | None = None,
    key=None,
    limit: float | None = math.inf,
) -> tuple[Forward, str]:
    """The forward of a scan of footprint ``fp`` whose backward runs ``method``, and why (see
    the module docstring; ``key``: the scan's record, :func:`scan_key`; ``limit``: the scan's
    memory limit, which Newton's solver must fit too)."""
    if not method.uses_jacobians:
        return SEQUENTIAL, "the backward is plain back-propagation, which differentiates lax.scan"
    if method.forward_for(SEQUENTIAL) != SEQUENTIAL:
        return SEQUENTIAL, f"{method!r} runs its own forward"
    if policy.profile_for(backend).measured_rules:
        return SEQUENTIAL, "measured: the Newton forward is slower than lax.scan on CPUs"
    try:
        solver = Newton().solver_for(fp, backend, policy, limit)
    except MemoryLimitError:
        return SEQUENTIAL, "no solver of the Newton iterations fits the memory limit"
    bound = break_even(fp, policy, backend, solver, method.supports.forward_jacobians)
    if bound < MIN_ITERATIONS:
        return SEQUENTIAL, (
            f"predicted: lax.scan's {fp.length} steps cost less than {MIN_ITERATIONS} Newton "
            "iterations"
        )
    record = RECORDS.get(key) if key is not None else None
    if record is not None and record.runs:
        measured = f"{record.iterations:.1f} iterations on average over {record.runs} runs"
        if record.iterations >= bound:
            return SEQUENTIAL, f"measured: {measured}, break-even {bound}"
        if not record.last_converged:
            return SEQUENTIAL, f"measured: its last Newton run did not converge ({measured})"
        why = f"measured: {measured}, below the break-even {bound}"
    else:
        why = f"predicted: Newton pays up to {bound} iterations (bounded there, certified)"
    callback = recorder(key) if key is not None else None
    return Newton(max_iterations=bound, callback=callback, solver=solver), why


@dataclasses.dataclass(frozen=True)
class AutoForward(Forward):
    """Chooses the forward pass of each scan: ``lax.scan``, or the certified Newton forward
    bounded at the break-even iteration count where the cost model says it can pay (see
    :mod:`bppsa.scan._core.auto_forward`); the default forward of every scan.

    Example:
        >>> bppsa.AutoForward().choose(10_000, 20, "gpu", batch=16)
        Newton(max_iterations=64, tol=None, quasi=False, solver=Blelloch(), share_jacobians=True)
        >>> bppsa.AutoForward().choose(10_000, 20, "cpu", batch=16)
        'sequential'
    """

    name: ClassVar[str] = "auto"

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
        (``element``, ``width``: the Jacobians' structure, as for :meth:`bppsa.Auto.choose`),
        before any record of its runs, with a Jacobian backward."""
        fp = cost.footprint_of(length, size, batch, element, width)
        options = dict(batch=batch, element=element, width=width, jacobians=True)
        method = Auto().choose(length, size, backend, **options)
        return choose_forward(Auto(), fp, method, backend)[0]

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
        (default: the break-even count) on ``backend``'s profile (Newton's net of the
        Jacobians it hands to a backward that takes them)."""
        fp = cost.footprint_of(length, size, batch, element, width)
        profile = Auto().profile_for(backend)
        newton = Newton()
        solver = newton.solver_for(fp, backend, Auto())
        backward = Auto().scan_method(fp, backend=backend, jacobians=True)
        shared = backward.supports.forward_jacobians
        k = break_even(fp, Auto(), backend, solver, shared) if iterations is None else iterations
        return {
            SEQUENTIAL: cost.sequential_forward(fp).seconds(profile),
            newton: cost.newton_forward(fp, k, solver, shared).seconds(profile),
        }

    def __call__(self, problem, consts, init, xs, *, keep):
        fp = problem.footprint
        method = Auto().scan_method(fp, jacobians=True)
        chosen, _ = choose_forward(Auto(), fp, method)
        return chosen(problem, consts, init, xs, keep=keep)

    def __repr__(self) -> str:
        return "'auto'"
