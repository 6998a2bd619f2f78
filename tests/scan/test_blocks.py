"""Diagonal and block-diagonal elements against their dense forms: apply, rows, compose,
transpose, concat, diagonal; products keep the structure; every algorithm runs over them."""

import functools
from unittest import mock

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bppsa.scan import (
    BlockDiagonal,
    Dense,
    Diagonal,
    blelloch,
    block_grouping,
    chunked,
    combine,
    concat,
    sequential,
)
from bppsa.scan._blocks import SMALL_BLOCK

GROUPINGS = [
    (1, None),  # k = 1: a diagonal map in block form
    (2, None),
    (2, block_grouping((3, 3))),  # (c_i, h_i) pairs of a carry packed as [c, h]
    (3, (4, 0, 2, 5, 1, 3)),  # any permutation
]


def blocks(rng, m, k, n=6, batch=(2,)):
    return BlockDiagonal(jnp.asarray(rng.normal(size=(m, *batch, n // k, k, k))))


def with_perm(element, perm):
    return BlockDiagonal(element.blocks, perm)


@pytest.mark.parametrize("k,perm", GROUPINGS)
def test_block_diagonal_apply_rows_transpose_and_diagonal_match_the_dense_form(k, perm, x64):
    rng = np.random.default_rng(k)
    a = with_perm(blocks(rng, 4, k), perm)
    dense = a.to_dense().a  # (4, 2, 6, 6)
    assert dense.shape == (4, 2, 6, 6)
    v = jnp.asarray(rng.normal(size=(4, 2, 6)))
    np.testing.assert_allclose(a.apply(v), jnp.einsum("...ij,...j->...i", dense, v), rtol=1e-12)
    y = jnp.asarray(rng.normal(size=(4, 2, 5, 6)))
    np.testing.assert_allclose(a.apply_to_rows(y), y @ jnp.swapaxes(dense, -1, -2), rtol=1e-12)
    np.testing.assert_allclose(a.transpose().to_dense().a, jnp.swapaxes(dense, -1, -2))
    np.testing.assert_allclose(a.diagonal().d, jnp.diagonal(dense, axis1=-2, axis2=-1))
    # The maps are block-diagonal after the grouping: no entry outside the blocks.
    order = np.arange(6) if perm is None else np.asarray(perm)
    grouped = np.asarray(dense)[..., order, :][..., order]
    mask = np.kron(np.eye(6 // k), np.ones((k, k))).astype(bool)
    assert np.all(grouped[..., ~mask] == 0)
    assert a.floats_per_step() == a.dense_floats_per_step() == 2 * 6 * k and a.width == k


@pytest.mark.parametrize("k,perm", GROUPINGS)
def test_products_keep_the_blocks_and_equal_the_dense_products(k, perm, x64):
    rng = np.random.default_rng(10 + k)
    later, earlier = (with_perm(blocks(rng, 3, k), perm) for _ in range(2))
    product = later.then(earlier)  # earlier @ later
    assert isinstance(product, BlockDiagonal) and product.perm == later.perm
    np.testing.assert_allclose(
        product.to_dense().a, earlier.to_dense().a @ later.to_dense().a, rtol=1e-12
    )
    d = Diagonal(jnp.asarray(rng.normal(size=(3, 2, 6))))
    for mixed, expected in (
        (later.then(d), d.to_dense().a @ later.to_dense().a),  # diag after the blocks
        (d.then(earlier), earlier.to_dense().a @ d.to_dense().a),  # diag before them
    ):
        assert isinstance(mixed, BlockDiagonal)
        np.testing.assert_allclose(mixed.to_dense().a, expected, rtol=1e-12)
    # Another grouping or another type: a dense product, still the right one.
    other = BlockDiagonal(blocks(rng, 3, 2).blocks, (1, 0, 3, 2, 5, 4))
    if (k, perm) != (2, (1, 0, 3, 2, 5, 4)):
        crossed = later.then(other)
        assert isinstance(crossed, Dense)
        np.testing.assert_allclose(crossed.a, other.to_dense().a @ later.to_dense().a, rtol=1e-12)


def test_diagonal_products_stay_diagonal_with_a_shared_and_a_batched_map(x64):
    rng = np.random.default_rng(3)
    shared = Diagonal(jnp.asarray(rng.normal(size=(4, 5))))
    batched = Diagonal(jnp.asarray(rng.normal(size=(4, 2, 5))))
    for later, earlier in ((shared, batched), (batched, shared)):
        product = later.then(earlier)
        assert isinstance(product, Diagonal) and product.d.shape == (4, 2, 5)
        expected = np.asarray(shared.d)[:, None] * np.asarray(batched.d)
        np.testing.assert_allclose(product.d, expected, rtol=1e-12)
    assert shared.width == 1 and shared.dense_floats_per_step() == 5


def test_concat_keeps_blocks_of_one_grouping_and_densifies_across_groupings(x64):
    rng = np.random.default_rng(5)
    perm = block_grouping((3, 3))
    parts = [with_perm(blocks(rng, m, 2), perm) for m in (2, 3)]
    joined = concat(parts)
    assert isinstance(joined, BlockDiagonal) and len(joined) == 5 and joined.perm == perm
    np.testing.assert_allclose(
        joined.to_dense().a, jnp.concatenate([p.to_dense().a for p in parts]), rtol=1e-12
    )
    mixed = concat([parts[0], with_perm(blocks(rng, 1, 2), None)])
    assert isinstance(mixed, Dense) and mixed.a.shape == (3, 2, 6, 6)


def test_bad_blocks_and_groupings_are_refused():
    with pytest.raises(ValueError, match=r"blocks must have shape \(m, \*batch, g, k, k\)"):
        BlockDiagonal(jnp.zeros((2, 3, 2, 3)))
    with pytest.raises(ValueError, match=r"perm must be a permutation of range\(6\)"):
        BlockDiagonal(jnp.zeros((2, 3, 2, 2)), (0, 1, 2, 3, 4, 4))
    with pytest.raises(ValueError, match="equal sizes"):
        block_grouping((3, 4))
    assert block_grouping((3, 3)) == (0, 3, 1, 4, 2, 5)
    assert BlockDiagonal(jnp.zeros((1, 2, 2, 2)), (0, 1, 2, 3)).perm is None  # the identity


ALGORITHMS = {
    "sequential": sequential,
    "blelloch": blelloch,
    "blelloch-1-level": functools.partial(blelloch, levels=1),
    "chunked-3": functools.partial(chunked, chunks=3),
}


@pytest.mark.parametrize("algorithm", list(ALGORITHMS))
@pytest.mark.parametrize("length", [1, 2, 5, 17])
@pytest.mark.parametrize("kind", ["diagonal", "blocks", "grouped-blocks"])
def test_every_algorithm_runs_over_structured_maps_and_matches_a_python_loop(
    algorithm, length, kind, x64
):
    rng = np.random.default_rng(length)
    if kind == "diagonal":
        maps = Diagonal(jnp.asarray(rng.normal(size=(length, 2, 6))))
    else:
        maps = with_perm(
            blocks(rng, length, 2), block_grouping((3, 3)) if "grouped" in kind else None
        )
    b = jnp.asarray(rng.normal(size=(length, 2, 6)))
    g = jnp.asarray(rng.normal(size=(2, 6)))
    dense = np.asarray(maps.to_dense().a)
    expected = [np.asarray(g)]
    for t in reversed(range(length)):
        expected.append(np.einsum("bij,bj->bi", dense[t], expected[-1]) + np.asarray(b[t]))
    actual = jax.jit(ALGORITHMS[algorithm])(g, maps, b)
    np.testing.assert_allclose(actual, np.stack(expected[::-1]), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("algorithm", ["blelloch", "blelloch-1-level", "sequential", "chunked-3"])
@pytest.mark.parametrize("kind", ["diagonal", "blocks"])
def test_the_scans_never_form_a_dense_matrix(algorithm, kind, x64):
    """Every product the scans form keeps the element's type: no map is ever densified."""
    rng = np.random.default_rng(0)
    if kind == "diagonal":
        maps = Diagonal(jnp.asarray(rng.normal(size=(9, 2, 6))))
    else:
        maps = with_perm(blocks(rng, 9, 2), block_grouping((3, 3)))
    g = jnp.asarray(rng.normal(size=(2, 6)))
    expected = ALGORITHMS[algorithm](g, Dense(maps.to_dense().a), None)
    with mock.patch.object(type(maps), "to_dense", side_effect=AssertionError("densified")):
        actual = ALGORITHMS[algorithm](g, maps, None)
    np.testing.assert_allclose(actual, expected, rtol=1e-10)
    a, _ = combine((maps.take(0, 4), None), (maps.take(4, 8), None))
    assert type(a) is type(maps)


def _shapes(jaxpr) -> set[tuple[int, ...]]:
    """Shapes of every value a jaxpr (and the jaxprs inside it) forms."""
    shapes = set()
    for eqn in jaxpr.eqns:
        shapes |= {tuple(v.aval.shape) for v in eqn.outvars if hasattr(v.aval, "shape")}
        for param in eqn.params.values():
            inner = getattr(param, "jaxpr", None)
            if inner is not None:
                shapes |= _shapes(getattr(inner, "jaxpr", inner))
    return shapes


@pytest.mark.parametrize("kind", ["diagonal", "blocks"])
def test_chunked_aggregates_keep_the_structure(kind):
    """The chunk aggregates are maps of the elements' type, not (n + 1) x n dense rows."""
    rng = np.random.default_rng(1)
    if kind == "diagonal":
        maps = Diagonal(jnp.asarray(rng.normal(size=(17, 2, 6)), jnp.float32))
    else:
        maps = with_perm(blocks(rng, 17, 2), block_grouping((3, 3)))
    g = jnp.ones((2, 6), maps.per_step()[maps.per_step_fields[0]].dtype)
    run = functools.partial(chunked, chunks=3)
    dense_rows = {s[-2:] for s in _shapes(jax.make_jaxpr(run)(g, maps.to_dense(), None).jaxpr)}
    assert (7, 6) in dense_rows  # the check can fail: dense maps do form the rows
    structured = {s[-2:] for s in _shapes(jax.make_jaxpr(run)(g, maps, None).jaxpr)}
    assert (7, 6) not in structured and (6, 6) not in structured


# Blocks past SMALL_BLOCK (8) act by a batched matmul instead of the multiply-and-sum loop.
LARGE_GROUPINGS = [
    (12, None),
    (12, tuple(int(i) for i in np.random.default_rng(12).permutation(36))),
    (16, None),
    (16, block_grouping((16, 16))),
]


def dense_reference(element: BlockDiagonal) -> np.ndarray:
    """``P^T diag(blocks) P`` in numpy, independent of ``to_dense``: ``A[perm[i], perm[j]]`` is
    entry ``(i, j)`` of the block-diagonal matrix."""
    blocks = np.asarray(element.blocks)
    g, k = blocks.shape[-3:-1]
    n = g * k
    perm = np.arange(n) if element.perm is None else np.asarray(element.perm)
    dense = np.zeros((*blocks.shape[:-3], n, n))
    for b in range(g):
        members = perm[b * k : (b + 1) * k]
        dense[..., members[:, None], members[None, :]] = blocks[..., b, :, :]
    return dense


@pytest.mark.parametrize("k,perm", LARGE_GROUPINGS)
def test_large_blocks_apply_rows_transpose_and_diagonal_match_the_dense_form(k, perm, x64):
    assert k > SMALL_BLOCK
    n = 36 if k == 12 else 32
    rng = np.random.default_rng(100 + k)
    a = with_perm(blocks(rng, 3, k, n=n), perm)
    dense = dense_reference(a)  # (3, 2, n, n), blocks not symmetric
    assert not np.allclose(dense, np.swapaxes(dense, -1, -2))
    np.testing.assert_allclose(a.to_dense().a, dense, rtol=0, atol=0)
    v = rng.normal(size=(3, 2, n))
    np.testing.assert_allclose(a.apply(jnp.asarray(v)), np.einsum("...ij,...j->...i", dense, v))
    y = rng.normal(size=(3, 2, 5, n))  # 5 rows, each acted on as a vector
    expected_rows = y @ np.swapaxes(dense, -1, -2)
    np.testing.assert_allclose(a.apply_to_rows(jnp.asarray(y)), expected_rows, rtol=1e-12)
    transposed = a.transpose()
    assert isinstance(transposed, BlockDiagonal) and transposed.perm == a.perm
    np.testing.assert_allclose(dense_reference(transposed), np.swapaxes(dense, -1, -2))
    np.testing.assert_allclose(a.diagonal().d, np.diagonal(dense, axis1=-2, axis2=-1))


@pytest.mark.parametrize("k,perm", LARGE_GROUPINGS)
def test_large_block_products_keep_the_blocks_and_equal_the_dense_products(k, perm, x64):
    n = 36 if k == 12 else 32
    rng = np.random.default_rng(200 + k)
    later, earlier = (with_perm(blocks(rng, 3, k, n=n), perm) for _ in range(2))
    shared = with_perm(blocks(rng, 3, k, n=n, batch=()), perm)  # one map for every example
    for product, expected in (
        (later.then(earlier), dense_reference(earlier) @ dense_reference(later)),
        (later.then(shared), dense_reference(shared)[:, None] @ dense_reference(later)),
        (shared.then(earlier), dense_reference(earlier) @ dense_reference(shared)[:, None]),
    ):
        assert isinstance(product, BlockDiagonal) and product.perm == later.perm
        assert product.blocks.shape == (3, 2, n // k, k, k)
        np.testing.assert_allclose(dense_reference(product), expected, rtol=1e-12, atol=1e-12)
    d = Diagonal(jnp.asarray(rng.normal(size=(3, 2, n))))
    d_dense = np.asarray(d.d)[..., :, None] * np.eye(n)
    for mixed, expected in (
        (later.then(d), d_dense @ dense_reference(later)),  # diag after the blocks
        (d.then(earlier), dense_reference(earlier) @ d_dense),  # diag before them
    ):
        assert isinstance(mixed, BlockDiagonal)
        np.testing.assert_allclose(dense_reference(mixed), expected, rtol=1e-12)


@pytest.mark.parametrize("algorithm", ["blelloch", "chunked-3"])
def test_the_scans_over_large_blocks_match_a_python_loop(algorithm, x64):
    """Every product of the scan goes through the matmul branch of the block products."""
    rng = np.random.default_rng(16)
    maps = with_perm(blocks(rng, 5, 12, n=24), block_grouping((12, 12)))
    b = rng.normal(size=(5, 2, 24))
    g = rng.normal(size=(2, 24))
    dense = dense_reference(maps)
    expected = [g]
    for t in reversed(range(5)):
        expected.append(np.einsum("bij,bj->bi", dense[t], expected[-1]) + b[t])
    actual = ALGORITHMS[algorithm](jnp.asarray(g), maps, jnp.asarray(b))
    np.testing.assert_allclose(actual, np.stack(expected[::-1]), rtol=1e-10, atol=1e-12)
