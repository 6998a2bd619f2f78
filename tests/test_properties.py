"""Property-based tests of the public API (hypothesis).

Over carries and inputs of any pytree structure, shapes, float32 and float64, integer leaves,
lengths 0 to 9, ``reverse`` and every method, ``bppsa.scan`` and ``bppsa.grad`` give what
``jax.lax.scan`` and ``jax.grad`` give (tolerances of ``tests/helpers.py``); arguments that
``jax.lax.scan`` cannot scan raise bppsa's own ``ValueError`` or ``TypeError``, with the same
message under ``jax.grad``, never an internal error or a silently different answer.

Every method of ``METHOD_LIST`` is a test case of its own, with lengths 2 to 9 (a parallel scan
has something to combine); lengths 0 and 1 have tests of their own, the methods drawn. Where a
float32 draw is so ill-conditioned that back-propagation itself is off the float64 gradient by
more than the float32 tolerance, BPPSA must be within 2x of back-propagation's own error there
(see ``tests.helpers.assert_close_to_back_propagation``; no draw is rejected). Examples are drawn
deterministically (``derandomize``) so that the default suite is reproducible.
"""

import contextlib
import functools
import math
import re
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import bppsa
from bppsa.models import GRU, LSTM, RNN
from tests.helpers import (
    assert_close_to_back_propagation,
    assert_trees_close,
    derandomized,
    distinct_state,
    marked_slow,
)

METHOD_LIST = [
    bppsa.Blelloch(),
    bppsa.Chunked(),
    bppsa.Chunked(2),
    bppsa.Blocked(bppsa.Chunked(3), 4),
    bppsa.Blocked(bppsa.Chunked(1), 2),
    bppsa.SequentialScan(),
    bppsa.Sequential(),
    "auto",
    "blelloch",
]
METHODS = st.sampled_from(METHOD_LIST)
# The per-method properties run in the default suite for one method of each kind; the variants
# (another chunk count or block, the name of a method beside the method) only with -m slow.
SLOW_VARIANTS = (bppsa.Chunked(2), bppsa.Blocked(bppsa.Chunked(1), 2), "blelloch")
PER_METHOD_LIST = [
    *(m for m in METHOD_LIST if m not in SLOW_VARIANTS),
    *marked_slow(*SLOW_VARIANTS),
]
LENGTHS = st.integers(2, 9)
SHORT_LENGTHS = st.integers(0, 1)
LEAF_SHAPES = st.sampled_from([(), (1,), (3,), (2, 2), (0,)])


PER_METHOD = derandomized(5)  # x 9 methods, per property
SHORT = derandomized(10)


def precision(name):
    """float64 with x64 enabled for the example only."""
    return jax.enable_x64(True) if name == "float64" else contextlib.nullcontext()


@st.composite
def pytree_problems(draw, lengths):
    """A scan over a random carry pytree (float leaves, maybe an int counter), random ``xs``
    (or none, with ``length``), random outputs, and the weights the loss is differentiated in;
    the method is the caller's."""
    floats = draw(st.lists(LEAF_SHAPES, min_size=1, max_size=3))
    x_shapes = draw(st.lists(st.sampled_from([(), (2,)]), min_size=0, max_size=2))
    return dict(
        floats=floats,
        counter=draw(st.booleans()),
        nest=draw(st.sampled_from(["tuple", "dict", "nested"])),
        x_shapes=x_shapes,
        outputs=draw(st.sampled_from(["none", "sum", "pytree"])),
        length=draw(lengths),
        reverse=draw(st.booleans()),
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


def check_pytree_problem(problem):
    """``bppsa.value_and_grad`` through ``bppsa.scan`` against ``jax.value_and_grad`` through
    ``jax.lax.scan``, jitted, in the weights, the initial carry and ``xs``."""
    with precision(problem["dtype"]):
        loss, weights, floats, xs = build(problem)
        dtype = weights.dtype
        args = (weights, floats, xs)
        argnums = (0, 1, 2) if xs is not None else (0, 1)
        back_propagation = jax.value_and_grad(functools.partial(loss, jax.lax.scan), argnums)
        expected = jax.jit(back_propagation)(*args)
        actual = jax.jit(
            bppsa.value_and_grad(
                functools.partial(loss, scan_with(problem["method"], problem["check_finite"])),
                argnums=argnums,
            )
        )(*args)
        assert_close_to_back_propagation(actual, expected, dtype, back_propagation, args)


@pytest.mark.parametrize("method", PER_METHOD_LIST, ids=repr)
@PER_METHOD
@given(problem=pytree_problems(LENGTHS))
def test_pytrees_lengths_reverse_and_methods_match_lax_scan(method, problem):
    check_pytree_problem(problem | dict(method=method))


@SHORT
@given(problem=pytree_problems(SHORT_LENGTHS), method=METHODS)
def test_pytrees_of_zero_or_one_step_match_lax_scan(problem, method):
    check_pytree_problem(problem | dict(method=method))


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
            method=bppsa.Blocked(bppsa.Chunked(3), 4),
            dtype="float32",
            check_finite=True,
            seed=0,
        )
        | changes
    )


@pytest.mark.parametrize(
    "problem",
    [
        _problem(),  # length 1, and the time-blocked paths below
        _problem(length=9, method=bppsa.Blocked(bppsa.Chunked(3), 4), nest="dict"),
        _problem(
            length=7, method=bppsa.Blocked(bppsa.Chunked(1), 2), reverse=False, dtype="float64"
        ),
        _problem(
            length=0, method=bppsa.Blocked(bppsa.Chunked(1), 2), x_shapes=[], floats=[(0,), ()]
        ),
        _problem(floats=[(0,)], method=bppsa.Blelloch(), outputs="sum"),  # an empty carry
    ],
    ids=["length 1", "partial last block", "blocks of 2", "length 0", "empty carry"],
)
def test_pytree_examples_match_lax_scan(problem):
    check_pytree_problem(problem)


@st.composite
def cell_problems(draw, lengths):
    """A cell of bppsa.models (analytic Jacobians), its sizes, on one example or with batch
    dims in the carry, and where the loss reads the states; the method is the caller's."""
    return dict(
        cell=draw(st.sampled_from([RNN(), RNN("relu"), GRU(), LSTM()])),
        hidden=draw(st.integers(1, 5)),
        inputs=draw(st.integers(1, 3)),
        batch=draw(st.sampled_from([(), (2,)])),
        length=draw(lengths),
        reverse=draw(st.booleans()),
        where=draw(st.sampled_from(["last", "every"])),
        dtype=draw(st.sampled_from(["float32", "float64"])),
    )


def check_cell_problem(cell, hidden, inputs, batch, length, reverse, where, method, dtype):
    """``bppsa.grad`` against ``jax.grad`` through ``jax.lax.scan``, jitted, in the
    parameters, the inputs and the initial state."""
    with precision(dtype):
        params = cell.init(inputs, hidden, key=jax.random.key(hidden), dtype=dtype)
        xs = jax.random.normal(jax.random.key(length), (length, *batch, inputs), dtype)
        # Seeded and distinct per leaf: a swap of the LSTM's h and c must change the result.
        init = distinct_state(cell.initial_state(hidden, dtype), jax.random.key(7), batch)

        def loss(scan, params, xs, init):
            def body(state, x):
                state = cell(params, state, x)
                return state, jnp.sum(cell.output(state) ** 2)

            state, ys = scan(body, init, xs, reverse=reverse)
            return jnp.sum(cell.output(state)) if where == "last" else jnp.sum(ys)

        back_propagation = jax.grad(functools.partial(loss, jax.lax.scan), argnums=(0, 1, 2))
        expected = jax.jit(back_propagation)(params, xs, init)
        actual = jax.jit(bppsa.grad(functools.partial(loss, scan_with(method)), argnums=(0, 1, 2)))(
            params, xs, init
        )
        args = (params, xs, init)
        assert_close_to_back_propagation(actual, expected, dtype, back_propagation, args)


@pytest.mark.parametrize("method", PER_METHOD_LIST, ids=repr)
@PER_METHOD
@given(problem=cell_problems(LENGTHS))
def test_cells_with_analytic_jacobians_match_lax_scan(method, problem):
    check_cell_problem(**problem, method=method)


@SHORT
@given(problem=cell_problems(SHORT_LENGTHS), method=METHODS)
def test_cells_over_zero_or_one_step_match_lax_scan(problem, method):
    check_cell_problem(**problem, method=method)


def _body(h, x):
    return jnp.tanh(h + x), h


class Bad(NamedTuple):
    """Arguments of ``bppsa.scan`` (a function of ``n``) and the error it must raise: its
    type exactly, and a regex of bppsa's message (lax.scan's own, prefixed "bppsa.scan: ")."""

    arguments: Callable[[int], dict]
    error: type[Exception]
    message: str


PAIR = r"^bppsa\.scan: scan body output must be a pair, got "
CARRY_TYPES = r"(?s)^bppsa\.scan: scan body function carry input and carry output must have equal"
NOT_ARRAY = r"^bppsa\.scan: every leaf of (init|xs) must be an array or a number, got a "
NO_AXIS = r"^bppsa\.scan: every leaf of xs needs a leading axis to scan over, got a scalar of "
BAD_CALLS = {
    "xs of different lengths": Bad(
        lambda n: dict(xs=(jnp.ones((n, 3)), jnp.ones((n + 1, 3)))),
        ValueError,
        r"^bppsa\.scan: scan got values with different leading axis sizes: \d+, \d+\.$",
    ),
    "length disagrees": Bad(
        lambda n: dict(xs=jnp.ones((n, 3)), length=n + 2),
        ValueError,
        r"^bppsa\.scan: scan got `length` argument of \d+ which disagrees with leading axis "
        r"sizes \[\d+\]\.$",
    ),
    "no xs, no length": Bad(
        lambda n: dict(xs=None),
        ValueError,
        r"^bppsa\.scan: scan got no values to scan over and `length` not provided\.$",
    ),
    "negative length": Bad(
        lambda n: dict(xs=None, length=-n - 1),
        ValueError,
        r"^bppsa\.scan: length must be >= 0, got -\d+\.$",
    ),
    "fractional length": Bad(
        lambda n: dict(xs=None, length=n + 0.5),
        TypeError,
        r"^bppsa\.scan: length must be an int, got float: \d+\.5\.$",
    ),
    "xs without a leading axis": Bad(
        lambda n: dict(xs=jnp.float32(n)), ValueError, NO_AXIS + r"shape \(\): Array\("
    ),
    "xs of python numbers": Bad(
        lambda n: dict(xs=[float(n), 1.0]), ValueError, NO_AXIS + r"shape \(\): \d+\.0\.$"
    ),
    "init of strings": Bad(
        lambda n: dict(init="h" * (n + 1)), TypeError, NOT_ARRAY + r"str: 'h+'\.$"
    ),
    "carry changes shape": Bad(
        lambda n: dict(f=lambda h, x: (jnp.concatenate([h, x]), h)),
        TypeError,
        CARRY_TYPES + r".*float32\[3\].*float32\[6\], so the shapes do not match",
    ),
    "carry changes dtype": Bad(
        lambda n: dict(f=lambda h, x: (h.astype(jnp.int32), h)),
        TypeError,
        CARRY_TYPES + r".*float32\[3\].*int32\[3\], so the dtypes do not match",
    ),
    "body returns one value": Bad(
        lambda n: dict(f=lambda h, x: h + x), TypeError, PAIR + r"float32\[3\]\.$"
    ),
    "body returns three values": Bad(
        lambda n: dict(f=lambda h, x: (h, h, x)), TypeError, PAIR + r"\(.*,.*,.*\)\.$"
    ),
    "body not callable": Bad(
        lambda n: dict(f=n),
        TypeError,
        r"^bppsa\.scan: f argument should be a callable, got int\.$",
    ),
    "unknown method name": Bad(
        lambda n: dict(method="parallel" * (n + 1)),
        ValueError,
        r"method='(parallel)+' is not a known backward method; expected one of .*'blelloch'",
    ),
    "method of the wrong type": Bad(
        lambda n: dict(method=n),
        TypeError,
        r"method must be a method object \(e\.g\. bppsa\.Blelloch\(\)\) or one of .*; got int\.$",
    ),
    "complex carry, parallel method": Bad(
        lambda n: dict(init=jnp.ones(3, jnp.complex64), method="blelloch"),
        TypeError,
        r"^bppsa\.scan: the carry has complex leaves \(complex64\[3\]\), which the backward "
        r"method Blelloch\(\) does not support",
    ),
    "memory limit of the wrong type": Bad(
        lambda n: dict(memory_limit=str(n)),
        TypeError,
        r"memory_limit must be a number of bytes, 'available' or None \(.*\), got str\.$",
    ),
    "memory limit not positive": Bad(
        lambda n: dict(memory_limit=-n),
        ValueError,
        r"memory_limit must be positive \(math\.inf turns the check off\), got -?\d+\.$",
    ),
    "check_finite not a bool": Bad(
        lambda n: dict(check_finite=n), TypeError, r"check_finite must be a bool, got int\.$"
    ),
}


def call(bad, n):
    kwargs = dict(f=_body, init=jnp.zeros(3), xs=jnp.ones((n, 3))) | BAD_CALLS[bad].arguments(n)
    return bppsa.scan(kwargs.pop("f"), kwargs.pop("init"), kwargs.pop("xs"), **kwargs)


def call_at(bad, n, h):
    """``call`` with the carry derived from ``h`` (a differentiated input) where it can be."""
    kwargs = dict(f=_body, init=h, xs=jnp.ones((n, 3))) | BAD_CALLS[bad].arguments(n)
    if isinstance(kwargs["init"], jax.Array) and kwargs["init"] is not h:
        kwargs["init"] = kwargs["init"] + h.astype(kwargs["init"].dtype)
    return bppsa.scan(kwargs.pop("f"), kwargs.pop("init"), kwargs.pop("xs"), **kwargs)


@pytest.mark.parametrize("under_grad", [False, True], ids=["direct", "under grad"])
@pytest.mark.parametrize("bad", sorted(BAD_CALLS))
@settings(max_examples=3, deadline=None, derandomize=True, database=None)
@given(n=st.integers(0, 5))
def test_arguments_lax_scan_cannot_scan_raise_clear_errors(bad, under_grad, n):
    expected = BAD_CALLS[bad]
    with pytest.raises(expected.error) as info:
        if under_grad:  # the same error when the scan is differentiated
            jax.grad(lambda h: jnp.sum(call_at(bad, n, h)[0]).real)(jnp.zeros(3))
        else:
            call(bad, n)
    error = info.value
    assert type(error) is expected.error, repr(error)
    assert re.search(expected.message, str(error)), str(error)


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
    with pytest.raises(ValueError, match="chunks must be a positive int"):
        bppsa.Chunked(bad)
    with pytest.raises(ValueError, match="block must be a positive int"):
        bppsa.Blocked(bppsa.Chunked(), bad)


def test_numeric_lengths_and_arrays_like_lax_scan():
    """Integer-valued numpy and JAX scalars are valid lengths, as in lax.scan."""
    for length in (np.int64(3), jnp.int32(3), 3):
        actual = bppsa.scan(lambda h, _: (h + 1.0, h), jnp.zeros(2), None, length=length)
        expected = jax.lax.scan(lambda h, _: (h + 1.0, h), jnp.zeros(2), None, length=3)
        assert_trees_close(actual, expected, jnp.float32)
    assert math.isclose(float(bppsa.scan(lambda h, x: (h + x, h), 0.0, np.ones(4))[0]), 4.0)
