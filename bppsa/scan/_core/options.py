"""What a scan's backward pass is asked for, and how :func:`bppsa.grad`'s settings reach it.

One frozen (hashable) :class:`Options` holds the method, the memory limit, the finiteness
check, the forward pass and the precision of the library's own products. :func:`bppsa.grad`
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
from typing import Any

from bppsa.scan import _precision
from bppsa.scan._core import tracing
from bppsa.scan._core.auto_forward import AutoForward
from bppsa.scan._core.forward import Forward
from bppsa.scan._core.forwards import resolve_forward
from bppsa.scan._core.methods.base import Method
from bppsa.scan._core.methods.policy import Policy
from bppsa.scan._core.methods.resolve import resolve


@dataclasses.dataclass(frozen=True)
class Options:
    """Settings of a scan's backward; ``None`` fields are unset (inherited, then defaults).

    Attributes:
        method: a method object (see :mod:`bppsa.scan._core.methods`).
        memory_limit: bytes the backward may use; ``math.inf`` turns the check off; ``None``:
            the default device's available memory.
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

    @classmethod
    def make(
        cls,
        method=None,
        memory_limit=None,
        check_finite=None,
        forward=None,
        precision=None,
        check_structure=None,
        linear_vjp=None,
    ) -> Options:
        """Validated options from user arguments (method and forward names are resolved here)."""
        return cls(
            method=None if method is None else resolve(method),
            memory_limit=check_limit(memory_limit),
            check_finite=None if check_finite is None else check_bool(check_finite),
            check_structure=(
                None if check_structure is None else check_bool(check_structure, "check_structure")
            ),
            forward=None if forward is None else resolve_forward(forward),
            precision=None if precision is None else _precision.canonical(precision),
            linear_vjp=None if linear_vjp is None else check_bool(linear_vjp, "linear_vjp"),
        )

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


def check_bool(value: Any, argname: str = "check_finite") -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{argname} must be a bool, got {type(value).__name__}.")
    return value
