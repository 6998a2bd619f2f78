"""Building blocks of a Jacobian-based backward pass, shared by the methods.

A method that scans transposed Jacobians back-propagates a span of steps with
:func:`span_backward` (one evaluation of all its steps at once gives their VJP and their
Jacobians; the method's linear scan gives the carry cotangents; the VJP gives those of the
constants and ``xs``). :func:`blocked` runs a span backward over time blocks, from the last block
back, so that the per-step arrays stay in cache.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from jax import Array, lax

from bppsa.scan._core import debug
from bppsa.scan._core.carry import BatchedLayout, Layout, is_float, zero_cotangent

# (g_end, linear maps, offsets | None) -> [g_start, ..., g_end]: a method's linear scan.
LinearScan = Callable[[Array, Any, Array | None], Array]


def vjp_without_carries(all_steps, consts, carries_before, xs):
    """``jax.vjp`` of all steps w.r.t. consts and xs only (carries held fixed), with Jacobians."""
    return jax.vjp(
        lambda consts, xs: all_steps(consts, carries_before, xs), consts, xs, has_aux=True
    )


def steps_vjp(all_steps, consts, carries_before, xs, ct_ys):
    """Cotangents of consts and xs from those of every step's ``y`` (none on the carries)."""
    (carries_after, ys), vjp, _ = vjp_without_carries(all_steps, consts, carries_before, xs)
    ct_ys = jax.tree.map(zero_cotangent, ys) if ct_ys is None else ct_ys
    return vjp((jax.tree.map(zero_cotangent, carries_after), ct_ys))


def linearize_steps(
    all_steps: Callable,
    layout: Layout | BatchedLayout,
    consts,
    carries_before,
    xs,
    ct_ys,
    jac_t=None,
):
    """One evaluation of all the steps of a span: their transposed Jacobians, the offsets that
    the outputs' cotangents ``ct_ys`` send to the carries, and the VJP w.r.t. consts and xs.

    ``jac_t``: the Jacobians, if the forward already has them at these carries (then
    ``all_steps`` need not form them: see :meth:`bppsa.scan._core.problem.Problem.all_steps`).

    Returns:
        ``(jac_t, offsets, vjp, ct_ys)``: ``offsets`` is ``None`` without ``ct_ys`` (then no VJP
        w.r.t. the carries is needed); ``vjp((carry_cotangents, ct_ys)) -> (ct_consts, ct_xs)``;
        ``ct_ys`` with zeros filled in.
    """
    if ct_ys is None:
        (carries_after, ys), vjp_consts_xs, formed = vjp_without_carries(
            all_steps, consts, carries_before, xs
        )
        jac_t = formed if jac_t is None else jac_t
        return jac_t, None, vjp_consts_xs, jax.tree.map(zero_cotangent, ys)
    (carries_after, _), vjp_all, formed = jax.vjp(
        all_steps, consts, carries_before, xs, has_aux=True
    )
    _, from_ys, _ = vjp_all((jax.tree.map(zero_cotangent, carries_after), ct_ys))

    def vjp(cts):
        ct_consts, _, ct_xs = vjp_all(cts)
        return ct_consts, ct_xs

    jac_t = formed if jac_t is None else jac_t
    return jac_t, layout.pack(from_ys, stacked=True), vjp, ct_ys


def span_backward(
    scan: LinearScan,
    all_steps: Callable,
    layout: Layout | BatchedLayout,
    consts,
    check: bool,
    carries_before,
    xs,
    g_end: Array,
    ct_ys,
    jac_t=None,
):
    """Back-propagates ``g_end`` through a span of steps.

    One evaluation of all the span's steps at once (parallel in t) gives their VJP and their
    transposed Jacobians (:func:`linearize_steps`; ``jac_t``: the Jacobians the forward
    already has, then ``all_steps`` does not form them); ``scan`` turns the Jacobians into carry
    cotangents; the VJP then gives the cotangents of consts (summed over the steps) and xs.

    Returns:
        ``(g_start, ct_consts, ct_xs, flags)``, with ``flags`` the steps' finiteness flags
        (:mod:`bppsa.scan._core.debug`) if ``check``, else ``None``.
    """
    jac_t, offsets, vjp, ct_ys = linearize_steps(
        all_steps, layout, consts, carries_before, xs, ct_ys, jac_t
    )
    g = scan(g_end, jac_t, offsets)  # [g_start, ..., g_end]
    ct_consts, ct_xs = vjp((layout.unpack(g[1:], carries_before, stacked=True), ct_ys))
    flags = debug.step_flags(jac_t, g, offsets) if check else None
    return g[0], ct_consts, ct_xs, flags


def blocked(span: Callable, block: int, consts, carries_before, xs, g_last, ct_ys):
    """``span(carries_before, xs, g_end, ct_ys)`` over time blocks of ``block`` steps, from the
    last block back (a shorter first block when ``block`` does not divide ``T``).

    Every block is still evaluated all steps at once, but its arrays stay small enough for the
    cache: on CPUs, streaming ``T``-long arrays through memory costs more than the loop. The
    loop slices each block out of the full arrays (``lax.dynamic_slice``) rather than scanning
    over a ``(blocks, block, ...)`` reshape of them: that reshape of all but the first block is
    a copy of the forward's carries (at ``T = 10k, B = 16, H = 20`` 12 MB more temporary memory
    and about a fifth of the backward's time on a CPU).
    """
    num_steps = jax.tree.leaves(carries_before)[0].shape[0]
    if block >= num_steps:
        return span(carries_before, xs, g_last, ct_ys)
    head, blocks = num_steps % block, num_steps // block

    def one_block(carry, k):
        g, total = carry
        start = head + k * block
        inputs = jax.tree.map(
            lambda a: lax.dynamic_slice_in_dim(a, start, block), (carries_before, xs, ct_ys)
        )
        g, ct_consts, ct_xs, flags = span(*inputs[:2], g, inputs[2])
        total = jax.tree.map(jnp.add, total, ct_consts)
        return (g, total), (jax.tree.map(float0_as_placeholder, ct_xs), flags)

    zeros = jax.tree.map(jnp.zeros_like, consts)  # consts are float: their cotangents match
    (g, ct_consts), (ct_xs, flags) = lax.scan(
        one_block, (g_last, zeros), jnp.arange(blocks), reverse=True
    )
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
            (jax.tree.map(float0_as_placeholder, ct_xs_head), flags_head),
            (ct_xs, flags),
        )
    ct_xs = jax.tree.map(restore_float0, ct_xs, xs)
    return g, ct_consts, ct_xs, flags


def float0_as_placeholder(ct):
    """``lax.scan`` cannot stack ``float0`` cotangents: carry a same-shaped bool instead."""
    return jnp.zeros(ct.shape, bool) if ct.dtype == jax.dtypes.float0 else ct


def restore_float0(ct, x):
    return zero_cotangent(x) if not is_float(x) else ct
