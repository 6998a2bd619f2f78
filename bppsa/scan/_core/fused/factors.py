"""Elementwise scalings of the carry folded into one per value (a jaxpr rewrite).

JAX's VJP of a cell scales the cotangent by the derivative of each elementwise operation in
turn (its rule for ``tanh`` alone is ``(g + g y)(1 - y)``: two products and a sum), and the
factors do not depend on the cotangent. Inside a loop every one of them is an operation per
step. :func:`fold_scalings` rewrites every value of the form ``d * u`` (``u`` a value that
depends on the carry, ``d`` one that does not: a per-step or constant factor of the same shape,
or a scalar) built by ``mul``, ``neg``, ``div`` by ``d`` and sums or differences of two
scalings of the same ``u``, into one product ``u * d`` formed where something else first uses
it, its factor ``d`` computed outside the loop: ``(g + g y)(1 - y) -> g ((1 + y)(1 - y))``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax
from jax.extend.core import ClosedJaxpr, Literal

from bppsa.scan._core.jaxprs.walk import bind

_SUMS = frozenset({"add", "add_any", "sub"})


@dataclasses.dataclass(eq=False)
class _Scaled:
    """``base * factor`` (``factor`` ``None``: one), not formed until :meth:`value`."""

    base: Any
    factor: Any = None
    formed: Any = None

    def value(self):
        if self.factor is None:
            return self.base
        if self.formed is None:
            factor = jnp.broadcast_to(self.factor, jnp.shape(self.base))
            self.formed = lax.mul(self.base, factor.astype(jnp.result_type(self.base)))
        return self.formed


def _times(factor, other):
    return other if factor is None else factor * other


def _combined(name, a: _Scaled, b: _Scaled):
    one = jnp.ones((), jnp.result_type(a.base))
    fa = one if a.factor is None else a.factor
    fb = one if b.factor is None else b.factor
    return _Scaled(a.base, fa - fb if name == "sub" else fa + fb)


def fold_scalings(closed: ClosedJaxpr, num_carry: int) -> ClosedJaxpr:
    """``closed`` (flat) with chains of scalings of its first ``num_carry`` inputs' dependents
    folded (see the module)."""
    jaxpr = closed.jaxpr

    def run(*args):
        env = dict(zip(jaxpr.constvars, closed.consts))
        env.update(zip(jaxpr.invars, args))
        for v in jaxpr.invars[:num_carry]:
            env[v] = _Scaled(env[v])

        def read(v):
            return v.val if isinstance(v, Literal) else env[v]

        def formed(x):
            return x.value() if isinstance(x, _Scaled) else x

        for eqn in jaxpr.eqns:
            name, args = eqn.primitive.name, [read(v) for v in eqn.invars]
            scaled = [isinstance(a, _Scaled) for a in args]
            shape = tuple(eqn.outvars[0].aval.shape)
            same = all(jnp.shape(a.base if s else a) in ((), shape) for a, s in zip(args, scaled))
            if name == "mul" and sum(scaled) == 1 and same:
                a, factor = (args[0], args[1]) if scaled[0] else (args[1], args[0])
                if jnp.shape(a.base) == shape:
                    factor = jnp.asarray(factor, eqn.outvars[0].aval.dtype)
                    env[eqn.outvars[0]] = _Scaled(a.base, _times(a.factor, factor))
                    continue
            if name == "div" and scaled == [True, False] and same:
                a, divisor = args
                if jnp.shape(a.base) == shape:
                    inverse = 1 / jnp.asarray(divisor, eqn.outvars[0].aval.dtype)
                    env[eqn.outvars[0]] = _Scaled(a.base, _times(a.factor, inverse))
                    continue
            if name == "neg" and scaled[0]:
                a = args[0]
                minus = -jnp.ones((), jnp.result_type(a.base))
                env[eqn.outvars[0]] = _Scaled(a.base, _times(a.factor, minus))
                continue
            if name in _SUMS and all(scaled) and args[0].base is args[1].base and same:
                env[eqn.outvars[0]] = _combined(name, *args)
                continue
            outs = bind(eqn, *[formed(a) for a in args])
            if any(scaled):
                outs = [_Scaled(out) for out in outs]
            env.update(zip(eqn.outvars, outs))
        return [formed(read(v)) for v in jaxpr.outvars]

    shapes = [jax.ShapeDtypeStruct(v.aval.shape, v.aval.dtype) for v in jaxpr.invars]
    return jax.make_jaxpr(run)(*shapes)
