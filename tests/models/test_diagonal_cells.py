"""Cells with a diagonal recurrence: their analytic J^T is ``jax.jacrev``'s, diagonal or 2x2
block-diagonal over ``(h_i, c_i)``; gradients through ``bppsa.scan`` are ``jax.grad``'s through
``lax.scan`` for every method, on the analytic path and without ever densifying a map; the
initializations stay bounded over 2000 steps."""

import functools
from unittest import mock

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import bppsa
from bppsa.jacobians import cifg_lstm_jacobian_t, diagonal_gru_jacobian_t, indrnn_jacobian_t
from bppsa.models import (
    CIFGLSTM,
    DiagonalGRU,
    IndRNN,
    cifg_lstm_cell,
    diagonal_gru_cell,
    indrnn_cell,
)
from bppsa.scan import BlockDiagonal, Diagonal, block_grouping, resolve
from tests.helpers import assert_trees_close, marked_slow, spread

H, I = 5, 3

CELLS = {
    "diagonal_gru": DiagonalGRU(),
    "cifg_lstm": CIFGLSTM(),
    "indrnn_relu": IndRNN(),
    "indrnn_tanh": IndRNN("tanh"),
}
BUILDERS = {
    "diagonal_gru": (diagonal_gru_cell, diagonal_gru_jacobian_t, {}),
    "cifg_lstm": (cifg_lstm_cell, cifg_lstm_jacobian_t, {}),
    "indrnn_relu": (indrnn_cell, indrnn_jacobian_t, {"nonlinearity": "relu"}),
    "indrnn_tanh": (indrnn_cell, indrnn_jacobian_t, {"nonlinearity": "tanh"}),
}


def init(cell, input_size, hidden_size, key, dtype=jnp.float32):
    """``cell.init`` jitted: eagerly, each of its small random draws compiles on its own."""
    return jax.jit(lambda key: cell.init(input_size, hidden_size, key=key, dtype=dtype))(key)


@functools.partial(jax.jit, static_argnums=(0, 2))
def perturbed_params(cell, key, dtype=jnp.float64):
    """The cell's initialization plus noise, so that no term of J^T is zero by construction
    (e.g. the CIFG LSTM's peepholes start at 0)."""
    k_init, k_noise = jax.random.split(key)
    params = cell.init(I, H, key=k_init, dtype=dtype)
    leaves, treedef = jax.tree.flatten(params)
    noise = jax.random.split(k_noise, len(leaves))
    return treedef.unflatten(
        [a + 0.3 * jax.random.normal(k, a.shape, dtype) for a, k in zip(leaves, noise)]
    )


def random_state(cell, key, batch=(), dtype=jnp.float64):
    leaves, treedef = jax.tree.flatten(cell.initial_state(H, dtype))
    keys = jax.random.split(key, len(leaves))
    return treedef.unflatten(
        [0.5 * jax.random.normal(k, (*batch, *a.shape), dtype) for a, k in zip(leaves, keys)]
    )


def dense_jacobian_t(cell, params, state, x):
    """``jax.jacrev`` of one example's step over the state's leaves packed ``[leaf0, leaf1]``,
    transposed; ``jax.vmap``-ed over any leading batch dims."""
    leaves, treedef = jax.tree.flatten(state)

    def one(leaves, x):
        def packed(v):
            new = cell(params, treedef.unflatten(jnp.split(v, len(leaves))), x)
            return jnp.concatenate(jax.tree.leaves(new))

        return jax.jacrev(packed)(jnp.concatenate(leaves)).T

    for _ in range(x.ndim - 1):
        one = jax.vmap(one)
    return jax.jit(one)(leaves, x)


@pytest.mark.parametrize("name", list(CELLS))
def test_analytic_jacobian_is_jacrev_and_keeps_its_structure(name, x64):
    """On a batch ``(2, 3)`` of states and inputs, and on one example of it."""
    cell = CELLS[name]
    _, builder, options = BUILDERS[name]
    keys = jax.random.split(jax.random.key(1), 3)
    params = perturbed_params(cell, keys[0])
    state = random_state(cell, keys[1], (2, 3))
    x = jax.random.normal(keys[2], (2, 3, I), jnp.float64)
    expected = dense_jacobian_t(cell, params, state, x)  # (2, 3, n, n)
    one = jax.tree.map(lambda a: a[1, 2], state)
    for batch, element, dense in (
        ((2, 3), builder(params, state, x, **options), expected),
        ((), builder(params, one, x[1, 2], **options), expected[1, 2]),
    ):
        if name == "cifg_lstm":
            assert type(element) is BlockDiagonal
            assert element.blocks.shape == (*batch, H, 2, 2)
            assert element.perm == block_grouping((H, H))  # blocks (h_i, c_i) of [h, c]
        else:
            assert type(element) is Diagonal and element.d.shape == (*batch, H)
        np.testing.assert_allclose(element.to_dense().a, dense, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("name", list(CELLS))
def test_the_cell_functions_take_batch_dims_and_the_cells_call_them(name, x64):
    cell = CELLS[name]
    function, _, options = BUILDERS[name]
    keys = jax.random.split(jax.random.key(2), 3)
    params = perturbed_params(cell, keys[0])
    state = random_state(cell, keys[1], (4,))
    x = jax.random.normal(keys[2], (4, I), jnp.float64)
    batched = function(params, state, x, **options)
    one_by_one = jax.vmap(lambda s, x: cell(params, s, x))(state, x)
    assert_trees_close(batched, one_by_one, jnp.float64)
    assert jax.tree.structure(batched) == jax.tree.structure(state)


def test_cifg_lstm_state_is_h_then_c_and_output_is_h(x64):
    cell = CIFGLSTM()
    params = perturbed_params(cell, jax.random.key(3))
    h, c = random_state(cell, jax.random.key(4))
    x = jnp.ones(I, jnp.float64)
    h_new, c_new = cell(params, (h, c), x)
    f_pre = params["weight_ih"][:H] @ x + params["bias"][:H]
    f = jax.nn.sigmoid(f_pre + params["recurrent"][:H] * h + params["peephole"][:H] * c)
    g_pre = params["weight_ih"][H : 2 * H] @ x + params["bias"][H : 2 * H]
    g = jnp.tanh(g_pre + params["recurrent"][H : 2 * H] * h)
    np.testing.assert_allclose(c_new, f * c + (1 - f) * g, rtol=1e-12)
    o_pre = params["weight_ih"][2 * H :] @ x + params["bias"][2 * H :]
    o = jax.nn.sigmoid(o_pre + params["recurrent"][2 * H :] * h + params["peephole"][H:] * c_new)
    np.testing.assert_allclose(h_new, o * jnp.tanh(c_new), rtol=1e-12)
    assert cell.output((h_new, c_new)) is h_new


def test_initializations_and_their_shapes():
    for cell, gates in ((DiagonalGRU(), 3), (CIFGLSTM(), 3), (IndRNN(), 1)):
        params = init(cell, I, 64, jax.random.key(0))
        assert params["weight_ih"].shape == (gates * 64, I)
        assert params["recurrent"].shape == params["bias"].shape == (gates * 64,)
        assert all(a.dtype == jnp.float32 for a in jax.tree.leaves(params))
        again = init(cell, I, 64, jax.random.key(0))
        assert all(map(np.array_equal, jax.tree.leaves(params), jax.tree.leaves(again)))
        u = np.asarray(params["recurrent"])
        if isinstance(cell, IndRNN):
            assert np.all((u >= 0) & (u < 1)) and u.max() > 0.9  # U(0, 1)
        else:
            assert np.all(np.abs(u) <= 0.9) and np.abs(u).max() > 0.2
    gru = init(DiagonalGRU(), I, 64, jax.random.key(0))
    lstm = init(CIFGLSTM(), I, 64, jax.random.key(0))
    np.testing.assert_allclose(gru["bias"][:64], -np.linspace(0, 1, 64), rtol=1e-6)
    assert np.all(lstm["bias"][:64] >= 1)  # the forget gate starts open
    assert lstm["peephole"].shape == (128,) and not np.any(lstm["peephole"])
    with pytest.raises(ValueError, match="nonlinearity must be one of"):
        IndRNN("sigmoid")
    with pytest.raises(ValueError, match="nonlinearity must be one of"):
        indrnn_cell(init(IndRNN(), I, H, jax.random.key(0)), jnp.zeros(H), jnp.zeros(I), "gelu")


@pytest.mark.parametrize("name", list(CELLS))
def test_long_sequences_from_the_initialization_stay_bounded(name):
    """T = 2000 from each cell's initialization on unit-normal inputs (seeded): finite and
    within the bound its docstring states."""
    cell = CELLS[name]
    keys = jax.random.split(jax.random.key(5), 2)
    params = init(cell, I, 32, keys[0])
    xs = jax.random.normal(keys[1], (2000, I))
    state0 = cell.initial_state(32)
    _, states = jax.lax.scan(lambda s, x: (cell(params, s, x),) * 2, state0, xs)
    states = jax.tree.leaves(states)
    assert all(bool(jnp.all(jnp.isfinite(s))) for s in states)
    if name == "indrnn_relu":
        drive = jnp.max(jax.nn.relu(xs @ params["weight_ih"].T + params["bias"]))
        bound = drive / (1 - jnp.max(params["recurrent"]))
        assert bool(jnp.all(states[0] >= 0)) and float(jnp.max(states[0])) <= float(bound)
    else:
        assert all(float(jnp.max(jnp.abs(s))) <= 1 for s in states)
    # Not collapsed to a fixed point either: the state still follows the input at the end.
    assert float(jnp.std(states[0][-100:], axis=0).max()) > 1e-3


# -- gradients through bppsa.scan ---------------------------------------------------------------

METHODS = [
    bppsa.Sequential(),
    bppsa.SequentialScan(),
    bppsa.Blelloch(),
    bppsa.Blelloch(levels=1),
    bppsa.Chunked(),
    bppsa.Blocked(bppsa.Blelloch(), 4),
    bppsa.Auto(),
]
LENGTHS = [(1, False), (2, True), (5, False), (17, True)]  # (T, reverse)
B = 3
STRUCTURE = {name: "diagonal" for name in CELLS} | {"cifg_lstm": "block-diagonal k=2"}


def problem(cell, length, seed=0):
    keys = jax.random.split(jax.random.key(seed), 5)
    params = perturbed_params(cell, keys[0])
    xs = jax.random.normal(keys[1], (B, length, I), jnp.float64)
    heads = tuple(jax.random.normal(k, (H,), jnp.float64) for k in keys[2:4])
    return params, xs, heads, random_state(cell, keys[4], (B,))


def loss_fn(cell, scan, reverse):
    """Cotangents on every leaf of the final carry and on every ``y_t``; one scan per example,
    vmapped."""

    def loss(params, xs, heads, init):
        head, head_every = heads

        def one(x, state):
            def body(state, x_t):
                state = cell(params, state, x_t)
                return state, jnp.tanh(cell.output(state)) @ head_every

            state, ys = scan(body, state, x, reverse=reverse)
            return sum(jnp.sin(leaf) @ head for leaf in jax.tree.leaves(state)) + ys.sum()

        return jax.vmap(one)(xs, init).sum()

    return loss


@functools.lru_cache
def back_propagation(name, length, reverse):
    """``jax.grad`` through ``lax.scan``, once per case."""
    cell = CELLS[name]
    with jax.enable_x64(True):
        args = problem(cell, length)
        return jax.jit(jax.grad(loss_fn(cell, jax.lax.scan, reverse), argnums=(0, 1, 3)))(*args)


def check_gradients(name, method, length, reverse):
    cell = CELLS[name]
    args = problem(cell, length)
    loss = loss_fn(cell, bppsa.scan, reverse)
    # No product of the scan may densify a map: the elements keep their structure throughout.
    densify = mock.patch.object(Diagonal, "to_dense", side_effect=AssertionError("densified"))
    densify_blocks = mock.patch.object(
        BlockDiagonal, "to_dense", side_effect=AssertionError("densified")
    )
    with bppsa.trace_plans() as plans, densify, densify_blocks:
        grad = jax.jit(bppsa.grad(loss, argnums=(0, 1, 3), method=method))(*args)
    assert plans, "no bppsa.scan was traced"
    for plan in plans:
        if isinstance(method, bppsa.Auto):  # whatever it picked, it must scan the Jacobians
            assert plan.method.keeps_carries, plan.method
        else:
            assert plan.method == resolve(method), (plan.method, method)
        assert plan.backward == (plan.method if plan.method.keeps_carries else None)
        # "analytic", or with the structure the scan keeps: "analytic, diagonal", ...
        kind, _, structure = plan.jacobians.partition(", ")
        assert kind == "analytic" and structure in ("", STRUCTURE[name]), plan.jacobians
    assert_trees_close(grad, back_propagation(name, length, reverse), jnp.float64)


def slow_rest(names, default):
    """``default`` as it is, and every other case of ``names x METHODS x LENGTHS`` for
    ``-m slow``."""
    rest = [
        pytest.param(name, method, length, reverse, marks=pytest.mark.slow)
        for name in names
        for method in METHODS
        for length, reverse in LENGTHS
        if (name, method, length, reverse) not in default
    ]
    return [*default, *rest]


@pytest.mark.parametrize(
    "name,method,length,reverse", spread(["cifg_lstm"], METHODS, LENGTHS, crossed=2)
)
def test_block_diagonal_gradients_match_back_propagation(name, method, length, reverse, x64):
    """The 2x2 blocks under every method; the lengths rotate."""
    check_gradients(name, method, length, reverse)


DIAGONAL_DEFAULT = [
    ("diagonal_gru", bppsa.Blelloch(), 17, True),
    ("indrnn_relu", bppsa.Chunked(), 5, False),
]


@pytest.mark.parametrize(
    "name,method,length,reverse",
    slow_rest(["diagonal_gru", "indrnn_relu", "indrnn_tanh"], DIAGONAL_DEFAULT),
)
def test_diagonal_gradients_match_back_propagation(name, method, length, reverse, x64):
    check_gradients(name, method, length, reverse)


@pytest.mark.parametrize("length", marked_slow(1000))
@pytest.mark.parametrize("name", ["diagonal_gru", "cifg_lstm"])
def test_long_sequences_match_back_propagation(name, length, x64):
    check_gradients(name, bppsa.Blelloch(), length, False)
