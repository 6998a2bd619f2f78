"""The stacked recurrent language model: shapes, one bppsa.scan per block, gradients of its loss
with parallel backward methods equal back-propagation's, the step-by-step model equals the
scanned one, sampling is reproducible, and a uniform model costs log2(V) bits per token."""

import dataclasses
import functools
import math
from unittest import mock

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import bppsa
from bppsa.models import CIFGLSTM, GRU, LSTM, DiagonalGRU, IndRNN, LanguageModel
from bppsa.scan import BlockDiagonal, Diagonal
from tests.helpers import NEWTON_RTOL, assert_trees_close, marked_slow

V, H, L, T, B = 11, 8, 2, 13, 3
NEW_CELLS = {"diagonal_gru": DiagonalGRU(), "cifg_lstm": CIFGLSTM(), "indrnn": IndRNN()}


def data(seed=0, length=T):
    tokens = jax.random.randint(jax.random.key(seed), (B, length + 1), 0, V)
    return tokens[:, :-1], tokens[:, 1:]


def init(model, seed, dtype=jnp.float32):
    """``model.init`` jitted: eagerly, each of its small random draws compiles on its own."""
    return jax.jit(model.init, static_argnames="dtype")(key=jax.random.key(seed), dtype=dtype)


@functools.lru_cache
def default_model():
    """``LanguageModel(V, H, L)`` and its float32 parameters, shared by the tests that only read
    them."""
    model = LanguageModel(V, H, L)
    return model, init(model, 0)


def batch_loss(model, method):
    def loss(params, tokens, targets):
        def one(tokens, targets):
            return model.loss(params, tokens, targets, method=method)

        return jax.vmap(one)(tokens, targets).mean()

    return loss


@functools.lru_cache
def back_propagation(name):
    """The model, its parameters and data, and jax.grad of the loss with Sequential()."""
    model = LanguageModel(V, H, L, cell=NEW_CELLS[name])
    with jax.enable_x64(True):
        params = init(model, 1, jnp.float64)
        tokens, targets = data()
        loss = batch_loss(model, bppsa.Sequential())
        return model, (params, tokens, targets), jax.jit(jax.grad(loss))(params, tokens, targets)


# Each cell with each method; the default suite rotates the methods over the cells.
# Each cell with each method: the default suite runs the two structures (2x2 blocks, diagonal)
# with one method each, -m slow the rest.
GRADIENT_CASES = [
    ("cifg_lstm", bppsa.Auto()),
    ("diagonal_gru", bppsa.Blelloch()),
    *marked_slow(
        ("cifg_lstm", bppsa.Blelloch()),
        ("diagonal_gru", bppsa.Auto()),
        ("indrnn", bppsa.Blelloch()),
        ("indrnn", bppsa.Auto()),
    ),
]


@pytest.mark.parametrize("case", GRADIENT_CASES, ids=lambda case: f"{case[0]}-{case[1]}")
def test_parallel_gradients_equal_back_propagation(case, x64):
    """Blelloch() and Auto() against Sequential() (plain back-propagation), float64. Blelloch()
    is passed to the model's scans; Auto() reaches them from an enclosing bppsa.grad."""
    name, method = case
    model, args, expected = back_propagation(name)
    if isinstance(method, bppsa.Auto):
        grad = bppsa.grad(batch_loss(model, None), method=method)
    else:
        grad = jax.grad(batch_loss(model, method))
    with bppsa.trace_plans() as plans:
        actual = jax.jit(grad)(*args)
    assert len(plans) == L  # one scan per block
    for plan in plans:
        assert plan.requested == method and plan.method.keeps_carries, plan
        assert plan.jacobians.startswith("analytic") and plan.length == T and plan.batch == B
    assert_trees_close(actual, expected, jnp.float64)


def test_shapes_and_parameters():
    model = LanguageModel(V, H, L, cell=CIFGLSTM(), expansion=3)
    params = jax.eval_shape(lambda: model.init(key=jax.random.key(0)))
    assert params["embedding"].shape == (V, H) and params["head"]["weight"].shape == (V, H)
    assert len(params["blocks"]) == L
    assert params["blocks"][0]["mlp"]["weight_in"].shape == (3 * H, H)
    assert params["blocks"][0]["cell"]["peephole"].shape == (2 * H,)
    tokens, targets = data()
    assert jax.eval_shape(model.logits, params, tokens[0]).shape == (T, V)
    assert jax.eval_shape(model.loss, params, tokens[0], targets[0]).shape == ()
    assert jax.eval_shape(model.step, params, model.initial_states(), tokens[0, 0])[1].shape == (V,)


@pytest.mark.parametrize(
    "cell", [CIFGLSTM(), *marked_slow(DiagonalGRU(), IndRNN("tanh"), GRU(), LSTM())]
)
def test_stepping_one_token_at_a_time_gives_the_same_logits(cell, x64):
    model = LanguageModel(V, H, L, cell=cell)
    params = init(model, 2, jnp.float64)
    tokens = data()[0][0]

    def both(params, tokens):
        _, stepped = jax.lax.scan(
            lambda states, token: model.step(params, states, token),
            model.initial_states(jnp.float64),
            tokens,
        )
        return model.logits(params, tokens), stepped

    scanned, stepped = jax.jit(both)(params, tokens)
    assert_trees_close(scanned, stepped, jnp.float64)


@pytest.mark.parametrize("cell", [CIFGLSTM(), *marked_slow(DiagonalGRU(), IndRNN())])
def test_the_newton_forward_gives_the_sequential_logits(cell, x64):
    """forward=bppsa.Newton(): every block's trajectory by Newton iterations over the
    structured Jacobians (never densified), certified to NEWTON_RTOL of lax.scan's."""
    model = LanguageModel(V, H, L, cell=cell)
    params = init(model, 4, jnp.float64)
    tokens = data(length=40)[0][0]
    expected = jax.jit(functools.partial(model.logits, method=bppsa.Sequential()))(params, tokens)
    newton = functools.partial(model.logits, forward=bppsa.Newton())
    densify = [
        mock.patch.object(kind, "to_dense", side_effect=AssertionError("densified"))
        for kind in (Diagonal, BlockDiagonal)
    ]
    with bppsa.trace_plans() as plans, densify[0], densify[1]:
        actual = jax.jit(newton)(params, tokens)
    assert len(plans) == L
    assert all(dataclasses.replace(p.forward, solver=None) == bppsa.Newton() for p in plans)
    assert_trees_close(actual, expected, jnp.float64, NEWTON_RTOL)


def test_generate_is_reproducible_for_a_key():
    model, params = default_model()
    prompt = jnp.array([1, 2, 3])
    generate = jax.jit(model.generate, static_argnames=("length", "temperature"))
    first = generate(params, prompt, length=20, key=jax.random.key(4))
    assert first.shape == (20,) and jnp.issubdtype(first.dtype, jnp.integer)
    assert np.all((np.asarray(first) >= 0) & (np.asarray(first) < V))
    again = generate(params, prompt, length=20, key=jax.random.key(4))
    other = generate(params, prompt, length=20, key=jax.random.key(5))
    assert np.array_equal(first, again) and not np.array_equal(first, other)
    # temperature 0 follows the most likely token, whatever the key
    greedy = generate(params, prompt, length=5, key=jax.random.key(6), temperature=0.0)
    _, logits = jax.lax.scan(lambda s, t: model.step(params, s, t), model.initial_states(), prompt)
    assert int(greedy[0]) == int(jnp.argmax(logits[-1]))


def test_a_uniform_model_costs_log2_v_bits_per_token():
    model, params = default_model()
    params = params | {"head": jax.tree.map(jnp.zeros_like, params["head"])}  # every logit 0
    tokens, targets = data()
    bits, nats = jax.jit(lambda *a: (model.bits_per_character(*a), model.loss(*a)))(
        params, tokens[0], targets[0]
    )
    np.testing.assert_allclose(bits, math.log2(V), rtol=1e-6)
    np.testing.assert_allclose(nats, math.log(V), rtol=1e-6)


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="width must be a positive int"):
        LanguageModel(V, 0, L)
    with pytest.raises(TypeError, match=r"cell must be a bppsa\.models\.Cell"):
        LanguageModel(V, H, L, cell="gru")
    model = LanguageModel(V, H, 1)
    params = jax.eval_shape(lambda: model.init(key=jax.random.key(0)))  # checks come first
    with pytest.raises(ValueError, match=r"tokens must be integers of shape \(T,\)"):
        model.logits(params, jnp.zeros((2, 3), jnp.int32))
    with pytest.raises(ValueError, match="targets must have the shape of tokens"):
        model.loss(params, jnp.zeros(3, jnp.int32), jnp.zeros(4, jnp.int32))
    with pytest.raises(ValueError, match="prompt must hold at least one token"):
        model.generate(params, jnp.zeros(0, jnp.int32), 3, key=jax.random.key(0))
