"""The fused loops' envelope as the benchmarks see it: the one module of the benchmarks that
reads the fused forward's internals (``bppsa/scan/_core/fused``).

The envelope is data of the profile: ``fused_programs`` of its ``bppsa.Kernels``, a tuple of
``bppsa.FusedProgram(num_warps, max_tile, max_resident)`` that the kernel lab derives
(``python -m benchmarks.kernel_lab``: the largest loops that compile without spilling). The
compile grid of :mod:`benchmarks._fused_compile` checks on a device that the kernels it admits
compile and run right (``python -m benchmarks.tools.fit_profile --compile``), and tries a few
beyond it: :func:`lifted` raises it out of the way on the default backend's profile, its last
program unbounded, so that a loop the profile admits keeps its warps and one beyond runs in
the largest program. :func:`with_kernels` swaps other switches of the profile for a block
(the step-ahead loads, ``fused_prefetch``). :func:`sizes` counts, for one scan, the two numbers
the envelope compares with a program's limits. All fall back safely where the internals have
moved (:func:`lifted` does nothing, :func:`sizes` gives ``None``); the tests
(``tests/benchmarks/test_fused.py``) fail loudly when they do.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator
from typing import Any

import jax

import bppsa

UNBOUNDED = 1 << 62


def _modules():
    from bppsa.scan._core.fused import forward
    from bppsa.scan._core.problem import prepare
    from bppsa.scan._profile import built_in

    return forward, prepare, built_in


def unbounded(kernels: bppsa.Kernels) -> bppsa.Kernels:
    """``kernels`` whose last fused program holds every loop (the others kept: a loop they hold
    keeps its warps)."""
    *smaller, largest = kernels.fused_programs
    last = dataclasses.replace(largest, max_tile=UNBOUNDED, max_resident=UNBOUNDED)
    return dataclasses.replace(kernels, fused_programs=(*smaller, last))


@contextlib.contextmanager
def with_kernels(change: Callable[[bppsa.Kernels], bppsa.Kernels]) -> Iterator[bool]:
    """Inside the block the default backend's profile has the kernels ``change`` makes of its
    own (for scans traced in it: the profile is part of ``jax.jit``'s cache key); yields
    whether they could be changed (``False`` where the fields have moved)."""
    backend = jax.default_backend()
    saved = bppsa.get_profile(backend)
    try:
        *_, built_in = _modules()
        kernels = change(saved.kernels)
    except (ImportError, TypeError, AttributeError, ValueError):  # the fields have moved
        yield False
        return
    bppsa.set_profile(backend, dataclasses.replace(saved, kernels=kernels))
    try:
        yield True
    finally:
        bppsa.set_profile(backend, None if saved is built_in(backend) else saved)


def lifted() -> contextlib.AbstractContextManager[bool]:
    """Inside the block the default backend's profile admits every size to the fused kernels
    (:func:`unbounded`); yields whether it could be lifted."""
    return with_kernels(unbounded)


def prefetching(prefetch: bool) -> contextlib.AbstractContextManager[bool]:
    """Inside the block the default backend's profile loads a step's residuals one step ahead
    (``Kernels.fused_prefetch``) or not; yields whether it could be set."""
    return with_kernels(lambda kernels: dataclasses.replace(kernels, fused_prefetch=prefetch))


def programs(kernels: bppsa.Kernels) -> list[dict[str, int]] | None:
    """``kernels.fused_programs`` as JSON (``None`` where the field has moved)."""
    found = getattr(kernels, "fused_programs", None)
    if found is None:
        return None
    return [dataclasses.asdict(program) for program in found]


def limits() -> dict[str, Any]:
    """The envelope of the default backend's profile now: ``{"fused_programs": [{"num_warps":
    ..., "max_tile": ..., "max_resident": ...}, ...]}`` (``None`` where the field has moved)."""
    return {"fused_programs": programs(bppsa.get_profile().kernels)}


def admits(envelope: list[dict[str, int]], tile: int, resident: int) -> dict[str, int] | None:
    """The program of ``envelope`` (:func:`limits`' list) that runs a loop of ``tile`` and
    ``resident`` entries when its warps are left to the profile: the first that holds it
    (``None``: refused)."""
    for program in envelope:
        if tile <= program["max_tile"] and resident <= program["max_resident"]:
            return program
    return None


def sizes(body: Callable, init: Any, xs: Any) -> dict[str, int | None] | None:
    """The envelope's two counts for ``lax.scan(body, init, xs)`` (one example), entries after
    padding to powers of two: ``tile``, the largest array one operation of the recurrence forms
    (compared with a program's ``max_tile``), and ``resident``, the constants and the carry the
    kernel keeps loaded (compared with its ``max_resident``); with ``num_warps``, the warps the
    default backend's profile launches the fused forward with (``None``: it refuses the loop).
    ``None`` where the kernel cannot run the scan for another reason, or where the internals
    have moved."""
    try:
        forward, prepare, _ = _modules()
        problem, _ = prepare(body, init, xs, None, reverse=False, batch=None)
        profile = bppsa.get_profile()
        wide = dataclasses.replace(profile, kernels=unbounded(profile.kernels))
        plan = forward.Fused().prepare(problem, wide)
        if isinstance(plan, str):
            return None
        footprint = plan.loop.footprint
        library = forward.Fused().prepare(problem, profile)
        warps = None if isinstance(library, str) else int(library.loop.launch.num_warps)
        return {
            "tile": int(footprint.tile),
            "resident": int(footprint.resident),
            "num_warps": warps,
        }
    except Exception:  # internals moved: the grid goes on without the counts
        return None
