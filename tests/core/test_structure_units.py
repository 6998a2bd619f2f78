"""Unit checks of the structure analysis, each on one small body with its exact expected answer:
the dense reasons (which primitive mixed more than ``max_block`` units), the bounds of
``max_block``, carries of ``jax.ShapeDtypeStruct`` or of integers only, the message for blocks of
unequal sizes, the dtype of coloured Jacobians and of dense views, the dense fallback of an
unreadable step, and constants the pass reads.

References: the expected dependency sets are worked out by hand from each body; the coloured
Jacobians are compared with ``jax.jacfwd``'s dense one.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from bppsa.scan import BlockDiagonal, Diagonal
from bppsa.scan._core.dependence import depends_on
from bppsa.scan._core.structure import (
    Dependencies,
    carry_dependencies,
    carry_structure,
    classify,
    coloured_jacobian,
    coloured_jacobian_t,
)
from tests.helpers import RTOL

# Dense reasons: each body mixes more units than max_block allows, in one named primitive.


def _flip_in_one_branch(h, x):  # each branch keeps units apart; together they mix them
    return lax.cond(x > 0, lambda h: h, lambda h: h[::-1], h)


def _sort_keys_with_values(carry):  # each operand within max_block, their union past it
    keys, values = carry
    return lax.sort_key_val(keys, values)


def _update_at(h, i):
    return lax.dynamic_update_slice(h, 2 * h[:1], (i,))


def _reshape_transposed(h):  # reshape's ``dimensions`` transposes first: not understood
    return lax.reshape(h, (2, 3), dimensions=(1, 0)).reshape(3, 2)


DENSE_REASONS = [
    pytest.param(
        lambda h: h + h[::-1], (jnp.zeros(3),), 1, "add mixes more than 1 units", id="add"
    ),
    pytest.param(
        _flip_in_one_branch, (jnp.zeros(3), 1.0), 1, "cond mixes more than 1 units", id="cond"
    ),
    pytest.param(jnp.cumsum, (jnp.zeros(3),), 2, "cumsum mixes more than 2 units", id="cumsum"),
    pytest.param(jnp.sort, (jnp.zeros(3),), 2, "sort mixes more than 2 units", id="sort"),
    pytest.param(
        _sort_keys_with_values,
        ((jnp.zeros(2), jnp.zeros(2)),),
        2,
        "sort mixes more than 2 units",
        id="sort-two-operands",
    ),
    pytest.param(
        _update_at,
        (jnp.zeros(3), jnp.int32(1)),
        2,
        "dynamic_update_slice at a runtime index",
        id="dynamic_update_slice",
    ),
    pytest.param(
        _reshape_transposed,
        (jnp.zeros((3, 2)),),
        2,
        "reshape with parameters not understood",
        id="reshape-dimensions",
    ),
]


@pytest.mark.parametrize(("step", "args", "max_block", "reason"), DENSE_REASONS)
def test_the_dense_reason_names_the_primitive(step, args, max_block, reason):
    deps = carry_dependencies(step, *args, max_block=max_block)
    assert deps.sets is None
    assert deps.reason == reason
    structure = classify(deps)
    assert (structure.kind, structure.block, structure.reason) == ("dense", deps.n, reason)


# max_block: a set past it becomes "everything", which a later slice can still drop.


def _sums_of_pairs(h):  # (3,) -> (2,): h0 + h1 (past max_block=1), then h2 + 0 (within it)
    return jnp.pad(h, (0, 1)).reshape(2, 2).sum(1)


def test_a_set_past_max_block_is_dropped_with_its_element():
    h = jnp.zeros(3)
    kept = carry_dependencies(
        lambda h: jnp.stack([_sums_of_pairs(h)[0], h[1], h[2]]), h, max_block=1
    )
    assert kept.reason == "reduce_sum mixes more than 1 units"

    dropped = carry_dependencies(
        lambda h: jnp.stack([h[0], h[1], _sums_of_pairs(h)[1]]), h, max_block=1
    )
    np.testing.assert_array_equal(dropped.sets, [[0], [1], [2]])
    assert dropped.reason is None


def test_max_block_is_at_least_one():
    deps = carry_dependencies(lambda h: jnp.tanh(h) * h, jnp.zeros(4), max_block=1)
    np.testing.assert_array_equal(deps.sets, [[0], [1], [2], [3]])
    assert classify(deps).kind == "diagonal"
    with pytest.raises(ValueError, match="max_block must be at least 1; got 0"):
        carry_dependencies(lambda h: h, jnp.zeros(4), max_block=0)


# Carries: as jax.ShapeDtypeStruct (what the scan passes), or without float leaves.


def _columns_step(carry):  # a[i, j] and b[j] are coupled: one block per column j
    a, b = carry["a"], carry["b"]
    return {"a": a * b[None, :], "b": b + a.sum(0), "i": carry["i"] + 1}


def test_a_carry_of_shape_dtype_structs_is_read_by_its_shapes():
    carry = {
        "a": jax.ShapeDtypeStruct((2, 3), jnp.float32),
        "b": jax.ShapeDtypeStruct((3,), jnp.float32),
        "i": jax.ShapeDtypeStruct((), jnp.int32),
    }
    deps = carry_dependencies(_columns_step, carry)
    # packed: a[i, j] at 3 i + j, then b[j] at 6 + j; the int leaf has no units
    assert deps.n == 9
    as_arrays = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), carry)
    np.testing.assert_array_equal(deps.sets, carry_dependencies(_columns_step, as_arrays).sets)
    structure = classify(deps)
    assert (structure.kind, structure.block) == ("block", 3)
    assert structure.perm == (0, 3, 6, 1, 4, 7, 2, 5, 8)

    scalar = carry_dependencies(lambda h: 2 * h, jax.ShapeDtypeStruct((4,), jnp.float32))
    np.testing.assert_array_equal(scalar.sets, [[0], [1], [2], [3]])
    assert deps.sets.dtype == scalar.sets.dtype == np.int32  # max_block ints per element


def test_a_carry_without_float_leaves_has_no_units():
    carry = (jnp.zeros(3, jnp.int32), jnp.array(True))
    deps = carry_dependencies(lambda c: (c[0] + 1, ~c[1]), carry)
    assert deps.n == 0
    assert deps.sets.shape == (0, 0)


# classify's message for blocks of unequal sizes.


def _components(*sizes: int) -> Dependencies:
    """Dependencies whose connected components have ``sizes``, in order: every member of a
    component depends on itself and on the component's first member."""
    rows, first = [], 0
    for size in sizes:
        rows += [[first + i, first] for i in range(size)]
        first += size
    return Dependencies(first, np.array(rows, np.int32))


@pytest.mark.parametrize(
    ("sizes", "shown"),
    [((1, 2), "1 and 2"), ((3, 1, 2), "1 and 2 and 3"), ((1, 2, 3, 4), "1 to 4")],
    ids=["two-sizes", "three-sizes", "four-sizes"],
)
def test_blocks_of_unequal_sizes_are_listed_up_to_three_sizes(sizes, shown):
    structure = classify(_components(*sizes))
    assert structure.kind == "dense"
    assert structure.reason == f"blocks of unequal sizes {shown}"


# Coloured Jacobians keep the point's dtype, also one other than the default float's.


def _elementwise(v):
    return jnp.tanh(v) * v


def _pairs_apart(v):  # v[i] with v[i + 2 mod 4]: blocks (0, 2), (1, 3)
    return jnp.sin(v * jnp.concatenate([v[2:], v[:2]]))


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float64])
@pytest.mark.parametrize("fun", [_elementwise, _pairs_apart])
def test_coloured_jacobians_keep_the_points_dtype(x64, fun, dtype):
    # under x64 the default float is float64, so a float32 point needs tangents of its dtype
    point = jnp.linspace(-1.0, 1.0, 4, dtype=dtype)
    structure = classify(carry_dependencies(fun, point))
    dense = np.asarray(jax.jacfwd(fun)(point))
    rtol = RTOL[jnp.dtype(dtype)]
    if fun is _elementwise:
        assert structure.kind == "diagonal"
        expected, expected_t = np.diag(dense), np.diag(dense)
    else:
        assert (structure.kind, structure.perm) == ("block", (0, 2, 1, 3))
        members = np.reshape(structure.perm, (2, 2))
        expected = np.stack([dense[np.ix_(m, m)] for m in members])
        expected_t = np.transpose(expected, (0, 2, 1))

    blocks = coloured_jacobian(fun, point, structure)
    assert blocks.dtype == dtype
    np.testing.assert_allclose(blocks, expected, rtol=rtol)

    element = coloured_jacobian_t(fun, point, structure)
    values = element.d if isinstance(element, Diagonal) else element.blocks
    assert values.dtype == dtype
    np.testing.assert_allclose(values, expected_t, rtol=rtol)


# The dense fallback of a step the analysis cannot read covers the whole packed carry.


@pytest.mark.parametrize("abstract", [False, True], ids=["arrays", "shape-dtype-structs"])
def test_an_unreadable_step_is_dense_over_the_whole_carry(abstract):
    carry = (jnp.zeros((2, 3)), jnp.zeros(4), jnp.zeros(2, jnp.int32))
    if abstract:
        carry = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), carry)
    structure = carry_structure(lambda c: (c, c), carry)  # a new carry of another structure
    assert (structure.kind, structure.n, structure.block) == ("dense", 10, 10)
    assert structure.reason.startswith(
        "the dependency analysis failed: ValueError: fun must return a new carry"
    )


# Dense views of structured elements keep a low-precision dtype.


def test_dense_views_keep_a_low_precision_dtype():
    d = jnp.array([1.0, -2.0, 0.5], jnp.bfloat16)
    dense = Diagonal(d).to_dense().a
    assert dense.dtype == jnp.bfloat16
    np.testing.assert_array_equal(dense.astype(np.float32), np.diag(d.astype(np.float32)))

    blocks = jnp.arange(1.0, 9.0, dtype=jnp.float16).reshape(2, 2, 2)
    dense = BlockDiagonal(blocks, (0, 2, 1, 3)).to_dense().a
    assert dense.dtype == jnp.float16
    expected = np.zeros((4, 4), np.float32)  # block b acts on entries perm[2 b : 2 b + 2]
    for b, members in enumerate([[0, 2], [1, 3]]):
        expected[np.ix_(members, members)] = blocks[b].astype(np.float32)
    np.testing.assert_array_equal(dense.astype(np.float32), expected)


# Constants: a start index closed over as an array is a constant of the jaxpr, and is read.


def test_a_start_index_closed_over_as_an_array_is_read():
    start = jnp.int32(2)

    def step(h):  # allow_negative_indices=False: the constant itself is dynamic_slice's operand
        moved = lax.dynamic_slice(h, (start,), (2,), allow_negative_indices=False)
        return jnp.concatenate([moved, h[:2]])

    h = jnp.zeros(4)
    assert jax.make_jaxpr(step)(h).consts, "start must reach the jaxpr as a constant"
    deps = carry_dependencies(step, h)
    np.testing.assert_array_equal(deps.sets, [[2], [3], [0], [1]])
    assert classify(deps).perm == (0, 2, 1, 3)


# depends_on: the leaf-level pass that decides whether a body's Jacobians may be analytic.


def test_depends_on_lists_the_labels_each_output_may_depend_on():
    def fun(a, pair, c):
        u, v = pair
        return a * u, jnp.sin(v) + 1.0, c + 2, jnp.ones(3)

    args = (jnp.ones(3), (jnp.ones(3), jnp.ones(3)), jnp.ones(3))
    found = depends_on(fun, args, ["a", "u", "v", None])
    assert found == [frozenset({"a", "u"}), frozenset({"v"}), frozenset(), frozenset()]


def test_depends_on_follows_every_output_of_an_equation():
    def fun(a, b):
        first, second = jnp.split(jnp.concatenate([a, b]), 2)
        return second * 2.0, first

    found = depends_on(fun, (jnp.ones(2), jnp.ones(2)), ["a", "b"])
    assert found == [frozenset({"a", "b"})] * 2  # an equation's outputs inherit all its inputs
