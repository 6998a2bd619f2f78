"""Which outputs of a traced function depend on which inputs (a conservative data-flow pass)."""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from typing import Any

import jax
from jax.extend.core import Literal


def depends_on(
    fun: Callable, args: Sequence[Any], labels: Sequence[Hashable | None]
) -> list[frozenset]:
    """For each output leaf of ``fun(*args)``, the labels of the input leaves it may depend on.

    ``labels`` has one entry per leaf of ``args`` (``None``: not tracked). An equation's outputs
    inherit the labels of all of its inputs, so the answer may list a label too often but never
    misses one.
    """
    jaxpr = jax.make_jaxpr(fun)(*args).jaxpr
    deps = {v: frozenset([lab]) for v, lab in zip(jaxpr.invars, labels) if lab is not None}

    def of(v):
        return frozenset() if isinstance(v, Literal) else deps.get(v, frozenset())

    for eqn in jaxpr.eqns:
        inherited = frozenset().union(*(of(v) for v in eqn.invars))
        if inherited:
            deps.update((v, inherited) for v in eqn.outvars)
    return [of(v) for v in jaxpr.outvars]
