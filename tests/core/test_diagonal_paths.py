"""Quasi-Newton on dense cells: the diagonals of the Jacobians from the element-aligned paths."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import bppsa
from bppsa.models import GRU, LSTM
from bppsa.scan._core import problem as problem_module
from bppsa.scan._core.diagonal_paths import diagonal
from bppsa.scan._core.problem import prepare
from bppsa.scan._core.structure import coloured_jacobian_t
from tests.helpers import assert_trees_close, compiled_flops

H, I = 6, 3


def _cells(h=H):
    """Autodiff cells (no analytic Jacobian), as a user writes them, with dense Jacobians."""
    key = jax.random.key(0)
    g = GRU().init(I, h, key=key, dtype=jnp.float64)  # gates stacked: (3h, h)
    m = LSTM().init(I, h, key=key, dtype=jnp.float64)  # (4h, h)
    w = jax.random.normal(jax.random.key(5), (3, h, h), jnp.float64) / np.sqrt(h)

    def elman_rows(c, x):  # the row-vector convention (flax): h @ W
        return jnp.tanh(c @ w[0] + x.sum()), c

    def gru(c, x):
        gi, gh = g["weight_ih"] @ x + g["bias_ih"], g["weight_hh"] @ c + g["bias_hh"]
        r = jax.nn.sigmoid(gi[:h] + gh[:h])
        z = jax.nn.sigmoid(gi[h : 2 * h] + gh[h : 2 * h])
        n = jnp.tanh(gi[2 * h :] + r * gh[2 * h :])
        return (1 - z) * n + z * c, c

    def gru_square(c, x):  # one square weight per gate
        r, z = jax.nn.sigmoid(w[0] @ c + x[0]), jax.nn.sigmoid(w[1] @ c + x[1])
        n = jnp.tanh(r * (w[2] @ c) + x[2])
        return (1 - z) * n + z * c, c

    def lstm(carry, x):
        c, cell = carry
        gates = m["weight_ih"] @ x + m["bias_ih"] + m["weight_hh"] @ c + m["bias_hh"]
        i, f, gg, o = jnp.split(gates, 4)
        cell = jax.nn.sigmoid(f) * cell + jax.nn.sigmoid(i) * jnp.tanh(gg)
        return (jax.nn.sigmoid(o) * jnp.tanh(cell), cell), c

    def two_layers(c, x):  # two products in a row: the aligned diagonal is an approximation
        return 0.5 * c + 0.5 * jnp.tanh(w[1] @ jnp.tanh(w[0] @ c) + x.sum()), c

    def rolled_carry(c, x):  # every element moves, in one cycle: no cheap diagonal
        return jnp.roll(jnp.tanh(w[0] @ c + x.sum()), 1) * 0.9, c

    zeros = jnp.zeros(h, jnp.float64)
    return {
        "elman_rows": (elman_rows, zeros),
        "gru": (gru, zeros),
        "gru_square": (gru_square, zeros),
        "lstm": (lstm, (zeros, zeros + 0.1)),
        "two_layers": (two_layers, zeros),
        "rolled_carry": (rolled_carry, zeros),
    }


EXACT = ["elman_rows", "gru", "gru_square", "lstm"]


def _xs(length, seed=1):
    return jax.random.normal(jax.random.key(seed), (length, I), jnp.float64)


def _problem(name, length=7):
    body, init = _cells()[name]
    return prepare(body, init, _xs(length), None, reverse=False, batch=None)[0]


def _diagonals(name):
    """(the aligned paths' diagonal, the true diagonal) of one step at a random point."""
    problem = _problem(name)
    body, init = _cells()[name]
    layout = problem.layout
    x = _xs(1)[0]
    point = jax.random.normal(jax.random.key(2), (layout.pack(init).shape[0],), jnp.float64)

    def carry_map(v):
        return layout.pack(body(layout.unpack_into(v, init), x)[0])

    cheap = coloured_jacobian_t(diagonal(carry_map), point, problem.quasi_structure)
    return cheap.diagonal().d, jnp.diagonal(jax.jacfwd(carry_map)(point))


@pytest.mark.parametrize("name", EXACT)
def test_the_aligned_paths_give_the_exact_diagonal_of_the_usual_cells(x64, name):
    problem = _problem(name)
    assert problem.jacobians == "autodiff"  # dense: what quasi-Newton used to form whole
    kind = "block" if name == "lstm" else "diagonal"  # the LSTM's c -> h path pairs elements
    assert problem.quasi_structure.kind == kind
    cheap, exact = _diagonals(name)
    np.testing.assert_allclose(cheap, exact, rtol=1e-12, atol=1e-15)


def test_elsewhere_an_approximation_or_the_full_jacobian(x64):
    cheap, exact = _diagonals("two_layers")
    assert float(jnp.max(jnp.abs(cheap - exact))) > 1e-3  # the second product's terms dropped
    assert _problem("rolled_carry").quasi_structure is None  # the dense diagonal, as before


def test_the_cut_function_keeps_the_values(x64):
    body, _ = _cells()["lstm"]
    x = _xs(1)[0]
    carry = (jnp.linspace(-1, 1, H), jnp.linspace(0.5, -0.5, H))
    step = lambda c: body(c, x)
    assert jax.tree.all(
        jax.tree.map(jnp.array_equal, diagonal(step)(carry), step(carry))
    )  # same computation, only derivatives cut


def _newton(name, length=150):
    """Quasi-Newton's iterations, and whether the backward took the forward's Jacobians, after
    checking the trajectory and the gradients against lax.scan's."""
    body, init = _cells()[name]
    xs = _xs(length)
    iterations = []
    newton = bppsa.Newton(quasi=True, callback=lambda i: iterations.append(int(i.iterations)))
    scan = functools.partial(bppsa.scan, body, init, forward=newton, method="blelloch")
    actual = jax.jit(scan)(xs)
    assert_trees_close(actual, jax.lax.scan(body, init, xs), jnp.float64)

    def loss(run, xs):
        return sum(jnp.sum(jnp.sin(leaf)) for leaf in jax.tree.leaves(run(xs)))

    with bppsa.trace_plans() as plans:
        grads = jax.jit(jax.grad(functools.partial(loss, scan)))(xs)
    reference = jax.grad(functools.partial(loss, lambda xs: jax.lax.scan(body, init, xs)))(xs)
    assert_trees_close(grads, reference, jnp.float64)
    return iterations[-1], plans[0].forward_jacobians


@pytest.mark.parametrize("name", ["gru", "lstm", "two_layers"])
def test_quasi_newton_on_dense_cells_is_certified_and_exact(x64, monkeypatch, name):
    iterations, shared = _newton(name)
    assert shared is False  # the iterations formed only the diagonals: the backward forms all
    if name != "two_layers":  # the same diagonals as the full Jacobians': the same iterates
        monkeypatch.setattr(problem_module.Problem, "quasi_structure", property(lambda p: None))
        assert _newton(name) == (iterations, True)


def test_an_iteration_costs_far_less_than_forming_dense_jacobians(x64, monkeypatch):
    # XLA's count of the compiled forward (its loop body counted once): the GRU at H = 32
    # forms no (H, H) Jacobians, only diagonals.
    body, init = _cells(32)["gru"]
    xs = _xs(64)
    newton = bppsa.Newton(quasi=True)
    run = lambda xs: bppsa.scan(body, init, xs, forward=newton)
    cheap = compiled_flops(lambda xs: run(xs), xs)
    monkeypatch.setattr(problem_module.Problem, "quasi_structure", property(lambda p: None))
    assert 10 * cheap < compiled_flops(lambda xs: run(xs), xs)
