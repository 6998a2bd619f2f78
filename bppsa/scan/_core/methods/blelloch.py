"""``Blelloch()``: the paper's modified Blelloch scan over all steps."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from bppsa.scan import _algorithms
from bppsa.scan._core import cost
from bppsa.scan._core.memory import BLELLOCH_DENSE
from bppsa.scan._core.methods.base import Method, Supports, chain_levels


@dataclasses.dataclass(frozen=True)
class Blelloch(Method):
    """BPPSA's modified Blelloch scan: ``Theta(log T)`` levels (MLSys 2020, Wang et al.).

    Args:
        levels: how many parallel up-sweep levels run before a linear scan over what is left
            (``None``: all of them; ``0``: the sequential scan), over time steps and over a
            chain of layers (``Chain.apply``) alike. The products of pruned convolutions fill
            in quickly, which is why the paper's analysis of VGG-11 ran two.
    """

    levels: int | None = None
    name: ClassVar[str] = "blelloch"
    supports: ClassVar[Supports] = Supports(layers=True)

    def __post_init__(self):
        if self.levels is not None and (
            isinstance(self.levels, bool) or not isinstance(self.levels, int) or self.levels < 0
        ):
            raise ValueError(f"levels must be None or an int >= 0, got {self.levels!r}.")

    def __repr__(self) -> str:
        return "Blelloch()" if self.levels is None else f"Blelloch(levels={self.levels})"

    def scan(self, g_last, maps, offsets):
        return _algorithms.blelloch(g_last, maps, offsets, levels=self.levels)

    def memory(self, fp):
        return fp.span_bytes(BLELLOCH_DENSE * fp.length * fp.dense)

    def cost(self, fp):
        return cost.plus(cost.jacobians(fp, fp.length), cost.blelloch_scan(fp, fp.length))


@chain_levels.register
def _(method: Blelloch) -> int | None:
    return method.levels
