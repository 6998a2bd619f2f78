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

import jax
from jax import lax

from bppsa.scan._core.fused.backend import Backend, Interpreted
from bppsa.scan._core.fused.mosaic_gpu import MosaicGPU
from bppsa.scan._core.fused.triton import Triton

BACKENDS: dict[str, Backend] = {backend.name: backend for backend in (Triton(), MosaicGPU())}


def backend_named(name: str | None) -> Backend | str:
    """The backend a profile names, or why there is none (``None``: the platform has no
    fused kernel)."""
    if name is None:
        return "the profile has no fused kernel backend (fused_backend=None)"
    backend = BACKENDS.get(name)
    if backend is None:
        return f"no fused kernel backend named {name!r} (known: {', '.join(sorted(BACKENDS))})"
    return backend


def check_backend(owner: str, backend: str) -> None:
    """Raises ``ValueError`` naming ``owner`` unless ``backend`` is ``"auto"`` (the profile's)
    or the name of a backend of :data:`BACKENDS`."""
    if backend != "auto" and backend not in BACKENDS:
        known = ", ".join(repr(name) for name in sorted(BACKENDS))
        raise ValueError(
            f"{owner}: backend must be 'auto' (the profile's) or one of {known}, got {backend!r}."
        )


def runners(backend: Backend) -> dict[str, Backend]:
    """The platforms ``backend``'s kernels run on, and as what: compiled on its own, in
    Pallas' interpreter on the CPU (where this JAX has one for it)."""
    if not backend.interpretable():
        return {backend.platform: backend}
    return {backend.platform: backend, "cpu": Interpreted(backend)}


def dispatch(backend: Backend, kernel: Callable[[Backend], Callable], scanned: Callable, *args):
    """``kernel(runner)(*args)`` on the platforms of :func:`runners`, ``scanned(*args)`` (the
    same recurrence in ``lax.scan``) on every other, chosen when the program is lowered.

    Where a runner has effects that ``jax.vmap`` cannot take through a choice of branches
    (``vmap_outside``: Mosaic GPU's interpreter calls back into Python), ``jax.vmap`` maps
    each branch inside the choice instead (:func:`_mapped_inside`)."""
    branches: dict[str, Any] = {p: kernel(b) for p, b in runners(backend).items()}
    if not backend.vmap_outside:
        return lax.platform_dependent(*args, default=scanned, **branches)
    return _mapped_inside(branches, scanned)(*args)


def _mapped_inside(branches: dict[str, Callable], default: Callable) -> Callable:
    """``lax.platform_dependent`` of ``branches`` (``default`` elsewhere) whose batching maps
    every branch (each ``jax.vmap``-ed over the batched arguments) rather than the choice."""

    @jax.custom_batching.custom_vmap
    def chosen(args):
        return lax.platform_dependent(*args, default=default, **branches)

    @chosen.def_vmap
    def _(axis_size, in_batched, args):
        (batched,) = in_batched
        axes = jax.tree.map(lambda b: 0 if b else None, batched)

        def mapped(f):
            return jax.vmap(f, in_axes=tuple(axes), axis_size=axis_size)

        inner = _mapped_inside({p: mapped(b) for p, b in branches.items()}, mapped(default))
        out = inner(*args)
        return out, jax.tree.map(lambda _: True, out)

    return lambda *args: chosen(list(args))
