"""Sparse linear maps with a static pattern: the element of a scan over pruned layers.

:class:`Sparse` pairs a static :class:`~bppsa.scan._pattern.Pattern` (where the non-zeros are,
known before any data is seen) with traced values, shared by the batch (a convolution) or one
set per example (a ReLU), and speaks the element interface of :class:`bppsa.scan.Dense`.

Conventions (the same as :class:`bppsa.scan.Dense`): map ``k`` of a stack is a matrix
``A_k: (n_rows, n_cols)`` applied on the left of vectors of shape ``(*batch, n_cols)``. For a
layer ``y = f(x)`` the map is ``J^T``: ``n_cols`` is the size of ``y`` (the cotangent that
arrives), ``n_rows`` the size of ``x`` (the cotangent that leaves).

Products (:meth:`Sparse.then`, :meth:`Sparse.after`, :func:`compose`): sparse @ sparse is the
two-phase SpGEMM of :mod:`bppsa.scan._spgemm`, whose plan also decides when the output is stored
dense. A product of a sparse and a dense map (either order) gathers rows of the dense operand at
the sparse one's entries and never densifies the sparse operand; its result is dense.

The names of :mod:`bppsa.scan._pattern` and :mod:`bppsa.scan._spgemm` that other modules, tests
and benchmarks import from here are re-exported.
"""

from __future__ import annotations

import dataclasses
import math
from typing import ClassVar

import jax
import jax.numpy as jnp
from jax import Array

from bppsa.scan import _kernels
from bppsa.scan._elements import Dense, MapStack, matmul
from bppsa.scan._pattern import Pattern, expand_values

# Re-exported, besides those used here: bppsa.scan._chain, tests and benchmarks import them.
from bppsa.scan._spgemm import (  # noqa: F401
    METHODS,
    ProductPlan,
    _cached_plan,
    _pairs,
    _spmm_rows,
    plan_structures,
    product_plan,
    spgemm_values,
    thresholds,
)


def _sparse_then_dense(later: Sparse, earlier: Array) -> Array:
    """``E @ L`` with ``L`` sparse and ``E: (m, *batch, n0, n1)`` dense: the rows of ``E``
    times ``L``, i.e. ``E`` applied to by ``L^T`` row by row (gathers of ``E``'s columns)."""
    ndim = max(earlier.ndim, later.values.ndim + 1)
    transposed, order = later.pattern.transpose()
    return Sparse(later.values[..., order], transposed).apply_to_rows(expand_values(earlier, ndim))


def _dense_then_sparse(later: Array, earlier: Sparse) -> Array:
    """``E @ L`` with ``E`` sparse and ``L: (m, *batch, n1, n2)`` dense: ``(L^T E^T)^T``, the
    rows of ``L^T`` (columns of ``L``) gathered at ``E``'s entries."""
    ndim = max(later.ndim, earlier.values.ndim + 1)
    rows = earlier.apply_to_rows(jnp.swapaxes(expand_values(later, ndim), -1, -2))
    return jnp.swapaxes(rows, -1, -2)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Sparse(MapStack):
    """A stack of ``m`` sparse maps with one static :class:`Pattern` and traced values.

    Attributes:
        values: ``(m, *vbatch, nnz)``: ``(m, nnz)`` for maps shared by the batch (the values of
            a convolution's ``J^T``), ``(m, B, nnz)`` for one map per example (a ReLU's slopes).
            Missing or singleton batch dims broadcast against the vectors' batch.
        pattern: the positions, static.
    """

    values: Array
    pattern: Pattern = dataclasses.field(metadata=dict(static=True))

    per_step_fields: ClassVar[tuple[str, ...]] = ("values",)
    shared_fields: ClassVar[tuple[str, ...]] = ()

    def __post_init__(self):
        shape = getattr(self.values, "shape", None)
        if shape is not None and (len(shape) < 2 or shape[-1] != self.pattern.nnz):
            raise ValueError(
                f"Sparse values must have shape (m, *batch, {self.pattern.nnz}) for "
                f"{self.pattern}, got {tuple(shape)}."
            )

    @property
    def size(self) -> int:
        return self.pattern.shape[1]

    @property
    def shape(self) -> tuple[int, int]:
        """``(n_rows, n_cols)`` of every map."""
        return self.pattern.shape

    def apply(self, v: Array) -> Array:
        """SpMV: ``v: (m, *batch, n_cols) -> (m, *batch, n_rows)``, by default a gather over the
        padded rows and a sum (no scatter; the ``spmv_method`` of :mod:`bppsa.scan._kernels`)."""
        return self._apply(v, extra=0)

    def apply_to_rows(self, y: Array) -> Array:
        return self._apply(y, extra=1)

    def _apply(self, v: Array, extra: int, method: str | None = None) -> Array:
        method = _kernels.current().spmv_method if method is None else method
        values = expand_values(self.values, v.ndim - extra)
        if extra:
            values = jnp.expand_dims(values, tuple(range(-1 - extra, -1)))
        values, x = jnp.moveaxis(values, -1, 0), jnp.moveaxis(v, -1, 0)
        return jnp.moveaxis(_spmm_rows(self.pattern, values, x, method), 0, -1)

    def to_dense(self) -> Dense:
        p = self.pattern
        out = jnp.zeros((*self.values.shape[:-1], *p.shape), self.values.dtype)
        return Dense(out.at[..., p.rows, p.cols].set(self.values))

    def dense_floats_per_step(self) -> int:
        return math.prod(self.values.shape[1:-1]) * math.prod(self.pattern.shape)

    def plan(self, earlier: MapStack) -> ProductPlan:
        """The :class:`ProductPlan` of :meth:`then` (shared for the copies of the batch)."""
        if isinstance(earlier, Sparse):
            return _cached_plan(self.pattern, earlier.pattern, thresholds())
        return product_plan(self.pattern, _dense_shape(earlier))

    def then(self, earlier: MapStack) -> MapStack:
        """The maps ``earlier[k] @ self[k]`` (``self`` is the LATER map, applied first).

        Sparse @ sparse is the two-phase SpGEMM; the result is :class:`Sparse`, or
        :class:`Dense` where :meth:`plan` says so. With a dense (or structured) ``earlier``
        the sparse operand is not densified and the result is :class:`Dense`. Values
        broadcast: shared with per-example gives per-example maps.
        """
        if not isinstance(earlier, Sparse):
            return Dense(_sparse_then_dense(self, earlier.to_dense().a))
        plan = self.plan(earlier)
        if plan.method == "gemm":
            return Dense(matmul(earlier.to_dense().a, self.to_dense().a))
        pairs = _pairs(self.pattern, earlier.pattern)
        out = Sparse(spgemm_values(self.values, earlier.values, pairs, plan.method), pairs.pattern)
        return out.to_dense() if plan.format == "dense" else out

    def after(self, later: MapStack) -> MapStack:
        """``self[k] @ later[k]``: :meth:`then` with ``self`` as the EARLIER map, for a
        ``later`` map of another type (dense: the sparse operand is not densified)."""
        if isinstance(later, Sparse):
            return later.then(self)
        return Dense(_dense_then_sparse(later.to_dense().a, self))


def _dense_shape(x: MapStack) -> tuple[int, int]:
    return tuple(jax.eval_shape(lambda maps: maps.to_dense().a, x).shape[-2:])


def compose(later: MapStack, earlier: MapStack) -> MapStack:
    """``earlier[k] @ later[k]`` for maps of any types (``later`` applied first), without
    densifying a :class:`Sparse` operand: ``later.then(earlier)``, whose default asks a sparse
    ``earlier`` for the reflected product (:meth:`Sparse.after`)."""
    return later.then(earlier)
