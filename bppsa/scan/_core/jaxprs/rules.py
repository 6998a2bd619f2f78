"""Calls with their own derivative rules in a jaxpr: ``jax.custom_jvp`` and ``jax.custom_vjp``.

A ``custom_jvp_call`` differentiates by its rule, not by the function it calls: a spiking cell's
step function ``v > 0`` has a zero derivative, its surrogate rule a dense one. Every analysis of
a step's derivative reads the call by its rule: :func:`jvp_jaxpr` traces the rule's JVP of one
such equation as a jaxpr (JAX applies the rule while tracing ``jax.jvp``).

A ``custom_vjp_call`` differentiates by a backward function that JAX only ever calls with a
cotangent: nothing says it is linear in that cotangent (JAX's own ``clip_gradient`` example is
not). A method that forms the step's Jacobians (columns of ``jax.vjp``) or splits the step's
cotangents is exact only for a rule that is linear; back-propagation, which calls the rule step by
step with the whole cotangent, is exact for any. :func:`opaque_rules` names the calls the carry
reaches, for the decision (:mod:`bppsa.scan._core.decision`).

JAX's internal read here (with a fallback): the traced function's name (``debug_info``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np
from jax.extend.core import ClosedJaxpr, Jaxpr, Literal

from bppsa.scan._core.carry import is_float
from bppsa.scan._core.jaxprs.taxonomy import JVP_RULES, VJP_RULES
from bppsa.scan._core.jaxprs.walk import bind


def name(eqn) -> str:
    """The decorated function's name and source position (``"clip_gradient at f.py:3"``), or
    the primitive's name where JAX does not record it."""
    inner = eqn.params.get("call_jaxpr") or eqn.params.get("fun_jaxpr")
    jaxpr = getattr(inner, "jaxpr", inner)
    info = getattr(jaxpr, "debug_info", None)
    where = getattr(info, "func_src_info", None)
    return where if isinstance(where, str) and where else f"a {eqn.primitive.name}"


def jvp_jaxpr(eqn) -> tuple[ClosedJaxpr, list[bool], list[bool]]:
    """The JVP of one ``custom_jvp_call`` equation by its rule, as a jaxpr.

    Returns:
        ``(closed, float_in, float_out)``: ``closed`` maps ``(*primals, *tangents)`` to the
        tangents of the float outputs, with a tangent input for each float input only
        (``float_in``, ``float_out``: which of the equation's inputs and outputs are float).

    Raises:
        Exception: whatever tracing the rule raises (the caller reads the call as dense).
    """
    float_in = [is_float(v.aval) for v in eqn.invars]
    float_out = [is_float(v.aval) for v in eqn.outvars]
    primals = [jax.ShapeDtypeStruct(v.aval.shape, v.aval.dtype) for v in eqn.invars]
    tangents = [p for p, f in zip(primals, float_in) if f]

    def tangent_map(*args):
        ps, ts = args[: len(primals)], iter(args[len(primals) :])
        full = [
            next(ts) if f else np.zeros(p.shape, jax.dtypes.float0)
            for p, f in zip(primals, float_in)
        ]
        _, outs = jax.jvp(lambda *a: bind(eqn, *a), list(ps), full)
        return [t for t, f in zip(outs, float_out) if f]

    return jax.make_jaxpr(tangent_map)(*primals, *tangents), float_in, float_out


def _inner_jaxprs(params: dict) -> list[Jaxpr]:
    """The jaxprs an equation's parameters hold (calls, branches, loop bodies)."""
    found = []
    for value in params.values():
        for item in value if isinstance(value, tuple | list) else (value,):
            if isinstance(item, ClosedJaxpr):
                found.append(item.jaxpr)
            elif isinstance(item, Jaxpr):
                found.append(item)
    return found


def opaque_rules(fun: Callable, sources: Any, *others: Any) -> tuple[str, ...]:
    """The ``jax.custom_vjp`` functions of ``fun(sources, *others)`` whose inputs ``sources``
    may reach (:func:`name` of each, in order, without repeats).

    Conservative: inside a call, branch or loop the carry reaches, every input counts as
    reached; a ``custom_jvp`` call is read by its rule, so a ``custom_vjp`` function inside
    its primal function does not count.
    """
    closed = jax.make_jaxpr(fun)(sources, *others)
    reached_inputs = [True] * len(jax.tree.leaves(sources))
    reached_inputs += [False] * (len(closed.jaxpr.invars) - len(reached_inputs))
    found: list[str] = []

    def walk(jaxpr: Jaxpr, reached_inputs: Sequence[bool]) -> None:
        reached = {v for v, r in zip(jaxpr.invars, reached_inputs) if r}
        for eqn in jaxpr.eqns:
            if not any(v in reached for v in eqn.invars if not isinstance(v, Literal)):
                continue
            reached.update(eqn.outvars)
            if eqn.primitive.name in VJP_RULES:
                found.append(name(eqn))
            elif eqn.primitive.name not in JVP_RULES:
                for inner in _inner_jaxprs(eqn.params):
                    walk(inner, [True] * len(inner.invars))

    walk(closed.jaxpr, reached_inputs)
    return tuple(dict.fromkeys(found))
