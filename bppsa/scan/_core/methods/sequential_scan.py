"""``SequentialScan()``: the sequential scan over the transposed Jacobians."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from bppsa.scan import _algorithms
from bppsa.scan._core import cost
from bppsa.scan._core.methods.base import Method, Supports, chain_levels


@dataclasses.dataclass(frozen=True)
class SequentialScan(Method):
    """A sequential scan over the transposed Jacobians: ``T`` dependent matrix-vector products.

    The same pipeline as the parallel methods (all steps' Jacobians and VJP evaluated at once,
    then the scan, then the VJP) with back-propagation's sequential order, which separates
    errors in the Jacobians from errors in a parallel scan. Over a chain of layers it is the
    sequential chain of sparse matrix-vector products. In time blocks
    (``bppsa.Blocked(SequentialScan(), K)``) it is what ``Auto()`` runs on CPUs.
    """

    name: ClassVar[str] = "sequential-scan"
    supports: ClassVar[Supports] = Supports(layers=True)

    def scan(self, g_last, maps, offsets):
        return _algorithms.sequential(g_last, maps, offsets)

    def memory(self, fp):
        return fp.span_bytes()

    def cost(self, fp):
        return cost.plus(cost.jacobians(fp, fp.length), cost.sequential_scan(fp, fp.length))


@chain_levels.register
def _(method: SequentialScan) -> int:
    return 0  # the sequential chain: no parallel level
