"""Evaluating jaxprs by binding their primitives: calls inlined, equations run in place."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
from jax.extend.core import ClosedJaxpr, Jaxpr, Literal

# Primitives whose inner jaxpr is evaluated in place (their own rules only matter to autodiff,
# which never runs through the forward: the library's derivative rules wrap it).
INLINED = frozenset(
    {
        "jit",
        "pjit",
        "closed_call",
        "core_call",
        "custom_jvp_call",
        "custom_vjp_call",
        "custom_vjp_call_jaxpr",
        "remat",
        "remat2",
        "checkpoint",
    }
)


def _inner(eqn) -> tuple[Jaxpr, Sequence[Any]] | None:
    """The jaxpr and consts an inlined call evaluates (``None``: not an inlined call)."""
    if eqn.primitive.name not in INLINED:
        return None
    for key in ("jaxpr", "call_jaxpr", "fun_jaxpr"):
        inner = eqn.params.get(key)
        if isinstance(inner, ClosedJaxpr):
            return inner.jaxpr, inner.consts
        if isinstance(inner, Jaxpr):
            return inner, ()
    return None


def bind(eqn, *args: Any, **updates: Any) -> list[Any]:
    """``eqn``'s primitive bound to ``args`` with its parameters (``updates`` replacing some)."""
    params = eqn.primitive.get_bind_params(eqn.params)
    subfuns: Sequence[Any] = ()
    if isinstance(params, tuple):  # JAX versions that split off the subfunctions
        subfuns, params = params
    out = eqn.primitive.bind(*subfuns, *args, **{**params, **updates})
    return list(out) if eqn.primitive.multiple_results else [out]


def evaluate(jaxpr: Jaxpr, consts: Sequence[Any], *args: Any, inline: bool = True) -> list[Any]:
    """``jaxpr`` evaluated by binding its primitives (inlined calls evaluated in place)."""
    env: dict[Any, Any] = {}

    def read(v):
        return v.val if isinstance(v, Literal) else env[v]

    for var, value in zip(jaxpr.constvars, consts):
        env[var] = value
    for var, value in zip(jaxpr.invars, args):
        env[var] = value
    for eqn in jaxpr.eqns:
        invals = [read(v) for v in eqn.invars]
        inner = _inner(eqn) if inline else None
        if inner is not None:
            outvals = evaluate(inner[0], inner[1], *invals[-len(inner[0].invars) :])
        else:
            outvals = bind(eqn, *invals)
        for var, value in zip(eqn.outvars, outvals):
            env[var] = value
    return [read(v) for v in jaxpr.outvars]


def flat_jaxpr(fun: Callable, *shapes: Any) -> ClosedJaxpr:
    """The jaxpr of ``fun`` on flat arguments, with every inlined call evaluated in place."""
    closed = jax.make_jaxpr(fun)(*shapes)
    return jax.make_jaxpr(lambda *a: evaluate(closed.jaxpr, closed.consts, *a))(*shapes)


def run_equations(eqns: Sequence[Any], env: dict) -> dict:
    """Evaluates ``eqns`` (flat: no inlined calls left) into ``env`` and returns it."""

    def read(v):
        return v.val if isinstance(v, Literal) else env[v]

    for eqn in eqns:
        env.update(zip(eqn.outvars, bind(eqn, *[read(v) for v in eqn.invars])))
    return env
