"""The memory model's exact bytes for scans over maps that keep a structure (diagonal, 2 x 2
blocks), derived here by hand from ``T``, ``n``, the chunks and the float size.

The model (``bppsa/scan/_core/memory.py``), in floats per example over the batch: the carries
kept for the backward, ``2 T n``; the span of ``T`` steps, ``T (2.5 e + 2 n)`` for ``e``
Jacobian floats per step; ``Chunked(C)`` with ``C > 1`` adds a reordered copy of the
Jacobians, ``T e``, and ``3 C`` chunk aggregates of ``e + n`` floats each (a map of the
structure and its offset; ``n^2`` floats, ``n`` dense rows per carry float, for dense maps). A
diagonal map stores ``e = n`` floats, ``k x k`` blocks ``e = n k``.
"""

import math

import jax
import jax.numpy as jnp
import pytest

import bppsa

N, X, B = 12, 3, 3  # carry floats, input floats, vmapped examples
T = 318  # round(sqrt(T / 2)) = round(12.61) = 13 default chunks, floor would give 12


def diagonal_cell(h, x):
    w, u = jnp.ones((N, X), h.dtype), jnp.linspace(0.1, 0.9, N, dtype=h.dtype)
    return jnp.tanh(w @ x + u * h)


def pairs_cell(h, x):  # 2 x 2 blocks over units (2i, 2i + 1)
    a = jnp.linspace(-1.0, 1.0, N * 2, dtype=h.dtype).reshape(N // 2, 2, 2)
    pairs = jnp.einsum("gij,gj->gi", a, h.reshape(N // 2, 2)).reshape(N)
    return jnp.tanh(pairs + jnp.ones((N, X), h.dtype) @ x)


CELLS = {"diagonal": (diagonal_cell, N), "pairs": (pairs_cell, 2 * N)}  # (cell, e)


def estimate(cell, method, dtype):
    spec = jax.ShapeDtypeStruct((T, X), dtype)
    body = lambda h, x: (cell(h, x), None)
    return bppsa.estimate_memory(body, jnp.zeros(N, dtype), spec, method=method, batch=B)


def span_floats(steps, element, chunks):
    """Floats per example of ``steps`` steps of ``Chunked(chunks)`` evaluated at once."""
    floats = steps * (2.5 * element + 2 * N)
    if chunks > 1:  # the reordered Jacobians and the chunk aggregates
        floats += steps * element + 3 * chunks * (element + N)
    return floats


def bytes_of(span, itemsize):
    return math.ceil((2 * T * N + span) * itemsize * B)  # with the carries of all T steps


@pytest.mark.parametrize("name", CELLS)
@pytest.mark.parametrize(
    "method,chunks",
    [
        (bppsa.Chunked(), 13),  # about sqrt(T / 2)
        (bppsa.Chunked(7), 7),
        (bppsa.Chunked(2), 2),
        (bppsa.Chunked(1), 1),  # no aggregates: a sequential scan
        (bppsa.Chunked(T + 5), T),  # no more chunks than steps
    ],
    ids=str,
)
def test_chunked_memory_over_structured_maps_is_the_models_exact_bytes(name, method, chunks, dtype):
    cell, element = CELLS[name]
    itemsize = jnp.dtype(dtype).itemsize
    assert estimate(cell, method, dtype) == bytes_of(span_floats(T, element, chunks), itemsize)


@pytest.mark.parametrize("name", CELLS)
def test_blocks_of_chunked_steps_count_one_block(name):
    """``Blocked(Chunked(5), 100)``: the carries of all ``T`` steps, the span of one block."""
    cell, element = CELLS[name]
    method = bppsa.Blocked(bppsa.Chunked(5), 100)
    assert estimate(cell, method, jnp.float32) == bytes_of(span_floats(100, element, 5), 4)


def test_the_estimate_of_a_dense_cell_counts_dense_aggregates():
    """The check can fail: over dense ``n x n`` maps an aggregate counts ``n^2`` floats (``n``
    rows per carry float; the model leaves out the offset row), not ``e + n``."""

    def dense_cell(h, x):
        return jnp.tanh(jnp.linspace(-1.0, 1.0, N * N).reshape(N, N) @ h + x.sum())

    element, chunks = N * N, 13
    span = T * (2.5 * element + 2 * N) + T * element + 3 * chunks * N * N
    assert estimate(dense_cell, bppsa.Chunked(), jnp.float32) == bytes_of(span, 4)
