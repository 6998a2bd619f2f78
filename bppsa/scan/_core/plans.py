"""What each traced ``bppsa.scan`` decided: the method it ran and how it built its Jacobians.

``with bppsa.trace_plans() as plans:`` collects one :class:`ScanPlan` per ``bppsa.scan`` traced
inside the block (a call served from ``jax.jit``'s cache is not traced and records nothing).
Tests use it to assert the path they exercise; a researcher uses it to see what ``Auto()``
picked.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
from collections.abc import Iterator
from typing import Any

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


@contextlib.contextmanager
def trace_plans() -> Iterator[list[ScanPlan]]:
    """Collects a :class:`ScanPlan` for every ``bppsa.scan`` traced inside the block.

    Example:
        >>> with bppsa.trace_plans() as plans:
        ...     _ = bppsa.grad(lambda w: bppsa.scan(lambda h, x: (w * h + x, None), 0.0,
        ...                                         jnp.ones(5), method="blelloch")[0])(0.5)
        >>> plans[0].method, plans[0].backward
        (Blelloch(), Blelloch())
    """
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
