"""The primitive tables of the jaxpr analyses, built from one taxonomy, are the tables they were.

Each analysis (the element flow, the quasi-Newton diagonal's aligned paths, the fused kernel's
padded rules, lanes and slices, the walker's inlined calls) names its primitives as a subset of
:mod:`bppsa.scan._core.jaxprs.taxonomy`. The sets below are the tables as the analyses held them
literally before the taxonomy: a change to a table is a change of what an analysis accepts, to
be made here on purpose.
"""

import itertools

import jax
import jax.numpy as jnp
import pytest
from jax import lax

from bppsa.scan._core import diagonal_paths, element_flow
from bppsa.scan._core.fused import lanes, padded, slices
from bppsa.scan._core.jaxprs import rules, taxonomy, walk


def _names(text: str) -> frozenset[str]:
    return frozenset(text.split())


FLOW_ELEMENTWISE = _names(
    """abs acos acosh add add_any and asin asinh atan atan2 atanh cbrt ceil clamp complex conj
    convert_element_type copy copy_p cos cosh digamma div eq erf erf_inv erfc exp exp2 expm1 floor
    ge gt igamma imag integer_pow is_finite le lgamma log log1p logistic lt max min mul ne neg
    nextafter not or polygamma pow real reduce_precision rem round rsqrt select_n sign sin sinh
    sqrt square sub tan tanh xor zeta"""
)
FLOW_REDUCTIONS = _names(
    "argmax argmin reduce_and reduce_max reduce_min reduce_or reduce_prod reduce_sum"
)
FLOW_CUMULATIVE = _names("cumlogsumexp cummax cummin cumprod cumsum")
FLOW_CALLS = {
    "jit": "jaxpr",
    "pjit": "jaxpr",
    "closed_call": "call_jaxpr",
    "core_call": "call_jaxpr",
    "remat2": "jaxpr",
    "checkpoint": "jaxpr",
}
FLOW_RULES = FLOW_CUMULATIVE | _names(
    """broadcast_in_dim reshape squeeze transpose rev slice concatenate stack split pad
    dynamic_slice dynamic_update_slice dot_general sort stop_gradient optimization_barrier"""
)
JVP_RULES = _names("custom_jvp_call")
VJP_RULES = _names("custom_vjp_call custom_vjp_call_jaxpr")
FLOW_READS = (
    FLOW_ELEMENTWISE
    | FLOW_REDUCTIONS
    | frozenset(FLOW_CALLS)
    | {"cond"}
    | JVP_RULES
    | VJP_RULES
    | FLOW_RULES
)

ALIGNED = FLOW_ELEMENTWISE | _names(
    """broadcast_in_dim concatenate convert_element_type copy copy_p dynamic_slice
    dynamic_update_slice expand_dims optimization_barrier pad reshape rev select_n slice split
    squeeze stop_gradient transpose"""
)

PADDED_ELEMENTWISE = _names(
    """abs acos acosh add add_any and asin asinh atan atan2 atanh cbrt ceil clamp clz
    convert_element_type copy copy_p cos cosh div eq erf_inv exp exp2 expm1 floor ge gt
    integer_pow is_finite le log log1p logistic lt max min mul ne neg nextafter not or
    population_count pow rem rsqrt select_n shift_left shift_right_arithmetic
    shift_right_logical sign sin sinh sqrt square sub tan tanh xor"""
)
PADDED_UPCAST = PADDED_ELEMENTWISE - _names(
    "convert_element_type copy copy_p eq ne lt le gt ge select_n is_finite and or not xor"
)
PADDED_RULES = PADDED_ELEMENTWISE | _names(
    """iota broadcast_in_dim squeeze reshape transpose reshard sharding_constraint reduce_sum
    reduce_max reduce_min argmax argmin dot_general slice split rev concatenate pad"""
)
LANES_RULES = _names(
    """broadcast_in_dim squeeze reshape transpose reduce_sum reduce_max reduce_min argmax argmin
    reshard sharding_constraint dot_general slice rev pad concatenate split"""
)
INLINED = _names("jit pjit closed_call core_call remat remat2 checkpoint")


def _flow_reads() -> frozenset[str]:
    candidates = taxonomy.KNOWN | FLOW_READS | {"no_such_primitive"}
    return frozenset(name for name in candidates if element_flow._rule(name) is not None)


@pytest.mark.parametrize(
    "table, expected",
    [
        (lambda: element_flow.ELEMENTWISE, FLOW_ELEMENTWISE),
        (lambda: element_flow.REDUCTIONS, FLOW_REDUCTIONS),
        (lambda: element_flow.CUMULATIVE, FLOW_CUMULATIVE),
        (lambda: element_flow.CALLS, FLOW_CALLS),
        (lambda: frozenset(element_flow._RULES), FLOW_RULES),
        (_flow_reads, FLOW_READS),
        (lambda: diagonal_paths.ALIGNED, ALIGNED),
        (lambda: padded.ELEMENTWISE, PADDED_ELEMENTWISE),
        (lambda: padded._UPCAST, PADDED_UPCAST),
        (lambda: frozenset(padded.RULES), PADDED_RULES),
        (lambda: lanes.ELEMENTWISE | frozenset(lanes._RULES), PADDED_ELEMENTWISE | LANES_RULES),
        (lambda: slices.ELEMENTWISE, PADDED_ELEMENTWISE),
        (lambda: walk.INLINED, INLINED),
        (lambda: rules.JVP_RULES, JVP_RULES),
        (lambda: rules.VJP_RULES, VJP_RULES),
        (lambda: taxonomy.WITH_RULES, JVP_RULES | VJP_RULES),
    ],
    ids=[
        "flow elementwise",
        "flow reductions",
        "flow cumulative",
        "flow calls",
        "flow rules",
        "flow reads",
        "aligned",
        "padded elementwise",
        "padded upcast",
        "padded rules",
        "lanes",
        "slices",
        "inlined",
        "jvp rules",
        "vjp rules",
        "with rules",
    ],
)
def test_table_is_as_before(table, expected):
    got = table()
    assert got == expected, (sorted(set(got) - set(expected)), sorted(set(expected) - set(got)))


def test_every_name_an_analysis_reads_is_sorted_in_the_taxonomy():
    tables = [FLOW_READS, ALIGNED, PADDED_RULES, LANES_RULES, INLINED]
    unsorted = frozenset().union(*tables) - taxonomy.KNOWN
    assert not unsorted, sorted(unsorted)


ELEMENTWISE_KINDS = {
    "arithmetic": taxonomy.ARITHMETIC,
    "transcendental": taxonomy.TRANSCENDENTAL,
    "special": taxonomy.SPECIAL,
    "complex parts": taxonomy.COMPLEX_PARTS,
    "predicates": taxonomy.PREDICATES,
    "selections": taxonomy.SELECTIONS,
    "conversions": taxonomy.CONVERSIONS,
    "logical": taxonomy.LOGICAL,
    "integer bits": taxonomy.INTEGER_BITS,
}
KINDS = {
    "elementwise": taxonomy.ELEMENTWISE,
    "moves": taxonomy.MOVES,
    "reductions": taxonomy.REDUCTIONS,
    "cumulative": taxonomy.CUMULATIVE,
    "sorts": taxonomy.SORTS,
    "contractions": taxonomy.CONTRACTIONS,
    "annotations": taxonomy.ANNOTATIONS,
    "stop_gradient": taxonomy.STOP_GRADIENT,
    "sources": taxonomy.SOURCES,
    "calls": frozenset(taxonomy.CALLS),
    "with rules": taxonomy.WITH_RULES,
    "neither": taxonomy.NEITHER,
}


@pytest.mark.parametrize("kinds", [ELEMENTWISE_KINDS, KINDS], ids=["elementwise", "all"])
def test_each_primitive_is_of_one_kind(kinds):
    for (a, first), (b, second) in itertools.combinations(kinds.items(), 2):
        assert not first & second, (a, b, sorted(first & second))
    assert frozenset().union(*kinds.values()) == (
        taxonomy.ELEMENTWISE if kinds is ELEMENTWISE_KINDS else taxonomy.KNOWN
    )


@jax.custom_vjp
def _clipped(x):
    return x


_clipped.defvjp(lambda x: (x, None), lambda _, g: (jnp.clip(g, -1, 1),))


def _cell(h, w):
    """A step binding primitives of every kind under the names the taxonomy gives them."""
    g = jax.jit(lambda a: w @ a)(h)
    g = jax.checkpoint(jnp.tanh)(g) + jax.nn.relu(h) + _clipped(h)
    parts = jnp.split(jnp.stack([g, h]).reshape(-1), 2)
    g = jnp.concatenate([jnp.flip(parts[0][1:]), parts[1][:1]]) * jnp.cumsum(h).sum()
    g = lax.cond(g.sum() > 0, lambda a: a, lambda a: -a, g)
    return lax.stop_gradient(jnp.sort(g)) + jnp.where(h > 0, g, h.astype(jnp.int32))


def _bound(jaxpr) -> set[str]:
    """The primitives of ``jaxpr``'s equations and of the jaxprs they call."""
    names = set()
    for eqn in jaxpr.eqns:
        names.add(eqn.primitive.name)
        for inner in rules._inner_jaxprs(eqn.params):
            names |= _bound(inner)
    return names


def test_jax_binds_the_names_of_the_taxonomy():
    """Fails when JAX renames a primitive the analyses read: sort the new name, then."""
    closed = jax.make_jaxpr(_cell)(jnp.ones(4), jnp.ones((4, 4)))
    names = _bound(closed.jaxpr)
    assert {"jit", "remat2", "custom_jvp_call", "custom_vjp_call", "stack", "split"} <= names
    assert {"cond", "cumsum", "sort", "stop_gradient", "dot_general"} <= names
    assert names <= taxonomy.KNOWN, sorted(names - taxonomy.KNOWN)
