"""The recurrence evaluated on arrays padded to powers of two, exactly.

Pallas' GPU (Triton) lowering wants every array's size a power of two. :func:`run_padded`
evaluates the recurrence's equations on arrays whose every axis is padded to the next power of
two (:func:`padded_shape`). Padded lanes hold anything (they are never read as values); each
rule keeps them out of what mixes lanes:

* elementwise operations act lane by lane: padded lanes stay apart;
* reductions and contractions first set the padded lanes of the reduced axes to the operation's
  identity (:func:`valid_lanes` is the mask), so a mean or a layer norm over ``H = 20`` is that
  over 20 lanes;
* moves (``slice``, ``split``, ``concatenate``, ``pad``, ``rev``) select each output lane from
  its input lane with an iota comparison and a reduction (the lowering has no rule for them);
* ``dot_general`` is a broadcast product and a sum over the masked contracting axes: the carry
  of one example is a vector, below the 16-per-side minimum of the GPU's matrix units. A vector
  times a constant matrix reads the matrix arranged for the program's warps
  (:mod:`~bppsa.scan._core.fused.matvec`), so that each sum stays within its warp.

Low-precision floats (bfloat16, float16) are computed in float32 and rounded after every
operation, as XLA does on CPUs and GPUs. :func:`unsupported` says why an equation cannot run.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.extend.core import Literal

from bppsa.scan._core.fused import matvec
from bppsa.scan._core.jaxprs import taxonomy
from bppsa.scan._core.jaxprs.walk import bind


def pow2(n: int) -> int:
    """The smallest power of two ``>= n`` (``1`` for ``0``)."""
    n = int(n)
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def padded_shape(shape: Sequence[int]) -> tuple[int, ...]:
    return tuple(pow2(d) for d in shape)


def valid_lanes(shape: Sequence[int], axes: Sequence[int]) -> Any:
    """``padded_shape(shape)`` booleans, true where the index along every axis of ``axes`` is
    within ``shape`` (``None`` where nothing along them is padded)."""
    padded = padded_shape(shape)
    mask = None
    for axis in axes:
        if padded[axis] != shape[axis]:
            lane = lax.broadcasted_iota(jnp.int32, padded, axis) < shape[axis]
            mask = lane if mask is None else mask & lane
    return mask


def masked(x, shape: Sequence[int], axes: Sequence[int], fill) -> Any:
    """``x`` with the padded lanes of ``axes`` set to ``fill``."""
    mask = valid_lanes(shape, axes)
    if mask is None:
        return x
    return lax.select(mask, x, lax.full_like(x, fill))


# The elementwise primitives of the taxonomy that have a padded rule (lane by lane): all but the
# complex ones (the kernel refuses complex dtypes), and the special functions (``erf_inv``
# aside), ``round`` and ``reduce_precision``, which the Triton lowering has no rule for.
# :func:`unsupported` asks the lowering of every equation anyway.
ELEMENTWISE = (
    taxonomy.ELEMENTWISE
    - taxonomy.COMPLEX_PARTS
    - (taxonomy.SPECIAL - {"erf_inv"})
    - {"round", "reduce_precision"}
)
# computed in float32 for low-precision floats (not conversions, comparisons, selections)
_UPCAST = (
    ELEMENTWISE
    - taxonomy.CONVERSIONS
    - taxonomy.PREDICATES
    - taxonomy.SELECTIONS
    - taxonomy.LOGICAL
)
_LOW = (jnp.bfloat16, jnp.float16)


def _shape(v) -> tuple[int, ...]:
    return tuple(v.aval.shape)


def _elementwise(eqn, args):
    dtype = eqn.outvars[0].aval.dtype
    low = [a for a in args if jnp.result_type(a) in _LOW]
    if eqn.primitive.name in _UPCAST and low and eqn.params.get("out_dtype") is None:
        args = [a.astype(jnp.float32) if jnp.result_type(a) in _LOW else a for a in args]
        return [out.astype(dtype) for out in bind(eqn, *args)]
    return bind(eqn, *args)


def _iota(eqn, args):
    return bind(eqn, shape=padded_shape(eqn.params["shape"]))


def _broadcast_in_dim(eqn, args):
    return bind(eqn, *args, shape=padded_shape(eqn.params["shape"]))


def _squeeze(eqn, args):
    return bind(eqn, *args)


def _reshape(eqn, args):
    return [args[0].reshape(padded_shape(_shape(eqn.outvars[0])))]


def _reshape_problem(eqn) -> str | None:
    before, after = _shape(eqn.invars[0]), _shape(eqn.outvars[0])
    if [d for d in before if d != 1] == [d for d in after if d != 1]:
        return None  # only axes of size 1 added or removed
    if padded_shape(before) == before and padded_shape(after) == after:
        return None
    return f"a reshape from {before} to {after} (axes not powers of two)"


def _transpose(eqn, args):
    return bind(eqn, *args)


def _unsharded(eqn, args):
    """A sharding annotation (JAX's transposes emit ``reshard`` under a mesh): inside the
    kernel one program holds the whole array, so the value passes unchanged."""
    return list(args)


_IDENTITIES: dict[str, Callable[[Any], Any]] = {
    "reduce_sum": lambda dtype: 0,
    "reduce_max": lambda dtype: (
        -jnp.inf if jnp.issubdtype(dtype, jnp.floating) else jnp.iinfo(dtype).min
    ),
    "reduce_min": lambda dtype: (
        jnp.inf if jnp.issubdtype(dtype, jnp.floating) else jnp.iinfo(dtype).max
    ),
    "argmax": lambda dtype: (
        -jnp.inf if jnp.issubdtype(dtype, jnp.floating) else jnp.iinfo(dtype).min
    ),
    "argmin": lambda dtype: (
        jnp.inf if jnp.issubdtype(dtype, jnp.floating) else jnp.iinfo(dtype).max
    ),
}


def _reduce(eqn, args):
    (x,) = args
    fill = _IDENTITIES[eqn.primitive.name](jnp.result_type(x))
    x = masked(x, _shape(eqn.invars[0]), eqn.params["axes"], fill)
    if jnp.result_type(x) in _LOW and eqn.primitive.name == "reduce_sum":
        return [bind(eqn, x.astype(jnp.float32))[0].astype(jnp.result_type(x))]
    return bind(eqn, x)


def _dot_general(eqn, args, permuted=None, num_warps: int = 1):
    """``dot_general`` as a broadcast product summed over the (masked) contracting axes, in a
    program of ``num_warps`` warps.

    ``permuted`` maps ``(variable, order)`` to an operand's value already in the order the
    product reads it (:func:`dot_orders`; a constant permuted and padded before the loop, zero
    in its padded lanes: :func:`permuted_constants`)."""
    (lc, rc), (lb, rb) = eqn.params["dimension_numbers"]
    lhs, rhs = args
    lshape, rshape = _shape(eqn.invars[0]), _shape(eqn.invars[1])
    out_dtype = eqn.outvars[0].aval.dtype
    acc = jnp.float32 if jnp.issubdtype(out_dtype, jnp.floating) else jnp.int32
    found = matrix_of(eqn, num_warps)
    key = None if found is None else (eqn.invars[found[0]], found[1])
    if found is not None and permuted and key in permuted:
        m, layout = found
        vector = masked(jnp.asarray(args[1 - m]).astype(acc), _shape(eqn.invars[1 - m]), [0], 0)
        product = matvec.product(layout, vector, permuted[key].astype(acc))
        return [product.astype(out_dtype)]
    first = _contracting_first(eqn, num_warps)
    lorder, rorder = _orders(eqn, first)
    ready = [
        None if isinstance(v, Literal) else (permuted or {}).get((v, order))
        for v, order in zip(eqn.invars, (lorder, rorder))
    ]
    lhs = _operand(lhs, lshape, lc, lorder, acc, ready[0])
    rhs = _operand(rhs, rshape, rc, rorder, acc, ready[1])
    nb, nl, nr = len(lb), len(lorder) - len(lb) - len(lc), len(rorder) - len(rb) - len(rc)
    nc = len(lc)
    # (B, C, LF, 1..) * (B, C, 1.., RF) -> (B, C, LF, RF), summed over C (contracting first),
    # or (B, LF, 1.., C) * (B, 1.., RF, C) -> (B, LF, RF, C), summed over C (last)
    free = nb + nc if first else nb
    lhs = lax.expand_dims(lhs, tuple(range(free + nl, free + nl + nr)))
    rhs = lax.expand_dims(rhs, tuple(range(free, free + nl)))
    product = lhs * rhs
    summed = nb if first else nb + nl + nr
    out = product.sum(axis=tuple(range(summed, summed + nc))) if nc else product
    return [out.astype(out_dtype)]


def matrix_of(eqn, num_warps: int) -> tuple[int, matvec.Arranged] | None:
    """Where ``eqn`` multiplies a vector by a matrix: the matrix's operand index and how it is
    arranged for a program of ``num_warps`` warps (:mod:`~bppsa.scan._core.fused.matvec`);
    ``None`` for any other contraction."""
    (lc, rc), (lb, rb) = eqn.params["dimension_numbers"]
    if lb or rb or len(lc) != 1 or any(isinstance(v, Literal) for v in eqn.invars):
        return None
    ranks = [len(_shape(v)) for v in eqn.invars]
    if sorted(ranks) != [1, 2]:
        return None
    m = ranks.index(2)
    contracting = (lc, rc)[m][0]
    shape = padded_shape(_shape(eqn.invars[m]))
    return m, matvec.Arranged(contracting, shape[contracting], shape[1 - contracting], num_warps)


# The most padded entries a contraction sums with its contracting axes last, in programs of
# more than one warp (see dot_orders).
ROW_CONTRACTION = 32


def _contracting_first(eqn, num_warps: int) -> bool:
    (lc, _), _ = eqn.params["dimension_numbers"]
    lshape = padded_shape(_shape(eqn.invars[0]))
    return num_warps == 1 or math.prod(lshape[d] for d in lc) > ROW_CONTRACTION


def dot_orders(eqn, num_warps: int = 1) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The axis order in which ``dot_general``'s rule reads each operand in a program of
    ``num_warps`` warps: batch axes first, then the contracting axes first, or last in a
    program of several warps where they hold at most :data:`ROW_CONTRACTION` padded entries.

    Triton lays a row-major array out with its last axis across the threads of a warp (four
    entries a thread, eight threads along a row of 32) and its first axis across the rest of
    the threads and the warps. Summed down the columns (contracting axes first), a contraction
    of one warp stays within the warp and leaves each thread a quarter of a row's outputs
    (fewer outputs a thread than a row sum leaves, and fewer shuffles); in several warps the
    columns run across warps, summed through shared memory. There a short contraction is
    summed along the rows, within the warp; a longer one would leave each thread many outputs,
    each held by the 16 or more threads that summed it, and the elementwise work after the
    contraction (a gate's sigmoid) repeated on all of them: it is summed down the columns."""
    return _orders(eqn, _contracting_first(eqn, num_warps))


def _orders(eqn, first: bool) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Each operand's axes: batch, then contracting and free (``first``) or free and
    contracting."""
    (lc, rc), (lb, rb) = eqn.params["dimension_numbers"]
    orders = []
    for v, contracting, batch in ((eqn.invars[0], lc, lb), (eqn.invars[1], rc, rb)):
        free = [d for d in range(len(_shape(v))) if d not in contracting and d not in batch]
        if first:
            orders.append((*batch, *contracting, *free))
        else:
            orders.append((*batch, *free, *contracting))
    return orders[0], orders[1]


def _operand(x, shape, contracting, order, acc, ready):
    """A contraction's operand as its product reads it: cast, masked along the contracting
    axes and permuted to ``order`` (``ready``: that already, from before the loop)."""
    if ready is not None:
        return ready.astype(acc)
    return _permute(masked(x.astype(acc), shape, contracting, 0), order)


def _permute(x, order):
    return x if list(order) == list(range(x.ndim)) else lax.transpose(x, tuple(order))


def _moved(x, shape: Sequence[int], axis: int, source: Callable, size: int):
    """Output lanes ``j < size`` along ``axis`` taken from input lane ``source(j)`` (an
    affine map of ``j``), zero elsewhere: an iota comparison and a sum (exact: one term)."""
    padded_in, padded_out = padded_shape(shape)[axis], pow2(size)
    dtype = jnp.result_type(x)
    x = masked(x, shape, [axis], 0)
    x = jnp.moveaxis(x, axis, -1) if axis != x.ndim - 1 else x
    k = lax.broadcasted_iota(jnp.int32, (padded_in, padded_out), 0)
    j = lax.broadcasted_iota(jnp.int32, (padded_in, padded_out), 1)
    pick = (k == source(j)) & (j < size)
    picked = lax.select(
        jnp.broadcast_to(pick, (*x.shape[:-1], padded_in, padded_out)),
        jnp.broadcast_to(x[..., :, None], (*x.shape[:-1], padded_in, padded_out)),
        jnp.zeros((*x.shape[:-1], padded_in, padded_out), dtype),
    )
    out = picked.sum(axis=-2, dtype=dtype) if dtype != jnp.bool_ else picked.any(axis=-2)
    return jnp.moveaxis(out, -1, axis) if axis != out.ndim - 1 else out


def _changed_axes(before, after) -> list[int]:
    return [d for d, (a, b) in enumerate(zip(before, after)) if a != b]


def _slice(eqn, args):
    (x,) = args
    shape = _shape(eqn.invars[0])
    out = _shape(eqn.outvars[0])
    starts = eqn.params["start_indices"]
    strides = eqn.params["strides"] or (1,) * len(shape)
    for axis in range(len(shape)):
        if starts[axis] == 0 and strides[axis] == 1 and out[axis] == shape[axis]:
            continue
        s, st = starts[axis], strides[axis]
        x = _moved(x, shape, axis, lambda j, s=s, st=st: s + st * j, out[axis])
        shape = (*shape[:axis], out[axis], *shape[axis + 1 :])
    return [x]


def _split(eqn, args):
    (x,) = args
    shape, axis = _shape(eqn.invars[0]), eqn.params["axis"]
    outs, start = [], 0
    for size in eqn.params["sizes"]:
        outs.append(_moved(x, shape, axis, lambda j, s=start: s + j, size))
        start += size
    return outs


def _rev(eqn, args):
    (x,) = args
    shape = _shape(eqn.invars[0])
    for axis in eqn.params["dimensions"]:
        n = shape[axis]
        x = _moved(x, shape, axis, lambda j, n=n: n - 1 - j, n)
    return [x]


def _concatenate(eqn, args):
    axis = eqn.params["dimension"]
    size = _shape(eqn.outvars[0])[axis]
    out, start = None, 0
    for x, v in zip(args, eqn.invars):
        shape = _shape(v)
        part = _moved(x, shape, axis, lambda j, s=start: j - s, size)
        if out is None:
            out = part
        else:
            lane = lax.broadcasted_iota(jnp.int32, part.shape, axis)
            out = lax.select((lane >= start) & (lane < start + shape[axis]), part, out)
        start += shape[axis]
    return [out]


def _pad(eqn, args):
    x, value = args
    shape = _shape(eqn.invars[0])
    out_shape = _shape(eqn.outvars[0])
    for axis, (lo, _, _) in enumerate(eqn.params["padding_config"]):
        if out_shape[axis] == shape[axis] and lo == 0:
            continue
        n = shape[axis]
        x = _moved(x, shape, axis, lambda j, lo=lo: j - lo, out_shape[axis])
        lane = lax.broadcasted_iota(jnp.int32, x.shape, axis)
        x = lax.select((lane >= lo) & (lane < lo + n), x, lax.full_like(x, value))
        shape = (*shape[:axis], out_shape[axis], *shape[axis + 1 :])
    return [x]


def _pad_problem(eqn) -> str | None:
    if any(interior for _, _, interior in eqn.params["padding_config"]):
        return "a pad with interior padding"
    return None


RULES: dict[str, Callable] = {
    **dict.fromkeys(ELEMENTWISE, _elementwise),
    "iota": _iota,
    "broadcast_in_dim": _broadcast_in_dim,
    "squeeze": _squeeze,
    "reshape": _reshape,
    "transpose": _transpose,
    "reshard": _unsharded,
    "sharding_constraint": _unsharded,
    "reduce_sum": _reduce,
    "reduce_max": _reduce,
    "reduce_min": _reduce,
    "argmax": _reduce,
    "argmin": _reduce,
    "dot_general": _dot_general,
    "slice": _slice,
    "split": _split,
    "rev": _rev,
    "concatenate": _concatenate,
    "pad": _pad,
}
_PROBLEMS: dict[str, Callable] = {"reshape": _reshape_problem, "pad": _pad_problem}
# what the rules emit besides the primitive itself
_REWRITTEN = frozenset(RULES) - ELEMENTWISE - {"iota", "broadcast_in_dim", "transpose"}
_REWRITTEN |= {"squeeze", "reshape", "reduce_sum", "reduce_max", "reduce_min"}


def unsupported(eqn, lowered: Callable[[str], bool]) -> str | None:
    """Why the kernel cannot run ``eqn`` (``None``: it can), where ``lowered(name)`` says
    whether the backend's lowering has a rule for a primitive the padded rule binds as it is."""
    name = eqn.primitive.name
    if eqn.effects:
        return f"the primitive {name!r} has effects"
    if name not in RULES:
        return f"the primitive {name!r} has no padded rule"
    for v in [*eqn.invars, *eqn.outvars]:
        dtype = np.dtype(v.aval.dtype)
        if dtype.itemsize == 8 or jnp.issubdtype(dtype, jnp.complexfloating):
            return f"the primitive {name!r} works on {dtype.name}"
    if name not in _REWRITTEN and not lowered(name):
        return f"the GPU lowering has no rule for the primitive {name!r}"
    problem = _PROBLEMS.get(name)
    return problem(eqn) if problem else None


def largest_tile(eqn) -> int:
    """Entries of the largest padded array ``eqn``'s rule forms (a contraction's product)."""
    sizes = [math.prod(padded_shape(_shape(v))) for v in [*eqn.invars, *eqn.outvars]]
    if eqn.primitive.name == "dot_general":
        (lc, _), _ = eqn.params["dimension_numbers"]
        contracted = math.prod(padded_shape(_shape(eqn.invars[0]))[d] for d in lc)
        sizes.append(math.prod(padded_shape(_shape(eqn.outvars[0]))) * contracted)
    elif eqn.primitive.name in ("slice", "split", "rev", "concatenate", "pad"):
        sizes.append(max(sizes) ** 2)  # a bound on the selection's (in, out) lanes
    return max(sizes)


def permuted_constants(
    eqns: Sequence[Any], constants: Sequence[Any], num_warps: int = 1
) -> list[tuple]:
    """The ``(variable, order)`` pairs of the ``constants`` that a contraction of ``eqns``
    reads permuted (:func:`dot_orders`) in a program of ``num_warps`` warps: the kernel
    permutes them once, before its loop, rather than at every step. A matrix that multiplies a
    vector comes arranged instead (``order`` a :class:`~bppsa.scan._core.fused.matvec.Arranged`:
    :func:`matrix_of`)."""
    wanted = set(constants)
    pairs: list[tuple] = []
    for eqn in eqns:
        if eqn.primitive.name != "dot_general":
            continue
        found = matrix_of(eqn, num_warps)
        if found is not None and eqn.invars[found[0]] in wanted:
            if (eqn.invars[found[0]], found[1]) not in pairs:
                pairs.append((eqn.invars[found[0]], found[1]))
            continue
        for v, order in zip(eqn.invars, dot_orders(eqn, num_warps)):
            if isinstance(v, Literal) or v not in wanted or order == tuple(range(len(order))):
                continue
            if (v, order) not in pairs:
                pairs.append((v, order))
    return pairs


def run_padded(
    eqns: Sequence[Any], env: dict, permuted: dict | None = None, num_warps: int = 1
) -> dict:
    """Evaluates ``eqns`` on padded arrays into ``env`` (variables to padded values), for a
    program of ``num_warps`` warps; ``permuted`` maps :func:`permuted_constants`' pairs (of the
    same warps) to their values, permuted and padded (zero in the padded lanes)."""

    def read(v):
        return v.val if isinstance(v, Literal) else env[v]

    for eqn in eqns:
        args = [read(v) for v in eqn.invars]
        if eqn.primitive.name == "dot_general":
            outs = _dot_general(eqn, args, permuted, num_warps)
        else:
            outs = RULES[eqn.primitive.name](eqn, args)
        env.update(zip(eqn.outvars, outs))
    return env
