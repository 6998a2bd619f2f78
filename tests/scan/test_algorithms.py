"""The scan algorithms on random non-commuting matrices, against a plain Python loop."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bppsa.scan import Dense, Structured, blelloch, chunked, combine, sequential
from tests.helpers import assert_trees_close

LENGTHS = [0, 1, 2, 3, 4, 5, 8, 17, 100]
ALGORITHMS = [blelloch, sequential, functools.partial(chunked, chunks=3)]
MORE_CHUNKS = [functools.partial(chunked, chunks=c) for c in (1, 2, 16)]


def algorithm_name(algorithm) -> str:
    """A test id without an address (the same in every process, as pytest-xdist needs)."""
    if isinstance(algorithm, functools.partial):
        return f"{algorithm.func.__name__}(chunks={algorithm.keywords['chunks']})"
    return algorithm.__name__


def python_loop(g_last, a, b):
    """g_{t-1} = A_t g_t + b_t from t = T down to 1, in NumPy; returns g_0, ..., g_T."""
    out = [np.asarray(g_last)]
    for k in reversed(range(a.shape[0])):
        out.append(np.einsum("...ij,...j->...i", a[k], out[-1]) + b[k])
    return np.stack(out[::-1])


def random_problem(length, batch, n, dtype, seed=0):
    rng = np.random.default_rng(seed)
    # Entries ~ N(0, 1/n) keep long products bounded; they do not commute.
    a = rng.normal(size=(length, *batch, n, n)) / np.sqrt(n)
    b = rng.normal(size=(length, *batch, n))
    g = rng.normal(size=(*batch, n))
    return (np.asarray(x, dtype) for x in (g, a, b))


@pytest.mark.parametrize("algorithm", ALGORITHMS, ids=algorithm_name)
@pytest.mark.parametrize("length", LENGTHS)
@pytest.mark.parametrize("batch", [(), (3,)])
def test_dense_matches_python_loop(algorithm, length, batch, dtype):
    check_dense(algorithm, length, batch, dtype)


@pytest.mark.parametrize("algorithm", MORE_CHUNKS, ids=lambda a: f"chunks={a.keywords['chunks']}")
@pytest.mark.parametrize("length", [1, 2, 16, 17, 100])
def test_chunk_counts(algorithm, length, dtype):
    """Chunk counts that divide T, that do not, and more chunks than steps."""
    check_dense(algorithm, length, (2,), dtype)


@pytest.mark.parametrize("levels", [0, 1, 2, 5])
@pytest.mark.parametrize("length", [1, 2, 3, 5, 17, 100])
def test_blelloch_with_fewer_levels(levels, length, dtype):
    """``levels`` up-sweep levels, a linear scan over what is left, then the down-sweep."""
    check_dense(functools.partial(blelloch, levels=levels), length, (2,), dtype)


def check_dense(algorithm, length, batch, dtype):
    g, a, b = random_problem(length, batch, 4, dtype)
    # Jitted: dispatching every operation of the sweeps eagerly would dominate the test time.
    out = jax.jit(algorithm)(jnp.asarray(g), Dense(jnp.asarray(a)), jnp.asarray(b))
    assert out.shape == (length + 1, *batch, 4)
    assert out.dtype == dtype
    assert_trees_close(out, python_loop(g, a, b).astype(dtype), dtype)


@pytest.mark.parametrize("algorithm", ALGORITHMS, ids=algorithm_name)
@pytest.mark.parametrize("length", [1, 5, 17])
@pytest.mark.parametrize("reps,diagonal", [(1, False), (3, True)])
@pytest.mark.parametrize("rows", [1, 2])  # one row: unrolled scan steps; two: a folded diagonal
def test_structured_matches_python_loop(algorithm, length, reps, diagonal, rows, x64):
    rng = np.random.default_rng(1)
    n = 5
    u = rng.normal(size=(n, reps * n)) / np.sqrt(n)
    d = rng.normal(size=(length, rows, reps * n))
    e = rng.normal(size=(length, rows, n)) if diagonal else None
    elements = Structured(
        u=jnp.asarray(u), d=jnp.asarray(d), e=None if e is None else jnp.asarray(e), reps=reps
    )
    # Independent dense form: A = u diag(d) [I; ...; I] + diag(e).
    tile = np.concatenate([np.eye(n)] * reps, axis=0)
    a = np.einsum("ip,tbp,pj->tbij", u, d, tile)
    if e is not None:
        a = a + np.einsum("tbi,ij->tbij", e, np.eye(n))
    g, b = rng.normal(size=(rows, n)), rng.normal(size=(length, rows, n))
    out = algorithm(jnp.asarray(g), elements, jnp.asarray(b))
    assert_trees_close(out, python_loop(g, a, b), jnp.float64)


def test_combine_applies_first_then_second(x64):
    rng = np.random.default_rng(2)
    a1, a2 = rng.normal(size=(2, 1, 3, 3))
    b1, b2 = rng.normal(size=(2, 1, 3))
    v = rng.normal(size=(1, 3))
    (a, b) = combine((Dense(jnp.asarray(a1)), jnp.asarray(b1)), (Dense(jnp.asarray(a2)), b2))
    expected = a2[0] @ (a1[0] @ v[0] + b1[0]) + b2[0]
    np.testing.assert_allclose(a.apply(jnp.asarray(v)) + b, expected[None], rtol=1e-12)
    # The operator does not commute: the other order gives a different map.
    assert not np.allclose(a.a, (a1 @ a2))


@pytest.mark.parametrize("length", [1, 2, 7, 33])
def test_agrees_with_associative_scan(length, x64):
    """Cross-check with JAX's own associative scan (whose reverse order is easy to get wrong:
    with reverse=False over the scan order, its first argument is the EARLIER scan element)."""
    g, a, b = random_problem(length, (), 3, np.float64, seed=3)
    mats = np.concatenate([np.zeros((1, 3, 3)), a[::-1]])  # scan order: latest step first
    vecs = np.concatenate([g[None], b[::-1]])

    def op(earlier, later):  # earlier in scan order = later in time: apply it first
        (a1, b1), (a2, b2) = earlier, later
        return a2 @ a1, jnp.einsum("...ij,...j->...i", a2, b1) + b2

    _, expected = jax.lax.associative_scan(op, (jnp.asarray(mats), jnp.asarray(vecs)))
    out = blelloch(jnp.asarray(g), Dense(jnp.asarray(a)), jnp.asarray(b))
    assert_trees_close(out, expected[::-1], jnp.float64)


def test_blelloch_depth_is_logarithmic():
    """The traced program has O(log T) levels: count the matrix products it stages."""
    g, a, b = random_problem(1000, (), 2, np.float32)
    jaxpr = jax.make_jaxpr(blelloch)(jnp.asarray(g), Dense(jnp.asarray(a)), jnp.asarray(b))
    products = [e for e in jaxpr.jaxpr.eqns if e.primitive.name == "dot_general"]
    # One batched matrix-matrix product per up-sweep level and a few matrix-vector products
    # per level in both sweeps: ~10 levels for T = 1000, nowhere near T products.
    assert len(products) <= 6 * 10
    assert jaxpr.jaxpr.eqns and not any(
        e.primitive.name in ("scan", "while") for e in jaxpr.jaxpr.eqns
    )
