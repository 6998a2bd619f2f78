"""Block-diagonal maps: ``n / k`` blocks of ``k x k`` over a fixed grouping of the vector.

The transposed Jacobian of a cell whose units only talk to a few others stays in this form
through a whole scan: the product of two block-diagonal maps with the same grouping is again
block-diagonal (``g`` products of ``k x k`` blocks, ``O(n k^2)`` instead of ``O(n^3)``), and so
is the product with a diagonal map. Examples: an LSTM with a coupled input/forget gate and a
diagonal recurrence, over the ``(c_i, h_i)`` pairs of its carry (``k = 2``); a cell with
per-head recurrent matrices (``k`` = the head size).
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import jax
import jax.numpy as jnp
import numpy as np
from jax import Array

from bppsa.scan._elements import Dense, Diagonal, MapStack, matmul
from bppsa.scan._pattern import expand_values

SMALL_BLOCK = 8  # up to this size a block acts by multiply-and-sum (XLA fuses it), else matmul


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class BlockDiagonal(MapStack):
    """Maps ``A_k = P^T diag(blocks[k, 0], ..., blocks[k, g - 1]) P``.

    ``P`` groups the vector: ``(P v)[j] = v[perm[j]]``, so block ``b`` acts on the entries
    ``perm[b k : (b + 1) k]`` of the vector (e.g. ``perm = (0, n/2, 1, n/2 + 1, ...)`` pairs
    ``c_i`` with ``h_i`` in a carry packed as ``[c, h]``).

    Attributes:
        blocks: ``(m, *batch, g, k, k)``; ``blocks[s, ..., b]`` is block ``b`` of map ``s``.
        perm: the grouping, a permutation of ``range(g k)`` (static); ``None`` is the
            identity (contiguous blocks).
    """

    blocks: Array
    perm: tuple[int, ...] | None = dataclasses.field(default=None, metadata=dict(static=True))

    per_step_fields: ClassVar[tuple[str, ...]] = ("blocks",)
    shared_fields: ClassVar[tuple[str, ...]] = ()

    def __post_init__(self):
        shape = getattr(self.blocks, "shape", None)
        if shape is not None and (len(shape) < 3 or shape[-1] != shape[-2]):
            raise ValueError(
                f"BlockDiagonal: blocks must have shape (m, *batch, g, k, k), got {shape}."
            )
        if self.perm is not None:
            perm = tuple(int(i) for i in self.perm)
            if shape is not None and sorted(perm) != list(range(shape[-3] * shape[-1])):
                raise ValueError(
                    f"BlockDiagonal: perm must be a permutation of range({shape[-3] * shape[-1]}) "
                    f"(g k for blocks of shape {shape}), got {len(perm)} entries."
                )
            object.__setattr__(self, "perm", None if perm == tuple(range(len(perm))) else perm)

    @property
    def size(self) -> int:
        return self.blocks.shape[-3] * self.blocks.shape[-1]

    @property
    def block(self) -> int:
        """``k``, the size of a block."""
        return self.blocks.shape[-1]

    @property
    def width(self) -> int:
        return self.block

    @property
    def structure(self) -> str:
        return f"block-diagonal k={self.block}"

    # -- grouping ----------------------------------------------------------------------------

    def group(self, v: Array) -> Array:
        """``(..., n) -> (..., g, k)``: the entries of each block together."""
        if self.perm is not None:
            v = jnp.take(v, np.asarray(self.perm), axis=-1)
        return v.reshape(*v.shape[:-1], v.shape[-1] // self.block, self.block)

    def ungroup(self, w: Array) -> Array:
        """The inverse of :meth:`group`."""
        v = w.reshape(*w.shape[:-2], w.shape[-2] * w.shape[-1])
        if self.perm is not None:
            v = jnp.take(v, np.argsort(self.perm), axis=-1)
        return v

    # -- the element interface -----------------------------------------------------------------

    def apply(self, v: Array) -> Array:
        w = self.group(v)  # (m, *batch, g, k)
        return self.ungroup(_act(expand_values(self.blocks, w.ndim + 1), w))

    def apply_to_rows(self, y: Array) -> Array:
        w = self.group(y)  # (m, *batch, c, g, k): row r is acted on as a vector
        blocks = expand_values(self.blocks, w.ndim)[..., None, :, :, :]
        return self.ungroup(_act(blocks, w))

    def to_dense(self) -> Dense:
        g, k = self.blocks.shape[-3], self.block
        eye = jnp.eye(g, dtype=self.blocks.dtype)
        # grouped[..., b, i, c, j] = blocks[..., b, i, j] if b == c
        grouped = self.blocks[..., :, :, None, :] * eye[:, None, :, None]
        a = grouped.reshape(*self.blocks.shape[:-3], g * k, g * k)
        if self.perm is not None:
            inverse = np.argsort(self.perm)
            a = jnp.take(jnp.take(a, inverse, axis=-2), inverse, axis=-1)
        return Dense(a)

    def then(self, earlier: MapStack) -> MapStack:
        if isinstance(earlier, BlockDiagonal) and self.same_grouping(earlier):
            return dataclasses.replace(self, blocks=_product(earlier.blocks, self.blocks))
        if isinstance(earlier, Diagonal):  # diag(d) @ A: scales the rows of every block
            d = self.group(earlier.d)[..., :, :, None]
            ndim = max(d.ndim, self.blocks.ndim)
            scaled = expand_values(d, ndim) * expand_values(self.blocks, ndim)
            return dataclasses.replace(self, blocks=scaled)
        return super().then(earlier)

    def after(self, later: MapStack) -> MapStack:
        if isinstance(later, Diagonal):  # A @ diag(d): scales the columns of every block
            d = self.group(later.d)[..., None, :]
            ndim = max(d.ndim, self.blocks.ndim)
            scaled = expand_values(self.blocks, ndim) * expand_values(d, ndim)
            return dataclasses.replace(self, blocks=scaled)
        return NotImplemented

    def same_grouping(self, other: BlockDiagonal) -> bool:
        return self.block == other.block and self.perm == other.perm

    def transpose(self) -> BlockDiagonal:
        return dataclasses.replace(self, blocks=jnp.swapaxes(self.blocks, -1, -2))

    def diagonal(self) -> Diagonal:
        return Diagonal(self.ungroup(jnp.diagonal(self.blocks, axis1=-2, axis2=-1)))

    def dense_floats_per_step(self) -> int:
        return self.floats_per_step()  # products keep the blocks


def _act(blocks: Array, w: Array) -> Array:
    """``blocks @ w`` blockwise: ``(..., g, k, k) x (..., g, k) -> (..., g, k)``."""
    return _product(blocks, w[..., None])[..., 0]


def _product(earlier: Array, later: Array) -> Array:
    """``earlier @ later`` blockwise, ``(..., k, k) x (..., k, c)``; for small blocks the ``k``
    products are added elementwise (one fusion; XLA's CPU backend runs a reduction over so
    short an axis slowly)."""
    k = earlier.shape[-1]
    if k > SMALL_BLOCK:
        return matmul(earlier, later)
    ndim = max(earlier.ndim, later.ndim)
    earlier, later = expand_values(earlier, ndim), expand_values(later, ndim)
    out = earlier[..., :, 0, None] * later[..., None, 0, :]
    for j in range(1, k):
        out = out + earlier[..., :, j, None] * later[..., None, j, :]
    return out


def block_grouping(sizes: tuple[int, ...]) -> tuple[int, ...]:
    """The ``perm`` that groups entry ``i`` of every one of ``len(sizes)`` equal-length leaves
    packed one after the other (e.g. ``[c, h]``): blocks ``(c_0, h_0), (c_1, h_1), ...``."""
    if len(set(sizes)) != 1:
        raise ValueError(f"block_grouping: the leaves must have equal sizes, got {sizes}.")
    n, leaves = sizes[0], len(sizes)
    return tuple(int(i) for i in np.arange(n * leaves).reshape(leaves, n).T.reshape(-1))
