"""A chunked scan: sequential inside chunks, parallel across them, a Blelloch scan between."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from jax import Array, lax

from bppsa.scan._algorithms import blelloch_scan_order, sequential
from bppsa.scan._elements import Dense, MapStack


def default_chunks(length: int) -> int:
    """About ``sqrt(length / 2)`` chunks: balances the ``2 L`` sequential steps inside chunks
    against the ``C`` chunk aggregates (and keeps their ``C n^2`` memory small)."""
    return max(1, min(length, round(math.sqrt(length / 2))))


def chunked(g_last: Array, linear: MapStack, offsets: Array | None, chunks: int) -> Array:
    """Scan of :func:`bppsa.scan._algorithms.sequential`'s problem in ``2 L + O(log C)`` steps.

    Algorithm summary (a form of the "heterogeneous" Blelloch scan of Wang, Bai & Pekhimenko,
    MLSys 2020, for fewer workers than elements). The ``T`` elements, in scan order, are split
    into ``C`` chunks of ``L = ceil(T / C)`` (the earliest one padded, its padding masked).

    1. Inside every chunk at once, ``L`` sequential steps compose the chunk's elements into one
       affine map ``g -> M g + o``, kept transposed as ``Y = [M^T; o^T]`` (``(n + 1) x n``):
       ``Y <- Y A^T + [0; b^T]``. Chunk 0 holds the cotangent ``g_T``, so it propagates just
       that vector (the BPPSA modification: no matrix products where the vector is known) and
       its prefixes are final. For the structured Jacobians of the cells each step is ONE
       product of all chunks' rows with the shared weight.
    2. The chunk aggregates are scanned with :func:`blelloch`: every chunk's start vector.
    3. Inside chunks 1..C-1 at once, ``L`` sequential matrix-vector steps from their start
       vectors give every prefix.

    Work: about ``(T - L) n^2 (n + 1)`` multiply-adds, in ``2 L`` large products instead of
    ``T`` small ones. ``C = 1`` is a sequential scan of matrix-vector products.

    Args:
        g_last, linear, offsets: as :func:`bppsa.scan._algorithms.sequential`.
        chunks: ``C``; clipped to ``[1, T]``.

    Returns:
        ``(T + 1, *batch, n)``: ``g_0, g_1, ..., g_T``.
    """
    length = len(linear)
    if length == 0 or chunks <= 1:
        return sequential(g_last, linear, offsets)
    per_chunk = -(-length // min(chunks, length))
    chunks = -(-length // per_chunk)  # no empty chunk; still >= 2 since 2 <= chunks <= T
    padded = chunks * per_chunk

    def by_step(x):
        # Time order (T, ...) -> scan order split into (L, C, ...): chunk 0 holds the latest
        # steps, and step j of every chunk is one contiguous slice.
        x = jnp.pad(x[::-1], [(0, padded - length)] + [(0, 0)] * (x.ndim - 1))
        return jnp.swapaxes(x.reshape(chunks, per_chunk, *x.shape[1:]), 0, 1)

    elements = linear.map_per_step(by_step)
    steps = (
        elements.per_step(),
        None if offsets is None else by_step(offsets),
        by_step(jnp.arange(length) >= 0),  # False on the padding
    )

    def unpack(step):
        fields, offset, valid = step
        return elements.with_per_step(**fields), offset, valid

    if _products_keep_type(elements):  # diagonal, block-diagonal: so do the aggregates
        first, starts = _structured_starts(g_last, elements, steps, unpack, chunks)
    else:
        first, starts = _dense_starts(g_last, elements, steps, unpack, chunks)

    # 3. Every prefix of chunks 1..C-1, from their start vectors.
    def propagate(v, step):
        element, offset, valid = unpack(step)
        new = element.take(1, chunks).apply(v)
        v = jnp.where(_expand(valid[1:], v.ndim), new if offset is None else new + offset[1:], v)
        return v, v

    _, rest = lax.scan(propagate, starts, steps)  # (L, C - 1, *batch, n)
    prefixes = jnp.concatenate([first[:, None], rest], axis=1)
    prefixes = jnp.swapaxes(prefixes, 0, 1).reshape(padded, *g_last.shape)[:length]
    return jnp.concatenate([g_last[None], prefixes])[::-1]


def _dense_starts(g_last, elements, steps, unpack, chunks):
    """Steps 1 and 2 with dense aggregates: every prefix of chunk 0 and the start vectors of
    chunks 1..C-1."""
    # 1. Chunk 0 propagates the vector itself (every prefix of it comes out); the other chunks
    #    compose their aggregates Y = [M^T; o^T], starting from [I; 0].
    n = g_last.shape[-1]
    identity = jnp.eye(n + 1, n, dtype=g_last.dtype)
    start = (g_last, jnp.broadcast_to(identity, (chunks - 1, *g_last.shape[:-1], n + 1, n)))

    def compose(carry, step):
        v, y = carry
        element, offset, valid = unpack(step)
        v = _chunk_zero_step(v, element, offset, valid)
        new = element.take(1, chunks).apply_to_rows(y)
        if offset is not None:
            new = new.at[..., -1, :].add(offset[1:])
        y = jnp.where(_expand(valid[1:], new.ndim), new, y)
        return (v, y), v

    (after_first, aggregates), first = lax.scan(compose, start, steps)

    # 2. Start vectors of chunks 1..C-1: a Blelloch scan over their aggregates.
    matrices = Dense(jnp.swapaxes(aggregates[..., :-1, :], -1, -2))
    return first, blelloch_scan_order(after_first, matrices, aggregates[..., -1, :])[:-1]


def _structured_starts(g_last, elements, steps, unpack, chunks):
    """Steps 1 and 2 for maps whose products keep their structure (diagonal, block-diagonal):
    each chunk's aggregate is the affine map ``g -> M g + o`` with ``M`` the product of its
    maps, of their type (``n k`` floats, not ``n (n + 1)``), starting from its first map."""
    element, offset, valid = unpack(jax.tree.map(lambda a: a[0], steps))
    # The first step of every chunk is a real one (see chunked): chunk 0's vector goes through
    # it, and it is the other chunks' first aggregate.
    v = _chunk_zero_step(g_last, element, offset, valid)
    m = element.take(1, chunks)
    o = jnp.zeros((chunks - 1, *g_last.shape), g_last.dtype) if offset is None else offset[1:]

    def compose(carry, step):
        v, m, o = carry
        element, offset, valid = unpack(step)
        v = _chunk_zero_step(v, element, offset, valid)
        nxt = element.take(1, chunks)  # applied after m: the next map in scan order
        new_m, new_o = m.then(nxt), nxt.apply(o)
        new_o = new_o if offset is None else new_o + offset[1:]
        keep = valid[1:]
        m = m.with_per_step(
            **{
                name: jnp.where(_expand(keep, value.ndim), new_m.per_step()[name], value)
                for name, value in m.per_step().items()
                if value is not None
            }
        )
        o = jnp.where(_expand(keep, o.ndim), new_o, o)
        return (v, m, o), v

    rest = jax.tree.map(lambda a: a[1:], steps)
    (after_first, m, o), first = lax.scan(compose, (v, m, o), rest)
    first = jnp.concatenate([v[None], first])
    return first, blelloch_scan_order(after_first, m, o)[:-1]


def _chunk_zero_step(v, element, offset, valid):
    """Chunk 0's vector ``v`` through its map of this step (unchanged on padding)."""
    new = element.take(0, 1).apply(v[None])[0]
    return jnp.where(valid[0], new if offset is None else new + offset[0], v)


def _products_keep_type(elements: MapStack) -> bool:
    """Whether a product of two of these maps is a map of their own type (no dense rows)."""
    if elements.width >= elements.size:
        return False
    return type(jax.eval_shape(lambda e: e.then(e), elements)) is type(elements)


def _expand(mask: Array, ndim: int) -> Array:
    return mask.reshape(*mask.shape, *([1] * (ndim - mask.ndim)))
