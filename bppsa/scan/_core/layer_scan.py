"""Back-propagation through a chain of layers as a scan over their transposed Jacobians.

``Chain.apply``'s derivatives when the method scans Jacobians (``bppsa.grad(loss,
method=...)``, or the ambient method of an enclosing ``bppsa.grad``), by the derivative rule of
the scans over time: a ``jax.custom_jvp`` whose rule keeps every layer's input (what
back-propagation keeps too) and returns the tangents through the linear primitive of
:mod:`bppsa.scan._core.linear`. Evaluated (``jax.jvp``, ``jax.jacfwd``, ``jax.linearize``), the
tangent is JAX's JVP of the layers' forward; transposed (``jax.grad``, ``jax.vjp``), it is the
method's backward, which

1. builds every layer's transposed Jacobian for the batch (sparse with a static pattern for the
   library's layers, see :mod:`bppsa.jacobians._layers`; dense by autodiff for a user's own
   callable layer),
2. runs the method's ``scan`` over the list of those maps (:func:`bppsa.scan.chain_scan`:
   ``SequentialScan()`` is the sequential chain of sparse matrix-vector products,
   ``Blelloch()`` the full modified Blelloch scan, ``Blelloch(levels=k)`` the paper's ``k``
   parallel levels with a linear scan between them) to get every layer's output cotangent,
3. and takes every layer's parameter cotangent from its own output cotangent (independent of
   each other, so XLA may run them in parallel).

The chain is any sequence of layers that also gives, for each of them, its forward
(``chain.call_layer(layer, params, x, mask)``), its transposed Jacobian
(``chain.layer_jacobian_t(layer, params, x, mask)``: an element of :mod:`bppsa.scan`, ``None``
for an identity, or :data:`AUTODIFF` to have it built by autodiff) and the multiply-adds of its
input gradient in dense back-propagation (``chain.dense_work(layer, output_shape)``, ``None``
where pruning does not thin it), its ``forward`` and its ``shapes``: the layers register their
Jacobians with the core this way (:class:`bppsa.models.Chain`), never the other way round.

The chain's memory guard (:func:`guard`) runs between 1 and 2, at trace time: the products
the method's scan would form (:func:`~bppsa.scan._core.methods.base.chain_levels`) are
known from the static patterns, so a scan that would not fit raises
:class:`bppsa.MemoryLimitError` (listing the levels that would fit) before anything runs.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from bppsa.scan import _chain, _precision
from bppsa.scan._core import options, plans
from bppsa.scan._core.carry import floats_only, zeros_for_none
from bppsa.scan._core.decision import Decision, decide_chain
from bppsa.scan._core.linear import differentiable
from bppsa.scan._core.memory import MemoryLimitError, human, limit_source
from bppsa.scan._core.methods.base import Method, chain_levels
from bppsa.scan._core.methods.blelloch import Blelloch
from bppsa.scan._core.methods.policy import ChainWork, Policy, as_policy, memory_guard
from bppsa.scan._core.methods.resolve import resolve
from bppsa.scan._core.methods.sequential_scan import SequentialScan
from bppsa.scan._core.profiles import profile_of
from bppsa.scan._elements import Dense, MapStack

AUTODIFF = type("Autodiff", (), {"__repr__": lambda self: "AUTODIFF"})()
"""What a chain's ``layer_jacobian_t`` returns for a layer without a builder: the core builds
its dense transposed Jacobian per example by autodiff."""


def apply(chain, params, x, masks):
    """``chain.forward(params, x, masks=masks)``, differentiated by the ambient method."""
    decision = decide_chain(lambda: chain_work(chain, params, x, masks), options.current())
    method = decision.method
    plan = plans.record(
        requested=decision.requested,
        method=method,
        jacobians="sparse" if method.keeps_carries else "autodiff",
        length=len(chain),
        batch=x.shape[0],
    )
    if not method.keeps_carries:  # plain back-propagation: JAX differentiates the forward
        return chain.forward(params, x, masks=masks)
    static, traced = _split_masks(chain, masks)
    run = _differentiable(chain, static, decision, plan)
    return run(params, x, traced)


def layer_maps(chain, params, inputs, masks) -> list[MapStack | None]:
    """Every layer's transposed Jacobian at its input (``None`` for an identity, e.g. Flatten)."""
    return [
        _layer_map(chain, layer, p, x, m) for layer, p, x, m in zip(chain, params, inputs, masks)
    ]


def chain_work(chain, params, x, masks) -> ChainWork:
    """The multiply-adds per example of the chain's convolutions and linear layers: their
    sparse transposed Jacobians' entries, and their dense input gradients' (from the static
    patterns and shapes; nothing runs)."""
    masks = _masks_list(chain, masks)
    spec = jax.ShapeDtypeStruct((1, *x.shape[1:]), x.dtype)
    maps = jax.eval_shape(lambda p, x: layer_maps_at(chain, p, x, masks), params, spec)
    return _work(chain, params, x, maps)


def _work(chain, params, x, maps) -> ChainWork:
    """:func:`chain_work` from the chain's maps (shared values: their entries do not depend on
    the batch the maps were built for): the layers that report a dense backward's multiply-adds
    (``chain.dense_work``: convolutions and linear layers) against their maps' entries."""
    shapes = chain.shapes(tuple(x.shape[1:]), params)
    sparse = dense = 0
    for layer, m, out in zip(chain, maps, shapes[1:]):
        work = chain.dense_work(layer, out)
        if work is not None and m is not None:
            sparse += m.floats_per_step()
            dense += work
    return ChainWork(sparse=int(sparse), dense=int(dense))


def layer_maps_at(chain, params, x, masks) -> list[MapStack | None]:
    """:func:`layer_maps` at the inputs the forward of ``x`` gives every layer."""
    return _maps_and_inputs(chain, params, x, _masks_list(chain, masks))[0]


def estimate_memory(
    chain, params, x, *, masks=None, method: Method | Policy | str | None = None
) -> int:
    """Estimated peak bytes of ``chain.apply``'s forward and backward with ``method``.

    The layers' inputs kept for the backward, their transposed Jacobians as stored, and the
    products the method's scan over the layers forms (from the static patterns: nothing runs).
    ``params`` and ``x`` may be arrays or ``jax.ShapeDtypeStruct``.
    """
    requested = resolve(method)
    masks = _masks_list(chain, masks)
    maps, inputs = jax.eval_shape(lambda p, x: _maps_and_inputs(chain, p, x, masks), params, x)
    policy = as_policy(requested)
    method = policy.chain_method(
        lambda: _work(chain, params, x, maps), profile=policy.profile_or(profile_of())
    )
    if not method.keeps_carries:
        shapes = chain.shapes(tuple(x.shape[1:]), params)
        return _itemsize(x) * x.shape[0] * 3 * sum(math.prod(s) for s in shapes)
    return _footprint_bytes(maps, inputs, chain_levels(method))


def _differentiable(chain, static_masks, decision: Decision, plan):
    """``(params, x, traced_masks) -> y`` with the derivative rule of the scans over time (the
    one wrapper, :func:`bppsa.scan._core.linear.differentiable`).
    Evaluated (forward mode), the map is JAX's JVP of the layers' forward; transposed (reverse
    mode), it is the decision's method's scan over the layers' transposed Jacobians
    (:func:`_backward`)."""

    def masks_of(traced):
        return [t if s is None else s for s, t in zip(static_masks, traced)]

    def forward(params, x, traced):
        with _precision.cell():
            return chain.forward(params, x, masks=masks_of(traced))

    def tangents(res, lin):
        params, inputs, traced = res
        dparams, dx = (zeros_for_none(t, a) for t, a in zip(lin, (params, inputs[0])))
        return jax.jvp(lambda p, x: forward(p, x, traced), (params, inputs[0]), (dparams, dx))[1]

    def transpose(res, ct_y):
        params, inputs, traced = res
        y = jax.eval_shape(forward, params, inputs[0], traced)
        g = jnp.zeros(y.shape, y.dtype) if ct_y is None else ct_y
        with decision.library():
            ct_params, ct_x = _backward(
                chain,
                decision.method,
                decision.requested,
                decision.memory_limit,
                plan,
                params,
                inputs,
                masks_of(traced),
                g,
            )
        return floats_only((ct_params, ct_x))

    def evaluate(params, x, traced):
        inputs, y = _forward(chain, params, x, masks_of(traced))
        return y, (params, inputs, traced)

    return differentiable(forward, evaluate, tangents, transpose, linear=lambda t: t[:2])


def _backward(chain, method, requested, limit, plan, params, inputs, masks, g):
    """``(ct_params, ct_x)`` from the output cotangent ``g``: every layer's transposed Jacobian,
    the memory guard, ``method``'s scan over the layers, then each layer's parameter VJP."""
    maps = layer_maps(chain, params, inputs, masks)
    guard(method, requested, maps, inputs, limit)
    if plan is not None:
        plan.backward = method
    batch = g.shape[0]
    present = [m for m in maps if m is not None]
    scanned = method.scan(g.reshape(batch, -1), present, None)
    # scanned[k] is the cotangent after the k-th present map; identity layers pass theirs.
    outs, k = [None] * len(maps), len(present)
    current = scanned[k]
    for i in reversed(range(len(maps))):
        outs[i] = current
        if maps[i] is not None:
            k -= 1
            current = scanned[k]
    ct_params = [
        _param_cotangent(chain, layer, p, xi, m, gi)
        for layer, p, xi, m, gi in zip(chain, params, inputs, masks, outs)
    ]
    ct_x = current.reshape(inputs[0].shape).astype(inputs[0].dtype)
    return ct_params, ct_x


def _forward(chain, params, x, masks):
    inputs = []
    for layer, p, m in zip(chain, params, masks):
        inputs.append(x)
        x = _call_layer(chain, layer, p, x, m)
    return inputs, x


def _maps_and_inputs(chain, params, x, masks):
    inputs, _ = _forward(chain, params, x, masks)
    return layer_maps(chain, params, inputs, masks), inputs


def _call_layer(chain, layer, p, x, mask):
    with _precision.cell():  # the layer's own products keep the user's precision
        return chain.call_layer(layer, p, x, mask)


def _layer_map(chain, layer, p, x, mask) -> MapStack | None:
    built = chain.layer_jacobian_t(layer, p, x, mask)
    return _autodiff_map(chain, layer, p, x, mask) if built is AUTODIFF else built


def _autodiff_map(chain, layer, p, x, mask) -> Dense:
    """A layer without a transposed-Jacobian builder: its dense one per example, by autodiff."""

    def one(xi):
        def fn(z):
            return _call_layer(chain, layer, p, z.reshape(1, *xi.shape), mask).reshape(-1)

        return jax.jacrev(fn)(xi.reshape(-1))

    jac = jax.vmap(one)(x)  # (B, n_out, n_in)
    return Dense(jnp.swapaxes(jac, -1, -2)[None])


def _param_cotangent(chain, layer, p, x, mask, g_out):
    # A pruned weight's cotangent is the dense VJP of the masked layer (exactly zero where
    # masked): gathering only the unmasked entries' patches was measured slower, even at 97%
    # pruning (experiments/pruned_vgg11.py benchmark).
    if not jax.tree.leaves(p):
        return jax.tree.map(jnp.zeros_like, p)
    y, vjp = jax.vjp(lambda p: _call_layer(chain, layer, p, x, mask), p)
    (ct,) = vjp(g_out.reshape(y.shape).astype(y.dtype))
    return ct


def _masks_list(chain, masks) -> list:
    if masks is None:
        return [None] * len(chain)
    return [m if m else None for m in masks]


def _split_masks(chain, masks) -> tuple[list, list]:
    """Masks with concrete values (their pruned entries leave the static patterns) apart from
    traced ones (which can only zero values)."""
    static: list = []
    traced: list = []
    for m in _masks_list(chain, masks):
        leaves = jax.tree.leaves(m)
        if m is not None and all(not isinstance(v, jax.core.Tracer) for v in leaves):
            static.append(jax.tree.map(np.asarray, m))
            traced.append(None)
        else:
            static.append(None)
            traced.append(m)
    return static, traced


def _fewer_levels(levels, maps) -> list[int]:
    present = sum(m is not None for m in maps)
    top = max(0, math.ceil(math.log2(present + 1))) if levels is None else levels
    return list(range(top - 1, -1, -1))


def _footprint_bytes(maps: Sequence, inputs: Sequence, levels) -> int:
    present = [m for m in maps if m is not None]
    itemsize = _itemsize(inputs[0])
    kept = sum(math.prod(x.shape) for x in inputs)
    stored = sum(m.floats_per_step() for m in present)
    formed = _chain.chain_memory(present, levels=levels, batch=inputs[0].shape[0]) if present else 0
    return int(itemsize * (2 * kept + stored + formed))


def _itemsize(x) -> int:
    return jnp.dtype(x.dtype).itemsize


def guard(method: Method, requested, maps: list, inputs: list, limit: float | None) -> None:
    """The memory guard of a chain's backward (:func:`~bppsa.scan._core.methods.policy.
    memory_guard`, the one of scans over time too): the layers' inputs kept, their transposed
    Jacobians (``None`` for an identity) and the products ``method``'s scan forms, against
    ``limit`` bytes (``None``: the default device's memory).

    Raises:
        MemoryLimitError: naming ``requested`` and listing the levels that fit.
    """
    need = _footprint_bytes(maps, inputs, chain_levels(method))

    def error(limit_bytes):
        return _memory_error(requested, method, need, limit, limit_bytes, maps, inputs)

    memory_guard(method, need, limit, error)


def _memory_error(requested, method, need, limit, limit_bytes, maps, inputs) -> MemoryLimitError:
    fits = []
    for levels in _fewer_levels(chain_levels(method), maps):
        b = _footprint_bytes(maps, inputs, levels)
        if b <= limit_bytes:
            fits.append((SequentialScan() if levels == 0 else Blelloch(levels=levels), b))
    source = limit_source(limit)
    advice = (
        "Fewer levels fit: " + ", ".join(f"bppsa.{m!r} (~{human(b)})" for m, b in fits[:3])
        if fits
        else "No scan over these layers fits; use fewer examples."
    )
    message = (
        f"Chain.apply: the backward with method={requested!r} ({_describe(method)}) needs about "
        f"{human(need)}, more than the limit of {human(limit_bytes)} ({source}). {advice} "
        "method='sequential' is plain back-propagation; raise memory_limit (math.inf turns "
        "this check off)."
    )
    return MemoryLimitError(message, need, limit_bytes, fits)


def _describe(method: Method) -> str:
    """A few words for messages: what ``method``'s scan over the layers does."""
    levels = chain_levels(method)
    if levels == 0:
        return "sequential sparse chain"
    return "all parallel levels" if levels is None else f"{levels} parallel levels"
