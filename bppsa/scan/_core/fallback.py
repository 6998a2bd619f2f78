"""``bppsa.FallbackWarning``: an explicit request that runs by another, exact route, and why.

The rule: what a scan is explicitly asked for either runs, or says so. A request the library
can still serve exactly by another route (a fused kernel that cannot run this scan's step:
float64, a primitive without a rule, beyond the profile's envelope) runs that route and warns
once per trace with the reason (:class:`FallbackWarning`); a request that cannot be served at
all (a backward over the memory limit) raises (:class:`bppsa.MemoryLimitError`). Only explicit
requests warn: the choices of ``bppsa.Auto()`` and ``bppsa.AutoForward()`` are recorded with
their reasons in :func:`bppsa.trace_plans`.
"""

from __future__ import annotations

import sys
import types
import warnings


class FallbackWarning(UserWarning):
    """An explicit ``forward=`` or ``method=`` runs by another, exact route for this scan.

    Emitted once per trace of the scan, with the reason (also in :func:`bppsa.trace_plans`'s
    ``forward_because`` or ``backward_because``), e.g. for ``forward="fused"`` or
    ``method=bppsa.FusedSequential()`` on a float64 carry, which the fused kernel does not
    take: the loop then runs in ``lax.scan``, with the same result. To make it an error,
    ``warnings.simplefilter("error", bppsa.FallbackWarning)``.

    Example:
        >>> import warnings
        >>> body = lambda h, x: (jnp.tanh(jnp.cumsum(h) + x), h)  # cumsum: no kernel rule
        >>> with warnings.catch_warnings():
        ...     warnings.simplefilter("error", bppsa.FallbackWarning)
        ...     bppsa.scan(body, jnp.zeros(2), jnp.ones((5, 2)), forward="fused")
        Traceback (most recent call last):
        ...
        bppsa.scan._core.fallback.FallbackWarning: ...
    """


def warn(request: str, route: str, reason: str) -> None:
    """Warns that the explicit ``request`` (``"forward=Fused()"``) runs ``route`` instead, and
    why (``reason``)."""
    warnings.warn(
        f"bppsa.scan: {request} runs {route} for this scan ({reason}).",
        FallbackWarning,
        stacklevel=caller_stacklevel(),
    )


def caller_stacklevel() -> int:
    """The ``stacklevel`` of the innermost caller outside bppsa and JAX (the user's line that
    traces the scan or its derivative), so that a library's warning points there."""
    frame: types.FrameType | None = sys._getframe(2)
    level = 2
    while frame is not None and frame.f_globals.get("__name__", "").partition(".")[0] in (
        "bppsa",
        "jax",
        "contextlib",
        "functools",
    ):
        frame, level = frame.f_back, level + 1
    return level if frame is not None else 2
