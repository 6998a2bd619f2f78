"""The loop of a scan's recurrence in one Pallas kernel.

Algorithm summary. Given a :class:`~bppsa.scan._core.fused.split.Split` of the step, the
residuals the recurrence reads are computed outside the kernel (constants once, per-step values
for all steps at once), padded to powers of two (:mod:`bppsa.scan._core.fused.padded`) and
passed in; the kernel loads the constants once and runs ``lax.fori_loop`` over the ``T`` steps
with the carry as the loop's value (on chip), reading step ``t``'s residuals from their refs and
writing the carry after step ``t`` to its output ref. Padded lanes of the carry are zeroed at
every step, so the outputs hold zeros there.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pltriton
from jax.extend.core import Literal

from bppsa.scan._core.fused.padded import masked, padded_shape, run_padded
from bppsa.scan._core.fused.split import Split


def pad(x, shape: Sequence[int], lead: int = 0):
    """``x`` (of ``shape`` after ``lead`` leading axes) zero-padded to powers of two."""
    target = padded_shape(shape)
    if tuple(target) == tuple(shape):
        return x
    widths = [(0, 0)] * lead + [(0, p - s) for s, p in zip(shape, target)]
    return jnp.pad(x, widths)


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
    interpret: bool,
    num_warps: int,
    reverse: bool = False,
    name: str = "bppsa_fused_forward",
) -> list[Any]:
    """The carry leaves after every step, ``(T, *leaf)`` each, from one kernel launch.

    Args:
        split: the step's split.
        length: ``T >= 1``.
        init: the initial carry's leaves.
        constants: the values of ``split.constant_residuals``.
        steps: the values of ``split.step_residuals``, ``(T, ...)`` each.
        interpret: run the kernel in Pallas' interpreter (CPU) instead of lowering it.
        num_warps: Triton's warps per program.
        reverse: run the steps from ``T - 1`` down to ``0`` (step ``t`` reads ``steps[t]`` and
            writes the carry after it at ``t``), as a backward's loop does.
        name: the kernel's name (in the lowered program).
    """
    carry_in, carry_out = split.carry_in, split.carry_out
    shapes = [tuple(v.aval.shape) for v in carry_in]
    inputs = [
        *(pad(x, s) for x, s in zip(init, shapes)),
        *(pad(x, v.aval.shape) for x, v in zip(constants, split.constant_residuals)),
        *(pad(x, v.aval.shape, lead=1) for x, v in zip(steps, split.step_residuals)),
    ]
    ni, nk = len(init), len(constants)
    out_shape = [
        jax.ShapeDtypeStruct((length, *padded_shape(s)), v.aval.dtype)
        for s, v in zip(shapes, carry_in)
    ]

    def kernel(*refs):
        init_refs, const_refs = refs[:ni], refs[ni : ni + nk]
        step_refs, out_refs = refs[ni + nk : len(inputs)], refs[len(inputs) :]
        const_values = [r[...] for r in const_refs]

        def body(k, carry):
            t = length - 1 - k if reverse else k
            env = dict(zip(carry_in, carry))
            env.update(zip(split.constant_residuals, const_values))
            env.update(zip(split.step_residuals, [r[t] for r in step_refs]))
            run_padded(split.recurrence, env)
            new = []
            for v, shape, old, ref in zip(carry_out, shapes, carry, out_refs):
                if isinstance(v, Literal):
                    value = jnp.full(old.shape, v.val, old.dtype)
                else:
                    value = env[v].astype(old.dtype)
                value = masked(value, shape, range(len(shape)), 0)
                ref[t] = value
                new.append(value)
            return new

        lax.fori_loop(0, length, body, [r[...] for r in init_refs])

    after = pl.pallas_call(
        kernel,
        out_shape=out_shape,
        interpret=interpret,
        compiler_params=pltriton.CompilerParams(num_warps=num_warps, num_stages=1),
        name=name,
    )(*inputs)
    return [unpad(a, s) for a, s in zip(after, shapes)]
