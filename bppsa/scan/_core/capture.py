"""How a cell's analytic transposed Jacobian reaches ``bppsa.scan`` without being asked for.

A cell decorated with :func:`transposed_jacobian` records each call while ``bppsa.scan`` traces
its body inside :func:`recording`. The scan uses a recorded builder only when the call IS the
whole carry map: its state arguments are the very carry leaves the body received and its outputs
the very carry leaves the body returned (checked by object identity during tracing, see
:func:`match`), and its other inputs do not depend on the carry (checked on the traced program
by :mod:`bppsa.scan._core.body`). Anything else falls back to autodiff Jacobians, with an
:class:`AnalyticJacobianWarning` that says why, so the analytic path is only taken where it is
exact.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
from collections.abc import Callable, Iterator
from typing import Any

import jax
import jax.numpy as jnp

from bppsa.scan._core.carry import is_float
from bppsa.scan._elements import Dense, MapStack, Structured


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


def transposed_jacobian(builder: Callable[..., MapStack], *, of: str = "cell"):
    """Attaches an analytic transposed Jacobian to a cell (``of="cell"``, the default) or to a
    layer of a chain (``of="layer"``), for :func:`bppsa.scan` and ``Chain.apply`` to use.

    Decorate a cell ``cell(params, state, x, **options) -> new_state`` (``new_state`` with the
    structure of ``state``). Wherever a scan's body IS one call of the cell (the body hands the
    cell the carry it receives and returns the cell's output as its new carry, e.g.
    ``lambda h, x: (cell(params, h, x), h)``, and the parameters and input do not depend on the
    carry), the scan builds every step's ``J_t^T`` with ``builder`` instead of by autodiff:
    ``bppsa.trace_plans()`` then records ``jacobians="analytic"``. Anywhere else the call is
    plain ``cell(...)`` (the scan builds autodiff Jacobians and warns with
    :class:`AnalyticJacobianWarning` why it could not use ``builder``), so the decorator never
    changes values, only how the backward pass gets them.

    ``builder(params, state, x, **options)`` gets the cell's own arguments and returns ONE step's
    transposed Jacobian ``J^T = (d new_state / d state)^T`` (no time axis; the scan vmaps the
    builder over the steps) as an element of :mod:`bppsa.scan`, acting on the float leaves of
    ``state`` concatenated along their last axis (``n`` = the sum of their last dims; the
    leading dims, if the cell is called on a batch, are independent examples):

    * :class:`bppsa.scan.Dense` ``(a)``: ``a: (*batch, n, n)``, the matrix ``J^T`` itself;
    * :class:`bppsa.scan.Structured` ``(u, d, e=None, reps=1)``:
      ``J^T = u @ diag(d) @ [I; ...; I] + diag(e)`` with ``u: (n, reps * n)`` shared by every
      step (it may depend on ``params`` only, not on ``state`` or ``x``: it is built once),
      ``d: (*batch, reps * n)`` and ``e: (*batch, n)``. A cell
      ``h' = g(W h + ...)`` with an elementwise ``g`` has ``J = diag(g') W``, so
      ``J^T = W^T diag(g')``: ``Structured(u=W.T, d=g')``; a diagonal term ``c * h`` in ``h'``
      adds ``e = c``. The scan then applies ``J^T`` with one ``(n, reps * n)`` product per
      step instead of forming an ``(n, n)`` matrix.

    The builder is not checked against autodiff (that would cost what it saves): test it once
    against ``jax.jacobian`` of the cell, or compare gradients with ``method=Sequential()``.

    Args:
        builder: ``(params, state, x, **options) -> Dense | Structured`` (any
            :class:`bppsa.scan.MapStack`), called while the scan is traced.

    Returns:
        A decorator. The decorated cell computes exactly what the cell computes and has the
        builder as its attribute ``transposed_jacobian``.

    Raises:
        TypeError: when the scan uses the builder and it returns something that is not an
            element of :mod:`bppsa.scan` (raised while ``bppsa.scan`` is traced).
        ValueError: when the builder's element does not have the shapes above for the cell's
            state, e.g. a scalar ``e`` (use ``jnp.full_like(h, c)``) or ``u = W`` of another
            size.

    Example:
        A leaky Elman cell ``h' = (1 - a) h + a tanh(W h + U x + b)`` has
        ``J^T = W^T diag(a (1 - tanh^2)) + (1 - a) I``
        (``tests/interop/test_custom_jacobian.py`` runs this example)::

            import jax
            import jax.numpy as jnp
            import bppsa
            from bppsa.jacobians import transposed_jacobian
            from bppsa.scan import Structured

            a = 0.5

            def leaky_jacobian_t(params, h, x):
                z = jnp.tanh(params["w"] @ h + params["u"] @ x + params["b"])
                return Structured(u=params["w"].T, d=a * (1 - z**2), e=jnp.full_like(h, 1 - a))

            @transposed_jacobian(leaky_jacobian_t)
            def leaky(params, h, x):
                z = jnp.tanh(params["w"] @ h + params["u"] @ x + params["b"])
                return (1 - a) * h + a * z

            def loss(params, xs):
                h, _ = bppsa.scan(lambda h, x: (leaky(params, h, x), None), jnp.zeros(3), xs)
                return h.sum()

            params = {"w": jnp.eye(3), "u": jnp.ones((3, 2)), "b": jnp.zeros(3)}
            with bppsa.trace_plans() as plans:
                grads = jax.jit(bppsa.grad(loss, method="blelloch"))(params, jnp.ones((5, 2)))
            assert plans[0].jacobians == "analytic"

        A method can be the cell too (``self`` is then ``params``), e.g. an equinox module's
        ``@transposed_jacobian(builder) def __call__(self, h, x)``, whose builder is called as
        ``builder(module, h, x)``. A cell whose arguments come in another order (equinox's
        ``GRUCell(x, h)``) is wrapped in a function of ``(params, h, x)``.

        A layer of a :class:`bppsa.models.Chain` written as a function ``layer(params, x)`` of
        a batch declares its transposed Jacobian with ``of="layer"``: ``builder(params, x)``
        returns the ``J^T`` of the batch at its input ``x`` (e.g. a :class:`bppsa.scan.Dense`
        of shape ``(1, B, n_in, n_out)``); without one, the chain's backward builds it by
        autodiff. It is one protocol for cells and layers, with two named calling conventions
        (``of``): a ``transposed_jacobian`` builder that takes the call's own arguments, which
        is also what the layer types of :mod:`bppsa.models` define
        (:meth:`bppsa.models.Layer.transposed_jacobian`, ``(params, x, mask)``).
    """

    if of not in ("cell", "layer"):
        raise ValueError(f"transposed_jacobian: of must be 'cell' or 'layer', got {of!r}.")

    def decorate(cell):
        name = getattr(cell, "__name__", repr(cell))

        if of == "layer":  # layer(params, x): no carry to match; the chain reads the builder

            @functools.wraps(cell)
            def layer(params, *args, **options):
                return cell(params, *args, **options)

            layer.transposed_jacobian = builder
            return layer

        @functools.wraps(cell)
        def wrapped(params, *args, **options):
            if len(args) > 2:  # options given by position: a plain call (keywords are matched)
                return cell(params, *args, **options)
            if len(args) < 2:
                raise TypeError(
                    f"{name} is declared a cell by transposed_jacobian: call it as "
                    f"{name}(params, state, x); got {len(args) + 1} positional arguments (a "
                    "layer's builder is declared with transposed_jacobian(builder, of='layer'))."
                )
            state, x = args
            new_state = cell(params, state, x, **options)
            calls = _calls.get()
            if calls is not None:
                calls.append(
                    CellCall(
                        name=name,
                        state_in=jax.tree.leaves(state),
                        state_out=jax.tree.leaves(new_state),
                        # Arrays only: a module's other leaves (activation functions, Python
                        # numbers) are constants, which cannot depend on the carry.
                        other_inputs=[
                            leaf
                            for leaf in jax.tree.leaves((params, x))
                            if isinstance(leaf, jax.Array)
                        ],
                        build=functools.partial(
                            _build_checked, name, builder, params, state, x, options
                        ),
                    )
                )
            return new_state

        wrapped.transposed_jacobian = builder
        return wrapped

    return decorate


def _build_checked(name, builder, params, state, x, options) -> MapStack:
    """``builder(params, state, x, **options)``, checked against the shapes of ``state``."""
    built = builder(params, state, x, **options)
    where = f"the transposed-Jacobian builder {_name(builder)} of {name}"
    if not isinstance(built, MapStack):
        raise TypeError(
            f"bppsa.scan: {where} must return an element of bppsa.scan (Dense, Structured), "
            f"got {_describe(built)}; wrap a matrix a = J^T as bppsa.scan.Dense(a)."
        )
    leaves = [leaf for leaf in jax.tree.leaves(state) if is_float(leaf)]
    if any(jnp.ndim(leaf) == 0 for leaf in leaves):
        raise ValueError(
            f"bppsa.scan: {where} acts on the state's leaves concatenated along their last "
            "axis, so each needs one; got shapes "
            f"{[tuple(jnp.shape(leaf)) for leaf in leaves]} (use shape (1,) for a scalar)."
        )
    batches = {tuple(jnp.shape(leaf)[:-1]) for leaf in leaves}
    if len(batches) != 1:
        raise ValueError(
            f"bppsa.scan: {where} acts on the state's leaves concatenated along their last "
            "axis, so they must share their leading dims; got shapes "
            f"{[tuple(jnp.shape(leaf)) for leaf in leaves]}."
        )
    (batch,) = batches
    n = sum(jnp.shape(leaf)[-1] for leaf in leaves)
    if isinstance(built, Dense):
        expected = {"a": (*batch, n, n)}
    elif isinstance(built, Structured):
        p = built.reps * n
        expected = {"u": (n, p), "d": (*batch, p)}
        if built.e is not None:
            expected["e"] = (*batch, n)
    else:
        expected = {}
        if built.size != n:
            raise ValueError(
                f"bppsa.scan: {where} returned a {type(built).__name__} on vectors of size "
                f"{built.size}; the state has {n} floats along its last axis."
            )
    wrong = {
        field: (tuple(jnp.shape(getattr(built, field))), shape)
        for field, shape in expected.items()
        if tuple(jnp.shape(getattr(built, field))) != shape
    }
    if wrong:
        got = ", ".join(f"{f}: {g} (expected {e})" for f, (g, e) in wrong.items())
        raise ValueError(
            f"bppsa.scan: {where} returned {_describe(built)} of the wrong shape for a "
            f"state of {n} floats (leading dims {batch}): {got}. It must be ONE step's J^T "
            "(no time axis) on the state's leaves concatenated along their last axis; see "
            "help(bppsa.jacobians.transposed_jacobian)."
        )
    return built


def _describe(value) -> str:
    if hasattr(value, "reps"):
        return f"a {type(value).__name__} with reps={value.reps}"
    if hasattr(value, "shape") and hasattr(value, "dtype"):
        return f"an array of shape {tuple(value.shape)}"
    return f"a {type(value).__name__}"


def _name(fn) -> str:
    return getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or repr(fn)


def match(calls: list[CellCall], carry_in: list[Any], carry_out: list[Any]) -> CellCall | None:
    """The recorded call that maps exactly ``carry_in`` to ``carry_out``, if there is one."""

    def same(a, b):
        return len(a) == len(b) and all(x is y for x, y in zip(a, b))

    for call in calls:
        if carry_in and same(call.state_in, carry_in) and same(call.state_out, carry_out):
            return call
    return None
