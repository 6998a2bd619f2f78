"""Magnitude pruning: exact counts (global and per layer), the largest magnitudes kept, biases
never pruned, and masked layers equal to layers with zeroed weights, also under ``jax.grad``."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bppsa.models import Chain, Conv2d, Flatten, Linear, MaxPool2d, ReLU
from bppsa.models._pruning import magnitude_prune, sparsity_of

SPARSITIES = [0.0, 0.1, 0.37, 0.5, 0.9, 0.999]


def chain_and_params():
    chain = Chain(
        [Conv2d(2, 4, 3, padding=1), ReLU(), MaxPool2d(2), Conv2d(4, 3, 2), Flatten(), Linear(6, 5)]
    )
    # Distinct magnitudes at different scales per layer, so that global and per-layer differ.
    rng = np.random.default_rng(0)
    params = [
        {
            k: (scale * rng.normal(size=s)).astype(np.float32)
            for k, s in layer.param_shapes().items()
        }
        for layer, scale in zip(chain, [1.0, 0, 0, 0.1, 0, 3.0])
    ]
    return chain, params


def removed(mask):
    return int(mask.size - np.count_nonzero(mask))


def check_structure(params, masks):
    assert len(masks) == len(params)
    for p, m in zip(params, masks):
        assert set(m) == set(p)
        for name, mask in m.items():
            assert type(mask) is np.ndarray and mask.dtype == np.bool_
            assert mask.shape == p[name].shape
        if "bias" in m:
            assert m["bias"].all()  # biases are never pruned


@pytest.mark.parametrize("sparsity", SPARSITIES)
def test_global_prunes_exactly_the_smallest_weights_of_all_layers(sparsity):
    _, params = chain_and_params()
    masks = magnitude_prune(params, sparsity)
    check_structure(params, masks)
    weights = [(p["weight"], m["weight"]) for p, m in zip(params, masks) if p]
    total = sum(w.size for w, _ in weights)
    assert sum(removed(m) for _, m in weights) == round(sparsity * total)
    kept = np.concatenate([np.abs(w[m]) for w, m in weights])
    dropped = np.concatenate([np.abs(w[~m]) for w, m in weights])
    if kept.size and dropped.size:
        assert kept.min() >= dropped.max()
    report = sparsity_of(masks)
    assert report.overall == round(sparsity * total) / total
    assert report.per_layer[1] is None and report.per_layer[4] is None


@pytest.mark.parametrize("sparsity", SPARSITIES)
def test_per_layer_prunes_exactly_the_smallest_weights_of_each_layer(sparsity):
    _, params = chain_and_params()
    masks = magnitude_prune(params, sparsity, scope="layer")
    check_structure(params, masks)
    report = sparsity_of(masks)
    for i, (p, m) in enumerate(zip(params, masks)):
        if not p:
            assert m == {} and report.per_layer[i] is None
            continue
        w, mask = p["weight"], m["weight"]
        assert removed(mask) == round(sparsity * w.size)
        assert report.per_layer[i] == round(sparsity * w.size) / w.size
        if mask.any() and not mask.all():
            assert np.abs(w[mask]).min() >= np.abs(w[~mask]).max()


def test_global_and_per_layer_differ_across_scales():
    _, params = chain_and_params()
    per_layer = sparsity_of(magnitude_prune(params, 0.5)).per_layer
    # The small-scale conv loses more than half, the large-scale linear less.
    assert per_layer[3] > 0.5 > per_layer[5]


def test_ties_are_broken_deterministically_with_an_exact_count():
    params = [{"weight": np.ones((3, 5), np.float32), "bias": np.zeros(3)}, {}]
    params.append({"weight": -np.ones((7,), np.float32)})
    for scope in ("global", "layer"):
        masks = magnitude_prune(params, 0.4, scope=scope)
        again = magnitude_prune(params, 0.4, scope=scope)
        assert all(np.array_equal(m["weight"], a["weight"]) for m, a in zip(masks, again) if m)
        if scope == "global":
            assert removed(masks[0]["weight"]) + removed(masks[2]["weight"]) == round(0.4 * 22)
        else:
            assert [removed(masks[i]["weight"]) for i in (0, 2)] == [6, 3]
        assert masks[1] == {} and set(masks[2]) == {"weight"}


def test_masked_forward_equals_forward_with_zeroed_weights():
    chain, params = chain_and_params()
    masks = magnitude_prune(params, 0.6)
    zeroed = [
        {k: np.where(m[k], v, 0) for k, v in p.items()} if m else p for p, m in zip(params, masks)
    ]
    x = np.random.default_rng(1).normal(size=(3, 2, 4, 6)).astype(np.float32)
    expected = chain.forward(zeroed, x)
    np.testing.assert_array_equal(chain.forward(params, x, masks=masks), expected)
    np.testing.assert_array_equal(chain.apply(params, x, masks=masks), expected)


def test_grad_through_apply_is_exactly_zero_at_masked_weights():
    chain, params = chain_and_params()
    masks = magnitude_prune(params, 0.6, scope="layer")
    x = np.random.default_rng(1).normal(size=(3, 2, 4, 6)).astype(np.float32)

    def loss(params):
        return jnp.sum(chain.apply(params, x, masks=masks) ** 2)

    grads = jax.jit(jax.grad(loss))(params)
    reference = jax.grad(lambda p: jnp.sum(chain.forward(p, x, masks=masks) ** 2))(params)
    for g, r, m in zip(grads, reference, masks):
        if m:
            assert np.all(np.asarray(g["weight"])[~m["weight"]] == 0)
            assert np.any(np.asarray(g["weight"])[m["weight"]] != 0)
            np.testing.assert_allclose(g["weight"], r["weight"], rtol=1e-5, atol=1e-6)
            np.testing.assert_allclose(g["bias"], r["bias"], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    ("args", "kwargs", "error", "message"),
    [
        ((1.0,), {}, ValueError, r"sparsity must be in \[0, 1\), got 1.0"),
        ((-0.1,), {}, ValueError, r"sparsity must be in \[0, 1\)"),
        (("0.5",), {}, TypeError, r"sparsity must be a real number"),
        ((True,), {}, TypeError, r"sparsity must be a real number"),
        ((0.5,), {"scope": "network"}, ValueError, r"scope must be one of \('global', 'layer'\)"),
    ],
)
def test_arguments_are_validated(args, kwargs, error, message):
    _, params = chain_and_params()
    with pytest.raises(error, match=message):
        magnitude_prune(params, *args, **kwargs)


def test_params_are_validated():
    with pytest.raises(TypeError, match=r"params must be a list with one dict per layer"):
        magnitude_prune({"weight": np.ones(3)}, 0.5)
    with pytest.raises(ValueError, match=r"params\[0\]\['weight'\] must be finite"):
        magnitude_prune([{"weight": np.array([1.0, np.nan])}], 0.5)
    with pytest.raises(TypeError, match=r"params\[0\]\['weight'\] must be concrete"):
        jax.jit(lambda w: magnitude_prune([{"weight": w}], 0.5))(jnp.ones(3))
    assert magnitude_prune([{}, {}], 0.5) == [{}, {}]
    assert sparsity_of([{}, None]) == ([None, None], 0.0)
