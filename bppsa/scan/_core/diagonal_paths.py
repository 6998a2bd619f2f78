"""The diagonal of a dense cell's Jacobian without forming it: its element-aligned paths.

Quasi-Newton (``bppsa.Newton(quasi=True)``) needs only the diagonal of every step's Jacobian
``d h_t / d h_{t-1}``. For a cell whose Jacobian is dense, forming it costs ``n`` products with
the cell per step (``n^3`` for an ``n x n`` weight) just to keep ``n`` numbers. :func:`diagonal`
keeps what the cheap part of the cell says instead: it re-evaluates the cell's jaxpr with every
operation that MIXES elements of its operands (a product with a weight matrix, a reduction, a
gather, a loop, anything not listed below) cut from the derivative (``stop_gradient`` on its
inputs), except that a product ``W u`` of a carry-dependent ``u`` with a square weight ``W`` keeps
its own diagonal term ``diag(W) * u`` (also with ``k`` gates' weights stacked, see
:func:`_dot_general`). The derivative of what is left goes only through
elementwise operations and moves of elements, one product's diagonal at most on each path:

* for the usual cells (Elman, GRU, LSTM, with their gates' weights stacked or not: every path
  from ``h_{t-1}`` to ``h_t`` passes at most one product with a weight) it is EXACTLY the
  diagonal of the Jacobian (tested against ``jax.jacfwd``);
* for others (two products in a row, normalizations) it drops the terms of the diagonal that
  pass those mixes: an approximation, which quasi-Newton tolerates (its iterations converge
  more slowly) and the Newton forward certifies (the same residual test of every step, the
  same sequential fallback).

The left-over derivative is diagonal or block-diagonal with small blocks (an LSTM's ``c -> h``
path pairs element ``j`` of ``h`` with element ``j`` of ``c``), which the dependency analysis of
:mod:`bppsa.scan._core.structure` finds: a VJP per colour, ``O(n)`` per step on top of evaluating
the cell. Elsewhere (an element moved to another position, e.g. a reversed carry) the caller
forms the full Jacobian as before.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax
from jax.extend.core import Literal

from bppsa.scan._core.element_flow import CALLS, ELEMENTWISE
from bppsa.scan._core.jaxprs import taxonomy
from bppsa.scan._core.jaxprs.walk import bind

# Primitives whose outputs' elements each come from the elements at the same position of their
# operands, or are moved copies of them: kept as they are (with their derivatives). From the
# taxonomy: the elementwise ones the element flow reads (whose dependency analysis then finds
# the diagonal), the moves (but ``stack``, never listed here: a stacked carry-dependent value
# is cut, and the diagonal's terms through it dropped), ``optimization_barrier`` and
# ``stop_gradient``, whose values pass unchanged (the sharding annotations are not listed:
# cut like a mix).
ALIGNED = (
    ELEMENTWISE
    | (taxonomy.MOVES - {"stack"})
    | (taxonomy.ANNOTATIONS & {"optimization_barrier"})
    | taxonomy.STOP_GRADIENT
)


def diagonal(fn: Callable) -> Callable:
    """``fn`` (pytrees in, pytrees out) with the same values and the derivative of its
    element-aligned paths only (see the module docstring)."""

    def cut(*args):
        flat, tree = jax.tree.flatten(args)
        closed, out_shape = jax.make_jaxpr(
            lambda *leaves: fn(*tree.unflatten(leaves)), return_shape=True
        )(*flat)
        outs = _run(closed.jaxpr, closed.consts, flat, [True] * len(flat))[0]
        return jax.tree.unflatten(jax.tree.structure(out_shape), outs)

    return cut


def _run(jaxpr, consts, args, tracked) -> tuple[list, list]:
    """Evaluates ``jaxpr`` with the mixing operations cut; ``tracked`` says which inputs depend
    on the carry (only those need cutting). Returns the outputs and whether each depends on it."""
    env: dict[Any, Any] = {}
    depends: dict[Any, bool] = {}
    for v, c in zip(jaxpr.constvars, consts, strict=True):
        env[v], depends[v] = c, False
    for v, a, t in zip(jaxpr.invars, args, tracked, strict=True):
        env[v], depends[v] = a, t

    def read(v):
        return v.val if isinstance(v, Literal) else env[v]

    def dependent(v):
        return False if isinstance(v, Literal) else depends[v]

    for eqn in jaxpr.eqns:
        ins = [read(v) for v in eqn.invars]
        deps = [dependent(v) for v in eqn.invars]
        outs, out_deps = _apply(eqn, ins, deps)
        for v, value, d in zip(eqn.outvars, outs, out_deps, strict=True):
            env[v], depends[v] = value, d
    return [read(v) for v in jaxpr.outvars], [dependent(v) for v in jaxpr.outvars]


def _apply(eqn, ins, deps) -> tuple[list, list]:
    name = eqn.primitive.name
    if not any(deps) or name in ALIGNED:
        outs = bind(eqn, *ins)
        return outs, [any(deps)] * len(outs)
    if name in taxonomy.JVP_RULES:  # its own rule, kept: the structure analysis reads it
        outs = bind(eqn, *ins)
        return outs, [True] * len(outs)
    if name in CALLS:
        jaxpr, consts = _called(eqn)
        return _run(jaxpr, consts, ins, deps)  # its operations cut one by one
    if name == "dot_general":
        return [_dot_general(eqn, ins, deps)], [True]
    # Anything else mixes elements (or is not understood, a custom_vjp call's opaque backward
    # among them): evaluated without the derivative.
    outs = bind(eqn, *_cut(ins, deps))
    return outs, [False] * len(outs)


def _cut(ins, deps) -> list:
    """``ins`` with the carry-dependent ones (``deps``) cut from the derivative."""
    return [lax.stop_gradient(x) if d else x for x, d in zip(ins, deps, strict=True)]


def _called(eqn) -> tuple[Any, Any]:
    """The jaxpr a call primitive runs, and its constants."""
    inner = next(eqn.params[key] for key in ("jaxpr", "call_jaxpr") if key in eqn.params)
    return (inner.jaxpr, inner.consts) if hasattr(inner, "consts") else (inner, ())


def _dot_general(eqn, ins, deps):
    """The product without the derivative of its carry-dependent operand ``u``, plus, against
    a weight ``W`` that does not depend on the carry, the term whose derivative is ``W``'s
    diagonal: ``W`` of ``m = k n`` rows (``k`` gates stacked) by the ``n`` elements of ``u``
    pairs output element ``i`` with element ``i mod n`` of ``u``, ``d_i = W[i, i mod n]``, and
    the term is ``d`` times ``k`` copies of ``u`` (for ``k = 1`` simply ``diag(W) * u``)."""
    (out,) = bind(eqn, *_cut(ins, deps))
    if deps[0] == deps[1]:
        return out
    (contract_l, contract_r), (batch_l, _) = eqn.params["dimension_numbers"]
    u_right = deps[1]  # W @ u: the carry-dependent operand is on the right
    w, u = (ins[0], ins[1]) if u_right else (ins[1], ins[0])
    w_contract, u_contract = (contract_l, contract_r) if u_right else (contract_r, contract_l)
    if batch_l or w.ndim != 2 or len(w_contract) != 1 or len(u_contract) != 1:
        return out
    # The output keeps u's layout, its contracted axis (u's first for W @ u, its last for
    # u @ W) stretched k-fold: then output element i pairs with element i mod n of u.
    axis = 0 if u_right else u.ndim - 1
    n, m = w.shape[w_contract[0]], w.shape[1 - w_contract[0]]
    if u_contract[0] != axis or m % n or out.shape != (*u.shape[:axis], m, *u.shape[axis + 1 :]):
        return out
    rows = jnp.arange(m)
    d = jnp.moveaxis(w, w_contract[0], 1)[rows, rows % n].astype(out.dtype)
    d = d.reshape(m, *[1] * (u.ndim - 1)) if u_right else d
    term = d * jnp.concatenate([u.astype(out.dtype)] * (m // n), axis=axis)
    return out + (term - lax.stop_gradient(term))
