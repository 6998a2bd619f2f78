"""Carries as vectors: which leaves are differentiated and how they pack into one vector."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import Array


def is_float(leaf: Any) -> bool:
    """True for leaves that get cotangents (inexact dtypes); ints and bools get none."""
    dtype = leaf.dtype if hasattr(leaf, "dtype") else jnp.result_type(leaf)
    return jnp.issubdtype(dtype, jnp.inexact)


def zero_cotangent(aval: Any) -> Array | np.ndarray:
    """A zero cotangent for a leaf: ``float0`` for integer and boolean leaves, as JAX expects."""
    if is_float(aval):
        return jnp.zeros(aval.shape, aval.dtype)
    return np.zeros(aval.shape, dtype=jax.dtypes.float0)


def zeros_for_none(tree, like):
    """``tree`` with a zero (``float0`` for integer leaves) wherever it has ``None``."""
    return jax.tree.map(
        lambda t, a: zero_cotangent(a) if t is None and a is not None else t,
        tree,
        like,
        is_leaf=lambda x: x is None,
    )


def floats_only(tree):
    """``None`` for every leaf that is not a float array (what :func:`linear_map` carries)."""
    return jax.tree.map(lambda t: t if is_float(t) else None, tree)


def unstacked(a: Any) -> jax.ShapeDtypeStruct:
    """The shape and dtype of one step of a stacked array (without its leading axis)."""
    return jax.ShapeDtypeStruct(a.shape[1:], a.dtype)


@dataclasses.dataclass(frozen=True)
class Layout:
    """Packs the float leaves of a carry into the vector that the scan propagates.

    ``concat_last=True``: leaves share all but their last axis and are concatenated along it
    (the layout of the analytic cell Jacobians, block-diagonal over leading batch dims).
    ``concat_last=False``: every float leaf is flattened and concatenated (autodiff Jacobians).
    """

    treedef: Any
    float_mask: tuple[bool, ...]
    shapes: tuple[tuple[int, ...], ...]
    dtypes: tuple[Any, ...]
    concat_last: bool

    @classmethod
    def of(cls, carry: Any, *, concat_last: bool) -> Layout:
        leaves, treedef = jax.tree.flatten(carry)
        mask = tuple(is_float(leaf) for leaf in leaves)
        floats = [leaf for leaf, f in zip(leaves, mask) if f]
        return cls(
            treedef=treedef,
            float_mask=mask,
            shapes=tuple(tuple(jnp.shape(leaf)) for leaf in floats),
            dtypes=tuple(jnp.result_type(leaf) for leaf in floats),
            concat_last=concat_last,
        )

    @property
    def dtype(self):
        return jnp.result_type(*self.dtypes) if self.dtypes else jnp.float32

    def float_leaves(self, carry: Any) -> list[Any]:
        leaves = self.treedef.flatten_up_to(carry)
        return [leaf for leaf, f in zip(leaves, self.float_mask) if f]

    def pack(self, carry: Any, *, stacked: bool = False) -> Array:
        """The vector of ``carry`` (with a leading stack axis if ``stacked``)."""
        return self._pack_floats(self.float_leaves(carry), stacked)

    def _pack_floats(self, leaves: list[Any], stacked: bool) -> Array:
        lead = 1 if stacked else 0
        leaves = [jnp.asarray(x, self.dtype) for x in leaves]
        if self.concat_last:
            return jnp.concatenate(leaves, axis=-1)
        flat = [x.reshape(*x.shape[:lead], math.prod(x.shape[lead:])) for x in leaves]
        return jnp.concatenate(flat, axis=-1)

    def _float_parts(self, vector: Array, stacked: bool) -> list[Array]:
        lead = vector.shape[:1] if stacked else ()
        sizes = [s[-1] if self.concat_last else math.prod(s) for s in self.shapes]
        parts = jnp.split(vector, np.cumsum(sizes)[:-1], axis=-1)
        return [
            part.reshape(*lead, *shape).astype(dtype)
            for part, shape, dtype in zip(parts, self.shapes, self.dtypes)
        ]

    def _merge(self, floats: list[Array], others: list[Any]) -> Any:
        float_leaves, other_leaves = iter(floats), iter(others)
        return self.treedef.unflatten(
            [next(float_leaves) if f else next(other_leaves) for f in self.float_mask]
        )

    def unpack(self, vector: Array, like: Any, *, stacked: bool = False) -> Any:
        """A carry cotangent from ``vector``; non-float leaves of ``like`` get ``float0`` zeros."""
        return self._merge(self._float_parts(vector, stacked), self._other_zeros(like))

    def _other_zeros(self, like: Any) -> list[Any]:
        """``float0`` zeros for the non-float leaves of ``like``."""
        leaves = self.treedef.flatten_up_to(like)
        return [zero_cotangent(leaf) for leaf, f in zip(leaves, self.float_mask) if not f]

    def unpack_into(self, vector: Array, carry: Any) -> Any:
        """``carry`` with its float leaves replaced by the parts of ``vector``."""
        others = [
            leaf for leaf, f in zip(self.treedef.flatten_up_to(carry), self.float_mask) if not f
        ]
        return self._merge(self._float_parts(vector, False), others)

    def zeros(self, like: Any) -> Any:
        """A zero cotangent for every leaf of ``like``."""
        return jax.tree.map(zero_cotangent, like)


@dataclasses.dataclass(frozen=True)
class BatchedLayout:
    """A :class:`Layout` of one example, for carries that hold a batch of examples on a leading
    axis (after the stack axis, if stacked): every example is packed as ``layout`` packs it, so
    vectors are ``(*stack, B, n)``.

    Attributes:
        layout: the layout of one example.
    """

    layout: Layout

    @property
    def float_mask(self) -> tuple[bool, ...]:
        return self.layout.float_mask

    @property
    def shapes(self) -> tuple[tuple[int, ...], ...]:
        """The float leaves' shapes of ONE example."""
        return self.layout.shapes

    @property
    def dtype(self):
        return self.layout.dtype

    def pack(self, carry: Any, *, stacked: bool = False) -> Array:
        axis = 1 if stacked else 0
        pack = jax.vmap(lambda floats: self.layout._pack_floats(floats, stacked), axis, axis)
        return pack(self.layout.float_leaves(carry))

    def unpack(self, vector: Array, like: Any, *, stacked: bool = False) -> Any:
        layout, axis = self.layout, 1 if stacked else 0
        floats = jax.vmap(lambda v: layout._float_parts(v, stacked), axis, axis)(vector)
        return layout._merge(floats, layout._other_zeros(like))

    def zeros(self, like: Any) -> Any:
        return self.layout.zeros(like)
