"""An optional check of a scan: which time step makes its values or its gradient non-finite.

With ``check_finite=True`` (on :func:`bppsa.scan`, :func:`bppsa.grad` or
:func:`bppsa.value_and_grad`) the backward pass of a scan also records, per step, whether its
transposed Jacobian, the cotangent its output ``y`` sends back, or the cotangent of its input
carry holds a NaN or an infinity, and raises ``FloatingPointError`` naming, as indices into
``xs``:

* the EARLIEST step whose Jacobian is not finite: non-finite values in the forward pass travel
  forward in time, so that is where one entered (through ``xs`` at that step, the carry entering
  it, or the parameters);
* the LATEST step where a non-finite cotangent arises (from its output ``y``, or an overflow of
  the carry cotangent itself): cotangents travel backward, so that is where back-propagation
  first meets it; or the final carry's cotangent, if the value comes from after the scan.

A scan that is only run (no derivative taken) checks its forward pass instead: the EARLIEST
step that returns a non-finite carry or output ``y`` from a finite carry (or the initial carry
itself), where the NaN or infinity arises.

The check runs on the device (a ``jax.debug.callback`` with a few scalars). Outside ``jax.jit``
the ``FloatingPointError`` reaches the caller, also where the check ran inside a compiled
program that :func:`bppsa.grad`, :func:`bppsa.value_and_grad` or :func:`bppsa.scan` called
(:func:`readable_errors` takes it out of JAX's runtime error, its message first). A program
compiled by the user's ``jax.jit`` raises JAX's ``JaxRuntimeError`` ("INTERNAL: CpuCallback
error ..."), whose message ends with the check's: JAX 0.10 surfaces an error of a host callback
no other way (``checkify`` needs the program functionalized by ``checkify.checkify``).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from typing import Any

import jax
import jax.numpy as jnp
from jax import Array

from bppsa.scan._core import structure_check
from bppsa.scan._elements import MapStack

# Per-step flags (bits).
JACOBIAN, OUTPUT, CARRY = 1, 2, 4
# How every message of the check begins (and how it is found in JAX's runtime error).
PREFIX = "bppsa.scan (check_finite=True): "


def _nonfinite(x: Array) -> Array:
    """``(m,)``: whether any entry of ``x[k]`` is NaN or infinite."""
    return ~jnp.isfinite(x).all(axis=tuple(range(1, x.ndim)))


def step_flags(jac_t: MapStack | None, g: Array, offsets: Array | None) -> Array:
    """``(L,)`` int32 bit flags of the steps of a span (time order).

    Args:
        jac_t: the span's stacked transposed Jacobians, or ``None``.
        g: ``(L + 1, ...)`` the carry cotangents ``g_0 .. g_L`` of the span (``g_L`` enters it).
        offsets: ``(L, ...)`` the cotangents the steps' outputs send to their input carries.

    Returns:
        ``JACOBIAN`` if the step's Jacobian is not finite; ``OUTPUT`` if the cotangent from its
        output is not; ``CARRY`` if the cotangent of its input carry is not finite although
        everything it is computed from is (an overflow).
    """
    steps = g.shape[0] - 1
    none = jnp.zeros(steps, bool)
    bad_jac = none
    if jac_t is not None:
        bad_jac = jac_t.nonfinite_steps()
    bad_out = _nonfinite(offsets) if offsets is not None else none
    bad_g = _nonfinite(g)
    overflow = bad_g[:-1] & ~bad_g[1:] & ~bad_jac & ~bad_out
    return (
        jnp.where(bad_jac, JACOBIAN, 0)
        | jnp.where(bad_out, OUTPUT, 0)
        | jnp.where(overflow, CARRY, 0)
    ).astype(jnp.int32)


def report(flags: Array, g_last: Array, reverse: bool) -> None:
    """Raises (on the device, through a callback) if any step, or the cotangent ``g_last`` of
    the final carry, is not finite. ``flags: (T,)`` in scan order (``xs`` flipped for a
    reverse scan)."""
    steps = flags.shape[0]
    final_bad = ~jnp.isfinite(g_last).all()
    jac = (flags & JACOBIAN) != 0
    cot = (flags & (OUTPUT | CARRY)) != 0
    earliest_jac = jnp.argmax(jac) if steps else jnp.int32(0)
    latest_cot = steps - 1 - jnp.argmax(cot[::-1]) if steps else jnp.int32(0)
    cot_flag = flags[latest_cot] if steps else jnp.int32(0)
    raise_ = functools.partial(_raise, steps=steps, reverse=reverse)
    jax.debug.callback(raise_, final_bad, jac.any(), earliest_jac, cot.any(), latest_cot, cot_flag)


def _raise(final_bad, any_jac, earliest_jac, any_cot, latest_cot, cot_flag, *, steps, reverse):
    def index(step):
        return steps - 1 - int(step) if reverse else int(step)

    found = []
    if bool(any_jac):
        found.append(
            f"the earliest non-finite transposed Jacobian is that of time step "
            f"xs[{index(earliest_jac)}] (a NaN or infinity entered the forward pass there: "
            "through that step's input, the carry entering it, or the parameters)"
        )
    if bool(final_bad):
        found.append(
            "the cotangent of the final carry is not finite (it comes from after the scan: "
            "the loss or what follows the scan)"
        )
    elif bool(any_cot):
        where = (
            "the cotangent its output y sends back"
            if int(cot_flag) & OUTPUT
            else "the cotangent of its input carry, which overflowed"
        )
        found.append(
            f"the first non-finite cotangent in back-propagation order arises at time step "
            f"xs[{index(latest_cot)}]: {where}"
        )
    if found:
        raise FloatingPointError(
            PREFIX + "non-finite values in the backward pass: " + "; ".join(found) + "."
        )


def check_forward(init: Any, before: Any, carry: Any, ys: Any, reverse: bool) -> None:
    """Raises (on the device, through a callback) if the forward pass of a scan is not finite,
    naming the earliest step that returns a non-finite carry or output from a finite carry.

    Args:
        init: the initial carry.
        before: the carries that entered the steps, stacked ``(T, ...)`` (time order).
        carry: the final carry.
        ys: the steps' outputs, stacked ``(T, ...)``.
        reverse: whether the scan runs from the end of ``xs`` (then ``xs`` was flipped).
    """
    steps = max([0, *(leaf.shape[0] for leaf in jax.tree.leaves((before, ys)))])
    after = jax.tree.map(lambda b, c: jnp.concatenate([b[1:], c[None]]), before, carry)
    bad_carry, bad_out = (_nonfinite_steps(tree, steps) for tree in (after, ys))
    bad = bad_carry | bad_out
    earliest = jnp.argmax(bad) if steps else jnp.int32(0)
    flag = jnp.where(bad_carry, CARRY, 0) | jnp.where(bad_out, OUTPUT, 0)
    raise_ = functools.partial(_raise_forward, steps=steps, reverse=reverse)
    init_bad = _nonfinite_steps(jax.tree.map(lambda a: a[None], init), 1)[0]
    jax.debug.callback(raise_, init_bad, bad.any(), earliest, flag[earliest] if steps else 0)


def _nonfinite_steps(stacked: Any, steps: int) -> Array:
    """``(steps,)``: whether any float leaf of ``stacked`` is non-finite at each step."""
    bad = jnp.zeros(steps, bool)
    for leaf in jax.tree.leaves(stacked):
        if jnp.issubdtype(leaf.dtype, jnp.inexact):
            bad = bad | _nonfinite(leaf)
    return bad


def _raise_forward(init_bad, any_bad, earliest, flag, *, steps, reverse):
    if bool(init_bad):
        found = "the initial carry init is not finite"
    elif bool(any_bad):
        index = steps - 1 - int(earliest) if reverse else int(earliest)
        what = {CARRY: "the carry it returns", OUTPUT: "its output y"}.get(
            int(flag), "the carry it returns and its output y"
        )
        found = (
            f"the earliest non-finite value is returned by time step xs[{index}]: {what}, from "
            "a finite carry (a NaN or infinity arises there: from that step's input, the "
            "parameters, or an overflow)"
        )
    else:
        return
    raise FloatingPointError(PREFIX + "non-finite values in the forward pass: " + found + ".")


# The checks that raise from inside a compiled program: how their messages begin, their errors.
CHECKS = {PREFIX: FloatingPointError, structure_check.PREFIX: ValueError}


@contextlib.contextmanager
def readable_errors() -> Iterator[None]:
    """Within the block, a check's error raised inside a compiled program (this one's, or the
    structure check's) reaches the caller as the ``FloatingPointError`` or ``ValueError`` it is
    (JAX's runtime error, which ends with its message and traceback, becomes its
    ``__cause__``)."""
    try:
        yield
    except jax.errors.JaxRuntimeError as err:
        text = str(err)
        at, prefix = max((text.rfind(prefix), prefix) for prefix in CHECKS)
        if at < 0:
            raise
        raise CHECKS[prefix](text[at:].strip()) from err
