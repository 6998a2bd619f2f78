"""The vector times a constant matrix of the fused kernels, arranged for the warps
(:mod:`bppsa.scan._core.fused.matvec`), against ``jnp.dot`` (float64 in, so the only difference
is the order of the sum) and against the layout its docstring states."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from bppsa.scan._core.fused.matvec import Arranged, product


@pytest.mark.parametrize(
    ("k", "n", "warps"),
    [(32, 32, 1), (64, 64, 4), (64, 64, 1), (128, 128, 4), (8, 64, 2), (64, 8, 4), (2, 1, 1)],
)
@pytest.mark.parametrize("contracting", [0, 1])
def test_the_product_equals_the_dot(k, n, warps, contracting):
    """Padded (``K = k - 3`` logical rows where ``k > 4``), either axis contracted, warps
    more than the lanes (``n = 8`` at 4 warps) and parts more than ``K`` (``k = 2``)."""
    rows = k - 3 if k > 4 else k
    rng = np.random.default_rng(k * 1000 + n * 10 + warps)
    matrix = rng.normal(size=(rows, n))
    vector = np.zeros(k)
    vector[:rows] = rng.normal(size=rows)
    given = matrix if contracting == 0 else matrix.T
    arranged = Arranged(contracting, k, n, warps)
    with jax.enable_x64(True):
        stored = arranged.arrange(given)
        assert stored.shape == arranged.shape
        np.testing.assert_array_equal(np.asarray(stored[..., 1]), 0.0)
        got = product(arranged, jax.numpy.asarray(vector), stored[..., 0])
    np.testing.assert_allclose(np.asarray(got), vector[:rows] @ matrix, rtol=1e-12, atol=1e-12)


def test_the_layout_keeps_a_warps_lanes_and_a_threads_terms():
    """At H = 64 in 4 warps: 16 lanes across a warp's threads, the contraction in 2 parts
    across the other 16, 4 groups of lanes (one a warp), 32 terms a thread; entry ``(k, n)``
    sits at ``(k // 2, 0, n // 16, k % 2, n % 16)``."""
    arranged = Arranged(0, 64, 64, 4)
    assert (arranged.groups, arranged.lanes, arranged.parts) == (4, 16, 2)
    assert arranged.shape == (32, 1, 4, 2, 16, 2)
    matrix = np.arange(64 * 64, dtype=np.float32).reshape(64, 64)
    stored = np.asarray(arranged.arrange(matrix))
    for k, n in [(0, 0), (1, 17), (63, 63), (10, 33)]:
        assert stored[k // 2, 0, n // 16, k % 2, n % 16, 0] == matrix[k, n]
