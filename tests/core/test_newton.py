"""bppsa.Newton: the certified parallel-in-time forward, against lax.scan."""

import functools
import typing

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import bppsa
from bppsa.models import GRU, LSTM, RNN, gru_cell, lstm_cell, rnn_cell
from bppsa.scan._core.memory import Footprint
from bppsa.scan._core.problem import prepare
from bppsa.scan._core.profiles import profile_of
from bppsa.scan._profile import CPU, GPU
from tests.helpers import NEWTON_RTOL, assert_trees_close, spread

H, I = 5, 2


def _cells(dtype):
    key = jax.random.key(3)
    rnn, gru, lstm = (c().init(I, H, key=key, dtype=dtype) for c in (RNN, GRU, LSTM))
    w = jax.random.normal(key, (H, H), dtype) / np.sqrt(H)

    def autodiff(carry, x):  # a pytree carry and a cell without an analytic Jacobian
        h = jnp.tanh(w @ carry["h"] + x.sum() + 0.3 * carry["m"].sum())
        return {"h": h, "m": 0.5 * carry["m"] + h[:2]}, h[0] * carry["m"][1]

    zeros = jnp.zeros(H, dtype)
    return {
        "rnn": (lambda h, x: (rnn_cell(rnn, h, x), h.sum()), zeros),
        "gru": (lambda h, x: (gru_cell(gru, h, x), h), zeros),
        "lstm": (lambda c, x: (lstm_cell(lstm, c, x), c[1]), (zeros, zeros + 0.1)),
        "autodiff": (autodiff, {"h": zeros, "m": jnp.ones(2, dtype)}),
    }


def _xs(length, dtype, seed=1):
    return jax.random.normal(jax.random.key(seed), (length, I), dtype)


def _info_recorder():
    infos = []

    def record(info):
        infos.append({k: np.asarray(v).item() for k, v in info._asdict().items()})

    return infos, record


@pytest.mark.parametrize("cell,length", spread(["rnn", "gru", "lstm", "autodiff"], [1, 2, 3, 17]))
def test_newton_forward_equals_lax_scan(dtype, cell, length):
    body, init = _cells(dtype)[cell]
    xs = _xs(length, dtype)
    infos, record = _info_recorder()
    newton = bppsa.Newton(callback=record)
    actual = jax.jit(lambda xs: bppsa.scan(body, init, xs, forward=newton))(xs)
    assert_trees_close(actual, jax.lax.scan(body, init, xs), dtype, NEWTON_RTOL)
    assert infos[-1]["converged"] and infos[-1]["fallback_steps"] == 0


@pytest.mark.parametrize("cell", ["rnn", "gru"])
def test_long_contractive_scans_converge_in_a_few_iterations(x64, cell):
    body, init = _cells(jnp.float64)[cell]
    xs = _xs(1000, jnp.float64)
    infos, record = _info_recorder()
    actual = jax.jit(lambda xs: bppsa.scan(body, init, xs, forward=bppsa.Newton(callback=record)))(
        xs
    )
    assert_trees_close(actual, jax.lax.scan(body, init, xs), jnp.float64)  # 1e-10
    assert infos[-1]["converged"] and infos[-1]["iterations"] <= 8, infos


def test_reverse_vmap_and_the_ambient_forward(dtype):
    body, init = _cells(dtype)["gru"]
    xs = jnp.stack([_xs(9, dtype, seed) for seed in range(3)])

    def run(scan, xs, **kw):
        return jax.vmap(lambda xs: scan(body, init, xs, reverse=True, **kw))(xs)

    expected = run(jax.lax.scan, xs)
    actual = jax.jit(lambda xs: run(bppsa.scan, xs, forward="newton"))(xs)
    assert_trees_close(actual, expected, dtype, NEWTON_RTOL)

    def loss(xs):
        carry, ys = run(bppsa.scan, xs)
        return jnp.sum(carry**2) + jnp.sum(jnp.sin(ys))

    def loss_ref(xs):
        carry, ys = run(jax.lax.scan, xs)
        return jnp.sum(carry**2) + jnp.sum(jnp.sin(ys))

    with bppsa.trace_plans() as plans:
        value, grads = bppsa.value_and_grad(loss, forward="newton", method="blelloch")(xs)
    assert isinstance(plans[0].forward, bppsa.Newton)
    assert_trees_close((value, grads), jax.value_and_grad(loss_ref)(xs), dtype, NEWTON_RTOL)


def test_too_few_iterations_fall_back_to_the_sequential_rest(x64):
    body, init = _cells(jnp.float64)["rnn"]
    xs = _xs(40, jnp.float64)
    infos, record = _info_recorder()
    forward = bppsa.Newton(max_iterations=1, callback=record)
    actual = bppsa.scan(body, init, xs, forward=forward)
    assert_trees_close(actual, jax.lax.scan(body, init, xs), jnp.float64)
    (info,) = infos
    assert info["iterations"] == 1 and not info["converged"]
    assert info["fallback_steps"] == 40 - info["prefix"] > 0


def _residuals(body, init, xs, carries_after):
    """Every step's |h_t - f(h_{t-1}, x_t)| relative to |f| + the mean |f| over the steps."""
    before = jax.tree.map(lambda h0, h: jnp.concatenate([h0[None], h[:-1]]), init, carries_after)
    f = jax.vmap(lambda c, x: body(c, x)[0])(before, xs)
    return jax.tree.map(
        lambda h, f: jnp.abs(h - f) / (jnp.abs(f) + jnp.mean(jnp.abs(f), axis=0)),
        carries_after,
        f,
    )


def test_expansive_cells_end_certified_without_nan(dtype):
    w = 6.0 * jax.random.normal(jax.random.key(0), (H, H), dtype) / H**0.5  # chaotic
    body = lambda h, x: (jnp.tanh(w @ h + x.sum()), h)
    xs = _xs(300, dtype)
    infos, record = _info_recorder()
    _, hs = bppsa.scan(body, jnp.ones(H, dtype), xs, forward=bppsa.Newton(callback=record))
    ratio = _residuals(body, jnp.ones(H, dtype), xs[:-1], hs[1:])  # ys[t] = h_t: h_1..h_{T-1}
    assert bool(jnp.all(jnp.isfinite(hs)))
    assert float(jnp.max(ratio)) <= bppsa.Newton().tolerance(dtype)
    assert not infos[-1]["converged"] and infos[-1]["fallback_steps"] > 0


def test_nan_inputs_give_nan_where_lax_scan_does(dtype):
    body, init = _cells(dtype)["rnn"]
    xs = _xs(30, dtype).at[11, 0].set(jnp.nan)
    carry, ys = bppsa.scan(body, init, xs, forward="newton")
    carry_ref, ys_ref = jax.lax.scan(body, init, xs)
    np.testing.assert_array_equal(np.isnan(ys), np.isnan(ys_ref))
    np.testing.assert_array_equal(np.isnan(carry), np.isnan(carry_ref))
    finite = ~np.isnan(np.asarray(ys_ref))
    np.testing.assert_allclose(
        np.asarray(ys)[finite], np.asarray(ys_ref)[finite], rtol=NEWTON_RTOL[jnp.dtype(dtype)]
    )


METHODS = [
    "auto",
    "blelloch",
    "sequential",
    bppsa.SequentialScan(),
    bppsa.Chunked(3),
    bppsa.Blocked(bppsa.Blelloch(), 4),
]


@pytest.mark.parametrize("method,quasi", spread(METHODS, [False, True]))
def test_gradients_of_newton_forward_scans_equal_jax_grad(x64, method, quasi):
    cells = _cells(jnp.float64)
    xs = _xs(23, jnp.float64)

    def loss(scan, xs, **kw):
        total = 0.0
        for name in ("lstm", "autodiff"):
            body, init = cells[name]
            carry, ys = scan(body, init, xs, **kw)
            total += sum(jnp.sum(leaf**2) for leaf in jax.tree.leaves((carry, ys)))
        return total

    forward = bppsa.Newton(quasi=quasi, max_iterations=100)
    actual = jax.jit(
        bppsa.grad(functools.partial(loss, bppsa.scan), method=method, forward=forward)
    )(xs)
    assert_trees_close(actual, jax.grad(functools.partial(loss, jax.lax.scan))(xs), jnp.float64)


class _CountingScan(bppsa.SequentialScan):
    """A sequential scan that records the length of every scan it runs (at trace time)."""

    lengths: typing.ClassVar[list] = []

    def scan(self, g_last, maps, offsets):
        self.lengths.append(len(maps))
        return super().scan(g_last, maps, offsets)


@pytest.mark.parametrize("method", [_CountingScan(), bppsa.Blocked(_CountingScan(), 4)], ids=str)
def test_newton_solves_with_its_own_solver_not_the_backwards_method(x64, method):
    # The forward alone (no derivative, so no backward scans): its Newton iterations solve
    # their linear recurrences over all 13 steps with the solver's scan...
    body, init = _cells(jnp.float64)["gru"]
    xs = _xs(13, jnp.float64)
    _CountingScan.lengths.clear()
    newton = bppsa.Newton(solver=method)
    actual = jax.jit(lambda xs: bppsa.scan(body, init, xs, forward=newton))(xs)
    assert _CountingScan.lengths and set(_CountingScan.lengths) == {13}
    assert_trees_close(actual, jax.lax.scan(body, init, xs), jnp.float64)
    # ... and never with the backward's method (the default solver is Auto()'s pick).
    _CountingScan.lengths.clear()
    run = jax.jit(lambda xs: bppsa.scan(body, init, xs, forward=bppsa.Newton(), method=method))
    assert_trees_close(run(xs), jax.lax.scan(body, init, xs), jnp.float64)
    assert _CountingScan.lengths == []


def test_the_plan_shows_the_solver_a_newton_forward_picked(x64):
    body, init = _cells(jnp.float64)["gru"]
    xs = _xs(13, jnp.float64)
    with bppsa.trace_plans() as plans:
        bppsa.scan(body, init, xs, forward="newton")
        bppsa.scan(body, init, xs, forward=bppsa.Newton(quasi=True, solver="blelloch"))
    fp = prepare(body, init, xs, None, reverse=False, batch=None)[0].footprint
    assert plans[0].forward == bppsa.Newton(
        solver=bppsa.Auto().scan_method(fp, profile=profile_of(), jacobians=True)
    )
    assert plans[1].forward == bppsa.Newton(quasi=True, solver=bppsa.Blelloch())


def test_the_default_solver_is_autos_pick_for_the_device():
    fp = Footprint(length=10_000, state=20, element=20, dense=400, itemsize=4, batch=16, size=20)
    auto = bppsa.Auto()
    for backend in ("cpu", "gpu"):
        pick = auto.scan_method(fp, profile=profile_of(backend), jacobians=True)
        assert bppsa.Newton().solver_for(fp, bppsa.Auto(), profile_of(backend)) == pick
    assert (
        bppsa.Newton().solver_for(fp, bppsa.Auto(), GPU) == bppsa.Blelloch()
    )  # parallel on accelerators
    assert bppsa.Newton(solver="chunked").solver_for(fp, bppsa.Auto(), GPU) == bppsa.Chunked()
    # quasi: the diagonals' footprint (products keep the structure): a structured block on CPU
    quasi = bppsa.Newton(quasi=True).solver_for(fp, bppsa.Auto(), CPU)
    assert quasi == auto.choose(10_000, 20, "cpu", batch=16, element=20, width=1, jacobians=True)
    with pytest.raises(ValueError, match="Newton: solver='fast' is not a known"):
        bppsa.Newton(solver="fast")
    with pytest.raises(TypeError, match="Newton: solver must be"):
        bppsa.Newton(solver=3)


def test_bad_newton_settings_raise_clearly():
    with pytest.raises(ValueError, match="max_iterations must be a positive int"):
        bppsa.Newton(max_iterations=0)
    with pytest.raises(ValueError, match="tol must be positive"):
        bppsa.Newton(tol=-1.0)
    with pytest.raises(TypeError, match="quasi must be a bool"):
        bppsa.Newton(quasi=1)
    with pytest.raises(ValueError, match="forward='bogus' is not a known forward pass"):
        bppsa.scan(lambda h, x: (h, x), 0.0, jnp.ones(3), forward="bogus")
    with pytest.raises(TypeError, match="forward must be None"):
        bppsa.grad(lambda w: w, forward=3)
    counter = lambda c, x: ((c[0] * 0.5 + x, c[1] + 1), None)
    with pytest.raises(TypeError, match=r"integer or boolean leaves.*forward='sequential'"):
        bppsa.scan(counter, (0.0, 0), jnp.ones(3), forward="newton")
