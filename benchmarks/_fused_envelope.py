"""The fused kernel's envelope as the compile grid measures it: the one module of the benchmarks
that reads the fused forward's internals (``bppsa/scan/_core/fused``).

:func:`lifted` raises the envelope (``MAX_TILE``, ``MAX_RESIDENT`` in
``bppsa/scan/_core/fused/forward.py``) out of the way, so that a grid can try to compile the
kernel beyond it: the limits are what the grid is to set. :func:`sizes` counts, for one scan,
the two numbers the envelope compares with them. Both fall back safely where the internals have
moved (:func:`lifted` does nothing, :func:`sizes` gives ``None``); the tests
(``tests/benchmarks/test_fused.py``) fail loudly when they do.

The library has no public way to set the envelope yet (issue 43 asks for it as data of the GPU
profile); until it has, this module stands in for it.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator
from typing import Any

UNBOUNDED = 1 << 62


def _modules():
    from bppsa.scan._core.fused import forward, padded
    from bppsa.scan._core.problem import prepare

    return forward, padded, prepare


@contextlib.contextmanager
def lifted() -> Iterator[bool]:
    """Inside the block the fused forward's envelope admits every size (for scans traced in
    it); yields whether it could be lifted."""
    try:
        forward, _, _ = _modules()
        saved = forward.MAX_TILE, forward.MAX_RESIDENT
    except (ImportError, AttributeError):
        yield False
        return
    forward.MAX_TILE = forward.MAX_RESIDENT = UNBOUNDED
    try:
        yield True
    finally:
        forward.MAX_TILE, forward.MAX_RESIDENT = saved


def limits() -> dict[str, int | None]:
    """The library's envelope now: ``{"MAX_TILE": ..., "MAX_RESIDENT": ...}`` (``None`` where
    the internals have moved)."""
    try:
        forward, _, _ = _modules()
        return {"MAX_TILE": forward.MAX_TILE, "MAX_RESIDENT": forward.MAX_RESIDENT}
    except (ImportError, AttributeError):
        return {"MAX_TILE": None, "MAX_RESIDENT": None}


def sizes(body: Callable, init: Any, xs: Any) -> dict[str, int] | None:
    """The envelope's two counts for ``lax.scan(body, init, xs)`` (one example), entries after
    padding to powers of two: ``tile``, the largest array one operation of the recurrence forms
    (compared with ``MAX_TILE``), and ``resident``, the constants and the carry the kernel
    keeps loaded (compared with ``MAX_RESIDENT``); ``None`` where the kernel cannot run the
    scan for another reason, or where the internals have moved."""
    try:
        forward, padded, prepare = _modules()
        problem, _ = prepare(body, init, xs, None, reverse=False, batch=None)
        with lifted():
            plan = forward.Fused()._plan(problem)
        if isinstance(plan, str):
            return None
        split = plan.split
        tile = max((padded.largest_tile(eqn) for eqn in split.recurrence), default=0)
        kept = [*split.constant_residuals, *split.carry_in]
        resident = sum(math.prod(padded.padded_shape(v.aval.shape)) for v in kept)
        return {"tile": int(tile), "resident": int(resident)}
    except Exception:  # internals moved: the grid goes on without the counts
        return None
