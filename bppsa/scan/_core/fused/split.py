"""A scan's step split into what depends on the carry and what does not.

:func:`split_step` traces one step to a flat jaxpr (calls such as ``jit`` inlined; calls with their
own derivative rules too, unless the step is to be differentiated) and sorts its equations by
what they read:

* ``constant``: neither the carry nor ``x`` (e.g. ``W_hh^T``, ``b_ih + b_hh``): evaluated once;
* ``per_step``: ``x`` but not the carry (input projections ``x @ W_ih``): evaluated for all
  steps at once, before the loop, as large products;
* ``recurrence``: the dependence cone of the new carry: the only part the loop runs.

What the kernel reads of the first two (its *residuals*) are the values the recurrence uses.
Outputs ``ys`` that are not a carry are computed after the loop, for all steps at once, from the
carries that entered each step.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
from jax.extend.core import ClosedJaxpr, Literal

from bppsa.scan._core.fused.slices import push_slices
from bppsa.scan._core.jaxprs.walk import flat_jaxpr, run_equations


@dataclasses.dataclass(frozen=True, eq=False)
class Split:
    """One step's flat jaxpr, its equations sorted by what they depend on.

    Attributes:
        jaxpr: the flat step ``(*carry, *x, *consts) -> (*new_carry, *ys)``.
        num_carry, num_x: leaves of the carry and of one step's ``x`` among its inputs.
        num_ys: leaves of ``ys`` among its outputs.
        constant, per_step, recurrence: the equations, in order (see the module).
        constant_residuals, step_residuals: what the recurrence reads of the other two
            (variables of the jaxpr: its constants and inputs included).
    """

    jaxpr: ClosedJaxpr
    num_carry: int
    num_x: int
    num_ys: int
    constant: tuple
    per_step: tuple
    recurrence: tuple
    constant_residuals: tuple
    step_residuals: tuple

    @property
    def carry_in(self) -> list:
        return self.jaxpr.jaxpr.invars[: self.num_carry]

    @property
    def carry_out(self) -> list:
        return self.jaxpr.jaxpr.outvars[: self.num_carry]

    @property
    def ys_out(self) -> list:
        return self.jaxpr.jaxpr.outvars[self.num_carry :]


def split_step(
    step: Callable,
    carry: Sequence[Any],
    x: Sequence[Any],
    consts: Sequence[Any],
    *,
    rules: bool = False,
):
    """:class:`Split` of ``step(carry_leaves, x_leaves, const_leaves) -> (carry_leaves,
    y_leaves)`` at the shapes given (lists of ``jax.ShapeDtypeStruct``); ``rules``: keep the
    calls with their own derivative rules whole (for a step that is differentiated)."""
    nc, nx = len(carry), len(x)
    num_ys = []

    def flat(*args):
        new_carry, ys = step(list(args[:nc]), list(args[nc : nc + nx]), list(args[nc + nx :]))
        num_ys.append(len(ys))
        return [*new_carry, *ys]

    closed = push_slices(flat_jaxpr(flat, *carry, *x, *consts, rules=rules), nc)
    jaxpr = closed.jaxpr
    on_carry = set(jaxpr.invars[:nc])
    on_x = set(jaxpr.invars[nc : nc + nx])
    for eqn in jaxpr.eqns:
        ins = [v for v in eqn.invars if not isinstance(v, Literal)]
        if any(v in on_carry for v in ins):
            on_carry.update(eqn.outvars)
        elif any(v in on_x for v in ins):
            on_x.update(eqn.outvars)
    # the recurrence: the equations the new carry needs, walked backwards
    needed = {v for v in jaxpr.outvars[:nc] if not isinstance(v, Literal)}
    recurrence = []
    for eqn in reversed(jaxpr.eqns):
        if any(v in needed for v in eqn.outvars) and any(v in on_carry for v in eqn.outvars):
            recurrence.append(eqn)
            needed.update(v for v in eqn.invars if not isinstance(v, Literal))
    recurrence.reverse()
    produced = {v for eqn in recurrence for v in eqn.outvars} | set(jaxpr.invars[:nc])
    residuals = []
    for v in [*(v for eqn in recurrence for v in eqn.invars), *jaxpr.outvars[:nc]]:
        if not isinstance(v, Literal) and v not in produced and v not in residuals:
            residuals.append(v)
    others = [eqn for eqn in jaxpr.eqns if not any(v in on_carry for v in eqn.outvars)]
    return Split(
        jaxpr=closed,
        num_carry=nc,
        num_x=nx,
        num_ys=num_ys[0],
        constant=tuple(e for e in others if not any(v in on_x for v in e.outvars)),
        per_step=tuple(e for e in others if any(v in on_x for v in e.outvars)),
        recurrence=tuple(recurrence),
        constant_residuals=tuple(v for v in residuals if v not in on_x),
        step_residuals=tuple(v for v in residuals if v in on_x),
    )


def residuals(split: Split, constants: Sequence, x_leaves: Sequence, length: int):
    """What the loop reads of ``split``'s constant and per-step parts, given its constant
    inputs and its ``x`` inputs for all steps: ``(env, x_vars, constant_values, step_values)``,
    ``env`` the values of the constant part's variables, ``x_vars`` the step's ``x``
    variables, and the per-step residuals ``(T, ...)`` evaluated for all steps at once."""
    jaxpr = split.jaxpr.jaxpr
    nc, nx = split.num_carry, split.num_x
    env = dict(zip(jaxpr.constvars, split.jaxpr.consts))
    env.update(zip(jaxpr.invars[nc + nx :], constants))
    run_equations(split.constant, env)
    x_vars = jaxpr.invars[nc : nc + nx]

    def per_step(x):
        local = dict(env)
        local.update(zip(x_vars, x))
        run_equations(split.per_step, local)
        return [local[v] for v in split.step_residuals]

    steps = jax.vmap(per_step, axis_size=length)(list(x_leaves)) if split.step_residuals else []
    return env, x_vars, [env[v] for v in split.constant_residuals], steps


def shapes_of(values) -> list:
    """``jax.ShapeDtypeStruct`` of each of ``values``."""
    return [jax.ShapeDtypeStruct(jnp.shape(v), jnp.result_type(v)) for v in values]


def split_scan_step(problem, *, rules: bool = False) -> tuple[Split, Any]:
    """A scan's step (``problem.body``, one step of its carry and ``x`` as flat leaves) split by
    :func:`split_step` (``rules``: as there), and the tree of its outputs ``ys``.

    Raises:
        Exception: whatever tracing or splitting the step raises (the callers fall back).
    """
    body = problem.body
    carry_leaves, carry_tree = jax.tree.flatten(problem.init)
    x_shapes = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape[1:], a.dtype), problem.xs)
    x_leaves, x_tree = jax.tree.flatten(x_shapes)
    consts = shapes_of(body.consts)
    ys_trees = []

    def step(carry, x, consts):
        out, *_ = body.converted(carry_tree.unflatten(carry), x_tree.unflatten(x), *consts)
        new_carry, ys = out
        y_leaves, ys_tree = jax.tree.flatten(ys)
        ys_trees.append(ys_tree)
        return carry_tree.flatten_up_to(new_carry), y_leaves

    split = split_step(step, carry_leaves, x_leaves, consts, rules=rules)
    return split, ys_trees[0]
