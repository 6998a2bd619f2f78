"""``bppsa.grad`` and ``bppsa.value_and_grad``: ``jax.grad`` with the scan backward chosen here."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Sequence
from typing import Any

import jax

from bppsa import _debug, _memory
from bppsa.scan import Method, ambient, resolve


def value_and_grad(
    fun: Callable,
    argnums: int | Sequence[int] = 0,
    has_aux: bool = False,
    *,
    method: Method | str = "auto",
    memory_limit: float | None = None,
    check_finite: bool | None = None,
) -> Callable[..., tuple[Any, Any]]:
    """Like ``jax.value_and_grad``; every ``bppsa.scan`` inside ``fun`` uses ``method``.

    Args:
        fun: function to differentiate; its ``bppsa.scan`` calls that do not name their own
            method back-propagate with ``method``.
        argnums, has_aux: as in ``jax.value_and_grad``.
        method: backward method object or name (``"auto"``, ``"blelloch"``, ``"chunked"``,
            ``"sequential"``); ``"sequential"`` is plain back-propagation, the reference;
            ``"auto"`` picks per backend (see :class:`bppsa.Auto`).
        memory_limit: bytes the backward pass of each scan inside may use (``None``: that of
            an enclosing ``bppsa.grad``, else the default device's available memory); see
            :func:`bppsa.scan`.
        check_finite: raise ``FloatingPointError`` naming the first time step whose Jacobian
            or cotangent is not finite (``None``: that of an enclosing ``bppsa.grad``, else
            False); see :func:`bppsa.scan`.

    Returns:
        A function with the signature and results of ``jax.value_and_grad(fun, ...)``.

    Raises:
        ValueError: for an unknown method name (listing the valid ones) or a limit <= 0.
        TypeError: for a method, limit or ``check_finite`` of the wrong type.

    The method is fixed when ``fun`` is traced: a ``fun`` that is itself ``jax.jit``-compiled is
    traced once and keeps the method of its first trace; wrap the result of this function in
    ``jax.jit`` instead.
    """
    method = resolve(method)
    memory_limit = _memory.check_limit(memory_limit)
    check_finite = None if check_finite is None else _debug.validate(check_finite)
    inner = jax.value_and_grad(fun, argnums=argnums, has_aux=has_aux)

    @functools.wraps(fun)
    def wrapped(*args, **kwargs):
        with contextlib.ExitStack() as stack:
            stack.enter_context(ambient(method))
            if memory_limit is not None:
                stack.enter_context(_memory.ambient_limit(memory_limit))
            if check_finite is not None:
                stack.enter_context(_debug.ambient(check_finite))
            return inner(*args, **kwargs)

    return wrapped


def grad(
    fun: Callable,
    argnums: int | Sequence[int] = 0,
    has_aux: bool = False,
    *,
    method: Method | str = "auto",
    memory_limit: float | None = None,
    check_finite: bool | None = None,
) -> Callable:
    """Like ``jax.grad``; every ``bppsa.scan`` inside ``fun`` uses ``method``, ``memory_limit``
    and ``check_finite`` (see :func:`value_and_grad`).

    Example:
        >>> loss = lambda w: bppsa.scan(lambda h, x: (jnp.tanh(w * h + x), None), 0.0, xs)[0]
        >>> bppsa.grad(loss)(0.5) == bppsa.grad(loss, method="sequential")(0.5)
    """
    value_and_grad_fun = value_and_grad(
        fun, argnums, has_aux, method=method, memory_limit=memory_limit, check_finite=check_finite
    )

    @functools.wraps(fun)
    def wrapped(*args, **kwargs):
        value, g = value_and_grad_fun(*args, **kwargs)
        return (g, value[1]) if has_aux else g

    return wrapped
