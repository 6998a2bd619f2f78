"""What a scan's backward pass is asked for, and how :func:`bppsa.grad`'s settings reach it.

One frozen (hashable) :class:`Options` holds the method, the memory limit, the finiteness
check, the forward pass and the precision of the library's own products: plain values, the
names already resolved at the front door (:func:`bppsa.scan._core.asked.options_from`), so that
this module imports no method nor forward. :func:`bppsa.grad`
sets it for the scans traced inside it with :func:`ambient`, through a JAX configuration state
that keys ``jax.jit``'s cache (see :mod:`bppsa.scan._core.tracing`), so a ``fun`` that was
jitted before being passed to ``bppsa.grad`` is traced again for other options instead of
silently reusing the trace of its first options.
A scan's own arguments win over the ambient ones, and an inner ``bppsa.grad`` over an outer
one, field by field.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from bppsa.scan import _precision
from bppsa.scan._core import memory, tracing

if TYPE_CHECKING:
    from bppsa.scan._core.auto_forward import AutoForward
    from bppsa.scan._core.forward import Forward
    from bppsa.scan._core.methods.base import Method
    from bppsa.scan._core.methods.policy import Policy


@dataclasses.dataclass(frozen=True)
class Options:
    """Settings of a scan's backward; ``None`` fields are unset (inherited, then defaults).

    Attributes:
        method: a method object (see :mod:`bppsa.scan._core.methods`).
        memory_limit: bytes the backward may use; ``math.inf`` turns the check off; ``None``:
            the default device's memory, its capacity (``"available"`` was resolved to bytes
            when the options were made).
        check_finite: raise ``FloatingPointError`` naming the step of a non-finite value.
        check_structure: compare structured step Jacobians with dense ones at a few steps
            (see :mod:`bppsa.scan._core.structure_check`).
        forward: how the forward pass runs (see :mod:`bppsa.scan._core.forward`), or the
            forward's policy (:class:`~bppsa.scan._core.auto_forward.AutoForward`).
        precision: of the library's own matrix products, in JAX's canonical form (see
            :mod:`bppsa.scan._precision`; unset: ``"highest"``).
        linear_vjp: the user's word that the backward of every ``jax.custom_vjp`` function
            the carry reaches is linear in its cotangent (see :mod:`bppsa.scan._core.jaxprs.rules`);
            unset: it may not be, and only back-propagation runs such a step.
    """

    method: Method | Policy | None = None
    memory_limit: float | None = None
    check_finite: bool | None = None
    check_structure: bool | None = None
    forward: Forward | AutoForward | None = None
    precision: _precision.Precision | None = None
    linear_vjp: bool | None = None

    def over(self, outer: Options) -> Options:
        """These options, with the unset fields taken from ``outer``."""
        fields = {}
        for field in dataclasses.fields(self):
            mine = getattr(self, field.name)
            fields[field.name] = mine if mine is not None else getattr(outer, field.name)
        return Options(**fields)


def current() -> Options:
    """The options of the enclosing :func:`bppsa.grad` calls (all unset outside any)."""
    options = tracing.current_options()
    return options if isinstance(options, Options) else Options()


@contextlib.contextmanager
def ambient(options: Options) -> Iterator[Options]:
    """Within the block, scans inherit ``options`` (over those of an enclosing block)."""
    merged = options.over(current())
    with tracing.options_context(merged):
        yield merged


def check_limit(limit: Any, argname: str = "memory_limit") -> float | None:
    """Validates a user's limit: ``None`` (the default device's memory, a constant of it),
    bytes > 0, or ``"available"``, resolved here, once, into the bytes free now
    (:func:`~bppsa.scan._core.memory.available_bytes`): a number in the options that key
    ``jax.jit``'s cache, never a reading taken later while a scan is traced."""
    if limit is None:
        return None
    if isinstance(limit, str) and limit == memory.AVAILABLE:
        return memory.available_bytes()
    if isinstance(limit, bool) or not isinstance(limit, int | float):
        raise TypeError(
            f"{argname} must be a number of bytes, 'available' or None (the device's memory), "
            f"got {type(limit).__name__}."
        )
    if not limit > 0:  # also rejects NaN
        raise ValueError(f"{argname} must be positive (math.inf turns the check off), got {limit}.")
    return float(limit)


def check_bool(value: Any, argname: str = "check_finite") -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{argname} must be a bool, got {type(value).__name__}.")
    return value
