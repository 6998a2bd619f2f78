"""The precision of the library's own products, and the products that use it.

The scan's combines, the Jacobians' applications, the chunk aggregates, the structured blocks'
products and the Newton solves are matrix products that ``bppsa`` emits itself. JAX runs a
float32 product at its default precision, which on recent NVIDIA GPUs is TF32 (a 10-bit
mantissa); back-propagation only multiplies vectors by Jacobians, but a parallel scan multiplies
Jacobians by each other across ``log T`` levels, so at TF32 its gradients drift from BP's by
about 1e-3 (docs/accuracy.md). Every product here therefore passes an explicit ``precision``:
``"highest"`` unless :func:`bppsa.grad` / :func:`bppsa.scan` were given ``precision=``. The
user's own cell is never touched: its products keep whatever precision the user's code and
``jax.default_matmul_precision`` give them.

The precision reaches these helpers through :func:`products`, a context the scan's derivative
rules enter while they trace the library's work (they are traced when JAX differentiates, long
after :func:`bppsa.scan` returned); the option itself travels in
:class:`~bppsa.scan._core.options.Options`, which keys ``jax.jit``'s cache. Outside any such
context (the scan algorithms called directly) the products run at ``"highest"``.

The user's computations (the scan's body, a cell's analytic Jacobian builder, a chain's layers)
are traced inside :func:`cell`, a ``jax.named_scope`` that their derivatives keep: it marks in
every jaxpr which products are the user's, and a test checks that all the others carry the
precision asked for (tests/scan/test_precision.py).
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

Array = Any
Precision = lax.Precision | lax.DotAlgorithmPreset | tuple[lax.Precision, lax.Precision]

HIGHEST: Precision = (lax.Precision.HIGHEST, lax.Precision.HIGHEST)
CELL_SCOPE = "bppsa_cell"
_NAMES = ("default", "high", "highest", "bfloat16", "tensorfloat32", "float32")

_current: contextvars.ContextVar[Precision] = contextvars.ContextVar(
    "bppsa_products_precision", default=HIGHEST
)


def canonical(precision: Any, argname: str = "precision") -> Precision:
    """``precision`` as JAX's canonical form, validated: a name of ``jax.lax.Precision``
    (``"default"``, ``"high"``, ``"highest"`` or their aliases ``"bfloat16"``,
    ``"tensorfloat32"``, ``"float32"``), a ``lax.Precision``, a pair of them, or a
    ``lax.DotAlgorithmPreset`` (or its name, e.g. ``"F32_F32_F32"``).

    Raises:
        TypeError, ValueError: naming ``argname`` and what it accepts.
    """
    accepted = (
        f"{argname} must be one of {', '.join(map(repr, _NAMES))}, a jax.lax.Precision, a pair "
        "of them or a jax.lax.DotAlgorithmPreset (or its name)"
    )
    if isinstance(precision, str):
        if precision in _NAMES:
            value = lax.Precision(precision)
            return (value, value)
        if precision in lax.DotAlgorithmPreset.__members__:
            return lax.DotAlgorithmPreset[precision]
        raise ValueError(f"{accepted}, got {precision!r}.")
    if isinstance(precision, lax.Precision):
        return (precision, precision)
    if isinstance(precision, lax.DotAlgorithmPreset):
        return precision
    if (
        isinstance(precision, tuple)
        and len(precision) == 2
        and all(isinstance(p, lax.Precision) for p in precision)
    ):
        return precision
    raise TypeError(f"{accepted}, got {type(precision).__name__} {precision!r}.")


def current() -> Precision:
    """The precision of the library's products traced now."""
    return _current.get()


@contextlib.contextmanager
def products(precision: Precision | None) -> Iterator[None]:
    """Within the block, the library's products run at ``precision`` (``None``: ``"highest"``)."""
    token = _current.set(HIGHEST if precision is None else precision)
    try:
        yield
    finally:
        _current.reset(token)


def cell() -> contextlib.AbstractContextManager:
    """The named scope of the user's own computations (see the module's docstring)."""
    return jax.named_scope(CELL_SCOPE)


def matmul(a: Array, b: Array) -> Array:
    """``a @ b`` (``jnp.matmul``'s broadcasting) at the library's precision."""
    return jnp.matmul(a, b, precision=current())


def einsum(subscripts: str, *operands: Array) -> Array:
    """``jnp.einsum`` at the library's precision."""
    return jnp.einsum(subscripts, *operands, precision=current())
