"""Chunked's split of ``T`` steps: ``C`` chunks of ``L = ceil(T / C)`` steps (fewer chunks when
the last would be empty), so its sequential phases are ``L`` steps long, whatever the values
(which any split gives alike: tests/scan/test_algorithms.py checks those)."""

import math

import jax
import jax.numpy as jnp
import pytest

from bppsa.scan import Dense
from bppsa.scan._chunked import chunked


def scan_lengths(jaxpr) -> list[int]:
    """The lengths of every ``scan`` in ``jaxpr``, nested ones included."""
    lengths = []
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "scan":
            lengths.append(eqn.params["length"])
        for param in eqn.params.values():
            inner = getattr(param, "jaxpr", None)
            if inner is not None:
                lengths += scan_lengths(getattr(inner, "jaxpr", inner))
    return lengths


# (T, C, L): L = ceil(T / C) where floor and ceiling differ, and where C does not divide T.
CASES = [(5, 3, 2), (7, 2, 4), (10, 4, 3), (17, 5, 4), (6, 4, 2)]


@pytest.mark.parametrize("length,chunks,per_chunk", CASES)
def test_sequential_phases_are_ceil_t_over_c_steps(length, chunks, per_chunk):
    assert per_chunk == math.ceil(length / chunks)
    n = 3
    maps = jnp.zeros((length, n, n))
    offsets = jnp.zeros((length, n))
    jaxpr = jax.make_jaxpr(lambda g, a, b: chunked(g, Dense(a), b, chunks))(
        jnp.zeros(n), maps, offsets
    )
    # The chunk-internal phases (aggregates, then prefixes); the scan between chunks is a
    # parallel Blelloch scan (no lax.scan).
    assert scan_lengths(jaxpr.jaxpr) == [per_chunk, per_chunk]
