"""The library's own matrix products run at the precision asked for, ``"highest"`` by default,
and the user's cell keeps its own: every ``dot_general`` / convolution in the jaxprs of every
method's backward, the Newton forward, forward mode and the scan over layers is either the
user's (traced inside :func:`bppsa.scan._precision.cell`'s named scope, which JAX keeps through
derivatives) or carries the precision promised (docs/accuracy.md, precision).

On a CPU every float32 product runs at full precision whatever it says, so these tests read the
jaxprs: what they check is what a GPU would run."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import pytest
from jax import lax
from jax.extend.core import jaxprs_in_params

import bppsa
from bppsa.models import (
    CIFGLSTM,
    GRU,
    RNN,
    Chain,
    Conv2d,
    DiagonalGRU,
    Flatten,
    Linear,
    MaxPool2d,
    ReLU,
    magnitude_prune,
)
from bppsa.scan import _precision
from bppsa.scan._core import linear
from tests.helpers import distinct_state

PRODUCTS = ("dot_general", "conv_general_dilated")
LINEAR_MAP = "bppsa_linear_map"  # the scan's tangent map (bppsa.scan._core.linear)
HIGHEST = (lax.Precision.HIGHEST, lax.Precision.HIGHEST)
H, T, B, I = 6, 13, 2, 3


@pytest.fixture(autouse=True)
def _jax_default_precision():
    """JAX's own default, as a user has it: the suite's "highest" (tests/conftest.py) would
    give a library product that forgets its precision "highest" all the same."""
    with jax.default_matmul_precision(None):
        yield


def products(jaxpr) -> tuple[list, list]:
    """``(library, cell)``: the precision of every product in ``jaxpr`` and its sub-jaxprs,
    split by whether it was traced inside the cell's named scope."""
    library, cell = [], []
    for eqn in jaxpr.eqns:
        if eqn.primitive.name in PRODUCTS:
            mine = _precision.CELL_SCOPE in str(eqn.source_info.name_stack)
            (cell if mine else library).append(eqn.params.get("precision"))
        subs = list(jaxprs_in_params(eqn.params))
        if eqn.primitive.name == LINEAR_MAP:  # its map is traced when lowered: trace it here
            avals = [jax.ShapeDtypeStruct(v.aval.shape, v.aval.dtype) for v in eqn.invars]
            impl = functools.partial(linear._impl, rule=eqn.params["rule"])
            subs.append(jax.make_jaxpr(impl)(*avals).jaxpr)
        for sub in subs:
            more_library, more_cell = products(sub)
            library += more_library
            cell += more_cell
    return library, cell


def check(fn, *args, expected=HIGHEST) -> tuple[list, list]:
    """Asserts that every library product of ``fn``'s jaxpr runs at ``expected``."""
    library, cell = products(jax.make_jaxpr(fn)(*args).jaxpr)
    wrong = [p for p in library if p != expected]
    assert not wrong, f"{len(wrong)} of {len(library)} library products not at {expected}: {wrong}"
    return library, cell


def dense_cell(params, h, x):
    """A user's cell with no analytic Jacobian: dense autodiff Jacobians, dense products."""
    return jnp.tanh(params["w"] @ h + params["u"] @ x) * params["s"]


def block_cell(params, h, x):
    """A user's cell whose Jacobian is block-diagonal with blocks of 16 (> the small blocks
    that are multiplied elementwise): the blocks' products are matrix products."""
    blocks = jnp.einsum("gij,gj->gi", params["w"], h.reshape(2, 16))
    return jnp.tanh(blocks.reshape(-1) + params["u"] @ x)


def cell_problem(name):
    key = jax.random.key(0)
    if name == "dense":
        k = jax.random.split(key, 3)
        params = {
            "w": 0.4 * jax.random.normal(k[0], (H, H)),
            "u": jax.random.normal(k[1], (H, I)),
            "s": jnp.ones(H) + 0.1 * jax.random.normal(k[2], (H,)),
        }
        return params, dense_cell, jnp.zeros(H)
    if name == "blocks":
        k = jax.random.split(key, 2)
        params = {
            "w": 0.2 * jax.random.normal(k[0], (2, 16, 16)),
            "u": jax.random.normal(k[1], (32, I)),
        }
        return params, block_cell, jnp.zeros(32)
    model = {"rnn": RNN(), "gru": GRU(), "diagonal-gru": DiagonalGRU(), "cifg-lstm": CIFGLSTM()}[
        name
    ]
    params = model.init(I, H, key=key)
    zeros = (jnp.zeros(H), jnp.zeros(H)) if name == "cifg-lstm" else jnp.zeros(H)
    init = distinct_state(zeros, jax.random.key(2))  # the CIFG's h is not its c
    return params, model, init


def loss_of(name, **scan_options):
    params, cell, init = cell_problem(name)

    def loss(params, xs):
        def one(x):
            carry, ys = bppsa.scan(
                lambda c, x: (cell(params, c, x), jnp.sum(jax.tree.leaves(c)[0])),
                init, x, **scan_options,
            )  # fmt: skip
            return jnp.sum(ys) + sum(jnp.sum(leaf**2) for leaf in jax.tree.leaves(carry))

        return jnp.mean(jax.vmap(one)(xs))

    xs = jax.random.normal(jax.random.key(1), (B, T, I))
    return loss, params, xs


METHODS = [
    bppsa.Blelloch(),
    bppsa.Chunked(),
    bppsa.SequentialScan(),
    bppsa.Blocked(bppsa.Blelloch(), 4),
    bppsa.Auto(),
]
CELLS = ["dense", "rnn", "gru", "diagonal-gru", "cifg-lstm", "blocks"]


@pytest.mark.parametrize("name", CELLS)
@pytest.mark.parametrize("method", METHODS, ids=repr)
def test_every_backward_runs_its_products_at_highest(name, method):
    loss, params, xs = loss_of(name)
    check(bppsa.grad(loss, method=method), params, xs)


@pytest.mark.parametrize("name", ["dense", "rnn", "blocks"])
def test_the_dense_and_blocked_scans_do_form_library_products(name):
    """The check above has something to check: the parallel scan over dense maps, over an
    RNN's structured maps and over blocks larger than 8 multiplies matrices itself."""
    loss, params, xs = loss_of(name)
    library, _ = check(bppsa.grad(loss, method=bppsa.Blelloch()), params, xs)
    assert library


@pytest.mark.parametrize("name", ["dense", "gru", "diagonal-gru"])
@pytest.mark.parametrize("method", [bppsa.Blelloch(), bppsa.Auto()], ids=repr)
def test_the_newton_forward_and_its_backward(name, method):
    loss, params, xs = loss_of(name)
    library, _ = check(bppsa.grad(loss, method=method, forward="newton"), params, xs)
    if name == "dense":
        assert library


@pytest.mark.parametrize("method", [bppsa.Blelloch(), bppsa.Chunked(), bppsa.Auto()], ids=repr)
def test_forward_mode(method):
    loss, params, xs = loss_of("dense", method=method)
    tangent = jax.tree.map(jnp.ones_like, params)
    library, _ = check(lambda p: jax.jvp(lambda p: loss(p, xs), (p,), (tangent,)), params)
    if not isinstance(method, bppsa.Auto):
        assert library


@pytest.mark.parametrize("pruned", [False, True])
def test_the_scan_over_layers(pruned):
    layers = [Conv2d(2, 3, 3, padding=1), ReLU(), MaxPool2d(2), Flatten(), Linear(12, 5)]
    chain = Chain([*layers, Linear(5, 3)])  # two dense maps in a row: a matrix product
    params = chain.init(jax.random.key(0))
    x = jax.random.normal(jax.random.key(1), (2, 2, 4, 4))
    masks = magnitude_prune(params, 0.5) if pruned else None

    def loss(params, x):
        return jnp.sum(jnp.sin(chain.apply(params, x, masks=masks)))

    found = []
    for method in (bppsa.Blelloch(), bppsa.Blelloch(levels=1), bppsa.SequentialScan()):
        library, cell = check(bppsa.grad(loss, method=method), params, x)
        assert cell  # the layers' own convolutions and products are the user's
        found += library
    assert found or pruned  # unpruned, the scan multiplies the two Linear layers' maps


@pytest.mark.parametrize(
    "precision,expected",
    [
        ("default", (lax.Precision.DEFAULT,) * 2),
        (lax.Precision.HIGH, (lax.Precision.HIGH,) * 2),
        ("F32_F32_F32", lax.DotAlgorithmPreset.F32_F32_F32),
        (None, HIGHEST),
    ],
)
def test_the_option_reaches_every_library_product(precision, expected):
    loss, params, xs = loss_of("dense")
    grad = bppsa.grad(loss, method=bppsa.Blelloch(), forward="newton", precision=precision)
    library, _ = check(grad, params, xs, expected=expected)
    assert library
    if precision is None:
        return
    # a scan's own argument wins over the enclosing bppsa.grad's
    loss, params, xs = loss_of("dense", method=bppsa.Chunked(), precision=precision)
    outer = "highest" if precision == "default" else "default"
    check(bppsa.grad(loss, precision=outer), params, xs, expected=expected)


def test_the_users_cell_keeps_its_own_precision():
    """The cell's products keep what the user's code and JAX's default give them, in the
    forward, the Jacobians and the parameter VJP, whatever the library's precision."""
    loss, params, xs = loss_of("dense")
    for precision in ("highest", "default"):
        _, cell = check(bppsa.grad(loss, method=bppsa.Blelloch(), precision=precision), params, xs,
                        expected=_precision.canonical(precision))  # fmt: skip
        assert cell and all(p is None for p in cell)
    with jax.default_matmul_precision("bfloat16"):
        _, cell = check(bppsa.grad(loss, method=bppsa.Blelloch()), params, xs)
    assert cell and all(p == (lax.Precision.DEFAULT,) * 2 for p in cell)


def test_a_library_product_without_the_precision_fails_the_check(monkeypatch):
    """A planted product that forgets the precision (the library's helpers asked for none) is
    caught: the check is not vacuous."""
    monkeypatch.setattr(_precision, "current", lambda: None)
    loss, params, xs = loss_of("rnn")
    with pytest.raises(AssertionError, match="library products not at"):
        check(bppsa.grad(loss, method=bppsa.Blelloch()), params, xs)


@pytest.mark.parametrize(
    "bad,error", [("fast", ValueError), ("F99", ValueError), (3, TypeError), (("high",), TypeError)]
)
def test_a_bad_precision_is_refused_naming_the_argument(bad, error):
    with pytest.raises(error, match="precision must be"):
        bppsa.grad(lambda w: w, precision=bad)
    with pytest.raises(error, match="precision must be"):
        bppsa.scan(lambda h, x: (h, None), 0.0, jnp.ones(3), precision=bad)


def test_gradients_at_every_precision_agree_on_a_cpu(dtype):
    """On a CPU float32 products run at full precision whatever they say: the option changes
    the program's annotations, not its values."""
    loss, params, xs = loss_of("gru")
    params, xs = jax.tree.map(lambda a: a.astype(dtype), (params, xs))
    reference = bppsa.grad(loss, method=bppsa.Blelloch())(params, xs)
    for precision in ("default", "high"):
        other = bppsa.grad(loss, method=bppsa.Blelloch(), precision=precision)(params, xs)
        for a, b in zip(jax.tree.leaves(other), jax.tree.leaves(reference), strict=True):
            assert jnp.array_equal(a, b)
