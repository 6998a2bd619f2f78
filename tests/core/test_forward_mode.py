"""Forward mode through every method: jvp, jacfwd, linearize and hessian equal lax.scan's; the
tangents run through the method's own scan and reverse mode through its own backward."""

import functools

import jax
import jax.numpy as jnp
import pytest

import bppsa
from bppsa.models import GRU, gru_cell
from tests.helpers import assert_trees_close, marked_slow

H, I, T = 4, 2, 13
# The body's carry is the GRU's state and one more leaf: its Jacobians come from autodiff.
pytestmark = pytest.mark.filterwarnings("ignore::bppsa.AnalyticJacobianWarning")
METHODS = [
    "auto",
    "blelloch",
    bppsa.SequentialScan(),
    bppsa.Blocked(bppsa.Chunked(2), 4),
    *marked_slow("sequential", bppsa.Chunked(3)),  # lax.scan's own rules; a chunk count
]


@pytest.fixture
def problem(x64):
    key1, key2 = jax.random.split(jax.random.key(5))
    params = GRU().init(I, H, key=key1, dtype=jnp.float64)
    xs = jax.random.normal(key2, (T, I), jnp.float64)
    return params, xs


def loss(scan, params, xs, reverse=False, **kw):
    """A pytree carry (analytic GRU state and an autodiff one), outputs on every step."""

    def body(carry, x):
        h = gru_cell(params, carry["h"], x)
        m = 0.5 * carry["m"] + jnp.tanh(params["weight_hh"][:2, :2] @ carry["m"] + h[:2])
        return {"h": h, "m": m}, (h.sum(), m)

    init = {"h": jnp.zeros(H, jnp.float64), "m": jnp.ones(2, jnp.float64)}
    carry, (s, m) = scan(body, init, xs, reverse=reverse, **kw)
    return jnp.sum(carry["h"] ** 2) + jnp.sum(jnp.sin(s)) + jnp.sum(m * carry["m"])


def pair(fn, method, **kw):
    """``fn`` applied to the loss through bppsa.scan with ``method`` and through lax.scan."""
    return (
        fn(functools.partial(loss, bppsa.scan, method=method, **kw)),
        fn(functools.partial(loss, jax.lax.scan, **kw)),
    )


@pytest.mark.parametrize("method", METHODS, ids=str)
def test_jvp_jacfwd_linearize_hessian_equal_lax_scan(problem, method):
    params, xs = problem
    tangent = jax.tree.map(jnp.ones_like, params)

    def jvp(f):
        return jax.jvp(lambda p: f(p, xs), (params,), (tangent,))

    def jacfwd_xs(f):
        return jax.jacfwd(lambda xs: f(params, xs, reverse=True))(xs)

    def linearize(f):
        _, f_jvp = jax.linearize(lambda xs: f(params, xs), xs)
        return f_jvp(jnp.cos(xs))

    def hessian(f):
        return jax.hessian(lambda xs: f(params, xs))(xs[:5])

    for fn in (jvp, jacfwd_xs, linearize, hessian):
        assert_trees_close(*pair(jax.jit(fn, static_argnums=0), method), jnp.float64)


@pytest.mark.parametrize("method", ["blelloch", bppsa.Chunked(2)], ids=str)
def test_forward_mode_under_vmap_jit_and_of_jitted_functions(problem, method):
    params, xs = problem
    batch = jnp.stack([xs, 2 * xs, -xs])
    fun = jax.jit(functools.partial(loss, bppsa.scan, method=method))
    ref = functools.partial(loss, jax.lax.scan)
    actual = jax.vmap(lambda xs: jax.jvp(lambda xs: fun(params, xs), (xs,), (xs,)))(batch)
    expected = jax.vmap(lambda xs: jax.jvp(lambda xs: ref(params, xs), (xs,), (xs,)))(batch)
    assert_trees_close(actual, expected, jnp.float64)
    # vmap inside jvp: the batched tangent map
    actual = jax.jvp(lambda b: jax.vmap(lambda xs: fun(params, xs))(b), (batch,), (batch,))
    expected = jax.jvp(lambda b: jax.vmap(lambda xs: ref(params, xs))(b), (batch,), (batch,))
    assert_trees_close(actual, expected, jnp.float64)


def test_tangents_use_the_methods_scan_and_gradients_its_backward(problem, monkeypatch):
    params, xs = problem
    scans, backwards = [], []
    original_scan, original_backward = bppsa.Blelloch.scan, bppsa.Blelloch.backward
    monkeypatch.setattr(
        bppsa.Blelloch, "scan", lambda self, *a: scans.append(1) or original_scan(self, *a)
    )
    monkeypatch.setattr(
        bppsa.Blelloch,
        "backward",
        lambda self, *a, **k: backwards.append(1) or original_backward(self, *a, **k),
    )
    f = functools.partial(loss, bppsa.scan, params, method="blelloch")
    jax.jvp(f, (xs,), (xs,))
    assert (len(scans), len(backwards)) == (1, 0)  # forward mode: the scan, no backward
    jax.grad(f)(xs)
    assert (len(scans), len(backwards)) == (2, 1)  # reverse mode: the method's own backward
    g = jax.grad(lambda xs: jax.jvp(f, (xs,), (xs,))[1])(xs)  # reverse over forward
    g_ref = jax.grad(
        lambda xs: jax.jvp(functools.partial(loss, jax.lax.scan, params), (xs,), (xs,))[1]
    )(xs)
    assert_trees_close(g, g_ref, jnp.float64)


@pytest.mark.parametrize("forward", ["sequential", "newton"])
def test_second_order_reverse_mode(problem, forward):
    params, xs = problem

    def gradient_norm(scan, xs, **kw):
        return jnp.sum(jax.grad(lambda p: loss(scan, p, xs, **kw))(params)["weight_hh"] ** 2)

    actual = jax.jit(
        jax.grad(lambda xs: gradient_norm(bppsa.scan, xs, method="blelloch", forward=forward))
    )(xs)
    expected = jax.jit(jax.grad(lambda xs: gradient_norm(jax.lax.scan, xs)))(xs)
    assert_trees_close(actual, expected, jnp.float64)


@pytest.mark.parametrize("method", ["blelloch", "sequential"])
def test_forward_mode_of_newton_forward_scans(problem, method):
    params, xs = problem
    tangent = jax.tree.map(jnp.ones_like, params)
    actual = jax.jvp(
        lambda p: loss(bppsa.scan, p, xs, method=method, forward="newton"), (params,), (tangent,)
    )
    expected = jax.jvp(lambda p: loss(jax.lax.scan, p, xs), (params,), (tangent,))
    assert_trees_close(actual, expected, jnp.float64)
