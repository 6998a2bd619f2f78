"""The loop of a scan's recurrence in one Pallas kernel.

Algorithm summary. Given a :class:`~bppsa.scan._core.fused.split.Split` of the step, the
residuals the recurrence reads are computed outside the kernel (constants once, per-step values
for all steps at once), padded as the backend pads them (:mod:`~bppsa.scan._core.fused.backend`)
and passed in; the kernel loads the constants once and runs ``lax.fori_loop`` over the ``T``
steps with the carry as the loop's value (on chip), reading step ``t``'s residuals from their
refs and writing the carry after step ``t`` to its output ref. With the step-ahead loads, a step
of the loop loads the following step's residuals during its own: the per-step residuals are
passed with one more (zero) step past the last, which the last step loads, so that no index is
clamped (a step of lanes apart clamps it instead: the compiler unrolls its small loop itself).
The loop runs ``launch.unroll`` steps an iteration, so that its branch and counter are paid once
for them and the compiler schedules one step's end with the next one's start; the steps left
over run after it, each loading its own residuals. Padded lanes of the carry are zeroed at every
step, so the outputs hold zeros there. Where the carry's lanes are independent
(:mod:`bppsa.scan._core.fused.lanes`) the kernel is a grid of programs, one per tile of lanes,
each reading its tile of every array that holds lanes and all of the others.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.extend.core import Literal

from bppsa.scan._core.fused.backend import Backend, Launch
from bppsa.scan._core.fused.lanes import Tiled
from bppsa.scan._core.fused.matvec import Arranged
from bppsa.scan._core.fused.split import Split


def unpad(x, shape: Sequence[int], lead: int = 1):
    """The logical ``shape`` (after ``lead`` leading axes) of padded ``x``."""
    if tuple(x.shape[lead:]) == tuple(shape):
        return x
    return x[(slice(None),) * lead + tuple(slice(0, s) for s in shape)]


def carries_after(
    split: Split,
    length: int,
    init: Sequence[Any],
    constants: Sequence[Any],
    steps: Sequence[Any],
    *,
    backend: Backend,
    launch: Launch,
    reverse: bool = False,
    name: str = "bppsa_fused_forward",
    tiled: Tiled | None = None,
) -> list[Any]:
    """The carry leaves after every step, ``(T, *leaf)`` each, from one kernel launch.

    Args:
        split: the step's split.
        length: ``T >= 1``.
        init: the initial carry's leaves.
        constants: the values of ``split.constant_residuals``.
        steps: the values of ``split.step_residuals``, ``(T, ...)`` each.
        backend: the kernel backend (its padding, equations and compiler parameters; an
            interpreted one runs in Pallas' interpreter).
        launch: the launch's parameters (warps, stages).
        reverse: run the steps from ``T - 1`` down to ``0`` (step ``t`` reads ``steps[t]`` and
            writes the carry after it at ``t``), as a backward's loop does.
        name: the kernel's name (in the lowered program).
        tiled: ``split``'s recurrence for one tile of independent lanes
            (:mod:`~bppsa.scan._core.fused.lanes`): the kernel then runs one program per tile,
            ``init``, ``constants`` and ``steps`` still whole.
    """
    if backend.own_kernel:  # a backend with a kernel of its own (Mosaic GPU's)
        return backend.carries_after(
            split,
            length,
            init,
            constants,
            steps,
            launch=launch,
            reverse=reverse,
            name=name,
            tiled=tiled,
        )
    source = split if tiled is None else tiled
    carry_in, carry_out = source.carry_in, source.carry_out
    shapes = [tuple(v.aval.shape) for v in carry_in]
    warps = launch.num_warps
    permuted = backend.permuted_constants(
        source.recurrence, source.constant_residuals, num_warps=warps
    )
    if tiled is not None:  # an arranged matrix has no lane axis to tile along
        permuted = [(v, order) for v, order in permuted if not isinstance(order, Arranged)]
    position = {v: i for i, v in enumerate(source.constant_residuals)}
    axes = list(tiled.axes) if tiled is not None else [None] * (len(init) + len(constants))
    if tiled is None:
        axes += [None] * len(steps)
    ni, nk, nq = len(init), len(constants), len(permuted)
    # each permuted constant: its value permuted outside the kernel, its lane axis moved along
    moved = [axes[ni + position[v]] for v, _ in permuted]
    axes[ni + nk : ni + nk] = [
        None if a is None else order.index(a) for a, (_, order) in zip(moved, permuted)
    ]
    values = [
        *init,
        *constants,
        *(_prepared(constants[position[v]], order) for v, order in permuted),
        *steps,
    ]
    avals = [
        *(tuple(v.aval.shape) for v in [*carry_in, *source.constant_residuals]),
        *(_prepared_shape(v.aval.shape, order) for v, order in permuted),
        *(tuple(v.aval.shape) for v in source.step_residuals),
    ]
    leads = [0] * (ni + nk + nq) + [1] * len(steps)
    # the step-ahead loads: one more (zero) step past the last, which the last step loads, or
    # the index clamped (launch.padded_ahead)
    prefetch = launch.prefetch and bool(steps)
    ahead = 1 if prefetch and launch.padded_ahead else 0
    times = [(0, 0)] * (ni + nk + nq) + [(ahead, 0) if reverse else (0, ahead)] * len(steps)
    count = 1 if tiled is None else tiled.count
    padded_shape = backend.padded_shape
    blocks = [padded_shape(shape) for shape in avals]
    inputs = [
        _padded_to(x, lead, _whole(block, axis, count), around)
        for x, lead, block, axis, around in zip(values, leads, blocks, axes, times)
    ]
    out_shape = [
        jax.ShapeDtypeStruct((length, *_whole(padded_shape(s), a, count)), v.aval.dtype)
        for s, v, a in zip(shapes, carry_in, axes)
    ]
    grid: dict[str, Any] = {}
    if tiled is not None:
        grid = {
            "grid": (count,),
            "in_specs": [
                _tile_spec(block, axis, (length + sum(around),) * lead)
                for block, axis, lead, around in zip(blocks, axes, leads, times)
            ],
            "out_specs": [_tile_spec(padded_shape(s), a, (length,)) for s, a in zip(shapes, axes)],
        }

    def time(k):
        return length - 1 - k if reverse else k

    def kernel(*refs):
        init_refs, const_refs = refs[:ni], refs[ni : ni + nk]
        permuted_refs = refs[ni + nk : ni + nk + nq]
        step_refs, out_refs = refs[ni + nk + nq : len(inputs)], refs[len(inputs) :]
        const_values = [r[...] for r in const_refs]
        permuted_values = {
            (v, order): order.read(r) if isinstance(order, Arranged) else r[...]
            for (v, order), r in zip(permuted, permuted_refs)
        }

        def load(k):
            return [r[time(k) + ahead if reverse and ahead else time(k)] for r in step_refs]

        def step(k, carry, step_values):
            t = time(k)
            env = dict(zip(carry_in, carry))
            env.update(zip(source.constant_residuals, const_values))
            env.update(zip(source.step_residuals, step_values))
            backend.run_equations(source.recurrence, env, permuted_values, num_warps=warps)
            new = []
            for v, shape, old, ref in zip(carry_out, shapes, carry, out_refs):
                if isinstance(v, Literal):
                    value = jnp.full(old.shape, v.val, old.dtype)
                else:
                    value = env[v].astype(old.dtype)
                value = backend.masked(value, shape, 0)
                ref[t] = value
                new.append(value)
            return new

        first = [r[...] for r in init_refs]
        unroll = launch.unroll
        rounds = length // unroll

        def several(body):
            def run(i, state):
                start = i * unroll if unroll > 1 else i
                for j in range(unroll):
                    state = body(start + j if j else start, state)
                return state

            return run

        def own(k, carry):
            return step(k, carry, load(k))

        if prefetch:
            last = length - 1

            def early(k, state):
                carry, current = state
                # issued before the step (clamped where no step was added past the last)
                following = load(k + 1 if ahead else jnp.minimum(k + 1, last))
                return step(k, carry, current), following

            carry, _ = lax.fori_loop(0, rounds, several(early), (first, load(0)))
        else:
            carry = lax.fori_loop(0, rounds, several(own), first)
        for k in range(rounds * unroll, length):  # the rest after the loop
            carry = own(k, carry)

    after = pl.pallas_call(
        kernel,
        out_shape=out_shape,
        interpret=backend.interpret,
        compiler_params=backend.compiler_params(launch),
        name=name,
        **grid,
    )(*inputs)
    return [unpad(a, jnp.shape(c)) for a, c in zip(after, init)]


def _prepared(constant, order):
    """``constant`` as the kernel reads it: permuted to ``order``, or arranged."""
    if isinstance(order, Arranged):
        return order.arrange(constant)
    return jnp.transpose(constant, order)


def _prepared_shape(shape: Sequence[int], order) -> tuple[int, ...]:
    if isinstance(order, Arranged):
        return order.shape
    return tuple(shape[d] for d in order)


def _whole(block: Sequence[int], axis: int | None, count: int) -> tuple[int, ...]:
    """The shape of ``count`` tiles of ``block`` along ``axis`` (``None``: one)."""
    if axis is None:
        return tuple(block)
    return (*block[:axis], block[axis] * count, *block[axis + 1 :])


def _padded_to(x, lead: int, shape: Sequence[int], time: tuple[int, int] = (0, 0)):
    """``x`` zero-padded to ``shape`` after ``lead`` leading axes, and by ``time`` (before,
    after) along the first of them."""
    widths = [time] * lead + [(0, p - s) for s, p in zip(jnp.shape(x)[lead:], shape)]
    return x if not any(a or b for a, b in widths) else jnp.pad(x, widths)


def _tile_spec(block: Sequence[int], axis: int | None, lead: Sequence[int]):
    """The block of program ``j``: tile ``j`` along ``axis`` (after the ``lead`` axes, read
    whole), everything along the others."""
    ndim = len(lead) + len(block)
    at = None if axis is None else len(lead) + axis

    def index(j):
        return tuple(j if d == at else 0 for d in range(ndim))

    return pl.BlockSpec((*lead, *block), index)
