"""``bppsa.scan``: ``jax.lax.scan`` with a parallel-scan backward pass (BPPSA)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import jax
import jax.numpy as jnp
from jax import lax

from bppsa import _dependence
from bppsa._carry import Layout, is_float, zero_cotangent
from bppsa.jacobians._capture import match, recording
from bppsa.scan import Dense, Method, resolve
from bppsa.scan._elements import flip, vmap_out_axes

Carry = TypeVar("Carry")
X = TypeVar("X")
Y = TypeVar("Y")

try:  # only used to turn JAX's terse forward-mode error into one that names the alternative
    from jax._src.interpreters import ad as _ad
    from jax._src.interpreters import batching as _batching
except ImportError:  # pragma: no cover - a future JAX without these modules
    _ad = _batching = None


def scan(
    f: Callable[[Carry, X], tuple[Carry, Y]],
    init: Carry,
    xs: X | None = None,
    length: int | None = None,
    reverse: bool = False,
    *,
    method: Method | str | None = None,
) -> tuple[Carry, Y]:
    """Scans ``f`` over ``xs`` exactly like ``jax.lax.scan``; the backward pass is a parallel scan.

    The forward pass is sequential (``lax.scan``). Its reverse-mode derivative, instead of
    back-propagating step by step, builds the transposed Jacobian ``d carry_t / d carry_{t-1}``
    of every step at once (from the cell's analytic builder when the body is a cell of
    :mod:`bppsa.models`, else by autodiff on the flattened float leaves of the carry), scans them
    with ``method`` (BPPSA: Wang, Bai & Pekhimenko, MLSys 2020) to get every carry cotangent, and
    then gets the cotangents of ``xs``, ``init`` and closed-over arrays with one VJP of ``f``
    vmapped over all steps. Cotangents may arrive on every ``y_t`` and on the final carry.

    Args:
        f: ``f(carry, x) -> (carry, y)``; the carry keeps its pytree structure, shapes and dtypes.
        init: initial carry (any pytree; integer and boolean leaves get no gradient).
        xs: pytree of arrays scanned along their leading axis, or ``None`` (then give ``length``).
        length: number of steps; must agree with ``xs``.
        reverse: scan from the end of ``xs`` to its start, as in ``lax.scan``.
        method: backward method, e.g. ``bppsa.Blelloch()`` or ``"sequential"``. ``None`` uses
            the method of the enclosing :func:`bppsa.grad`, else ``Blelloch()``.

    Returns:
        ``(final carry, stacked ys)``, identical to ``jax.lax.scan``.

    Works under ``jax.jit``, ``jax.vmap`` (batch by vmapping a scan over one example) and
    reverse mode of any order. With a parallel method, forward mode (``jax.jvp``,
    ``jax.jacfwd``) raises a ``TypeError``; ``method="sequential"`` is plain ``lax.scan`` and
    supports every transformation.

    Example:
        >>> cell = lambda h, x: (jnp.tanh(w @ h + x), h)
        >>> h_last, hs = bppsa.scan(cell, h0, xs)
    """
    method = resolve(method)
    if not callable(f):
        raise TypeError(f"bppsa.scan: f argument should be a callable, got {type(f).__name__}.")
    out_shape = _check_like_lax_scan(f, init, xs, length, reverse)
    if not method.uses_jacobians:
        return lax.scan(f, init, xs, length=length, reverse=reverse)

    init = _promote_weak_types(init, out_shape[0])
    num_steps = _num_steps(xs, length)
    if reverse:
        xs = jax.tree.map(lambda x: jnp.flip(x, axis=0), xs)
    x_example = jax.tree.map(_unstacked, xs)

    analytic = _has_analytic_jacobian(f, init, x_example)
    step, consts = jax.closure_convert(_step_with_jacobian(f, analytic), init, x_example)
    _refuse_forward_mode(method, (init, xs, consts))

    run = _differentiable_scan(step, method, num_steps, init, analytic)
    carry, ys = run(consts, init, xs)
    if reverse:
        ys = jax.tree.map(lambda y: jnp.flip(y, axis=0), ys)
    return carry, ys


def _check_like_lax_scan(f, init, xs, length, reverse):
    """Runs ``lax.scan``'s own checks (shape-only), so errors read exactly like its errors."""
    try:
        return jax.eval_shape(lambda i, x: lax.scan(f, i, x, length=length, reverse=reverse), init, xs)
    except (TypeError, ValueError) as err:
        if type(err) not in (TypeError, ValueError):
            raise
        raise type(err)(f"bppsa.scan: {err}") from None


def _promote_weak_types(init, carry_out):
    """Casts weakly typed init leaves (Python scalars) to the carry's dtype, as ``lax.scan`` does."""
    return jax.tree.map(lambda x, out: jnp.asarray(x, out.dtype), init, carry_out)


def _num_steps(xs, length) -> int:
    leaves = jax.tree.leaves(xs)
    return int(length) if length is not None else leaves[0].shape[0]


def _has_analytic_jacobian(f, init, x_example) -> bool:
    """Whether the body's carry map is exactly one call of a cell with an analytic Jacobian.

    Traces ``f`` once while recording cell calls. A call qualifies if it maps exactly the float
    carry leaves to the float carry leaves (object identity), if its other inputs (parameters,
    input) do not depend on the carry, and if the shared parts of its Jacobian depend on neither
    the carry nor ``x`` (they are built once, not per step).
    """
    found = []

    def probe(carry, x):
        _, _, call = _matching_call(f, carry, x)
        if call is None:
            return [], []
        found.append(call)
        element = call.build()
        return call.other_inputs, [getattr(element, name) for name in element.shared_fields]

    carry_labels = ["carry" if is_float(leaf) else None for leaf in jax.tree.leaves(init)]
    if "carry" not in carry_labels:
        return False
    labels = carry_labels + ["x"] * len(jax.tree.leaves(x_example))
    deps = _dependence.depends_on(probe, (init, x_example), labels)
    if not found:
        return False
    num_other = len(found[0].other_inputs)
    return not any(deps[:num_other]) and not any(d & {"carry", "x"} for d in deps[num_other:])


def _matching_call(f, carry, x):
    """Runs ``f(carry, x)``; also returns the recorded cell call that is its whole carry map."""
    layout = Layout.of(carry, concat_last=True)
    with recording() as calls:
        new_carry, y = f(carry, x)
    call = match(calls, layout.float_leaves(carry), layout.float_leaves(new_carry))
    return new_carry, y, call


def _step_with_jacobian(f, analytic: bool):
    """``f`` extended to also return its step's transposed Jacobian when a cell provides one."""

    def step(carry, x):
        if not analytic:
            return (*f(carry, x), None)
        new_carry, y, call = _matching_call(f, carry, x)
        return new_carry, y, call.build()

    return step


def _refuse_forward_mode(method: Method, leaves) -> None:
    """Raises a clear error where JAX would apply forward mode to the custom VJP.

    A ``jax.custom_vjp`` function has no forward-mode derivative; JAX would fail later with a
    terse message. Batching traces re-bind the scan one level down, so they are looked through.
    """
    if _ad is None or not jax.config.jax_use_direct_linearize:
        return
    stack = [x for x in jax.tree.leaves(leaves) if isinstance(x, jax.core.Tracer)]
    while stack:
        tracer = stack.pop()
        if isinstance(tracer, _batching.BatchTracer):
            stack.append(tracer.val)
        elif isinstance(tracer, _ad.JVPTracer):
            if not isinstance(tracer.tangent, _ad.Zero):
                raise TypeError(
                    f"bppsa.scan with method={method!r} has no forward-mode derivative "
                    "(jax.jvp, jax.jacfwd, jax.linearize): its backward pass is a custom VJP. "
                    "Use method='sequential' (plain jax.lax.scan), which supports every "
                    "transformation, or reverse mode (jax.grad, jax.vjp, jax.jacrev)."
                )
            stack.append(tracer.primal)


def _differentiable_scan(step, method: Method, num_steps: int, init, analytic: bool):
    """``(consts, init, xs) -> (carry, ys)`` with BPPSA as its VJP.

    ``step(carry, x, *consts) -> (carry, y, jac_t)`` is the closure-converted body; ``jac_t`` is
    the analytic transposed Jacobian of the step, or ``None``.
    """
    layout = Layout.of(init, concat_last=analytic)
    init = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), init)

    def forward(consts, init, xs, keep_carries: bool):
        def body(carry, x):
            new_carry, y, _ = step(carry, x, *consts)
            return new_carry, (y, carry) if keep_carries else y

        return lax.scan(body, init, xs, length=num_steps)

    @jax.custom_vjp
    def run(consts, init, xs):
        return forward(consts, init, xs, keep_carries=False)

    def run_fwd(consts, init, xs):
        carry, (ys, carries_before) = forward(consts, init, xs, keep_carries=True)
        return (carry, ys), (consts, xs, carries_before)

    def run_bwd(residuals, cotangents):
        consts, xs, carries_before = residuals
        ct_carry, ct_ys = cotangents

        def carry_and_y(consts, carry, x):
            new_carry, y, _ = step(carry, x, *consts)
            return new_carry, y

        # One VJP of the body, vmapped over all steps (parallel in t); consts are shared, so
        # their cotangents come out summed over t.
        all_steps = jax.vmap(carry_and_y, in_axes=(None, 0, 0), axis_size=num_steps)
        (carries_after, _), vjp = jax.vjp(all_steps, consts, carries_before, xs)
        no_carry_ct = jax.tree.map(zero_cotangent, carries_after)
        _, from_ys, _ = vjp((no_carry_ct, ct_ys))

        if any(layout.float_mask):
            jac_t = _transposed_jacobians(step, consts, carries_before, xs, layout, analytic)
            # Scan order is reverse time: index 0 is the last step, nearest the loss.
            g = method.scan(
                layout.pack(ct_carry), flip(jac_t), layout.pack(from_ys, stacked=True)[::-1]
            )[::-1]
            ct_init = layout.unpack(g[0], init)
            ct_after = layout.unpack(g[1:], carries_before, stacked=True)
        else:  # nothing in the carry is differentiable
            ct_init, ct_after = layout.zeros(init), no_carry_ct
        ct_consts, _, ct_xs = vjp((ct_after, ct_ys))
        return ct_consts, ct_init, ct_xs

    run.defvjp(run_fwd, run_bwd)
    return run


def _transposed_jacobians(step, consts, carries_before, xs, layout: Layout, analytic: bool):
    """``J_t^T`` for every step, as a stack in time order (vmapped over t)."""
    if analytic:
        one_step = jax.tree.map(_unstacked, (carries_before, xs))
        example = jax.eval_shape(lambda c, x: step(c, x, *consts)[2], *one_step)
        return jax.vmap(
            lambda c, x: step(c, x, *consts)[2], out_axes=vmap_out_axes(example)
        )(carries_before, xs)

    def one(carry, x):
        def carry_map(vector):
            new_carry, _, _ = step(layout.unpack_into(vector, carry), x, *consts)
            return layout.pack(new_carry)

        return jax.jacrev(carry_map)(layout.pack(carry)).T

    return Dense(jax.vmap(one)(carries_before, xs))


def _unstacked(a):
    return jax.ShapeDtypeStruct(a.shape[1:], a.dtype)
