"""``bppsa.scan``: ``jax.lax.scan`` with a parallel-scan backward pass (BPPSA)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TypeVar

import jax
import jax.numpy as jnp
from jax import lax
from jax.custom_derivatives import SymbolicZero

from bppsa import _forward_mode
from bppsa._carry import Layout, is_float, unstacked, zero_cotangent
from bppsa.jacobians._capture import has_analytic_jacobian, with_jacobian
from bppsa.jacobians._stacked import steps_with_jacobians
from bppsa.scan import Method, resolve

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

    Returns:
        ``(final carry, stacked ys)``, identical to ``jax.lax.scan``.

    Works under ``jax.jit``, ``jax.vmap`` (batch by vmapping a scan over one example) and
    reverse mode of any order. With a parallel method, forward mode (``jax.jvp``,
    ``jax.jacfwd``) raises a ``TypeError``; ``method="sequential"`` is plain ``lax.scan`` and
    supports every transformation.

    Example:
        >>> cell = lambda h, x: (jnp.tanh(w @ h + x), h)
        >>> h_last, hs = bppsa.scan(cell, h0, xs)
    """
    method = resolve(method)
    if not callable(f):
        raise TypeError(f"bppsa.scan: f argument should be a callable, got {type(f).__name__}.")
    out_shape = _check_like_lax_scan(f, init, xs, length, reverse)
    if not method.uses_jacobians:
        return lax.scan(f, init, xs, length=length, reverse=reverse)

    init = _promote_weak_types(init, out_shape[0])
    num_steps = _num_steps(xs, length)
    if reverse:
        xs = jax.tree.map(lambda x: jnp.flip(x, axis=0), xs)
    x_example = jax.tree.map(unstacked, xs)

    analytic = has_analytic_jacobian(f, init, x_example)
    step, consts = jax.closure_convert(with_jacobian(f, analytic), init, x_example)
    _forward_mode.refuse(method, (init, xs, consts))

    run = _differentiable_scan(step, method, num_steps, init, analytic)
    carry, ys = run(consts, init, xs)
    if reverse:
        ys = jax.tree.map(lambda y: jnp.flip(y, axis=0), ys)
    return carry, ys


def _check_like_lax_scan(f, init, xs, length, reverse):
    """Runs ``lax.scan``'s own checks (shape-only), so errors read exactly like its errors."""
    try:
        return jax.eval_shape(
            lambda i, x: lax.scan(f, i, x, length=length, reverse=reverse), init, xs
        )
    except (TypeError, ValueError) as err:
        if type(err) not in (TypeError, ValueError):
            raise
        raise type(err)(f"bppsa.scan: {err}") from None


def _promote_weak_types(init, carry_out):
    """Casts weakly typed init leaves (Python scalars) to the carry dtype, as lax.scan does."""
    return jax.tree.map(lambda x, out: jnp.asarray(x, out.dtype), init, carry_out)


def _num_steps(xs, length) -> int:
    leaves = jax.tree.leaves(xs)
    return int(length) if length is not None else leaves[0].shape[0]


def _differentiable_scan(step, method: Method, num_steps: int, init, analytic: bool):
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
        if all(isinstance(ct, SymbolicZero) for ct in jax.tree.leaves(ct_ys)):
            ct_ys = None  # only the final carry receives a cotangent
        else:
            ys_shape = jax.eval_shape(all_steps, consts, carries_before, xs)[0][1]
            ct_ys = _instantiate_tree(ct_ys, ys_shape)
        if not any(layout.float_mask):  # nothing in the carry is differentiable
            ct_consts, ct_xs = _steps_vjp(all_steps, consts, carries_before, xs, ct_ys)
            return ct_consts, layout.zeros(init), ct_xs
        span = functools.partial(_span_backward, all_steps, method, layout, consts)
        g_last = layout.pack(_instantiate_tree(ct_carry, init))
        block = method.block_size(num_steps)
        if block is None or block >= num_steps:
            g_first, ct_consts, ct_xs = span(carries_before, xs, g_last, ct_ys)
        else:
            g_first, ct_consts, ct_xs = _blocked(
                span, block, consts, carries_before, xs, g_last, ct_ys
            )
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


def _span_backward(all_steps, method, layout, consts, carries_before, xs, g_end, ct_ys):
    """Back-propagates ``g_end`` through a span of steps.

    One evaluation of all the span's steps at once (parallel in t) gives their VJP and their
    transposed Jacobians; ``method`` scans the Jacobians; the VJP then gives the cotangents of
    consts (summed over the steps) and xs. Returns ``(g_start, ct_consts, ct_xs)``.
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
    return g[0], ct_consts, ct_xs


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
        g, ct_consts, ct_xs = span(*inputs[:2], g, inputs[2])
        total = jax.tree.map(jnp.add, total, ct_consts)
        return (g, total), jax.tree.map(_float0_as_placeholder, ct_xs)

    first = jax.tree.map(split, (carries_before, xs, ct_ys))
    zeros = jax.tree.map(jnp.zeros_like, consts)  # consts are float: their cotangents match
    (g, ct_consts), ct_xs = lax.scan(one_block, (g_last, zeros), first, reverse=True)
    ct_xs = jax.tree.map(lambda c: c.reshape(-1, *c.shape[2:]), ct_xs)
    if head:
        g, ct_head, ct_xs_head = span(
            *jax.tree.map(lambda a: a[:head], (carries_before, xs)),
            g,
            jax.tree.map(lambda a: a[:head], ct_ys),
        )
        ct_consts = jax.tree.map(jnp.add, ct_consts, ct_head)
        ct_xs = jax.tree.map(
            lambda a, b: jnp.concatenate([a, b]),
            jax.tree.map(_float0_as_placeholder, ct_xs_head),
            ct_xs,
        )
    ct_xs = jax.tree.map(_restore_float0, ct_xs, xs)
    return g, ct_consts, ct_xs


def _float0_as_placeholder(ct):
    """``lax.scan`` cannot stack ``float0`` cotangents: carry a same-shaped bool instead."""
    return jnp.zeros(ct.shape, bool) if ct.dtype == jax.dtypes.float0 else ct


def _restore_float0(ct, x):
    return zero_cotangent(x) if not is_float(x) else ct
