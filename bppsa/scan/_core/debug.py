"""An optional check of the backward pass: which time step makes the gradient non-finite.

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

The check runs on the device (a ``jax.debug.callback`` with a few scalars). Outside ``jax.jit``
the ``FloatingPointError`` reaches the caller; under ``jax.jit`` JAX re-raises it as its runtime
error, with the same message inside.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import Array

from bppsa.scan._elements import MapStack

# Per-step flags (bits).
JACOBIAN, OUTPUT, CARRY = 1, 2, 4


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
            "bppsa.scan (check_finite=True): non-finite values in the backward pass: "
            + "; ".join(found)
            + "."
        )
