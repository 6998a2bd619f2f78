"""Checks of ``bppsa.scan``'s arguments at the public boundary, before anything is traced.

:func:`check_arguments` catches what ``jax.lax.scan`` leaves to XLA or to an ``IndexError`` (a
negative length, ``xs`` leaves without a leading axis, non-array leaves) or lets through
silently (a length of 3.5 runs 3 steps); :func:`check_like_lax_scan` then runs ``lax.scan``'s own
checks (shape-only), so that its errors read as its errors. The one restriction of the parallel
methods (real carries) is checked with the others of a method, by
:func:`bppsa.scan._core.methods.base.require`.
"""

from __future__ import annotations

import operator

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax


def check_arguments(init, xs, length) -> int | None:
    """Checks that ``jax.lax.scan`` leaves to XLA (or to an ``IndexError``); returns
    ``length`` as an int."""
    for name, tree in (("init", init), ("xs", xs)):
        for leaf in jax.tree.leaves(tree):
            if not (hasattr(leaf, "dtype") or isinstance(leaf, int | float | complex | np.generic)):
                raise TypeError(
                    f"bppsa.scan: every leaf of {name} must be an array or a number, got a "
                    f"{type(leaf).__name__}: {leaf!r:.80}."
                )
    for leaf in jax.tree.leaves(xs):
        if not jnp.shape(leaf):
            raise ValueError(
                "bppsa.scan: every leaf of xs needs a leading axis to scan over, got a scalar "
                f"of shape {jnp.shape(leaf)}: {leaf!r:.80}."
            )
    if length is None:
        return None
    try:
        steps = operator.index(length)
    except TypeError:
        if isinstance(length, jax.Array):
            raise  # JAX's own error: length must be concrete
        raise TypeError(
            f"bppsa.scan: length must be an int, got {type(length).__name__}: {length!r:.80}."
        ) from None
    if steps < 0:
        raise ValueError(f"bppsa.scan: length must be >= 0, got {steps}.")
    return steps


def check_unroll(unroll) -> int | bool:
    """``unroll`` as ``jax.lax.scan`` accepts it: a bool, or an int >= 0 (``0`` or ``True``:
    every step unrolled)."""
    if isinstance(unroll, bool | np.bool_):
        return bool(unroll)
    try:
        steps = operator.index(unroll)
    except TypeError:
        raise TypeError(
            "bppsa.scan: unroll must be an int >= 0 or a bool, as in jax.lax.scan; got "
            f"{type(unroll).__name__}: {unroll!r:.80}."
        ) from None
    if steps < 0:
        raise ValueError(
            f"bppsa.scan: unroll must be an int >= 0 or a bool, as in jax.lax.scan; got {steps}."
        )
    return steps


def complex_leaves(init) -> list:
    """The leaves of ``init`` with complex dtypes (the parallel methods need real carries)."""
    return [
        x for x in jax.tree.leaves(init) if jnp.issubdtype(jnp.result_type(x), jnp.complexfloating)
    ]


def check_like_lax_scan(f, init, xs, length, reverse):
    """Runs ``lax.scan``'s own checks (shape-only), so errors read exactly like its errors,
    which name the carry by the body's first parameter: here ``init``, the user's argument."""

    def body(init, x):
        return f(init, x)

    try:
        return jax.eval_shape(
            lambda i, x: lax.scan(body, i, x, length=length, reverse=reverse), init, xs
        )
    except (TypeError, ValueError) as err:
        if type(err) not in (TypeError, ValueError):
            raise
        raise type(err)(f"bppsa.scan: {_name_the_returned_carry(str(err))}") from None


def _name_the_returned_carry(message: str) -> str:
    """``lax.scan``'s message, with the carry the body returns named as the user's ``f``'s."""
    for theirs in (
        "the corresponding output carry component",
        "the corresponding component of the carry output",
    ):
        message = message.replace(theirs, "the corresponding component of the carry f returns")
    return message


def promote_weak_types(init, carry_out):
    """Casts weakly typed init leaves (Python scalars) to the carry dtype, as lax.scan does
    (shapes, ``jax.ShapeDtypeStruct``, stay shapes)."""

    def promote(x, out):
        if isinstance(x, jax.ShapeDtypeStruct):
            return jax.ShapeDtypeStruct(x.shape, out.dtype)
        return jnp.asarray(x, out.dtype)

    return jax.tree.map(promote, init, carry_out)


def num_steps(xs, length) -> int:
    leaves = jax.tree.leaves(xs)
    return int(length) if length is not None else leaves[0].shape[0]
