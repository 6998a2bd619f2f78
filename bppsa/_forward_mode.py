"""A clear error for forward-mode differentiation of a scan whose backward is a custom VJP.

JAX cannot apply forward mode to a ``jax.custom_vjp`` function; it fails late, with a message that
does not say what to do instead. :func:`refuse` follows the same dispatch JAX will follow for the
scan's inputs (batching traces hand the call to their parent; differentiation traces with only
zero tangents too) and raises before tracing if a forward-mode trace would differentiate it.
This reads JAX internals; if they change, it does nothing and JAX's own error remains.
"""

from __future__ import annotations

from typing import Any

import jax

try:
    from jax._src import core as _core
    from jax._src.interpreters import ad as _ad
    from jax._src.interpreters import batching as _batching
except ImportError:  # pragma: no cover - a JAX without these modules
    _core = _ad = _batching = None


def refuse(method: Any, inputs: Any) -> None:
    """Raises ``TypeError`` if the current trace would take a JVP of the scan of ``inputs``."""
    if _core is None:
        return
    try:
        mode = _first_differentiating_trace(jax.tree.leaves(inputs))
    except (AttributeError, TypeError):  # JAX internals changed: leave it to JAX's own error
        return
    if mode == "forward":
        raise TypeError(
            f"bppsa.scan with method={method!r} has no forward-mode derivative "
            "(jax.jvp, jax.jacfwd, jax.linearize): its backward pass is a custom VJP. Use "
            "method='sequential' (plain jax.lax.scan, which supports every transformation) "
            "or reverse mode (jax.grad, jax.vjp, jax.jacrev)."
        )


def _first_differentiating_trace(values: list[Any]) -> str | None:
    trace = _core.trace_ctx.trace
    while trace is not None:
        if isinstance(trace, _batching.BatchTrace):
            values = [trace.to_batch_info(v)[0] for v in values]
        elif isinstance(trace, _ad.JVPTrace | _ad.LinearizeTrace):
            pairs = [trace.to_primal_tangent_pair(v) for v in values]
            if any(type(t) is not _ad.Zero for _, t in pairs):
                return "forward" if isinstance(trace, _ad.JVPTrace) else "reverse"
            values = [p for p, _ in pairs]
        else:
            return None
        trace = trace.parent_trace
    return None
