"""Element stacks: the dense form agrees with the structured matrix-vector products; the element
interface carries a new element type through every algorithm, and composition and concatenation
keep a structure where they can."""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bppsa.scan import Dense, MapStack, Structured, blelloch, chunked, combine, concat, sequential


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


@pytest.mark.parametrize("rows,folded", [(1, False), (2, True), (16, True), (17, False)])
def test_structured_diagonal_folded_into_the_product_or_apart(rows, folded, x64):
    # A scan step applies one map to a batch of rows: from 2 to 16 rows the diagonal term
    # joins the product ([d * tile(v), e * v] @ [u^T; I]), else it is added after it.
    rng = np.random.default_rng(2)
    n, reps = 5, 3
    s = Structured(
        u=jnp.asarray(rng.normal(size=(n, reps * n))),
        d=jnp.asarray(rng.normal(size=(rows, reps * n))),
        e=jnp.asarray(rng.normal(size=(rows, n))),
        reps=reps,
    )
    v = jnp.asarray(rng.normal(size=(rows, n)))
    assert s._folds_diagonal(v.shape) == folded
    expected = jnp.einsum("rij,rj->ri", s.to_dense().a, v)
    np.testing.assert_allclose(s.apply(v), expected, rtol=1e-12)


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


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Diagonal(MapStack):
    """An element type defined outside the library: ``A_k = diag(d[k])``, whose products stay
    diagonal (it overrides ``then``)."""

    d: jax.Array
    per_step_fields = ("d",)
    shared_fields = ()

    @property
    def size(self):
        return self.d.shape[-1]

    def apply(self, v):
        return self.d * v

    def apply_to_rows(self, y):
        return y * self.d[..., None, :]

    def to_dense(self):
        return Dense(self.d[..., :, None] * jnp.eye(self.size, dtype=self.d.dtype))

    def then(self, earlier):
        if isinstance(earlier, Diagonal):
            return Diagonal(earlier.d * self.d)
        return super().then(earlier)


@pytest.mark.parametrize(
    "algorithm",
    [blelloch, sequential, functools.partial(chunked, chunks=3)],
    ids=["blelloch", "sequential", "chunked"],
)
@pytest.mark.parametrize("length", [1, 2, 5, 17])
def test_a_new_element_type_runs_every_algorithm(algorithm, length, x64):
    rng = np.random.default_rng(length)
    d = jnp.asarray(rng.normal(size=(length, 2, 3)))
    b = jnp.asarray(rng.normal(size=(length, 2, 3)))
    g = jnp.asarray(rng.normal(size=(2, 3)))
    expected = [np.asarray(g)]
    for t in reversed(range(length)):
        expected.append(np.asarray(d[t]) * expected[-1] + np.asarray(b[t]))
    actual = algorithm(g, Diagonal(d), b)
    np.testing.assert_allclose(actual, np.stack(expected[::-1]), rtol=1e-12)


def test_composition_dispatches_on_the_element_types(x64):
    rng = np.random.default_rng(3)
    later, earlier = (Diagonal(jnp.asarray(rng.normal(size=(4, 3)))) for _ in range(2))
    a, _ = combine((later, jnp.zeros((4, 3))), (earlier, jnp.ones((4, 3))))
    assert isinstance(a, Diagonal)  # no densification where the type knows better
    np.testing.assert_allclose(a.d, earlier.d * later.d, rtol=1e-12)
    dense = Dense(jnp.asarray(rng.normal(size=(4, 3, 3))))
    mixed = later.then(dense)  # apply ``later`` first, then ``dense``
    np.testing.assert_allclose(mixed.a, dense.a @ later.to_dense().a, rtol=1e-12)


def test_concat_keeps_a_shared_structure_and_counts_floats(x64):
    rng = np.random.default_rng(4)
    u = jnp.asarray(rng.normal(size=(3, 9)))
    parts = [
        Structured(u=u, d=jnp.asarray(rng.normal(size=(m, 2, 9))), e=jnp.ones((m, 2, 3)), reps=3)
        for m in (2, 5)
    ]
    joined = concat(parts)
    assert isinstance(joined, Structured) and len(joined) == 7 and joined.u is u
    np.testing.assert_allclose(
        joined.to_dense().a, jnp.concatenate([p.to_dense().a for p in parts]), rtol=1e-12
    )
    other = Structured(u=2 * u, d=parts[0].d, e=parts[0].e, reps=3)  # another shared weight
    assert isinstance(concat([parts[0], other]), Dense)
    assert joined.floats_per_step() == 2 * 9 + 2 * 3
    assert joined.dense_floats_per_step() == 2 * 3 * 3
    assert joined.to_dense().floats_per_step() == joined.dense_floats_per_step()


def test_sequential_scans_unroll_only_the_short_fused_steps():
    """One to four small rows of a single-block structured map unroll 4 steps (the loop's
    overhead shows beside their fused step), one row of a tiled map 2; batched rows and dense
    maps do not. That the unrolled scans are right is test_algorithms'
    test_structured_matches_python_loop (rows of 1 and 2, lengths 1, 5 and 17)."""
    rnn = Structured(u=jnp.ones((20, 20)), d=jnp.ones((7, 20)))
    gru = Structured(u=jnp.ones((20, 60)), d=jnp.ones((7, 60)), e=jnp.ones((7, 20)), reps=3)
    assert [rnn.sequential_unroll((b, 20)) for b in (1, 4, 5, 16)] == [4, 4, 1, 1]
    assert rnn.sequential_unroll((20,)) == 4
    assert [gru.sequential_unroll(shape) for shape in ((20,), (1, 20), (2, 20))] == [2, 2, 1]
    assert Dense(jnp.ones((7, 20, 20))).sequential_unroll((1, 20)) == 1
