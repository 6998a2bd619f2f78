"""Bad input raises a clear error naming the argument, at the call, before any backward pass
(in the words of jax.lax.scan where it has them)."""

import jax
import jax.numpy as jnp
import pytest

import bppsa


def body(h, x):
    return jnp.tanh(h + x), h


H0 = jnp.zeros(3)
XS = jnp.ones((5, 3))


def call_and_grad(f, init=H0, xs=XS, **kwargs):
    """Runs bppsa.scan plainly and under bppsa.grad: both must raise the same error."""
    errors = []
    for run in (
        lambda: bppsa.scan(f, init, xs, **kwargs),
        lambda: bppsa.grad(lambda i: bppsa.scan(f, i, xs, **kwargs)[0].sum())(init),
    ):
        with pytest.raises((TypeError, ValueError)) as info:
            run()
        errors.append(info.value)
    assert type(errors[0]) is type(errors[1]) and str(errors[0]) == str(errors[1])
    return errors[0]


def test_mismatched_leading_dims_of_xs():
    err = call_and_grad(lambda h, x: body(h, x[0] + x[1][:3]), xs=(XS, jnp.ones((4, 3))))
    assert isinstance(err, ValueError)
    assert "scan got values with different leading axis sizes: 5, 4" in str(err)


def test_length_disagreeing_with_xs():
    err = call_and_grad(body, length=4)
    assert isinstance(err, ValueError)
    assert "`length` argument of 4 which disagrees with leading axis sizes [5]" in str(err)


def test_no_xs_and_no_length():
    err = call_and_grad(lambda h, _: (h, h), xs=None)
    assert isinstance(err, ValueError) and "`length` not provided" in str(err)


def test_carry_changing_shape():
    err = call_and_grad(lambda h, x: (jnp.concatenate([h, x]), h))
    assert isinstance(err, TypeError)
    assert "carry input and carry output must have equal types" in str(err)
    assert "float32[3]" in str(err) and "float32[6]" in str(err)
    # The carry is named as the user's argument init and the carry the body f returns.
    assert (
        "The input carry init has type float32[3] but the corresponding component of the carry "
        "f returns has type float32[6]"
    ) in str(err)
    assert "carry carry" not in str(err)


def test_carry_changing_dtype(x64):
    err = call_and_grad(lambda h, x: (h.astype(jnp.float64) + x, h))
    assert isinstance(err, TypeError)
    assert "float32[3]" in str(err) and "float64[3]" in str(err)


def test_carry_changing_structure():
    err = call_and_grad(lambda h, x: ((h, h), h))
    assert isinstance(err, TypeError) and "same pytree structure" in str(err)
    assert "The input carry init is a" in str(err)


def test_a_component_of_the_carry_is_named_by_its_path_in_init():
    err = call_and_grad(lambda c, x: ((c[0] + x, (c[0] + x).astype(jnp.int32)), c[0]), (H0, H0))
    assert (
        "The input carry component init[1] has type float32[3] but the corresponding component "
        "of the carry f returns has type int32[3]"
    ) in str(err)


@pytest.mark.parametrize(
    "unroll, error", [(-1, ValueError), (1.5, TypeError), ("2", TypeError), (None, TypeError)]
)
def test_a_bad_unroll(unroll, error):
    err = call_and_grad(body, unroll=unroll)
    assert isinstance(err, error)
    assert "unroll must be an int >= 0 or a bool, as in jax.lax.scan" in str(err)


def test_body_not_returning_a_pair():
    err = call_and_grad(lambda h, x: jnp.tanh(h + x))
    assert isinstance(err, TypeError) and "scan body output must be a pair" in str(err)


def test_unknown_method_and_non_callable_body():
    with pytest.raises(ValueError, match=r"method='parallel' is not a known backward method"):
        bppsa.scan(body, H0, XS, method="parallel")
    with pytest.raises(TypeError, match="f argument should be a callable"):
        bppsa.scan(3, H0, XS)


def test_errors_come_before_any_backward_tracing(monkeypatch):
    """The check runs on the forward call: the backward is never reached."""

    def fail(*args, **kwargs):
        raise AssertionError("the backward pass was traced")

    monkeypatch.setattr(bppsa.Blelloch, "scan", fail)
    with pytest.raises(ValueError):
        jax.grad(lambda i: bppsa.scan(body, i, XS, length=2)[0].sum())(H0)
