"""``Chunked(chunks)``: the paper's heterogeneous scan, sequential inside chunks."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from bppsa.scan._chunked import chunked, default_chunks
from bppsa.scan._core import cost
from bppsa.scan._core.memory import CHUNK_DENSE
from bppsa.scan._core.methods.base import Method


@dataclasses.dataclass(frozen=True)
class Chunked(Method):
    """Sequential inside ``chunks`` chunks, parallel across them, Blelloch between them.

    ``2 T / chunks + O(log chunks)`` dependent steps, each a large product (see
    :func:`bppsa.scan.chunked`): the paper's heterogeneous Blelloch scan for fewer workers than
    elements. ``chunks=None`` picks about ``sqrt(T / 2)``; ``Chunked(1)`` is a sequential scan
    of matrix-vector products over the Jacobians. For time blocks, wrap it in
    :class:`bppsa.Blocked`.
    """

    chunks: int | None = None
    name: ClassVar[str] = "chunked"

    def __post_init__(self):
        value = self.chunks
        bad_type = isinstance(value, bool) or not isinstance(value, int)
        if value is not None and (bad_type or value < 1):
            raise ValueError(f"chunks must be a positive int or None, got {value!r}.")

    def scan(self, g_last, maps, offsets):
        chunks = default_chunks(len(maps)) if self.chunks is None else self.chunks
        return chunked(g_last, maps, offsets, chunks)

    def memory(self, fp):
        steps = fp.length
        chunks = min(self.chunks or default_chunks(steps), steps)
        # A reordered copy of the span's Jacobians, and the chunk aggregates.
        extra = steps * fp.element + CHUNK_DENSE * chunks * fp.aggregate if chunks > 1 else 0.0
        return fp.span_bytes(extra)

    def cost(self, fp):
        chunks = min(self.chunks or default_chunks(fp.length), max(fp.length, 1))
        scan = cost.chunked_scan(fp, fp.length, chunks)
        return cost.plus(cost.jacobians(fp, fp.length), scan)
