"""Stacks of linear maps: the element interface that every scan algorithm is written against.

A scan over back-propagation works on the maps ``g_t -> A_t g_t`` where ``A_t = J_t^T`` is the
transposed Jacobian of step ``t``. :class:`MapStack` lists everything the algorithms, the memory
model and the debug check use: applying the maps to vectors (or to the rows of matrices),
composing two stacks (:meth:`MapStack.then`: which operand is later in time is in the name),
slicing, flipping, concatenating, the floats a step keeps, and which fields carry the stack axis
(per-step) and which are shared by every map of the stack. :class:`Dense`, :class:`Structured`
and :class:`Diagonal` implement it (``BlockDiagonal`` too, in :mod:`bppsa.scan._blocks`); a new
element type (e.g. sparse) implements the abstract methods and overrides the defaults where it
can do better than densifying.

Maps act on vectors of shape ``(*batch, n)``: the leading ``batch`` dims index independent
examples, so a map is block-diagonal over them (the shape a cell gives when it is called on a
batch of hidden states).
"""

from __future__ import annotations

import abc
import dataclasses
import math
from collections.abc import Callable, Sequence
from typing import Any, ClassVar, Self, cast

import jax
import jax.numpy as jnp
from jax import Array

from bppsa.scan import _kernels, _precision
from bppsa.scan._pattern import expand_values


class MapStack(abc.ABC):
    """A stack of ``m`` linear maps ``A_0, ..., A_{m-1}`` on vectors of shape ``(*batch, n)``.

    Subclasses are frozen dataclasses registered as pytrees whose fields are arrays: the ones
    named in :attr:`per_step_fields` have the stack axis first (``None`` allowed), the ones in
    :attr:`shared_fields` are the same for every map of the stack.
    """

    per_step_fields: ClassVar[tuple[str, ...]]
    shared_fields: ClassVar[tuple[str, ...]]
    # Set by @dataclasses.dataclass on each subclass: what dataclasses.replace and fields need.
    __dataclass_fields__: ClassVar[dict[str, dataclasses.Field[Any]]]

    # -- what an element type must say -------------------------------------------------------

    @property
    @abc.abstractmethod
    def size(self) -> int:
        """``n``, the length of the vectors the maps act on."""

    @abc.abstractmethod
    def apply(self, v: Array) -> Array:
        """Applies map ``k`` to ``v[k]``; ``v: (m, *batch, n) -> (m, *batch, n)``."""

    @abc.abstractmethod
    def apply_to_rows(self, y: Array) -> Array:
        """``y[k] @ A_k^T``: map ``k`` applied to the ROWS of ``y[k]``; ``y: (m, *batch, c, n)``.

        Rows rather than columns, so that every stacked and batch dim folds into the rows of a
        single matrix product with shared weights, without transposes.
        """

    @abc.abstractmethod
    def to_dense(self) -> Dense:
        """The same maps as explicit matrices."""

    # -- defaults, written once against the fields -------------------------------------------

    def per_step(self) -> dict[str, Array | None]:
        """The fields that carry the stack axis (first), by name."""
        return {name: getattr(self, name) for name in self.per_step_fields}

    def shared(self) -> dict[str, Array]:
        """The fields shared by every map of the stack, by name."""
        return {name: getattr(self, name) for name in self.shared_fields}

    def with_per_step(self, **fields: Array | None) -> Self:
        """The same shared fields with new per-step fields."""
        return dataclasses.replace(self, **fields)

    def map_per_step(self, fn: Callable[[Array], Array]) -> Self:
        """Applies ``fn`` to every (non-``None``) per-step field."""
        fields = {k: fn(v) for k, v in self.per_step().items() if v is not None}
        return self.with_per_step(**fields)

    def __len__(self) -> int:
        return next(v.shape[0] for v in self.per_step().values() if v is not None)

    def take(self, start: int, stop: int, step: int = 1) -> Self:
        """The maps ``start:stop:step`` of the stack (static bounds)."""
        return self.map_per_step(lambda x: x[start:stop:step])

    def index(self, i: Array) -> Self:
        """Map ``i`` (a traced index is fine), as a stack of length one."""
        return self.map_per_step(lambda x: jax.lax.dynamic_slice_in_dim(x, i, 1))

    def flip(self) -> Self:
        """The stack in reverse order."""
        return self.map_per_step(lambda x: x[::-1])

    def sequential_unroll(self, shape: tuple[int, ...]) -> int:
        """How many steps a sequential scan over these maps unrolls, for vectors of ``shape``
        (``(*batch, n)``): 1 unless an element type's steps are so short that the loop's own
        overhead counts."""
        return 1

    def then(self, earlier: MapStack) -> MapStack:
        """The maps ``earlier[k] @ self[k]``: ``self`` (the LATER step's map, the one nearer the
        loss) is applied to the cotangent first, then ``earlier``.

        The default asks ``earlier`` first (:meth:`after`, the reflected product: a sparse
        earlier map multiplies a dense later one by gathers), else forms dense matrices;
        element types whose products keep a structure override it.
        """
        product = earlier.after(self)
        if product is not NotImplemented:
            return product
        return Dense(matmul(earlier.to_dense().a, self.to_dense().a))

    def after(self, later: MapStack) -> MapStack:
        """``self[k] @ later[k]`` with ``self`` the EARLIER map, for a ``later`` map whose own
        :meth:`then` does not know ``self``'s type; ``NotImplemented`` (the default) lets
        :meth:`then` form dense matrices."""
        return NotImplemented

    def transpose(self) -> MapStack:
        """The maps ``A_k^T`` (as dense matrices unless the type keeps a structure): what a
        scan forward in time applies, ``J_t = (J_t^T)^T``."""
        return Dense(jnp.swapaxes(self.to_dense().a, -1, -2))

    def diagonal(self) -> Diagonal:
        """The diagonals of the maps, as maps of their own (a quasi-Newton approximation)."""
        return Diagonal(jnp.diagonal(self.to_dense().a, axis1=-2, axis2=-1))

    @property
    def width(self) -> int:
        """The inner dimension of a product of two such maps: ``n`` for dense ones (a product
        costs ``2 n^3`` flops per example), ``k`` for ``k x k`` blocks, ``1`` for diagonals
        (a product costs ``2 x`` the floats it forms times ``width``)."""
        return self.size

    @property
    def structure(self) -> str | None:
        """The name of a structure products of these maps keep (``None``: they are dense)."""
        return None

    def floats_per_step(self) -> int:
        """Floats one map of the stack keeps as stored (its batch dims included)."""
        return sum(math.prod(v.shape[1:]) for v in self.per_step().values() if v is not None)

    def dense_floats_per_step(self) -> int:
        """Floats one map would keep as a dense matrix (what parallel products form)."""
        return math.prod(jax.eval_shape(lambda maps: maps.to_dense().a, self).shape[1:])

    def nonfinite_steps(self) -> Array:
        """``(m,)`` bool: whether map ``k`` holds a NaN or an infinity."""
        bad = jnp.zeros(len(self), bool)
        for v in self.per_step().values():
            if v is not None:
                bad = bad | ~jnp.isfinite(v).all(axis=tuple(range(1, v.ndim)))
        return bad

    def stack_axes(self) -> Self:
        """``out_axes`` for ``jax.vmap`` building such a stack with its shared fields unbatched."""
        axes: dict[str, int | None] = {
            name: 0 for name, v in self.per_step().items() if v is not None
        }
        axes |= {name: None for name in self.shared_fields}
        return dataclasses.replace(self, **axes)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Dense(MapStack):
    """Explicit matrices, ``A_k = a[k]``.

    Attributes:
        a: ``(m, *batch, n, n)``; ``a[k, b]`` is the block of example ``b``.
    """

    a: Array

    per_step_fields: ClassVar[tuple[str, ...]] = ("a",)
    shared_fields: ClassVar[tuple[str, ...]] = ()

    @property
    def size(self) -> int:
        return self.a.shape[-1]

    def apply(self, v: Array) -> Array:
        return _precision.einsum("...ij,...j->...i", self.a, v)

    def apply_to_rows(self, y: Array) -> Array:
        return _precision.matmul(y, jnp.swapaxes(self.a, -1, -2))

    def to_dense(self) -> Dense:
        return self

    def diagonal(self) -> Diagonal:
        return Diagonal(jnp.diagonal(self.a, axis1=-2, axis2=-1))


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Structured(MapStack):
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

    per_step_fields: ClassVar[tuple[str, ...]] = ("d", "e")
    shared_fields: ClassVar[tuple[str, ...]] = ("u",)

    @property
    def size(self) -> int:
        return self.u.shape[0]

    def apply(self, v: Array) -> Array:
        n = self.size
        if self.reps > 1:  # d * tile(v), by broadcasting (a concatenation is slower in loops)
            blocks = self.d.reshape(*self.d.shape[:-1], self.reps, n) * v[..., None, :]
            scaled = blocks.reshape(*blocks.shape[:-2], self.reps * n)
        else:
            scaled = self.d * v
        if self._small(v.shape):
            # A few small rows (a sequential scan's step at a small batch): one fused
            # multiply-and-sum beats a matrix-product call (Kernels.small_rows).
            out = (scaled[..., :, None] * self.u.T).sum(-2)
        elif self.e is not None and self._folds_diagonal(v.shape):
            # [d * tile(v), e * v] @ [u^T; I]: the diagonal term inside the product, one kernel
            # less per step (at one row XLA's fused loop of the product apart wins).
            folded = jnp.concatenate([scaled, self.e * v], axis=-1)
            eye = jnp.eye(n, dtype=self.u.dtype)
            return _precision.matmul(folded, jnp.concatenate([self.u.T, eye]))
        else:
            out = _precision.matmul(scaled, self.u.T)
        if self.e is not None:
            out = out + self.e * v
        return out

    def _small(self, shape) -> bool:
        kernels = _kernels.current()
        rows = math.prod(shape[:-1])
        return self.reps == 1 and self.size <= kernels.small_size and rows <= kernels.small_rows

    def _folds_diagonal(self, shape) -> bool:
        low, high = _kernels.current().folded_diagonal_rows
        return self.e is not None and low <= math.prod(shape[:-1]) <= high

    def sequential_unroll(self, shape) -> int:
        # The fused steps of a few small rows, or of one row of a tiled map, are short enough
        # that the loop's own overhead shows.
        kernels = _kernels.current()
        rows = math.prod(shape[:-1])
        if self._small(shape) and rows <= kernels.small_unroll_rows:
            return kernels.small_unroll
        return kernels.tiled_one_row_unroll if self.reps > 1 and rows == 1 else 1

    def apply_to_rows(self, y: Array) -> Array:
        # y A^T = (tile(y) * d) u^T + y * e: ONE (m*batch*c, p) @ (p, n) product.
        tiled = jnp.concatenate([y] * self.reps, axis=-1) if self.reps > 1 else y
        out = _precision.matmul(tiled * self.d[..., None, :], self.u.T)
        if self.e is not None:
            out = out + y * self.e[..., None, :]
        return out

    def to_dense(self) -> Dense:
        n = self.u.shape[0]
        # sum_r u_r diag(d_r) over the reps blocks of p, added block by block: one elementwise
        # fusion (XLA's CPU backend runs a reduction over a (..., n, reps, n) product slowly;
        # docs/width.md, the Newton forward against DEER's).
        a = self.u[:, :n] * self.d[..., None, :n]
        for r in range(1, self.reps):
            a = a + self.u[:, r * n : (r + 1) * n] * self.d[..., None, r * n : (r + 1) * n]
        if self.e is not None:
            a = a + self.e[..., :, None] * jnp.eye(n, dtype=a.dtype)
        return Dense(a)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Diagonal(MapStack):
    """Diagonal maps, ``A_k = diag(d[k])``: the exact transposed Jacobian of a cell whose units
    do not talk to each other (IndRNN, a GRU with diagonal recurrence), and quasi-Newton's
    approximation of any other. Products stay diagonal: ``O(n)`` per step.

    Attributes:
        d: ``(m, *batch, n)``.
    """

    d: Array

    per_step_fields: ClassVar[tuple[str, ...]] = ("d",)
    shared_fields: ClassVar[tuple[str, ...]] = ()

    @property
    def size(self) -> int:
        return self.d.shape[-1]

    def apply(self, v: Array) -> Array:
        return self.d * v

    def apply_to_rows(self, y: Array) -> Array:
        return y * self.d[..., None, :]

    def to_dense(self) -> Dense:
        return Dense(self.d[..., :, None] * jnp.eye(self.size, dtype=self.d.dtype))

    def then(self, earlier: MapStack) -> MapStack:
        if isinstance(earlier, Diagonal):
            ndim = max(earlier.d.ndim, self.d.ndim)
            return Diagonal(expand_values(earlier.d, ndim) * expand_values(self.d, ndim))
        return super().then(earlier)

    def transpose(self) -> Diagonal:
        return self

    def diagonal(self) -> Diagonal:
        return self

    @property
    def width(self) -> int:
        return 1

    @property
    def structure(self) -> str:
        return "diagonal"

    def dense_floats_per_step(self) -> int:
        return self.floats_per_step()  # products stay diagonal


def matmul(earlier: Array, later: Array) -> Array:
    """``earlier @ later`` for dense stacks ``(m, *batch, r, c)`` whose batch dims broadcast
    after the stack axis (a shared ``(m, r, c)`` against a per-example ``(m, B, c, k)``)."""
    ndim = max(earlier.ndim, later.ndim)
    return _precision.matmul(expand_values(earlier, ndim), expand_values(later, ndim))


def concat(parts: Sequence[MapStack]) -> MapStack:
    """Concatenates stacks along the stack axis.

    Stacks of one type that share the same shared fields (the very same arrays) and the same
    static fields stay of that type; anything else is concatenated as dense matrices.
    """
    if len(parts) == 1:
        return parts[0]
    first = parts[0]
    if all(_compatible(first, p) for p in parts[1:]):
        fields = {}
        for name, value in first.per_step().items():
            if value is not None:  # then not None in any part (_compatible)
                per_part = [cast(Array, p.per_step()[name]) for p in parts]
                fields[name] = jnp.concatenate(per_part, axis=0)
        return first.with_per_step(**fields)
    return Dense(jnp.concatenate([p.to_dense().a for p in parts], axis=0))


def _compatible(a: MapStack, b: MapStack) -> bool:
    if type(a) is not type(b):
        return False
    if any(x is not y for x, y in zip(a.shared().values(), b.shared().values())):
        return False
    if any(
        (x is None) != (y is None) for x, y in zip(a.per_step().values(), b.per_step().values())
    ):
        return False
    static = [f.name for f in dataclasses.fields(a) if f.metadata.get("static")]
    return all(getattr(a, name) == getattr(b, name) for name in static)
