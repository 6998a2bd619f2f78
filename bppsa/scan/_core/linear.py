"""A linear map whose transpose is ours: how forward mode and reverse mode share one scan.

:func:`linear_map` evaluates ``fn(res, lin)``, linear in ``lin``, as one JAX primitive whose
transpose rule is ``transpose(res, ct)``. A scan's JVP rule (:mod:`bppsa.scan._core.vjp`) returns
its
tangents through it, so that

* ``jax.jvp``, ``jax.jacfwd`` and ``jax.linearize`` evaluate ``fn``: the tangent recurrence as
  a parallel scan;
* ``jax.grad``, ``jax.vjp`` and ``jax.jacrev`` linearize the scan and transpose this primitive,
  which runs ``transpose``: the method's own backward (Auto, Blelloch, Chunked, blocks, the
  memory guard), not a transpose that JAX derives from ``fn``.

Under ``jax.vmap`` the transpose may be given whole batches (``batched_transpose``): a scan's
backward then handles the batch as an axis of its own arrays, so that the cotangents of the
parameters the examples share are ONE product contracting over steps and examples, instead of
a product per example summed afterwards. Linear arguments that are not batched stay unbatched
(their cotangent is the sum over the batch).

``jax.custom_vjp`` cannot be differentiated in forward mode, and JAX's ``linear_call`` has no
batching rule (``jax.vmap``), which is why this module defines its own primitive, with the four
rules a primitive needs: evaluation (``fn``, also when lowered under ``jax.jit``), JVP (linear in
``lin``; the derivative w.r.t. ``res`` is JAX's, of ``fn``), transpose and batching (``fn`` and
``transpose`` vmapped). It uses JAX's extension API (``jax.extend.core.Primitive`` and the rule
tables of ``jax.interpreters``); if that is missing, :func:`linear_map` evaluates ``fn`` as plain
JAX code (every transformation still works, reverse mode then through JAX's own transpose) and
:func:`bppsa.scan._core.tracing.problems` lists it, which ``tests/core/test_tracing.py`` fails on.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from bppsa.scan._core import tracing
from bppsa.scan._core.carry import floats_only, zeros_for_none

try:
    from jax.extend.core import Primitive
    from jax.interpreters import ad, batching, mlir

    _EXTENSION_API = True
except ImportError as err:  # pragma: no cover - a JAX without the extension API
    _EXTENSION_API = False
    tracing.record_problem("linear_map", f"cannot define a JAX primitive: {err}")


def linear_map(
    fn: Callable,
    transpose: Callable,
    res: Any,
    lin: Any,
    out_shapes: Any = None,
    batched_transpose: Callable | None = None,
) -> Any:
    """``fn(res, lin)``, linear in ``lin``, with ``transpose(res, ct)`` as its transpose.

    Args:
        fn: ``(res, lin) -> out`` (pytrees of arrays), linear in ``lin``.
        transpose: ``(res, ct_out) -> ct_lin``, the transpose of ``fn`` in ``lin``; ``ct_out``
            has ``None`` for every output leaf that receives no cotangent.
        res: the arguments in which ``fn`` need not be linear.
        lin: the linear arguments (float leaves).
        out_shapes: the shapes and dtypes of ``fn``'s output, if known (else ``fn`` is traced
            once for them).
        batched_transpose: ``(res, res_axes, ct_out, lin_axes) -> ct_lin | None``, the
            transpose of a batch at once, if the caller has one. Batched leaves carry the batch
            on axis 0 (``res_axes``, ``lin_axes``: pytrees of ``0`` or ``None`` like ``res`` and
            ``lin``; every output leaf is batched); an unbatched linear leaf gets its cotangent
            summed over the batch. ``None`` (returned) means: transpose each example instead.
    """
    if _PRIMITIVE is None:  # pragma: no cover - see the module docstring
        return fn(res, lin)
    res_leaves, res_tree = jax.tree.flatten(res)
    lin_leaves, lin_tree = jax.tree.flatten(lin)
    if out_shapes is None:
        out_shapes = jax.eval_shape(fn, res, lin)
    out_leaves, out_tree = jax.tree.flatten(out_shapes)

    def flat_fn(res_leaves, lin_leaves):
        out = fn(res_tree.unflatten(res_leaves), lin_tree.unflatten(lin_leaves))
        return jax.tree.leaves(out)

    def flat_transpose(res_leaves, ct_leaves):
        ct = out_tree.unflatten(ct_leaves)
        ct_lin = transpose(res_tree.unflatten(res_leaves), ct)
        return lin_tree.flatten_up_to(ct_lin)

    flat_batched = None
    if batched_transpose is not None:

        def flat_batched(res_leaves, res_axes, ct_leaves, lin_axes):
            ct_lin = batched_transpose(
                res_tree.unflatten(res_leaves),
                res_tree.unflatten(res_axes),
                out_tree.unflatten(ct_leaves),
                lin_tree.unflatten(lin_axes),
            )
            return None if ct_lin is None else lin_tree.flatten_up_to(ct_lin)

    rule = _Rule(flat_fn, flat_transpose, len(res_leaves), out_leaves, flat_batched)
    out = _PRIMITIVE.bind(*res_leaves, *lin_leaves, rule=rule)
    return jax.tree.unflatten(out_tree, out)


def jvp_rule(
    evaluate: Callable,
    tangents: Callable,
    transpose: Callable,
    *,
    linear: Callable = lambda tangents_in: tangents_in,
    batched_transpose: Callable | None = None,
) -> Callable:
    """The ``jax.custom_jvp`` rule of every differentiable function of the library (a scan over
    time steps, a chain of layers): ``(primals, tangents_in) -> (out, tangents_out)``.

    ``evaluate(*primals) -> (out, res)`` gives the outputs and what the derivatives need; the
    output tangents are :func:`linear_map` of ``tangents(res, lin)``, whose transpose is
    ``transpose`` (and ``batched_transpose``), with ``lin`` the float leaves of
    ``linear(tangents_in)``; an output without a float tangent gets a zero.
    """

    def rule(primals, tangents_in):
        out, res = evaluate(*primals)
        shapes = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), out)
        lin = floats_only(linear(tangents_in))
        dots = linear_map(
            tangents, transpose, res, lin, floats_only(shapes), batched_transpose=batched_transpose
        )
        return out, zeros_for_none(dots, out)

    return rule


def differentiable(
    primal: Callable,
    evaluate: Callable,
    tangents: Callable,
    transpose: Callable,
    *,
    linear: Callable = lambda tangents_in: tangents_in,
    batched_transpose: Callable | None = None,
    outputs: Callable = lambda out: out,
) -> Callable:
    """The library's one differentiable wrapper (scans over time steps and chains of layers):
    ``primal`` as a ``jax.custom_jvp`` with :func:`jvp_rule`'s rule (``outputs`` picks the
    primal's outputs from the rule's, e.g. where ``evaluate`` returns more than ``primal``)."""
    rule = jvp_rule(
        evaluate, tangents, transpose, linear=linear, batched_transpose=batched_transpose
    )

    def picked(primals, tangents_in):
        out, dots = rule(primals, tangents_in)
        return outputs(out), outputs(dots)

    wrapped = jax.custom_jvp(primal)
    wrapped.defjvp(picked)
    return wrapped


class _Rule:
    """The parameters of one bound primitive: its functions over flat leaves and output shapes.

    Compared by identity (a primitive's parameters key JAX's caches).
    """

    def __init__(self, fn, transpose, num_res: int, out_shapes: list, batched_transpose=None):
        self.fn, self.transpose, self.num_res = fn, transpose, num_res
        self.batched_transpose = batched_transpose
        self.out_shapes = [jax.ShapeDtypeStruct(s.shape, s.dtype) for s in out_shapes]

    def split(self, args):
        return list(args[: self.num_res]), list(args[self.num_res :])


def _impl(*args, rule):
    return rule.fn(*rule.split(args))


def _abstract_eval(*args, rule):
    return [jax.core.ShapedArray(s.shape, s.dtype) for s in rule.out_shapes]


def _jvp(primals, tangents, *, rule):
    res, lin = rule.split(primals)
    res_dot, lin_dot = rule.split(tangents)
    lin_dot = [ad.instantiate_zeros(t) for t in lin_dot]
    if all(type(t) is ad.Zero for t in res_dot):  # linear: the tangent is the same map
        out = _PRIMITIVE.bind(*primals, rule=rule)
        return out, _PRIMITIVE.bind(*res, *lin_dot, rule=rule)
    res_dot = [ad.instantiate_zeros(t) for t in res_dot]
    return jax.jvp(rule.fn, (res, lin), (res_dot, lin_dot))


def _transpose(cts, *args, rule):
    res, lin = rule.split(args)
    if any(ad.is_undefined_primal(r) for r in res):
        raise NotImplementedError("bppsa: a scan's tangent map is not linear in its residuals.")
    cts = [None if type(ct) is ad.Zero else ct for ct in cts]
    ct_lin = rule.transpose(res, cts)
    return [None] * len(res) + [
        ct if ad.is_undefined_primal(x) else None for ct, x in zip(ct_lin, lin, strict=True)
    ]


def _batch(args, dims, *, rule):
    size = next(a.shape[d] for a, d in zip(args, dims) if d is not None)
    res, lin = rule.split(args)
    res_dims, lin_dims = rule.split(dims)
    res = [a if d is None else jnp.moveaxis(a, d, 0) for a, d in zip(res, res_dims)]
    lin = [a if d is None else jnp.moveaxis(a, d, 0) for a, d in zip(lin, lin_dims)]
    res_axes = [None if d is None else 0 for d in res_dims]
    lin_axes = [None if d is None else 0 for d in lin_dims]
    fn = jax.vmap(rule.fn, in_axes=(res_axes, lin_axes))

    def transpose(res, cts):
        present = [i for i, ct in enumerate(cts) if ct is not None]
        if rule.batched_transpose is not None:  # every output is batched (out_axes 0 below)
            whole = rule.batched_transpose(res, res_axes, cts, lin_axes)
            if whole is not None:
                return whole

        def one(res, given):
            full = [None] * len(cts)
            for i, ct in zip(present, given):
                full[i] = ct
            return rule.transpose(res, full)

        ct_lin = jax.vmap(one, in_axes=(res_axes, 0))(res, [cts[i] for i in present])
        # An unbatched linear argument was shared by the examples: its cotangent is the sum.
        return [
            ct if axis is not None or ct is None else ct.sum(0)
            for ct, axis in zip(ct_lin, lin_axes)
        ]

    out_shapes = [jax.ShapeDtypeStruct((size, *o.shape), o.dtype) for o in rule.out_shapes]
    batched = _Rule(fn, transpose, len(res), out_shapes)
    out = _PRIMITIVE.bind(*res, *lin, rule=batched)
    return out, [0] * len(out)


def _define():
    if not _EXTENSION_API:  # pragma: no cover
        return None
    try:
        primitive = Primitive("bppsa_linear_map")
        primitive.multiple_results = True
        primitive.def_impl(_impl)
        primitive.def_abstract_eval(_abstract_eval)
        mlir.register_lowering(primitive, mlir.lower_fun(_impl, multiple_results=True))
        ad.primitive_jvps[primitive] = _jvp
        ad.primitive_transposes[primitive] = _transpose
        batching.primitive_batchers[primitive] = _batch
        ad.Zero, ad.instantiate_zeros, ad.is_undefined_primal  # noqa: B018 - fail here if moved
    except Exception as err:  # pragma: no cover - JAX changed its extension API
        tracing.record_problem("linear_map", f"cannot define a JAX primitive: {err!r}")
        return None
    return primitive


_PRIMITIVE = _define()
