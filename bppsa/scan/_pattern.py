"""The static pattern of a sparse map: where its non-zeros are, known at trace time.

A transposed Jacobian of a convolution, a ReLU or a max-pooling layer is more than 99% zeros, and
WHERE its non-zeros are is known before any data is seen: from the layer's geometry and its
pruning mask. :class:`Pattern` holds those positions as NumPy arrays (static: known at trace
time, hashable, so ``jax.jit`` can key its cache on them and every symbolic phase runs once per
pattern). The traced values that go with a pattern, ``(m, *vbatch, nnz)``, are held by
:class:`bppsa.scan._sparse.Sparse`; :func:`expand_values` broadcasts them against a batch.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import math

import numpy as np
import scipy.sparse
from jax import Array


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
