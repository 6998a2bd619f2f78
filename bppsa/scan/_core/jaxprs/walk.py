"""Walking jaxprs: binding their equations, calls inlined, equations run in place.

:func:`bind` runs one equation's primitive on values (a call with its own derivative rule kept
whole); :func:`evaluate` runs a jaxpr equation by equation, evaluating the calls of
:data:`~bppsa.scan._core.jaxprs.taxonomy.CALLS` in place. Calls with their own derivative rules
(``custom_jvp``, ``custom_vjp``) are inlined for the forward, which no derivative runs through;
a step that is differentiated afterwards (the fused backward's reverse step) keeps them whole
(``rules=True``), so that ``jax.vjp`` applies each rule as it does through ``lax.scan``.

JAX's internal read here: the parameters that rebuild a call's subfunctions
(``get_bind_params``), with a fallback for the versions that return them split off.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
from jax.extend.core import ClosedJaxpr, Jaxpr, Literal

from bppsa.scan._core.jaxprs import taxonomy

# Every call of the taxonomy: the parameter that holds the called jaxpr is searched for below,
# so names of older JAX versions need no entry of their own.
INLINED = frozenset(taxonomy.CALLS)


def bind(eqn, *args: Any, **updates: Any) -> list[Any]:
    """``eqn``'s primitive bound to ``args`` with its parameters (``updates`` replacing some):
    a call with its own rule keeps it (its subfunctions are rebuilt from the parameters)."""
    params = eqn.primitive.get_bind_params(eqn.params)
    subfuns: Sequence[Any] = ()
    if isinstance(params, tuple):  # JAX versions that split off the subfunctions
        subfuns, params = params
    out = eqn.primitive.bind(*subfuns, *args, **{**params, **updates})
    return list(out) if eqn.primitive.multiple_results else [out]


def _inner(eqn, rules: bool = False) -> tuple[Jaxpr, Sequence[Any]] | None:
    """The jaxpr and consts an inlined call evaluates (``None``: not an inlined call; with
    ``rules``, calls with their own derivative rules are not inlined)."""
    name = eqn.primitive.name
    if name not in INLINED and (rules or name not in taxonomy.WITH_RULES):
        return None
    for key in ("jaxpr", "call_jaxpr", "fun_jaxpr"):
        inner = eqn.params.get(key)
        if isinstance(inner, ClosedJaxpr):
            return inner.jaxpr, inner.consts
        if isinstance(inner, Jaxpr):
            return inner, ()
    return None


def evaluate(
    jaxpr: Jaxpr, consts: Sequence[Any], *args: Any, inline: bool = True, rules: bool = False
) -> list[Any]:
    """``jaxpr`` evaluated by binding its primitives (inlined calls evaluated in place; with
    ``rules``, calls with their own derivative rules kept whole)."""
    env: dict[Any, Any] = {}

    def read(v):
        return v.val if isinstance(v, Literal) else env[v]

    for var, value in zip(jaxpr.constvars, consts):
        env[var] = value
    for var, value in zip(jaxpr.invars, args):
        env[var] = value
    for eqn in jaxpr.eqns:
        invals = [read(v) for v in eqn.invars]
        inner = _inner(eqn, rules) if inline else None
        if inner is not None:
            outvals = evaluate(inner[0], inner[1], *invals[-len(inner[0].invars) :], rules=rules)
        else:
            outvals = bind(eqn, *invals)
        for var, value in zip(eqn.outvars, outvals):
            env[var] = value
    return [read(v) for v in jaxpr.outvars]


def flat_jaxpr(fun: Callable, *shapes: Any, rules: bool = False) -> ClosedJaxpr:
    """The jaxpr of ``fun`` on flat arguments, with every inlined call evaluated in place
    (with ``rules``, calls with their own derivative rules kept whole)."""
    closed = jax.make_jaxpr(fun)(*shapes)
    return jax.make_jaxpr(lambda *a: evaluate(closed.jaxpr, closed.consts, *a, rules=rules))(
        *shapes
    )


def run_equations(eqns: Sequence[Any], env: dict) -> dict:
    """Evaluates ``eqns`` (flat: no inlined calls left) into ``env`` and returns it."""

    def read(v):
        return v.val if isinstance(v, Literal) else env[v]

    for eqn in eqns:
        env.update(zip(eqn.outvars, bind(eqn, *[read(v) for v in eqn.invars])))
    return env
