"""``bppsa.scan``: ``jax.lax.scan`` with a parallel-scan backward pass (BPPSA)."""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable
from typing import TypeVar

import jax
import jax.numpy as jnp
from jax import lax
from jax.custom_derivatives import SymbolicZero

from bppsa import _arguments, _debug, _forward_mode, _memory
from bppsa._batching import vmapped_batch_size
from bppsa._carry import Layout, is_float, unstacked, zero_cotangent
from bppsa.jacobians._capture import has_analytic_jacobian, with_jacobian
from bppsa.jacobians._stacked import steps_with_jacobians
from bppsa.scan import Auto, Method, Sequential, resolve

Carry = TypeVar("Carry")
X = TypeVar("X")
Y = TypeVar("Y")


def scan(
    f: Callable[[Carry, X], tuple[Carry, Y]],
    init: Carry,
    xs: X | None = None,
    length: int | None = None,
    reverse: bool = False,
    *,
    method: Method | str | None = None,
    memory_limit: float | None = None,
    check_finite: bool | None = None,
) -> tuple[Carry, Y]:
    """Scans ``f`` over ``xs`` exactly like ``jax.lax.scan``; the backward pass is a parallel scan.

    The forward pass is sequential (``lax.scan``). Its reverse-mode derivative, instead of
    back-propagating step by step, builds the transposed Jacobian ``d carry_t / d carry_{t-1}``
    of every step at once (from the cell's analytic builder when the body is a cell of
    :mod:`bppsa.models`, else by autodiff on the flattened float leaves of the carry), scans them
    with ``method`` (BPPSA: Wang, Bai & Pekhimenko, MLSys 2020) to get every carry cotangent, and
    then gets the cotangents of ``xs``, ``init`` and closed-over arrays with one VJP of ``f``
    vmapped over all steps. Cotangents may arrive on every ``y_t`` and on the final carry.

    Args:
        f: ``f(carry, x) -> (carry, y)``; the carry keeps its pytree structure, shapes and dtypes.
        init: initial carry (any pytree; integer and boolean leaves get no gradient).
        xs: pytree of arrays scanned along their leading axis, or ``None`` (then give ``length``).
        length: number of steps; must agree with ``xs``.
        reverse: scan from the end of ``xs`` to its start, as in ``lax.scan``.
        method: backward method, e.g. ``bppsa.Blelloch()`` or ``"sequential"``. ``None`` uses
            the method of the enclosing :func:`bppsa.grad`, else ``bppsa.Auto()``.
        memory_limit: bytes the backward pass of this scan may use (``None``: the limit of the
            enclosing :func:`bppsa.grad`, else the default device's available memory;
            ``math.inf``: no check). When the backward is traced, the method's memory is
            estimated for this scan (``T``, the carry and Jacobian sizes, the dtype and the
            ``jax.vmap`` batch it is traced under); over the limit, ``bppsa.Auto()`` falls back
            to a lower-memory method and an explicit method raises
            :class:`bppsa.MemoryLimitError`, which lists the alternatives that fit.
        check_finite: if True, the backward pass raises ``FloatingPointError`` when a Jacobian
            or cotangent holds a NaN or infinity, naming (as indices into ``xs``) the earliest
            step whose Jacobian is not finite and the latest step where a non-finite cotangent
            arises (see :mod:`bppsa._debug`). ``None``: the setting of the enclosing
            :func:`bppsa.grad`, else False. Without it, non-finite values propagate as in
            ``jax.grad``.

    Returns:
        ``(final carry, stacked ys)``, identical to ``jax.lax.scan``.

    Raises:
        TypeError, ValueError: for arguments ``jax.lax.scan`` rejects (in its words), a carry
            with complex leaves and an explicit parallel method, or a bad option.
        MemoryLimitError: (when the backward pass is traced) see ``memory_limit``.

    Works under ``jax.jit``, ``jax.vmap`` (batch by vmapping a scan over one example) and
    reverse mode of any order. With a parallel method, forward mode (``jax.jvp``,
    ``jax.jacfwd``) raises a ``TypeError``; ``method="sequential"`` is plain ``lax.scan`` and
    supports every transformation.

    Example:
        >>> cell = lambda h, x: (jnp.tanh(w @ h + x), h)
        >>> h_last, hs = bppsa.scan(cell, h0, xs)
    """
    method = resolve(method)
    limit = _memory.resolve_limit(memory_limit)
    check = _debug.resolve(check_finite)
    if not callable(f):
        raise TypeError(f"bppsa.scan: f argument should be a callable, got {type(f).__name__}.")
    length = _arguments.check_arguments(init, xs, length)
    out_shape = _arguments.check_like_lax_scan(f, init, xs, length, reverse)
    method = _arguments.refuse_complex(method, init)
    if not method.uses_jacobians:
        return lax.scan(f, init, xs, length=length, reverse=reverse)

    init = _arguments.promote_weak_types(init, out_shape[0])
    num_steps = _arguments.num_steps(xs, length)
    x_example = jax.tree.map(unstacked, xs)
    analytic = has_analytic_jacobian(f, init, x_example)
    step, consts = jax.closure_convert(with_jacobian(f, analytic), init, x_example)
    if isinstance(method, Auto):
        # Auto()'s choice depends on a step's Jacobian and on the vmap batch the scan is traced
        # under: plain back-propagation when the batch is large.
        batch = vmapped_batch_size((init, xs))
        fp = _footprint(step, init, xs, consts, num_steps, analytic, batch)
        if not _memory.auto_method(method.choose, fp).uses_jacobians:
            return lax.scan(f, init, xs, length=length, reverse=reverse)
    if reverse:
        xs = jax.tree.map(lambda x: jnp.flip(x, axis=0), xs)
    _forward_mode.refuse(method, (init, xs, consts))

    options = _Options(method, limit, check, reverse)
    run = _differentiable_scan(step, options, num_steps, init, analytic)
    carry, ys = run(consts, init, xs)
    if reverse:
        ys = jax.tree.map(lambda y: jnp.flip(y, axis=0), ys)
    return carry, ys


def _footprint(step, init, xs, consts, num_steps: int, analytic: bool, batch: int):
    """What the memory guard and ``Auto()`` know of a scan, from the shapes of its Jacobians."""
    layout = Layout.of(init, concat_last=analytic)
    carries = jax.tree.map(lambda a: jax.ShapeDtypeStruct((num_steps, *a.shape), a.dtype), init)
    _, jac_t = jax.eval_shape(steps_with_jacobians(step, layout, analytic), consts, carries, xs)
    return _memory.footprint(
        jac_t,
        state=sum(math.prod(shape) for shape in layout.shapes),
        length=num_steps,
        itemsize=jnp.dtype(layout.dtype).itemsize,
        batch=batch,
    )


def estimate_memory(
    f: Callable[[Carry, X], tuple[Carry, Y]],
    init: Carry,
    xs: X | None = None,
    length: int | None = None,
    *,
    method: Method | str | None = None,
    batch: int = 1,
) -> int:
    """Estimated peak bytes of ``bppsa.scan(f, init, xs, length)``'s forward and backward.

    The model that the memory guard of :func:`scan` uses (see ``memory_limit`` there): the
    carries kept for the backward, the stacked Jacobians and per-step arrays of one time block,
    and the dense products of the parallel scans; fitted to XLA's memory analysis on CPU.

    Args:
        f, init, xs, length: as for :func:`scan`; arrays or ``jax.ShapeDtypeStruct``.
        method: the backward method (default ``bppsa.Auto()``, as it would choose on the
            default backend; ``"sequential"``: plain back-propagation, roughly).
        batch: examples the scan is ``jax.vmap``-ed over.

    Returns:
        Bytes.

    Example:
        >>> spec = jax.ShapeDtypeStruct((30_000, 1), jnp.float32)
        >>> bppsa.estimate_memory(body, jnp.zeros(20), spec, method="blelloch", batch=16)
    """
    method = resolve(method)
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise ValueError(f"batch must be a positive int, got {batch!r}.")
    length = _arguments.check_arguments(init, xs, length)
    out_shape = _arguments.check_like_lax_scan(f, init, xs, length, False)
    method = _arguments.refuse_complex(method, init)
    init = _arguments.promote_weak_types(init, out_shape[0])
    num_steps = _arguments.num_steps(xs, length)
    x_example = jax.tree.map(unstacked, xs)
    analytic = has_analytic_jacobian(f, init, x_example)
    step, consts = jax.closure_convert(with_jacobian(f, analytic), init, x_example)
    fp = _footprint(step, init, xs, consts, num_steps, analytic, batch)
    return _memory.estimate(method if method.uses_jacobians else Sequential(), fp)


@dataclasses.dataclass(frozen=True)
class _Options:
    """What the backward pass of one scan was asked for (fixed when the scan is traced)."""

    method: Method
    limit: float | None  # bytes; None: the default device's available memory
    check: bool  # check_finite
    reverse: bool


def _differentiable_scan(step, options: _Options, num_steps: int, init, analytic: bool):
    """``(consts, init, xs) -> (carry, ys)`` with BPPSA as its VJP.

    ``step(carry, x, *consts) -> (carry, y, jac_t)`` is the closure-converted body; ``jac_t`` is
    the analytic transposed Jacobian of the step, or ``None``.
    """
    layout = Layout.of(init, concat_last=analytic)
    init = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), init)

    def forward(consts, init, xs, keep_carries: bool):
        def body(carry, x):
            new_carry, y, _ = step(carry, x, *consts)
            return new_carry, (y, carry) if keep_carries else y

        return lax.scan(body, init, xs, length=num_steps)

    all_steps = steps_with_jacobians(step, layout, analytic)

    @jax.custom_vjp
    def run(consts, init, xs):
        return forward(consts, init, xs, keep_carries=False)

    def run_fwd(consts, init, xs):
        consts, init, xs = jax.tree.map(lambda p: p.value, (consts, init, xs))
        carry, (ys, carries_before) = forward(consts, init, xs, keep_carries=True)
        return (carry, ys), (consts, xs, carries_before)

    def run_bwd(residuals, cotangents):
        consts, xs, carries_before = residuals
        ct_carry, ct_ys = cotangents
        (_, ys_shape), jac_shape = jax.eval_shape(all_steps, consts, carries_before, xs)
        if all(isinstance(ct, SymbolicZero) for ct in jax.tree.leaves(ct_ys)):
            ct_ys = None  # only the final carry receives a cotangent
        else:
            ct_ys = _instantiate_tree(ct_ys, ys_shape)
        if not any(math.prod(shape) for shape in layout.shapes):
            # Nothing in the carry is differentiable (no float leaves, or only empty ones): the
            # cotangents come from the outputs alone.
            ct_consts, ct_xs = _steps_vjp(all_steps, consts, carries_before, xs, ct_ys)
            return ct_consts, layout.zeros(init), ct_xs
        g_last = layout.pack(_instantiate_tree(ct_carry, init))
        method = _memory.fit(
            options.method,
            _memory.footprint(
                jac_shape,
                state=math.prod(g_last.shape),
                length=num_steps,
                itemsize=jnp.dtype(g_last.dtype).itemsize,
                batch=vmapped_batch_size(residuals),
            ),
            options.limit,
        )
        span = functools.partial(_span_backward, all_steps, method, layout, consts, options.check)
        block = method.block_size(num_steps)
        if block is None or block >= num_steps:
            g_first, ct_consts, ct_xs, flags = span(carries_before, xs, g_last, ct_ys)
        else:
            g_first, ct_consts, ct_xs, flags = _blocked(
                span, block, consts, carries_before, xs, g_last, ct_ys
            )
        if options.check:
            _debug.report(flags, g_last, options.reverse)
        return ct_consts, layout.unpack(g_first, init), ct_xs

    run.defvjp(run_fwd, run_bwd, symbolic_zeros=True)
    return run


def _instantiate(ct, like):
    """A real array for a symbolic-zero cotangent (``float0`` for integer leaves)."""
    return zero_cotangent(like) if isinstance(ct, SymbolicZero) else ct


def _instantiate_tree(cts, like):
    return jax.tree.map(_instantiate, cts, like, is_leaf=lambda x: isinstance(x, SymbolicZero))


def _vjp_without_carries(all_steps, consts, carries_before, xs):
    """``jax.vjp`` of all steps w.r.t. consts and xs only (carries held fixed), with Jacobians."""
    return jax.vjp(
        lambda consts, xs: all_steps(consts, carries_before, xs), consts, xs, has_aux=True
    )


def _steps_vjp(all_steps, consts, carries_before, xs, ct_ys):
    """Cotangents of consts and xs from those of every step's ``y`` (none on the carries)."""
    (carries_after, ys), vjp, _ = _vjp_without_carries(all_steps, consts, carries_before, xs)
    ct_ys = jax.tree.map(zero_cotangent, ys) if ct_ys is None else ct_ys
    return vjp((jax.tree.map(zero_cotangent, carries_after), ct_ys))


def _span_backward(all_steps, method, layout, consts, check, carries_before, xs, g_end, ct_ys):
    """Back-propagates ``g_end`` through a span of steps.

    One evaluation of all the span's steps at once (parallel in t) gives their VJP and their
    transposed Jacobians; ``method`` scans the Jacobians; the VJP then gives the cotangents of
    consts (summed over the steps) and xs. Returns ``(g_start, ct_consts, ct_xs, flags)``, with
    ``flags`` the steps' finiteness flags (:mod:`bppsa._debug`) if ``check``, else ``None``.
    """
    if ct_ys is None:  # no VJP w.r.t. the carries is needed
        (carries_after, ys), vjp, jac_t = _vjp_without_carries(
            all_steps, consts, carries_before, xs
        )
        ct_ys = jax.tree.map(zero_cotangent, ys)
        offsets = None
    else:
        (carries_after, _), vjp_all, jac_t = jax.vjp(
            all_steps, consts, carries_before, xs, has_aux=True
        )
        _, from_ys, _ = vjp_all((jax.tree.map(zero_cotangent, carries_after), ct_ys))
        offsets = layout.pack(from_ys, stacked=True)

        def vjp(cts):
            ct_consts, _, ct_xs = vjp_all(cts)
            return ct_consts, ct_xs

    g = method.scan(g_end, jac_t, offsets)  # [g_start, ..., g_end]
    ct_consts, ct_xs = vjp((layout.unpack(g[1:], carries_before, stacked=True), ct_ys))
    flags = _debug.step_flags(jac_t, g, offsets) if check else None
    return g[0], ct_consts, ct_xs, flags


def _blocked(span, block, consts, carries_before, xs, g_last, ct_ys):
    """:func:`_span_backward` over time blocks of ``block`` steps, from the last block back.

    Every block is still evaluated all steps at once, but its arrays stay small enough for the
    cache: on CPUs, streaming ``T``-long arrays through memory costs more than the loop.
    """
    num_steps = jax.tree.leaves(carries_before)[0].shape[0]
    head, blocks = num_steps % block, num_steps // block

    def split(a):
        return a[head:].reshape(blocks, block, *a.shape[1:])

    def one_block(carry, inputs):
        g, total = carry
        g, ct_consts, ct_xs, flags = span(*inputs[:2], g, inputs[2])
        total = jax.tree.map(jnp.add, total, ct_consts)
        return (g, total), (jax.tree.map(_float0_as_placeholder, ct_xs), flags)

    first = jax.tree.map(split, (carries_before, xs, ct_ys))
    zeros = jax.tree.map(jnp.zeros_like, consts)  # consts are float: their cotangents match
    (g, ct_consts), (ct_xs, flags) = lax.scan(one_block, (g_last, zeros), first, reverse=True)
    ct_xs, flags = jax.tree.map(lambda c: c.reshape(-1, *c.shape[2:]), (ct_xs, flags))
    if head:
        g, ct_head, ct_xs_head, flags_head = span(
            *jax.tree.map(lambda a: a[:head], (carries_before, xs)),
            g,
            jax.tree.map(lambda a: a[:head], ct_ys),
        )
        ct_consts = jax.tree.map(jnp.add, ct_consts, ct_head)
        ct_xs, flags = jax.tree.map(
            lambda a, b: jnp.concatenate([a, b]),
            (jax.tree.map(_float0_as_placeholder, ct_xs_head), flags_head),
            (ct_xs, flags),
        )
    ct_xs = jax.tree.map(_restore_float0, ct_xs, xs)
    return g, ct_consts, ct_xs, flags


def _float0_as_placeholder(ct):
    """``lax.scan`` cannot stack ``float0`` cotangents: carry a same-shaped bool instead."""
    return jnp.zeros(ct.shape, bool) if ct.dtype == jax.dtypes.float0 else ct


def _restore_float0(ct, x):
    return zero_cotangent(x) if not is_float(x) else ct
