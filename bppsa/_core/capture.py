"""How a cell's analytic transposed Jacobian reaches ``bppsa.scan`` without being asked for.

A cell decorated with :func:`transposed_jacobian` records each call while ``bppsa.scan`` traces
its body inside :func:`recording`. The scan uses a recorded builder only when the call IS the
whole carry map: its state arguments are the very carry leaves the body received and its outputs
the very carry leaves the body returned (checked by object identity during tracing), and its
other inputs do not depend on the carry (checked on the traced program). Anything else falls
back to autodiff Jacobians, so the analytic path can only be taken where it is exact.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
from collections.abc import Callable, Iterator
from typing import Any

import jax

from bppsa._carry import Layout, is_float
from bppsa._dependence import depends_on
from bppsa.scan import Linear


@dataclasses.dataclass(frozen=True)
class CellCall:
    """One recorded call of a cell that knows its transposed Jacobian."""

    state_in: list[Any]
    state_out: list[Any]
    other_inputs: list[Any]
    build: Callable[[], Linear]


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


def transposed_jacobian(builder: Callable[..., Linear]):
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
    the carry nor ``x`` (they are built once, not per step).
    """
    found = []

    def probe(carry, x):
        _, _, call = matching_call(f, carry, x)
        if call is None:
            return [], []
        found.append(call)
        element = call.build()
        return call.other_inputs, [getattr(element, name) for name in element.shared_fields]

    carry_labels = ["carry" if is_float(leaf) else None for leaf in jax.tree.leaves(init)]
    if "carry" not in carry_labels:
        return False
    labels = carry_labels + ["x"] * len(jax.tree.leaves(x))
    deps = depends_on(probe, (init, x), labels)
    if not found:
        return False
    num_other = len(found[0].other_inputs)
    other, shared = deps[:num_other], deps[num_other:]
    return not any("carry" in d for d in other) and not any(shared)


def matching_call(f, carry, x):
    """Runs ``f(carry, x)``; also returns the recorded cell call that is its whole carry map."""
    layout = Layout.of(carry, concat_last=True)
    with recording() as calls:
        new_carry, y = f(carry, x)
    call = match(calls, layout.float_leaves(carry), layout.float_leaves(new_carry))
    return new_carry, y, call


def with_jacobian(f, analytic: bool):
    """``f`` extended to also return its step's transposed Jacobian when a cell provides one."""

    def step(carry, x):
        if not analytic:
            return (*f(carry, x), None)
        new_carry, y, call = matching_call(f, carry, x)
        return new_carry, y, call.build()

    return step
