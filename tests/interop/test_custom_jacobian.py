"""Your own cell with an analytic transposed Jacobian (``bppsa.jacobians.transposed_jacobian``):
the scan takes the analytic path, its gradients are those of ``jax.grad`` through
``jax.lax.scan``, an equinox module's ``__call__`` can be the cell (decorated, or wrapped in a
function of ``(module, h, x)``), and a builder of the wrong shape is a clear error."""

import inspect
import textwrap
from collections.abc import Callable

import jax
import jax.numpy as jnp
import pytest

import bppsa
from bppsa.jacobians import gru_jacobian_t, transposed_jacobian
from bppsa.scan import Dense, Structured
from tests.helpers import assert_path, assert_trees_close

H, I, B = 4, 2, 2
LEAK = 0.3


def leaky_jacobian_t(params, h, x):
    """``h' = (1 - a) h + a tanh(z)``: ``J = (1 - a) I + diag(a (1 - tanh(z)^2)) W``, so
    ``J^T = W^T diag(a (1 - tanh(z)^2)) + diag(1 - a)``."""
    z = jnp.tanh(params["w"] @ h + params["u"] @ x + params["b"])
    return Structured(u=params["w"].T, d=LEAK * (1 - z**2), e=jnp.full_like(h, 1 - LEAK))


def leaky_step(params, h, x):
    return (1 - LEAK) * h + LEAK * jnp.tanh(params["w"] @ h + params["u"] @ x + params["b"])


leaky = transposed_jacobian(leaky_jacobian_t)(leaky_step)


def problem(length, seed=0):
    k = jax.random.split(jax.random.key(seed), 5)
    params = {
        "w": jax.random.normal(k[0], (H, H), jnp.float64) / jnp.sqrt(H),
        "u": jax.random.normal(k[1], (H, I), jnp.float64),
        "b": jax.random.normal(k[2], (H,), jnp.float64),
    }
    init = 0.5 * jax.random.normal(k[3], (B, H), jnp.float64)
    xs = jax.random.normal(k[4], (B, length, I), jnp.float64)
    return params, init, xs


def loss_fn(scan, cell):
    def loss(params, init, xs):
        def one(h, x):
            h, ys = scan(lambda h, x: (cell(params, h, x), jnp.sin(h).sum()), h, x)
            return (h**2).sum() + ys.sum()

        return jax.vmap(one)(init, xs).sum()

    return loss


def both(cell, method, params, init, xs):
    """Gradients (params and init) through bppsa.scan and through jax.lax.scan, and the plans."""
    with bppsa.trace_plans() as plans:
        grad = bppsa.grad(loss_fn(bppsa.scan, cell), argnums=(0, 1), method=method)
        actual = jax.jit(grad)(params, init, xs)
    expected = jax.jit(jax.grad(loss_fn(jax.lax.scan, cell), argnums=(0, 1)))(params, init, xs)
    return actual, expected, plans


def test_the_docstring_example_runs():
    doc = inspect.getdoc(transposed_jacobian)
    code = doc.split("runs this example)::", 1)[1].split("A method can be the cell", 1)[0]
    namespace = {}
    exec(textwrap.dedent(code), namespace)
    assert namespace["plans"][0].jacobians == "analytic"


def test_the_builder_is_the_transposed_jacobian(x64):
    params, init, xs = problem(1)
    h, x = init[0], xs[0, 0]
    dense = leaky_jacobian_t(params, h, x).to_dense().a
    assert_trees_close(dense, jax.jacobian(leaky_step, argnums=1)(params, h, x).T, jnp.float64)


# Each method at one length (not powers of two; 17 > the block of 4).
METHOD_LENGTHS = [
    (bppsa.Blelloch(), 17),
    (bppsa.Chunked(), 5),
    (bppsa.SequentialScan(), 1),
    (bppsa.Blocked(bppsa.Blelloch(), 4), 17),
    (bppsa.Auto(), 5),
]


def test_the_scan_uses_the_analytic_jacobian(x64, subtests):
    args = {n: problem(n) for _, n in METHOD_LENGTHS}
    params, init, xs = args[5]
    assert bppsa.jacobians.has_analytic_jacobian(
        lambda h, x: (leaky(params, h, x), None), init[0], xs[0, 0]
    )

    @jax.jit  # one compilation for all methods: compiling is all the time
    def gradients(args):
        return [
            bppsa.grad(loss_fn(bppsa.scan, leaky), argnums=(0, 1), method=method)(*args[n])
            for method, n in METHOD_LENGTHS
        ]

    @jax.jit
    def references(args):
        grad = jax.grad(loss_fn(jax.lax.scan, leaky), argnums=(0, 1))
        return {n: grad(*problem_args) for n, problem_args in args.items()}

    with bppsa.trace_plans() as plans:
        actual = gradients(args)
    expected = references(args)
    assert len(plans) == len(METHOD_LENGTHS)
    for (method, n), grads, plan in zip(METHOD_LENGTHS, actual, plans):
        with subtests.test(method=str(method), length=n):
            assert plan.jacobians == "analytic"
            if method != bppsa.Auto():
                assert_path([plan], method, jacobians="analytic")
            assert_trees_close(grads, expected[n], jnp.float64)


def leaky_module_jacobian_t(cell, h, x):
    z = jnp.tanh(cell.w @ h + cell.u @ x + cell.b)
    return Structured(u=cell.w.T, d=cell.leak * (1 - z**2), e=jnp.full_like(h, 1 - cell.leak))


def leaky_module(params):
    """The leaky cell as an equinox module whose ``__call__`` is decorated (``self`` is the
    builder's ``params``); its activation is a non-array leaf."""
    eqx = pytest.importorskip("equinox")

    class Leaky(eqx.Module):
        w: jax.Array
        u: jax.Array
        b: jax.Array
        leak: float = eqx.field(static=True)
        activation: Callable = jnp.tanh

        @transposed_jacobian(leaky_module_jacobian_t)
        def __call__(self, h, x):
            z = self.activation(self.w @ h + self.u @ x + self.b)
            return (1 - self.leak) * h + self.leak * z

    return Leaky(params["w"], params["u"], params["b"], LEAK)


def test_an_equinox_module_call_can_be_the_cell(x64):
    eqx = pytest.importorskip("equinox")
    params, init, xs = problem(17)
    dynamic, static = eqx.partition(leaky_module(params), eqx.is_inexact_array)
    cell = lambda dynamic, h, x: eqx.combine(dynamic, static)(h, x)
    actual, expected, plans = both(cell, bppsa.Blelloch(), dynamic, init, xs)
    assert_path(plans, bppsa.Blelloch(), jacobians="analytic")
    assert_trees_close(actual, expected, jnp.float64)


def pytorch_layout(cell):
    """An ``eqx.nn.GRUCell``'s parameters in ``bppsa.models.gru_cell``'s layout (the same gate
    order r, z, n and update ``h' = (1 - z) n + z h``; equinox adds ``bias_n`` inside ``r *``)."""
    zeros = jnp.zeros(2 * cell.hidden_size, cell.bias_n.dtype)
    return {
        "weight_ih": cell.weight_ih,
        "weight_hh": cell.weight_hh,
        "bias_ih": cell.bias,
        "bias_hh": jnp.concatenate([zeros, cell.bias_n]),
    }


@transposed_jacobian(lambda cell, h, x: gru_jacobian_t(pytorch_layout(cell), h, x))
def equinox_gru(cell, h, x):
    """``eqx.nn.GRUCell`` takes ``(x, h)``: wrapped in a function of ``(cell, h, x)``."""
    return cell(x, h)


def test_an_equinox_gru_wrapped_with_the_gru_jacobian(x64):
    eqx = pytest.importorskip("equinox")
    _, init, xs = problem(17)
    gru = eqx.nn.GRUCell(I, H, dtype=jnp.float64, key=jax.random.key(3))
    dynamic, static = eqx.partition(gru, eqx.is_inexact_array)
    cell = lambda dynamic, h, x: equinox_gru(eqx.combine(dynamic, static), h, x)
    actual, expected, plans = both(cell, bppsa.Chunked(), dynamic, init, xs)
    assert_path(plans, bppsa.Chunked(), jacobians="analytic")
    assert_trees_close(actual, expected, jnp.float64)


def wrong(builder):
    return transposed_jacobian(builder)(leaky_step)


def tanh_slope(params, h, x):
    return 1 - jnp.tanh(params["w"] @ h + params["u"] @ x + params["b"]) ** 2


WRONG_BUILDERS = {
    "scalar e": (
        lambda p, h, x: Structured(u=p["w"].T, d=tanh_slope(p, h, x), e=jnp.asarray(0.7)),
        ValueError,
        r"Structured with reps=1 of the wrong shape for a state of 4 floats .*e: \(\) "
        r"\(expected \(4,\)\)",
    ),
    "u for reps=2": (
        lambda p, h, x: Structured(u=jnp.concatenate([p["w"].T] * 2, 1), d=tanh_slope(p, h, x)),
        ValueError,
        r"u: \(4, 8\) \(expected \(4, 4\)\)",
    ),
    "stacked over time": (
        lambda p, h, x: Dense(jnp.stack([p["w"].T] * 3)),
        ValueError,
        r"Dense of the wrong shape .*a: \(3, 4, 4\) \(expected \(4, 4\)\).*ONE step's J\^T",
    ),
    "a bare matrix": (
        lambda p, h, x: p["w"].T,
        TypeError,
        r"must return an element of bppsa.scan \(Dense, Structured\), got an array of shape "
        r"\(4, 4\); wrap a matrix a = J\^T as bppsa.scan.Dense\(a\)",
    ),
}


@pytest.mark.parametrize("case", WRONG_BUILDERS)
def test_a_builder_of_the_wrong_shape_is_a_clear_error(x64, case):
    builder, error, message = WRONG_BUILDERS[case]
    params, init, xs = problem(5)
    with pytest.raises(error, match=message):
        bppsa.grad(loss_fn(bppsa.scan, wrong(builder)), method="blelloch")(params, init, xs)
