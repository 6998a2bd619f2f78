"""``Blocked(method, block)``: any Jacobian method's backward, in time blocks."""

from __future__ import annotations

import dataclasses
import functools
from typing import ClassVar

from bppsa.scan._core import backward, cost
from bppsa.scan._core.methods.base import JacobianMethod, cost_of, refuse_layers, span_floats_of


@dataclasses.dataclass(frozen=True)
class Blocked(JacobianMethod):
    """Runs ``method``'s backward over blocks of ``block`` steps, from the last block back.

    Every block is evaluated all steps at once and scanned with ``method``; the cotangent
    leaving a block enters the next one. On CPUs, streaming ``T``-long arrays of Jacobians
    through memory costs more than the loop over blocks, so blocks sized to stay in cache are
    faster, and the memory of the backward is that of one block (plus the carries kept by the
    forward). E.g. ``Blocked(SequentialScan(), 2048)`` is what ``Auto()`` runs on CPUs
    for the RNN of H = 20 at B = 16.

    Attributes:
        method: a Jacobian method (``Blelloch()``, ``Chunked(...)``, ``SequentialScan()``).
        block: steps per block (the first block is shorter when it does not divide ``T``).
    """

    method: JacobianMethod
    block: int
    name: ClassVar[str | None] = None

    def __post_init__(self):
        if isinstance(self.method, Blocked) or not isinstance(self.method, JacobianMethod):
            raise TypeError(
                "Blocked(method, block) needs a method that scans Jacobians, such as "
                f"bppsa.Blelloch(), bppsa.Chunked() or bppsa.SequentialScan(); got "
                f"{self.method!r}."
            )
        bad_type = isinstance(self.block, bool) or not isinstance(self.block, int)
        if bad_type or self.block < 1:
            raise ValueError(f"block must be a positive int, got {self.block!r}.")

    def scan(self, g_last, maps, offsets):
        refuse_layers(self, maps)
        return self.method.scan(g_last, maps, offsets)

    def backward(self, problem, consts, carries_before, xs, g_last, ct_ys, *, check):
        def span(carries, xs, g_end, ct_ys):
            return self.method.backward(problem, consts, carries, xs, g_end, ct_ys, check=check)

        run = functools.partial(backward.blocked, span, self.block, consts)
        return run(carries_before, xs, g_last, ct_ys)


@span_floats_of.register
def _span_floats(method: Blocked, fp, steps):
    return method.method.span_floats(fp, min(method.block, steps))


@cost_of.register
def _cost(method: Blocked, fp):
    # The full blocks and the shorter first one (when ``block`` does not divide ``T``).
    block = max(min(method.block, fp.length), 1)
    blocks, head = divmod(fp.length, block)
    full = method.method.cost(dataclasses.replace(fp, length=block))
    first = method.method.cost(dataclasses.replace(fp, length=head)) if head else cost.Cost(0, 0, 0)
    if full is None or first is None:
        return None
    return cost.plus(full.times(blocks), first)
