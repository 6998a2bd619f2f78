"""``aggregate``: the composition of a stack of affine elements into one map (what each device of
``bppsa.Sharded`` sends), on one device, against a Python loop: ``g_0 = M g_T + o``."""

import jax.numpy as jnp
import numpy as np
import pytest

from bppsa.scan import Dense, Structured
from bppsa.scan._algorithms import aggregate


def loop(a, b, g):
    """``g_0`` from ``g_T`` by ``g_{t-1} = A_t g_t + b_t``."""
    for k in reversed(range(a.shape[0])):
        g = np.einsum("...ij,...j->...i", a[k], g) + b[k]
    return g


@pytest.mark.parametrize("length", [1, 2, 5])
@pytest.mark.parametrize("batch", [(), (2,)])
@pytest.mark.parametrize("kind", ["dense", "structured"])
def test_aggregate_is_the_composed_affine_map(x64, length, batch, kind):
    rng = np.random.default_rng(length)
    n = 3
    if kind == "dense":
        a = rng.normal(size=(length, *batch, n, n))
        maps = Dense(jnp.asarray(a))
    else:
        u, d = rng.normal(size=(n, n)), rng.normal(size=(length, *batch, n))
        maps = Structured(u=jnp.asarray(u), d=jnp.asarray(d))
        a = np.einsum("ip,t...p->t...ip", u, d)
    b = rng.normal(size=(length, *batch, n))
    matrix, offset = aggregate(maps, jnp.asarray(b), jnp.zeros((*batch, n)))
    assert matrix.shape == (*batch, n, n) and offset.shape == (*batch, n)
    # The offset is g_0 from g_T = 0; the matrix column j is g_0 from e_j without offsets.
    np.testing.assert_allclose(offset, loop(a, b, np.zeros((*batch, n))), rtol=1e-12)
    columns = [loop(a, 0 * b, np.broadcast_to(np.eye(n)[j], (*batch, n))) for j in range(n)]
    np.testing.assert_allclose(matrix, np.stack(columns, axis=-1), rtol=1e-12)
    # Without offsets, the same matrix and a zero offset.
    matrix0, offset0 = aggregate(maps, None, jnp.zeros((*batch, n)))
    np.testing.assert_allclose(matrix0, matrix, rtol=1e-12)
    np.testing.assert_array_equal(offset0, 0.0)
