"""``bppsa.grad`` and ``bppsa.value_and_grad``: ``jax.grad`` with the scan backward chosen here."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import jax

from bppsa.scan._core import debug, tracing
from bppsa.scan._core.asked import options_from
from bppsa.scan._core.forward import Forward
from bppsa.scan._core.methods import Method, Policy
from bppsa.scan._core.options import ambient
from bppsa.scan._precision import Precision


def value_and_grad(
    fun: Callable,
    argnums: int | Sequence[int] = 0,
    has_aux: bool = False,
    holomorphic: bool = False,
    allow_int: bool = False,
    *,
    method: Method | Policy | str | None = None,
    memory_limit: float | str | None = None,
    check_finite: bool | None = None,
    forward: Forward | str | None = None,
    precision: str | Precision | None = None,
    check_structure: bool | None = None,
    linear_vjp: bool | None = None,
) -> Callable[..., tuple[Any, Any]]:
    """Like ``jax.value_and_grad``; every ``bppsa.scan`` inside ``fun`` uses ``method``.

    Args:
        fun: function to differentiate; its ``bppsa.scan`` calls that do not name their own
            method back-propagate with ``method``.
        argnums, has_aux, holomorphic, allow_int: as in ``jax.value_and_grad`` (with
            ``allow_int``, integer arguments get ``float0`` gradients; with ``holomorphic``,
            ``fun`` is complex and holomorphic in complex arguments).
        method: backward method object or name (``"auto"``, ``"blelloch"``, ``"blocked"``,
            ``"chunked"``, ``"fused-sequential"``, ``"sequential"``, ``"sequential-scan"``,
            ``"sharded"``; ``_`` or ``-`` alike); ``"sequential"`` is plain
            back-propagation, the reference; ``"auto"`` picks per scan (see
            :class:`bppsa.Auto`). ``None``: that of an enclosing ``bppsa.grad``, else
            ``"auto"``.
        memory_limit: bytes the backward pass of each scan inside may use (``None``: that of
            an enclosing ``bppsa.grad``, else the default device's memory; ``"available"``:
            what is free on it when ``bppsa.grad`` is called, read once); see
            :func:`bppsa.scan`.
        check_finite: raise ``FloatingPointError`` naming the first time step whose Jacobian
            or cotangent is not finite (``None``: that of an enclosing ``bppsa.grad``, else
            False); see :func:`bppsa.scan`.
        forward: the forward pass of each scan inside (``"sequential"``, ``"newton"`` or
            ``bppsa.Newton(...)``, ``"fused"`` or ``bppsa.Fused(...)``, ``"pipelined"`` or
            ``bppsa.Pipelined(mesh)``, or ``"auto"``; ``None``: that of an enclosing
            ``bppsa.grad``, else ``"auto"``, the forward's policy); see :func:`bppsa.scan`.
        precision: of the matrix products ``bppsa`` forms in each scan's derivatives
            (``"highest"``, ``"high"``, ``"default"``, a ``jax.lax.Precision`` or
            ``jax.lax.DotAlgorithmPreset``; ``None``: that of an enclosing ``bppsa.grad``, else
            ``"highest"``); the user's own products keep theirs. See :func:`bppsa.scan`.
        check_structure: ``True``: compare the Jacobians built in a structure found in a cell
            with dense ones at a few steps, raising ``ValueError`` on a missed entry; ``False``:
            no check; ``None``: that of an enclosing ``bppsa.grad``, else a cheap check at one
            step (two products with the step's VJP); see :func:`bppsa.scan`.
        linear_vjp: ``True`` declares that the backward of every ``jax.custom_vjp`` function
            the scans' carries reach is linear in its cotangent, so that any method may run
            (``None``: that of an enclosing ``bppsa.grad``, else False: such a scan
            back-propagates); see :func:`bppsa.scan`.

    Returns:
        A function with the signature and results of ``jax.value_and_grad(fun, ...)``.

    Raises:
        ValueError: for an unknown method name (listing the valid ones) or a limit <= 0.
        TypeError: for a method, limit, ``check_finite``, ``precision``, ``check_structure``
            or ``linear_vjp`` of the wrong type.

    The options reach the scans when ``fun`` is traced, also when ``fun`` (or a function it
    calls) is already ``jax.jit``-compiled: they are part of ``jax.jit``'s cache key, so such a
    function is traced again for other options rather than keeping those of its first trace.

    Example:
        >>> loss = jax.jit(lambda w: bppsa.scan(lambda h, x: (jnp.tanh(w * h + x), None), 0.0,
        ...                                     jnp.ones(9))[0])
        >>> with bppsa.trace_plans() as plans:
        ...     _ = bppsa.grad(loss, method="blelloch")(0.5)
        ...     _ = bppsa.grad(loss, method="sequential")(0.5)
        >>> [plan.method for plan in plans]
        [Blelloch(), Sequential()]
    """
    options = options_from(
        method,
        memory_limit,
        check_finite,
        forward,
        precision,
        check_structure=check_structure,
        linear_vjp=linear_vjp,
    )
    if not tracing.OPTIONS_IN_JIT_KEY and tracing.is_jitted(fun):  # pragma: no cover
        raise TypeError(
            "bppsa.grad cannot pass its options into a function that is already jax.jit-"
            "compiled on this JAX version (its cached trace would keep other options); pass "
            "the function before jitting it and jit the result: "
            "jax.jit(bppsa.grad(fun, ...))."
        )
    inner = jax.value_and_grad(
        fun, argnums=argnums, has_aux=has_aux, holomorphic=holomorphic, allow_int=allow_int
    )

    @functools.wraps(fun)
    def wrapped(*args, **kwargs):
        with ambient(options), debug.readable_errors():
            return inner(*args, **kwargs)

    return wrapped


def grad(
    fun: Callable,
    argnums: int | Sequence[int] = 0,
    has_aux: bool = False,
    holomorphic: bool = False,
    allow_int: bool = False,
    *,
    method: Method | Policy | str | None = None,
    memory_limit: float | str | None = None,
    check_finite: bool | None = None,
    forward: Forward | str | None = None,
    precision: str | Precision | None = None,
    check_structure: bool | None = None,
    linear_vjp: bool | None = None,
) -> Callable:
    """Like ``jax.grad`` (``argnums``, ``has_aux``, ``holomorphic`` and ``allow_int`` as
    there); every ``bppsa.scan`` inside ``fun`` uses ``method``, ``memory_limit``,
    ``check_finite``, ``forward``, ``precision``, ``check_structure`` and ``linear_vjp`` (see
    :func:`value_and_grad`, which lists the methods and forwards).

    Example:
        >>> xs = jnp.linspace(0.0, 1.0, 50)
        >>> loss = lambda w: bppsa.scan(lambda h, x: (jnp.tanh(w * h + x), None), 0.0, xs)[0]
        >>> bool(jnp.allclose(bppsa.grad(loss)(0.5), jax.grad(loss)(0.5)))
        True
    """
    value_and_grad_fun = value_and_grad(
        fun,
        argnums,
        has_aux,
        holomorphic,
        allow_int,
        method=method,
        memory_limit=memory_limit,
        check_finite=check_finite,
        forward=forward,
        precision=precision,
        check_structure=check_structure,
        linear_vjp=linear_vjp,
    )

    @functools.wraps(fun)
    def wrapped(*args, **kwargs):
        value, g = value_and_grad_fun(*args, **kwargs)
        return (g, value[1]) if has_aux else g

    return wrapped
