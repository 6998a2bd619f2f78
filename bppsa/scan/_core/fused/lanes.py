"""Independent lanes of the carry: the recurrence split across the kernel's programs.

A cell whose units see only their own past (ParaRNN's diagonal GRU, the CIFG LSTM over its
``(h_i, c_i)`` pairs, IndRNN) runs the same recurrence in every lane ``i`` of its carry, apart
from the other lanes. One program per example would then run ``H`` lanes on one streaming
multiprocessor; split into tiles of lanes, ``H = 4096`` runs on every one of them.

Algorithm summary. :func:`lanes_of` follows one axis of every carry leaf (its *lanes*, all of
the same size ``L``) through the recurrence's equations: an elementwise operation keeps it in
place, a broadcast, a transpose, a squeeze or a reduction over other axes moves it, a
contraction keeps it where it is a batch axis of both operands or a free axis of one (the other
then holds no lanes). Anything that would mix lanes (a reduction or contraction over them, a
move along them, a reshape of them) means the lanes are not independent: the analysis says why.
The residuals the recurrence reads take the lane axis of their first use (one that holds no
lanes is read whole by every program). :func:`tiled` traces the recurrence again with the lanes
cut to ``tile``: the kernel runs that tile's recurrence in each program of a grid over the
tiles, the lanes past ``L`` in the last tile computed and discarded.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import jax
from jax.extend.core import Literal

from bppsa.scan._core.fused.backend import CANNOT
from bppsa.scan._core.fused.padded import ELEMENTWISE, pow2
from bppsa.scan._core.jaxprs.walk import bind

# none of the operand's axes holds lanes (the value is the same for every lane)
NONE = None


@dataclasses.dataclass(frozen=True, eq=False)
class Tiled:
    """A recurrence traced for one tile of lanes, in the shape the kernel reads a split's.

    Attributes:
        carry_in, carry_out: the tile's carry variables (leaves in order).
        constant_residuals, step_residuals: the tile's residual variables, in the order of the
            split's.
        recurrence: the tile's equations.
        axes: the lane axis of each of ``carry_in``, ``constant_residuals`` and
            ``step_residuals`` (in that order; ``None``: no lanes, read whole), per step for
            the step residuals (without their leading ``T``).
        size: ``L``, the lanes of the whole carry.
        tile: lanes per program (a power of two).
    """

    carry_in: tuple
    carry_out: tuple
    constant_residuals: tuple
    step_residuals: tuple
    recurrence: tuple
    axes: tuple
    size: int
    tile: int

    @property
    def count(self) -> int:
        """Programs per example: tiles of ``tile`` lanes covering ``L``."""
        return -(-self.size // self.tile)


def lanes_of(split, carry_axes: Sequence[int] | None = None) -> dict | str:
    """The lane axis of every variable of ``split``'s recurrence (``None``: no lanes), or why
    its carry's lanes are not independent.

    Args:
        split: a :class:`~bppsa.scan._core.fused.split.Split` (or :class:`Tiled`: anything with
            ``carry_in``, ``carry_out``, ``constant_residuals``, ``step_residuals`` and
            ``recurrence``).
        carry_axes: the lane axis of each carry leaf (``None``: the last axis of each).
    """
    carry_in = list(split.carry_in)
    if carry_axes is None:
        carry_axes = [len(v.aval.shape) - 1 for v in carry_in]
    axes: dict[Any, Any] = {}
    sizes = set()
    for v, axis in zip(carry_in, carry_axes):
        if axis < 0:
            return "a scalar carry (no lanes)"
        axes[v] = axis
        sizes.add(v.aval.shape[axis])
    if len(sizes) != 1:
        return f"carry leaves with lanes of different sizes {sorted(sizes)}"
    (size,) = sizes
    residuals = set(split.constant_residuals) | set(split.step_residuals)
    state = _State(axes, residuals, size)
    for eqn in split.recurrence:
        reason = state.apply(eqn)
        if reason is not None:
            return reason
    for v_in, v_out in zip(carry_in, split.carry_out):
        if isinstance(v_out, Literal):
            return "a carry leaf that is a constant"
        reason = state.claim(v_out, axes[v_in])
        if reason is not None:
            return f"the new carry: {reason}"
    for v in residuals:
        axes.setdefault(v, NONE)
    return axes


class _State:
    """The lane axes found so far; residuals take the axis of their first use."""

    def __init__(self, axes: dict, residuals: set, size: int):
        self.axes, self.residuals, self.size = axes, residuals, size

    def claim(self, v, axis) -> str | None:
        """Sets or checks the lane axis of ``v`` (a residual not seen before takes ``axis``)."""
        if isinstance(v, Literal):
            return None if axis is NONE else "a constant where lanes are expected"
        if v not in self.axes:
            if v not in self.residuals:
                return f"a variable {v} of unknown lanes"
            if axis is not NONE and v.aval.shape[axis] != self.size:
                return f"an operand of shape {v.aval.shape} where lanes are expected"
            self.axes[v] = axis
            return None
        if self.axes[v] != axis:
            return f"lanes on axis {self.axes[v]} of an operand where {axis} is expected"
        return None

    def known(self, v):
        return NONE if isinstance(v, Literal) else self.axes.get(v, "unknown")

    def apply(self, eqn) -> str | None:
        name = eqn.primitive.name
        rule = _RULES.get(name)
        if rule is None and name not in ELEMENTWISE:
            return f"the primitive {name!r} (its lanes are not followed)"
        out = (rule or _elementwise)(self, eqn)
        if isinstance(out, str):
            return f"{out} in the primitive {name!r}"
        for v, axis in zip(eqn.outvars, out):
            self.axes[v] = axis
        return None


def _elementwise(state: _State, eqn):
    """Lanes stay in place; an operand of the same rank holds them where its axis is as long
    as the output's, and is the same for every lane where it is 1 long (broadcast)."""
    shape = eqn.outvars[0].aval.shape
    found = {state.known(v) for v in eqn.invars} - {"unknown", NONE}
    if len(found) != 1:
        return "operands with lanes on different axes" if found else "no operand with lanes"
    (axis,) = found
    for v in eqn.invars:
        own = v.aval.shape
        full = len(own) == len(shape) and own[axis] == shape[axis]
        reason = state.claim(v, axis if full else NONE)
        if reason is not None:
            return reason
    return [axis] * len(eqn.outvars)


def _single(state: _State, eqn):
    axis = state.known(eqn.invars[0])
    if axis in (NONE, "unknown"):
        return "an operand with no lanes"
    return axis


def _broadcast_in_dim(state: _State, eqn):
    axis = _single(state, eqn)
    if isinstance(axis, str):
        return axis
    out = eqn.params["broadcast_dimensions"][axis]
    return [out]


def _squeeze(state: _State, eqn):
    axis = _single(state, eqn)
    if isinstance(axis, str):
        return axis
    return [axis - sum(d < axis for d in eqn.params["dimensions"])]


def _reshape(state: _State, eqn):
    axis = _single(state, eqn)
    if isinstance(axis, str):
        return axis
    before, after = eqn.invars[0].aval.shape, eqn.outvars[0].aval.shape
    kept_before = [d for d, n in enumerate(before) if n != 1]
    kept_after = [d for d, n in enumerate(after) if n != 1]
    if [before[d] for d in kept_before] != [after[d] for d in kept_after]:
        return "a reshape of the lanes"
    return [kept_after[kept_before.index(axis)]]


def _transpose(state: _State, eqn):
    axis = _single(state, eqn)
    if isinstance(axis, str):
        return axis
    return [list(eqn.params["permutation"]).index(axis)]


def _reduce(state: _State, eqn):
    axis = _single(state, eqn)
    if isinstance(axis, str):
        return axis
    if axis in eqn.params["axes"]:
        return "a reduction over the lanes"
    return [axis - sum(d < axis for d in eqn.params["axes"])]


def _identity(state: _State, eqn):
    axis = _single(state, eqn)
    return axis if isinstance(axis, str) else [axis]


def _same_axis_moves(state: _State, eqn):
    """``slice``, ``rev``, ``pad``, ``concatenate``, ``split`` along other axes than lanes."""
    axis = _single(state, eqn)
    if isinstance(axis, str):
        return axis
    name, params = eqn.primitive.name, eqn.params
    shape = eqn.invars[0].aval.shape
    along = {
        "slice": lambda: {
            d
            for d in range(len(shape))
            if params["start_indices"][d] != 0
            or params["limit_indices"][d] != shape[d]
            or (params["strides"] or (1,) * len(shape))[d] != 1
        },
        "rev": lambda: set(params["dimensions"]),
        "pad": lambda: {d for d, c in enumerate(params["padding_config"]) if any(c)},
        "concatenate": lambda: {params["dimension"]},
        "split": lambda: {params["axis"]},
    }[name]()
    if axis in along:
        return "a move along the lanes"
    for v in eqn.invars[1:]:
        reason = state.claim(v, axis if name == "concatenate" else NONE)
        if reason is not None:
            return reason
    return [axis] * len(eqn.outvars)


def _dot_general(state: _State, eqn):
    """Lanes on a batch axis of both operands, or on a free axis of one (the other holding
    none); the output's axes are the batch axes, then the left's free axes, then the right's."""
    (lc, rc), (lb, rb) = eqn.params["dimension_numbers"]
    lhs, rhs = eqn.invars
    lf = [d for d in range(len(lhs.aval.shape)) if d not in lc and d not in lb]
    rf = [d for d in range(len(rhs.aval.shape)) if d not in rc and d not in rb]
    # each side as (operand, its contracting, batch and free axes, the output's first free axis)
    left, right = (lhs, lc, lb, lf, len(lb)), (rhs, rc, rb, rf, len(lb) + len(lf))
    for (own, contracting, batch, free, first), (other, _, other_batch, _, _) in (
        (left, right),
        (right, left),
    ):
        axis = state.known(own)
        if axis in (NONE, "unknown"):
            continue
        if axis in contracting:
            return "a contraction over the lanes"
        if axis in batch:
            at = list(batch).index(axis)
            return state.claim(other, other_batch[at]) or [at]
        return state.claim(other, NONE) or [first + free.index(axis)]
    return "no operand with lanes"


_RULES = {
    "broadcast_in_dim": _broadcast_in_dim,
    "squeeze": _squeeze,
    "reshape": _reshape,
    "transpose": _transpose,
    "reduce_sum": _reduce,
    "reduce_max": _reduce,
    "reduce_min": _reduce,
    "argmax": _reduce,
    "argmin": _reduce,
    "reshard": _identity,
    "sharding_constraint": _identity,
    "dot_general": _dot_general,
    "slice": _same_axis_moves,
    "rev": _same_axis_moves,
    "pad": _same_axis_moves,
    "concatenate": _same_axis_moves,
    "split": _same_axis_moves,
}


def tiled(split, axes: dict, tile: int) -> Tiled:
    """``split``'s recurrence traced again with every lane axis ``tile`` long."""
    size = next(v.aval.shape[axes[v]] for v in split.carry_in)
    inputs = [*split.carry_in, *split.constant_residuals, *split.step_residuals]

    def cut(v):
        shape = list(v.aval.shape)
        if axes[v] is not NONE:
            shape[axes[v]] = tile
        return jax.ShapeDtypeStruct(tuple(shape), v.aval.dtype)

    def recurrence(*args):
        env = dict(zip(inputs, args))

        def read(v):
            return v.val if isinstance(v, Literal) else env[v]

        for eqn in split.recurrence:
            outs = bind(eqn, *[read(v) for v in eqn.invars], **_cut_params(eqn, axes, tile))
            env.update(zip(eqn.outvars, outs))
        return [read(v) for v in split.carry_out]

    closed = jax.make_jaxpr(recurrence)(*[cut(v) for v in inputs])
    jaxpr = closed.jaxpr
    if jaxpr.constvars:
        raise ValueError("the tile's recurrence holds array constants")
    nc, nk = len(split.carry_in), len(split.constant_residuals)
    return Tiled(
        carry_in=tuple(jaxpr.invars[:nc]),
        carry_out=tuple(jaxpr.outvars),
        constant_residuals=tuple(jaxpr.invars[nc : nc + nk]),
        step_residuals=tuple(jaxpr.invars[nc + nk :]),
        recurrence=tuple(jaxpr.eqns),
        axes=tuple(axes[v] for v in inputs),
        size=size,
        tile=tile,
    )


def _cut_params(eqn, axes: dict, tile: int) -> dict:
    """The shape parameters of ``eqn`` with its output's lane axis ``tile`` long."""
    out = eqn.outvars[0]
    axis = axes.get(out, NONE)
    if axis is NONE:
        return {}
    name = eqn.primitive.name
    if name == "broadcast_in_dim":
        shape = list(eqn.params["shape"])
        shape[axis] = tile
        return {"shape": tuple(shape)}
    if name == "reshape":
        sizes = list(eqn.params["new_sizes"])
        sizes[axis] = tile
        return {"new_sizes": tuple(sizes)}
    if name == "slice":  # whole along the lanes, which keep their axis
        limits = list(eqn.params["limit_indices"])
        limits[axis] = tile
        return {"limit_indices": tuple(limits)}
    return {}


def split_lanes(split, lanes: int | None) -> Tiled | None:
    """``split``'s recurrence for one tile of ``lanes`` lanes (the next power of two) where
    its carry's lanes are independent and more than ``lanes``; ``None``: one program per
    example (``lanes=None``, lanes that mix, or a rule that does not retrace)."""
    if lanes is None or not split.carry_in:
        return None
    try:
        axes = lanes_of(split)
        if isinstance(axes, str):
            return None
        first = split.carry_in[0]
        if first.aval.shape[axes[first]] <= lanes:
            return None
        return tiled(split, axes, pow2(lanes))
    except CANNOT:  # a rule that does not retrace: one program per example
        return None
