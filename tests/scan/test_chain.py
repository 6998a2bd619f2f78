"""The scan over a heterogeneous chain of maps (mixed shapes, Sparse and Dense, shared and
per-example) against a dense Python loop, and its symbolic plan against brute-force counts."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bppsa.scan import Dense, combine
from bppsa.scan._chain import chain_memory, chain_plan, chain_scan
from tests.helpers import spread
from tests.scan.test_sparse import assert_close, dense_of, random_pattern, random_sparse

LEVELS = [0, 1, 2, None]
LENGTHS = [1, 2, 3, 5, 8]
BATCH = 3


def random_chain(length, dtype, seed=0):
    """``length`` maps of sizes that change from layer to layer, cycling through shared
    sparse, per-example sparse and dense maps; entries scaled to keep products bounded."""
    rng = np.random.default_rng(seed)
    sizes = rng.integers(4, 13, length + 1)
    maps = []
    for k in range(length):
        shape = (int(sizes[k]), int(sizes[k + 1]))
        kind = (k + seed) % 3
        if kind == 0:
            maps.append(random_sparse(rng, shape, 0.35, (), dtype))
        elif kind == 1:
            maps.append(random_sparse(rng, shape, 0.35, (BATCH,), dtype))
        else:
            a = rng.normal(size=(1, *shape)) / np.sqrt(shape[1])
            maps.append(Dense(jnp.asarray(a, dtype)))
    g = jnp.asarray(rng.normal(size=(BATCH, int(sizes[-1]))), dtype)
    return g, maps


def python_loop(g, maps):
    """``g_{l-1} = A_l g_l`` in NumPy, from the last map back; returns ``[g_0, ..., g_L]``."""
    out = [np.asarray(g, np.float64)]
    for a in reversed(maps):
        out.append(np.einsum("...ij,...j->...i", dense_of(a)[0], out[-1]))
    return out[::-1]


@pytest.mark.parametrize("length,levels", spread(LENGTHS, LEVELS))
def test_matches_python_loop(length, levels, dtype):
    g, maps = random_chain(length, dtype, seed=length)  # the seed also shifts the type cycle
    out = chain_scan(g, maps, levels=levels)
    expected = python_loop(g, maps)
    assert len(out) == length + 1
    for actual, reference in zip(out, expected):
        assert actual.dtype == dtype
        assert_close(actual, reference, dtype)


def test_empty_chain_and_levels_beyond_the_top():
    g, maps = random_chain(3, jnp.float32)
    assert chain_scan(g, [])[0] is g
    for actual, expected in zip(chain_scan(g, maps, levels=7), python_loop(g, maps)):
        assert_close(actual, expected, jnp.float32)


def test_under_jit_and_vmap(x64):
    g, maps = random_chain(5, jnp.float64, seed=1)
    jitted = jax.jit(lambda g, maps: chain_scan(g, maps, levels=1))(g, maps)
    for actual, expected in zip(jitted, python_loop(g, maps)):
        assert_close(actual, expected, jnp.float64)
    # vmap over examples: the per-example maps' batch axis (1) with the vectors' (0).
    per_example = [getattr(m, "values", jnp.zeros((1, 1))).ndim == 3 for m in maps]
    axes = [jax.tree.map(lambda _: 1, m) if p else None for m, p in zip(maps, per_example)]
    one = jax.vmap(lambda g, maps: chain_scan(g, maps), in_axes=(0, axes))(g, maps)
    for actual, expected in zip(one, python_loop(g, maps)):
        assert_close(actual, expected, jnp.float64)


def test_dense_later_times_sparse_earlier_does_not_densify():
    rng = np.random.default_rng(3)
    first = random_sparse(rng, (9, 17), 0.3)  # A_1, the EARLIER operand of the product
    second = Dense(jnp.asarray(rng.normal(size=(1, 17, 6)), jnp.float32))
    third = Dense(jnp.asarray(rng.normal(size=(1, 6, 5)), jnp.float32))
    g = jnp.ones((BATCH, 5))
    jaxpr = str(jax.make_jaxpr(lambda g, m: chain_scan(g, m))(g, [first, second, third]))
    assert "9,17]" not in jaxpr
    rows = chain_plan([first, second, third])
    assert [(r.kind, r.method) for r in rows if r.sweep == "up" and r.format != "vector"] == [
        ("SpMM", "gather")
    ]


def test_combine_without_offsets():
    rng = np.random.default_rng(4)
    later = Dense(jnp.asarray(rng.normal(size=(1, 3, 4))))
    earlier = Dense(jnp.asarray(rng.normal(size=(1, 2, 3))))
    product, offset = combine((later, None), (earlier, None))
    assert offset is None
    np.testing.assert_allclose(product.a, earlier.a @ later.a, rtol=1e-6)


# -- the plan --------------------------------------------------------------------------------


def reference_plan(structures, levels, batch, per_example, densify_density, densify_pair_ratio):
    """Brute force on 0/1 integer matrices: (sweep, level, flops) of every product of the
    modified Blelloch scan, written as its own recursion over levels. A map is ``(matrix,
    copies, dense)``; a dense one is all ones."""
    rows = []

    def product(later, earlier, level):
        (l_int, l_copies, l_dense), (e_int, e_copies, e_dense) = later, earlier
        counts = e_int @ l_int
        pairs = int(counts.sum())
        (n0, n1), n2 = e_int.shape, l_int.shape[1]
        copies = max(l_copies, e_copies)
        dense = l_dense or e_dense
        dense = dense or pairs / (n0 * n1 * n2) > densify_pair_ratio
        dense = dense or (counts > 0).mean() > densify_density
        rows.append(("up", level, 2 * pairs * copies))
        return (np.ones_like(counts) if dense else (counts > 0).astype(int)), copies, dense

    def matvec(element, level, sweep):
        rows.append((sweep, level, 2 * int(element[0].sum()) * batch))

    maps = [(s.astype(int), batch if p else 1, False) for s, p in zip(structures, per_example)]
    maps, kept, level = maps[::-1], [], 0
    while maps and (levels is None or level < levels):
        level += 1
        kept.append(maps)
        rest = maps[1:]
        matvec(maps[0], level, "up")
        maps = [product(rest[i], rest[i + 1], level) for i in range(0, len(rest) - 1, 2)]
        maps += rest[len(rest) - len(rest) % 2 :]
    for element in maps:
        matvec(element, level, "linear")
    for maps in reversed(kept):
        for i in range(1, (len(maps) - 1) // 2 + 1):
            matvec(maps[2 * i - 1], level, "down")
        level -= 1
    return rows


@pytest.mark.parametrize("density", [0.2, 0.45])  # 0.45: products go dense
@pytest.mark.parametrize("levels", LEVELS)
@pytest.mark.parametrize("length", [1, 3, 5, 8])
def test_plan_flops_match_brute_force(length, levels, density):
    rng = np.random.default_rng(length)
    sizes = rng.integers(5, 12, length + 1)
    shapes = [(int(sizes[k]), int(sizes[k + 1])) for k in range(length)]
    patterns = [random_pattern(rng, shape, density) for shape in shapes]
    per_example = [k % 2 == 1 for k in range(length)]
    options = dict(densify_density=0.5, densify_pair_ratio=0.3)
    rows = chain_plan(patterns, levels, batch=4, per_example=per_example, **options)
    structures = []
    for p in patterns:
        s = np.zeros(p.shape, bool)
        s[p.rows, p.cols] = True
        structures.append(s)
    expected = reference_plan(structures, levels, 4, per_example, **options)
    assert sorted((r.sweep, r.level, r.flops) for r in rows) == sorted(expected)
    for r in rows:
        n2 = 1 if r.format == "vector" else r.later_shape[1]
        assert r.dense_flops == 2 * r.earlier_shape[0] * r.earlier_shape[1] * n2 * r.copies
        assert all(d < r.index for d in r.depends)
    if levels == 0:
        assert all(r.critical and r.kind == "SpMV" for r in rows) and len(rows) == length
    if density > 0.4 and length == 8 and levels is None:
        assert any(r.kind == "SpGEMM" and r.format == "dense" for r in rows)
        assert any(r.kind == "GEMM" for r in rows)
    assert sum(r.critical for r in rows) >= 1
    total = sum(r.floats for r in rows) + max((r.temp_floats for r in rows), default=0)
    assert chain_memory(patterns, levels, batch=4, per_example=per_example, **options) == total


def test_plan_of_maps_agrees_with_the_scan_it_describes():
    _, maps = random_chain(8, jnp.float32)
    rows = chain_plan(maps, 2)
    assert {r.copies for r in rows if r.format == "vector"} == {BATCH}
    # Full Blelloch on 8 maps: ceil(log2 9) = 4 levels; critical rows cover every depth.
    full = chain_plan(maps, None)
    assert max(r.level for r in full) == 4
    depth = {}
    for r in full:
        depth[r.index] = 1 + max((depth[d] for d in r.depends), default=0)
    assert {depth[r.index] for r in full if r.critical} == set(range(1, max(depth.values()) + 1))
    assert chain_plan([(4, 5), (5, 3)], 0)[0].kind == "GEMV"


def test_errors_name_the_argument():
    g, maps = random_chain(3, jnp.float32)
    with pytest.raises(ValueError, match=r"maps\[0\] \(A_1, \(3, 4\)\).*A_l must be"):
        chain_scan(jnp.ones(6), [Dense(jnp.ones((1, 3, 4))), Dense(jnp.ones((1, 5, 6)))])
    with pytest.raises(ValueError, match="g_last must have shape"):
        chain_scan(g[:, :-1], maps)
    for bad in (-1, 1.5, True):
        with pytest.raises(ValueError, match="levels must be None or an int"):
            chain_scan(g, maps, levels=bad)
    with pytest.raises(ValueError, match=r"maps\[1\] must be a stack of one map"):
        chain_scan(g, [maps[0], Dense(jnp.concatenate([maps[1].to_dense().a] * 2)), maps[2]])
    with pytest.raises(TypeError, match=r"maps\[0\] must be a MapStack"):
        chain_scan(g, [np.eye(3)])
    with pytest.raises(TypeError, match=r"maps\[0\] must be a MapStack, a Pattern"):
        chain_plan([np.eye(3)])
    with pytest.raises(ValueError, match="per_example must have one bool per map"):
        chain_plan([(3, 4)], per_example=[True, False])
    with pytest.raises(ValueError, match="A_l must be"):
        chain_plan([(3, 4), (5, 6)])
