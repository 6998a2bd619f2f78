"""Products of sparse maps with a static pattern: the SpGEMM and SpMV kernels, their plans.

What :class:`bppsa.scan._sparse.Sparse` runs, on values and :class:`~bppsa.scan._pattern.Pattern`
objects (never on ``Sparse`` elements): the symbolic phase (:class:`ProductPlan`,
:func:`product_plan`, :func:`plan_structures`, the pair lists of :func:`_pairs`), the numeric
phase (:func:`spgemm_values`, the SpMV :func:`_spmm_rows`) and the measured constants that choose
among the kernels (the ``spgemm_method``, ``spmv_method``, ``densify_density`` and
``densify_pair_ratio`` of a :class:`bppsa.Kernels`, measured by
``benchmarks/tools/sparse_kernels.py``, in force through :mod:`bppsa.scan._kernels`).

Algorithm summary of the fixed-pattern SpGEMM ``C = E @ L`` (``E`` the EARLIER map
``(n0, n1)``, ``L`` the LATER one ``(n1, n2)``), two-phase as scipy's SMMP (Bank & Douglas) and
cuSPARSE's "reuse" API:

* symbolic, in NumPy, once per pair of patterns (:func:`product_plan` and a cache of the pair
  lists): every stored ``E[i, k]`` meets every stored ``L[k, j]``; the distinct ``(i, j)`` are
  the output pattern and, per output entry, the list of ``(earlier entry, later entry)`` pairs
  is kept. There are ``sum_k colcount_E[k] * rowcount_L[k]`` pairs, ``FLOPs = 2 x pairs``.
* numeric, traced: gather both operands' values at the pairs, multiply, sum per output entry:
  over the pairs padded per output entry to the longest list (``"padded"``: the pad points to
  an appended zero, no scatter), the same per bucket of entries whose counts round up to one
  power of two (``"bucketed"``: at most 2x padding, one permutation after), or by a flat
  ``segment_sum`` (``"segment"``: a sorted scatter-add on XLA CPU). The kernels' ``spgemm_method``
  picks among them by the measurement. The entries' axis leads every gathered array (the
  "rows layout" of :func:`_spmm_rows`), so a gather copies all the examples of a batch at once.

A product whose output is denser than the kernels' ``densify_density`` is returned as
:class:`~bppsa.scan.Dense` (the sparse numeric phase, then placed), one whose pairs are more than
``densify_pair_ratio`` of ``n0 n1 n2`` is a dense GEMM: :func:`product_plan` reports the
decision for every product before it runs, products of a sparse and a dense map included.

Memory: the symbolic phase keeps ``(pairs,)`` int32 lists (padded: ``(nnz_out, width)``
tables), cached for a few pattern pairs; the numeric phase's gathered operands and products
are ``pairs x copies`` floats before XLA fuses them: :class:`ProductPlan` counts both.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import scipy.sparse
from jax import Array

from bppsa.scan import _kernels, _precision
from bppsa.scan._pattern import Pattern, expand_values

METHODS = ("padded", "bucketed", "segment")


# -- the symbolic phase: what a product costs, without running it -----------------------------

Operand = Pattern | tuple[int, int]  # a tuple stands for a dense matrix of that shape


@dataclasses.dataclass(frozen=True)
class ProductPlan:
    """What the product ``earlier @ later`` (``later`` applied first) computes and costs.

    Counts are for the whole product: ``copies`` maps when an operand is per example (``batch``
    of them), one when both are shared by the batch. ``temp_floats`` bounds the numeric phase's
    intermediates (gathered operands and products) as if XLA fused nothing.

    Attributes:
        kind: ``"SpGEMM"`` (sparse @ sparse), ``"SpMM"`` (sparse and dense), ``"GEMM"``.
        later_shape, earlier_shape, shape: ``(n1, n2)``, ``(n0, n1)`` and the output's
            ``(n0, n2)``.
        later_nnz, earlier_nnz: stored entries of the operands (dense: all).
        nnz_out: stored entries of the output (``n0 * n2`` when it is dense).
        density: structural non-zeros of the output over ``n0 * n2``.
        pairs: multiplications per copy (pairs of entries that meet).
        width: the longest list of pairs of an output entry (the padded layout's width).
        copies: how many maps the product forms (``batch`` or 1).
        flops: ``2 * pairs * copies``; dense_flops: ``2 * n0 * n1 * n2 * copies``.
        format: ``"sparse"`` or ``"dense"`` (the output's type).
        method: ``"padded"``, ``"bucketed"``, ``"segment"`` (SpGEMM numeric phases),
            ``"gather"`` (SpMM) or ``"gemm"`` (both operands dense).
        out_floats, temp_floats: floats of the output, of the intermediates; floats: their sum.
        reason: why this format and method.
    """

    kind: str
    later_shape: tuple[int, int]
    earlier_shape: tuple[int, int]
    shape: tuple[int, int]
    later_nnz: int
    earlier_nnz: int
    nnz_out: int
    density: float
    pairs: int
    width: int
    copies: int
    flops: int
    dense_flops: int
    format: str
    method: str
    out_floats: int
    temp_floats: int
    floats: int
    reason: str


def product_plan(
    later: Operand,
    earlier: Operand,
    *,
    batch: int = 1,
    later_per_example: bool = False,
    earlier_per_example: bool = False,
    densify_density: float | None = None,
    densify_pair_ratio: float | None = None,
    method: str | None = None,
) -> ProductPlan:
    """The plan of ``earlier @ later``, symbolically (nothing is traced or listed pair by pair).

    The output pattern of a sparse @ sparse product is scipy's boolean product of the two
    patterns, with the number of pairs per output entry as its values: cheap for the products
    of a whole pruned VGG-11 (tens of millions of entries, ~1e9 pairs), where listing pairs
    would not be.

    Args:
        later: the LATER map (applied first), ``(n1, n2)``: a :class:`Pattern`, or a shape
            tuple for a dense matrix.
        earlier: the EARLIER map, ``(n0, n1)``, likewise.
        batch: examples in the batch.
        later_per_example, earlier_per_example: whether the operand has one map per example.
        densify_density, densify_pair_ratio: the thresholds of the dense output (``None``:
            those of the kernels in force, :func:`bppsa.scan._kernels.current`).
        method: the SpGEMM numeric phase: ``"auto"`` (by the pairs per output entry, as
            measured), ``"padded"``, ``"bucketed"`` or ``"segment"`` (``None``: the kernels'
            ``spgemm_method``).

    Returns:
        A :class:`ProductPlan`.

    Raises:
        ValueError: mismatched inner sizes, or an unknown ``method``.
    """
    densify_density, densify_pair_ratio, method = thresholds(
        densify_density, densify_pair_ratio, method
    )
    if method not in ("auto", *METHODS):
        raise ValueError(f"method must be 'auto' or one of {METHODS}, got {method!r}.")
    if batch < 1:
        raise ValueError(f"batch must be >= 1, got {batch}.")
    structs = (_structure(later, "later"), _structure(earlier, "earlier"))
    copies = (batch if later_per_example else 1, batch if earlier_per_example else 1)
    plan, _ = plan_structures(*structs, copies, densify_density, densify_pair_ratio, method)
    return plan


def _structure(x: Operand, name: str) -> tuple[tuple[int, int], scipy.sparse.csr_array | None]:
    if isinstance(x, Pattern):
        return x.shape, x.to_scipy()
    if isinstance(x, tuple) and len(x) == 2:
        return (int(x[0]), int(x[1])), None
    raise TypeError(f"{name} must be a Pattern or a (n_rows, n_cols) tuple, got {type(x)}.")


def plan_structures(later, earlier, copies, densify_density, densify_pair_ratio, method):
    """:func:`product_plan` on ``(shape, csr or None)`` operands (``None``: dense), with the
    operands' ``copies = (later, earlier)``; also returns the output's structure (the CSR of
    pair counts, or ``None`` when the output is dense). :func:`bppsa.scan.chain_plan` chains
    it."""
    (l_shape, l_csr), (e_shape, e_csr) = later, earlier
    if e_shape[1] != l_shape[0]:
        raise ValueError(
            f"the earlier map {e_shape} cannot follow the later map {l_shape}: the earlier "
            f"map's n_cols must equal the later map's n_rows."
        )
    (n0, n1), n2 = e_shape, l_shape[1]
    out_copies = max(copies)
    l_nnz = l_csr.nnz if l_csr is not None else n1 * n2
    e_nnz = e_csr.nnz if e_csr is not None else n0 * n1
    cube = n0 * n1 * n2
    common = dict(later_shape=l_shape, earlier_shape=e_shape, shape=(n0, n2), copies=out_copies)
    common |= dict(later_nnz=int(l_nnz), earlier_nnz=int(e_nnz), dense_flops=2 * cube * out_copies)

    def finish(kind, nnz_out, density, pairs, width, fmt, how, temp, reason, out_csr):
        out_floats = out_copies * (nnz_out if fmt == "sparse" else n0 * n2)
        plan = ProductPlan(
            kind=kind, nnz_out=int(nnz_out), density=float(density), pairs=int(pairs),
            width=int(width), flops=2 * int(pairs) * out_copies, format=fmt, method=how,
            out_floats=int(out_floats), temp_floats=int(temp), floats=int(out_floats + temp),
            reason=reason, **common,
        )  # fmt: skip
        return plan, out_csr

    if l_csr is None and e_csr is None:
        temp = 0
        return finish("GEMM", n0 * n2, 1.0, cube, n1, "dense", "gemm", temp, "dense @ dense", None)
    if l_csr is None or e_csr is None:
        # Gathers of the dense operand at the sparse one's entries: for a sparse later map, each
        # output (i, j) sums over the entries of column j of L; for a sparse earlier map, over
        # the entries of row i of E (bppsa.scan._sparse: _sparse_then_dense, _dense_then_sparse).
        if e_csr is None:
            width = _longest(np.bincount(l_csr.indices, minlength=n2))
            pairs, temp = n0 * l_nnz, (out_copies * n0 + copies[0]) * n2 * width
        else:
            width = _longest(np.diff(e_csr.indptr))
            pairs, temp = e_nnz * n2, (out_copies * n2 + copies[1]) * n0 * width
        reason = "sparse and dense: gathers against the dense operand, the result is dense"
        return finish("SpMM", n0 * n2, 1.0, pairs, width, "dense", "gather", temp, reason, None)

    pairs = int(np.dot(np.bincount(e_csr.indices, minlength=n1), np.diff(l_csr.indptr)))
    out = e_csr @ l_csr  # values: pairs per output entry (never zero, so none is dropped)
    nnz_out = int(out.nnz)
    width = int(out.data.max()) if nnz_out else 0
    density = nnz_out / max(1, n0 * n2)
    ratio = pairs / max(1, cube)
    if ratio > densify_pair_ratio:
        temp = copies[1] * n0 * n1 + copies[0] * n1 * n2
        reason = f"pairs / (n0 n1 n2) = {ratio:.3g} > {densify_pair_ratio}: a dense GEMM is faster"
        return finish("SpGEMM", nnz_out, density, pairs, width, "dense", "gemm", temp, reason, None)
    method = _resolve(method, width, nnz_out, pairs)
    gathered = {"padded": width * nnz_out, "segment": pairs}.get(method)
    if gathered is None:  # bucketed: every entry's count rounded up to a power of two
        gathered = int(np.left_shift(1, np.ceil(np.log2(out.data)).astype(np.int64)).sum())
    temp = gathered * (copies[0] + copies[1] + out_copies)
    if density > densify_density:
        reason = f"output density {density:.3g} > {densify_density}: stored dense"
        temp += out_copies * nnz_out
        return finish("SpGEMM", nnz_out, density, pairs, width, "dense", method, temp, reason, None)
    reason = f"output density {density:.3g} <= {densify_density}, pairs ratio {ratio:.3g}"
    return finish("SpGEMM", nnz_out, density, pairs, width, "sparse", method, temp, reason, out)


def _resolve(method: str, width: int, nnz_out: int, pairs: int) -> str:
    """``"auto"``: the padded sum where it pads nothing (every output entry has as many pairs,
    e.g. a product with a ReLU's diagonal or a max-pooling's one entry per column), the
    bucketed one for at most two pairs per entry, else the segment sum: what the ``spgemm``
    section of benchmarks/tools/sparse_kernels.py measured faster (see :data:`SPGEMM_METHOD`)."""
    if method != "auto":
        return method
    if width * nnz_out == pairs:
        return "padded"
    return "bucketed" if width <= 2 else "segment"


def _longest(counts: np.ndarray) -> int:
    return int(counts.max()) if counts.size else 0


@functools.lru_cache(maxsize=256)
def _cached_plan(later: Pattern, earlier: Pattern, thresholds: tuple) -> ProductPlan:
    density, pair_ratio, method = thresholds
    return product_plan(
        later, earlier, densify_density=density, densify_pair_ratio=pair_ratio, method=method
    )


def thresholds(density=None, pair_ratio=None, method=None) -> tuple[float, float, str]:
    """``(densify_density, densify_pair_ratio, spgemm_method)``: the given ones, those of the
    kernels in force (:func:`bppsa.scan._kernels.current`) for ``None``. The tuple keys
    :func:`_cached_plan`, so a plan follows the switches it was made under."""
    kernels = _kernels.current()
    return (
        kernels.densify_density if density is None else density,
        kernels.densify_pair_ratio if pair_ratio is None else pair_ratio,
        kernels.spgemm_method if method is None else method,
    )


@dataclasses.dataclass(frozen=True, eq=False)
class _Pairs:
    """The pairs of entries that meet in ``E @ L``, sorted by output entry.

    Attributes:
        pattern: the output's.
        earlier, later: ``(pairs,)`` int32 entries of ``E`` and of ``L``.
        segment: ``(pairs,)`` int32 output entry of each pair (non-decreasing).
        width: the most pairs of one output entry.
    """

    pattern: Pattern
    earlier: np.ndarray
    later: np.ndarray
    segment: np.ndarray
    width: int
    pads: tuple[int, int]  # (nnz of E, nnz of L): the index of each operand's appended zero

    @functools.cached_property
    def padded(self) -> tuple[np.ndarray, np.ndarray]:
        """``(nnz_out, width)`` entries of ``E`` and of ``L``, padded with the appended zero."""
        tables = self._tables(np.full(self.pattern.nnz, self.width))
        if not tables:  # an empty product
            return np.zeros((0, 0), np.int32), np.zeros((0, 0), np.int32)
        ((_, pad_earlier, pad_later),) = tables
        return pad_earlier, pad_later

    @functools.cached_property
    def bucketed(self) -> tuple[list[tuple[np.ndarray, np.ndarray]], np.ndarray]:
        """The padded tables per bucket of output entries whose pair counts round up to one
        power of two (so at most half of a table is padding), and ``inverse``: the bucket
        sums concatenated, gathered at ``inverse``, are in the pattern's order."""
        counts = np.bincount(self.segment, minlength=self.pattern.nnz)
        widths = np.left_shift(1, np.ceil(np.log2(np.maximum(counts, 1))).astype(np.int64))
        buckets = self._tables(widths)
        order = np.concatenate([entries for entries, _, _ in buckets] or [np.zeros(0, np.int64)])
        return [(pad_e, pad_l) for _, pad_e, pad_l in buckets], np.argsort(order).astype(np.int32)

    def _tables(self, widths: np.ndarray) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """For each distinct width: the output entries of that width, and their tables."""
        n = self.pattern.nnz
        starts = np.searchsorted(self.segment, np.arange(n))
        counts = np.diff(np.append(starts, self.segment.size))
        out = []
        for width in np.unique(widths):
            entries = np.flatnonzero(widths == width)
            slot = np.arange(width)
            index = starts[entries, None] + slot
            valid = slot < counts[entries, None]
            index = np.minimum(index, max(self.segment.size - 1, 0))
            tables = [
                np.where(valid, pairs[index], pad).astype(np.int32)
                for pairs, pad in zip((self.earlier, self.later), self.pads)
            ]
            out.append((entries, tables[0], tables[1]))
        return out


@functools.lru_cache(maxsize=32)  # pair lists are the symbolic phase's big arrays: few kept
def _pairs(later: Pattern, earlier: Pattern) -> _Pairs:
    """Lists, per output entry of ``earlier @ later``, the pairs of entries that meet."""
    n2 = later.shape[1]
    counts = np.diff(later.row_starts)[earlier.cols]  # later entries each earlier entry meets
    total = int(counts.sum())
    pair_earlier = np.repeat(np.arange(earlier.nnz, dtype=np.int64), counts)
    first = np.repeat(later.row_starts[earlier.cols] - (np.cumsum(counts) - counts), counts)
    pair_later = first + np.arange(total)
    key = earlier.rows[pair_earlier].astype(np.int64) * n2 + later.cols[pair_later]
    order = np.argsort(key, kind="stable")
    key = key[order]
    new = np.ones(total, bool)
    new[1:] = key[1:] != key[:-1]
    unique = key[new]
    pattern = Pattern(unique // n2, unique % n2, (earlier.shape[0], n2))
    segment = (np.cumsum(new) - 1).astype(np.int32)
    width = int(np.bincount(segment).max()) if total else 0
    return _Pairs(
        pattern=pattern,
        earlier=pair_earlier[order].astype(np.int32),
        later=pair_later[order].astype(np.int32),
        segment=segment,
        width=width,
        pads=(earlier.nnz, later.nnz),
    )


# -- the numeric phase -------------------------------------------------------------------------


def _with_zero(rows: Array) -> Array:
    """``rows: (k, ...)`` with a row of zeros appended (what the padded tables point to)."""
    return jnp.concatenate([rows, jnp.zeros((1, *rows.shape[1:]), rows.dtype)], axis=0)


def _spmm_rows(pattern: Pattern, values: Array, x: Array, method: str) -> Array:
    """``A @ x`` in the rows layout: ``x: (n_cols, *lead)``, ``values: (nnz, *v)`` broadcasting
    against ``lead``; returns ``(n_rows, *lead)``.

    The entries' axis leads, so every gather copies contiguous slices of ``prod(lead)`` floats
    (a whole batch of examples at once) rather than single floats: on XLA CPU the SpMV of a
    pruned convolution's ``J^T`` on 16 vectors is ~30x faster so
    (benchmarks/tools/sparse_kernels.py, ``spmv``: ``last_axis``).
    """
    if method == "segment":
        products = x[pattern.cols] * values
        return jax.ops.segment_sum(
            products, pattern.rows, num_segments=pattern.shape[0], indices_are_sorted=True
        )
    ell = pattern.ell
    cols = np.append(pattern.cols, 0)[ell]
    # A contraction rather than multiply-then-sum: XLA CPU reduces a middle axis next to a
    # unit dim ~30x slower than the dot it makes of this.
    return _precision.einsum("rw...,rw...->r...", x[cols], _with_zero(values)[ell])


def spgemm_values(
    later_values: Array, earlier_values: Array, pairs: _Pairs, method: str = "auto"
) -> Array:
    """The numeric phase: the values ``(m, *vbatch, nnz_out)`` of ``E @ L`` in ``pairs.pattern``'s
    order, from the values ``(m, *vbatch, nnz)`` of both operands (batch dims broadcast).

    In the rows layout of :func:`_spmm_rows` (entries first): a gather takes one slice per
    pair, all the maps of the stack and examples of the batch at once.
    """
    method = _resolve(method, pairs.width, pairs.pattern.nnz, pairs.segment.size)
    ndim = max(later_values.ndim, earlier_values.ndim)
    later_rows, earlier_rows = (
        jnp.moveaxis(expand_values(v, ndim), -1, 0) for v in (later_values, earlier_values)
    )
    if method == "segment":
        products = earlier_rows[pairs.earlier] * later_rows[pairs.later]
        out = jax.ops.segment_sum(
            products, pairs.segment, num_segments=pairs.pattern.nnz, indices_are_sorted=True
        )
        return jnp.moveaxis(out, 0, -1)
    earlier_rows, later_rows = _with_zero(earlier_rows), _with_zero(later_rows)

    def padded_sum(pad_earlier, pad_later):
        return _precision.einsum(
            "ow...,ow...->o...", earlier_rows[pad_earlier], later_rows[pad_later]
        )

    if method == "padded" or pairs.pattern.nnz == 0:
        out = padded_sum(*pairs.padded)
    else:
        tables, inverse = pairs.bucketed
        out = jnp.concatenate([padded_sum(*table) for table in tables], axis=0)[inverse]
    return jnp.moveaxis(out, 0, -1)
