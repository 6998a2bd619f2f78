"""The paper's sequence classifier."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import bppsa
from bppsa.models import GRU, LSTM, RNN, SequenceClassifier
from tests.helpers import assert_trees_close, classifier_loss_reference


@pytest.mark.parametrize("cell", [RNN(), GRU(), LSTM()])
def test_loss_and_gradients(cell):
    model = SequenceClassifier(input_size=1, hidden_size=8, num_classes=4, cell=cell)
    params = model.init(key=jax.random.key(0))
    xs = jax.random.bernoulli(jax.random.key(1), 0.3, (6, 13, 1)).astype(jnp.float32)
    labels = jnp.array([0, 1, 2, 3, 0, 1])
    logits = jax.vmap(model.logits, (None, 0))(params, xs)
    assert logits.shape == (6, 4)
    log_probs = np.asarray(jax.nn.log_softmax(logits))
    expected_loss = -np.mean(log_probs[np.arange(6), np.asarray(labels)])
    np.testing.assert_allclose(model.loss(params, xs, labels), expected_loss, rtol=1e-6)
    grads = jax.jit(bppsa.grad(model.loss))(params, xs, labels)
    reference = jax.jit(jax.grad(functools.partial(classifier_loss_reference, model)))(
        params, xs, labels
    )
    assert_trees_close(grads, reference, jnp.float32)
    assert jax.tree.structure(grads) == jax.tree.structure(params)


def test_bad_shapes_are_named():
    model = SequenceClassifier(2, 4, 3)
    params = model.init(key=jax.random.key(0))
    with pytest.raises(ValueError, match=r"xs must have shape \(T, 2\)"):
        model.logits(params, jnp.zeros((5, 3)))
    with pytest.raises(ValueError, match=r"labels \(B,\)"):
        model.loss(params, jnp.zeros((2, 5, 2)), jnp.zeros((3,), jnp.int32))
