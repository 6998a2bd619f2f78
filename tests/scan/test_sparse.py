"""Sparse maps: SpMV and the two-phase SpGEMM against dense products, the densify decision,
sparse-dense products without densifying, and the symbolic plan against brute-force counts."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bppsa.scan import Dense
from bppsa.scan._profile import Kernels
from bppsa.scan._sparse import (
    METHODS,
    Pattern,
    Sparse,
    _pairs,
    compose,
    product_plan,
    spgemm_values,
)

# Normwise relative error max|a - b| / max|b| (as tests/helpers.py). The products here sum at
# most ~30 terms per entry and a chain composes at most 8 maps: float32 rounding stays below
# ~1e-6 (measured <= 4e-7), so 1e-5 leaves margin while a wrong pair or a transposed operand
# (errors of order 1) fails; float64 likewise at 1e-12 (measured ~1e-15).
TOL = {jnp.dtype("float32"): 1e-5, jnp.dtype("float64"): 1e-12}
KERNELS = Kernels()  # what the kernels run with outside the scan's derivative rules


def assert_close(actual, expected, dtype):
    actual, expected = np.asarray(actual, np.float64), np.asarray(expected, np.float64)
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    scale = max(np.abs(expected).max(initial=0.0), 1e-30)
    error = np.abs(actual - expected).max(initial=0.0) / scale
    assert error <= TOL[jnp.dtype(dtype)], error


def random_pattern(rng, shape, density, empty_rows=(), empty_cols=()):
    mask = rng.random(shape) < density
    mask[list(empty_rows), :] = False
    mask[:, list(empty_cols)] = False
    rows, cols = np.nonzero(mask)
    return Pattern.from_coo(rows, cols, shape)[0]


def random_sparse(rng, shape, density, vbatch=(), dtype=jnp.float32, **empty):
    pattern = random_pattern(rng, shape, density, **empty)
    values = rng.normal(size=(1, *vbatch, pattern.nnz))
    return Sparse(jnp.asarray(values, dtype), pattern)


def dense_of(maps):
    return np.asarray(maps.to_dense().a, np.float64)


def matmul(earlier, later):
    """``earlier @ later`` for stacks ``(1, *batch, r, c)`` with or without the batch dims."""
    earlier, later = np.asarray(earlier, np.float64), np.asarray(later, np.float64)
    ndim = max(earlier.ndim, later.ndim)
    earlier, later = (x.reshape(x.shape[:1] + (1,) * (ndim - x.ndim) + x.shape[1:])
                      for x in (earlier, later))  # fmt: skip
    return earlier @ later


# Rectangular, with empty rows and columns in both operands: (13, 9) @ (9, 17).
EARLIER, LATER = (13, 9), (9, 17)
EMPTY = dict(empty_rows=(0, 5), empty_cols=(2,))
BATCHES = [((), ()), ((), (3,)), ((3,), ()), ((3,), (3,))]


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("later_batch,earlier_batch", BATCHES)
def test_spgemm_numeric_phase_matches_dense(method, later_batch, earlier_batch, dtype):
    rng = np.random.default_rng(0)
    later = random_sparse(rng, LATER, 0.3, later_batch, dtype, **EMPTY)
    earlier = random_sparse(rng, EARLIER, 0.3, earlier_batch, dtype, **EMPTY)
    pairs = _pairs(later.pattern, earlier.pattern)
    product = Sparse(spgemm_values(later.values, earlier.values, pairs, method), pairs.pattern)
    batch = later_batch or earlier_batch
    assert product.values.shape == (1, *batch, pairs.pattern.nnz)
    assert product.values.dtype == dtype
    expected = matmul(dense_of(earlier), dense_of(later))
    assert_close(product.to_dense().a, expected, dtype)
    # The output pattern is exactly the boolean product's non-zeros.
    structure = (dense_of(earlier) != 0).reshape(-1, *EARLIER)[0].astype(int)
    structure = structure @ (dense_of(later) != 0).reshape(-1, *LATER)[0].astype(int)
    rows, cols = np.nonzero(structure)
    assert pairs.pattern == Pattern.from_coo(rows, cols, (13, 17))[0]
    assert pairs.segment.size == structure.sum()


@pytest.mark.parametrize("densities", [(0.05, 0.05), (0.3, 0.3), (0.9, 0.9), (0.0, 0.5)])
@pytest.mark.parametrize("later_batch,earlier_batch", BATCHES[:2])
def test_then_matches_dense_and_reports_its_format(densities, later_batch, earlier_batch, dtype):
    rng = np.random.default_rng(1)
    later = random_sparse(rng, (40, 30), densities[0], later_batch, dtype)
    earlier = random_sparse(rng, (20, 40), densities[1], earlier_batch, dtype)
    plan = later.plan(earlier)
    product = jax.jit(lambda a, b: a.then(b))(later, earlier)
    assert type(product) is (Sparse if plan.format == "sparse" else Dense)
    expected = matmul(dense_of(earlier), dense_of(later))
    assert_close(product.to_dense().a, expected, dtype)
    if plan.format == "sparse":
        assert plan.density <= KERNELS.densify_density and product.pattern.nnz == plan.nnz_out


def test_densify_decision_follows_the_measured_thresholds():
    rng = np.random.default_rng(2)
    sparse = product_plan(
        random_pattern(rng, (200, 200), 0.01), random_pattern(rng, (200, 200), 0.01)
    )
    assert (sparse.format, sparse.kind) == ("sparse", "SpGEMM")
    # Dense output, few pairs per entry: the sparse numeric phase, stored dense.
    crowded = product_plan(
        random_pattern(rng, (400, 400), 0.05), random_pattern(rng, (400, 400), 0.05)
    )
    assert crowded.density > KERNELS.densify_density
    assert crowded.pairs / 400**3 <= KERNELS.densify_pair_ratio
    assert (crowded.format, crowded.method) == ("dense", "segment")
    # Many pairs: a GEMM.
    full = product_plan(random_pattern(rng, (50, 50), 0.5), random_pattern(rng, (50, 50), 0.5))
    assert (full.format, full.method) == ("dense", "gemm") and "GEMM" in full.reason
    # A diagonal factor pads nothing: the padded sum.
    diagonal = product_plan(Pattern.diagonal(200), random_pattern(rng, (200, 200), 0.01))
    assert diagonal.method == "padded" and diagonal.width == 1
    # One or two pairs per entry: the bucketed sum; more: the segment sum.
    i = np.arange(200)
    banded = Pattern.from_coo(np.r_[i, i[1:]], np.r_[i, i[:-1]], (200, 200))[0]
    assert product_plan(banded, banded).method == "bucketed"
    assert crowded.width > 2
    forced = product_plan(Pattern.diagonal(200), Pattern.diagonal(200), densify_density=0.0)
    assert forced.format == "dense"


@pytest.mark.parametrize("method", ["padded", "segment"])
@pytest.mark.parametrize("vbatch,batch", [((), ()), ((), (4,)), ((4,), (4,)), ((), (2, 3))])
def test_spmv_and_rows_match_dense(method, vbatch, batch, dtype):
    rng = np.random.default_rng(3)
    maps = random_sparse(rng, (11, 7), 0.3, vbatch, dtype, **EMPTY)
    v = jnp.asarray(rng.normal(size=(1, *batch, 7)), dtype)
    dense = dense_of(maps)
    expected = np.einsum("...ij,...j->...i", dense.reshape(1, *vbatch, 11, 7), np.asarray(v))
    assert_close(maps._apply(v, 0, method), expected, dtype)
    y = jnp.asarray(rng.normal(size=(1, *batch, 5, 7)), dtype)
    assert_close(maps._apply(y, 1, method), np.asarray(y) @ np.swapaxes(dense, -1, -2), dtype)


def test_spgemm_and_spmv_under_jit_and_vmap(x64):
    rng = np.random.default_rng(4)
    later = random_sparse(rng, LATER, 0.3, (), jnp.float64)
    earlier = random_sparse(rng, EARLIER, 0.3, (), jnp.float64)
    stacks = jnp.asarray(rng.normal(size=(5, 1, later.pattern.nnz)))

    def product(values):
        return Sparse(values, later.pattern).then(earlier).to_dense().a

    batched = jax.jit(jax.vmap(product))(stacks)
    expected = [dense_of(earlier) @ dense_of(Sparse(s, later.pattern)) for s in stacks]
    assert_close(batched, np.stack(expected), jnp.float64)
    vectors = jnp.asarray(rng.normal(size=(5, 1, 17)))
    applied = jax.vmap(lambda v: later.apply(v))(vectors)
    assert_close(applied, np.einsum("ij,bmj->bmi", dense_of(later)[0], vectors), jnp.float64)


def forms_shape(fn, shape, *args) -> bool:
    """Whether the jaxpr of ``fn(*args)`` has an array whose last dims are ``shape``."""
    return f"{shape[0]},{shape[1]}]" in str(jax.make_jaxpr(fn)(*args))


@pytest.mark.parametrize("sparse_batch,dense_batch", [((), ()), ((3,), ()), ((), (3,))])
def test_sparse_dense_products_do_not_densify(sparse_batch, dense_batch, dtype):
    rng = np.random.default_rng(5)
    sparse = random_sparse(rng, (9, 17), 0.3, sparse_batch, dtype, **EMPTY)
    earlier = Dense(jnp.asarray(rng.normal(size=(1, *dense_batch, 13, 9)), dtype))
    later = Dense(jnp.asarray(rng.normal(size=(1, *dense_batch, 17, 6)), dtype))
    # Sparse later, dense earlier: (13, 9) @ (9, 17).
    out = sparse.then(earlier)
    assert type(out) is Dense
    assert_close(out.a, matmul(earlier.a, dense_of(sparse)), dtype)
    assert not forms_shape(lambda s, d: s.then(d).a, (9, 17), sparse, earlier)
    # Dense later, sparse earlier: (9, 17) @ (17, 6), by compose or Sparse.after.
    for fn in (lambda s, d: compose(d, s), lambda s, d: s.after(d)):
        out = fn(sparse, later)
        assert type(out) is Dense
        assert_close(out.a, matmul(dense_of(sparse), later.a), dtype)
        assert not forms_shape(lambda s, d, fn=fn: fn(s, d).a, (9, 17), sparse, later)
    assert forms_shape(lambda s: s.to_dense().a, (9, 17), sparse)  # the check can fail


def test_dense_dense_compose_broadcasts_shared_and_per_example():
    rng = np.random.default_rng(6)
    shared, per_example = rng.normal(size=(1, 4, 5)), rng.normal(size=(1, 3, 5, 2))
    out = compose(Dense(jnp.asarray(per_example)), Dense(jnp.asarray(shared)))
    assert_close(out.a, shared[:, None] @ per_example, jnp.float32)


@pytest.mark.parametrize("seed", range(4))
def test_plan_counts_match_brute_force(seed):
    rng = np.random.default_rng(seed)
    later = random_pattern(rng, (8, 11), 0.35, empty_rows=(1,))
    earlier = random_pattern(rng, (6, 8), 0.35, empty_cols=(3,))
    e_dense = np.zeros(earlier.shape, int)
    e_dense[earlier.rows, earlier.cols] = 1
    l_dense = np.zeros(later.shape, int)
    l_dense[later.rows, later.cols] = 1
    meet = [(i, k, j) for i in range(6) for k in range(8) for j in range(11)
            if e_dense[i, k] and l_dense[k, j]]  # fmt: skip
    out = {(i, j) for i, _, j in meet}
    per_entry = [sum((i, j) == (a, b) for a, _, b in meet) for i, j in out]
    plan = product_plan(later, earlier, batch=4, later_per_example=True, densify_density=1.0)
    assert plan.pairs == len(meet) and plan.flops == 2 * len(meet) * 4
    assert plan.nnz_out == len(out) and plan.width == max(per_entry, default=0)
    assert plan.dense_flops == 2 * 6 * 8 * 11 * 4 and plan.shape == (6, 11)
    assert (plan.later_nnz, plan.earlier_nnz) == (later.nnz, earlier.nnz)
    if plan.format == "sparse":
        assert plan.out_floats == 4 * len(out)
    # Sparse with dense (either order): every dense entry meets every sparse one it touches.
    mixed = product_plan(later, (6, 8))
    assert (mixed.kind, mixed.format, mixed.pairs) == ("SpMM", "dense", 6 * later.nnz)
    mixed = product_plan((8, 11), earlier)
    assert (mixed.kind, mixed.pairs, mixed.out_floats) == ("SpMM", earlier.nnz * 11, 6 * 11)
    assert product_plan((8, 11), (6, 8)).pairs == 6 * 8 * 11


def test_pattern_transpose_and_scipy():
    rng = np.random.default_rng(7)
    maps = random_sparse(rng, (5, 8), 0.4)
    transposed, order = maps.pattern.transpose()
    back = Sparse(maps.values[..., order], transposed).to_dense().a
    np.testing.assert_array_equal(back, np.swapaxes(maps.to_dense().a, -1, -2))
    csr = maps.pattern.to_scipy(np.asarray(maps.values[0]))
    np.testing.assert_array_equal(csr.toarray(), maps.to_dense().a[0])


def test_errors_name_the_argument():
    rng = np.random.default_rng(8)
    a, b = random_pattern(rng, (4, 5), 0.5), random_pattern(rng, (3, 6), 0.5)
    with pytest.raises(ValueError, match="n_cols must equal the later map's n_rows"):
        product_plan(a, b)
    with pytest.raises(ValueError, match="method must be"):
        product_plan(a, (3, 4), method="scatter")
    with pytest.raises(TypeError, match="later must be a Pattern"):
        product_plan(np.zeros((4, 5)), (3, 4))
    with pytest.raises(ValueError, match="batch must be"):
        product_plan(a, (3, 4), batch=0)
    with pytest.raises(ValueError, match=r"Sparse values must have shape \(m, \*batch, "):
        Sparse(jnp.zeros((1, a.nnz + 1)), a)
