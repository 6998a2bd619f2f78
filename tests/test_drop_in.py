"""bppsa.scan and bppsa.grad take what jax.lax.scan and jax.grad take, with their meaning:
unroll, allow_int, holomorphic; method and forward names with "_" or "-"."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import bppsa
from tests.helpers import assert_trees_close

XS = jnp.linspace(-1.0, 1.0, 21).reshape(7, 3)
W = 0.5 * jnp.eye(3) + 0.1


def body(w):
    return lambda h, x: (jnp.tanh(w @ h + x), h * h)


@pytest.mark.parametrize("unroll", [1, 2, 3, 7, 0, True, False])
@pytest.mark.parametrize("method", ["sequential", "blelloch"])
def test_unroll_gives_lax_scan_s_values_and_jax_grad_s_gradients(unroll, method):
    def loss(w, scan, **kwargs):
        h, ys = scan(body(w), jnp.ones(3), XS, unroll=unroll, **kwargs)
        return h.sum() + ys.sum()

    values = bppsa.scan(body(W), jnp.ones(3), XS, unroll=unroll, method=method)
    assert_trees_close(values, jax.lax.scan(body(W), jnp.ones(3), XS, unroll=unroll), "float32")
    expected = jax.grad(loss)(W, jax.lax.scan)
    assert_trees_close(jax.grad(loss)(W, bppsa.scan, method=method), expected, "float32")


def test_unroll_reaches_the_forward_and_plain_back_propagation_s_loops():
    def loss(w, method):
        return bppsa.scan(body(w), jnp.ones(3), XS, None, False, 3, method=method)[0].sum()

    def unrolls(method):  # of the scans in the gradient's program, nested ones included
        text = str(jax.make_jaxpr(jax.grad(lambda w: loss(w, method)))(W))
        return text.count("unroll=3")

    assert unrolls("sequential") == 2  # the forward, and its transpose
    assert unrolls("blelloch") == 1  # the forward; a parallel backward is no loop to unroll


@pytest.mark.parametrize("value_and_grad", [False, True])
def test_allow_int_gives_integer_arguments_float0_gradients_as_jax_grad(value_and_grad):
    def loss(w, n, scan):
        return scan(body(w * n), jnp.ones(3), XS)[0].sum()

    ours, theirs = (
        (bppsa.value_and_grad, jax.value_and_grad)
        if value_and_grad
        else (
            bppsa.grad,
            jax.grad,
        )
    )
    args = (W, 2)
    got = ours(lambda *a: loss(*a, bppsa.scan), argnums=(0, 1), allow_int=True)(*args)
    want = theirs(lambda *a: loss(*a, jax.lax.scan), argnums=(0, 1), allow_int=True)(*args)
    grads, expected = (got[1], want[1]) if value_and_grad else (got, want)
    assert grads[1].dtype == expected[1].dtype == jax.dtypes.float0
    assert_trees_close(grads[0], expected[0], "float32")
    with pytest.raises(TypeError) as ours_error:
        ours(lambda *a: loss(*a, bppsa.scan), argnums=(0, 1))(*args)
    with pytest.raises(TypeError) as jax_error:
        theirs(lambda *a: loss(*a, jax.lax.scan), argnums=(0, 1))(*args)
    assert str(ours_error.value) == str(jax_error.value)
    assert "allow_int" in str(ours_error.value)


@pytest.mark.parametrize("value_and_grad", [False, True])
def test_holomorphic_differentiates_a_complex_function_as_jax_grad(value_and_grad):
    xs = jnp.linspace(0.0, 1.0, 5).astype(jnp.complex64)

    def loss(w, scan):
        return scan(lambda h, x: (w * h + x * h * h, h), 0.3 + 0.1j, xs)[0]

    ours, theirs = (
        (bppsa.value_and_grad, jax.value_and_grad)
        if value_and_grad
        else (
            bppsa.grad,
            jax.grad,
        )
    )
    w = jnp.complex64(0.5 + 0.2j)
    got = ours(lambda w: loss(w, bppsa.scan), holomorphic=True)(w)
    want = theirs(lambda w: loss(w, jax.lax.scan), holomorphic=True)(w)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5)
    with pytest.raises(TypeError) as ours_error:
        ours(lambda w: loss(w, bppsa.scan))(w)
    with pytest.raises(TypeError) as jax_error:
        theirs(lambda w: loss(w, jax.lax.scan))(w)
    assert str(ours_error.value) == str(jax_error.value)
    assert "holomorphic=True" in str(ours_error.value)


@pytest.mark.parametrize(
    "names, cls",
    [
        (("sequential-scan", "sequential_scan", "Sequential_Scan"), bppsa.SequentialScan),
        (("fused-sequential", "fused_sequential"), bppsa.FusedSequential),
        (("blelloch", "BLELLOCH"), bppsa.Blelloch),
    ],
)
def test_method_names_take_underscores_or_hyphens(names, cls):
    for name in names:
        with bppsa.trace_plans() as plans:
            bppsa.scan(body(W), jnp.ones(3), XS, method=name)
        assert isinstance(plans[0].requested, cls), name
        assert isinstance(bppsa.scan.resolve(name), cls)


def test_forward_names_take_underscores_or_hyphens_and_the_error_lists_them():
    for name in ("sequential", "newton", "auto", "Newton"):
        with bppsa.trace_plans() as plans:
            bppsa.scan(body(W), jnp.ones(3), XS, forward=name)
        assert plans[0].forward is not None
    with pytest.raises(ValueError) as info:
        bppsa.scan(body(W), jnp.ones(3), XS, forward="parallel_newton")
    for name in ("'auto'", "'fused'", "'newton'", "'pipelined'", "'sequential'", "'_' or '-'"):
        assert name in str(info.value)


def test_the_docstrings_list_every_forward_and_method():
    forwards = ("sequential", "newton", "fused", "pipelined", "auto")
    methods = (*forwards[:1], "auto", "blelloch", "blocked", "chunked", "fused-sequential")
    methods += ("sequential-scan", "sharded")
    for fun in (bppsa.scan, bppsa.value_and_grad):
        for name in (*forwards, *methods):
            assert f'``"{name}"``' in fun.__doc__, (fun, name)
    assert "value_and_grad" in bppsa.grad.__doc__  # which lists them


def test_bppsa_scan_is_the_function_and_reaches_every_module_of_the_subpackage():
    import sys

    import bppsa.scan._core.layer_scan  # imported after bppsa.scan itself

    assert bppsa.scan._core.layer_scan is sys.modules["bppsa.scan._core.layer_scan"]
    assert bppsa.scan.Blelloch is bppsa.Blelloch and callable(sys.modules["bppsa.scan"])


def test_a_fallback_warning_points_at_the_user_s_line():
    body = lambda h, x: (jnp.tanh(jnp.cumsum(h) + x), h)  # cumsum: no kernel rule
    with pytest.warns(bppsa.FallbackWarning) as caught:
        bppsa.scan(body, jnp.zeros(2), jnp.ones((5, 2)), forward="fused")
    assert caught[0].filename == __file__
