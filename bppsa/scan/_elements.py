"""Stacks of linear maps that the scan algorithms combine.

A scan over back-propagation works on the maps ``g_t -> A_t g_t`` where ``A_t = J_t^T`` is the
transposed Jacobian of step ``t``. The algorithms in this package only need four operations on a
stack of ``m`` such maps: apply them to a stack of vectors, multiply two stacks, slice a stack,
and concatenate stacks. Every element type here implements them, so dense, structured and (later)
sparse Jacobians share one implementation of each algorithm.

Maps act on vectors of shape ``(*batch, n)``: the leading ``batch`` dims index independent
examples, so a map is block-diagonal over them (the shape a cell gives when it is called on a
batch of hidden states).
"""

from __future__ import annotations

import dataclasses
from typing import Protocol, runtime_checkable

import jax
import jax.numpy as jnp
from jax import Array


@runtime_checkable
class Linear(Protocol):
    """A stack of ``m`` linear maps on vectors of shape ``(*batch, n)``."""

    def __len__(self) -> int: ...

    def matvec(self, v: Array) -> Array:
        """Applies map ``k`` to ``v[k]``; ``v: (m, *batch, n) -> (m, *batch, n)``."""
        ...

    def rmatmat(self, y: Array) -> Array:
        """``y[k] @ A_k^T``: map ``k`` applied to the ROWS of ``y[k]``; ``y: (m, *batch, c, n)``.

        Rows rather than columns, so that every stacked and batch dim folds into the rows of a
        single matrix product with the shared weights, without transposes.
        """
        ...

    def to_dense(self) -> Dense:
        """The same maps as explicit matrices."""
        ...

    def take(self, start: int, stop: int, step: int = 1) -> Linear:
        """The maps ``start:stop:step`` of the stack."""
        ...


def map_stacked(obj, fn):
    """Applies ``fn`` to the (non-``None``) fields of ``obj`` that carry the stack axis."""
    changes = {name: getattr(obj, name) for name in obj.stacked_fields}
    changes = {k: fn(v) for k, v in changes.items() if v is not None}
    return dataclasses.replace(obj, **changes)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Dense:
    """Explicit matrices, ``A_k = a[k]``.

    Attributes:
        a: ``(m, *batch, n, n)``; ``a[k, b]`` is the block of example ``b``.
    """

    a: Array

    stacked_fields = ("a",)
    shared_fields = ()

    def __len__(self) -> int:
        return self.a.shape[0]

    def matvec(self, v: Array) -> Array:
        return jnp.einsum("...ij,...j->...i", self.a, v)

    def rmatmat(self, y: Array) -> Array:
        return y @ jnp.swapaxes(self.a, -1, -2)

    def to_dense(self) -> Dense:
        return self

    def take(self, start: int, stop: int, step: int = 1) -> Dense:
        return Dense(self.a[start:stop:step])


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Structured:
    """Maps of the form ``A_k = u @ diag(d[k]) @ R + diag(e[k])`` with a shared ``u``.

    ``R`` stacks ``reps`` identity matrices, so ``R @ v`` is ``v`` tiled ``reps`` times. This is
    the shape of the transposed Jacobian of the usual recurrent cells: for an Elman RNN
    ``J^T = W_hh^T diag(f'(z))`` (``reps=1``, no ``e``); for a GRU the three gate blocks of
    ``W_hh`` give ``reps=3`` plus the diagonal ``z`` term. Applying such a map costs one
    ``(n, p)`` matrix-vector product instead of forming an ``(n, n)`` matrix per step.

    Attributes:
        u: ``(n, p)`` with ``p = reps * n``, shared by every map of the stack.
        d: ``(m, *batch, p)``.
        e: ``(m, *batch, n)`` or ``None`` for no diagonal term.
        reps: how many times the vector is tiled (static).
    """

    u: Array
    d: Array
    e: Array | None = None
    reps: int = dataclasses.field(default=1, metadata=dict(static=True))

    stacked_fields = ("d", "e")
    shared_fields = ("u",)

    def __len__(self) -> int:
        return self.d.shape[0]

    def matvec(self, v: Array) -> Array:
        tiled = jnp.concatenate([v] * self.reps, axis=-1) if self.reps > 1 else v
        out = (self.d * tiled) @ self.u.T
        if self.e is not None:
            out = out + self.e * v
        return out

    def rmatmat(self, y: Array) -> Array:
        # y A^T = (tile(y) * d) u^T + y * e: ONE (m*batch*c, p) @ (p, n) product.
        tiled = jnp.concatenate([y] * self.reps, axis=-1) if self.reps > 1 else y
        out = (tiled * self.d[..., None, :]) @ self.u.T
        if self.e is not None:
            out = out + y * self.e[..., None, :]
        return out

    def to_dense(self) -> Dense:
        n = self.u.shape[0]
        # (u * d) has shape (m, *batch, n, p); summing the reps blocks of p applies R.
        scaled = self.u * self.d[..., None, :]
        a = scaled.reshape(*scaled.shape[:-1], self.reps, n).sum(axis=-2)
        if self.e is not None:
            a = a + self.e[..., :, None] * jnp.eye(n, dtype=a.dtype)
        return Dense(a)

    def take(self, start: int, stop: int, step: int = 1) -> Structured:
        return map_stacked(self, lambda x: x[start:stop:step])


def matmul(second: Linear, first: Linear) -> Dense:
    """The stack of products ``second[k] @ first[k]`` (apply ``first``, then ``second``)."""
    return Dense(second.to_dense().a @ first.to_dense().a)


def concat(parts: list[Linear]) -> Linear:
    """Concatenates stacks along the stack axis (dense unless all parts are ``Dense``)."""
    if len(parts) == 1:
        return parts[0]
    return Dense(jnp.concatenate([p.to_dense().a for p in parts], axis=0))


def index(elems: Linear, i: Array) -> Linear:
    """Map ``i`` of the stack (a traced index is fine), as a stack of length one."""
    return map_stacked(elems, lambda x: jax.lax.dynamic_slice_in_dim(x, i, 1))


def flip(elems: Linear) -> Linear:
    """The stack in reverse order."""
    return map_stacked(elems, lambda x: x[::-1])


def vmap_out_axes(elems: Linear):
    """``out_axes`` for ``jax.vmap`` that builds a stack with its shared fields unbatched."""
    axes = {name: 0 for name in elems.stacked_fields if getattr(elems, name) is not None}
    axes |= {name: None for name in elems.shared_fields}
    return dataclasses.replace(elems, **axes)
