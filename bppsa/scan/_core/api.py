"""``bppsa.scan`` and ``bppsa.estimate_memory``: argument checks and wiring.

Everything else has its own module: the options (:mod:`~bppsa.scan._core.options`), the one trace of
the body and the footprint (:mod:`~bppsa.scan._core.problem`), the one decision of what runs
(:mod:`~bppsa.scan._core.decision`), the methods, which carry out the backward
(:mod:`~bppsa.scan._core.methods`), and the forward slot (:mod:`~bppsa.scan._core.forward`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TypeVar

import jax
import jax.numpy as jnp

from bppsa.scan._core import debug, plans, vjp
from bppsa.scan._core.asked import options_from
from bppsa.scan._core.auto_forward import AutoForward
from bppsa.scan._core.decision import decide
from bppsa.scan._core.forward import Forward
from bppsa.scan._core.methods import Method, Policy, as_policy, resolve
from bppsa.scan._core.methods.auto import checked_footprint
from bppsa.scan._core.options import current
from bppsa.scan._core.problem import prepare
from bppsa.scan._core.profiles import profile_of
from bppsa.scan._precision import Precision

Carry = TypeVar("Carry")
X = TypeVar("X")
Y = TypeVar("Y")


def scan(
    f: Callable[[Carry, X], tuple[Carry, Y]],
    init: Carry,
    xs: X | None = None,
    length: int | None = None,
    reverse: bool = False,
    unroll: int | bool = 1,
    *,
    method: Method | Policy | str | None = None,
    memory_limit: float | str | None = None,
    check_finite: bool | None = None,
    batch: int | None = None,
    forward: Forward | AutoForward | str | None = None,
    precision: str | Precision | None = None,
    check_structure: bool | None = None,
    linear_vjp: bool | None = None,
) -> tuple[Carry, Y]:
    """Scans ``f`` over ``xs`` exactly like ``jax.lax.scan``; the backward pass is a parallel scan.

    The forward pass is ``lax.scan`` (on accelerators, where it pays, a certified parallel
    Newton forward: see ``forward``); the body is traced once. Its reverse-mode
    derivative, instead of back-propagating step by step, builds the transposed Jacobian
    ``d carry_t / d carry_{t-1}`` of every step at once (from the cell's analytic builder when
    the body is a cell of :mod:`bppsa.models`, else by autodiff on the flattened float leaves of
    the carry), scans them with ``method`` (BPPSA: Wang, Bai & Pekhimenko, MLSys 2020) to get
    every carry cotangent, and then gets the cotangents of ``xs``, ``init`` and closed-over
    arrays with one VJP of ``f`` vmapped over all steps. Cotangents may arrive on every ``y_t``
    and on the final carry.

    Args:
        f: ``f(carry, x) -> (carry, y)``; the carry keeps its pytree structure, shapes and dtypes.
        init: initial carry (any pytree; integer and boolean leaves get no gradient).
        xs: pytree of arrays scanned along their leading axis, or ``None`` (then give ``length``).
        length: number of steps; must agree with ``xs``.
        reverse: scan from the end of ``xs`` to its start, as in ``lax.scan``.
        unroll: steps per iteration of the sequential forward's loop, as in ``lax.scan`` (an
            int >= 0 or a bool; ``0`` or ``True`` unrolls every step). Plain
            back-propagation (``method="sequential"`` with the sequential forward) is JAX's
            derivative of that ``lax.scan``, so its backward loop is unrolled alike; a
            parallel method's backward, and the Newton, fused and pipelined forwards, do not
            run that loop, and there it changes nothing.
        method: backward method, e.g. ``bppsa.Blelloch()`` or a name: ``"auto"``,
            ``"blelloch"``, ``"blocked"``, ``"chunked"``, ``"fused-sequential"``,
            ``"sequential"`` (plain back-propagation), ``"sequential-scan"``, ``"sharded"``
            (``_`` or ``-`` alike). ``None`` uses the method of the enclosing
            :func:`bppsa.grad`, else ``bppsa.Auto()``.
        memory_limit: bytes the backward pass of this scan may use (``None``: the limit of the
            enclosing :func:`bppsa.grad`, else the default device's memory, a constant of the
            device: the allocator's limit on accelerators, the host's physical memory on the
            CPU; ``"available"``: what is free on the default device when ``bppsa.scan`` is
            called, read once, then a number; ``math.inf``: no check). When the backward is
            traced, the method's memory is estimated for this scan (``T``, the carry and
            Jacobian sizes, the dtype and the ``jax.vmap`` batch, see ``batch``); over the
            limit, ``bppsa.Auto()`` falls back to a lower-memory method (raising where none
            fits) and an explicit method raises :class:`bppsa.MemoryLimitError`, which lists
            the alternatives that fit.
        check_finite: if True, the backward pass raises ``FloatingPointError`` when a Jacobian
            or cotangent holds a NaN or infinity, naming (as indices into ``xs``) the earliest
            step whose Jacobian is not finite and the latest step where a non-finite cotangent
            arises, and a scan that is only run (no derivative taken) raises it when its
            forward pass is not finite, naming the earliest step that returns a NaN or
            infinity (see :mod:`bppsa.scan._core.debug`; under the user's ``jax.jit``, JAX
            raises its ``JaxRuntimeError``, whose message ends with this one). ``None``: the
            setting of the enclosing :func:`bppsa.grad`, else False. Without it, non-finite
            values propagate as in ``jax.grad``.
        batch: examples this scan serves at once (what ``Auto()`` and the memory guard weigh);
            ``None``: read from the ``jax.vmap`` traces the scan is traced under.
        forward: how the forward pass runs: ``"sequential"`` (``lax.scan``),
            ``bppsa.Newton(...)`` / ``"newton"`` (Newton iterations on the whole trajectory,
            each a parallel scan, certified to the residual tolerance; see
            :class:`bppsa.Newton`), ``bppsa.Fused(...)`` / ``"fused"`` (the loop in one GPU
            kernel launch, the carry on chip; see :class:`bppsa.Fused`),
            ``bppsa.Pipelined(mesh)`` / ``"pipelined"`` (``lax.scan`` device after device,
            for a ``bppsa.Sharded`` backward; see :class:`bppsa.Pipelined`) or ``"auto"``.
            Names take ``_`` or ``-`` alike. ``None``: that of the enclosing
            :func:`bppsa.grad`, else ``"auto"``: ``lax.scan`` on CPUs, on accelerators Newton
            bounded at the cost model's break-even iteration count where it can pay (see
            :class:`bppsa.AutoForward`; :func:`bppsa.trace_plans` records the choice and why).
        precision: of the matrix products ``bppsa`` itself forms (the scan's combines, the
            Jacobians' applications, chunk aggregates, structured blocks, Newton's linear
            solves), in ``jax.lax``'s vocabulary: ``"highest"``, ``"high"``, ``"default"``, a
            ``jax.lax.Precision`` or a ``jax.lax.DotAlgorithmPreset``. ``None``: that of the
            enclosing :func:`bppsa.grad`, else ``"highest"``, which keeps the gradients as
            close to a float64 reference as back-propagation's on every backend (at JAX's
            default, TF32 on recent NVIDIA GPUs, a parallel scan's gradients drift by about
            1e-3; docs/accuracy.md). The body's own products keep the body's precision.
        check_structure: wherever the Jacobians are built in a structure found in ``f``
            (diagonal, block-diagonal; see :attr:`bppsa.ScanPlan.jacobians`), check it against
            the step itself. ``None`` (the setting of the enclosing :func:`bppsa.grad`, else
            the default): at the middle step, the structured ``J^T`` applied to two fixed
            pseudo-random vectors is compared with the step's own VJP of them (the cost of
            two more VJPs of one step); a mismatch raises ``ValueError`` naming the structure,
            the step (as an index into ``xs``) and the carry element that differs most.
            ``True``: the first, middle and last steps are differentiated densely (one JVP per
            carry element) and compared entry by entry, the error naming the largest entry
            missed: the first thing to turn on when a custom cell's gradients look wrong.
            ``False``: nothing of the check is traced.
        linear_vjp: ``True`` declares that the backward of every ``jax.custom_vjp``
            function that ``f``'s carry reaches is linear in its cotangent (a
            straight-through estimator, a scaled gradient), so that its Jacobians (columns of
            ``jax.vjp``) are exact and any method may run. ``None`` (the setting of the
            enclosing :func:`bppsa.grad`, else False): such a backward may not be linear
            (clipping the cotangent, say), and only back-propagation applies it exactly:
            ``Auto()`` back-propagates (``Sequential()`` with the sequential forward) and an
            explicit method that forms Jacobians raises ``ValueError`` naming the function.
            ``jax.custom_jvp`` rules need no word: every method reads them.

    Returns:
        ``(final carry, stacked ys)``, identical to ``jax.lax.scan``.

    Raises:
        TypeError, ValueError: for arguments ``jax.lax.scan`` rejects (in its words), a carry
            with complex leaves and an explicit parallel method, or a bad option.
        MemoryLimitError: (when the backward pass is traced) see ``memory_limit``.

    Works under ``jax.jit``, ``jax.vmap`` (batch by vmapping a scan over one example) and
    derivatives of any order and mode: forward mode (``jax.jvp``, ``jax.jacfwd``,
    ``jax.linearize``) solves the tangent recurrence ``dh_t = J_t dh_{t-1} + u_t`` with the
    method's own scan (parallel for ``Blelloch()`` and ``Chunked()``), and reverse mode
    (``jax.grad``, ``jax.vjp``, ``jax.jacrev``) transposes it into the method's backward.
    ``method="sequential"`` with the sequential forward is plain ``lax.scan``.

    Example:
        >>> w = 0.5 * jnp.eye(3)
        >>> cell = lambda h, x: (jnp.tanh(w @ h + x), h)
        >>> h_last, hs = bppsa.scan(cell, jnp.zeros(3), jnp.ones((100, 3)))
        >>> hs.shape
        (100, 3)
        >>> loss = lambda w: bppsa.scan(lambda h, x: (jnp.tanh(w @ h + x), None),
        ...                             jnp.zeros(3), jnp.ones((100, 3)))[0].sum()
        >>> bppsa.grad(loss, method="blelloch")(w).shape
        (3, 3)
    """
    options = options_from(
        method,
        memory_limit,
        check_finite,
        forward,
        precision,
        check_structure=check_structure,
        linear_vjp=linear_vjp,
    ).over(current())
    batch = _check_batch(batch)
    problem, init = prepare(
        f,
        init,
        xs,
        length,
        reverse=reverse,
        batch=batch,
        unroll=unroll,
        check_structure=options.check_structure,
    )
    decision = decide(problem, options)
    plan = plans.record(
        requested=decision.requested,
        method=decision.method,
        jacobians=problem.jacobians,
        dense_because=problem.dense_because,
        length=problem.length,
        batch=problem.batch,
        forward=decision.forward,
        forward_because=decision.forward_because,
        backward_because=decision.backward_because,
    )
    run = vjp.differentiable(decision, problem, plan)
    if reverse:
        xs = jax.tree.map(lambda x: jnp.flip(x, axis=0), xs)
    with debug.readable_errors():
        carry, ys = run(problem.body.consts, init, xs)
    if reverse:
        ys = jax.tree.map(lambda y: jnp.flip(y, axis=0), ys)
    return carry, ys


def estimate_memory(
    f: Callable[[Carry, X], tuple[Carry, Y]],
    init: Carry,
    xs: X | None = None,
    length: int | None = None,
    *,
    method: Method | Policy | str | None = None,
    batch: int = 1,
) -> int:
    """Estimated peak bytes of ``bppsa.scan(f, init, xs, length)``'s forward and backward.

    The model that the memory guard of :func:`scan` uses (see ``memory_limit`` there): the
    carries kept for the backward, the stacked Jacobians and per-step arrays of one time block,
    and the dense products of the parallel scans; fitted to XLA's memory analysis on CPU.

    Args:
        f, init, xs, length: as for :func:`scan`; arrays or ``jax.ShapeDtypeStruct``.
        method: the backward method (default ``bppsa.Auto()``, as it would choose on the
            default backend; ``"sequential"``: plain back-propagation, roughly).
        batch: examples the scan is ``jax.vmap``-ed over.

    Returns:
        Bytes.

    Example:
        >>> from bppsa.models import RNN, rnn_cell
        >>> params = RNN().init(1, 20, key=jax.random.key(0))
        >>> body = lambda h, x: (rnn_cell(params, h, x), None)
        >>> spec = jax.ShapeDtypeStruct((30_000, 1), jnp.float32)
        >>> bppsa.estimate_memory(body, jnp.zeros(20), spec, method="blelloch", batch=16) > 1e9
        True
    """
    if _check_batch(batch) is None:
        raise ValueError("batch must be a positive int, got None.")
    policy = as_policy(resolve(method))
    problem, _ = prepare(f, init, xs, length, reverse=False, batch=batch)
    profile = policy.profile_or(profile_of())
    fp = checked_footprint(problem, profile)
    method = policy.scan_method(fp, math.inf, profile=profile)
    return method.memory(fp)


def _check_batch(batch) -> int | None:
    if batch is not None and (isinstance(batch, bool) or not isinstance(batch, int) or batch < 1):
        raise ValueError(f"batch must be a positive int, got {batch!r}.")
    return batch
