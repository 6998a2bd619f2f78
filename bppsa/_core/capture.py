"""How a cell's analytic transposed Jacobian reaches ``bppsa.scan`` without being asked for.

A cell decorated with :func:`transposed_jacobian` records each call while ``bppsa.scan`` traces
its body inside :func:`recording`. The scan uses a recorded builder only when the call IS the
whole carry map: its state arguments are the very carry leaves the body received and its outputs
the very carry leaves the body returned (checked by object identity during tracing, see
:func:`match`), and its other inputs do not depend on the carry (checked on the traced program
by :mod:`bppsa._core.body`). Anything else falls back to autodiff Jacobians, with an
:class:`AnalyticJacobianWarning` that says why, so the analytic path is only taken where it is
exact.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import jax

if TYPE_CHECKING:
    from bppsa.scan._elements import MapStack


class AnalyticJacobianWarning(UserWarning):
    """A scan's body calls a cell with an analytic Jacobian, but the scan cannot use it (the
    call is not exactly the body's carry map): its Jacobians are built by autodiff instead."""


@dataclasses.dataclass(frozen=True)
class CellCall:
    """One recorded call of a cell that knows its transposed Jacobian."""

    name: str
    state_in: list[Any]
    state_out: list[Any]
    other_inputs: list[Any]
    build: Callable[[], MapStack]


_calls: contextvars.ContextVar[list[CellCall] | None] = contextvars.ContextVar(
    "bppsa_cell_calls", default=None
)


@contextlib.contextmanager
def recording() -> Iterator[list[CellCall]]:
    """Collects the calls of decorated cells made inside the block."""
    calls: list[CellCall] = []
    token = _calls.set(calls)
    try:
        yield calls
    finally:
        _calls.reset(token)


def transposed_jacobian(builder: Callable[..., MapStack]):
    """Attaches an analytic transposed-Jacobian builder to a cell.

    The cell is called as ``cell(params, state, x, **options)`` and returns the new state (same
    pytree structure). ``builder(params, state, x, **options)`` returns ``J^T``, the transpose of
    ``d new_state / d state``, as a single (unstacked) element of :mod:`bppsa.scan`, acting on the
    state's leaves concatenated along their last axis.
    """

    def decorate(cell):
        @functools.wraps(cell)
        def wrapped(params, state, x, **options):
            new_state = cell(params, state, x, **options)
            calls = _calls.get()
            if calls is not None:
                calls.append(
                    CellCall(
                        name=getattr(cell, "__name__", repr(cell)),
                        state_in=jax.tree.leaves(state),
                        state_out=jax.tree.leaves(new_state),
                        other_inputs=jax.tree.leaves((params, x)),
                        build=functools.partial(builder, params, state, x, **options),
                    )
                )
            return new_state

        wrapped.transposed_jacobian = builder
        return wrapped

    return decorate


def match(calls: list[CellCall], carry_in: list[Any], carry_out: list[Any]) -> CellCall | None:
    """The recorded call that maps exactly ``carry_in`` to ``carry_out``, if there is one."""

    def same(a, b):
        return len(a) == len(b) and all(x is y for x, y in zip(a, b))

    for call in calls:
        if carry_in and same(call.state_in, carry_in) and same(call.state_out, carry_out):
            return call
    return None
