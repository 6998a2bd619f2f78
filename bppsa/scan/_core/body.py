"""A scan's body, traced once: its closure-converted step and how its Jacobians are built.

:func:`trace_body` runs the Python body ``f`` exactly once, while recording the calls of cells
that know their transposed Jacobian (:mod:`bppsa.scan._core.capture`), and closure-converts it
(``jax.closure_convert``: closed-over arrays become explicit arguments, so the custom VJP can
return their cotangents). Everything after that (the forward ``lax.scan``, the Jacobians of all
steps, the VJP, shape checks) evaluates the traced program, not the Python function.

The Jacobians are analytic when the body's carry map is exactly one recorded cell call whose
other inputs (parameters, input) do not depend on the carry and whose shared Jacobian parts
(e.g. ``W_hh^T``) depend on neither the carry nor ``x``; otherwise they come from autodiff, and
if the body did call such a cell, an :class:`AnalyticJacobianWarning` says why it was not used,
where the Jacobians are built (:meth:`Body.warn_unused_cell`): not for a scan that is only run,
or back-propagated through ``lax.scan``.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable
from typing import Any

import jax

from bppsa.scan import _precision
from bppsa.scan._core.capture import AnalyticJacobianWarning, match, recording
from bppsa.scan._core.carry import Layout, is_float
from bppsa.scan._core.dependence import depends_on
from bppsa.scan._core.fallback import caller_stacklevel

ANALYTIC, AUTODIFF = "analytic", "autodiff"


@dataclasses.dataclass(frozen=True, eq=False)
class Body:
    """The traced body of a scan.

    Attributes:
        converted: ``(carry, x, *consts) -> ((carry, y), jac_t | None, other_inputs, shared)``,
            the traced body with its recorded cell call's Jacobian (``None`` when none matched).
        consts: the arrays hoisted from the body's closure.
        jacobians: ``"analytic"`` or ``"autodiff"``.
        reason: why a recorded cell call was not used (``None`` if none was recorded or it was).
    """

    converted: Callable
    consts: list[Any]
    jacobians: str
    reason: str | None

    @property
    def analytic(self) -> bool:
        return self.jacobians == ANALYTIC

    def keeping_carries(self) -> Body:
        """This body with ``(y, carry)`` as its output (the carry that entered the step)."""
        converted = self.converted

        def keeping(carry, x, *consts):
            (new_carry, y), *rest = converted(carry, x, *consts)
            return ((new_carry, (y, carry)), *rest)

        return dataclasses.replace(self, converted=keeping)

    def step(self, carry, x, *consts):
        """``(carry, y, jac_t | None)``: one step, with its analytic Jacobian if it is used."""
        (new_carry, y), jac_t, _, _ = self.converted(carry, x, *consts)
        return new_carry, y, jac_t if self.analytic else None

    def plain(self, carry, x):
        """The body's own output ``f(carry, x)`` (for ``lax.scan``'s checks and the forward)."""
        return self.converted(carry, x, *self.consts)[0]

    def warn_unused_cell(self) -> None:
        """Warns with :class:`AnalyticJacobianWarning` why the Jacobians of a cell the body
        calls are not used, if they are not: called where the scan builds its Jacobians."""
        if self.reason is None:
            return
        warnings.warn(
            f"bppsa.scan: analytic Jacobians not used ({self.reason}); the scan builds its "
            "Jacobians by autodiff instead (exact, but dense and slower).",
            AnalyticJacobianWarning,
            stacklevel=caller_stacklevel(),
        )


def trace_body(f: Callable, init: Any, x: Any) -> Body:
    """Traces ``f(init, x)`` once; ``init`` and ``x`` (one step's input) may be shapes.

    Args:
        f: the scan body.
        init: the carry.
        x: one step's input (``xs`` without its leading axis, or ``None``).
    """
    recorded: list[str] = []
    matched: list[bool] = []

    def probe(carry, x):
        with recording() as calls, _precision.cell():
            out = f(carry, x)
        recorded.extend(call.name for call in calls)
        call = _whole_carry_map(calls, carry, out)
        matched.append(call is not None)
        if call is None:
            return out, None, [], []
        with _precision.cell():  # the cell's own values (its gates), at its precision
            element = call.build()
        return out, element, call.other_inputs, list(element.shared().values())

    converted, consts = jax.closure_convert(probe, init, x)
    reason = None
    if recorded and not matched[0]:
        reason = (
            f"the body calls {', '.join(sorted(set(recorded)))}, but no call maps exactly the "
            "carry the body receives to the carry it returns"
        )
    elif matched[0]:
        reason = _dependence_problem(converted, consts, init, x)
    jacobians = ANALYTIC if matched[0] and reason is None else AUTODIFF
    return Body(converted, consts, jacobians, reason)


def _whole_carry_map(calls, carry, out):
    """The recorded call that is the body's whole carry map, or ``None``."""
    if not (isinstance(out, tuple | list) and len(out) == 2):
        return None  # lax.scan's own check reports the malformed output
    layout = Layout.of(carry, concat_last=True)
    try:
        carry_out = layout.float_leaves(out[0])
    except (TypeError, ValueError):  # another structure: lax.scan's check reports it
        return None
    return match(calls, layout.float_leaves(carry), carry_out)


def _dependence_problem(converted, consts, init, x) -> str | None:
    """Why the matched cell call cannot give the scan's Jacobians, or ``None`` if it can."""
    carry_labels = ["carry" if is_float(leaf) else None for leaf in jax.tree.leaves(init)]
    labels = carry_labels + ["x"] * len(jax.tree.leaves(x))

    def inputs_and_shared(carry, x):
        _, _, other_inputs, shared = converted(carry, x, *consts)
        return other_inputs, shared

    deps = depends_on(inputs_and_shared, (init, x), labels)
    num_other = len(jax.tree.leaves(jax.eval_shape(inputs_and_shared, init, x)[0]))
    other, shared = deps[:num_other], deps[num_other:]
    if any("carry" in d for d in other):
        return "the cell's parameters or input depend on the carry"
    if any(shared):
        return "the shared part of the cell's Jacobian depends on the carry or the input"
    return None


def has_analytic_jacobian(f: Callable, init: Any, x: Any) -> bool:
    """Whether ``bppsa.scan(f, init, xs)`` builds its Jacobians analytically (else by autodiff).

    True when the body's carry map is exactly one call of a cell with an analytic Jacobian
    (e.g. ``lambda h, x: (rnn_cell(params, h, x), h)``).

    Args:
        f: the scan body ``f(carry, x) -> (carry, y)``.
        init: the initial carry (arrays or ``jax.ShapeDtypeStruct``).
        x: one step's input, i.e. ``xs`` without its leading axis (or ``None``).

    Traces ``f`` once while recording cell calls. A call qualifies if it maps exactly the float
    carry leaves to the float carry leaves (object identity), if its other inputs (parameters,
    input) do not depend on the carry, and if the shared parts of its Jacobian depend on neither
    the carry nor ``x`` (they are built once, not per step). It does not warn when a cell call
    is not used.

    Example:
        >>> from bppsa.models import RNN, rnn_cell
        >>> params = RNN().init(1, 4, key=jax.random.key(0))
        >>> has_analytic_jacobian(lambda h, x: (rnn_cell(params, h, x), h), jnp.zeros(4),
        ...                       jnp.zeros(1))
        True
        >>> has_analytic_jacobian(lambda h, x: (2 * rnn_cell(params, h, x), h), jnp.zeros(4),
        ...                       jnp.zeros(1))
        False
    """
    return trace_body(f, init, x).analytic
