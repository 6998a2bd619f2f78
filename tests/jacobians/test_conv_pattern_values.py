"""The patterns of strided convolutions and poolings whose output size is a rounded-down
quotient, entry by entry against dense autodiff (jax.jacrev of jax.lax.conv_general_dilated and
jax.lax.reduce_window).

Every case has ``(n + 2 pad - k) % stride != 0`` on both axes, so that an output size rounded up
instead of down changes the pattern. The assertions compare shapes, positions and values as
arrays (never by indexing a dense matrix at the pattern's positions, which could raise instead
of failing)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bppsa.jacobians import conv2d_jacobian_t, maxpool2d_jacobian_t

# (O, I, kernel, (H, W), stride, padding)
CONV_CASES = [
    (2, 2, 2, (5, 7), 2, 0),
    (1, 2, 3, (8, 8), (3, 2), 1),
    (2, 1, (3, 2), (6, 8), (2, 3), (0, 1)),
]
# (kernel, stride, (H, W)): floor-mode pooling with a remainder on both axes.
POOL_CASES = [(2, 2, (5, 7)), (3, (2, 3), (8, 7))]


def pair(v):
    return v if isinstance(v, tuple) else (v, v)


def assert_rounding_matters(hw, kernel, stride, padding):
    for n, k, s, p in zip(hw, pair(kernel), pair(stride), pair(padding), strict=True):
        assert (n + 2 * p - k) % s != 0, (n, k, s, p)


def assert_pattern_is_dense_nonzeros(jac_t, dense):
    """``jac_t``'s shape, positions and values are those of the non-zeros of ``dense``."""
    assert tuple(jac_t.shape) == dense.shape
    rows, cols = np.nonzero(dense)  # row-major: the pattern's order
    np.testing.assert_array_equal(jac_t.pattern.rows, rows)
    np.testing.assert_array_equal(jac_t.pattern.cols, cols)
    values = np.asarray(jac_t.values).reshape(-1, jac_t.pattern.nnz)
    for v in values:
        np.testing.assert_allclose(v, dense[rows, cols], rtol=1e-12)


@pytest.mark.parametrize("case", CONV_CASES, ids=str)
def test_strided_conv_pattern_equals_dense_jacobian(x64, case):
    out_ch, in_ch, kernel, hw, stride, padding = case
    assert_rounding_matters(hw, kernel, stride, padding)
    rng = np.random.default_rng(1)
    weight = jnp.asarray(rng.standard_normal((out_ch, in_ch, *pair(kernel))) + 3.0)  # no zeros
    ph, pw = pair(padding)

    def forward(x):
        return jax.lax.conv_general_dilated(
            x[None],
            weight,
            pair(stride),
            [(ph, ph), (pw, pw)],
            dimension_numbers=("NCHW", "OIHW", "NCHW"),
        )[0]

    x = jnp.zeros((in_ch, *hw), jnp.float64)
    dense = np.asarray(jax.jacrev(forward)(x)).reshape(-1, x.size).T  # (I*H*W, O*OH*OW)
    jac_t = conv2d_jacobian_t(weight, hw, stride=stride, padding=padding)
    assert_pattern_is_dense_nonzeros(jac_t, dense)


@pytest.mark.parametrize("case", POOL_CASES, ids=str)
def test_strided_pool_pattern_equals_dense_jacobian(x64, case):
    kernel, stride, hw = case
    assert_rounding_matters(hw, kernel, stride, 0)
    (kh, kw), (sh, sw) = pair(kernel), pair(stride)
    channels = 2
    # Distinct values: one maximum per window, so the Jacobian has one 1 per output.
    x = jnp.asarray(np.random.default_rng(2).permutation(channels * hw[0] * hw[1]), jnp.float64)
    x = x.reshape(1, channels, *hw)

    def forward(x):
        return jax.lax.reduce_window(
            x, -jnp.inf, jax.lax.max, (1, 1, kh, kw), (1, 1, sh, sw), "VALID"
        )[0]

    dense = np.asarray(jax.jacrev(forward)(x)).reshape(-1, x.size).T
    jac_t = maxpool2d_jacobian_t(x, kernel, stride)
    # The pattern holds every window slot (zeros included): its positions are the windows'.
    assert tuple(jac_t.shape) == dense.shape
    assert np.all(jac_t.pattern.cols < dense.shape[1]) and np.all(
        jac_t.pattern.rows < dense.shape[0]
    )
    n_out = dense.shape[1]
    assert jac_t.pattern.nnz == n_out * kh * kw
    values = np.asarray(jac_t.values).reshape(-1)
    picked = (jac_t.pattern.rows[values == 1], jac_t.pattern.cols[values == 1])
    rows, cols = np.nonzero(dense)
    np.testing.assert_array_equal(picked[0], rows)
    np.testing.assert_array_equal(picked[1], cols)
