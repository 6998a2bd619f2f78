"""The one table of the fused loops' backends, and the platform dispatch both loops share.

A profile names its fused backend (:class:`~bppsa.scan._profile.Kernels`' ``fused_backend``);
:func:`backend_named` finds it here. A loop planned for a backend runs, chosen when the program
is lowered (``lax.platform_dependent``), as that backend's kernel on its platform, as the same
kernel in Pallas' interpreter on the CPU (:class:`~bppsa.scan._core.fused.backend.Interpreted`),
and as the same recurrence in ``lax.scan`` everywhere else (:func:`dispatch`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from jax import lax

from bppsa.scan._core.fused.backend import Backend, Interpreted
from bppsa.scan._core.fused.triton import Triton

BACKENDS: dict[str, Backend] = {backend.name: backend for backend in (Triton(),)}


def backend_named(name: str | None) -> Backend | str:
    """The backend a profile names, or why there is none (``None``: the platform has no
    fused kernel)."""
    if name is None:
        return "the profile has no fused kernel backend (fused_backend=None)"
    backend = BACKENDS.get(name)
    if backend is None:
        return f"no fused kernel backend named {name!r} (known: {', '.join(sorted(BACKENDS))})"
    return backend


def runners(backend: Backend) -> dict[str, Backend]:
    """The platforms ``backend``'s kernels run on, and as what: compiled on its own, in
    Pallas' interpreter on the CPU."""
    return {backend.platform: backend, "cpu": Interpreted(backend)}


def dispatch(backend: Backend, kernel: Callable[[Backend], Callable], scanned: Callable, *args):
    """``kernel(runner)(*args)`` on the platforms of :func:`runners`, ``scanned(*args)`` (the
    same recurrence in ``lax.scan``) on every other, chosen when the program is lowered."""
    branches: dict[str, Any] = {p: kernel(b) for p, b in runners(backend).items()}
    return lax.platform_dependent(*args, default=scanned, **branches)
