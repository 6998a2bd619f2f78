"""``forward="auto"``: the sequential forward where it is measured faster, Newton where the cost
model predicts otherwise."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from bppsa.scan._core import cost
from bppsa.scan._core.forward import Forward, SequentialForward
from bppsa.scan._core.newton import Newton
from bppsa.scan._profile import get_profile


@dataclasses.dataclass(frozen=True)
class AutoForward(Forward):
    """Chooses the forward pass of each scan: ``lax.scan`` on CPUs (the Newton forward was
    measured far slower there); on accelerators ``bppsa.Newton()`` where
    :mod:`bppsa.scan._core.cost` predicts the profile's ``rules.newton_iterations`` iterations
    faster than the ``T`` dependent steps of ``lax.scan`` (long sequences of small cells), else
    ``lax.scan``. Whatever it picks, the result is certified (see
    :class:`bppsa.Newton`).

    Example:
        >>> bppsa.AutoForward().choose(10_000, 20, "gpu", batch=16)
        Newton(max_iterations=None, tol=None, quasi=False, solver=None)
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
        (``element``, ``width``: the Jacobians' structure, as for :meth:`bppsa.Auto.choose`)."""
        if get_profile(backend).measured_rules:
            return SequentialForward()
        times = self.predictions(length, size, backend, batch=batch, element=element, width=width)
        return min(times, key=times.get)

    def predictions(
        self,
        length: int,
        size: int,
        backend: str | None = None,
        *,
        batch: int = 1,
        element: int | None = None,
        width: int | None = None,
    ) -> dict[Forward, float]:
        """Predicted seconds of each forward on ``backend``'s :func:`bppsa.get_profile`."""
        fp = cost.footprint_of(length, size, batch, element, width)
        profile = get_profile(backend)
        newton = Newton()
        solver = newton.solver_for(fp, backend)
        return {
            SequentialForward(): cost.sequential_forward(fp).seconds(profile),
            newton: cost.newton_forward(fp, profile.rules.newton_iterations, solver).seconds(
                profile
            ),
        }

    def __call__(self, problem, consts, init, xs, *, keep):
        fp = problem.footprint
        chosen = self.choose(
            fp.length, fp.size, batch=fp.batch, element=fp.element, width=fp.width or None
        )
        return chosen(problem, consts, init, xs, keep=keep)

    def __repr__(self) -> str:
        return "'auto'"
