"""``Sequential()``: plain back-propagation through ``lax.scan`` (the reference)."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from bppsa._core import cost
from bppsa._core.memory import BP_STATES
from bppsa._core.methods.base import JacobianMethod, LayerScan
from bppsa.scan import _algorithms


@dataclasses.dataclass(frozen=True)
class Sequential(JacobianMethod):
    """Sequential back-propagation: the reference.

    By default ``bppsa.scan`` then *is* ``jax.lax.scan`` and JAX differentiates it (forward and
    reverse mode, any order). With ``jacobians=True`` the backward instead runs the same
    Jacobian-based pipeline as the parallel methods with a sequential scan, which separates
    errors in the Jacobians from errors in a parallel scan.
    """

    jacobians: bool = False
    name: ClassVar[str] = "sequential"

    def __post_init__(self):
        if not isinstance(self.jacobians, bool):
            raise TypeError(f"jacobians must be a bool, got {type(self.jacobians).__name__}.")

    @property
    def uses_jacobians(self) -> bool:  # type: ignore[override]
        return self.jacobians

    def scan(self, g_last, maps, offsets):
        return _algorithms.sequential(g_last, maps, offsets)

    def span_floats(self, fp, steps):
        return fp.span_floats(steps)

    def memory(self, fp):
        if self.jacobians:
            return super().memory(fp)
        # Plain back-propagation: lax.scan's residuals, about a Jacobian's worth per step.
        return fp.bytes(fp.length * (BP_STATES * fp.state + min(fp.element, 2 * fp.state)))

    def cost(self, fp):
        if not self.jacobians:
            return cost.back_propagation(fp)
        return cost.plus(cost.jacobians(fp, fp.length), cost.sequential_scan(fp, fp.length))

    def for_complex_carry(self, leaves):
        return self if not self.jacobians else super().for_complex_carry(leaves)

    def for_chain(self, work=None):
        # Plain autodiff of the layers' forward, or the sequential chain of sparse products.
        return LayerScan(levels=0) if self.jacobians else LayerScan(autodiff=True)

    def differentiable(self, problem, forward, **options):
        if self.jacobians:
            return super().differentiable(problem, forward, **options)
        if not forward.sequential:
            # lax.scan's own derivatives need lax.scan's forward: back-propagate through the
            # other forward's trajectory with the sequential scan over the Jacobians instead.
            options["requested"] = Sequential(jacobians=True)
            return super().differentiable(problem, forward, **options)

        def run(consts, init, xs):  # JAX differentiates the lax.scan itself
            return forward(problem, consts, init, xs, keep=False)

        return run
