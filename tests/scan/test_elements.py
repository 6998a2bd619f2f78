"""Element stacks: the dense form agrees with the structured matrix-vector products."""

import jax.numpy as jnp
import numpy as np
import pytest

from bppsa.scan import Dense, Structured, concat


@pytest.mark.parametrize("reps,diagonal", [(1, False), (3, True), (4, False)])
def test_structured_dense_form_matches_matvec(reps, diagonal, x64):
    rng = np.random.default_rng(0)
    n, m = 3, 4
    e = jnp.asarray(rng.normal(size=(m, 2, n))) if diagonal else None
    s = Structured(
        u=jnp.asarray(rng.normal(size=(n, reps * n))),
        d=jnp.asarray(rng.normal(size=(m, 2, reps * n))),
        e=e,
        reps=reps,
    )
    v = jnp.asarray(rng.normal(size=(m, 2, n)))
    dense = s.to_dense()
    assert dense.a.shape == (m, 2, n, n)
    np.testing.assert_allclose(dense.apply(v), s.apply(v), rtol=1e-12)


def test_slicing_flipping_and_products(x64):
    rng = np.random.default_rng(1)
    a = jnp.asarray(rng.normal(size=(5, 3, 3)))
    d = Dense(a)
    np.testing.assert_array_equal(d.take(1, 5, 2).a, a[1:5:2])
    np.testing.assert_array_equal(d.flip().a, a[::-1])
    np.testing.assert_array_equal(d.index(jnp.int32(2)).a, a[2:3])
    # then(): the receiver is the LATER map, applied first: earlier @ later.
    np.testing.assert_allclose(d.flip().then(d).a, a @ a[::-1], rtol=1e-12)
    assert len(concat([d, d.take(0, 2)])) == 7
