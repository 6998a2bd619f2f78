"""Cells with their own derivative rules: gradients equal ``jax.grad`` through ``lax.scan``.

A ``jax.custom_jvp`` rule (a spiking cell's surrogate derivative, a rule that scales the
derivative) is read by its rule everywhere: the structure analysis, the fused backward, the
Jacobians. A ``jax.custom_vjp`` rule's backward is opaque and may not be linear in the
cotangent (JAX's ``clip_gradient``): the defaults back-propagate, an explicit method that forms
Jacobians refuses with an error that names the function and the way out, and
``linear_vjp=True`` (the user's word that the rule is linear) lets every method run it.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import bppsa
from bppsa.scan._core import diagonal_paths
from bppsa.scan._core.structure import carry_structure

H, T = 6, 11
METHODS = ["blelloch", "chunked", "sequential-scan", "fused-sequential"]


@jax.custom_jvp
def spike(v):
    """A step function whose derivative is a surrogate (a fast sigmoid's)."""
    return (v > 0).astype(v.dtype)


@spike.defjvp
def _spike_jvp(primals, tangents):
    (v,), (dv,) = primals, tangents
    return spike(v), dv / (1 + jnp.abs(v)) ** 2


@jax.custom_jvp
def half_tanh(v):
    """``tanh`` whose rule halves its derivative."""
    return jnp.tanh(v)


@half_tanh.defjvp
def _half_tanh_jvp(primals, tangents):
    (v,), (dv,) = primals, tangents
    y = jnp.tanh(v)
    return y, 0.5 * (1 - y**2) * dv


def _custom_vjp(backward):
    """The identity with ``backward`` as its rule."""

    @jax.custom_vjp
    def identity(x):
        return x

    identity.defvjp(lambda x: (x, None), lambda _, g: (backward(g),))
    return identity


straight_through = _custom_vjp(lambda g: g)
negated_half = _custom_vjp(lambda g: -0.5 * g)
clip_gradient = _custom_vjp(lambda g: jnp.clip(g, -0.1, 0.1))  # not linear in g


def _weights(dtype=jnp.float32):
    w = jax.random.normal(jax.random.key(0), (H, H), dtype) / 2
    d = jnp.linspace(0.5, 0.9, H, dtype=dtype)
    return {"w": w, "d": d}


CELLS = {  # name -> (cell(params, h, x), the kind of rule)
    "spike": (lambda p, h, x: 0.5 * h + spike(p["w"] @ h + x), "jvp"),
    "diagonal_spike": (lambda p, h, x: 0.5 * h + spike(p["d"] * h + x), "jvp"),
    "half_tanh": (lambda p, h, x: half_tanh(p["w"] @ h + x), "jvp"),
    "straight_through": (lambda p, h, x: jnp.tanh(straight_through(p["w"] @ h) + x), "linear"),
    "negated_half": (lambda p, h, x: jnp.tanh(negated_half(p["d"] * h) + x), "linear"),
    "clip_gradient": (lambda p, h, x: jnp.tanh(clip_gradient(p["w"] @ h) + x), "nonlinear"),
}
JVP = [name for name, (_, kind) in CELLS.items() if kind == "jvp"]
VJP = [name for name, (_, kind) in CELLS.items() if kind != "jvp"]
LINEAR = [name for name, (_, kind) in CELLS.items() if kind == "linear"]


def _xs(dtype=jnp.float32, batch=None):
    shape = (T, H) if batch is None else (batch, T, H)
    return jax.random.normal(jax.random.key(1), shape, dtype)


def _loss(cell, scan=bppsa.scan, vmapped=False, **options):
    """Cotangents on every step's output and on the final carry."""
    if scan is bppsa.scan:
        scan = functools.partial(scan, **options)

    def one(params, xs):
        h, ys = scan(lambda h, x: (cell(params, h, x), h), jnp.zeros(H, xs.dtype), xs)
        return jnp.sum(h * jnp.arange(H)) + jnp.sum(ys**2)

    if not vmapped:
        return one
    return lambda params, xs: jnp.sum(jax.vmap(one, (None, 0))(params, xs))


def _assert_close(got, want):
    rtol = 1e-5 if jax.tree.leaves(want)[0].dtype == jnp.float32 else 1e-11
    for g, r in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        scale = float(jnp.abs(r).max())
        np.testing.assert_allclose(g, r, rtol=rtol, atol=rtol * scale)


def _check_defaults(name, vmapped, dtype, method=None):
    cell = CELLS[name][0]
    params, xs = _weights(dtype), _xs(dtype, 4 if vmapped else None)
    options = {} if method is None else {"method": method}
    got = bppsa.grad(_loss(cell, vmapped=vmapped, **options))(params, xs)
    want = jax.grad(_loss(cell, jax.lax.scan, vmapped))(params, xs)
    _assert_close(got, want)


@pytest.mark.parametrize("name", sorted(CELLS))
@pytest.mark.parametrize("vmapped", [False, True], ids=["one", "vmapped"])
@pytest.mark.parametrize("profile", ["cpu", "gpu"])
def test_the_defaults_equal_lax_scan(name, vmapped, profile):
    method = None if profile == "cpu" else bppsa.Auto(profile=bppsa.get_profile("gpu"))
    _check_defaults(name, vmapped, jnp.float32, method)


@pytest.mark.parametrize("name", sorted(CELLS))
def test_the_defaults_equal_lax_scan_in_float64(x64, name):
    _check_defaults(name, vmapped=True, dtype=jnp.float64)


@pytest.mark.parametrize("name", JVP)
@pytest.mark.parametrize("method", [*METHODS, "sequential"])
def test_every_method_reads_custom_jvp_rules(name, method):
    _check_defaults(name, vmapped=False, dtype=jnp.float32, method=method)


@pytest.mark.parametrize("name", ["spike", "half_tanh"])
def test_the_fused_backward_reads_the_rules_under_vmap_in_float64(x64, name):
    _check_defaults(name, vmapped=True, dtype=jnp.float64, method="fused-sequential")


@pytest.mark.parametrize("name", VJP)
@pytest.mark.parametrize("method", METHODS)
def test_an_explicit_jacobian_method_refuses_an_opaque_custom_vjp(name, method):
    loss = _loss(CELLS[name][0], method=method)
    with pytest.raises(ValueError, match=r"jax\.custom_vjp function identity at ") as raised:
        bppsa.grad(loss)(_weights(), _xs())
    assert "linear_vjp=True" in str(raised.value)
    assert "bppsa.Sequential()" in str(raised.value)


def test_a_forward_only_scan_with_an_explicit_method_runs():
    cell = CELLS["clip_gradient"][0]
    got = _loss(cell, method="blelloch")(_weights(), _xs())
    np.testing.assert_allclose(got, _loss(cell, jax.lax.scan)(_weights(), _xs()), rtol=1e-6)


def test_auto_back_propagates_an_opaque_custom_vjp_and_says_why():
    with bppsa.trace_plans() as plans:
        bppsa.grad(_loss(CELLS["clip_gradient"][0]))(_weights(), _xs())
    assert plans[0].method == bppsa.Sequential()
    assert "jax.custom_vjp function identity at" in plans[0].forward_because


@pytest.mark.parametrize("name", LINEAR)
@pytest.mark.parametrize("method", [*METHODS, "auto"])
def test_linear_vjp_lets_every_method_run_a_linear_rule(name, method):
    cell = CELLS[name][0]
    params, xs = _weights(), _xs()
    got = bppsa.grad(_loss(cell, method=method), linear_vjp=True)(params, xs)
    _assert_close(got, jax.grad(_loss(cell, jax.lax.scan))(params, xs))


def test_a_scan_s_own_linear_vjp_wins_over_grad_s():
    loss = _loss(CELLS["negated_half"][0], method="blelloch", linear_vjp=False)
    with pytest.raises(ValueError, match="linear_vjp=True"):
        bppsa.grad(loss, linear_vjp=True)(_weights(), _xs())


@pytest.mark.parametrize("value", ["yes", 1])
def test_linear_vjp_must_be_a_bool(value):
    with pytest.raises(TypeError, match="linear_vjp must be a bool"):
        bppsa.grad(lambda a: a, linear_vjp=value)


def _structure(cell):
    params = _weights()
    return carry_structure(lambda h, x: cell(params, h, x), jnp.zeros(H), jnp.zeros(H))


def test_the_structure_analysis_reads_a_rule_not_its_primal():
    # the primal v > 0 has no derivative: read by it, spike(W h + x) would look diagonal
    assert _structure(CELLS["spike"][0]).kind == "dense"
    assert _structure(CELLS["diagonal_spike"][0]).kind == "diagonal"

    @jax.custom_jvp
    def mixing(v):  # an elementwise primal whose rule mixes neighbours
        return jnp.tanh(v)

    mixing.defjvp(lambda p, t: (jnp.tanh(p[0]), t[0] + 0.1 * jnp.roll(t[0], 1)))
    found = _structure(lambda p, h, x: mixing(p["d"] * h + x))
    assert found.kind == "dense" and "units are coupled" in found.reason


def test_an_opaque_custom_vjp_reads_as_dense_with_its_name():
    found = _structure(CELLS["negated_half"][0])
    assert found.kind == "dense"
    assert "jax.custom_vjp function identity at" in found.reason


def test_jax_s_own_rules_keep_their_structure():
    # jax.nn.relu and jnp.logaddexp are custom_jvp functions with elementwise rules
    cell = lambda p, h, x: jax.nn.relu(p["d"] * h + x) + jnp.logaddexp(h, x)
    assert _structure(cell).kind == "diagonal"


def test_quasi_newton_s_diagonal_keeps_a_rule():
    """The element-aligned paths keep a custom_jvp call with its rule: the diagonal of the
    derivative is the rule's."""
    d = _weights()["d"]

    def cell(h):
        return half_tanh(d * h + 0.3)

    h = jnp.linspace(-1.0, 1.0, H)
    got = jax.jacfwd(diagonal_paths.diagonal(cell))(h)
    np.testing.assert_allclose(jnp.diagonal(got), jnp.diagonal(jax.jacfwd(cell)(h)), rtol=1e-6)
    np.testing.assert_allclose(jnp.diagonal(got), 0.5 * d * (1 - cell(h) ** 2), rtol=1e-6)
