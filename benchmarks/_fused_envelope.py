"""The fused kernel's envelope as the compile grid measures it: the one module of the benchmarks
that reads the fused forward's internals (``bppsa/scan/_core/fused``).

The envelope is data of the profile: ``fused_max_tile`` and ``fused_max_resident`` of its
``bppsa.Kernels``. :func:`lifted` raises it out of the way on the default backend's profile, so
that a grid can try to compile the kernel beyond it: the limits are what the grid is to set
(``python -m benchmarks.tools.fit_profile --compile``). :func:`sizes` counts, for one scan, the
two numbers the envelope compares with them. Both fall back safely where the internals have
moved (:func:`lifted` does nothing, :func:`sizes` gives ``None``); the tests
(``tests/benchmarks/test_fused.py``) fail loudly when they do.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from collections.abc import Callable, Iterator
from typing import Any

import jax

import bppsa

UNBOUNDED = 1 << 62
FIELDS = ("fused_max_tile", "fused_max_resident")


def _modules():
    from bppsa.scan._core.fused import forward, padded
    from bppsa.scan._core.problem import prepare
    from bppsa.scan._profile import built_in

    return forward, padded, prepare, built_in


def _unbounded(kernels: bppsa.Kernels) -> bppsa.Kernels:
    return dataclasses.replace(kernels, **dict.fromkeys(FIELDS, UNBOUNDED))


@contextlib.contextmanager
def lifted() -> Iterator[bool]:
    """Inside the block the default backend's profile admits every size to the fused kernels
    (for scans traced in it: the profile is part of ``jax.jit``'s cache key); yields whether it
    could be lifted."""
    backend = jax.default_backend()
    saved = bppsa.get_profile(backend)
    try:
        *_, built_in = _modules()
        kernels = _unbounded(saved.kernels)
    except (ImportError, TypeError):  # the fields have moved
        yield False
        return
    bppsa.set_profile(backend, dataclasses.replace(saved, kernels=kernels))
    try:
        yield True
    finally:
        bppsa.set_profile(backend, None if saved is built_in(backend) else saved)


def limits() -> dict[str, int | None]:
    """The envelope of the default backend's profile now, ``{"fused_max_tile": ...,
    "fused_max_resident": ...}`` (``None`` where the fields have moved)."""
    kernels = bppsa.get_profile().kernels
    return {field: getattr(kernels, field, None) for field in FIELDS}


def sizes(body: Callable, init: Any, xs: Any) -> dict[str, int] | None:
    """The envelope's two counts for ``lax.scan(body, init, xs)`` (one example), entries after
    padding to powers of two: ``tile``, the largest array one operation of the recurrence forms
    (compared with ``fused_max_tile``), and ``resident``, the constants and the carry the kernel
    keeps loaded (compared with ``fused_max_resident``); ``None`` where the kernel cannot run
    the scan for another reason, or where the internals have moved."""
    try:
        forward, padded, prepare, built_in = _modules()
        problem, _ = prepare(body, init, xs, None, reverse=False, batch=None)
        cpu = built_in("cpu")
        unbounded = dataclasses.replace(cpu, kernels=_unbounded(cpu.kernels))
        plan = forward.Fused().prepare(problem, unbounded)
        if isinstance(plan, str):
            return None
        split = plan.split
        tile = max((padded.largest_tile(eqn) for eqn in split.recurrence), default=0)
        kept = [*split.constant_residuals, *split.carry_in]
        resident = sum(math.prod(padded.padded_shape(v.aval.shape)) for v in kept)
        return {"tile": int(tile), "resident": int(resident)}
    except Exception:  # internals moved: the grid goes on without the counts
        return None
