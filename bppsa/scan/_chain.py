"""Back-propagation through a chain of layers as a scan over heterogeneous elements.

A feed-forward chain ``x_0 -> x_1 -> ... -> x_L`` (the layers of a pruned VGG-11: convolutions,
ReLUs, max-poolings, linear layers) back-propagates ``g_{l-1} = A_l g_l`` with ``A_l = J_l^T``
of shape ``(n_{l-1}, n_l)``: the maps differ in shape, in type (:class:`Sparse`, :class:`Dense`)
and in pattern from layer to layer, so they cannot share one stacked :class:`MapStack`. Here
they live in a Python list, each a stack of length one, and the scan is unrolled at trace time
over that list; every product goes through the one :func:`bppsa.scan.combine`.

:func:`chain_scan` runs it (in :mod:`bppsa.scan._algorithms`, beside the scans over stacks:
:func:`bppsa.scan.sequential` and :func:`bppsa.scan.blelloch` take a list of maps too);
:func:`chain_plan` lists every product it forms, symbolically (no
values needed: patterns alone will do, for the FLOP analysis of the paper's Fig. 10), and
:func:`chain_memory` sums their floats, for a memory guard before running.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import jax
import numpy as np
import scipy.sparse

from bppsa.scan._algorithms import (  # noqa: F401 (chain_scan: re-exported)
    _check_levels,
    _check_shapes,
    _List,
    _map_shape,
    chain_scan,
    sweeps,
)
from bppsa.scan._elements import MapStack
from bppsa.scan._sparse import (
    Pattern,
    Sparse,
    plan_structures,
    thresholds,
)

# -- the plan: every product of a scan, symbolically -------------------------------------------


@dataclasses.dataclass(frozen=True)
class ChainRow:
    """One product of :func:`chain_scan`.

    Attributes:
        index: position in the plan (topological: operands come first).
        level: the up-sweep level that forms it, the level of the linear scan, or the
            down-sweep level it restores.
        sweep: ``"up"``, ``"linear"`` or ``"down"``.
        kind: ``"SpGEMM"``, ``"SpMM"`` (sparse and dense), ``"GEMM"`` for two maps; ``"SpMV"``,
            ``"GEMV"`` for a map and the cotangent vector.
        later_shape: the operand applied first: a map ``(n1, n2)`` or the vector ``(n,)``.
        earlier_shape: the map applied second, ``(n0, n1)``.
        later_nnz, earlier_nnz: their stored entries (a vector: ``n``).
        nnz_out: stored entries of the result, per copy.
        copies: how many the batch forms (``batch`` if an operand is per example, else 1).
        flops: ``2 x pairs x copies``; dense_flops: ``2 n0 n1 n2 x copies`` (``n2 = 1`` for a
            vector).
        critical: on a longest chain of dependent products (every product one step).
        format: ``"sparse"``, ``"dense"`` or ``"vector"``.
        method: how the product is computed (see :class:`bppsa.scan.ProductPlan`).
        floats: of the result (all copies); temp_floats: of its intermediates, unfused.
        depends: the rows whose results it reads.
    """

    index: int
    level: int
    sweep: str
    kind: str
    later_shape: tuple[int, ...]
    earlier_shape: tuple[int, int]
    later_nnz: int
    earlier_nnz: int
    nnz_out: int
    copies: int
    flops: int
    dense_flops: int
    critical: bool
    format: str
    method: str
    floats: int
    temp_floats: int
    depends: tuple[int, ...]


@dataclasses.dataclass(frozen=True)
class _Symbol:
    """A map (``csr`` its structure, ``None``: dense) or, with ``shape = (n,)``, the vector."""

    shape: tuple[int, ...]
    csr: scipy.sparse.csr_array | None
    copies: int
    row: int | None  # the row that forms it; None for an input

    @property
    def nnz(self) -> int:
        return self.csr.nnz if self.csr is not None else math.prod(self.shape)


def _symbol(item, k: int, per_example: bool) -> _Symbol:
    copies_of = 1
    if isinstance(item, Sparse):
        shape, csr = item.shape, item.pattern.to_scipy()
        copies_of = math.prod(item.values.shape[1:-1])
    elif isinstance(item, MapStack):
        shape, csr = _map_shape(item), None
        copies_of = math.prod(jax.eval_shape(lambda m: m.to_dense().a, item).shape[1:-2])
    elif isinstance(item, Pattern):
        shape, csr = item.shape, item.to_scipy()
    elif isinstance(item, tuple) and len(item) == 2:
        shape, csr = (int(item[0]), int(item[1])), None
    else:
        raise TypeError(
            f"maps[{k}] must be a MapStack, a Pattern or an (n_rows, n_cols) tuple (dense), "
            f"got {type(item).__name__}."
        )
    return _Symbol(tuple(shape), csr, -1 if per_example else copies_of, None)


def chain_plan(
    maps: Sequence[MapStack | Pattern | tuple[int, int]],
    levels: int | None = None,
    *,
    batch: int | None = None,
    per_example: Sequence[bool] | None = None,
    densify_density: float | None = None,
    densify_pair_ratio: float | None = None,
) -> list[ChainRow]:
    """Every product :func:`chain_scan` forms for ``levels``, without running anything.

    Output patterns come from scipy's boolean products (cheap at the scale of a full pruned
    VGG-11), and a product goes dense where :func:`bppsa.scan.product_plan` says it would.

    Args:
        maps: the chain, as :func:`chain_scan` takes it, or its patterns alone: a
            :class:`Pattern` for a sparse map, an ``(n_rows, n_cols)`` tuple for a dense one.
        levels: as :func:`chain_scan`.
        batch: examples per cotangent (default: the largest per-example batch of the maps,
            else 1). Matrix-vector products form ``batch`` vectors.
        per_example: for patterns and tuples, whether the map is one per example (a ReLU's);
            maps given as a :class:`MapStack` say it by their shapes.
        densify_density, densify_pair_ratio: the thresholds of a dense product (``None``:
            those of the kernels in force, :func:`bppsa.scan._kernels.current`).

    Returns:
        One :class:`ChainRow` per product, operands before results.
    """
    _check_levels(levels)
    limits = thresholds(densify_density, densify_pair_ratio)
    if per_example is not None and len(per_example) != len(maps):
        raise ValueError(f"per_example must have one bool per map ({len(maps)}).")
    symbols = [
        _symbol(item, k, bool(per_example[k]) if per_example is not None else False)
        for k, item in enumerate(maps)
    ]
    _check_shapes([s.shape for s in symbols])
    if batch is None:
        batch = max([s.copies for s in symbols if s.copies > 0], default=1)
    if batch < 1:
        raise ValueError(f"batch must be >= 1, got {batch}.")
    symbols = [dataclasses.replace(s, copies=batch if s.copies < 0 else s.copies) for s in symbols]
    rows: list[dict] = []

    def add(**row) -> int:
        rows.append(dict(index=len(rows), **row))
        return len(rows) - 1

    def deps(*operands: _Symbol) -> tuple[int, ...]:
        return tuple(o.row for o in operands if o.row is not None)

    def vec(element: _Symbol, vector: _Symbol, level: int, sweep: str) -> _Symbol:
        (n0, n1), sparse = element.shape, element.csr is not None
        index = add(
            level=level, sweep=sweep, kind="SpMV" if sparse else "GEMV",
            later_shape=vector.shape, earlier_shape=element.shape, later_nnz=n1,
            earlier_nnz=element.nnz, nnz_out=n0, copies=batch, flops=2 * element.nnz * batch,
            dense_flops=2 * n0 * n1 * batch, format="vector",
            method="segment" if sparse else "gemv", floats=n0 * batch,
            temp_floats=element.nnz * batch if sparse else 0, depends=deps(element, vector),
        )  # fmt: skip
        return _Symbol((n0,), None, batch, index)

    def mat(later: _Symbol, earlier: _Symbol, level: int) -> _Symbol:
        plan, out = plan_structures(
            (later.shape, later.csr), (earlier.shape, earlier.csr),
            (later.copies, earlier.copies), *limits,
        )  # fmt: skip
        index = add(
            level=level, sweep="up", kind=plan.kind, later_shape=later.shape,
            earlier_shape=earlier.shape, later_nnz=plan.later_nnz, earlier_nnz=plan.earlier_nnz,
            nnz_out=plan.nnz_out, copies=plan.copies, flops=plan.flops,
            dense_flops=plan.dense_flops, format=plan.format, method=plan.method,
            floats=plan.out_floats, temp_floats=plan.temp_floats, depends=deps(later, earlier),
        )  # fmt: skip
        if out is not None:  # the next products need the structure only
            out = scipy.sparse.csr_array(
                (np.ones(out.nnz, np.int32), out.indices, out.indptr), shape=out.shape
            )
        return _Symbol(plan.shape, out, plan.copies, index)

    n_last = symbols[-1].shape[1] if symbols else 0
    sweeps(_Symbol((n_last,), None, batch, None), _List(symbols[::-1], vec, mat), levels)
    critical = _critical(rows)
    return [ChainRow(critical=c, **row) for row, c in zip(rows, critical)]


def _critical(rows: list[dict]) -> list[bool]:
    """Whether each row lies on a longest path of the dependence graph (rows are in
    topological order)."""
    depth: list[int] = []
    for row in rows:
        depth.append(1 + max((depth[d] for d in row["depends"]), default=0))
    height = [1] * len(rows)
    for row in reversed(rows):
        for d in row["depends"]:
            height[d] = max(height[d], height[row["index"]] + 1)
    longest = max(depth, default=0)
    return [d + h - 1 == longest for d, h in zip(depth, height)]


def chain_memory(
    maps: Sequence[MapStack | Pattern | tuple[int, int]], levels: int | None = None, **options
) -> int:
    """Floats that :func:`chain_scan` with ``levels`` forms: the results of all its products
    (the down-sweep reads every up-sweep level, so they may all be alive at once) plus the
    largest intermediates of one product. A guard to check before running; ``options`` are
    those of :func:`chain_plan`."""
    rows = chain_plan(maps, levels, **options)
    return sum(r.floats for r in rows) + max((r.temp_floats for r in rows), default=0)
