"""bppsa.scan as a drop-in for lax.scan: pytrees, reverse, jit, vmap, integer leaves, higher
order and the grad API, each compared with jax.grad through jax.lax.scan."""

import functools

import jax
import jax.numpy as jnp
import pytest

import bppsa
from bppsa.models import rnn_cell
from tests.helpers import assert_trees_close

H, I, T = 6, 3, 11
METHOD = "blelloch"  # the parallel scan: the path with the most to get wrong


@pytest.fixture
def problem(dtype):
    k1, k2, k3 = jax.random.split(jax.random.key(7), 3)
    params = {
        "w": jax.random.normal(k1, (H, H), dtype) / jnp.sqrt(H),
        "u": jax.random.normal(k2, (H, I), dtype),
    }
    xs = jax.random.normal(k3, (T, I), dtype)
    return params, xs, dtype


def both(loss, *args, argnums=0, method=METHOD):
    """Gradients through bppsa.scan (Blelloch) and through lax.scan (jitted: eager dispatch of
    every small operation of the backward pass would dominate the test time)."""
    grad = bppsa.grad(functools.partial(loss, bppsa.scan), argnums=argnums, method=method)
    actual = jax.jit(grad)(*args)
    expected = jax.jit(jax.grad(functools.partial(loss, jax.lax.scan), argnums=argnums))(*args)
    return actual, expected


@pytest.mark.parametrize("method", [METHOD, bppsa.Blocked(bppsa.Chunked(2), 4)], ids=str)
def test_pytree_carry_and_outputs(problem, method):
    params, xs, dtype = problem

    def loss(scan, params, xs):
        def body(carry, x):
            h = jnp.tanh(params["w"] @ carry["h"] + params["u"] @ x)
            m = 0.5 * carry["m"] + h[:2]
            return {"h": h, "m": m}, {"sum": h.sum(), "pair": (m, h[0])}

        init = {"h": jnp.zeros(H, dtype), "m": jnp.ones(2, dtype)}
        carry, ys = scan(body, init, xs)
        return carry["m"].sum() + ys["sum"].sum() + (ys["pair"][0] ** 2).sum()

    assert_trees_close(*both(loss, params, xs, method=method), dtype)


@pytest.mark.parametrize("reverse", [False, True])
def test_reverse_and_gradients_of_init_and_xs(problem, reverse):
    params, xs, dtype = problem

    def loss(scan, h0, xs):
        body = lambda h, x: (jnp.tanh(params["w"] @ h + params["u"] @ x), h * x[0])
        carry, ys = scan(body, h0, xs, reverse=reverse)
        return (carry**2).sum() + (ys**2).sum()

    h0 = jnp.linspace(-1, 1, H, dtype=dtype)
    assert_trees_close(*both(loss, h0, xs, argnums=(0, 1)), dtype)
    primal = bppsa.scan(lambda h, x: (h + x[0], h), h0, xs, reverse=reverse)
    expected = jax.lax.scan(lambda h, x: (h + x[0], h), h0, xs, reverse=reverse)
    assert_trees_close(primal, expected, dtype)


def test_integer_step_counter_and_xs_none(problem):
    params, _, dtype = problem

    def loss(scan, params):
        def body(carry, _):
            h, step = carry
            h = jnp.tanh(params["w"] @ h + 0.1 * step)
            return (h, step + 1), (h[0], step)

        (h, steps), (ys, counts) = scan(body, (jnp.ones(H, dtype), jnp.int32(0)), None, length=T)
        assert steps.dtype == jnp.int32 and counts.shape == (T,)
        return h.sum() + ys.sum()

    assert_trees_close(*both(loss, params), dtype)


@pytest.mark.parametrize("method", [METHOD, bppsa.Blocked(bppsa.Chunked(2), 4)], ids=str)
def test_carry_without_float_leaves(problem, method):
    params, xs, dtype = problem

    def loss(scan, params, xs):
        body = lambda k, x: (k + 1, jnp.sum(params["u"] @ x) * k)
        _, ys = scan(body, jnp.int32(0), xs)
        return (ys**2).sum()

    assert_trees_close(*both(loss, params, xs, argnums=(0, 1), method=method), dtype)


@pytest.mark.parametrize("method", [METHOD, bppsa.Blocked(bppsa.Chunked(2), 4)], ids=str)
def test_integer_and_boolean_xs_get_no_gradient(problem, method):
    params, xs, dtype = problem
    mask = jnp.arange(T) % 2 == 0
    index = jnp.arange(T, dtype=jnp.int32)

    def loss(scan, params, xs):
        def body(h, x):
            x_t, keep, i = x
            new = jnp.tanh(params["w"] @ h + params["u"] @ x_t + 0.01 * i)
            return jnp.where(keep, new, h), None

        h, _ = scan(body, jnp.zeros(H, dtype), (xs, mask, index))
        return (h**2).sum()

    assert_trees_close(*both(loss, params, xs, argnums=(0, 1), method=method), dtype)
    grads = jax.grad(lambda p, x: loss(bppsa.scan, p, x[0]), argnums=1, allow_int=True)(
        params, (xs, mask, index)
    )
    assert grads[1].dtype == jax.dtypes.float0 and grads[2].dtype == jax.dtypes.float0


def test_under_jit_and_vmap(problem):
    """The intended batching: vmap a scan over one example, jit the gradient."""
    params, xs, dtype = problem
    batch = jnp.stack([xs, 2 * xs, -xs])

    def loss(scan, params, batch):
        def one(xs):
            h, _ = scan(lambda h, x: (rnn_cell_like(params, h, x), None), jnp.zeros(H, dtype), xs)
            return h.sum()

        return jax.vmap(one)(batch).sum()

    actual = jax.jit(bppsa.grad(functools.partial(loss, bppsa.scan)))(params, batch)
    expected = jax.grad(functools.partial(loss, jax.lax.scan))(params, batch)
    assert_trees_close(actual, expected, dtype)
    # vmap outside the gradient (per-example gradients) works too.
    per_example = jax.jit(jax.vmap(bppsa.grad(functools.partial(loss, bppsa.scan)), (None, 0)))(
        params, batch[:, None]
    )
    per_example_ref = jax.vmap(jax.grad(functools.partial(loss, jax.lax.scan)), (None, 0))(
        params, batch[:, None]
    )
    assert_trees_close(per_example, per_example_ref, dtype)


def rnn_cell_like(params, h, x):
    return jnp.tanh(params["w"] @ h + params["u"] @ x)


def test_closed_over_parameters_and_explicit_arguments_agree(problem):
    params, xs, dtype = problem

    def closed(scan, params, xs):
        h, _ = scan(lambda h, x: (rnn_cell_like(params, h, x), None), jnp.zeros(H, dtype), xs)
        return h.sum()

    def explicit(scan, params, xs):
        body = lambda c, x: ((c[0], rnn_cell_like(c[0], c[1], x)), None)
        (_, h), _ = scan(body, (params, jnp.zeros(H, dtype)), xs)
        return h.sum()

    a, _ = both(closed, params, xs)
    b, b_ref = both(explicit, params, xs)
    assert_trees_close(b, b_ref, dtype)
    assert_trees_close(a, b, dtype)


def test_cell_that_calls_grad(problem):
    params, xs, dtype = problem

    def loss(scan, params, xs):
        def energy(h):
            return jnp.sum(jnp.cos(params["w"] @ h))

        def body(h, x):
            return h - 0.1 * jax.grad(energy)(h) + 0.1 * params["u"] @ x, None

        h, _ = scan(body, jnp.ones(H, dtype), xs)
        return (h**2).sum()

    assert_trees_close(*both(loss, params, xs), dtype)


def test_grad_of_grad(problem):
    params, xs, dtype = problem

    def loss(scan, params):
        h, ys = scan(lambda h, x: (rnn_cell_like(params, h, x), h.sum()), jnp.ones(H, dtype), xs)
        return (h**2).sum() + ys.sum()

    def second(scan, grad):
        return lambda p: jnp.sum(grad(functools.partial(loss, scan))(p)["w"] ** 2)

    blelloch_grad = functools.partial(bppsa.grad, method=METHOD)
    actual = jax.jit(jax.grad(second(bppsa.scan, blelloch_grad)))(params)
    expected = jax.jit(jax.grad(second(jax.lax.scan, jax.grad)))(params)
    assert_trees_close(actual, expected, dtype)
    hess = jax.jit(jax.hessian(lambda w: loss(bppsa.scan, {**params, "w": w})))(params["w"])
    hess_ref = jax.jit(jax.hessian(lambda w: loss(jax.lax.scan, {**params, "w": w})))(params["w"])
    assert_trees_close(hess, hess_ref, dtype)


def test_forward_mode_and_forward_over_reverse(problem):
    params, xs, _ = problem

    def loss(w, method=None):
        body = lambda h, x: (jnp.tanh(w @ h + x[0]), None)
        return bppsa.scan(body, jnp.ones(H, w.dtype), xs, method=method)[0].sum()

    def loss_ref(w):
        body = lambda h, x: (jnp.tanh(w @ h + x[0]), None)
        return jax.lax.scan(body, jnp.ones(H, w.dtype), xs)[0].sum()

    w, dw = params["w"], jnp.ones_like(params["w"])
    for method in ("blelloch", "sequential"):
        tangent = jax.jvp(functools.partial(loss, method=method), (w,), (dw,))
        assert_trees_close(tangent, jax.jvp(loss_ref, (w,), (dw,)), w.dtype)
    batched = jax.vmap(lambda w: jax.jvp(loss, (w,), (dw,)))(jnp.stack([w, 2 * w]))
    batched_ref = jax.vmap(lambda w: jax.jvp(loss_ref, (w,), (dw,)))(jnp.stack([w, 2 * w]))
    assert_trees_close(batched, batched_ref, w.dtype)

    # Forward over reverse works: the JVP differentiates the backward pass, itself plain JAX.
    def loss_xs(w, xs):
        body = lambda h, x: (jnp.tanh(w @ h + x[0]), None)
        return bppsa.scan(body, jnp.ones(H, w.dtype), xs)[0].sum()

    def loss_xs_ref(w, xs):
        body = lambda h, x: (jnp.tanh(w @ h + x[0]), None)
        return jax.lax.scan(body, jnp.ones(H, w.dtype), xs)[0].sum()

    fwd_rev = jax.jvp(lambda w: jax.grad(loss_xs, 1)(w, xs), (w,), (dw,))
    fwd_rev_ref = jax.jvp(lambda w: jax.grad(loss_xs_ref, 1)(w, xs), (w,), (dw,))
    assert_trees_close(fwd_rev, fwd_rev_ref, w.dtype)


def test_grad_api_matches_jax(problem):
    params, xs, dtype = problem

    def loss(params, xs, scale):
        h, _ = bppsa.scan(lambda h, x: (rnn_cell_like(params, h, x), None), jnp.zeros(H, dtype), xs)
        return scale * (h**2).sum(), h

    def loss_ref(params, xs, scale):
        h, _ = jax.lax.scan(
            lambda h, x: (rnn_cell_like(params, h, x), None), jnp.zeros(H, dtype), xs
        )
        return scale * (h**2).sum(), h

    for method in ("auto", "blelloch", bppsa.Chunked(3), "sequential"):
        (value, aux), grads = bppsa.value_and_grad(loss, (0, 1), has_aux=True, method=method)(
            params, xs, 2.0
        )
        (value_ref, aux_ref), grads_ref = jax.value_and_grad(loss_ref, (0, 1), has_aux=True)(
            params, xs, 2.0
        )
        assert_trees_close((value, aux, grads), (value_ref, aux_ref, grads_ref), dtype)
        g, aux = bppsa.grad(loss, has_aux=True, method=method)(params, xs, 2.0)
        assert_trees_close((g, aux), (grads_ref[0], aux_ref), dtype)


def test_scan_method_argument_beats_the_grad_method(monkeypatch, problem):
    params, xs, dtype = problem
    used = []
    original = bppsa.Blelloch.scan
    monkeypatch.setattr(
        bppsa.Blelloch, "scan", lambda self, *a: used.append(1) or original(self, *a)
    )

    def loss(params, method=None):
        body = lambda h, x: (rnn_cell_like(params, h, x), None)
        return bppsa.scan(body, jnp.zeros(H, dtype), xs, method=method)[0].sum()

    bppsa.grad(loss, method="sequential")(params)
    assert used == []
    bppsa.grad(functools.partial(loss, method="blelloch"), method="sequential")(params)
    assert used == [1]
    bppsa.grad(loss, method="blelloch")(params)
    assert used == [1, 1]
    with bppsa.trace_plans() as plans:
        bppsa.grad(loss)(params)  # the default: what Auto() picks for this scan and backend
    assert plans[0].requested == bppsa.Auto()
    assert used == [1, 1] + [1] * (plans[0].method == bppsa.Blelloch())


def test_zero_length_and_plain_forward(problem):
    params, xs, dtype = problem

    def loss(scan, h0):
        h, ys = scan(lambda h, x: (jnp.tanh(params["w"] @ h + x[0]), h), h0, xs[:0])
        return (h**2).sum() + ys.sum()

    h0 = jnp.ones(H, dtype)
    assert_trees_close(*both(loss, h0), dtype)
    zeros = jnp.zeros(H, dtype)
    cell_params = dict(weight_ih=params["u"], weight_hh=params["w"], bias_ih=zeros, bias_hh=zeros)
    body = lambda h, x: (rnn_cell(cell_params, h, x), h)
    assert_trees_close(bppsa.scan(body, h0, xs), jax.lax.scan(body, h0, xs), dtype)
