"""A memory guard for the backward pass of ``bppsa.scan``: an estimate, a limit, a fallback.

The backward methods trade memory for depth: ``Blelloch()`` forms about ``T`` dense products of
``n x n`` Jacobians, ``Chunked()`` keeps ``O(sqrt T)`` of them, ``Chunked(1, block=K)`` none.
When the backward pass of a scan is about to be traced, :func:`fit` estimates what the method
needs for that scan and compares it with a limit (the user's ``memory_limit``, else the default
device's available memory). Too much: an automatic method (``bppsa.Auto()``) switches to the
largest lower-memory method that fits; an explicit one raises :class:`MemoryLimitError` with
the estimate, the limit and the alternatives that fit.

The estimate is a model, not a measurement: bytes of the arrays the scan's forward and backward
keep alive at their peak (the carries kept for the backward, the Jacobians and the per-step
intermediate arrays of one time block, the dense products of a parallel scan), with constants
fitted to XLA's compiled memory analysis on CPU (RNN, GRU, LSTM and autodiff Jacobians; tested
to stay within 0.5x..2.5x of it in ``tests/test_memory.py``). It covers one scan, not the rest
of the program, and counts the ``jax.vmap`` batch only where the backward is traced under that
vmap (a scan inside a ``jax.jit`` that is itself vmapped sees one example).
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import math
import os
from collections.abc import Iterator
from typing import Any

import jax

from bppsa.scan import Auto, Blelloch, Chunked, Dense, Method, Sequential, Structured
from bppsa.scan._chunked import default_chunks
from bppsa.scan._methods import CPU_BLOCK

# Model constants, in floats per time step (see the module docstring for how they were fitted).
RESIDUAL_STATES = 2.0  # the carries kept for the backward, and one copy of them
SPAN_ELEMENTS = 2.5  # per step of a block: the stacked Jacobians and their VJP's arrays
SPAN_STATES = 2.0  # per step of a block: cotangents and the VJP's state-sized arrays
BLELLOCH_DENSE = 1.6  # Blelloch: the up-sweep levels' dense products (about T maps) and operands
CHUNK_DENSE = 3.0  # Chunked: per chunk, its aggregate and the Blelloch scan over them
BP_STATES = 3.0  # plain back-propagation through lax.scan: residuals per step (approximate)

# Lower-memory methods tried, in this order of preference, when an automatic method does not
# fit: the larger (more parallel) ones first.
FALLBACKS = (
    Chunked(),
    Chunked(block=CPU_BLOCK),
    Chunked(1, block=CPU_BLOCK),
    Chunked(1, block=256),
    Chunked(1, block=64),
)


class MemoryLimitError(MemoryError):
    """The backward pass of a scan would need more memory than the limit allows.

    Attributes:
        estimate: bytes the method was estimated to need.
        limit: the limit in bytes.
        alternatives: ``[(method, bytes)]`` of lower-memory methods that fit.
    """

    def __init__(self, message: str, estimate: int, limit: float, alternatives: list):
        super().__init__(message)
        self.estimate = estimate
        self.limit = limit
        self.alternatives = alternatives


@dataclasses.dataclass(frozen=True)
class Footprint:
    """What the memory of one scan's backward depends on.

    Attributes:
        length: ``T``, the number of steps.
        state: floats of the packed carry of one example (batch dims inside the carry included).
        element: floats of one step's transposed Jacobian as stored (structured or dense).
        dense: floats of one step's Jacobian as a dense matrix (what parallel products form).
        itemsize: bytes per float.
        batch: examples served at once through ``jax.vmap``.
        size: the state size ``n`` that ``Auto.choose`` sees.
    """

    length: int
    state: int
    element: int
    dense: int
    itemsize: int
    batch: int = 1
    size: int = 0

    def describe(self) -> str:
        return (
            f"T={self.length}, {self.state} carry floats per example, {self.batch} vmapped "
            f"example{'s' if self.batch != 1 else ''}, {self.itemsize}-byte floats"
        )


def footprint(jac_t: Any, state: int, length: int, itemsize: int, batch: int = 1) -> Footprint:
    """The footprint of a scan from the shape of its stacked Jacobians ``jac_t``.

    Args:
        jac_t: the stacked transposed Jacobians (arrays or ``jax.ShapeDtypeStruct``), a
            ``Dense`` or ``Structured`` stack; anything else counts as dense ``state x state``.
        state: floats of the packed carry of one example.
        length: number of steps.
        itemsize: bytes per float.
        batch: vmapped examples.
    """

    def per_step(x):
        return math.prod(x.shape[1:]) if x is not None else 0

    if isinstance(jac_t, Structured):
        n = jac_t.u.shape[0]
        inner = math.prod(jac_t.d.shape[1:-1])
        element, dense = per_step(jac_t.d) + per_step(jac_t.e), inner * n * n
    elif isinstance(jac_t, Dense):
        n = jac_t.a.shape[-1]
        element = dense = per_step(jac_t.a)
    else:
        n, element, dense = state, state * state, state * state
    return Footprint(length, state, element, dense, itemsize, batch, size=n)


def estimate(method: Method, fp: Footprint, backend: str | None = None) -> int | None:
    """Estimated peak bytes of a scan's forward and backward with ``method`` (``None``: a
    method this model does not know)."""
    t = fp.length
    residual = RESIDUAL_STATES * t * fp.state

    def span(steps):
        return steps * (SPAN_ELEMENTS * fp.element + SPAN_STATES * fp.state)

    if isinstance(method, Auto):
        return estimate(auto_method(method.choose, fp, backend), fp, backend)
    if isinstance(method, Blelloch):
        floats = residual + span(t) + BLELLOCH_DENSE * t * fp.dense
    elif isinstance(method, Chunked):
        steps = min(method.block or t, t)
        chunks = min(method.chunks or default_chunks(steps), steps)
        floats = residual + span(steps)
        if chunks > 1:  # a reordered copy of the block's Jacobians, and the chunk aggregates
            floats += steps * fp.element + CHUNK_DENSE * chunks * fp.dense
    elif isinstance(method, Sequential):
        if method.uses_jacobians:
            floats = residual + span(t)
        else:  # plain back-propagation: lax.scan's residuals, about a Jacobian's worth per step
            floats = t * (BP_STATES * fp.state + min(fp.element, 2 * fp.state))
    else:
        return None
    return math.ceil(floats * fp.itemsize * fp.batch)


def available_bytes() -> float:
    """Free memory of the default device: the allocator's limit minus what is in use on
    accelerators, the host's available memory on CPU (``inf`` when neither is known)."""
    try:
        stats = jax.devices()[0].memory_stats()
    except Exception:  # some backends do not implement memory statistics
        stats = None
    if stats and "bytes_limit" in stats:
        return float(stats["bytes_limit"] - stats.get("bytes_in_use", 0))
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return float(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return float(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):
        return math.inf


def check_limit(limit: Any, argname: str = "memory_limit") -> float | None:
    """Validates a user's limit: ``None`` (the device's available memory) or bytes > 0."""
    if limit is None:
        return None
    if isinstance(limit, bool) or not isinstance(limit, int | float):
        raise TypeError(
            f"{argname} must be a number of bytes or None (the device's available memory), "
            f"got {type(limit).__name__}."
        )
    if not limit > 0:  # also rejects NaN
        raise ValueError(f"{argname} must be positive (math.inf turns the check off), got {limit}.")
    return float(limit)


_ambient_limit: contextvars.ContextVar[float | None] = contextvars.ContextVar(
    "bppsa_memory_limit", default=None
)


def resolve_limit(limit: float | None) -> float | None:
    """The limit for a scan: its own, else the one of the enclosing ``bppsa.grad``."""
    return check_limit(limit) if limit is not None else _ambient_limit.get()


@contextlib.contextmanager
def ambient_limit(limit: float | None) -> Iterator[None]:
    """Within the block, scans without their own ``memory_limit`` use ``limit``."""
    token = _ambient_limit.set(check_limit(limit))
    try:
        yield
    finally:
        _ambient_limit.reset(token)


def auto_method(choose, fp: Footprint, backend: str | None = None) -> Method:
    """``Auto().choose`` or ``Auto().parallel`` for a scan of footprint ``fp``."""
    return choose(fp.length, fp.size, backend, batch=fp.batch, element=fp.element)


def fit(method: Method, fp: Footprint, limit: float | None, backend: str | None = None) -> Method:
    """The method to run a scan's backward with, within ``limit`` bytes.

    Args:
        method: the requested method; ``Auto()`` may be replaced by a lower-memory one.
        fp: the scan's footprint.
        limit: bytes, or ``None`` for the default device's available memory.
        backend: for ``Auto.choose`` (default: JAX's default backend).

    Returns:
        ``method`` itself when it fits (for ``Auto()``, the method it chooses), else, for
        ``Auto()``, the first of :data:`FALLBACKS` that fits.

    Raises:
        MemoryLimitError: the method (or, for ``Auto()``, every fallback) does not fit.
    """
    automatic = isinstance(method, Auto)
    chosen = auto_method(method.parallel, fp, backend) if automatic else method
    need = estimate(chosen, fp, backend)
    if need is None:
        return chosen
    limit_bytes = available_bytes() if limit is None else limit
    if need <= limit_bytes:
        return chosen
    options = []
    for candidate in FALLBACKS:
        bytes_ = estimate(candidate, fp, backend)
        if bytes_ < need and bytes_ <= limit_bytes and candidate not in (c for c, _ in options):
            options.append((candidate, bytes_))
    if automatic and options:
        return options[0][0]
    raise MemoryLimitError(
        _message(method, chosen, need, limit, limit_bytes, options, fp, backend),
        need,
        limit_bytes,
        options,
    )


def _message(method, chosen, need, limit, limit_bytes, options, fp, backend) -> str:
    name = f"{method!r} (which chose {chosen!r})" if chosen is not method else repr(method)
    source = "the default device's available memory" if limit is None else "memory_limit"
    if options:
        fits = ", ".join(f"bppsa.{m!r} (~{human(b)})" for m, b in options)
        advice = f"Lower-memory methods that fit: {fits}."
    else:
        advice = "No lower-memory backward method fits; use a shorter sequence or fewer examples."
    bp = estimate(Sequential(), fp, backend)
    return (
        f"bppsa.scan: the backward pass with method={name} needs about {human(need)} "
        f"({fp.describe()}), more than the limit of {human(limit_bytes)} ({source}). {advice} "
        f"Plain back-propagation, bppsa.Sequential(), needs about {human(bp)}. Pass a method "
        "as method=..., or raise memory_limit (math.inf turns this check off)."
    )


def human(nbytes: float) -> str:
    """``1.3 GB``-style sizes (decimal units)."""
    if not math.isfinite(nbytes):
        return str(nbytes)
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if nbytes >= scale:
            return f"{nbytes / scale:.3g} {unit}"
    return f"{int(nbytes)} B"
