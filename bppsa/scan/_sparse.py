"""Sparse linear maps with a static pattern: the element of a scan over pruned layers.

A transposed Jacobian of a convolution, a ReLU or a max-pooling layer is more than 99% zeros, and
WHERE its non-zeros are is known before any data is seen: from the layer's geometry and its
pruning mask. :class:`Pattern` holds those positions as NumPy arrays (static: known at trace
time, hashable, so ``jax.jit`` can key its cache on them and every symbolic phase runs once per
pattern); :class:`Sparse` pairs a pattern with traced values, shared by the batch (a
convolution) or one set per example (a ReLU).

Conventions (the same as :class:`bppsa.scan.Dense`): map ``k`` of a stack is a matrix
``A_k: (n_rows, n_cols)`` applied on the left of vectors of shape ``(*batch, n_cols)``. For a
layer ``y = f(x)`` the map is ``J^T``: ``n_cols`` is the size of ``y`` (the cotangent that
arrives), ``n_rows`` the size of ``x`` (the cotangent that leaves).

Products (:meth:`Sparse.then`, :func:`compose`). Algorithm summary of the fixed-pattern SpGEMM
``C = E @ L`` (``E`` the EARLIER map ``(n0, n1)``, ``L`` the LATER one ``(n1, n2)``), two-phase
as scipy's SMMP (Bank & Douglas) and cuSPARSE's "reuse" API:

* symbolic, in NumPy, once per pair of patterns (:func:`product_plan` and a cache of the pair
  lists): every stored ``E[i, k]`` meets every stored ``L[k, j]``; the distinct ``(i, j)`` are
  the output pattern and, per output entry, the list of ``(earlier entry, later entry)`` pairs
  is kept. There are ``sum_k colcount_E[k] * rowcount_L[k]`` pairs, ``FLOPs = 2 x pairs``.
* numeric, traced: gather both operands' values at the pairs, multiply, sum per output entry:
  over the pairs padded per output entry to the longest list (``"padded"``: the pad points to
  an appended zero, no scatter), the same per bucket of entries whose counts round up to one
  power of two (``"bucketed"``: at most 2x padding, one permutation after), or by a flat
  ``segment_sum`` (``"segment"``: a sorted scatter-add on XLA CPU). :data:`SPGEMM_METHOD`
  picks among them by the measurement. The entries' axis leads every gathered array (the
  "rows layout" of :func:`_spmm_rows`), so a gather copies all the examples of a batch at once.

A product whose output is denser than :data:`DENSIFY_DENSITY` is returned as :class:`Dense`
(the sparse numeric phase, then placed), one whose pairs are more than
:data:`DENSIFY_PAIR_RATIO` of ``n0 n1 n2`` is a dense GEMM: :func:`product_plan` reports the
decision for every product before it runs. A product of a sparse and a dense map (either
order) gathers rows of the dense operand at the sparse one's entries and never densifies the
sparse operand; its result is dense.

Memory: the symbolic phase keeps ``(pairs,)`` int32 lists (padded: ``(nnz_out, width)``
tables), cached for a few pattern pairs; the numeric phase's gathered operands and products
are ``pairs x copies`` floats before XLA fuses them: :class:`ProductPlan` counts both.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import math
from typing import ClassVar, Literal

import jax
import jax.numpy as jnp
import numpy as np
import scipy.sparse
from jax import Array

from bppsa.scan._elements import Dense, MapStack

# Measured by benchmarks/sparse_kernels.py (results/sparse_kernels_cpu.json: XLA CPU, 2 cores,
# JAX 0.10.2, float32, medians of 10 interleaved repeats after warm-up; the machine was shared,
# so differences under ~20% are noise).
#
# The SpGEMM numeric phase (see _resolve): the padded sum where it pads nothing (a ReLU
# diagonal (B=16) @ a pruned conv's J^T: 0.60 ms padded, 0.98 bucketed, 3.28 segment; a
# max-pooling's: 0.22 / 0.49 / 0.79), the bucketed one for at most 2 pairs per entry (diagonal
# plus neighbours: 3.40 / 3.57 segment and 4.68 / 14.2), else the segment sum (conv @ conv,
# 6.7M pairs, 5x padding: 38.4 padded, 23.1 bucketed, 8.9 segment; per example, B=8: 298 /
# 170 / 90; random patterns of width 4 and 6: segment ahead by 20-30%).
SPGEMM_METHOD: Literal["auto", "padded", "bucketed", "segment"] = "auto"
# SpMV on 16 vectors, segment vs padded, ms: conv J^T 1.22 / 1.62, 36.4 / 38.0, 32.3 / 42.4;
# random 0.49 / 1.06. Both in the rows layout (:func:`_spmm_rows`); one float per gathered
# index instead (the batch leading) took 40.8, 334, 271, 6.4.
SPMV_METHOD: Literal["padded", "segment"] = "segment"
# Stored dense above this output density. An output is used twice in the scan: one SpMV on
# the batch (down-sweep) and one product with the next map (up-sweep). n = 1024, B = 16, the
# next map a pruned conv's J^T, ms (SpMV + product): sparse 1.2 + 4.9 / dense 0.7 + 52.7 at
# density 0.1; 8.0 + 64.7 / 0.8 + 106.5 at 0.3; 31.0 + 101.7 / 1.2 + 95.8 at 0.5. The SpMV
# alone goes dense from 0.1 (n = 1024 and 4096), the product from 0.5.
DENSIFY_DENSITY: float = 0.4
# A GEMM (dense operands) above this ratio of pairs to n0 n1 n2. Random square products, ms
# (segment / GEMM): n = 512: 0.55 / 1.33 at ratio 0.0024, 1.89 / 1.37 at 0.0098; n = 256:
# 0.047 / 0.194 at 0.00084, 0.221 / 0.192 at 0.0098 (densifying the operands first included).
DENSIFY_PAIR_RATIO: float = 0.005
METHODS = ("padded", "bucketed", "segment")


@dataclasses.dataclass(frozen=True, eq=False)
class Pattern:
    """The static positions of the non-zeros of a ``(n_rows, n_cols)`` matrix.

    Entries are sorted by row, then column, without duplicates; entry ``e`` is at
    ``(rows[e], cols[e])`` and its value is ``values[..., e]`` of the :class:`Sparse` that uses
    the pattern. Two patterns with the same shape and positions are equal (and hash alike), so
    a pattern rebuilt in another trace hits the same ``jax.jit`` cache entry.

    Build one with :meth:`from_coo`, which sorts and checks.

    Attributes:
        rows: ``(nnz,)`` int32.
        cols: ``(nnz,)`` int32.
        shape: ``(n_rows, n_cols)``.
    """

    rows: np.ndarray
    cols: np.ndarray
    shape: tuple[int, int]

    @staticmethod
    def from_coo(rows, cols, shape: tuple[int, int]) -> tuple[Pattern, np.ndarray]:
        """The pattern of the entries ``(rows[i], cols[i])``, and the order that sorts them.

        Returns:
            ``(pattern, order)``: ``values[..., order]`` puts values given in the input's order
            into the pattern's order.

        Raises:
            ValueError: an entry outside ``shape``, or the same position twice.
        """
        rows = np.asarray(rows, dtype=np.int64).ravel()
        cols = np.asarray(cols, dtype=np.int64).ravel()
        n_rows, n_cols = (int(s) for s in shape)
        if rows.shape != cols.shape:
            raise ValueError(f"rows and cols must have one length, got {rows.shape}, {cols.shape}.")
        if rows.size and (
            rows.min() < 0 or rows.max() >= n_rows or cols.min() < 0 or cols.max() >= n_cols
        ):
            raise ValueError(f"an entry lies outside the shape {(n_rows, n_cols)}.")
        key = rows * n_cols + cols
        order = np.argsort(key, kind="stable")
        key = key[order]
        if key.size > 1 and (np.diff(key) == 0).any():
            raise ValueError("a position appears twice in the pattern.")
        pattern = Pattern(
            (key // n_cols).astype(np.int32), (key % n_cols).astype(np.int32), (n_rows, n_cols)
        )
        return pattern, order

    @staticmethod
    def diagonal(n: int) -> Pattern:
        """The ``n`` positions of the diagonal of an ``(n, n)`` matrix."""
        i = np.arange(n, dtype=np.int32)
        return Pattern(i, i, (n, n))

    def __post_init__(self):
        for name in ("rows", "cols"):
            array = np.asarray(getattr(self, name), dtype=np.int32)
            array.setflags(write=False)
            object.__setattr__(self, name, array)
        object.__setattr__(self, "shape", tuple(int(s) for s in self.shape))

    @property
    def nnz(self) -> int:
        return int(self.rows.size)

    @property
    def density(self) -> float:
        """Stored entries over ``n_rows * n_cols``."""
        return self.nnz / max(1, math.prod(self.shape))

    @functools.cached_property
    def digest(self) -> bytes:
        h = hashlib.blake2b(digest_size=16)
        h.update(np.asarray(self.shape, np.int64).tobytes())
        h.update(self.rows.tobytes())
        h.update(self.cols.tobytes())
        return h.digest()

    def __hash__(self) -> int:
        return hash(self.digest)

    def __eq__(self, other) -> bool:
        return isinstance(other, Pattern) and self.digest == other.digest

    def __repr__(self) -> str:
        return f"Pattern(shape={self.shape}, nnz={self.nnz}, density={self.density:.3g})"

    @functools.cached_property
    def row_starts(self) -> np.ndarray:
        """``(n_rows + 1,)``: the entries of row ``i`` are ``row_starts[i]:row_starts[i+1]``."""
        counts = np.bincount(self.rows, minlength=self.shape[0])
        return np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)

    @functools.cached_property
    def ell(self) -> np.ndarray:
        """``(n_rows, width)`` int32: the entries of every row, padded with ``nnz``.

        ``width`` is the longest row. Index ``nnz`` stands for a zero entry, so a product
        gathers through it and sums over the padded axis without any scatter.
        """
        starts = self.row_starts
        counts = np.diff(starts)
        width = int(counts.max()) if counts.size else 0
        slot = np.arange(width)
        entries = starts[:-1, None] + slot[None, :]
        return np.where(slot[None, :] < counts[:, None], entries, self.nnz).astype(np.int32)

    def transpose(self) -> tuple[Pattern, np.ndarray]:
        """The pattern of the transposed matrix, and ``order``: ``values[..., order]`` are the
        values in the transposed pattern's order (as :meth:`from_coo`)."""
        return _transposed(self)

    def to_scipy(self, data: np.ndarray | None = None) -> scipy.sparse.csr_array:
        """The positions as a CSR matrix (``data`` defaults to int32 ones: structure only)."""
        if data is None:
            data = np.ones(self.nnz, np.int32)
        return scipy.sparse.csr_array((data, self.cols, self.row_starts), shape=self.shape)


@functools.lru_cache(maxsize=64)
def _transposed(pattern: Pattern) -> tuple[Pattern, np.ndarray]:
    return Pattern.from_coo(pattern.cols, pattern.rows, pattern.shape[::-1])


def expand_values(values: Array, ndim: int) -> Array:
    """``values: (m, *vbatch, nnz)`` with singleton dims inserted after the stack axis so that
    it has ``ndim`` dims and broadcasts against arrays of shape ``(m, *batch, nnz)``."""
    missing = ndim - values.ndim
    if missing < 0:
        raise ValueError(f"values of shape {values.shape} have more dims than {ndim}.")
    return values.reshape(values.shape[:1] + (1,) * missing + values.shape[1:])


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
    densify_density: float = DENSIFY_DENSITY,
    densify_pair_ratio: float = DENSIFY_PAIR_RATIO,
    method: str = SPGEMM_METHOD,
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
        densify_density, densify_pair_ratio: the thresholds of the dense output.
        method: the SpGEMM numeric phase: ``"auto"`` (by the pairs per output entry, as
            measured: see :data:`SPGEMM_METHOD`), ``"padded"``, ``"bucketed"`` or ``"segment"``.

    Returns:
        A :class:`ProductPlan`.

    Raises:
        ValueError: mismatched inner sizes, or an unknown ``method``.
    """
    if method not in ("auto", *METHODS):
        raise ValueError(f"method must be 'auto' or one of {METHODS}, got {method!r}.")
    if batch < 1:
        raise ValueError(f"batch must be >= 1, got {batch}.")
    structs = [_structure(x, name) for x, name in ((later, "later"), (earlier, "earlier"))]
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
        # the entries of row i of E (:func:`_sparse_then_dense`, :func:`_dense_then_sparse`).
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
    section of benchmarks/sparse_kernels.py measured faster (see :data:`SPGEMM_METHOD`)."""
    if method != "auto":
        return method
    if width * nnz_out == pairs:
        return "padded"
    return "bucketed" if width <= 2 else "segment"


def _longest(counts: np.ndarray) -> int:
    return int(counts.max()) if counts.size else 0


@functools.lru_cache(maxsize=256)
def _cached_plan(later: Pattern, earlier: Pattern, method: str) -> ProductPlan:
    return product_plan(later, earlier, method=method)


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
            out.append((entries, *tables))
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
    pruned convolution's ``J^T`` on 16 vectors is ~30x faster so (benchmarks/sparse_kernels.py,
    ``spmv``: ``last_axis``).
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
    return jnp.einsum("rw...,rw...->r...", x[cols], _with_zero(values)[ell])


def spgemm_values(
    later_values: Array, earlier_values: Array, pairs: _Pairs, method: str = SPGEMM_METHOD
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
        return jnp.einsum("ow...,ow...->o...", earlier_rows[pad_earlier], later_rows[pad_later])

    if method == "padded" or pairs.pattern.nnz == 0:
        out = padded_sum(*pairs.padded)
    else:
        tables, inverse = pairs.bucketed
        out = jnp.concatenate([padded_sum(*table) for table in tables], axis=0)[inverse]
    return jnp.moveaxis(out, 0, -1)


def _matmul(earlier: Array, later: Array) -> Array:
    """``earlier @ later`` for dense stacks ``(m, *batch, r, c)`` whose batch dims broadcast
    after the stack axis (a shared ``(m, r, c)`` against a per-example ``(m, B, c, k)``)."""
    ndim = max(earlier.ndim, later.ndim)
    return expand_values(earlier, ndim) @ expand_values(later, ndim)


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
        padded rows and a sum (no scatter; :data:`SPMV_METHOD`)."""
        return self._apply(v, extra=0)

    def apply_to_rows(self, y: Array) -> Array:
        return self._apply(y, extra=1)

    def _apply(self, v: Array, extra: int, method: str = SPMV_METHOD) -> Array:
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
            return _cached_plan(self.pattern, earlier.pattern, SPGEMM_METHOD)
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
            return Dense(_matmul(earlier.to_dense().a, self.to_dense().a))
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
    densifying a :class:`Sparse` operand: :meth:`MapStack.then` with the reflected case
    (dense ``later``, sparse ``earlier``) handled by :meth:`Sparse.after`."""
    if isinstance(later, Sparse):
        return later.then(earlier)
    if isinstance(earlier, Sparse):
        return earlier.after(later)
    return Dense(_matmul(earlier.to_dense().a, later.to_dense().a))
