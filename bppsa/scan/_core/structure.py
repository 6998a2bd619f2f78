"""Structured step Jacobians: found from a cell's jaxpr, built with one JVP per colour.

For a scan body whose step ``carry -> new_carry`` keeps its carry's units apart (an IndRNN
``tanh(W x + u * h + b)``, a GRU or CIFG-LSTM with diagonal recurrence, per-head recurrences),
the Jacobian ``d carry_t / d carry_{t-1}`` is diagonal or block-diagonal after a permutation of
the packed carry. :func:`carry_dependencies` finds, from the jaxpr alone (never from values),
which packed carry elements each new one may depend on; :func:`classify` groups them into
blocks; :func:`coloured_jacobian` builds the blocks with ``k`` JVPs instead of ``n``.

Packed carry: the float leaves of the carry, each flattened (C order) and concatenated in
``jax.tree.leaves`` order, as ``Layout(concat_last=False)`` packs them; non-float leaves are
not part of it.

Algorithm summary (colouring, Curtis, Powell & Reid 1974): if the Jacobian is block-diagonal
with blocks ``perm[b*k:(b+1)*k]``, the ``j``-th members of all blocks form a colour (no two of
their columns share a nonzero row); one JVP with a tangent of ones on a colour returns the sum
of its columns, in which every row holds exactly one of them.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import scipy.sparse
import scipy.sparse.csgraph
from jax import Array

from bppsa.scan._blocks import BlockDiagonal
from bppsa.scan._core.carry import is_float
from bppsa.scan._core.element_flow import Flow, empty, widen
from bppsa.scan._elements import Dense, Diagonal, MapStack

MAX_BLOCK = 16  # the largest dependency set kept per element; past it, "dense"


@dataclasses.dataclass(frozen=True, eq=False)
class Dependencies:
    """Which packed carry elements each element of the new carry may depend on.

    Attributes:
        n: the packed carry's size.
        sets: ``(n, s)`` int32: row ``i`` lists the input indices output ``i`` may depend on,
            padded with ``-1``; ``None`` when dense.
        reason: why the dependencies are dense (``None`` when they are not).
    """

    n: int
    sets: np.ndarray | None
    reason: str | None = None


def carry_dependencies(
    fun: Callable, carry: Any, *others: Any, max_block: int = MAX_BLOCK
) -> Dependencies:
    """The element-level dependencies of ``fun``'s new carry on its carry, from its jaxpr.

    A conservative pass: a listed dependency may have a zero derivative, an unlisted one never
    has a nonzero one (given that ``custom_jvp`` rules differentiate the function they decorate,
    as JAX's own do). Only ``carry`` is a source; ``others`` (inputs, parameters) are not.
    Traced once with :func:`jax.make_jaxpr`; no value is read.

    Args:
        fun: ``fun(carry, *others) -> new_carry``, ``new_carry`` of ``carry``'s structure and
            float leaves' shapes.
        carry: a pytree of arrays or ``jax.ShapeDtypeStruct``.
        *others: the other arguments (arrays or ``jax.ShapeDtypeStruct``).
        max_block: an element depending on more than this many carry elements counts as
            depending on all of them (the bound on the work and memory of the pass:
            ``max_block`` ints per element of every intermediate value).

    Returns:
        :class:`Dependencies` over the packed carry of size ``n``.
    """
    if max_block < 1:
        raise ValueError(f"max_block must be at least 1; got {max_block}")
    leaves, treedef = jax.tree.flatten(carry)
    floats = [is_float(leaf) for leaf in leaves]
    shapes = [tuple(leaf.shape) if hasattr(leaf, "shape") else np.shape(leaf) for leaf in leaves]
    n = sum(math.prod(shape) for shape, f in zip(shapes, floats) if f)
    closed, out_shape = jax.make_jaxpr(fun, return_shape=True)(carry, *others)
    # JAX's PyTreeDef (jaxlib's, without stubs) is unresolved to type checkers.
    if jax.tree.structure(out_shape) != treedef:  # type: ignore[operator]
        raise ValueError(
            f"fun must return a new carry of the carry's structure {treedef}; "
            f"got {jax.tree.structure(out_shape)}"
        )
    out_leaves = jax.tree.leaves(out_shape)
    for shape, out, f in zip(shapes, out_leaves, floats):
        if f and tuple(out.shape) != shape:
            raise ValueError(
                f"fun must keep the carry's float leaves' shapes: {shape} became {out.shape}"
            )

    sources, offset = [], 0
    for shape, f in zip(shapes, floats):
        size = math.prod(shape) if f else 0
        sources.append(np.arange(offset, offset + size, dtype=np.int32).reshape(*shape, size and 1))
        offset += size
    jaxpr = closed.jaxpr
    sources += [empty(v.aval.shape) for v in jaxpr.invars[len(leaves) :]]
    flow = Flow(n, max_block)
    outs = flow.run(jaxpr, closed.consts, sources, [None] * len(sources))

    rows = [sets.reshape(-1, sets.shape[-1]) for sets, f in zip(outs, floats) if f]
    s = max((r.shape[-1] for r in rows), default=0)
    sets = np.concatenate([widen(r, s) for r in rows]) if rows else empty((0,))
    codes = sets[sets >= n]
    if codes.size:
        return Dependencies(n, None, flow.reasons[int(codes.min()) - n])
    return Dependencies(n, sets)


@dataclasses.dataclass(frozen=True)
class Structure:
    """The block structure of a step Jacobian over the packed carry.

    Attributes:
        kind: ``"diagonal"``, ``"block"`` (block-diagonal after ``perm``) or ``"dense"``.
        n: the packed carry's size.
        block: the block size ``k`` (1 for diagonal, ``n`` for dense).
        perm: ``None`` (the identity) or ``n`` packed indices: block ``b`` is
            ``perm[b*k:(b+1)*k]``, each block's members in increasing order, blocks ordered by
            their first member.
        reason: why the structure is dense (``None`` otherwise).
    """

    kind: str
    n: int
    block: int
    perm: tuple[int, ...] | None = None
    reason: str | None = None

    @property
    def description(self) -> str:
        if self.kind == "block":
            return f"block-diagonal k={self.block}"
        if self.kind == "dense":
            return f"dense ({self.reason})"
        return self.kind


def classify(deps: Dependencies) -> Structure:
    """The coarsest (block-)diagonal structure that ``deps`` allow.

    Blocks are the connected components of the graph with an edge ``i -- j`` wherever output
    ``i`` may depend on input ``j`` (both index the packed carry). Every element alone:
    diagonal; components all of one size ``k < n``: block-diagonal; otherwise dense.
    """
    n = deps.n
    if deps.sets is None:
        return Structure("dense", n, n, reason=deps.reason)
    row, slot = np.nonzero(deps.sets >= 0)
    col = deps.sets[row, slot]
    graph = scipy.sparse.coo_array((np.ones(row.size, np.int8), (row, col)), shape=(n, n))
    count, labels = scipy.sparse.csgraph.connected_components(graph, directed=False)
    sizes = np.unique(np.bincount(labels, minlength=count))
    if sizes.size > 1:
        shown = (
            " and ".join(map(str, sizes)) if sizes.size < 4 else f"{sizes.min()} to {sizes.max()}"
        )
        return Structure("dense", n, n, reason=f"blocks of unequal sizes {shown}")
    k = int(sizes[0]) if n else 1
    if k == 1:
        return Structure("diagonal", n, 1)
    if k == n:
        return Structure("dense", n, n, reason=f"all {n} units are coupled")
    first = np.full(count, n)
    np.minimum.at(first, labels, np.arange(n))
    rank = np.argsort(np.argsort(first))  # blocks ordered by their first member
    perm = np.lexsort((np.arange(n), rank[labels]))
    identity = bool(np.all(perm == np.arange(n)))
    return Structure("block", n, k, None if identity else tuple(int(p) for p in perm))


def coloured_jacobian(fun: Callable[[Array], Array], point: Array, structure: Structure) -> Array:
    """The Jacobian of ``fun`` at ``point`` in ``structure``'s blocks, with ``k`` JVPs.

    Args:
        fun: ``R^n -> R^n`` on the packed carry, with the structure :func:`classify` found.
        point: ``(n,)``, where to differentiate.
        structure: from :func:`classify`.

    Returns:
        diagonal: ``(n,)``, the diagonal (one JVP with a tangent of ones). Otherwise
        ``(n // k, k, k)`` with ``blocks[b, i, j] = d out[perm[b*k + i]] / d in[perm[b*k + j]]``
        (not transposed), from ``k`` JVPs vmapped over one-hot colour tangents; dense: the
        whole Jacobian as ``(1, n, n)``. Works under ``jax.jit`` and ``jax.vmap``.
    """
    n, k = structure.n, structure.block
    if jnp.ndim(point) != 1 or jnp.shape(point)[0] != n:
        raise ValueError(f"point must have shape ({n},) of the structure; got {jnp.shape(point)}")
    dtype = jnp.result_type(point)
    if structure.kind == "diagonal":
        return jax.jvp(fun, (point,), (jnp.ones(n, dtype),))[1]
    members = np.arange(n) if structure.perm is None else np.asarray(structure.perm)
    members = members.reshape(n // k, k)  # members[b, j]: the j-th member of block b
    tangents = np.zeros((k, n))
    tangents[np.arange(k)[None, :], members] = 1.0
    columns = jax.vmap(lambda t: jax.jvp(fun, (point,), (t,))[1])(jnp.asarray(tangents, dtype))
    # columns[j, r] = d out[r] / d in[members[b, j]] for the block b of row r
    return jnp.transpose(columns[:, members], (1, 2, 0))


def coloured_jacobian_t(
    fun: Callable[[Array], Array], point: Array, structure: Structure
) -> MapStack:
    """The transposed Jacobian of ``fun`` at ``point`` as one step's element, with ``k`` VJPs.

    A VJP with a cotangent of ones on the ``j``-th members of every block returns, at input
    ``members[b, i]``, the one entry ``J[members[b, j], members[b, i]]``: column ``j`` of block
    ``b`` of ``J^T``. VJPs, not JVPs, so that a body with a ``jax.custom_vjp`` function works as
    it does on the dense path (``jax.jacrev``).

    Returns:
        :class:`~bppsa.scan.Diagonal` ``(n,)``, :class:`~bppsa.scan.BlockDiagonal`
        ``(n // k, k, k)`` with ``structure.perm``, or :class:`~bppsa.scan.Dense` ``(n, n)``
        for a dense structure (``n`` VJPs, as ``jax.jacrev``).
    """
    n, k = structure.n, structure.block
    if structure.kind == "dense":
        return Dense(jax.jacrev(fun)(point).T)
    dtype = jnp.result_type(point)
    _, pullback = jax.vjp(fun, point)
    if structure.kind == "diagonal":
        return Diagonal(pullback(jnp.ones(n, dtype))[0])
    members = np.arange(n) if structure.perm is None else np.asarray(structure.perm)
    members = members.reshape(n // k, k)  # members[b, j]: the j-th member of block b
    cotangents = np.zeros((k, n))
    cotangents[np.arange(k)[None, :], members] = 1.0
    rows = jax.vmap(lambda c: pullback(c)[0])(jnp.asarray(cotangents, dtype))  # (k, n)
    # rows[j, members[b, i]] = (J^T)[members[b, i], members[b, j]]: block b of J^T at (i, j)
    return BlockDiagonal(jnp.transpose(rows[:, members], (1, 2, 0)), structure.perm)


def carry_structure(step: Callable, carry: Any, *others: Any) -> Structure:
    """:func:`classify` of ``step``'s dependencies, dense (with the reason) wherever the
    analysis cannot read the step: structure is a property of the function, never a guess."""
    try:
        return classify(carry_dependencies(step, carry, *others))
    except Exception as error:  # an unreadable step keeps the exact dense path
        n = sum(math.prod(np.shape(leaf)) for leaf in jax.tree.leaves(carry) if is_float(leaf))
        reason = f"the dependency analysis failed: {type(error).__name__}: {error}"
        return Structure("dense", n, n, reason=reason[:200])
