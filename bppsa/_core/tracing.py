"""How many examples a scan serves at once when it is batched with ``jax.vmap``.

A scan written for one example and vmapped over a batch is traced once, with per-example shapes;
the batch size only shows in the batching traces above it. The automatic method needs it (the
parallel backward's extra work grows with the batch, back-propagation's latency does not), so
:func:`vmapped_batch_size` walks those traces, the same way JAX dispatches the scan's inputs.
This reads JAX internals; if they change, it answers 1 (the per-example view).
"""

from __future__ import annotations

import math
from typing import Any

import jax

try:
    from jax._src import core as _core
    from jax._src.interpreters import ad as _ad
    from jax._src.interpreters import batching as _batching
except ImportError:  # pragma: no cover - a JAX without these modules
    _core = _ad = _batching = None


def vmapped_batch_size(inputs: Any) -> int:
    """The product of the sizes of the ``jax.vmap`` axes over which ``inputs`` are batched
    (the largest over the leaves), or 1 outside ``jax.vmap``."""
    if _core is None:
        return 1
    try:
        return max((_batch_size(leaf) for leaf in jax.tree.leaves(inputs)), default=1)
    except (AttributeError, TypeError):  # JAX internals changed
        return 1


def _batch_size(value: Any) -> int:
    sizes = []
    trace = _core.trace_ctx.trace
    while trace is not None:
        if isinstance(trace, _batching.BatchTrace):
            value, dim = trace.to_batch_info(value)
            if isinstance(dim, int):  # None when the value is not batched
                sizes.append(value.shape[dim])
        elif isinstance(trace, _ad.JVPTrace | _ad.LinearizeTrace):
            value = trace.to_primal_tangent_pair(value)[0]
        else:
            break
        trace = trace.parent_trace
    return math.prod(sizes)
