"""Element-level data flow through a jaxpr: which carry elements each element may depend on.

Every value of the jaxpr gets an int32 array ``sets: (*shape, s)``: for each of its elements,
the packed-carry indices it may depend on, padded with ``-1`` (``s`` is small, at most
``max_block``). A code ``>= n`` means "depends on everything": ``n + r`` for the ``r``-th reason
in :attr:`Flow.reasons`, so the answer says which primitive made it dense. A set that would pass
``max_block`` becomes such a code, so no value ever costs more than ``max_block`` ints per
element (never ``n x n``).

The pass is conservative (a set may hold an index the derivative does not need, never miss one)
and exact where it is cheap: it follows JAX's own autodiff, so values of integer or boolean dtype
(predicates, indices) have no derivative and an empty set; a moved element keeps its set
(slices, transposes, concatenations, stacks, pads and slices at constant offsets); elementwise
primitives take the union of their operands'; ``dot_general`` and reductions the union over the
contracted or reduced axes. A call with its own derivative rule is read by its rule: a
``custom_jvp`` call through the jaxpr of its rule's JVP
(:func:`bppsa.scan._core.jaxprs.rules.jvp_jaxpr`, its tangents in the operands' place), a
``custom_vjp`` call, whose backward cannot be read, as depending on everything. Everything else
(gather, scatter, loops, callbacks, primitives not listed here, parameters not understood, a
rule that cannot be traced) makes its outputs depend on everything.

The primitives are named by the kinds of :mod:`bppsa.scan._core.jaxprs.taxonomy`, which the
other analyses of jaxprs share (the quasi-Newton diagonal's element-aligned paths, the fused
kernel's padded rules and lanes); the tables below say which kinds this one reads.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np
from jax.extend.core import Literal

from bppsa.scan._core.jaxprs import rules, taxonomy

EMPTY = -1

# The primitives handled, from the taxonomy: every elementwise one (a union of the operands'
# sets) but the integer bit operations, which act on integers only (no derivative, so no set:
# an equation no set flows into is skipped before its rule is looked up); every reduction and
# cumulative one (a union along axes); the calls evaluated in place (but ``remat``, which this
# table never held: no primitive of the JAX this project pins) and a cond's branches; the
# calls with their own rules, read by their rules. The moves, the contraction ``dot_general``,
# ``sort``, ``stop_gradient`` and ``optimization_barrier`` have a rule each in ``_RULES``
# below (every move of the taxonomy but ``expand_dims``, no primitive either). Anything else
# (``conv_general_dilated``, loops, gathers, scatters, callbacks, sharding annotations)
# makes its outputs depend on everything.
ELEMENTWISE = taxonomy.ELEMENTWISE - taxonomy.INTEGER_BITS
REDUCTIONS = taxonomy.REDUCTIONS
CUMULATIVE = taxonomy.CUMULATIVE
CALLS = {name: key for name, key in taxonomy.CALLS.items() if name != "remat"}


def empty(shape: Sequence[int]) -> np.ndarray:
    return np.zeros((*shape, 0), np.int32)


def widen(sets: np.ndarray, s: int) -> np.ndarray:
    """``sets`` padded with ``-1`` to ``s`` entries per element."""
    pad = s - sets.shape[-1]
    return (
        sets
        if pad == 0
        else np.concatenate([sets, np.full((*sets.shape[:-1], pad), EMPTY, np.int32)], -1)
    )


def _is_float(aval: Any) -> bool:  # extended dtypes (PRNG keys) are not numpy's: no derivative
    return hasattr(aval, "dtype") and jax.dtypes.issubdtype(aval.dtype, np.inexact)


class Flow:
    """One analysis: ``n`` packed carry indices, sets bounded by ``max_block``."""

    def __init__(self, n: int, max_block: int):
        self.n, self.max_block = n, max_block
        self.reasons: list[str] = []
        self.primitive = ""  # the equation being analysed, named in reasons
        self.equation: Any = None

    def code(self, reason: str) -> int:
        if reason not in self.reasons:
            self.reasons.append(reason)
        return self.n + self.reasons.index(reason)

    def everything(self, shape: Sequence[int], reason: str) -> np.ndarray:
        return np.broadcast_to(np.int32(self.code(reason)), (*shape, 1))  # a view: no copy

    def normalize(self, sets: np.ndarray, cause: str) -> np.ndarray:
        """Each element's set without repeats, as few columns as possible; a set holding a
        code keeps only its first code, and one past ``max_block`` becomes a code."""
        if sets.shape[-1] <= 1:
            return sets
        sets = np.sort(sets, axis=-1)
        repeat = sets[..., 1:] == sets[..., :-1]
        sets[..., 1:][repeat] = EMPTY
        codes = sets >= self.n
        if codes.any():
            first = np.where(codes, sets, np.iinfo(np.int32).max).min(-1, keepdims=True)
            sets = np.where(codes.any(-1, keepdims=True) & (sets != first), EMPTY, sets)
        count = (sets >= 0).sum(-1)
        over = count > self.max_block
        if over.any():
            code = self.code(f"{cause} mixes more than {self.max_block} units")
            sets = np.where(over[..., None], EMPTY, sets)
            sets[..., 0] = np.where(over, code, sets[..., 0])
            count = np.where(over, 1, count)
        return -np.sort(-sets, axis=-1)[..., : count.max(initial=0)]

    def union(self, operands: Sequence[np.ndarray], shape: Sequence[int], cause: str):
        parts = [np.broadcast_to(o, (*shape, o.shape[-1])) for o in operands if o.shape[-1]]
        if not parts:
            return empty(shape)
        if len(parts) == 1:
            return parts[0]
        return self.normalize(np.concatenate(parts, -1), cause)

    def over_axes(self, sets: np.ndarray, axes: Sequence[int], cause: str) -> np.ndarray:
        """The union over ``axes`` (which are removed)."""
        rank = sets.ndim - 1
        kept = [d for d in range(rank) if d not in axes]
        moved = np.transpose(sets, (*kept, *axes, rank))
        lead = moved.shape[: len(kept)]
        return self.normalize(moved.reshape(*lead, math.prod(moved.shape[len(kept) :])), cause)

    def run(self, jaxpr, consts: Sequence[Any], sets: Sequence, values: Sequence) -> list:
        """The sets of ``jaxpr``'s outputs given its inputs' ``sets`` (and their ``values``
        where known constants, else ``None``)."""
        env: dict[Any, np.ndarray] = {}
        known: dict[Any, Any] = {}
        for v, c in zip(jaxpr.constvars, consts):
            env[v], known[v] = empty(v.aval.shape), c
        for v, s, value in zip(jaxpr.invars, sets, values):
            env[v], known[v] = s, value

        def read(v):
            return empty(v.aval.shape) if isinstance(v, Literal) else env[v]

        def known_value(v):
            return v.val if isinstance(v, Literal) else known.get(v)

        for eqn in jaxpr.eqns:
            ins = [read(v) for v in eqn.invars]
            shapes = [v.aval.shape for v in eqn.outvars]
            if all(s.shape[-1] == 0 for s in ins):  # no carry flows in
                outs = [empty(shape) for shape in shapes]
            else:
                outs = self.apply(eqn, ins, [known_value(v) for v in eqn.invars], shapes)
            for v, s, shape in zip(eqn.outvars, outs, shapes):
                env[v] = s if _is_float(v.aval) else empty(shape)
        return [read(v) for v in jaxpr.outvars]

    def apply(self, eqn, ins: list, values: list, shapes: list) -> list:
        name = self.primitive = eqn.primitive.name
        self.equation = eqn
        rule = _rule(name)
        if rule is None:
            return [self.everything(shape, f"unknown primitive {name}") for shape in shapes]
        try:
            outs = rule(self, eqn.params, ins, values, shapes)
        except Exception:  # parameters this module does not understand: safe, dense
            outs = None
        if outs is None or [o.shape[:-1] for o in outs] != [tuple(s) for s in shapes]:
            return [
                self.everything(shape, f"{name} with parameters not understood") for shape in shapes
            ]
        return outs


def _rule(name: str) -> Callable | None:
    if name in ELEMENTWISE:
        return _elementwise
    if name in REDUCTIONS:
        return _reduction
    if name in CALLS or name in taxonomy.BRANCHES:
        return _call
    if name in taxonomy.JVP_RULES:
        return _jvp_rule
    if name in taxonomy.VJP_RULES:
        return _vjp_rule
    return _RULES.get(name)


def _elementwise(flow, params, ins, values, shapes):
    return [flow.union(ins, shapes[0], flow.primitive)]


def _reduction(flow, params, ins, values, shapes):
    return [flow.over_axes(ins[0], tuple(params["axes"]), flow.primitive)]


def _call(flow: Flow, params, ins, values, shapes):
    if "branches" in params:  # cond: the index has no derivative; any branch may run
        branches, ins, values = params["branches"], ins[1:], values[1:]
    else:
        branches = [next(params[key] for key in ("jaxpr", "call_jaxpr") if key in params)]
    results = []
    for branch in branches:
        jaxpr, consts = (branch.jaxpr, branch.consts) if hasattr(branch, "consts") else (branch, ())
        results.append(flow.run(jaxpr, consts, ins, values))
    return [flow.union(outs, shape, "cond") for shape, *outs in zip(shapes, *results)]


def _jvp_rule(flow: Flow, params, ins, values, shapes):
    """A ``custom_jvp`` call: its outputs' tangents depend on its operands' through its rule."""
    eqn = flow.equation
    try:
        closed, float_in, float_out = rules.jvp_jaxpr(eqn)
    except Exception as error:  # a rule that cannot be traced: dense, never a guess
        cause = f"the custom_jvp rule of {rules.name(eqn)} could not be traced ({error})"
        return [flow.everything(shape, cause[:200]) for shape in shapes]
    primals = [empty(shape) for shape in (v.aval.shape for v in eqn.invars)]
    tangents = [sets for sets, f in zip(ins, float_in) if f]
    known = [*values, *[None] * len(tangents)]
    outs = iter(flow.run(closed.jaxpr, closed.consts, [*primals, *tangents], known))
    return [next(outs) if f else empty(shape) for shape, f in zip(shapes, float_out)]


def _vjp_rule(flow: Flow, params, ins, values, shapes):
    """A ``custom_vjp`` call: its backward is only ever called, never read."""
    cause = f"the jax.custom_vjp function {rules.name(flow.equation)}, whose backward is opaque"
    return [flow.everything(shape, cause) for shape in shapes]


def _broadcast_in_dim(flow, params, ins, values, shapes):
    if len(ins) != 1:  # dynamic shapes
        return None
    (sets,), shape = ins, params["shape"]
    expanded = [1] * len(shape)
    for i, d in enumerate(params["broadcast_dimensions"]):
        expanded[d] = sets.shape[i]
    return [np.broadcast_to(sets.reshape(*expanded, -1), (*shape, sets.shape[-1]))]


def _reshape(flow, params, ins, values, shapes):
    if params.get("dimensions") is not None or len(ins) != 1:
        return None
    return [ins[0].reshape(*shapes[0], ins[0].shape[-1])]


def _squeeze(flow, params, ins, values, shapes):  # C order is kept: a reshape
    return [ins[0].reshape(*shapes[0], ins[0].shape[-1])]


def _transpose(flow, params, ins, values, shapes):
    return [np.transpose(ins[0], (*params["permutation"], ins[0].ndim - 1))]


def _rev(flow, params, ins, values, shapes):
    return [np.flip(ins[0], tuple(params["dimensions"]))]


def _slice(flow, params, ins, values, shapes):
    strides = params["strides"] or (1,) * len(params["start_indices"])
    index = map(slice, params["start_indices"], params["limit_indices"], strides)
    return [ins[0][tuple(index)]]


def _concatenate(flow, params, ins, values, shapes):
    s = max(o.shape[-1] for o in ins)
    return [np.concatenate([widen(o, s) for o in ins], params["dimension"])]


def _stack(flow, params, ins, values, shapes):
    s = max(o.shape[-1] for o in ins)
    return [np.stack([widen(o, s) for o in ins], params["axis"])]


def _split(flow, params, ins, values, shapes):
    return np.split(ins[0], np.cumsum(params["sizes"])[:-1], params["axis"])


def _pad(flow, params, ins, values, shapes):
    s = max(o.shape[-1] for o in ins)
    sets, fill = widen(ins[0], s), widen(ins[1], s)
    out = np.array(np.broadcast_to(fill, (*shapes[0], s)))
    targets, sources = [], []
    for size, out_size, (lo, _, interior) in zip(sets.shape, shapes[0], params["padding_config"]):
        at = lo + np.arange(size) * (interior + 1)
        kept = (at >= 0) & (at < out_size)
        targets.append(at[kept])
        sources.append(np.nonzero(kept)[0])
    out[np.ix_(*targets)] = sets[np.ix_(*sources)]
    return [out]


def _starts(values, sizes, limits):
    """Constant start indices, clamped the way XLA clamps them, or None if any is not known."""
    try:
        starts = [int(v) for v in values if np.ndim(v) == 0]
    except TypeError:  # None, or a tracer closed over from an enclosing trace
        return None
    if len(starts) != len(values):
        return None
    return [min(max(a, 0), limit - size) for a, size, limit in zip(starts, sizes, limits)]


def _dynamic_slice(flow, params, ins, values, shapes):
    sizes = params["slice_sizes"]
    starts = _starts(values[1:], sizes, ins[0].shape)
    if starts is None:
        return [flow.everything(shapes[0], "dynamic_slice at a runtime index")]
    return [ins[0][tuple(slice(a, a + size) for a, size in zip(starts, sizes))]]


def _dynamic_update_slice(flow, params, ins, values, shapes):
    sets, update = ins[0], ins[1]
    starts = _starts(values[2:], update.shape[:-1], sets.shape[:-1])
    if starts is None:
        return [flow.everything(shapes[0], "dynamic_update_slice at a runtime index")]
    s = max(sets.shape[-1], update.shape[-1])
    out = np.array(widen(sets, s))
    out[tuple(slice(a, a + size) for a, size in zip(starts, update.shape[:-1]))] = widen(update, s)
    return [out]


def _dot_general(flow, params, ins, values, shapes):
    (contract_l, contract_r), (batch_l, batch_r) = params["dimension_numbers"]
    lhs, rhs = ins
    free_l = lhs.ndim - 1 - len(contract_l) - len(batch_l)
    free_r = rhs.ndim - 1 - len(contract_r) - len(batch_r)
    lhs = flow.over_axes(lhs, tuple(contract_l), "dot_general")  # (batch?, free_l, s) unordered
    rhs = flow.over_axes(rhs, tuple(contract_r), "dot_general")
    lhs = _batch_first(lhs, batch_l, contract_l)
    rhs = _batch_first(rhs, batch_r, contract_r)
    nb = len(batch_l)
    lhs = lhs.reshape(*lhs.shape[: nb + free_l], *[1] * free_r, lhs.shape[-1])
    rhs = rhs.reshape(*rhs.shape[:nb], *[1] * free_l, *rhs.shape[nb:])
    return [flow.union([lhs, rhs], shapes[0], "dot_general")]


def _batch_first(reduced: np.ndarray, batch: Sequence[int], contract: Sequence[int]) -> np.ndarray:
    """``reduced`` (an operand without its contracted axes) with its batch axes first, in the
    order of ``batch``, then its free axes in order: dot_general's output layout."""
    kept = [d for d in range(reduced.ndim - 1 + len(contract)) if d not in contract]
    position = {d: i for i, d in enumerate(kept)}
    batch_axes = [position[d] for d in batch]
    free_axes = [i for i in range(len(kept)) if i not in batch_axes]
    return np.transpose(reduced, (*batch_axes, *free_axes, reduced.ndim - 1))


def _along(flow: Flow, ins, axis: int, shape, cause: str) -> np.ndarray:
    """Every element depends on the union of all operands along ``axis``."""
    reduced = [flow.over_axes(o, (axis,), cause) for o in ins]
    merged = flow.union(reduced, reduced[0].shape[:-1], cause)
    expanded = np.expand_dims(merged, axis)
    return np.broadcast_to(expanded, (*shape, merged.shape[-1]))


def _cumulative(flow, params, ins, values, shapes):  # conservative: the whole axis, not a prefix
    return [_along(flow, ins, params["axis"], shapes[0], flow.primitive)]


def _sort(flow, params, ins, values, shapes):
    out = _along(flow, ins, params["dimension"], shapes[0], "sort")
    return [out] * len(shapes)


def _stop_gradient(flow, params, ins, values, shapes):
    return [empty(shapes[0])]


def _identity(flow, params, ins, values, shapes):
    return list(ins)


_RULES: dict[str, Callable] = {
    "broadcast_in_dim": _broadcast_in_dim,
    "reshape": _reshape,
    "squeeze": _squeeze,
    "transpose": _transpose,
    "rev": _rev,
    "slice": _slice,
    "concatenate": _concatenate,
    "stack": _stack,
    "split": _split,
    "pad": _pad,
    "dynamic_slice": _dynamic_slice,
    "dynamic_update_slice": _dynamic_update_slice,
    "dot_general": _dot_general,
    "sort": _sort,
    "stop_gradient": _stop_gradient,
    "optimization_barrier": _identity,
    **dict.fromkeys(CUMULATIVE, _cumulative),
}
