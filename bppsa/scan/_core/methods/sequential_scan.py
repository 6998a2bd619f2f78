"""``SequentialScan()``: the sequential scan over the transposed Jacobians."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from bppsa.scan import _algorithms
from bppsa.scan._core import cost
from bppsa.scan._core.methods.base import JacobianMethod, cost_of, span_floats_of


@dataclasses.dataclass(frozen=True)
class SequentialScan(JacobianMethod):
    """A sequential scan over the transposed Jacobians: ``T`` dependent matrix-vector products.

    The same pipeline as the parallel methods (all steps' Jacobians and VJP evaluated at once,
    then the scan, then the VJP) with back-propagation's sequential order, which separates
    errors in the Jacobians from errors in a parallel scan. Over a chain of layers it is the
    sequential chain of sparse matrix-vector products. In time blocks
    (``bppsa.Blocked(SequentialScan(), K)``) it is what ``Auto()`` runs on CPUs.
    """

    name: ClassVar[str] = "sequential-scan"

    def scan(self, g_last, maps, offsets):
        return _algorithms.sequential(g_last, maps, offsets)


@span_floats_of.register
def _span_floats(method: SequentialScan, fp, steps):
    return fp.span_floats(steps)


@cost_of.register
def _cost(method: SequentialScan, fp):
    return cost.plus(cost.jacobians(fp, fp.length), cost.sequential_scan(fp, fp.length))
