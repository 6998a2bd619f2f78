"""``Blocked(method, block)``: any Jacobian method's backward, in time blocks."""

from __future__ import annotations

import dataclasses
import functools
from typing import ClassVar

from bppsa.scan._core import backward, cost
from bppsa.scan._core.methods.base import Method, Supports, require
from bppsa.scan._core.methods.sequential_scan import SequentialScan

BLOCK = 1024  # the default block: the memory guard's fallback block on both profiles
SEQUENTIAL_SCAN = SequentialScan()  # the default method


@dataclasses.dataclass(frozen=True)
class Blocked(Method):
    """Runs ``method``'s backward over blocks of ``block`` steps, from the last block back.

    Every block is evaluated all steps at once and scanned with ``method``; the cotangent
    leaving a block enters the next one. On CPUs, streaming ``T``-long arrays of Jacobians
    through memory costs more than the loop over blocks, so blocks sized to stay in cache are
    faster, and the memory of the backward is that of one block (plus the carries kept by the
    forward). E.g. ``Blocked(SequentialScan(), 2048)`` is what ``Auto()`` runs on CPUs
    for the RNN of H = 20 at B = 16; ``"blocked"`` names ``Blocked(SequentialScan(), 1024)``.

    Attributes:
        method: a Jacobian method (``Blelloch()``, ``Chunked(...)``, ``SequentialScan()``).
        block: steps per block (the first block is shorter when it does not divide ``T``).
    """

    method: Method = SEQUENTIAL_SCAN
    block: int = BLOCK
    name: ClassVar[str] = "blocked"
    # One block's Jacobians at a time, to bound memory: it forms them block by block.
    supports: ClassVar[Supports] = Supports(forward_jacobians=False)

    def __post_init__(self):
        method = self.method
        if (
            isinstance(method, Blocked)
            or not isinstance(method, Method)
            or not method.keeps_carries
        ):
            raise TypeError(
                "Blocked(method, block) needs a method that scans Jacobians, such as "
                f"bppsa.Blelloch(), bppsa.Chunked() or bppsa.SequentialScan(); got "
                f"{self.method!r}."
            )
        bad_type = isinstance(self.block, bool) or not isinstance(self.block, int)
        if bad_type or self.block < 1:
            raise ValueError(f"block must be a positive int, got {self.block!r}.")

    def scan(self, g_last, maps, offsets):
        return self.method.scan(g_last, maps, offsets)

    @property
    def forms_jacobians(self) -> bool:  # type: ignore[override]
        return self.method.forms_jacobians

    @property
    def kernel_loop(self) -> bool:  # type: ignore[override]
        return self.method.kernel_loop

    def prepare(self, problem, profile=None):
        # Its method's plan, for the whole scan (a block's steps are the scan's steps).
        return self.method.prepare(problem, profile)

    def backward(
        self,
        problem,
        consts,
        carries_before,
        xs,
        g_last,
        ct_ys,
        *,
        check,
        jacobians=None,
        prepared=None,
    ):
        if jacobians is not None:
            require(self, "forward_jacobians")

        def span(carries, xs, g_end, ct_ys):
            return self.method.backward(
                problem, consts, carries, xs, g_end, ct_ys, check=check, prepared=prepared
            )

        run = functools.partial(backward.blocked, span, self.block, consts)
        return run(carries_before, xs, g_last, ct_ys)

    def memory(self, fp):
        return self.method.memory(fp.part(min(self.block, fp.length)))

    def cost(self, fp):
        # The full blocks and the shorter first one (when ``block`` does not divide ``T``).
        block = max(min(self.block, fp.length), 1)
        blocks, head = divmod(fp.length, block)
        full = self.method.cost(dataclasses.replace(fp, length=block))
        first = (
            self.method.cost(dataclasses.replace(fp, length=head)) if head else cost.Cost(0, 0, 0)
        )
        return cost.plus(full.times(blocks), first)
