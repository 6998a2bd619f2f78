"""``Blelloch()``: the paper's modified Blelloch scan over all steps."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from bppsa._core import cost
from bppsa._core.memory import BLELLOCH_DENSE
from bppsa._core.methods.base import JacobianMethod
from bppsa.scan import _algorithms


@dataclasses.dataclass(frozen=True)
class Blelloch(JacobianMethod):
    """BPPSA's modified Blelloch scan: ``Theta(log T)`` levels (MLSys 2020, Wang et al.)."""

    name: ClassVar[str] = "blelloch"

    def scan(self, g_last, maps, offsets):
        return _algorithms.blelloch(g_last, maps, offsets)

    def span_floats(self, fp, steps):
        return fp.span_floats(steps) + BLELLOCH_DENSE * steps * fp.dense

    def cost(self, fp):
        return cost.plus(cost.jacobians(fp, fp.length), cost.blelloch_scan(fp, fp.length))
