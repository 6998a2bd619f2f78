"""Back-propagation through a chain of layers as a scan: ``Chain.apply`` under ``bppsa.grad``
against ``jax.grad`` of the same network written directly with ``jax.lax``."""

from __future__ import annotations

import functools
import math
import typing

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import bppsa
from bppsa.jacobians import transposed_jacobian
from bppsa.models import (
    Chain,
    Conv2d,
    Flatten,
    Layer,
    Linear,
    MaxPool2d,
    ReLU,
    magnitude_prune,
    vgg11,
)
from bppsa.scan._core.asked import options_from
from bppsa.scan._core.options import ambient
from tests.helpers import RTOL, assert_trees_close, relative_errors, spread

# float32: the scan sums the products of up to ~10 layers' Jacobians in another order than
# back-propagation, and a conv's weight gradient is one reduction over B*H*W; measured <= 3e-7
# on these chains, so the shared 1e-5 leaves a 30x margin (an ordering bug is off by ~1).
SCAN_METHODS = [
    bppsa.SequentialScan(),
    bppsa.Blelloch(),
    bppsa.Blelloch(levels=1),
    bppsa.Blelloch(levels=2),
]


def lax_network(params, x, masks):
    """The chain below, written with jax.lax directly (independent of bppsa.models)."""

    def w(i):
        weight = params[i]["weight"]
        return weight if masks is None else weight * masks[i]["weight"]

    def conv(i, x, stride, padding):
        y = jax.lax.conv_general_dilated(
            x, w(i), (stride, stride), [(padding, padding)] * 2,
            dimension_numbers=("NCHW", "OIHW", "NCHW"),
        )  # fmt: skip
        return y + params[i]["bias"][None, :, None, None]

    x = jax.nn.relu(conv(0, x, 1, 1))
    x = jax.lax.reduce_window(x, -jnp.inf, jax.lax.max, (1, 1, 2, 2), (1, 1, 2, 2), "VALID")
    x = jax.nn.relu(conv(3, x, 2, 0))
    x = jax.lax.reduce_window(x, -jnp.inf, jax.lax.max, (1, 1, 2, 2), (1, 1, 1, 1), "VALID")
    x = x.reshape(x.shape[0], -1)
    return x @ w(7).T + params[7]["bias"]


def small_chain() -> Chain:
    # Non-square input, a stride, an overlapping pool, a Linear: shapes differ at every layer.
    return Chain(
        [
            Conv2d(2, 4, 3, padding=1),
            ReLU(),
            MaxPool2d(2),
            Conv2d(4, 5, 3, stride=2),
            ReLU(),
            MaxPool2d(2, stride=1),
            Flatten(),
            Linear(5, 3),
        ]
    )


def problem(dtype, batch, seed=0, sparsity=None):
    chain = small_chain()
    params = jax.tree.map(lambda a: a.astype(dtype), chain.init(jax.random.key(seed)))
    x = jax.random.normal(jax.random.key(seed + 1), (batch, 2, 12, 10), dtype)
    masks = None if sparsity is None else magnitude_prune(params, sparsity)
    return chain, params, x, masks


def loss_of(apply, masks):
    def loss(params, x):
        out = apply(params, x, masks)
        return jnp.sum(jnp.sin(out) * jnp.arange(1, out.shape[-1] + 1, dtype=out.dtype))

    return loss


@pytest.mark.parametrize(
    "method,sparsity,batch", spread(SCAN_METHODS, [None, 0.6], [1, 3], crossed=2)
)
def test_gradient_equals_lax_back_propagation(method, batch, sparsity, dtype):
    chain, params, x, masks = problem(dtype, batch, sparsity=sparsity)
    apply = lambda p, x, m: chain.apply(p, x, masks=m)
    grad = jax.jit(bppsa.grad(loss_of(apply, masks), argnums=(0, 1), method=method))
    expected = jax.grad(loss_of(lax_network, masks), argnums=(0, 1))(params, x)
    with bppsa.trace_plans() as plans:
        actual = grad(params, x)
    assert [p.backward for p in plans] == [method]
    assert_trees_close(actual, expected, dtype)


def test_masked_weights_get_exactly_zero_gradient():
    chain, params, x, masks = problem(jnp.float32, 2, sparsity=0.7)
    apply = lambda p, x, m: chain.apply(p, x, masks=m)
    grads = jax.jit(bppsa.grad(loss_of(apply, masks), method=bppsa.Blelloch(levels=1)))(params, x)
    for g, m in zip(grads, masks):
        if m:
            assert np.all(np.asarray(g["weight"])[~m["weight"]] == 0.0)
            assert np.any(np.asarray(g["weight"])[m["weight"]] != 0.0)


def test_pruned_entries_leave_the_patterns():
    chain, params, x, masks = problem(jnp.float32, 1, sparsity=0.7)
    dense = chain.transposed_jacobians(params, x)
    pruned = chain.transposed_jacobians(params, x, masks=masks)
    kept = masks[0]["weight"].mean()
    assert pruned[0].pattern.nnz < 0.5 * dense[0].pattern.nnz
    assert abs(pruned[0].pattern.nnz / dense[0].pattern.nnz - kept) < 0.15
    assert pruned[1].pattern == dense[1].pattern  # a ReLU's pattern does not depend on data


def test_a_users_own_layer_gets_an_autodiff_jacobian(x64):
    chain = Chain([Conv2d(1, 2, 2), ReLU(), Flatten(), lambda p, x: jnp.tanh(x) * p["scale"]])
    params = chain.init(jax.random.key(0))
    params = [jax.tree.map(lambda a: a.astype(jnp.float64), p) for p in params]
    params[3] = {"scale": jnp.asarray(1.5, jnp.float64)}
    x = jax.random.normal(jax.random.key(1), (2, 1, 4, 3), jnp.float64)
    loss = lambda p, x, apply: jnp.sum(apply(p, x) ** 2)
    expected = jax.grad(loss, argnums=(0, 1))(params, x, chain.forward)
    for method in SCAN_METHODS:
        grad = bppsa.grad(loss, argnums=(0, 1), method=method)
        actual = jax.jit(grad, static_argnums=2)(params, x, chain.apply)
        assert_trees_close(actual, expected, jnp.float64)
    assert type(chain.transposed_jacobians(params, x)[3]).__name__ == "Dense"


def scale_map(params, x):
    """The transposed Jacobian of ``y = s * x`` (elementwise): ``diag(s)``, a Structured map."""
    d = jnp.broadcast_to(params["scale"], x.shape)[None]
    return bppsa.scan.Structured(u=jnp.eye(x.shape[-1], dtype=x.dtype), d=d)


def scale_chain(layer):
    """A chain ``Flatten, layer, Linear`` with ``layer`` the scale ``y = s * x``, float64: the
    chain, its params, an input, a loss of ``apply`` and the loss's gradient by autodiff."""
    chain = Chain([Flatten(), layer, Linear(12, 2)])
    params = chain.init(jax.random.key(0), dtype=jnp.float64)
    params[1] = {"scale": jnp.linspace(0.5, 1.5, 12, dtype=jnp.float64)}
    x = jax.random.normal(jax.random.key(1), (3, 1, 4, 3), jnp.float64)
    loss = lambda p, x, apply: jnp.sum(jnp.tanh(apply(p, x)))
    expected = jax.grad(loss, argnums=(0, 1))(params, x, chain.forward)
    return chain, params, x, loss, expected


def test_a_users_layer_declares_its_jacobian_as_a_cell_does(x64):
    # y = s * x elementwise: J^T = diag(s), built by the layer's own builder (a Structured map),
    # so the chain's backward uses it and not autodiff.
    built = []

    def scale_jacobian_t(params, x):
        built.append(x.shape)
        return scale_map(params, x)

    @transposed_jacobian(scale_jacobian_t, of="layer")
    def scale(params, x):
        return x * params["scale"]

    declared_a_cell = transposed_jacobian(scale_jacobian_t)(lambda params, x: x)
    with pytest.raises(TypeError, match=r"declared a cell by transposed_jacobian.*of='layer'"):
        declared_a_cell({"scale": jnp.ones(2)}, jnp.ones(2))
    with pytest.raises(ValueError, match="of must be 'cell' or 'layer'"):
        transposed_jacobian(scale_jacobian_t, of="step")

    chain, params, x, loss, expected = scale_chain(scale)
    for method in SCAN_METHODS:
        built.clear()
        actual = jax.jit(bppsa.grad(loss, argnums=(0, 1), method=method), static_argnums=2)(
            params, x, chain.apply
        )
        assert_trees_close(actual, expected, jnp.float64)
        assert built == [(3, 12)]
    assert isinstance(chain.transposed_jacobians(params, x)[1], bppsa.scan.Structured)


class Scale(Layer):
    """A user's layer type ``y = s * x`` (elementwise), its transposed Jacobian declared by the
    protocol of cells and callables: ``transposed_jacobian`` with the call's arguments."""

    built: typing.ClassVar[list] = []

    def param_shapes(self):
        return {"scale": (12,)}

    def _output_shape(self, input_shape):
        return input_shape

    def __call__(self, params, x, mask=None):
        return x * params["scale"]

    def transposed_jacobian(self, params, x, mask=None):
        self.built.append(x.shape)
        return scale_map(params, x)


class PlainScale(Scale):
    """The same layer type without a builder of its own: the base class's, autodiff."""

    transposed_jacobian = Layer.transposed_jacobian


@pytest.mark.parametrize(
    "layer,analytic", [(Scale(), True), (PlainScale(), False)], ids=["Scale", "PlainScale"]
)
def test_a_users_layer_type_declares_its_jacobian_by_the_same_protocol(x64, layer, analytic):
    chain, params, x, loss, expected = scale_chain(layer)
    Scale.built.clear()
    actual = jax.jit(bppsa.grad(loss, argnums=(0, 1), method="blelloch"), static_argnums=2)(
        params, x, chain.apply
    )
    assert_trees_close(actual, expected, jnp.float64)
    assert Scale.built == ([(3, 12)] if analytic else [])
    built = chain.transposed_jacobians(params, x)[1]
    assert isinstance(built, bppsa.scan.Structured if analytic else bppsa.scan.Dense)


def test_the_ambient_method_reaches_the_chain_and_sequential_is_autodiff():
    chain, params, x, _ = problem(jnp.float32, 2)
    loss = lambda p: jnp.sum(chain.apply(p, x) ** 2)
    with bppsa.trace_plans() as plans:
        jax.jit(bppsa.grad(loss, method="sequential"))(params)
        jax.jit(bppsa.grad(loss, method="blelloch"))(params)
    assert [p.method for p in plans] == [bppsa.Sequential(), bppsa.Blelloch()]
    assert plans[0].jacobians == "autodiff" and plans[1].jacobians == "sparse"


@pytest.mark.parametrize("method", [bppsa.Chunked(), bppsa.Blocked(bppsa.Blelloch(), 4)], ids=repr)
def test_methods_without_a_layer_scan_are_refused(method):
    chain, params, x, _ = problem(jnp.float32, 1)
    with pytest.raises(TypeError, match="does not apply to a chain of layers"):
        jax.jit(bppsa.grad(lambda p: jnp.sum(chain.apply(p, x)), method=method))(params)


def test_levels_over_time_steps_run_too(x64):
    f = lambda w, scan: scan(lambda h, x: (jnp.tanh(w * h + x), h), 0.0, jnp.linspace(0, 1, 23))
    loss = lambda w, scan: jnp.sum(f(w, scan)[1] ** 2) + f(w, scan)[0]
    expected = jax.grad(loss)(0.5, jax.lax.scan)
    for levels in (0, 1, 3):
        actual = bppsa.grad(loss, method=bppsa.Blelloch(levels=levels))(0.5, bppsa.scan)
        assert_trees_close(actual, expected, jnp.float64)
    with pytest.raises(ValueError, match="levels"):
        bppsa.Blelloch(levels=-1)


def test_traced_masks_still_give_exact_gradients():
    chain, params, x, masks = problem(jnp.float32, 2, sparsity=0.5)
    masks_j = jax.tree.map(jnp.asarray, masks)

    def grad(params, masks):
        loss = lambda p: jnp.sum(jnp.sin(chain.apply(p, x, masks=masks)))
        return bppsa.grad(loss, method=bppsa.Blelloch())(params)

    with pytest.warns(UserWarning, match="concrete"):
        actual = jax.jit(grad)(params, masks_j)
    expected = jax.grad(lambda p: jnp.sum(jnp.sin(lax_network(p, x, masks))))(params)
    assert_trees_close(actual, expected, jnp.float32)


def test_memory_guard_raises_before_running_and_estimate_matches():
    chain, params, x, masks = problem(jnp.float32, 3, sparsity=0.5)
    loss = lambda p: jnp.sum(chain.apply(p, x, masks=masks))
    need = chain.estimate_memory(params, x, masks=masks, method=bppsa.Blelloch())
    chain_need = chain.estimate_memory(params, x, masks=masks, method="sequential")
    assert need > 0 and chain_need > 0
    with pytest.raises(bppsa.MemoryLimitError) as error:
        jax.eval_shape(bppsa.grad(loss, method=bppsa.Blelloch(), memory_limit=need / 2), params)
    assert error.value.estimate == need
    assert "Chain.apply" in str(error.value)
    assert "levels=" in str(error.value)  # fewer levels fit: the error says so
    # A limit that fits traces.
    jax.eval_shape(bppsa.grad(loss, method=bppsa.Blelloch(), memory_limit=2 * need), params)


def test_estimate_grows_with_levels_and_batch():
    chain, params, _, masks = problem(jnp.float32, 1, sparsity=0.5)
    spec = lambda b: jax.ShapeDtypeStruct((b, 2, 12, 10), jnp.float32)
    est = lambda m, b: chain.estimate_memory(params, spec(b), masks=masks, method=m)
    seq = bppsa.SequentialScan()
    assert est(seq, 1) < est(bppsa.Blelloch(), 1)
    assert est(bppsa.Blelloch(), 1) < est(bppsa.Blelloch(), 8)


def test_vgg11_pruned_to_97_percent_matches_back_propagation():
    chain = vgg11()
    rng = np.random.default_rng(0)
    shapes = jax.eval_shape(chain.init, jax.random.key(0))
    params = [
        {k: jnp.asarray(rng.uniform(-0.1, 0.1, v.shape), jnp.float32) for k, v in p.items()}
        for p in shapes
    ]
    masks = magnitude_prune(params, 0.97)
    x = jnp.asarray(rng.standard_normal((2, 3, 32, 32)), jnp.float32)
    labels = jnp.array([3, 7])

    def loss(p, x, apply):
        logits = apply(p, x, masks=masks)
        return -jnp.mean(jax.nn.log_softmax(logits)[jnp.arange(2), labels])

    expected = jax.jit(jax.grad(loss, argnums=(0, 1)), static_argnums=2)(params, x, chain.forward)
    method = bppsa.SequentialScan()
    actual = jax.jit(bppsa.grad(loss, argnums=(0, 1), method=method), static_argnums=2)(
        params, x, chain.apply
    )
    errors = relative_errors(actual, expected)
    assert max(errors) <= RTOL[jnp.dtype("float32")], errors
    for g, m in zip(actual[0], masks):
        if m:
            assert np.all(np.asarray(g["weight"])[~m["weight"]] == 0.0)
    assert math.isfinite(float(jnp.sum(actual[1])))


def test_auto_takes_the_sparse_chain_only_where_pruning_pays():
    chain, params, x, _ = problem(jnp.float32, 2)
    chain_method = bppsa.SequentialScan()
    for sparsity, expected in [(None, bppsa.Sequential()), (0.97, chain_method)]:
        masks = None if sparsity is None else magnitude_prune(params, sparsity)
        loss = lambda p, masks=masks: jnp.sum(chain.apply(p, x, masks=masks))
        with bppsa.trace_plans() as plans:
            jax.eval_shape(bppsa.grad(loss, method="auto"), params)
        assert plans[0].method == expected, (sparsity, bppsa.get_profile().rules.chain_sparse_cost)


@pytest.mark.parametrize("method", [bppsa.Sequential(), *SCAN_METHODS, bppsa.Auto()], ids=repr)
def test_forward_mode_through_the_chain_equals_dense_autodiff(x64, method):
    # jax.jvp, jax.linearize, jax.jacfwd and jax.hessian of a loss through Chain.apply with the
    # method as the ambient one (as inside bppsa.grad), against the same transformations of the
    # chain's plain forward. A small pruned chain: shapes differ at every layer.
    chain = Chain([Conv2d(1, 2, 3, padding=1), ReLU(), MaxPool2d(2), Flatten(), Linear(8, 2)])
    params = jax.tree.map(lambda a: a.astype(jnp.float64), chain.init(jax.random.key(0)))
    masks = magnitude_prune(params, 0.5)
    x = jax.random.normal(jax.random.key(1), (2, 1, 4, 4), jnp.float64)
    tangent = jnp.linspace(-1.0, 1.0, 18, dtype=jnp.float64).reshape(2, 1, 3, 3)

    @functools.partial(jax.jit, static_argnums=0)
    def transforms(apply, weight, x):
        def f(w, x):
            p = [{**params[0], "weight": w}, *params[1:]]
            return jnp.sum(jnp.sin(apply(p, x, masks=masks)))

        return {
            "jvp": jax.jvp(lambda w: f(w, x), (weight,), (tangent,))[1],
            "linearize": jax.linearize(lambda w: f(w, x), weight)[1](tangent),
            "jacfwd": jax.jacfwd(f, argnums=1)(weight, x),
            "hessian": jax.hessian(f)(weight, x),
        }

    with ambient(options_from(method=method)), bppsa.trace_plans() as plans:
        actual = transforms(chain.apply, params[0]["weight"], x)
    assert plans and all(plan.requested == method for plan in plans)
    assert_trees_close(actual, transforms(chain.forward, params[0]["weight"], x), jnp.float64)
