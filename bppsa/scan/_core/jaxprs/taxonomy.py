"""JAX's primitives sorted by what each output element reads of the operands: one taxonomy.

Every analysis of a jaxpr in bppsa (the element flow of the structure analysis, the
element-aligned paths of quasi-Newton, the fused kernel's padded rules, its lanes and its
slices) names the primitives it handles as a subset of these sets, and says which subset and
why beside its table, as JAX keeps one rule table per transformation keyed by primitive. A
primitive JAX adds is sorted here once; an analysis that does not list a primitive treats it
conservatively (its outputs dense, its derivative cut, the kernel refused).

Names, not primitive objects, so that jaxprs traced by other JAX versions read alike: some
names are older spellings (``pjit``, ``core_call``, ``copy_p``, ``custom_vjp_call_jaxpr``) and
some are no primitive of the JAX this project pins (``remat``, ``checkpoint``: it calls the
primitive ``remat2``; ``expand_dims``: ``lax.expand_dims`` binds ``broadcast_in_dim``); they are
kept because the analyses' tables held them.
"""

from __future__ import annotations


def _names(text: str) -> frozenset[str]:
    return frozenset(text.split())


# Elementwise: output element ``i`` reads element ``i`` of every operand (broadcast scalars
# aside), by kind.
ARITHMETIC = _names(
    "abs add add_any ceil clamp div floor integer_pow max min mul neg nextafter rem round sign "
    "square sub"
)
TRANSCENDENTAL = _names(
    "acos acosh asin asinh atan atan2 atanh cbrt cos cosh exp exp2 expm1 log log1p logistic pow "
    "rsqrt sin sinh sqrt tan tanh"
)
SPECIAL = _names("digamma erf erf_inv erfc igamma lgamma polygamma zeta")  # special functions
COMPLEX_PARTS = _names("complex conj imag real")
PREDICATES = _names("eq ge gt is_finite le lt ne")  # boolean results: no derivative
SELECTIONS = _names("select_n")  # the predicate (first operand) picks among the others
CONVERSIONS = _names("convert_element_type copy copy_p reduce_precision")  # same value, new type
LOGICAL = _names("and not or xor")  # on booleans and integers
INTEGER_BITS = _names(  # on integers only: never on a value with a derivative
    "clz population_count shift_left shift_right_arithmetic shift_right_logical"
)
ELEMENTWISE = (
    ARITHMETIC
    | TRANSCENDENTAL
    | SPECIAL
    | COMPLEX_PARTS
    | PREDICATES
    | SELECTIONS
    | CONVERSIONS
    | LOGICAL
    | INTEGER_BITS
)

# Moves: every output element is a copy of one operand element (or of a fill value), at a
# position the parameters fix (the dynamic ones: the index operands).
MOVES = _names(
    "broadcast_in_dim concatenate dynamic_slice dynamic_update_slice expand_dims pad reshape rev "
    "slice split squeeze stack transpose"
)

# Output element ``i`` reads the operand elements along the reduced or contracted axes.
REDUCTIONS = _names(
    "argmax argmin reduce_and reduce_max reduce_min reduce_or reduce_prod reduce_sum"
)
CUMULATIVE = _names("cumlogsumexp cummax cummin cumprod cumsum")  # a prefix along one axis
SORTS = _names("sort")  # any element along the sorted axis
CONTRACTIONS = _names("dot_general conv_general_dilated")

# The value passes unchanged: a compiler annotation, or a cut of the derivative.
ANNOTATIONS = _names("optimization_barrier reshard sharding_constraint")
STOP_GRADIENT = _names("stop_gradient")
SOURCES = _names("iota")  # values made from the parameters alone

# Calls evaluated in place: the primitive and the parameter holding the called jaxpr (operands
# map one to one to its inputs).
CALLS = {
    "jit": "jaxpr",
    "pjit": "jaxpr",
    "closed_call": "call_jaxpr",
    "core_call": "call_jaxpr",
    "remat": "jaxpr",
    "remat2": "jaxpr",
    "checkpoint": "jaxpr",
}
# Calls with their own derivative rules (:mod:`bppsa.scan._core.jaxprs.rules`): read by the
# rule wherever derivatives matter, their called function elsewhere.
JVP_RULES = _names("custom_jvp_call")
VJP_RULES = _names("custom_vjp_call custom_vjp_call_jaxpr")  # the second: older JAX
WITH_RULES = JVP_RULES | VJP_RULES

# Neither: no analysis reads these element by element (a cond's branches aside, which the
# element flow reads like calls, any branch possibly running).
BRANCHES = _names("cond")
LOOPS = _names("scan while")
INDEXED = _names(  # elements at positions held in runtime arrays
    "gather scatter scatter-add scatter-max scatter-min scatter-mul scatter-sub"
)
CALLBACKS = _names("debug_callback debug_print io_callback pure_callback")
NEITHER = BRANCHES | LOOPS | INDEXED | CALLBACKS

KNOWN = (
    ELEMENTWISE
    | MOVES
    | REDUCTIONS
    | CUMULATIVE
    | SORTS
    | CONTRACTIONS
    | ANNOTATIONS
    | STOP_GRADIENT
    | SOURCES
    | frozenset(CALLS)
    | WITH_RULES
    | NEITHER
)
