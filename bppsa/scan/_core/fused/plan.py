"""One plan builder for both fused loops: a split recurrence, checked and built once.

A :class:`Loop` is what one kernel launch runs: a split step's recurrence (or its tile of
independent lanes), the backend, the profile's program whose envelope holds it (and whose
``step_latency`` the cost model prices its steps at) and the launch. :func:`plan_loop` makes
it from a split for the profile's backend: lanes first (:mod:`~bppsa.scan._core.fused.lanes`),
then the backend's checks (:meth:`~bppsa.scan._core.fused.backend.Backend.unsupported_loop`)
and the program whose envelope holds it (:func:`~bppsa.scan._core.fused.backend.program_of`),
then the interpreted kernel is
built once, abstractly, so that what the run builds has been built: a plan that is not a
reason runs. The forward (:mod:`~bppsa.scan._core.fused.forward`) and the
backward (:mod:`~bppsa.scan._core.fused.backward`) call it from their ``prepare``, which the
scan's decision calls once; the plan then travels in the decision.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING

from bppsa.scan._core.fused import dispatch
from bppsa.scan._core.fused.backend import (
    AUTO,
    CANNOT,
    Backend,
    Footprint,
    Interpreted,
    Launch,
    lanes_of,
    launch_of,
    program_of,
)
from bppsa.scan._core.fused.lanes import Tiled, split_lanes

if TYPE_CHECKING:
    from bppsa.scan._core.fused.split import Split
    from bppsa.scan._profile import FusedProgram, Kernels, Profile


@dataclasses.dataclass(frozen=True, eq=False)
class Loop:
    """One kernel launch's plan.

    Attributes:
        split: the step's split (its recurrence runs in the loop).
        tiled: the recurrence for one tile of the carry's independent lanes (a program per
            tile), or ``None``: one program per example.
        backend: the kernel backend (compiled; its interpreter runs it on the CPU).
        launch: warps, stages and lanes.
        program: the program of the profile's ``fused_programs`` whose envelope holds the
            loop (:func:`~bppsa.scan._core.fused.backend.program_of`).
    """

    split: Split
    tiled: Tiled | None
    backend: Backend
    launch: Launch
    program: FusedProgram

    @property
    def step_latency(self) -> float | None:
        """The kernel lab's static estimate of one step of this loop, its program's
        (:attr:`bppsa.FusedProgram.step_latency`; ``None``: none)."""
        return self.program.step_latency

    def on(self, runner: Backend) -> Loop:
        """This loop run by ``runner`` (the backend itself, or its interpreter)."""
        return dataclasses.replace(self, backend=runner)

    @property
    def interpreted(self) -> Loop:
        """This loop run by its backend's interpreter on the CPU (by the backend itself where
        this JAX has no interpreter for it: built, never run, there)."""
        if self.backend.interpret or not self.backend.interpretable():
            return self
        return self.on(Interpreted(self.backend))

    @property
    def footprint(self) -> Footprint:
        """What one program holds (:meth:`Backend.footprint`)."""
        return self.backend.footprint(self.split if self.tiled is None else self.tiled)


def _contracts(loop: Split | Tiled) -> bool:
    """Whether ``loop``'s recurrence contracts arrays (a product with a weight)."""
    return any(eqn.primitive.name == "dot_general" for eqn in loop.recurrence)


def no_backend(profile: Profile | None) -> str | None:
    """Why ``profile``'s platform has no fused kernel (its ``fused_backend`` is ``None``), naming
    it; ``None``: it has one (or no profile was given: the defaults')."""
    if profile is None or profile.kernels.fused_backend is not None:
        return None
    return f"no fused kernel backend on {profile.name} (its profile's fused_backend is None)"


def backends_of(kernels: Kernels) -> list[tuple[str | None, Backend | str]]:
    """The profile's fused backends in order of preference (``kernels.fused_backend``: a name
    or a tuple of them), each ``(name, the backend or why it cannot run anything here)``."""
    names = kernels.fused_backend
    found: list[tuple[str | None, Backend | str]] = []
    for name in names if isinstance(names, tuple) else (names,):
        backend = dispatch.backend_named(name)
        found.append((name, backend if isinstance(backend, str) else backend.missing() or backend))
    return found


def with_backend(kernels: Kernels, backend: str) -> Kernels:
    """``kernels`` with the fused backend ``backend`` alone where it is not ``"auto"``."""
    return kernels if backend == AUTO else dataclasses.replace(kernels, fused_backend=backend)


def plan_loop(
    split: Split,
    kernels: Kernels,
    num_warps: int | str,
    lanes: int | str | None,
    build: Callable[[Loop], object],
    backward: bool = False,
) -> Loop | str:
    """The loop of ``split`` on the first backend of ``kernels`` that runs it (its envelope and
    launch, with ``num_warps`` and ``lanes`` where not ``"auto"``; ``backward``: a backward's
    loop), or why none can (each backend's reason, named where there are several);
    ``build(loop)`` builds its interpreted kernel abstractly (``jax.eval_shape``)."""
    reasons = []
    for name, backend in backends_of(kernels):
        if isinstance(backend, str):
            loop: Loop | str = backend
        else:
            loop = _planned(backend, split, kernels, num_warps, lanes, build, backward)
        if not isinstance(loop, str):
            return loop
        reasons.append((name, loop))
    if len(reasons) == 1:  # the one backend's reason alone
        return reasons[0][1]
    return "; ".join(f"{name}: {reason}" for name, reason in reasons)


def _planned(
    backend: Backend,
    split: Split,
    kernels: Kernels,
    num_warps: int | str,
    lanes: int | str | None,
    build: Callable[[Loop], object],
    backward: bool,
) -> Loop | str:
    """:func:`plan_loop` on one ``backend``."""
    tiled = split_lanes(split, lanes_of(kernels, lanes)) if backend.tiles else None
    target = split if tiled is None else tiled
    reason = backend.unsupported_loop(target)
    if reason is not None:
        return reason
    program = program_of(backend.footprint(target), backend.programs(kernels), num_warps)
    if isinstance(program, str):  # beyond the envelope
        return program
    launch = launch_of(kernels, program, num_warps, lanes, backward)
    if tiled is not None or not _contracts(target):
        # a step of lanes apart (a tile's, an elementwise cell's): the compiler unrolls its
        # small loop itself, faster in the kernel lab than with the loop unrolled here or its
        # residuals padded a step
        launch = dataclasses.replace(launch, unroll=1, padded_ahead=False)
    loop = Loop(split, tiled, backend, launch, program)
    try:
        build(loop.interpreted)
    except CANNOT as err:
        return f"the kernel could not be built: {type(err).__name__}: {err}"
    return loop
