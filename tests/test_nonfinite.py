"""NaN and infinity: where they appear in the gradient, BPPSA puts them exactly where jax.grad
through lax.scan does; and check_finite names the time step they come from."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import bppsa
from bppsa.models import GRU, RNN
from tests.helpers import RTOL

T, H, I = 12, 4, 2
# The three ways of scanning: Blelloch's levels, chunks, and a sequential scan in time blocks
# (what Auto() uses on CPU).
METHODS = ["blelloch", bppsa.Chunked(3), bppsa.Blocked(bppsa.Chunked(1), 5)]


def assert_same_nonfinite(actual, expected, dtype=jnp.float32, kinds=True):
    """NaN where expected has NaN, +-inf where it has +-inf (``kinds=False``: non-finite where
    it is non-finite), and the finite entries close. Returns whether any entry is not finite."""
    assert jax.tree.structure(actual) == jax.tree.structure(expected)
    some_nonfinite = False
    for a, b in zip(jax.tree.leaves(actual), jax.tree.leaves(expected), strict=True):
        a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
        for mask in (np.isnan, np.isposinf, np.isneginf) if kinds else (np.isfinite,):
            np.testing.assert_array_equal(mask(a), mask(b), err_msg=mask.__name__)
        finite = np.isfinite(b)
        some_nonfinite |= not finite.all()
        if finite.any():
            scale = max(np.max(np.abs(b[finite])), np.finfo(np.float64).tiny)
            assert np.max(np.abs(a[finite] - b[finite])) / scale <= RTOL[jnp.dtype(dtype)]
    return some_nonfinite


def problem(cell):
    k1, k2 = jax.random.split(jax.random.key(0))
    params = cell.init(I, H, key=k1)
    xs = jax.random.normal(k2, (T, I))
    return params, xs


def loss_fn(cell, scan, where="last"):
    def loss(params, xs, h0, weights):
        def body(h, x):
            h = cell(params, h, x)
            return h, h.sum()

        h, ys = scan(body, h0, xs)
        return (h**2).sum() if where == "last" else (ys * weights).sum()

    return loss


@functools.cache  # one compilation per method, cell and loss, shared by the cases
def gradients(method, cell, where):
    argnums = (0, 1, 2)
    actual = jax.jit(bppsa.grad(loss_fn(cell, bppsa.scan, where), argnums=argnums, method=method))
    expected = jax.jit(jax.grad(loss_fn(cell, jax.lax.scan, where), argnums=argnums))
    return actual, expected


def poison(name, params, xs, h0, weights):
    """Inputs with a NaN or infinity placed at one time step (or in the parameters)."""
    if name == "nan_in_xs":
        xs = xs.at[7, 0].set(jnp.nan)
    elif name == "inf_in_xs":
        xs = xs.at[7, 1].set(jnp.inf)
    elif name == "nan_in_init":
        h0 = h0.at[1].set(jnp.nan)
    elif name == "nan_in_weight":
        params = dict(params, weight_hh=params["weight_hh"].at[0, 1].set(jnp.nan))
    elif name == "nan_cotangent_of_y":
        weights = weights.at[5].set(jnp.nan)
    elif name == "inf_cotangent_of_y":
        weights = weights.at[5].set(-jnp.inf)
    return params, xs, h0, weights


CASES = [
    ("nan_in_xs", "last"),
    ("inf_in_xs", "last"),
    ("nan_in_init", "every"),
    ("nan_in_weight", "last"),
    ("nan_cotangent_of_y", "every"),
    ("inf_cotangent_of_y", "every"),
]


@pytest.mark.parametrize("case,where", CASES)
@pytest.mark.parametrize("cell", [RNN(), GRU()], ids=["rnn", "gru"])
@pytest.mark.parametrize("method", METHODS, ids=str)
def test_nonfinite_values_propagate_as_in_jax_grad(method, cell, case, where):
    params, xs = problem(cell)
    inputs = poison(case, params, xs, jnp.zeros(H), jnp.ones(T))
    actual, expected = (grad(*inputs) for grad in gradients(method, cell, where))
    assert assert_same_nonfinite(actual, expected), "the case should produce non-finite values"


@pytest.mark.parametrize("method", METHODS, ids=str)
def test_overflow_propagates_as_in_jax_grad(method):
    """A linear recurrence that overflows to infinity (autodiff Jacobians).

    Non-finite entries sit where jax.grad has them, but past an overflow, whether an entry is
    NaN or infinite depends on the order of the products (``inf - inf``, ``0 * inf``), which a
    parallel scan changes: e.g. ``(A_2 A_1) v`` against ``A_2 (A_1 v)``."""

    def loss(scan, a, xs):
        h, ys = scan(lambda h, x: (a @ h + x, h), jnp.ones(2), xs)
        return h.sum() + ys.sum()

    a = jnp.array([[1e12, 0.0], [1.0, -1e12]])
    xs = jnp.ones((8, 2))
    rows = lambda scan: lambda a, xs: loss(scan, a, xs)
    actual = jax.jit(bppsa.grad(rows(bppsa.scan), argnums=(0, 1), method=method))(a, xs)
    expected = jax.jit(jax.grad(rows(jax.lax.scan), argnums=(0, 1)))(a, xs)
    assert assert_same_nonfinite(actual, expected, kinds=False)


# check_finite: the error names the step.


def check(cell, where, inputs, method="auto", reverse=False, jit=False):
    def loss(params, xs, h0, weights):
        def body(h, x):
            h = cell(params, h, x)
            return h, h.sum()

        h, ys = bppsa.scan(body, h0, xs, reverse=reverse)
        return (h**2).sum() if where == "last" else (ys * weights).sum()

    grad = bppsa.grad(loss, method=method, check_finite=True)
    return (jax.jit(grad) if jit else grad)(*inputs)


@pytest.mark.parametrize("method", ["blelloch", bppsa.Blocked(bppsa.Chunked(1), 5)], ids=str)
@pytest.mark.parametrize("reverse", [False, True])
def test_check_names_the_earliest_nonfinite_jacobian(method, reverse):
    params, xs = problem(RNN())
    inputs = poison("nan_in_xs", params, xs, jnp.zeros(H), jnp.ones(T))
    with pytest.raises(FloatingPointError, match=r"Jacobian is that of time step xs\[7\]"):
        check(RNN(), "last", inputs, method, reverse)


def test_check_names_the_step_whose_output_cotangent_is_not_finite():
    params, xs = problem(GRU())
    inputs = poison("nan_cotangent_of_y", params, xs, jnp.zeros(H), jnp.ones(T))
    with pytest.raises(FloatingPointError, match=r"arises at time step xs\[5\]: the cotangent"):
        check(GRU(), "every", inputs, bppsa.Blocked(bppsa.Chunked(1), 5))


def test_check_names_the_final_carry_and_an_overflow():
    params, xs = problem(RNN())
    inputs = (params, xs, jnp.zeros(H), jnp.ones(T))

    def loss(params, xs, h0, _):
        h, _ = bppsa.scan(lambda h, x: (RNN()(params, h, x), None), h0, xs)
        return jnp.sqrt(h.sum() - 100.0)  # NaN: a negative square root after the scan

    with pytest.raises(FloatingPointError, match="cotangent of the final carry"):
        bppsa.grad(loss, check_finite=True)(*inputs)

    def overflowing(a, xs):
        return bppsa.scan(lambda h, x: (a @ h + x, None), jnp.ones(2), xs)[0].sum()

    a = jnp.array([[1e30, 0.0], [0.0, 1.0]])
    with pytest.raises(FloatingPointError, match="input carry, which overflowed"):
        bppsa.grad(overflowing, check_finite=True, method="blelloch")(a, jnp.zeros((4, 2)))


def test_check_under_jit_and_when_everything_is_finite():
    params, xs = problem(RNN())
    inputs = poison("nan_in_weight", params, xs, jnp.zeros(H), jnp.ones(T))
    with pytest.raises(Exception, match=r"Jacobian is that of time step xs\[0\]"):
        jax.block_until_ready(check(RNN(), "last", inputs, jit=True))
    finite = (params, xs, jnp.zeros(H), jnp.ones(T))
    with bppsa.trace_plans() as plans:
        checked = check(RNN(), "every", finite, jit=True)
    # The same method without the check gives the same bits (with the check, Auto() keeps to
    # the Jacobian backward, which holds it).
    method = plans[0].method
    plain = jax.jit(bppsa.grad(loss_fn(RNN(), bppsa.scan, "every"), method=method))(*finite)
    for a, b in zip(jax.tree.leaves(checked), jax.tree.leaves(plain), strict=True):
        np.testing.assert_array_equal(a, b)


def test_check_finite_must_be_a_bool():
    with pytest.raises(TypeError, match="check_finite must be a bool"):
        bppsa.grad(lambda x: x, check_finite="yes")
    with pytest.raises(TypeError, match="check_finite must be a bool"):
        bppsa.scan(lambda h, x: (h, x), 0.0, jnp.ones(3), check_finite=1)


# check_finite on a scan that is only run: the forward pass is checked.


def nan_at(step):
    return jnp.linspace(-1.0, 1.0, T).at[step].set(jnp.nan)


def tanh_body(h, x):
    return jnp.tanh(0.5 * h + x), h


@pytest.mark.parametrize("method", ["auto", "sequential", "blelloch"])
@pytest.mark.parametrize("reverse", [False, True])
def test_a_forward_only_scan_names_the_step_that_returns_a_nan(method, reverse):
    with pytest.raises(FloatingPointError) as info:
        bppsa.scan(tanh_body, 0.1, nan_at(5), reverse=reverse, method=method, check_finite=True)
    assert str(info.value).startswith("bppsa.scan (check_finite=True): non-finite values in the")
    assert "forward pass: the earliest non-finite value is returned by time step xs[5]: the " in (
        str(info.value)
    )
    # Without the check, the NaN is returned silently, as lax.scan returns it.
    _, ys = bppsa.scan(tanh_body, 0.1, nan_at(5), reverse=reverse, method=method)
    expected = jax.lax.scan(tanh_body, 0.1, nan_at(5), reverse=reverse)[1]
    assert_same_nonfinite(ys, expected)


def test_a_forward_only_scan_names_an_output_and_the_initial_carry():
    def body(h, x):
        return jnp.tanh(h + x), jnp.log(x)  # the output alone: log of a negative x

    xs = jnp.linspace(1.0, 2.0, T).at[3].set(-1.0)
    with pytest.raises(FloatingPointError, match=r"time step xs\[3\]: its output y, from a"):
        bppsa.scan(body, 0.0, xs, check_finite=True)
    with pytest.raises(FloatingPointError, match="the initial carry init is not finite"):
        bppsa.scan(body, jnp.inf, jnp.ones(T), check_finite=True)


def test_a_jitted_forward_only_scan_raises_and_a_finite_one_is_unchanged():
    run = jax.jit(lambda xs: bppsa.scan(tanh_body, 0.1, xs, check_finite=True))
    # A program the user compiled raises JAX's runtime error, which ends with the check's.
    with pytest.raises(Exception, match=r"forward pass: the earliest .* time step xs\[7\]"):
        jax.block_until_ready(run(nan_at(7)))
    xs = jnp.linspace(-1.0, 1.0, T)
    for a, b in zip(
        jax.tree.leaves(run(xs)),
        jax.tree.leaves(jax.jit(jax.lax.scan, static_argnums=0)(tanh_body, 0.1, xs)),
        strict=True,
    ):
        np.testing.assert_array_equal(a, b)


def test_the_check_s_error_in_a_compiled_program_reaches_bppsa_grad_s_caller_first():
    def loss(w):
        return bppsa.scan(lambda h, x: (jnp.tanh(w * h + x), h), 0.1, nan_at(4))[0]

    with pytest.raises(FloatingPointError) as info:
        bppsa.grad(jax.jit(loss), check_finite=True)(0.5)  # jax.grad runs a compiled backward
    assert str(info.value).startswith("bppsa.scan (check_finite=True): non-finite values")
    assert "Jacobian is that of time step xs[4]" in str(info.value)
    assert isinstance(info.value.__cause__, jax.errors.JaxRuntimeError)
