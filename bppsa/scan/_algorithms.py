"""Scans that back-propagate a cotangent through a chain of affine maps.

Every algorithm here solves the same problem. Given the cotangent ``g_T`` of the last state and
the elements ``e_1, ..., e_T`` with ``e_t: g_t -> g_{t-1} = A_t g_t + b_t`` (``A_t`` the transposed
Jacobian of step ``t``, ``b_t`` the cotangent that arrives at step ``t`` from its other outputs),
return ``[g_0, g_1, ..., g_T]``. Inputs and outputs are in TIME order (index ``t - 1`` of
``linear`` and ``offsets`` is step ``t``); the scan itself runs from the end, from ``g_T``.
``offsets=None`` means no ``b_t`` (a loss on the last state only).

This is an inclusive scan over ``[g_T, e_T, ..., e_1]`` with the operator ``combine`` below.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import Array

from bppsa.scan._elements import Dense, MapStack, concat
from bppsa.scan._sparse import Sparse, _dense_shape

Element = tuple[MapStack, Array]  # an affine map g -> A g + b, stacked: (A, b)
Maps = MapStack | list[MapStack] | tuple[MapStack, ...]  # a stack, or a chain's maps in a list


def combine(later: Element, earlier: Element) -> Element:
    """Composes two affine elements into one: ``later`` is applied to the cotangent first.

    ``later = (A_l, b_l)`` is the element LATER in time (nearer the loss), ``earlier = (A_e,
    b_e)`` the one EARLIER in time. Both ``A`` are transposed Jacobians, applied on the left of
    the cotangent. The result maps ``g -> A_e (A_l g + b_l) + b_e``, i.e.
    ``(A_e @ A_l, A_e b_l + b_e)``. The operator is associative but not commutative.
    Elements without offsets (``b = None`` in both, e.g. the maps of a chain of layers whose
    loss is on the last one only) compose to ``(A_e @ A_l, None)``.
    """
    (a_later, b_later), (a_earlier, b_earlier) = later, earlier
    if b_later is None and b_earlier is None:
        return a_later.then(a_earlier), None
    return a_later.then(a_earlier), a_earlier.apply(b_later) + b_earlier


def apply(vector: Array, element: Element) -> Array:
    """Applies elements to cotangents: ``A v + b`` (the vector is the LATER operand)."""
    a, b = element
    return a.apply(vector) + b


def sequential(g_last: Array, linear: Maps, offsets: Array | None):
    """Linear reverse scan (back-propagation itself): ``len(linear)`` dependent steps.

    Args:
        g_last: ``(*batch, n)`` cotangent of the last state, ``g_T``.
        linear: stack of the ``T`` maps ``A_1, ..., A_T`` (time order), or a list of maps that
            differ in shape (a chain of layers, see :func:`chain_scan`).
        offsets: ``(T, *batch, n)`` the matching ``b_1, ..., b_T``, or ``None`` (always for a
            list).

    Returns:
        ``(T + 1, *batch, n)``: ``g_0, g_1, ..., g_T`` (a list of them for a list of maps).
    """
    if isinstance(linear, list | tuple):
        return _over_list(g_last, linear, offsets, levels=0)
    if len(linear) == 0:
        return g_last[None]

    def step(g, k):
        g = linear.index(k).apply(g[None])[0]
        if offsets is not None:
            g = g + offsets[k]
        return g, g

    unroll = linear.sequential_unroll(g_last.shape)
    _, rest = jax.lax.scan(step, g_last, jnp.arange(len(linear)), reverse=True, unroll=unroll)
    return jnp.concatenate([rest, g_last[None]], axis=0)


def blelloch(
    g_last: Array,
    linear: Maps,
    offsets: Array | None,
    levels: int | None = None,
):
    """BPPSA's modified Blelloch scan: ``2 ceil(log2 (T + 1))`` parallel levels.

    Algorithm summary (Wang, Bai & Pekhimenko, "BPPSA: Scaling Back-propagation by Parallel Scan
    Algorithm", MLSys 2020). The sequence is ``s = [g_T, e_T, ..., e_1]``.

    * Up-sweep: at each level, adjacent pairs ``(s[2i], s[2i+1])`` are combined into one element
      of the next level (an odd element at the end is carried up unchanged). The leftmost pair
      holds the cotangent vector, so its result is again a vector (a matrix-vector product);
      every other pair costs one matrix-matrix product. The aggregates of every level are kept.
    * Down-sweep: from the top, the inclusive prefix of every position is completed. The prefix
      of a pair's right element is the prefix of the pair one level up; the prefix of its left
      element is the prefix of the previous pair, followed by that left element. Each prefix
      contains ``g_T``, so it is a vector and this half does matrix-vector products only.

    Keeping the vector as the leftmost element is the paper's modification: the total work is
    about ``T`` matrix-matrix products (up-sweep) plus ``O(T)`` matrix-vector products, instead
    of the ``~2T`` matrix-matrix products of a scan that treats the vector as one more matrix.
    Works for any ``T``, not only powers of two. The Blelloch formulation with an exclusive scan
    and an identity at the root gives the same prefixes; the inclusive form avoids having to
    represent the identity in every element type.

    Args and returns: as :func:`sequential`; ``levels`` limits the parallel up-sweep levels
    (``None``: all of them): after ``levels`` levels, a linear scan over the elements left,
    then as many down-sweep levels (the paper's heterogeneous scan, for fewer workers than
    elements; ``0`` is the sequential scan).
    """
    if isinstance(linear, list | tuple):
        return _over_list(g_last, linear, offsets, levels=levels)
    _check_levels(levels)
    if offsets is None:
        offsets = jnp.zeros((len(linear), *g_last.shape), g_last.dtype)
    # The sweeps below index the sequence in scan order: the latest step first.
    return blelloch_scan_order(g_last, linear.flip(), offsets[::-1], levels)[::-1]


def blelloch_scan_order(
    g_last: Array, linear: MapStack, offsets: Array, up_levels: int | None = None
) -> Array:
    """:func:`blelloch` with inputs and outputs in scan order (latest step first), with at most
    ``up_levels`` up-sweep levels (``None``: all)."""
    return sweeps(g_last[None], _Stack(linear, offsets), up_levels)


def _over_list(g_last, maps, offsets, levels):
    if offsets is not None:
        raise ValueError("a scan over a list of maps (a chain of layers) takes no offsets.")
    return chain_scan(g_last, list(maps), levels=levels)


def sweeps(vector: Any, sequence: Any, levels: int | None) -> Any:
    """The modified Blelloch scan over ``[vector, *sequence]`` (scan order: the latest element
    first), with ``levels`` parallel up-sweep levels (``None``: all), a linear scan over what is
    left at the top, and as many down-sweep levels. Returns the inclusive prefixes, in scan
    order.

    The one loop of every Blelloch scan here: ``sequence`` is a level's elements as a stack
    (:class:`_Stack`: each level's pairs combined in one product, for the steps of a scan over
    time) or as a list (:class:`_List`: one product per pair, unrolled at trace time, for the
    layers of a chain, whose maps differ in shape; also the symbolic plan of
    :func:`bppsa.scan.chain_plan`). Each level: the leftmost element is applied to the vector
    (the left spine stays matrix-vector), the other elements are combined in adjacent pairs
    (an odd one at the end is carried up unchanged); on the way down, the prefix of a pair's
    right element is the pair's prefix one level up, and its left element's is the previous
    pair's followed by that element.
    """
    kept, level = [], 0
    while len(sequence) and (levels is None or level < levels):
        kept.append((vector, sequence))
        level += 1
        up = sequence.paired(level)
        vector = sequence.first_applied(vector, level)
        sequence = up
    prefixes = sequence.linear(vector, level)
    for vector, sequence in reversed(kept):
        prefixes = sequence.down(vector, prefixes, level)
        level -= 1
    return prefixes


@dataclasses.dataclass(frozen=True)
class _Stack:
    """A level of :func:`sweeps` as a stack of maps and their offsets (``None``: no elements);
    the vector and the prefixes are stacked arrays ``(k, *batch, n)``."""

    maps: MapStack | None
    offsets: Array | None

    def __len__(self) -> int:
        return 0 if self.maps is None else len(self.maps)

    def first_applied(self, vector, level):
        return apply(vector, (self.maps.take(0, 1), self.offsets[:1]))

    def paired(self, level) -> _Stack:
        a, b, m = self.maps, self.offsets, len(self)
        assert a is not None and b is not None  # sweeps pairs only non-empty levels
        pairs = (m - 1) // 2
        if pairs:
            later = (a.take(1, 2 * pairs, 2), b[1 : 2 * pairs : 2])
            earlier = (a.take(2, 2 * pairs + 1, 2), b[2 : 2 * pairs + 1 : 2])
            next_a, next_b = combine(later, earlier)
        if (m - 1) % 2:  # an odd element at the end is carried up unchanged
            last_a, last_b = a.take(m - 1, m), b[m - 1 :]
            next_a = concat([next_a, last_a]) if pairs else last_a
            next_b = jnp.concatenate([next_b, last_b], axis=0) if pairs else last_b
        elif not pairs:
            return _Stack(None, None)
        return _Stack(next_a, next_b)

    def linear(self, vector, level):
        if not len(self):
            return vector
        return sequential(vector[0], self.maps.flip(), self.offsets[::-1])[::-1]

    def down(self, vector, prefixes, level):
        a, b, m = self.maps, self.offsets, len(self)
        pairs = (m - 1) // 2
        left = apply(prefixes[:pairs], (a.take(1, 2 * pairs, 2), b[1 : 2 * pairs : 2]))
        evens = jnp.concatenate([vector, left], axis=0)
        odds = prefixes[: pairs + 1]
        out = jnp.stack([evens, odds], axis=1).reshape(-1, *odds.shape[1:])
        if m % 2 == 0:  # the carried odd element's prefix is the last prefix one level up
            out = jnp.concatenate([out, prefixes[pairs + 1 :]], axis=0)
        return out


@dataclasses.dataclass(frozen=True)
class _List:
    """A level of :func:`sweeps` as a list of maps: ``vec(map, vector, level, sweep)`` applies
    a map to a vector, ``mat(later, earlier, level)`` composes two (``later`` applied first);
    the vector is one array and the prefixes a list."""

    maps: list
    vec: Callable
    mat: Callable

    def __len__(self) -> int:
        return len(self.maps)

    def first_applied(self, vector, level):
        return self.vec(self.maps[0], vector, level, "up")

    def paired(self, level) -> _List:
        maps = self.maps
        pairs = (len(maps) - 1) // 2
        up = [self.mat(maps[2 * i - 1], maps[2 * i], level) for i in range(1, pairs + 1)]
        if (len(maps) - 1) % 2:  # an odd element at the end is carried up unchanged
            up.append(maps[-1])
        return dataclasses.replace(self, maps=up)

    def linear(self, vector, level):
        prefixes = [vector]
        for element in self.maps:
            prefixes.append(self.vec(element, prefixes[-1], level, "linear"))
        return prefixes

    def down(self, vector, prefixes, level):
        maps, pairs = self.maps, (len(self.maps) - 1) // 2
        out = [vector, prefixes[0]]
        for i in range(1, pairs + 1):
            out += [self.vec(maps[2 * i - 1], prefixes[i - 1], level, "down"), prefixes[i]]
        if len(maps) % 2 == 0:  # the carried element's prefix is the last one up there
            out.append(prefixes[pairs + 1])
        return out


def chain_scan(g_last: Array, maps: Sequence[MapStack], *, levels: int | None = None) -> list:
    """The cotangents of every state of a chain: ``g_{l-1} = A_l g_l`` from ``g_L``.

    Algorithm summary (Wang, Bai & Pekhimenko, "BPPSA: Scaling Back-propagation by Parallel
    Scan Algorithm", MLSys 2020): the inclusive scan over ``[g_L, A_L, ..., A_1]`` with the
    cotangent as the LEFTMOST element, so that the left spine and the whole down-sweep are
    matrix-vector products and only the up-sweep composes maps (see
    :func:`bppsa.scan.blelloch`), run by the same loop as the scans over time steps
    (:func:`sweeps`) in its list form: the elements differ in shape and type, so they are a
    Python list unrolled at trace time rather than one stack, and the products are
    :func:`bppsa.scan.combine` on ``(A, None)`` elements. The
    paper's pruned VGG-11 ran ``levels=2``: fill-in makes the products of later levels nearly
    dense, so a linear scan is cheaper there.

    Args:
        g_last: ``(*batch, n_L)``, the cotangent of the last state.
        maps: the ``L`` maps in layer order, each a :class:`MapStack` of length one:
            ``maps[l - 1]`` is ``A_l: (n_{l-1}, n_l)``, mapping the cotangent of ``x_l`` to
            that of ``x_{l-1}``. Sparse, dense and structured maps mix freely; a product with
            a :class:`Sparse` operand never densifies it (:func:`bppsa.scan.compose`).
        levels: parallel up-sweep levels. ``0``: the sequential chain of ``L`` matrix-vector
            products (back-propagation itself); ``None``: the full modified Blelloch scan
            (``ceil(log2(L + 1))`` levels; a larger ``levels`` runs that too); ``k``: ``k``
            up-sweep levels, a linear scan over the elements left at level ``k``, then ``k``
            down-sweep levels.

    Returns:
        ``[g_0, g_1, ..., g_L]``, each ``(*batch, n_l)``.

    Raises:
        TypeError, ValueError: maps that are not stacks of one map, consecutive maps whose
            sizes do not chain, a ``g_last`` of the wrong size, or a bad ``levels``.

    Example (the maps of conv -> ReLU -> max-pool -> linear, in layer order)::

        g_0, g_1, g_2, g_3, g_4 = chain_scan(g_4, [conv_t, relu_t, pool_t, fc_t], levels=2)
    """
    shapes = _check_chain(maps, levels)
    if shapes and g_last.shape[-1:] != (shapes[-1][1],):
        raise ValueError(
            f"g_last must have shape (*batch, {shapes[-1][1]}) (n_cols of the last map), got "
            f"{tuple(g_last.shape)}."
        )

    def vec(element, vector, level, sweep):
        return element.apply(vector[None])[0]

    def mat(later, earlier, level):
        return combine((later, None), (earlier, None))[0]

    return sweeps(g_last, _List(list(maps[::-1]), vec, mat), levels)[::-1]


def _map_shape(element: MapStack) -> tuple[int, int]:
    if isinstance(element, Sparse):
        return element.shape
    if isinstance(element, Dense):
        return element.a.shape[-2], element.a.shape[-1]
    return _dense_shape(element)


def _check_levels(levels) -> None:
    if levels is not None and (
        isinstance(levels, bool) or not isinstance(levels, int | np.integer) or levels < 0
    ):
        raise ValueError(f"levels must be None or an int >= 0, got {levels!r}.")


def _check_chain(maps, levels) -> list[tuple[int, int]]:
    _check_levels(levels)
    if not isinstance(maps, Sequence):
        raise TypeError(f"maps must be a sequence of MapStack, got {type(maps).__name__}.")
    shapes = []
    for k, element in enumerate(maps):
        if not isinstance(element, MapStack):
            raise TypeError(f"maps[{k}] must be a MapStack, got {type(element).__name__}.")
        if len(element) != 1:
            raise ValueError(f"maps[{k}] must be a stack of one map, got {len(element)} maps.")
        shapes.append(_map_shape(element))
    _check_shapes(shapes)
    return shapes


def _check_shapes(shapes) -> None:
    for k in range(1, len(shapes)):
        if shapes[k - 1][1] != shapes[k][0]:
            raise ValueError(
                f"maps[{k - 1}] (A_{k}, {shapes[k - 1]}) takes a cotangent of size "
                f"{shapes[k - 1][1]}, but maps[{k}] (A_{k + 1}, {shapes[k]}) gives one of size "
                f"{shapes[k][0]}: A_l must be (n_(l-1), n_l)."
            )


def aggregate(linear: MapStack, offsets: Array | None, like: Array) -> tuple[Array, Array]:
    """The composition of all elements of a stack into one affine map (as dense matrices).

    Returns ``(matrix, offset)`` with ``g_0 = matrix @ g_T + offset`` for the elements
    ``e_1, ..., e_T`` (time order, as :func:`sequential`): ``matrix = A_1 ... A_T``. It is built
    from the latest element back, transposed as ``Y = [matrix^T; offset^T]``:
    ``Y <- Y A_t^T + [0; b_t^T]``, one :meth:`MapStack.apply_to_rows` per step (``T`` dependent
    steps of ``n x n`` work).

    Args:
        linear: ``T`` maps.
        offsets: ``(T, *batch, n)`` or ``None``.
        like: an array of the cotangents' shape ``(*batch, n)`` and dtype.

    Returns:
        ``((*batch, n, n), (*batch, n))``.
    """
    n = like.shape[-1]
    start = jnp.broadcast_to(jnp.eye(n + 1, n, dtype=like.dtype), (*like.shape[:-1], n + 1, n))

    def step(y, k):
        y = linear.index(k).apply_to_rows(y[None])[0]
        if offsets is not None:
            y = y.at[..., -1, :].add(offsets[k])
        return y, None

    y, _ = jax.lax.scan(step, start, jnp.arange(len(linear)), reverse=True)
    return jnp.swapaxes(y[..., :-1, :], -1, -2), y[..., -1, :]
