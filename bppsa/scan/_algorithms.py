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

import jax
import jax.numpy as jnp
from jax import Array

from bppsa.scan._elements import MapStack, concat

Element = tuple[MapStack, Array]  # an affine map g -> A g + b, stacked: (A, b)


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


def sequential(g_last: Array, linear: MapStack, offsets: Array | None) -> Array:
    """Linear reverse scan (back-propagation itself): ``len(linear)`` dependent steps.

    Args:
        g_last: ``(*batch, n)`` cotangent of the last state, ``g_T``.
        linear: stack of the ``T`` maps ``A_1, ..., A_T`` (time order).
        offsets: ``(T, *batch, n)`` the matching ``b_1, ..., b_T``, or ``None``.

    Returns:
        ``(T + 1, *batch, n)``: ``g_0, g_1, ..., g_T``.
    """
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


def blelloch(g_last: Array, linear: MapStack, offsets: Array | None) -> Array:
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

    Args and returns: as :func:`sequential`.
    """
    if offsets is None:
        offsets = jnp.zeros((len(linear), *g_last.shape), g_last.dtype)
    # The sweeps below index the sequence in scan order: the latest step first.
    return blelloch_scan_order(g_last, linear.flip(), offsets[::-1])[::-1]


def blelloch_scan_order(g_last: Array, linear: MapStack, offsets: Array) -> Array:
    """:func:`blelloch` with inputs and outputs in scan order (latest step first)."""
    levels = []
    v, a, b = g_last[None], linear, offsets
    while len(a) > 0:
        levels.append((v, a, b))
        m = len(a)
        pairs = (m - 1) // 2
        v = apply(v, (a.take(0, 1), b[:1]))
        if pairs:
            later = (a.take(1, 2 * pairs, 2), b[1 : 2 * pairs : 2])
            earlier = (a.take(2, 2 * pairs + 1, 2), b[2 : 2 * pairs + 1 : 2])
            next_a, next_b = combine(later, earlier)
        if (m - 1) % 2:  # an odd element at the end is carried up unchanged
            last_a, last_b = a.take(m - 1, m), b[m - 1 :]
            next_a = concat([next_a, last_a]) if pairs else last_a
            next_b = jnp.concatenate([next_b, last_b], axis=0) if pairs else last_b
        elif not pairs:
            break
        a, b = next_a, next_b

    prefixes = v  # every level's sequence starts with a vector; at the top it is alone
    for v, a, b in reversed(levels):
        m = len(a)
        pairs = (m - 1) // 2
        # The prefix of the left element of pair i >= 1 is the prefix of pair i - 1, followed
        # by that element: a matrix-vector product. Pair 0's left element is the vector itself.
        left = apply(prefixes[:pairs], (a.take(1, 2 * pairs, 2), b[1 : 2 * pairs : 2]))
        evens = jnp.concatenate([v, left], axis=0)
        odds = prefixes[: pairs + 1]
        out = jnp.stack([evens, odds], axis=1).reshape(-1, *odds.shape[1:])
        if m % 2 == 0:  # the carried odd element's prefix is the last prefix one level up
            out = jnp.concatenate([out, prefixes[pairs + 1 :]], axis=0)
        prefixes = out
    return prefixes


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
