"""A generative test of the structure analysis: random step bodies from what users write.

Every body is a few operations drawn from a zoo (elementwise maps, reductions, cumulative ops and
sorts, reversals, slices and concatenations, splits, stacks, pads, reshapes and transposes,
``cond`` / ``select`` / ``switch`` with branches of different structure, loops, ``dot`` with
block, diagonal and dense weights, gathers, nested ``jax.jit`` with one or several outputs,
``custom_jvp`` functions, dynamic slices), applied to the packed float leaves of a pytree carry.
For each body:

* the dependencies found (:func:`carry_dependencies`) must hold every nonzero of the true
  Jacobian (``jax.jacfwd``, at four points whose inputs take both sides of every branch), and
  the blocks (:func:`classify`) must hold every dependency: a structure may be coarser than the
  truth, never finer;
* for a sample of bodies, ``bppsa.scan``'s gradient (Blelloch, over the structure found) must
  equal ``lax.scan``'s in float64.

Examples are drawn deterministically (``derandomize``): the test cannot fail by chance. The
``slow`` variants draw many more. Each operation class is also an explicit example, so that the
default suite always meets it (a rule broken for it fails here).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, example, given
from hypothesis import strategies as st
from jax import lax

import bppsa
from bppsa.scan._core.carry import Layout
from bppsa.scan._core.structure import carry_dependencies, classify
from tests.helpers import derandomized

N = 12  # the packed carry (divisible by 2, 3, 4 and 6 for the reshapes)


@jax.custom_jvp
def soft_clip(v):
    return v / (1.0 + jnp.abs(v))


@soft_clip.defjvp
def _soft_clip_jvp(primals, tangents):
    (v,), (dv,) = primals, tangents
    return soft_clip(v), dv / (1.0 + jnp.abs(v)) ** 2


def _grid(v, rows):
    return v.reshape(rows, N // rows)


def _flip(v):
    return v[::-1]


def _row_sum(v):
    g = _grid(v, 3)
    return (g + 0.1 * g.sum(1, keepdims=True)).reshape(-1)


# name -> op(v, x, w): v and x of shape (N,), w a dict of constant weights; returns (N,).
OPS = {
    "tanh": lambda v, x, w: jnp.tanh(v + x),
    "scale": lambda v, x, w: w["d"] * v,
    "square": lambda v, x, w: v + 0.1 * v * v,
    "sum_all": lambda v, x, w: v + 0.1 * jnp.sum(v),
    "row_sum": lambda v, x, w: _row_sum(v),
    "column_max": lambda v, x, w: (_grid(v, 3) + 0.1 * _grid(v, 3).max(0)).reshape(-1),
    "cumsum": lambda v, x, w: 0.3 * jnp.cumsum(_grid(v, 3), axis=1).reshape(-1),
    "cumsum_reverse": lambda v, x, w: 0.3 * lax.cumsum(_grid(v, 4), axis=0, reverse=True).ravel(),
    "cumprod": lambda v, x, w: jnp.cumprod(0.9 + 0.1 * jnp.tanh(_grid(v, 4)), axis=0).ravel(),
    "cummax": lambda v, x, w: lax.cummax(_grid(v, 2), axis=1).reshape(-1),
    "sort": lambda v, x, w: jnp.sort(_grid(v, 2), axis=1).reshape(-1),
    "flip": lambda v, x, w: _flip(v),
    "rev_axis": lambda v, x, w: lax.rev(_grid(v, 3), (0,)).reshape(-1),
    "roll": lambda v, x, w: jnp.roll(v, 3),
    "split_swap": lambda v, x, w: (lambda a, b: jnp.concatenate([0.5 * b, jnp.tanh(a)]))(
        *jnp.split(v, [4])
    ),
    "split_three": lambda v, x, w: (lambda a, b, c: jnp.concatenate([c, a * b, b]))(
        *jnp.split(v, 3)
    ),
    "stack": lambda v, x, w: jnp.stack([v[: N // 2], v[N // 2 :]], axis=1).reshape(-1),
    "pad": lambda v, x, w: 0.5 * v + jnp.pad(v[2:], (0, 2)),
    "transpose": lambda v, x, w: _grid(v, 3).T.reshape(-1),
    "cond": lambda v, x, w: lax.cond(x[0] > 0, jnp.tanh, _flip, v),
    "cond_swapped": lambda v, x, w: lax.cond(x[0] > 0, _flip, jnp.tanh, v),
    "select": lambda v, x, w: jnp.where(x > 0, v, jnp.roll(v, 1)),
    "switch": lambda v, x, w: lax.switch(
        (x[1] > 0).astype(jnp.int32) + (x[2] > 0).astype(jnp.int32), [jnp.sin, _flip, _row_sum], v
    ),
    "fori": lambda v, x, w: lax.fori_loop(0, 2, lambda i, u: 0.9 * jnp.tanh(u), v),
    "while": lambda v, x, w: lax.while_loop(
        lambda c: c[0] < 2, lambda c: (c[0] + 1, jnp.sin(c[1])), (0, v)
    )[1],
    "dot_block": lambda v, x, w: jnp.einsum("bij,bj->bi", w["blocks"], _grid(v, 3)).ravel(),
    "dot_block_left": lambda v, x, w: jnp.einsum("bj,bij->bi", _grid(v, 3), w["blocks"]).ravel(),
    "dot_diagonal": lambda v, x, w: jnp.diag(w["d"]) @ v,
    "dot_dense": lambda v, x, w: w["dense"] @ v,
    "gather": lambda v, x, w: v[w["perm"]],
    "jit": lambda v, x, w: jax.jit(lambda u: 2.0 * jnp.sin(u))(v),
    "jit_two_outputs": lambda v, x, w: (lambda a, b: a + 0.5 * b)(
        *jax.jit(lambda u: (0.5 * u, _flip(u)))(v)
    ),
    "custom_jvp": lambda v, x, w: soft_clip(2.0 * v),
    "dynamic_slice": lambda v, x, w: jnp.concatenate([lax.dynamic_slice(v, (2,), (10,)), v[:2]]),
    "dynamic_slice_at_x": lambda v, x, w: jnp.concatenate(
        [lax.dynamic_slice(v, ((x[0] > 0).astype(jnp.int32),), (6,)), v[6:]]
    ),
    "stop_gradient": lambda v, x, w: v + lax.stop_gradient(_flip(v)),
    "random_key": lambda v, x, w: v * jax.random.uniform(jax.random.key(7), v.shape),
    "reshape_dimensions": lambda v, x, w: lax.reshape(_grid(v, 3), (N,), dimensions=(1, 0)),
    "split_columns": lambda v, x, w: jnp.concatenate(
        jnp.split(_grid(v, 3), [1], axis=1)[::-1], axis=1
    ).ravel(),
    "dynamic_slice_clamped": lambda v, x, w: jnp.concatenate(
        [lax.dynamic_slice(v, (10,), (6,)), v[:6]]  # XLA clamps the start to 6
    ),
    "dynamic_slice_at_constant": lambda v, x, w: jnp.concatenate(
        [lax.dynamic_slice(v, (w["start"],), (10,)), v[:2]]  # a closed-over start array
    ),
    "dynamic_update_slice_at_x": lambda v, x, w: lax.dynamic_update_slice(
        v, 2.0 * v[:3], (4 * (x[0] > 0).astype(jnp.int32),)
    ),
    "dynamic_update_slice_columns": lambda v, x, w: (  # pairs (0, 1), (2, 3) of each row
        lambda g: lax.dynamic_update_slice(
            lax.dynamic_update_slice(g, g[:, :1] + g[:, 1:2], (0, 0)), g[:, 2:3] + g[:, 3:], (0, 2)
        ).ravel()
    )(_grid(v, 3)),
    "cumsum_3d": lambda v, x, w: 0.3 * jnp.cumsum(v.reshape(2, 2, 3), axis=2).ravel(),
    "cond_constant": lambda v, x, w: sum(
        lax.cond(x[0] > 0, lambda u: (jnp.tanh(u), jnp.ones(N)), lambda u: (u, jnp.zeros(N)), v)
    ),
    "lower_pairs": lambda v, x, w: (  # only one unit of each pair reads the other
        lambda g: jnp.stack([g[:, 0], g[:, 1] + 0.5 * g[:, 0]], 1).reshape(-1)
    )(_grid(v, 6)),
    "partly_dense": lambda v, x, w: jnp.concatenate(
        [(jnp.concatenate([2.0 * v[:6], v[w["perm"]][6:]]) + v[::-1])[:6], v[6:]]
    ),
}
NAMES = sorted(OPS)


def _weights(seed: int) -> dict:
    keys = jax.random.split(jax.random.key(seed), 3)
    return {
        "d": 0.5 + 0.5 * jax.random.uniform(keys[0], (N,)),
        "blocks": 0.5 * jax.random.normal(keys[1], (3, N // 3, N // 3)),
        "dense": 0.3 * jax.random.normal(keys[2], (N, N)),
        "perm": np.random.default_rng(seed).permutation(N),
        "start": jnp.int32(2),
    }


# Carries: the float leaves hold N elements in all; an int32 leaf (a step counter) is not
# part of the packed carry.
CARRIES = {
    "vector": lambda: jnp.zeros(N),
    "pair": lambda: (jnp.zeros(N // 2), jnp.zeros(N // 2)),
    "dict": lambda: {"grid": jnp.zeros((3, 4)), "count": jnp.zeros((), jnp.int32)},
    "nested": lambda: ((jnp.zeros((2, 3)),), {"h": jnp.zeros(6), "step": jnp.int32(0)}),
}


def _floats(carry) -> list:
    return [leaf for leaf in jax.tree.leaves(carry) if jnp.issubdtype(leaf.dtype, jnp.floating)]


def make_step(ops: tuple[str, ...], seed: int):
    """``step(carry, x, scale) -> carry``: the ops on the packed float leaves, then ``tanh``."""
    return step_of([OPS[name] for name in ops], _weights(seed))


def step_of(functions, w):
    """``step(carry, x, scale) -> carry``: ``functions`` (``f(v, x, w)``, in order) on the
    packed float leaves, then ``tanh``; an integer leaf counts the steps."""

    def step(carry, x, scale):
        leaves, treedef = jax.tree.flatten(carry)
        v = jnp.concatenate([leaf.ravel() for leaf in _floats(carry)])
        for function in functions:
            v = function(v, x, w)
        v = jnp.tanh(v + scale * x)
        out, offset = [], 0
        for leaf in leaves:
            if jnp.issubdtype(leaf.dtype, jnp.floating):
                out.append(v[offset : offset + leaf.size].reshape(leaf.shape))
                offset += leaf.size
            else:
                out.append(leaf + 1)
        return jax.tree.unflatten(treedef, out)

    return step


def _points(carry, count=4):
    """``count`` (carry, x) points; ``x``'s first three entries take both signs."""
    rng = np.random.default_rng(0)
    signs = np.array([[1, 1, 1], [-1, -1, -1], [1, -1, 1], [-1, 1, -1]])[:count]
    points = []
    for s in signs:
        x = rng.normal(size=N)
        x[:3] = s * (0.5 + np.abs(x[:3]))
        c = jax.tree.map(
            lambda a: (
                jnp.asarray(rng.normal(size=a.shape), a.dtype)
                if jnp.issubdtype(a.dtype, jnp.floating)
                else a
            ),
            carry,
        )
        points.append((c, jnp.asarray(x)))
    return points


def true_nonzeros(step, carry) -> np.ndarray:
    """``(N, N)`` bool: where the packed step's Jacobian is nonzero at any of the points."""
    layout = Layout.of(carry, concat_last=False)
    found = np.zeros((N, N), bool)
    for c, x in _points(carry):

        def packed(vector, c=c, x=x):
            return layout.pack(step(layout.unpack_into(vector, c), x, 1.0))

        found |= np.asarray(jax.jacfwd(packed)(layout.pack(c))) != 0
    return found


def assert_structure_holds_the_jacobian(ops, carry_kind, seed):
    step, carry = make_step(ops, seed), CARRIES[carry_kind]()
    return assert_found_structure_holds(step, carry, f"ops {ops} on a {carry_kind} carry")


def assert_found_structure_holds(step, carry, body: str):
    """The dependencies found in ``step`` hold every nonzero of its Jacobian (``jax.jacfwd``,
    custom rules included) and the blocks every dependency; ``body`` names it in failures."""
    nonzero = true_nonzeros(step, carry)
    deps = carry_dependencies(step, carry, jnp.zeros(N), 1.0)
    structure = classify(deps)
    context = f"{body}: {structure.description}"
    if deps.sets is not None:
        allowed = np.zeros((N, N), bool)
        rows, slots = np.nonzero(deps.sets >= 0)
        allowed[rows, deps.sets[rows, slots]] = True
        missed = np.argwhere(nonzero & ~allowed)
        assert missed.size == 0, f"{context}: dependencies miss (out, in) = {missed[:4].tolist()}"
    if structure.kind != "dense":
        members = np.arange(N) if structure.perm is None else np.asarray(structure.perm)
        block_of = np.empty(N, int)
        block_of[members] = np.arange(N) // structure.block
        same = block_of[:, None] == block_of[None, :]
        missed = np.argwhere(nonzero & ~same)
        assert missed.size == 0, f"{context}: blocks miss (out, in) = {missed[:4].tolist()}"
    return structure


def assert_gradients_equal_lax_scan(ops, carry_kind, seed):
    step, init = make_step(ops, seed), CARRIES[carry_kind]()
    init = jax.tree.map(lambda a: a + 0.1 if jnp.issubdtype(a.dtype, jnp.floating) else a, init)
    xs = jax.random.normal(jax.random.key(seed), (5, N))

    def loss(scan, xs, scale, **options):
        carry, ys = scan(lambda c, x: (step(c, x, scale), _floats(c)[0].sum()), init, xs, **options)
        return sum((leaf**2).sum() for leaf in _floats(carry)) + (ys * jnp.arange(5.0)).sum()

    with bppsa.trace_plans() as plans:
        got = bppsa.grad(
            functools.partial(loss, bppsa.scan, method="blelloch"), argnums=(0, 1)
        )(xs, 0.7)  # fmt: skip
    want = jax.grad(functools.partial(loss, lax.scan), argnums=(0, 1))(xs, 0.7)
    for g, r in zip(got, want):
        np.testing.assert_allclose(g, r, rtol=1e-9, atol=1e-12, err_msg=plans[0].jacobians)


OP_LISTS = st.lists(st.sampled_from(NAMES), min_size=1, max_size=4).map(tuple)
# What reverse mode can differentiate at all: JAX refuses a while_loop's (lax.scan's too).
DIFFERENTIABLE = [name for name in NAMES if name != "while"]
GRADIENT_OP_LISTS = st.lists(st.sampled_from(DIFFERENTIABLE), min_size=1, max_size=4).map(tuple)
CARRY_KINDS = st.sampled_from(sorted(CARRIES))
SEEDS = st.integers(0, 3)


def _settings(max_examples):  # the x64 fixture is function-scoped; bodies may draw long lists
    return derandomized(
        max_examples, HealthCheck.data_too_large, HealthCheck.function_scoped_fixture
    )


def _every_op(test):
    """Each op once, alone, as an explicit example (also on the pair carry for the movers)."""
    for name in NAMES:
        test = example(ops=(name,), carry_kind="vector", seed=0)(test)
    for ops in [("flip", "cumsum"), ("cond", "row_sum"), ("split_three", "roll")]:
        test = example(ops=ops, carry_kind="pair", seed=1)(test)
    return test


@_every_op
@_settings(60)
@given(ops=OP_LISTS, carry_kind=CARRY_KINDS, seed=SEEDS)
def test_found_structure_holds_every_nonzero_of_the_jacobian(x64, ops, carry_kind, seed):
    assert_structure_holds_the_jacobian(ops, carry_kind, seed)


@pytest.mark.slow
@_settings(1000)
@given(ops=OP_LISTS, carry_kind=CARRY_KINDS, seed=SEEDS)
def test_found_structure_holds_every_nonzero_many_bodies(x64, ops, carry_kind, seed):
    assert_structure_holds_the_jacobian(ops, carry_kind, seed)


# The movers and branches whose misreading changes gradients (a missed dependency), and a few
# mixes: the gradient check compiles a Blelloch backward per body, so fewer bodies.
GRADIENT_CASES = [
    ("cumsum",),
    ("cumsum_reverse",),
    ("cumprod",),
    ("sort",),
    ("flip",),
    ("rev_axis",),
    ("cond",),
    ("cond_swapped",),
    ("switch",),
    ("split_three",),
    ("jit_two_outputs",),
    ("stack",),
    ("pad", "transpose"),
    ("dot_block", "select"),
    ("custom_jvp", "roll"),
]


@pytest.mark.parametrize("ops", GRADIENT_CASES, ids="-".join)
def test_gradients_over_the_found_structure_equal_lax_scan(x64, ops):
    assert_gradients_equal_lax_scan(ops, "pair", seed=2)


@_settings(6)
@given(ops=GRADIENT_OP_LISTS, carry_kind=CARRY_KINDS, seed=SEEDS)
def test_gradients_of_drawn_bodies_equal_lax_scan(x64, ops, carry_kind, seed):
    assert_gradients_equal_lax_scan(ops, carry_kind, seed)


@pytest.mark.slow
@_settings(100)
@given(ops=GRADIENT_OP_LISTS, carry_kind=CARRY_KINDS, seed=SEEDS)
def test_gradients_of_many_drawn_bodies_equal_lax_scan(x64, ops, carry_kind, seed):
    assert_gradients_equal_lax_scan(ops, carry_kind, seed)


# What each op alone is found to be, on the vector carry: exact, so that a rule made coarser
# (a structure lost to "dense", a block merged) fails here, where the test above, which only asks
# that nothing be missed, would pass. Dense entries name their reason.
EXPECTED = {
    "column_max": "block-diagonal k=3",
    "cond": "block-diagonal k=2",
    "cond_constant": "diagonal",
    "cond_swapped": "block-diagonal k=2",
    "cummax": "block-diagonal k=6",
    "cumprod": "block-diagonal k=4",
    "cumsum": "block-diagonal k=4",
    "cumsum_3d": "block-diagonal k=3",
    "cumsum_reverse": "block-diagonal k=4",
    "custom_jvp": "diagonal",
    "dot_block": "block-diagonal k=4",
    "dot_block_left": "block-diagonal k=4",
    "dot_dense": "dense (all 12 units are coupled)",
    "dot_diagonal": "dense (all 12 units are coupled)",
    "dynamic_slice": "block-diagonal k=6",
    "dynamic_slice_at_constant": "dense (dynamic_slice at a runtime index)",
    "dynamic_slice_at_x": "dense (dynamic_slice at a runtime index)",
    "dynamic_slice_clamped": "block-diagonal k=2",
    "dynamic_update_slice_at_x": "dense (dynamic_update_slice at a runtime index)",
    "dynamic_update_slice_columns": "block-diagonal k=2",
    "flip": "block-diagonal k=2",
    "fori": "dense (unknown primitive scan)",
    "gather": "dense (unknown primitive gather)",
    "jit": "diagonal",
    "jit_two_outputs": "block-diagonal k=2",
    "lower_pairs": "block-diagonal k=2",
    "pad": "block-diagonal k=6",
    "partly_dense": "block-diagonal k=2",
    "random_key": "diagonal",
    "reshape_dimensions": "dense (reshape with parameters not understood)",
    "rev_axis": "dense (blocks of unequal sizes 1 and 2)",
    "roll": "block-diagonal k=4",
    "row_sum": "block-diagonal k=4",
    "scale": "diagonal",
    "select": "dense (all 12 units are coupled)",
    "sort": "block-diagonal k=6",
    "split_columns": "block-diagonal k=4",
    "split_swap": "block-diagonal k=3",
    "split_three": "block-diagonal k=3",
    "square": "diagonal",
    "stack": "dense (blocks of unequal sizes 1 and 10)",
    "stop_gradient": "diagonal",
    "sum_all": "dense (all 12 units are coupled)",
    "switch": "dense (blocks of unequal sizes 4 and 8)",
    "tanh": "diagonal",
    "transpose": "dense (blocks of unequal sizes 1 and 5)",
    "while": "dense (unknown primitive while)",
}


def test_each_op_alone_is_found_as_expected():
    found = {
        name: classify(carry_dependencies(make_step((name,), 0), jnp.zeros(N), jnp.zeros(N), 1.0))
        for name in NAMES
    }
    assert {name: s.description for name, s in found.items()} == EXPECTED
    assert found["flip"].perm is not None and found["cumsum"].perm is None
