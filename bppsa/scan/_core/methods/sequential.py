"""``Sequential()``: plain back-propagation through ``lax.scan`` (the reference)."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from bppsa.scan import _algorithms
from bppsa.scan._core import cost
from bppsa.scan._core.memory import BP_STATES
from bppsa.scan._core.methods.base import Method, Supports


@dataclasses.dataclass(frozen=True, init=False)
class Sequential(Method):
    """Sequential back-propagation: the reference.

    ``bppsa.scan`` then *is* ``jax.lax.scan`` and JAX differentiates it (forward and reverse
    mode, any order); over a chain of layers, JAX differentiates the layers' forward. The same
    sequential order over the transposed Jacobians, through the pipeline of the parallel
    methods, is :class:`bppsa.SequentialScan`.
    """

    name: ClassVar[str] = "sequential"
    keeps_carries: ClassVar[bool] = False
    forms_jacobians: ClassVar[bool] = False
    supports: ClassVar[Supports] = Supports(layers=True, complex_carry=True)

    def __init__(self, **options):
        if "jacobians" in options:
            raise TypeError(
                "Sequential() takes no arguments: it is plain back-propagation; the sequential "
                "scan over the transposed Jacobians is bppsa.SequentialScan()."
            )
        if options:
            raise TypeError(f"Sequential() takes no arguments, got {sorted(options)}.")

    def scan(self, g_last, maps, offsets):
        # Never called by the library (JAX differentiates the lax.scan): back-propagation's
        # order over the transposed Jacobians, for a caller that has the maps.
        return _algorithms.sequential(g_last, maps, offsets)

    def memory(self, fp):
        # lax.scan's residuals, about a Jacobian's worth per step.
        return fp.bytes(fp.length * (BP_STATES * fp.state + min(fp.element, 2 * fp.state)))

    def cost(self, fp):
        return cost.back_propagation(fp)
