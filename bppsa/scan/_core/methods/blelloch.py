"""``Blelloch()``: the paper's modified Blelloch scan over all steps."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from bppsa.scan import _algorithms
from bppsa.scan._core import cost
from bppsa.scan._core.memory import BLELLOCH_DENSE
from bppsa.scan._core.methods.base import JacobianMethod, cost_of, span_floats_of


@dataclasses.dataclass(frozen=True)
class Blelloch(JacobianMethod):
    """BPPSA's modified Blelloch scan: ``Theta(log T)`` levels (MLSys 2020, Wang et al.).

    Args:
        levels: how many parallel up-sweep levels run before a linear scan over what is left
            (``None``: all of them; ``0``: the sequential scan), over time steps and over a
            chain of layers (``Chain.apply``) alike. The products of pruned convolutions fill
            in quickly, which is why the paper's analysis of VGG-11 ran two.
    """

    levels: int | None = None
    name: ClassVar[str] = "blelloch"

    def __post_init__(self):
        if self.levels is not None and (
            isinstance(self.levels, bool) or not isinstance(self.levels, int) or self.levels < 0
        ):
            raise ValueError(f"levels must be None or an int >= 0, got {self.levels!r}.")

    def __repr__(self) -> str:
        return "Blelloch()" if self.levels is None else f"Blelloch(levels={self.levels})"

    def scan(self, g_last, maps, offsets):
        return _algorithms.blelloch(g_last, maps, offsets, levels=self.levels)


@span_floats_of.register
def _span_floats(method: Blelloch, fp, steps):
    return fp.span_floats(steps) + BLELLOCH_DENSE * steps * fp.dense


@cost_of.register
def _cost(method: Blelloch, fp):
    return cost.plus(cost.jacobians(fp, fp.length), cost.blelloch_scan(fp, fp.length))
