"""``forward="auto"``: the sequential forward where it is measured faster, Newton where the cost
model predicts otherwise."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import jax

from bppsa.scan._core import cost
from bppsa.scan._core.forward import Forward, SequentialForward
from bppsa.scan._core.newton import Newton

# Newton iterations the cost model assumes: about the mean measured by benchmarks/newton.py
# for the paper's RNN after a short training (float32: 9.4 at T = 1k, 13.2 at 10k, 20.6 at 30k;
# its initial weights and the GRU need 2-4; an expansive cell falls back). On this project's
# 2-core CPUs the Newton forward was 51-76x slower than lax.scan (T = 1k-10k, B = 16, three
# runs): CPU never picks it.
EXPECTED_ITERATIONS = 15


@dataclasses.dataclass(frozen=True)
class AutoForward(Forward):
    """Chooses the forward pass of each scan: ``lax.scan`` on CPUs; on accelerators
    ``bppsa.Newton()`` where :mod:`bppsa.scan._core.cost` predicts ``EXPECTED_ITERATIONS`` (15)
    Newton
    iterations faster than the ``T`` dependent steps of ``lax.scan`` (long sequences of small
    cells), else ``lax.scan``. Whatever it picks, the result is certified (see
    :class:`bppsa.Newton`).

    Example:
        >>> bppsa.AutoForward().choose(10_000, 20, "gpu", batch=16)
        Newton(max_iterations=None, tol=None, quasi=False)
        >>> bppsa.AutoForward().choose(10_000, 20, "cpu", batch=16)
        'sequential'
    """

    name: ClassVar[str] = "auto"

    def choose(
        self, length: int, size: int, backend: str | None = None, *, batch: int = 1
    ) -> Forward:
        """The forward for ``length`` steps of a carry of ``size`` floats, ``batch`` examples."""
        backend = backend or jax.default_backend()
        if backend == "cpu":
            return SequentialForward()
        times = self.predictions(length, size, backend, batch=batch)
        return min(times, key=times.get)

    def predictions(
        self, length: int, size: int, backend: str | None = None, *, batch: int = 1
    ) -> dict[Forward, float]:
        """Predicted seconds of each forward on ``backend``'s profile (an H200 where none is
        known)."""
        fp, profile = cost.footprint_of(length, size, batch), cost.profile_of(backend)
        return {
            SequentialForward(): cost.sequential_forward(fp).seconds(profile),
            Newton(): cost.newton_forward(fp, EXPECTED_ITERATIONS).seconds(profile),
        }

    def __call__(self, problem, consts, init, xs, *, keep):
        fp = problem.footprint
        chosen = self.choose(fp.length, fp.size, batch=fp.batch)
        return chosen(problem, consts, init, xs, keep=keep)

    def __repr__(self) -> str:
        return "'auto'"
