"""Slices of products pushed into the products' constant operands (a jaxpr rewrite).

A gated cell computes all its gates in one product with the carry and then slices it:
``g = W_hh h + b``; ``r, z, n = split(g)``. Inside the kernel a slice is a move (a selection
over the padded lanes, :mod:`bppsa.scan._core.fused.padded`), costlier than the product itself.
:func:`push_slices` rewrites every static ``slice`` / ``split`` of a product whose sliced axes
belong to an operand that does not depend on the carry (``W_hh``) into a product with the sliced
operand, through elementwise operations whose other operands do not depend on the carry either
(``+ b``): ``split(W h + b) -> [W_r h + b_r, W_z h + b_z, W_n h + b_n]``, the slices of ``W``
and ``b`` left outside the loop. Other uses of the product keep it whole.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
from jax import lax
from jax.extend.core import ClosedJaxpr, Literal

from bppsa.scan._core.fused.padded import ELEMENTWISE
from bppsa.scan._core.jaxprs.walk import bind

Index = tuple[tuple[int, int, int], ...]  # (start, stop, stride) per axis


def _take(x, index: Index):
    if all(
        start == 0 and stop == n and stride == 1 for (start, stop, stride), n in zip(index, x.shape)
    ):
        return x
    starts, stops, strides = zip(*index)
    return lax.slice(x, starts, stops, strides)


@dataclasses.dataclass
class _Lazy:
    """A value not formed yet: ``make(index)`` forms the part ``index`` of it, where
    ``sliceable(index)`` says that part comes without a move inside the loop. Each part is
    formed once (:meth:`part`)."""

    shape: tuple[int, ...]
    make: Callable[[Index], Any]
    sliceable: Callable[[Index], bool]
    parts: dict = dataclasses.field(default_factory=dict)

    def part(self, index: Index):
        if index not in self.parts:
            self.parts[index] = self.make(index)
        return self.parts[index]

    def whole(self):
        return self.part(tuple((0, n, 1) for n in self.shape))


def _dot(eqn, args, on_carry):
    (lc, rc), (lb, rb) = eqn.params["dimension_numbers"]
    lhs, rhs = args
    nl, nr = lhs.ndim, rhs.ndim
    lf = [d for d in range(nl) if d not in lc and d not in lb]
    rf = [d for d in range(nr) if d not in rc and d not in rb]
    # output axis -> [(operand, axis)]
    owners = [[(0, a), (1, b)] for a, b in zip(lb, rb)]
    owners += [[(0, a)] for a in lf] + [[(1, a)] for a in rf]

    def sliceable(index):
        return all(
            not on_carry[op]
            for axis, (start, stop, stride) in enumerate(index)
            if (start, stop, stride) != (0, eqn.outvars[0].aval.shape[axis], 1)
            for op, _ in owners[axis]
        )

    def make(index):
        operand_index = [[(0, n, 1) for n in lhs.shape], [(0, n, 1) for n in rhs.shape]]
        for axis, part in enumerate(index):
            for op, a in owners[axis]:
                operand_index[op][a] = part
        return bind(eqn, _take(lhs, tuple(operand_index[0])), _take(rhs, tuple(operand_index[1])))[
            0
        ]

    return _Lazy(tuple(eqn.outvars[0].aval.shape), make, sliceable)


def _elementwise(eqn, args, lazy, on_carry):
    shape = tuple(eqn.outvars[0].aval.shape)

    def part(a, is_lazy, index):
        if is_lazy:
            return a.part(index)
        return a if getattr(a, "ndim", 0) == 0 else _take(a, index)

    def sliceable(index):
        return all(
            a.sliceable(index) if is_lazy else (getattr(a, "ndim", 0) == 0 or not dep)
            for a, is_lazy, dep in zip(args, lazy, on_carry)
        )

    def make(index):
        return bind(eqn, *(part(a, z, index) for a, z in zip(args, lazy)))[0]

    return _Lazy(shape, make, sliceable)


def _slices(eqn) -> list[Index] | None:
    shape = eqn.invars[0].aval.shape
    if eqn.primitive.name == "slice":
        strides = eqn.params["strides"] or (1,) * len(shape)
        return [tuple(zip(eqn.params["start_indices"], eqn.params["limit_indices"], strides))]
    axis, start, out = eqn.params["axis"], 0, []
    for size in eqn.params["sizes"]:
        out.append(
            tuple((start, start + size, 1) if d == axis else (0, n, 1) for d, n in enumerate(shape))
        )
        start += size
    return out


def push_slices(closed: ClosedJaxpr, num_carry: int) -> ClosedJaxpr:
    """``closed`` (flat) with slices of products pushed into their constant operands."""
    jaxpr = closed.jaxpr
    on_carry_vars = set(jaxpr.invars[:num_carry])
    for eqn in jaxpr.eqns:
        if any(v in on_carry_vars for v in eqn.invars if not isinstance(v, Literal)):
            on_carry_vars.update(eqn.outvars)

    def dep(v):
        return not isinstance(v, Literal) and v in on_carry_vars

    def run(*args):
        env = dict(zip(jaxpr.constvars, closed.consts))
        env.update(zip(jaxpr.invars, args))

        def read(v, force=True):
            value = v.val if isinstance(v, Literal) else env[v]
            return value.whole() if force and isinstance(value, _Lazy) else value

        for eqn in jaxpr.eqns:
            name = eqn.primitive.name
            raw = [read(v, force=False) for v in eqn.invars]
            lazy = [isinstance(a, _Lazy) for a in raw]
            deps = [dep(v) for v in eqn.invars]
            if name in ("slice", "split") and lazy[0]:
                parts = _slices(eqn)
                if all(raw[0].sliceable(p) for p in parts):
                    env.update(zip(eqn.outvars, [raw[0].part(p) for p in parts]))
                    continue
            if name == "dot_general" and any(deps) and not all(deps):
                env[eqn.outvars[0]] = _dot(eqn, [read(v) for v in eqn.invars], deps)
                continue
            if name in ELEMENTWISE and any(lazy) and len(eqn.outvars) == 1:
                same = all(
                    getattr(a, "shape", ()) in ((), tuple(eqn.outvars[0].aval.shape)) for a in raw
                )
                if same:
                    env[eqn.outvars[0]] = _elementwise(eqn, raw, lazy, deps)
                    continue
            env.update(zip(eqn.outvars, bind(eqn, *[read(v) for v in eqn.invars])))
        return [read(v) for v in jaxpr.outvars]

    shapes = [jax.ShapeDtypeStruct(v.aval.shape, v.aval.dtype) for v in jaxpr.invars]
    return jax.make_jaxpr(run)(*shapes)
