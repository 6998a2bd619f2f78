"""The language model with every RMSNorm scale moved off its initial 1, each to a value of its
own: logits (scanned and stepped) are those of a forward written out here from the parameters,
and the gradients w.r.t. every parameter, each scale included, through ``bppsa.grad`` are
``jax.grad``'s of that forward through ``lax.scan``. At initialization every scale is 1, so a
scale read in the wrong block, or the wrong norm of a block, changes nothing there."""

import functools

import jax
import jax.numpy as jnp
import optax
import pytest

import bppsa
from bppsa.models import DiagonalGRU, LanguageModel, diagonal_gru_cell
from bppsa.models._language_model import EPS  # the model's RMSNorm epsilon
from tests.helpers import assert_trees_close, relative_errors

V, H, L, T, B = 11, 8, 3, 13, 2


def rms_norm(x, scale):
    return x / jnp.sqrt(jnp.mean(x**2, axis=-1, keepdims=True) + EPS) * scale


def reference_logits(params, tokens):
    """The model of ``LanguageModel``'s docstring, block by block, each recurrence a
    ``lax.scan`` of the diagonal GRU from a zero state."""
    stream = params["embedding"][tokens]
    for block in params["blocks"]:
        step = lambda h, x, cell=block["cell"]: (diagonal_gru_cell(cell, h, x),) * 2
        _, outputs = jax.lax.scan(
            step, jnp.zeros(H, stream.dtype), rms_norm(stream, block["cell_norm"])
        )
        stream = stream + outputs
        mlp = block["mlp"]
        hidden = rms_norm(stream, block["mlp_norm"]) @ mlp["weight_in"].T + mlp["bias_in"]
        stream = stream + jax.nn.gelu(hidden, approximate=False) @ mlp["weight_out"].T
        stream = stream + mlp["bias_out"]
    head = params["head"]
    return rms_norm(stream, params["norm"]) @ head["weight"].T + head["bias"]


def reference_loss(params, tokens, targets):
    logits = jax.vmap(reference_logits, in_axes=(None, 0))(params, tokens)
    return optax.softmax_cross_entropy_with_integer_labels(logits, targets).mean()


@functools.lru_cache
def problem():
    """The model, float64 parameters with every norm scale ``1 + 0.5 N(0, 1)`` (seeded, each its
    own draw), tokens and targets ``(B, T)``."""
    model = LanguageModel(V, H, L, cell=DiagonalGRU())
    with jax.enable_x64(True):
        params = jax.jit(model.init, static_argnames="dtype")(
            key=jax.random.key(0), dtype=jnp.float64
        )
        keys = iter(jax.random.split(jax.random.key(1), 2 * L + 1))

        def draw():
            return 1 + 0.5 * jax.random.normal(next(keys), (H,), jnp.float64)

        params["blocks"] = [
            block | {"cell_norm": draw(), "mlp_norm": draw()} for block in params["blocks"]
        ]
        params["norm"] = draw()
        tokens = jax.random.randint(jax.random.key(2), (B, T + 1), 0, V)
    return model, params, tokens[:, :-1], tokens[:, 1:]


def with_scales(params, cell_norms, mlp_norms):
    blocks = [
        block | {"cell_norm": c, "mlp_norm": m}
        for block, c, m in zip(params["blocks"], cell_norms, mlp_norms, strict=True)
    ]
    return params | {"blocks": blocks}


def test_logits_at_distinct_scales_are_the_reference_forwards(x64):
    model, params, tokens, _ = problem()

    def logits(params, tokens):
        scanned = jax.vmap(model.logits, in_axes=(None, 0))(params, tokens)
        stepped = jax.vmap(
            lambda tokens: jax.lax.scan(
                lambda states, token: model.step(params, states, token),
                model.initial_states(jnp.float64),
                tokens,
            )[1]
        )(tokens)
        return scanned, stepped

    scanned, stepped = jax.jit(logits)(params, tokens)
    reference = jax.jit(jax.vmap(reference_logits, in_axes=(None, 0)))
    expected = reference(params, tokens)
    assert_trees_close(scanned, expected, jnp.float64)
    assert_trees_close(stepped, expected, jnp.float64)
    # The test sees the scales: moved between blocks, or between the two norms of each block,
    # they change the logits far beyond the tolerance.
    cell_norms = [block["cell_norm"] for block in params["blocks"]]
    mlp_norms = [block["mlp_norm"] for block in params["blocks"]]
    for moved in (
        with_scales(params, cell_norms[1:] + cell_norms[:1], mlp_norms),
        with_scales(params, cell_norms, mlp_norms[1:] + mlp_norms[:1]),
        with_scales(params, mlp_norms, cell_norms),
    ):
        assert min(relative_errors(reference(moved, tokens), expected)) > 1e-3


@pytest.mark.parametrize("method", [bppsa.Blelloch(), bppsa.Sequential()])
def test_gradients_at_distinct_scales_are_the_reference_backward(method, x64):
    model, params, tokens, targets = problem()

    def loss(params, tokens, targets):
        losses = jax.vmap(model.loss, in_axes=(None, 0, 0))(params, tokens, targets)
        return losses.mean()

    with bppsa.trace_plans() as plans:
        actual = jax.jit(bppsa.grad(loss, method=method))(params, tokens, targets)
    assert len(plans) == L
    expected = jax.jit(jax.grad(reference_loss))(params, tokens, targets)
    assert_trees_close(actual, expected, jnp.float64)  # every leaf, each scale among them
    scales = [expected["norm"]] + [
        b[k] for b in expected["blocks"] for k in ("cell_norm", "mlp_norm")
    ]
    assert all(float(jnp.max(jnp.abs(s))) > 1e-4 for s in scales)  # none is trivially 0
