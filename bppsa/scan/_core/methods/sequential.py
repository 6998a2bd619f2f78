"""``Sequential()``: plain back-propagation through ``lax.scan`` (the reference)."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from bppsa.scan._core import cost
from bppsa.scan._core.memory import BP_STATES
from bppsa.scan._core.methods.base import Method, cost_of, memory_of


@dataclasses.dataclass(frozen=True, init=False)
class Sequential(Method):
    """Sequential back-propagation: the reference.

    ``bppsa.scan`` then *is* ``jax.lax.scan`` and JAX differentiates it (forward and reverse
    mode, any order); over a chain of layers, JAX differentiates the layers' forward. The same
    sequential order over the transposed Jacobians, through the pipeline of the parallel
    methods, is :class:`bppsa.SequentialScan`.
    """

    name: ClassVar[str] = "sequential"
    uses_jacobians: ClassVar[bool] = False

    def __init__(self, **options):
        if "jacobians" in options:
            raise TypeError(
                "Sequential() takes no arguments: it is plain back-propagation; the sequential "
                "scan over the transposed Jacobians is bppsa.SequentialScan()."
            )
        if options:
            raise TypeError(f"Sequential() takes no arguments, got {sorted(options)}.")

    def for_complex_carry(self, leaves):
        return self


@memory_of.register
def _memory(method: Sequential, fp):
    # lax.scan's residuals, about a Jacobian's worth per step.
    return fp.bytes(fp.length * (BP_STATES * fp.state + min(fp.element, 2 * fp.state)))


@cost_of.register
def _cost(method: Sequential, fp):
    return cost.back_propagation(fp)
