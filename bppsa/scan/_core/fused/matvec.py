"""A vector times a constant matrix in a Triton program, each thread's sum kept on the thread.

Algorithm summary. A cell's step multiplies its carry ``h`` (``K`` lanes) by a matrix ``W``
(``K x N``) that does not change from step to step. Triton lays an array out with its last axis
across the threads of a warp, the axis before it across the threads left over, the next ones
across the warps, and what is left in each thread's registers. So ``W`` is passed arranged once,
outside the loop, as an array of shape ``(K1, R, NW, K2, NT)`` (:class:`Arranged`), where
``k = k1 * K2 + k2`` and ``n = (r * NW + w) * NT + t``: its ``NT`` output lanes lie across
threads, ``K2`` parts of the contraction across the rest of a warp's threads (``NT * K2 = 32``),
its ``NW`` groups of lanes across the warps, and the ``K1`` terms of each part and the ``R``
lanes past one a thread in the thread's registers. The product is ``h`` reshaped to
``(K1, 1, 1, K2, 1)`` times that array, summed over ``K1`` (within each thread, no exchange)
and then over ``K2`` (shuffles within a warp, none where ``K2 = 1``); each warp keeps its own
lanes, so no sum crosses warps, and each thread holds ``R`` lanes of the result, the same lanes
for every matrix of the step (a gated cell's gates meet lane by lane, with no exchange). The
carry reaches the next step's product through one layout conversion (shared memory).

Triton vectorizes a load along a contiguous axis (four entries a thread), which would put four
output lanes in a thread and spread ``K`` over more threads. The arranged matrix is therefore
passed with one more axis of two (the entry, then a zero) and read at index 0
(:meth:`Arranged.read`): its entries are two apart, and each thread loads one.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax.numpy as jnp
from jax import lax

WARP = 32


@dataclasses.dataclass(frozen=True)
class Arranged:
    """How a constant ``(K, N)`` matrix (padded) is passed for :func:`product` in a program of
    ``warps`` warps, and which of its two axes is contracted (``contracting``)."""

    contracting: int
    k: int
    n: int
    warps: int

    @property
    def groups(self) -> int:  # NW: groups of lanes, one a warp
        return min(self.warps, self.n)

    @property
    def lanes(self) -> int:  # NT: lanes across a warp's threads
        return min(WARP, self.n // self.groups)

    @property
    def parts(self) -> int:  # K2: parts of the contraction across the rest of the threads
        return min(WARP // self.lanes, self.k)

    @property
    def shape(self) -> tuple[int, ...]:
        """The arranged array's shape (as passed, with the trailing axis of two)."""
        k1, repeats = self.k // self.parts, self.n // (self.groups * self.lanes)
        return (k1, repeats, self.groups, self.parts, self.lanes, 2)

    def arrange(self, matrix) -> Any:
        """``matrix`` (its logical shape, contracting axis ``contracting``) zero-padded to
        ``(k, n)`` and arranged."""
        w = matrix if self.contracting == 0 else jnp.swapaxes(matrix, 0, 1)
        w = jnp.pad(w, [(0, self.k - w.shape[0]), (0, self.n - w.shape[1])])
        k1, repeats, groups, parts, lanes, _ = self.shape
        w = w.reshape(k1, parts, repeats, groups, lanes).transpose(0, 2, 3, 1, 4)
        return jnp.stack([w, jnp.zeros_like(w)], axis=-1)

    def read(self, ref) -> Any:
        """The arranged matrix from its kernel ref (the entries, not the zeros)."""
        return ref[..., 0]


def product(arranged: Arranged, vector, matrix) -> Any:
    """``vector`` (``(k,)``, padded lanes zero) times the ``arranged`` matrix (as
    :meth:`Arranged.read` gives it): ``(n,)``."""
    parts = arranged.parts
    h = vector.reshape(arranged.k // parts, parts)[:, None, None, :, None]
    within = (h * matrix).sum(axis=0)  # (R, NW, K2, NT): each thread's own terms
    out = within.sum(axis=2) if parts > 1 else lax.squeeze(within, (2,))
    return out.reshape(arranged.n)
