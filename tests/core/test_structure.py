"""Structured step Jacobians: dependencies from the jaxpr, their blocks, coloured Jacobians.

References: ``jax.jacfwd``'s dense Jacobian of the same packed step, which must vanish off the
blocks found and agree with :func:`coloured_jacobian` on them; the transpose of
``jax.jacrev``'s, which :func:`coloured_jacobian_t`'s element must equal.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from bppsa.scan import BlockDiagonal, Dense, Diagonal
from bppsa.scan._core.carry import Layout
from bppsa.scan._core.structure import (
    Structure,
    carry_dependencies,
    classify,
    coloured_jacobian,
    coloured_jacobian_t,
)

H, X = 5, 3  # units (not a power of two), input size


def _weights(key, *shapes):
    keys = jax.random.split(jax.random.PRNGKey(key), len(shapes))
    return [0.5 * jax.random.normal(k, s) for k, s in zip(keys, shapes)]


def _structure(step, carry, *others, **kwargs) -> Structure:
    return classify(carry_dependencies(step, carry, *others, **kwargs))


# Positive cases: steps (carry, x) -> carry, with their carry, and the structure expected.


def indrnn():
    W, u, b = _weights(0, (H, X), (H,), (H,))
    return lambda h, x: jnp.tanh(W @ x + u * h + b), jnp.zeros(H)


def diagonal_gru():  # ParaRNN's GRU with diagonal recurrence
    Wz, Wr, Wc, uz, ur, uc = _weights(1, (H, X), (H, X), (H, X), (H,), (H,), (H,))

    def step(h, x):
        z = jax.nn.sigmoid(Wz @ x + uz * h)
        r = jax.nn.sigmoid(Wr @ x + ur * h)
        c = jnp.tanh(Wc @ x + uc * (r * h))
        return (1 - z) * h + z * c

    return step, jnp.zeros(H)


def cifg_lstm():  # coupled input/forget gate, diagonal recurrence: (c_i, h_i) pairs
    Wf, Wz, Wo, uf, uz, uo = _weights(2, (H, X), (H, X), (H, X), (H,), (H,), (H,))

    def step(carry, x):
        c, h = carry
        f = jax.nn.sigmoid(Wf @ x + uf * h)
        c = f * c + (1 - f) * jnp.tanh(Wz @ x + uz * h)
        return c, jax.nn.sigmoid(Wo @ x + uo * h) * jnp.tanh(c)

    return step, (jnp.zeros(H), jnp.zeros(H))


HEADS, D = 3, 4


def per_head():  # one D x D recurrence per head, through dot_general with a batch dim
    (A,) = _weights(3, (HEADS, D, D))

    def step(h, x):
        heads = jnp.einsum("hij,hj->hi", A, h.reshape(HEADS, D))
        return jnp.tanh(heads.reshape(-1) + x.sum())

    return step, jnp.zeros(HEADS * D)


def pytree_carry():  # a dict of leaves, one of them an integer counter (not differentiated)
    (u,) = _weights(4, (H,))

    def step(carry, x):
        a, b = carry["a"], carry["b"]
        return {"a": a * jnp.tanh(b), "b": u * b + x.sum(), "t": carry["t"] + 1}

    return step, {"a": jnp.zeros(H), "b": jnp.zeros(H), "t": jnp.int32(0)}


PAIRS = tuple(p for i in range(H) for p in (i, H + i))  # (c_0, h_0, c_1, h_1, ...)
POSITIVE = {
    indrnn: ("diagonal", 1, None),
    diagonal_gru: ("diagonal", 1, None),
    cifg_lstm: ("block", 2, PAIRS),
    per_head: ("block", D, None),
    pytree_carry: ("block", 2, PAIRS),
}


@pytest.mark.parametrize("case", POSITIVE, ids=lambda c: c.__name__)
def test_structure_of_separable_cells(case):
    step, carry = case()
    kind, block, perm = POSITIVE[case]
    x = jax.ShapeDtypeStruct((X,), jnp.float32)
    carry = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), carry)
    structure = _structure(step, carry, x)
    assert (structure.kind, structure.block, structure.perm) == (kind, block, perm)
    assert structure.reason is None
    assert structure.description == ("diagonal" if block == 1 else f"block-diagonal k={block}")


def test_dependency_sets_of_the_lstm_pairs():
    step, carry = cifg_lstm()
    deps = carry_dependencies(step, carry, jnp.zeros(X))
    assert deps.n == 2 * H and deps.reason is None
    got = [set(row[row >= 0].tolist()) for row in deps.sets]
    assert got == [{i, H + i} for i in range(H)] * 2


def _primitive_zoo(h, x):
    """Diagonal, through many primitives that move or combine elements without mixing units."""
    y = jnp.flip(jnp.flip(h)) + jnp.concatenate([h[:2], h[2:]])  # rev, slice, concatenate
    y = y * jnp.pad(h, (1, 2))[1:-2] + h.reshape(1, H).T.reshape(H)  # pad, transpose, reshape
    y = lax.dynamic_update_slice(y, 2 * lax.dynamic_slice(y, (1,), (2,)), (1,))  # constant starts
    y = lax.cond(x[0] > 0, jnp.sin, jnp.cos, y) + jax.nn.relu(y) + jax.checkpoint(jnp.tanh)(y)
    y = y * lax.stop_gradient(h).sum() + jnp.where(y > 0, y, 0.1 * y) + jnp.clip(y, -1.0, 1.0)
    y = jnp.sort(y[:, None], axis=1)[:, 0] + jnp.cumsum(y[:, None], axis=1)[:, 0]  # size-1 axes
    y = y + x[jnp.argmax(h) % X]  # an index has no derivative; x is not the carry
    y = (y[:, None] @ jnp.ones((1, 2)))[:, 1] + jnp.exp(y) ** 2 + jnp.log1p(jnp.abs(y))  # dot
    parts = jnp.split(y, [2])
    return jnp.concatenate(parts) + jnp.max(h.reshape(H, 1), axis=1)  # split, reduce_max


def test_primitives_that_keep_units_apart():
    """Fails loudly if a JAX version lowers these to primitives or parameters not covered."""
    x = jnp.ones(X)
    _primitive_zoo(jnp.ones(H), x)  # runs
    structure = _structure(lambda h, x: _primitive_zoo(h, x)[:H], jnp.zeros(H), x)
    assert structure.kind == "diagonal", structure.reason


# Negative cases: steps whose Jacobian mixes units, and the reason given.

W = jnp.asarray(np.arange(H * H).reshape(H, H) / H**2)
NEGATIVE = {
    "matrix product": (lambda h: W @ h, "all 5 units are coupled"),
    "diagonal-valued matrix": (lambda h: jnp.diag(jnp.arange(1.0, H + 1)) @ h, "all 5 units"),
    "identity matrix": (lambda h: jnp.eye(H) @ h, "all 5 units are coupled"),
    "gather": (lambda h: h[np.array([1, 0, 2, 4, 3])], "unknown primitive gather"),
    "roll": (lambda h: jnp.roll(h, 1), "all 5 units are coupled"),
    "sum mixed back": (lambda h: h + h.sum(), "all 5 units are coupled"),
    "callback": (
        lambda h: jax.pure_callback(lambda a: a, jax.ShapeDtypeStruct((H,), h.dtype), h),
        "unknown primitive pure_callback",
    ),
    "while loop": (lambda h: lax.while_loop(lambda c: c[0] < 3, jnp.sin, h), "primitive while"),
    "runtime index": (
        lambda h: lax.dynamic_update_slice(h, lax.dynamic_slice(h, (jnp.argmax(h),), (2,)), (0,)),
        "dynamic_slice at a runtime index",
    ),
}


@pytest.mark.parametrize("name", NEGATIVE)
def test_structure_of_mixing_cells(name):
    step, reason = NEGATIVE[name]
    structure = _structure(step, jnp.zeros(H))
    assert (structure.kind, structure.block, structure.perm) == ("dense", H, None)
    assert reason in structure.reason
    assert structure.description == f"dense ({structure.reason})"


@pytest.mark.parametrize(
    ("step", "primitive"),
    [(lambda h: W40 @ h, "dot_general"), (lambda h: h + h.sum(), "reduce_sum")],
    ids=["matrix product", "sum"],
)
def test_sets_past_the_bound_are_dense(step, primitive):
    deps = carry_dependencies(step, jnp.zeros(40), max_block=16)
    assert deps.sets is None
    assert deps.reason == f"{primitive} mixes more than 16 units"


W40 = jnp.ones((40, 40))


def test_a_permutation_is_blocked_by_its_cycles():
    deps = carry_dependencies(lambda h: jnp.roll(h, 1), jnp.zeros(H))
    assert [row[row >= 0].tolist() for row in deps.sets] == [[(i - 1) % H] for i in range(H)]
    swap = _structure(lambda h: jnp.roll(h, 3), jnp.zeros(6))  # cycles (0 3) (1 4) (2 5)
    assert (swap.kind, swap.block, swap.perm) == ("block", 2, (0, 3, 1, 4, 2, 5))


def test_blocks_of_unequal_sizes_are_dense():
    structure = _structure(lambda c: (c[0] + c[0].sum(), 2 * c[1]), (jnp.zeros(2), jnp.zeros(3)))
    assert structure.kind == "dense"
    assert structure.reason == "blocks of unequal sizes 1 and 2"


def test_analysis_inside_jit_and_vmap():
    """At trace time, with the carry and closed-over weights tracers of an enclosing trace."""
    found = []

    def outer(u, h, start):
        window = lambda h: lax.dynamic_slice(jnp.concatenate([h, h]), (start,), (H,))
        for step in (lambda h: jnp.tanh(u * h), lambda h: u * window(h)):
            found.append(_structure(step, h).description)
        return h

    jax.jit(jax.vmap(outer, (0, None, None)))(jnp.ones((2, H)), jnp.ones(H), 1)
    assert found == ["diagonal", "dense (dynamic_slice at a runtime index)"]


def test_a_new_carry_of_another_structure_is_refused():
    with pytest.raises(ValueError, match="structure"):
        carry_dependencies(lambda c: c[0], (jnp.zeros(H), jnp.zeros(H)))
    with pytest.raises(ValueError, match="shapes"):
        carry_dependencies(lambda h: h[:2], jnp.zeros(H))


def test_analysis_at_4096_units():
    n, heads = 4096, 256
    h = jax.ShapeDtypeStruct((n,), jnp.float32)
    x = jax.ShapeDtypeStruct((X,), jnp.float32)
    W, u, A = jnp.ones((n, X)), jnp.ones(n), jnp.ones((heads, n // heads, n // heads))
    indrnn = _structure(lambda h, x: jnp.tanh(W @ x + u * h), h, x)
    blocks = _structure(
        lambda h, x: jnp.einsum("hij,hj->hi", A, h.reshape(heads, -1)).reshape(n), h, x
    )
    dense = _structure(lambda h, x: jnp.tanh(jnp.ones((n, n)) @ h), h, x)
    assert indrnn.kind == "diagonal"
    assert (blocks.kind, blocks.block) == ("block", n // heads)
    assert dense.reason == "dot_general mixes more than 16 units"


# Coloured Jacobians against jax.jacfwd.


def _packed(case):
    """The positive case's step as ``R^n -> R^n`` on the packed carry (float64), its structure
    and a few points."""
    step, carry = case()
    carry = jax.tree.map(lambda a: a.astype(jnp.float64) if a.dtype == jnp.float32 else a, carry)
    (x,) = _weights(5, (X,))
    layout = Layout.of(carry, concat_last=False)

    def fun(vector):
        return layout.pack(step(layout.unpack_into(vector, carry), x))

    structure = _structure(step, carry, x)
    points = jax.random.normal(jax.random.PRNGKey(6), (3, structure.n), jnp.float64)
    return fun, structure, points


def _expected_blocks(dense: np.ndarray, structure: Structure):
    """The blocks of a dense Jacobian, and the Jacobian with its blocks zeroed."""
    n, k = structure.n, structure.block
    perm = np.arange(n) if structure.perm is None else np.asarray(structure.perm)
    members = perm.reshape(n // k, k)
    blocks = dense[members[:, :, None], members[:, None, :]]
    rest = dense.copy()
    rest[members[:, :, None], members[:, None, :]] = 0.0
    return (blocks.reshape(n) if k == 1 else blocks), rest


@pytest.mark.parametrize("case", POSITIVE, ids=lambda c: c.__name__)
@pytest.mark.parametrize("transform", ["plain", "jit", "vmap"])
def test_coloured_jacobian_is_the_dense_one_on_its_blocks(x64, case, transform):
    fun, structure, points = _packed(case)
    n, k = structure.n, structure.block

    def coloured(point):
        return coloured_jacobian(fun, point, structure)

    if transform == "vmap":
        got = jax.vmap(coloured)(points)
    else:
        got = jnp.stack(
            [(jax.jit(coloured) if transform == "jit" else coloured)(p) for p in points]
        )
    assert got.shape == ((3, n) if k == 1 else (3, n // k, k, k))
    for point, blocks in zip(points, np.asarray(got)):
        expected, rest = _expected_blocks(np.asarray(jax.jacfwd(fun)(point)), structure)
        assert np.all(rest == 0.0)
        np.testing.assert_allclose(blocks, expected, rtol=1e-12, atol=1e-14)
    assert np.any(got != 0.0)


def test_coloured_jacobian_of_a_dense_structure_is_the_whole_jacobian(x64):
    A = jnp.asarray(np.arange(H * H).reshape(H, H) / H**2, jnp.float64)
    fun = lambda h: jnp.tanh(A @ h)
    structure = _structure(fun, jnp.zeros(H, jnp.float64))
    point = jnp.linspace(-1.0, 1.0, H, dtype=jnp.float64)
    got = coloured_jacobian(fun, point, structure)
    assert got.shape == (1, H, H)
    np.testing.assert_allclose(got[0], jax.jacfwd(fun)(point), rtol=1e-12, atol=1e-14)


def test_coloured_jacobian_checks_the_point():
    structure = _structure(jnp.tanh, jnp.zeros(H))
    with pytest.raises(ValueError, match="point"):
        coloured_jacobian(jnp.tanh, jnp.zeros(H + 1), structure)


# The transposed coloured Jacobian (k VJPs), the one the scans use, against jax.jacrev.


def pairs():  # (c_i, h_i) pairs of a carry packed as [c, h], with 2 x 2 blocks
    a, b, c, d = _weights(7, (H,), (H,), (H,), (H,))
    return lambda h: jnp.concatenate(
        [jnp.tanh(a * h[:H] + b * h[H:]), jnp.sin(c * h[:H] + d * h[H:])]
    )


def triples():  # units (i, 4 + i, 8 + i) of a packed [a, b, c], coupled in 3 x 3 blocks
    (A,) = _weights(8, (4, 3, 3))
    return lambda h: jnp.tanh(jnp.einsum("gij,gj->gi", A, h.reshape(3, 4).T).T.reshape(12))


def heads_of_12():  # three heads of 12 units, past the 8 of the multiply-and-sum path
    (A,) = _weights(9, (3, 12, 12))
    return lambda h: jnp.tanh(jnp.einsum("gij,gj->gi", A, h.reshape(3, 12)).reshape(36) + 0.1)


def scaled():
    (u,) = _weights(10, (7,))
    return lambda h: jnp.tanh(u * h) * jnp.cos(h)


def coupled():
    return lambda h: jnp.tanh(W @ h)


TRANSPOSED = {  # the step's factory, the carry's size, the structure expected
    scaled: (7, ("diagonal", 1, None)),
    pairs: (2 * H, ("block", 2, PAIRS)),
    triples: (12, ("block", 3, (0, 4, 8, 1, 5, 9, 2, 6, 10, 3, 7, 11))),
    heads_of_12: (36, ("block", 12, None)),
    coupled: (H, ("dense", H, None)),
}


@pytest.mark.parametrize("case", TRANSPOSED, ids=lambda c: c.__name__)
@pytest.mark.parametrize("transform", ["plain", "jit"])
def test_coloured_jacobian_t_is_the_transposed_jacobian(x64, case, transform):
    fun = case()
    n, expected_structure = TRANSPOSED[case]
    structure = _structure(fun, jnp.zeros(n, jnp.float64))
    assert (structure.kind, structure.block, structure.perm) == expected_structure
    point = jax.random.normal(jax.random.PRNGKey(11), (n,), jnp.float64)

    def coloured(point):
        return coloured_jacobian_t(fun, point, structure)

    element = (jax.jit(coloured) if transform == "jit" else coloured)(point)
    kinds = {"diagonal": Diagonal, "block": BlockDiagonal, "dense": Dense}
    assert type(element) is kinds[structure.kind]
    if structure.kind == "block":
        assert element.blocks.shape == (n // structure.block, structure.block, structure.block)
        assert element.perm == structure.perm
    jacobian = np.asarray(jax.jacrev(fun)(point))
    if structure.kind != "diagonal":  # else J^T = J: the check could not tell them apart
        assert not np.allclose(jacobian, jacobian.T)
    np.testing.assert_allclose(element.to_dense().a, jacobian.T, rtol=1e-12, atol=1e-14)
