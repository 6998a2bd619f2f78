"""Property-based tests of the public API (hypothesis).

Over carries and inputs of any pytree structure, shapes, float32 and float64, integer leaves,
lengths 0 to 9, ``reverse`` and every method, ``bppsa.scan`` and ``bppsa.grad`` give what
``jax.lax.scan`` and ``jax.grad`` give (tolerances of ``tests/helpers.py``); arguments that
``jax.lax.scan`` cannot scan raise a ``ValueError`` or ``TypeError`` from ``bppsa.scan``, never
an internal error or a silently different answer. Examples are drawn deterministically
(``derandomize``) so that the default suite is reproducible.
"""

import contextlib
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import bppsa
from bppsa.models import GRU, LSTM, RNN
from tests.helpers import assert_trees_close

SETTINGS = settings(
    max_examples=12,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)
METHODS = st.sampled_from(
    [
        bppsa.Blelloch(),
        bppsa.Chunked(),
        bppsa.Chunked(2),
        bppsa.Chunked(3, block=4),
        bppsa.Chunked(1, block=2),
        bppsa.Sequential(jacobians=True),
        bppsa.Sequential(),
        "auto",
        "blelloch",
    ]
)
LENGTHS = st.integers(0, 9)
LEAF_SHAPES = st.sampled_from([(), (1,), (3,), (2, 2), (0,)])


def precision(name):
    """float64 with x64 enabled for the example only."""
    return jax.enable_x64(True) if name == "float64" else contextlib.nullcontext()


@st.composite
def pytree_problems(draw):
    """A scan over a random carry pytree (float leaves, maybe an int counter), random ``xs``
    (or none, with ``length``), random outputs, and the weights the loss is differentiated in."""
    floats = draw(st.lists(LEAF_SHAPES, min_size=1, max_size=3))
    x_shapes = draw(st.lists(st.sampled_from([(), (2,)]), min_size=0, max_size=2))
    return dict(
        floats=floats,
        counter=draw(st.booleans()),
        nest=draw(st.sampled_from(["tuple", "dict", "nested"])),
        x_shapes=x_shapes,
        outputs=draw(st.sampled_from(["none", "sum", "pytree"])),
        length=draw(LENGTHS),
        reverse=draw(st.booleans()),
        method=draw(METHODS),
        dtype=draw(st.sampled_from(["float32", "float64"])),
        check_finite=draw(st.booleans()),
        seed=draw(st.integers(0, 2**16)),
    )


def build(problem):
    """``(loss(scan, weights, init_floats, xs), weights, init_floats, xs)``."""
    dtype = jnp.dtype(problem["dtype"])
    keys = iter(jax.random.split(jax.random.key(problem["seed"]), 8))
    n = len(problem["floats"])
    weights = jax.random.normal(next(keys), (2, n), dtype)
    floats = [jax.random.normal(next(keys), s, dtype) for s in problem["floats"]]
    length = problem["length"]
    xs = [jax.random.normal(next(keys), (length, *s), dtype) for s in problem["x_shapes"]]
    xs = {f"x{i}": x for i, x in enumerate(xs)} or None

    def pack(leaves, counter):
        if problem["nest"] == "tuple":
            carry = tuple(leaves)
        elif problem["nest"] == "dict":
            carry = {f"c{i}": leaf for i, leaf in enumerate(leaves)}
        else:
            carry = {"first": leaves[0], "rest": [tuple(leaves[1:])]}
        return (carry, counter) if problem["counter"] else carry

    def unpack(carry):
        counter = None
        if problem["counter"]:
            carry, counter = carry
        return jax.tree.leaves(carry), counter

    def loss(scan, weights, floats, xs):
        def body(carry, x):
            leaves, counter = unpack(carry)
            total = sum(jnp.mean(leaf) if leaf.size else 0.0 for leaf in leaves)
            drive = sum((jnp.mean(v) for v in jax.tree.leaves(x)), 0.0)
            new = [
                jnp.tanh(weights[0, i] * leaf + 0.3 * total + drive + weights[1, i])
                for i, leaf in enumerate(leaves)
            ]
            if counter is not None:
                drive = drive + 0.1 * counter
                counter = counter + 1
            if problem["outputs"] == "none":
                y = None
            elif problem["outputs"] == "sum":
                y = total * drive
            else:
                y = {"first": new[0] * drive, "count": counter}
            return pack(new, counter), y

        init = pack(floats, jnp.int32(0))
        carry, ys = scan(body, init, xs, length=length, reverse=problem["reverse"])
        leaves, _ = unpack(carry)
        out = sum(jnp.sum(leaf**2) for leaf in leaves)
        out += sum(
            jnp.sum(y**2) for y in jax.tree.leaves(ys) if jnp.issubdtype(y.dtype, jnp.inexact)
        )
        return out

    return loss, weights, floats, xs


def scan_with(method, check_finite=None):
    return functools.partial(bppsa.scan, method=method, check_finite=check_finite)


def _problem(**changes):
    return (
        dict(
            floats=[(3,), ()],
            counter=True,
            nest="nested",
            x_shapes=[(2,)],
            outputs="pytree",
            length=1,
            reverse=True,
            method=bppsa.Chunked(3, block=4),
            dtype="float32",
            check_finite=True,
            seed=0,
        )
        | changes
    )


@SETTINGS
@given(pytree_problems())
@example(_problem())  # length 1, and the time-blocked paths below
@example(_problem(length=9, method=bppsa.Chunked(3, block=4), nest="dict"))
@example(_problem(length=7, method=bppsa.Chunked(1, block=2), reverse=False, dtype="float64"))
@example(_problem(length=0, method=bppsa.Chunked(1, block=2), x_shapes=[], floats=[(0,), ()]))
@example(_problem(floats=[(0,)], method=bppsa.Blelloch(), outputs="sum"))  # an empty carry
def test_pytrees_lengths_reverse_and_methods_match_lax_scan(problem):
    with precision(problem["dtype"]):
        loss, weights, floats, xs = build(problem)
        dtype = weights.dtype
        args = (weights, floats, xs)
        argnums = (0, 1, 2) if xs is not None else (0, 1)
        expected = jax.jit(
            jax.value_and_grad(functools.partial(loss, jax.lax.scan), argnums=argnums)
        )(*args)
        actual = jax.jit(
            bppsa.value_and_grad(
                functools.partial(loss, scan_with(problem["method"], problem["check_finite"])),
                argnums=argnums,
            )
        )(*args)
        assert_trees_close(actual, expected, dtype)


CELLS = st.sampled_from([RNN(), RNN("relu"), GRU(), LSTM()])


@SETTINGS
@given(
    cell=CELLS,
    hidden=st.integers(1, 5),
    inputs=st.integers(1, 3),
    batch=st.sampled_from([(), (2,)]),
    length=LENGTHS,
    reverse=st.booleans(),
    where=st.sampled_from(["last", "every"]),
    method=METHODS,
    dtype=st.sampled_from(["float32", "float64"]),
)
def test_cells_with_analytic_jacobians_match_lax_scan(
    cell, hidden, inputs, batch, length, reverse, where, method, dtype
):
    """The cells of bppsa.models (analytic Jacobians), on one example or with batch dims in
    the carry, differentiated in parameters, inputs and initial state."""
    with precision(dtype):
        params = cell.init(inputs, hidden, key=jax.random.key(hidden), dtype=dtype)
        xs = jax.random.normal(jax.random.key(length), (length, *batch, inputs), dtype)
        init = jax.tree.map(
            lambda s: jnp.broadcast_to(0.1 * jnp.arange(hidden, dtype=dtype), (*batch, hidden)),
            cell.initial_state(hidden, dtype),
        )

        def loss(scan, params, xs, init):
            def body(state, x):
                state = cell(params, state, x)
                return state, jnp.sum(cell.output(state) ** 2)

            state, ys = scan(body, init, xs, reverse=reverse)
            return jnp.sum(cell.output(state)) if where == "last" else jnp.sum(ys)

        expected = jax.jit(jax.grad(functools.partial(loss, jax.lax.scan), argnums=(0, 1, 2)))(
            params, xs, init
        )
        actual = jax.jit(bppsa.grad(functools.partial(loss, scan_with(method)), argnums=(0, 1, 2)))(
            params, xs, init
        )
        assert_trees_close(actual, expected, jnp.dtype(dtype))


def _body(h, x):
    return jnp.tanh(h + x), h


BAD_CALLS = {
    "xs of different lengths": lambda n: dict(xs=(jnp.ones((n, 3)), jnp.ones((n + 1, 3)))),
    "length disagrees": lambda n: dict(xs=jnp.ones((n, 3)), length=n + 2),
    "no xs, no length": lambda n: dict(xs=None),
    "negative length": lambda n: dict(xs=None, length=-n - 1),
    "fractional length": lambda n: dict(xs=None, length=n + 0.5),
    "xs without a leading axis": lambda n: dict(xs=jnp.float32(n)),
    "xs of python numbers": lambda n: dict(xs=[float(n), 1.0]),
    "init of strings": lambda n: dict(init="h" * (n + 1)),
    "carry changes shape": lambda n: dict(f=lambda h, x: (jnp.concatenate([h, x]), h)),
    "carry changes dtype": lambda n: dict(f=lambda h, x: (h.astype(jnp.int32), h)),
    "body returns one value": lambda n: dict(f=lambda h, x: h + x),
    "body returns three values": lambda n: dict(f=lambda h, x: (h, h, x)),
    "body not callable": lambda n: dict(f=n),
    "unknown method name": lambda n: dict(method="parallel" * (n + 1)),
    "method of the wrong type": lambda n: dict(method=n),
    "complex carry, parallel method": lambda n: dict(
        init=jnp.ones(3, jnp.complex64), method="blelloch"
    ),
    "memory limit of the wrong type": lambda n: dict(memory_limit=str(n)),
    "memory limit not positive": lambda n: dict(memory_limit=-n),
    "check_finite not a bool": lambda n: dict(check_finite=n),
}


def call(bad, n):
    kwargs = dict(f=_body, init=jnp.zeros(3), xs=jnp.ones((n, 3))) | BAD_CALLS[bad](n)
    return bppsa.scan(kwargs.pop("f"), kwargs.pop("init"), kwargs.pop("xs"), **kwargs)


def call_at(bad, n, h):
    """``call`` with the carry derived from ``h`` (a differentiated input) where it can be."""
    kwargs = dict(f=_body, init=h, xs=jnp.ones((n, 3))) | BAD_CALLS[bad](n)
    if isinstance(kwargs["init"], jax.Array) and kwargs["init"] is not h:
        kwargs["init"] = kwargs["init"] + h.astype(kwargs["init"].dtype)
    return bppsa.scan(kwargs.pop("f"), kwargs.pop("init"), kwargs.pop("xs"), **kwargs)


@pytest.mark.parametrize("bad", sorted(BAD_CALLS))
@settings(max_examples=3, deadline=None, derandomize=True, database=None)
@given(n=st.integers(0, 5), under_grad=st.booleans())
def test_arguments_lax_scan_cannot_scan_raise_clear_errors(bad, n, under_grad):
    with pytest.raises((TypeError, ValueError)) as info:
        if under_grad:  # the same kind of error when the scan is differentiated
            jax.grad(lambda h: jnp.sum(call_at(bad, n, h)[0]).real)(jnp.zeros(3))
        else:
            call(bad, n)
    error = info.value
    assert type(error) in (TypeError, ValueError) or type(error).__module__.startswith("jax")
    assert str(error)


def test_complex_carry_uses_back_propagation_automatically():
    def loss(scan, w):
        h, _ = scan(lambda h, x: (jnp.tanh(w * h + x), None), jnp.ones(3, jnp.complex64), XS)
        return jnp.abs(h).sum()

    XS = jnp.linspace(0, 1, 15).reshape(5, 3)
    actual = bppsa.grad(functools.partial(loss, bppsa.scan))(0.5)
    expected = jax.grad(functools.partial(loss, jax.lax.scan))(0.5)
    assert_trees_close(actual, expected, jnp.float32)


@pytest.mark.parametrize("bad", [0, -1, 2.5, True])
def test_chunked_options_must_be_positive_ints(bad):
    with pytest.raises(ValueError, match="must be a positive int"):
        bppsa.Chunked(bad)
    with pytest.raises(ValueError, match="must be a positive int"):
        bppsa.Chunked(block=bad)


def test_numeric_lengths_and_arrays_like_lax_scan():
    """Integer-valued numpy and JAX scalars are valid lengths, as in lax.scan."""
    for length in (np.int64(3), jnp.int32(3), 3):
        actual = bppsa.scan(lambda h, _: (h + 1.0, h), jnp.zeros(2), None, length=length)
        expected = jax.lax.scan(lambda h, _: (h + 1.0, h), jnp.zeros(2), None, length=3)
        assert_trees_close(actual, expected, jnp.float32)
    assert math.isclose(float(bppsa.scan(lambda h, x: (h + x, h), 0.0, np.ones(4))[0]), 4.0)
