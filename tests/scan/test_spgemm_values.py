"""Sparse products whose segment boundaries matter, value by value against dense products.

Hand-built patterns with rows of 0, 1 and many entries, the first and last rows (and some
columns) empty, and output entries that sum 1, 2 or 3 pairs: an off-by-one in where a row's
entries, or an output entry's pairs, start or end gives a wrong value here (or a wrong pattern),
which the assertions below report as such."""

import jax.numpy as jnp
import numpy as np
import pytest

from bppsa.scan._sparse import METHODS, Pattern, Sparse, _pairs, spgemm_values


def pattern_of(rows_of: dict[int, list[int]], shape) -> Pattern:
    rows = [r for r, cols in rows_of.items() for _ in cols]
    cols = [c for cs in rows_of.values() for c in cs]
    pattern, order = Pattern.from_coo(rows, cols, shape)
    np.testing.assert_array_equal(order, np.arange(len(rows)))  # given in sorted order
    return pattern


# EARLIER (6, 5): row 0 empty, a row of one entry in the last column, a full row, a row of one
# entry in the first column, one of two, and the last row empty.
EARLIER = pattern_of({1: [4], 2: [0, 1, 2, 3, 4], 3: [0], 4: [1, 3]}, (6, 5))
# LATER (5, 7): a row of all but column 5, one of one, an empty row, one of two, one of one;
# column 5 is empty. EARLIER @ LATER has output entries of 1, 2 and 3 pairs, and rows 0 and 5
# of the product are empty.
LATER = pattern_of({0: [0, 1, 2, 3, 4, 6], 1: [6], 3: [0, 6], 4: [3]}, (5, 7))


def sparse(pattern, seed, vbatch=()):
    rng = np.random.default_rng(seed)
    values = rng.uniform(1.0, 2.0, size=(1, *vbatch, pattern.nnz))  # no cancellation
    return Sparse(jnp.asarray(values, jnp.float64), pattern)


def dense(maps):
    out = np.zeros((*maps.values.shape[:-1], *maps.shape))
    for e in range(maps.pattern.nnz):
        out[..., maps.pattern.rows[e], maps.pattern.cols[e]] = np.asarray(maps.values)[..., e]
    return out


def dense_of_values(values, pattern):
    return dense(Sparse(jnp.asarray(values), pattern))


def products() -> dict:
    """``{name: (later, earlier)}`` (built with x64 enabled): the hand-built pair, the same
    with a per-example batch, a product with an empty output, one whose only output row lies
    between empty ones, and random patterns with empty first and last rows."""
    rng = np.random.default_rng(7)
    mask_l, mask_e = rng.random((9, 11)) < 0.35, rng.random((8, 9)) < 0.35
    mask_l[[0, -1]], mask_e[[0, -1]], mask_e[:, [0, 4]] = False, False, False
    random_l = Pattern.from_coo(*np.nonzero(mask_l), mask_l.shape)[0]
    random_e = Pattern.from_coo(*np.nonzero(mask_e), mask_e.shape)[0]
    empty = pattern_of({0: [2], 2: [0]}, (3, 3))  # E's cols (2, 0) meet L's empty rows
    only_1 = pattern_of({1: [0, 1]}, (3, 2))
    return {
        "hand": (sparse(LATER, 0), sparse(EARLIER, 1)),
        "hand-batched": (sparse(LATER, 2, (3,)), sparse(EARLIER, 3)),
        "empty-output": (sparse(pattern_of({1: [0]}, (3, 4)), 4), sparse(empty, 5)),
        "middle-row-only": (sparse(pattern_of({0: [1, 3], 1: [0]}, (2, 4)), 6), sparse(only_1, 7)),
        "random": (sparse(random_l, 8), sparse(random_e, 9)),
    }


def test_the_hand_built_product_has_the_boundaries_it_claims():
    counts = np.bincount(_pairs(LATER, EARLIER).segment)
    assert set(counts) == {1, 2, 3}
    out = _pairs(LATER, EARLIER).pattern
    assert 0 not in out.rows and 5 not in out.rows and 5 not in out.cols


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize(
    "name", ["hand", "hand-batched", "empty-output", "middle-row-only", "random"]
)
def test_spgemm_values_equal_the_dense_product(x64, method, name):
    later, earlier = products()[name]
    pairs = _pairs(later.pattern, earlier.pattern)
    values = spgemm_values(later.values, earlier.values, pairs, method)
    expected = dense(earlier) @ dense(later)
    # The pattern is the boolean product's, and every value (zeros off it) matches.
    structure = [(dense(x).reshape(-1, *x.shape)[0] != 0).astype(int) for x in (earlier, later)]
    rows, cols = np.nonzero(structure[0] @ structure[1])
    np.testing.assert_array_equal(pairs.pattern.rows, rows)
    np.testing.assert_array_equal(pairs.pattern.cols, cols)
    np.testing.assert_allclose(dense_of_values(values, pairs.pattern), expected, rtol=1e-13)
    # The public product (whatever format and method its plan picks) agrees.
    np.testing.assert_allclose(
        np.asarray(later.then(earlier).to_dense().a), expected, rtol=1e-13, atol=0
    )


@pytest.mark.parametrize("method", ["padded", "segment"])
@pytest.mark.parametrize("pattern", [EARLIER, LATER], ids=["earlier", "later"])
def test_spmv_equals_the_dense_product(x64, method, pattern):
    maps = sparse(pattern, 11)
    v = jnp.asarray(np.random.default_rng(12).uniform(1.0, 2.0, (1, 3, pattern.shape[1])))
    expected = np.einsum("mij,mbj->mbi", dense(maps), np.asarray(v))
    np.testing.assert_allclose(np.asarray(maps._apply(v, 0, method)), expected, rtol=1e-13)
    # The rows of y times the map's transpose (what a product with a dense map gathers).
    y = jnp.asarray(np.random.default_rng(13).uniform(1.0, 2.0, (1, 2, pattern.shape[1])))
    expected = np.asarray(y) @ np.swapaxes(dense(maps), -1, -2)
    np.testing.assert_allclose(np.asarray(maps._apply(y, 1, method)), expected, rtol=1e-13)
