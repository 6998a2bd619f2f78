"""What each traced ``bppsa.scan`` decided: the method it ran and how it built its Jacobians.

``with bppsa.trace_plans() as plans:`` collects one :class:`ScanPlan` per ``bppsa.scan`` traced
inside the block (a call served from ``jax.jit``'s cache is not traced and records nothing);
``bppsa.trace_plans(fun, *args)`` traces ``fun`` abstractly, its jitted parts too, and returns
the plans: those of a jitted function after its first call. Tests use it to assert the path
they exercise; a researcher uses it to see what ``Auto()`` picked.

The plans go to the list of the innermost block through a context variable that only the user's
block sets and only tracing appends to; nothing that runs reads it.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
from collections.abc import Callable, Iterator
from typing import Any, overload

import jax

from bppsa.scan._core import tracing

_plans: contextvars.ContextVar[list | None] = contextvars.ContextVar("bppsa_plans", default=None)


@dataclasses.dataclass
class ScanPlan:
    """The decisions of one traced scan.

    Attributes:
        requested: the method the scan was asked for (``Auto()`` unless given).
        method: the concrete method it runs (``Sequential()``: plain ``lax.scan``).
        jacobians: how the Jacobians would be built, ``"analytic"`` or ``"autodiff"``, with the
            structure they keep through the scan's products where they have one (e.g.
            ``"autodiff, diagonal"``, ``"analytic, block-diagonal k=2"``).
        length: ``T``.
        batch: the ``jax.vmap`` batch the scan was traced under.
        backward: the method that ran the backward pass, after the memory guard (``None``
            until the backward is traced, and for plain ``lax.scan``).
        forward: how the forward pass runs (``'sequential'``: ``lax.scan``; ``Newton(...)``).
        forward_because: why, where the forward policy chose it (``None``: asked for), or
            why the fused forward asked for cannot run (then ``forward`` is ``lax.scan``).
        backward_because: why ``FusedSequential()``'s reverse loop cannot run in its kernel
            (e.g. ``"the fused kernel: a carry of float64 ..."``; the loop then runs in
            ``lax.scan``, or the backward is ``SequentialScan()``'s where the step's VJP
            cannot be traced); ``None``: it runs there, or the backward is another method.
        whole_batch: whether the backward ran on the ``jax.vmap`` batch as one array (the
            shared parameters' cotangents as one product over steps and examples) rather
            than example by example (``None`` until the backward is traced).
        dense_because: for autodiff Jacobians without a structure, why the analysis of the
            body's jaxpr found none (e.g. ``"unknown primitive gather"``).
        forward_jacobians: whether the backward took the Jacobians of the forward's final
            trajectory (``bppsa.Newton``'s ``share_jacobians``) instead of forming them
            (``None`` until the backward is traced).
    """

    requested: Any
    method: Any
    jacobians: str
    length: int
    batch: int
    backward: Any = None
    forward: Any = None
    forward_because: str | None = None
    backward_because: str | None = None
    whole_batch: bool | None = None
    dense_because: str | None = None
    forward_jacobians: bool | None = None


@overload
def trace_plans() -> contextlib.AbstractContextManager[list[ScanPlan]]: ...


@overload
def trace_plans(fun: Callable, /, *args: Any, **kwargs: Any) -> list[ScanPlan]: ...


def trace_plans(fun=None, /, *args, **kwargs):
    """The :class:`ScanPlan` of every ``bppsa.scan`` traced: in a block, or by ``fun(*args)``.

    ``with bppsa.trace_plans() as plans:`` collects the plans of the scans traced inside the
    block; a call that ``jax.jit`` serves from its cache is not traced and adds none. To read
    the plans of such a function, e.g. after its first call, pass it:
    ``bppsa.trace_plans(fun, *args, **kwargs)`` traces ``fun(*args, **kwargs)`` abstractly
    (``jax.make_jaxpr``: nothing is compiled or run), with ``jax.jit``'s caches missed for the
    jitted functions it calls, and returns their plans, which are those of their first trace
    with the same arguments and options.

    Args:
        fun: the function to trace (``None``: the block form).
        *args: its positional arguments, arrays or ``jax.ShapeDtypeStruct`` (traced
            abstractly).
        **kwargs: its keyword arguments, passed as they are (static options).

    Returns:
        The block's list (filled when the block ends), or the plans of ``fun(*args)``.

    Example:
        >>> loss = lambda w: bppsa.scan(lambda h, x: (w * h + x, None), 0.0, jnp.ones(5),
        ...                             method="blelloch")[0]
        >>> with bppsa.trace_plans() as plans:
        ...     _ = bppsa.grad(loss)(0.5)
        >>> plans[0].method, plans[0].backward
        (Blelloch(), Blelloch())
        >>> step = jax.jit(bppsa.grad(loss))
        >>> _ = step(0.5)  # traced and compiled; the next call is served from the cache
        >>> bppsa.trace_plans(step, 0.5) == plans
        True
    """
    if fun is None:
        if args or kwargs:
            raise TypeError("trace_plans: arguments were given without a function to trace.")
        return _collecting()
    if not callable(fun):
        raise TypeError(f"trace_plans: fun must be callable, got {type(fun).__name__}.")
    with _collecting() as plans, tracing.fresh_traces():
        jax.make_jaxpr(lambda *a: fun(*a, **kwargs))(*args)
    return plans


@contextlib.contextmanager
def _collecting() -> Iterator[list[ScanPlan]]:
    """The block form of :func:`trace_plans`."""
    plans: list[ScanPlan] = []
    token = _plans.set(plans)
    try:
        yield plans
    finally:
        _plans.reset(token)


def record(**fields) -> ScanPlan | None:
    """A new plan, appended to the innermost :func:`trace_plans` (``None`` outside any)."""
    plans = _plans.get()
    if plans is None:
        return None
    plan = ScanPlan(**fields)
    plans.append(plan)
    return plan
