"""Analytic sparse transposed Jacobians of the CNN layers against dense autodiff (jax.jacrev of
the reference forward), their static patterns, and the paper's sparsities."""

import functools
import math
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bppsa.jacobians._layers import (
    conv2d_jacobian_t,
    identity_jacobian_t,
    linear_jacobian_t,
    maxpool2d_jacobian_t,
    relu_jacobian_t,
    sparsity,
)
from bppsa.scan._sparse import Pattern
from tests.helpers import assert_trees_close


def pair(v):
    return v if isinstance(v, tuple) else (v, v)


def normal(rng, shape, dtype):
    """Inputs drawn in NumPy: eager ``jax.random`` would compile a kernel per shape."""
    return jnp.asarray(rng.standard_normal(shape), dtype)


def dense_jacobian_t(f, x):
    """``J^T: (x.size, y.size)`` of ``f`` at ``x`` from ``jax.jacrev``."""
    jac = jax.jacrev(f)(x)
    return jac.reshape(-1, x.size).T


def to_dense(jac_t):
    """The matrices ``(*vbatch, n_rows, n_cols)`` of a one-map :class:`Sparse`, in NumPy (the
    tests compile one jitted function each rather than many eager ops)."""
    values = np.asarray(jac_t.values[0])
    out = np.zeros((*values.shape[:-1], *jac_t.shape), values.dtype)
    out[..., jac_t.pattern.rows, jac_t.pattern.cols] = values
    return out


def build_and_reference(build, reference, *args):
    """``build(*args)`` and ``reference(*args)`` in one jitted call."""
    return jax.jit(lambda *a: (build(*a), reference(*a)))(*args)


def conv_forward(weight, stride, padding):
    ph, pw = pair(padding)
    return lambda x: jax.lax.conv_general_dilated(
        x[None],
        weight,
        pair(stride),
        [(ph, ph), (pw, pw)],
        dimension_numbers=("NCHW", "OIHW", "NCHW"),
    )[0]


def pool_forward(kernel, stride):
    kh, kw = pair(kernel)
    sh, sw = pair(kernel if stride is None else stride)
    return lambda x: jax.lax.reduce_window(
        x[None], -jnp.inf, jax.lax.max, (1, 1, kh, kw), (1, 1, sh, sw), "VALID"
    )[0]


def assert_sorted_and_exact(jac_t):
    """The pattern is what :meth:`Pattern.from_coo` makes of its own entries (sorted, unique)."""
    p = jac_t.pattern
    rebuilt, order = Pattern.from_coo(p.rows, p.cols, p.shape)
    assert rebuilt == p
    np.testing.assert_array_equal(order, np.arange(p.nnz))


def taps_hits(n_in, k, stride, pad):
    """Per kernel offset along one axis: how many outputs read a real (not padded) input."""
    n_out = (n_in + 2 * pad - k) // stride + 1
    return np.array([sum(0 <= o * stride + t - pad < n_in for o in range(n_out)) for t in range(k)])


# (O, I, kernel, (H, W), stride, padding): kernels 1, 2, 3, 5, non-square ones, strides 1-3,
# paddings 0-2, non-square inputs, a kernel that exactly fits the padded input.
CONV_CASES = [
    (2, 3, 1, (4, 5), 1, 0),
    (2, 2, 2, (5, 4), 2, 0),
    (3, 2, 3, (5, 7), 1, 1),
    (2, 3, 3, (6, 5), 2, 1),
    (1, 2, 5, (7, 6), 1, 2),
    (2, 1, 5, (9, 8), 3, 2),
    (2, 2, (2, 3), (6, 7), (1, 2), (0, 1)),
    (2, 2, 3, (3, 8), 3, (2, 0)),
    (1, 1, 5, (3, 3), 1, 1),
    (2, 2, 3, (4, 4), 3, 2),
]


def conv_problem(case, dtype, seed=0):
    out_ch, in_ch, kernel, hw, stride, padding = case
    weight = normal(np.random.default_rng(seed), (out_ch, in_ch, *pair(kernel)), dtype)
    return weight, hw, stride, padding


@pytest.mark.parametrize("case", CONV_CASES)
def test_conv2d_matches_autodiff(case, dtype):
    weight, hw, stride, padding = conv_problem(case, dtype)
    x = jnp.zeros((case[1], *hw), dtype)
    jac_t, expected = build_and_reference(
        lambda w: conv2d_jacobian_t(w, hw, stride=stride, padding=padding),
        lambda w: dense_jacobian_t(conv_forward(w, stride, padding), x),
        weight,
    )
    assert jac_t.values.shape == (1, jac_t.pattern.nnz) and jac_t.values.dtype == dtype
    assert jac_t.shape == expected.shape
    assert_trees_close(to_dense(jac_t), expected, dtype)
    # No stored entry is a structural zero (normal weights are never 0), none is missing.
    assert jac_t.pattern.nnz == int((expected != 0).sum())
    assert_sorted_and_exact(jac_t)


@pytest.mark.parametrize("case", CONV_CASES[2:7])
def test_conv2d_concrete_mask_removes_entries(case, dtype):
    weight, hw, stride, padding = conv_problem(case, dtype)
    mask = np.random.default_rng(1).random(weight.shape) < 0.4
    x = jnp.zeros((case[1], *hw), dtype)
    jac_t, expected = build_and_reference(
        lambda w: conv2d_jacobian_t(w, hw, stride=stride, padding=padding, mask=mask),
        lambda w: dense_jacobian_t(conv_forward(w * mask, stride, padding), x),
        weight,
    )
    assert_trees_close(to_dense(jac_t), expected, dtype)
    kh, kw = weight.shape[2:]
    hits = np.outer(
        taps_hits(hw[0], kh, pair(stride)[0], pair(padding)[0]),
        taps_hits(hw[1], kw, pair(stride)[1], pair(padding)[1]),
    )
    assert jac_t.pattern.nnz == int((mask * hits).sum()) == int((expected != 0).sum())
    assert_sorted_and_exact(jac_t)


def test_conv2d_mask_without_padding_is_count_times_positions():
    weight, hw, _, _ = conv_problem((3, 2, 3, (6, 7), 1, 0), jnp.float32)
    mask = np.random.default_rng(2).random(weight.shape) < 0.3
    jac_t = conv2d_jacobian_t(weight, hw, mask=mask)
    assert jac_t.pattern.nnz == int(mask.sum()) * 4 * 5


def test_conv2d_traced_mask_warns_and_is_correct(dtype):
    weight, hw, stride, padding = conv_problem(CONV_CASES[3], dtype)
    mask = jnp.asarray(np.random.default_rng(3).random(weight.shape) < 0.5)
    x = jnp.zeros((weight.shape[1], *hw), dtype)
    with pytest.warns(UserWarning, match="concrete"):
        jac_t, expected = build_and_reference(
            lambda w, m: conv2d_jacobian_t(w, hw, stride=stride, padding=padding, mask=m),
            lambda w, m: dense_jacobian_t(conv_forward(w * m, stride, padding), x),
            weight,
            mask,
        )
    assert jac_t.pattern == conv2d_jacobian_t(weight, hw, stride=stride, padding=padding).pattern
    assert_trees_close(to_dense(jac_t), expected, dtype)


def test_conv2d_closed_over_jax_mask_is_structural():
    weight, hw, stride, padding = conv_problem(CONV_CASES[2], jnp.float32)
    mask = jnp.asarray(np.random.default_rng(4).random(weight.shape) < 0.5)
    build = lambda m: lambda w: conv2d_jacobian_t(w, hw, stride=stride, padding=padding, mask=m)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        jac_t = jax.jit(build(mask))(weight)
    eager = build(np.asarray(mask))(weight)
    assert jac_t.pattern is eager.pattern  # one cache entry for equal masks
    np.testing.assert_array_equal(jac_t.values, eager.values)
    assert build(~np.asarray(mask))(weight).pattern != eager.pattern


def test_conv2d_under_jit_reuses_the_pattern():
    weight, hw, stride, padding = conv_problem(CONV_CASES[4], jnp.float32)
    build = lambda w: conv2d_jacobian_t(w, hw, stride=stride, padding=padding)
    first, second = jax.jit(build)(weight), jax.jit(build)(2 * weight + 1)
    assert first.pattern is second.pattern
    eager = build(2 * weight + 1)
    np.testing.assert_array_equal(second.values, eager.values)
    # The element's own to_dense agrees with the test's.
    np.testing.assert_array_equal(eager.to_dense().a[0], to_dense(eager))


@pytest.mark.parametrize("shape", [(1, 1), (3, 5), (6, 2)])
def test_linear_matches_autodiff(shape, dtype):
    rng = np.random.default_rng(0)
    weight, bias = normal(rng, shape, dtype), normal(rng, shape[:1], dtype)
    mask = np.random.default_rng(5).random(shape) < 0.5
    x = jnp.zeros(shape[1], dtype)
    reference = lambda w: dense_jacobian_t(lambda x: x @ w.T + bias, x)

    def build(w):
        return linear_jacobian_t(w), linear_jacobian_t(w, mask=mask)

    (jac_t, masked), (expected, expected_masked) = build_and_reference(
        build, lambda w: (reference(w), reference(w * mask)), weight
    )
    assert jac_t.shape == (shape[1], shape[0])
    assert_trees_close(to_dense(jac_t), expected, dtype)
    assert masked.pattern.nnz == int(mask.sum())
    assert_sorted_and_exact(masked)
    assert_trees_close(to_dense(masked), expected_masked, dtype)
    with pytest.warns(UserWarning, match="concrete"):
        traced = jax.jit(lambda w, m: linear_jacobian_t(w, mask=m))(weight, mask)
    assert traced.pattern == jac_t.pattern
    assert_trees_close(to_dense(traced), expected_masked, dtype)


def relu_input(batch, shape, dtype, seed=0):
    """Normal draws with exact zeros at a quarter of the positions (the kink)."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((batch, *shape))
    return jnp.asarray(np.where(rng.random(x.shape) < 0.25, 0, x), dtype)


def per_example(f):
    """``J^T`` of ``f`` for each example of ``x: (B, ...)``, by a loop (not vmap)."""
    return lambda x: jnp.stack([dense_jacobian_t(f, x[b]) for b in range(x.shape[0])])


@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("shape", [(5,), (2, 3, 4)])
def test_relu_matches_autodiff(batch, shape, dtype):
    x = relu_input(batch, shape, dtype)
    (jac_t, other), expected = build_and_reference(
        lambda x: (relu_jacobian_t(x), relu_jacobian_t(-x + 1)), per_example(jax.nn.relu), x
    )
    n = math.prod(shape)
    assert jac_t.values.shape == (1, batch, n) and jac_t.pattern == Pattern.diagonal(n)
    np.testing.assert_array_equal(to_dense(jac_t), expected)
    assert other.pattern is jac_t.pattern  # data independent
    assert jac_t.pattern is relu_jacobian_t(x).pattern


def test_relu_slope_at_zero_and_nan_matches_grad():
    x = jnp.array([[-1.0, 0.0, -0.0, 2.0, jnp.nan, jnp.inf]])
    expected = jax.vmap(jax.grad(jax.nn.relu))(x[0])
    np.testing.assert_array_equal(relu_jacobian_t(x).values[0, 0], expected)


POOL_CASES = [  # (kernel_size, stride): stride < kernel overlaps windows, > kernel skips input
    (1, None),
    (2, None),
    (3, None),
    (2, 1),
    (3, 2),
    ((2, 3), (1, 2)),
    (3, (2, 1)),
    (2, 3),
]


def pool_inputs(batch, dtype):
    rng = np.random.default_rng(0)
    shape = (batch, 2, 7, 6)
    inputs = {
        "normal": rng.standard_normal(shape),
        # Many ties: small integers, and the zeros a ReLU leaves.
        "integers": rng.integers(0, 3, shape),
        "after_relu": np.maximum(rng.standard_normal(shape), 0),
        "zeros": np.zeros(shape),
    }
    return {name: jnp.asarray(x, dtype) for name, x in inputs.items()}


@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("case", POOL_CASES)
def test_maxpool2d_matches_autodiff_with_ties(case, batch, dtype):
    kernel, stride = case
    inputs = pool_inputs(batch, dtype)
    built, expected = build_and_reference(
        lambda xs: {k: maxpool2d_jacobian_t(x, kernel, stride) for k, x in xs.items()},
        lambda xs: {k: per_example(pool_forward(kernel, stride))(x) for k, x in xs.items()},
        inputs,
    )
    for name, jac_t in built.items():
        assert jac_t.values.shape == (1, batch, jac_t.pattern.nnz), name
        np.testing.assert_array_equal(to_dense(jac_t), expected[name], err_msg=name)
        assert jac_t.pattern is built["normal"].pattern  # data independent
    kh, kw = pair(kernel)
    assert jac_t.pattern.nnz == kh * kw * jac_t.shape[1]  # every window slot
    assert_sorted_and_exact(jac_t)


def test_maxpool2d_nan_and_inf_match_autodiff():
    x = jnp.array([[[[jnp.nan, 1.0, jnp.nan], [2.0, jnp.nan, -jnp.inf], [1.0, 1.0, jnp.nan]]]])
    for kernel, stride in [(2, 1), (3, None)]:
        jac_t, expected = build_and_reference(
            functools.partial(maxpool2d_jacobian_t, kernel_size=kernel, stride=stride),
            per_example(pool_forward(kernel, stride)),
            x,
        )
        np.testing.assert_array_equal(to_dense(jac_t), expected)


def test_maxpool2d_eager_matches_jit():
    x = pool_inputs(3, jnp.float32)["integers"]
    jitted = jax.jit(lambda x: maxpool2d_jacobian_t(x, 3, 2))(x)
    eager = maxpool2d_jacobian_t(x, 3, 2)
    assert jitted.pattern is eager.pattern
    np.testing.assert_array_equal(jitted.values, eager.values)


def test_chain_of_maps_matches_vjp(dtype):
    """conv -> ReLU -> pool -> flatten -> linear: applying the maps right to left (latest layer
    first) is the VJP of the composition."""
    rng = np.random.default_rng(7)
    w_conv = normal(rng, (3, 2, 3, 3), dtype)
    w_lin = normal(rng, (4, 3 * 3 * 2), dtype)
    x = normal(rng, (2, 2, 6, 5), dtype)

    def net(x):
        z = jax.lax.conv_general_dilated(
            x, w_conv, (1, 1), [(1, 1), (1, 1)], dimension_numbers=("NCHW", "OIHW", "NCHW")
        )
        r = jax.nn.relu(z)
        p = jax.lax.reduce_window(r, -jnp.inf, jax.lax.max, (1, 1, 2, 2), (1, 1, 2, 2), "VALID")
        return p.reshape(p.shape[0], -1) @ w_lin.T, (z, r)

    @jax.jit
    def chain_and_vjp(x, g):
        _, vjp, (z, r) = jax.vjp(net, x, has_aux=True)
        maps = [
            conv2d_jacobian_t(w_conv, (6, 5), padding=1),
            relu_jacobian_t(z),
            maxpool2d_jacobian_t(r, 2),
            identity_jacobian_t(18, dtype),
            linear_jacobian_t(w_lin),
        ]
        v = g[None]
        for jac_t in reversed(maps):
            v = jac_t.apply(v)
        return v[0].reshape(x.shape), vjp(g)[0]

    g = normal(rng, (2, 4), dtype)
    actual, expected = chain_and_vjp(x, g)
    assert_trees_close(actual, expected, dtype)


def test_paper_first_layer_sparsities():
    """VGG-11's first layers on 32x32 (the paper: 0.99157, 0.99998, 0.99994)."""
    conv = conv2d_jacobian_t(jnp.zeros((64, 3, 3, 3)), (32, 32), padding=1)
    assert conv.pattern.nnz == 3 * 64 * 94 * 94
    x = jnp.zeros((1, 64, 32, 32))
    assert round(sparsity(conv), 5) == 0.99157
    assert round(sparsity(relu_jacobian_t(x)), 5) == 0.99998
    assert round(sparsity(maxpool2d_jacobian_t(x, 2)), 5) == 0.99994


def test_identity():
    jac_t = identity_jacobian_t(5)
    np.testing.assert_array_equal(jac_t.to_dense().a[0], np.eye(5))


W4 = jnp.zeros((2, 3, 3, 3))


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (lambda: conv2d_jacobian_t(jnp.zeros((2, 3, 3)), (5, 5)), ValueError, "weight"),
        (lambda: conv2d_jacobian_t(W4, (2, 5)), ValueError, "weight"),
        (
            lambda: conv2d_jacobian_t(jnp.zeros((2, 3, 6, 3)), (3, 3), padding=1),
            ValueError,
            "weight",
        ),
        (lambda: conv2d_jacobian_t(W4, (5, 0)), ValueError, "input_hw"),
        (lambda: conv2d_jacobian_t(W4, (5, 5, 5)), TypeError, "input_hw"),
        (lambda: conv2d_jacobian_t(W4, (5, 5), stride=0), ValueError, "stride"),
        (lambda: conv2d_jacobian_t(W4, (5, 5), stride=1.5), TypeError, "stride"),
        (lambda: conv2d_jacobian_t(W4, (5, 5), stride=(1, 2, 3)), TypeError, "stride"),
        (lambda: conv2d_jacobian_t(W4, (5, 5), padding=-1), ValueError, "padding"),
        (lambda: conv2d_jacobian_t(W4, (5, 5), padding=True), TypeError, "padding"),
        (lambda: conv2d_jacobian_t(W4, (5, 5), mask=np.ones((2, 3, 3), bool)), ValueError, "mask"),
        (lambda: linear_jacobian_t(jnp.zeros(3)), ValueError, "weight"),
        (
            lambda: linear_jacobian_t(jnp.zeros((2, 3)), mask=np.ones((3, 2), bool)),
            ValueError,
            "mask",
        ),
        (lambda: relu_jacobian_t(jnp.zeros(())), ValueError, "x"),
        (lambda: maxpool2d_jacobian_t(jnp.zeros((2, 4, 4)), 2), ValueError, "x"),
        (lambda: maxpool2d_jacobian_t(jnp.zeros((1, 2, 4, 4)), 5), ValueError, "kernel_size"),
        (lambda: maxpool2d_jacobian_t(jnp.zeros((1, 2, 4, 4)), 0), ValueError, "kernel_size"),
        (lambda: maxpool2d_jacobian_t(jnp.zeros((1, 2, 4, 4)), 2, (2, 0)), ValueError, "stride"),
        (lambda: identity_jacobian_t(0), ValueError, "n"),
    ],
)
def test_errors(call, error, match):
    with pytest.raises(error, match=match):
        call()


def test_integer_inputs_are_rejected():
    with pytest.raises(TypeError, match="x"):
        relu_jacobian_t(jnp.zeros((2, 3), jnp.int32))
    with pytest.raises(TypeError, match="x"):
        maxpool2d_jacobian_t(jnp.zeros((1, 1, 4, 4), jnp.int32), 2)
