"""The backward method of each name of :mod:`paper_figures.result_files.methods`: the one place
where a name becomes a ``bppsa`` method object.

``bp`` is the baseline, plain back-propagation (``bppsa``'s ``"sequential"`` method: JAX
differentiates ``lax.scan``); ``bppsa`` is the library's default choice (``bppsa.Auto()``: on
accelerators the fastest of BP, Blelloch and Chunked by its cost model, and ``FusedSequential()``
on a profile with a fused rate; on CPUs its measured rules: a time-blocked Jacobian-based
sequential scan, or plain back-propagation for large batches; over the memory limit, a
lower-memory method that fits); the other
names pick a method explicitly.

The forward pass of the scans is chosen apart from the method: ``"sequential"`` (the library's
default forward, ``bppsa.AutoForward``: ``lax.scan`` on a CPU, the fused kernel where it runs
on a GPU; a run's plan records which), ``"newton"`` (``bppsa.Newton()``: Newton iterations
on the whole trajectory, each a parallel scan) or ``"fused"`` (``bppsa.Fused()``: the loop in
one kernel launch, wherever it runs the cell; interpreted on a CPU). Only the BPPSA methods
take it: ``bp`` is the reference, plain JAX through ``lax.scan``, whatever forward the others
run (:func:`forward_of`).

:func:`bind` fixes a method, a forward and a memory limit inside a loss, for a gradient taken
apart from ``bppsa.grad`` (the timing harness's ``jax.vjp`` and its pullback,
:mod:`experiments.timing`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import bppsa
from bppsa.scan._core.asked import options_from
from bppsa.scan._core.options import ambient
from paper_figures.result_files import methods as method_names

__all__ = [
    "FORWARDS",
    "FUSED_FORWARD",
    "NEWTON_FORWARD",
    "OVER_LAYERS",
    "OVER_TIME",
    "SEQUENTIAL_FORWARD",
    "bind",
    "build",
    "describe",
    "forward_of",
    "is_baseline",
    "parse_forward",
    "parse_method",
]

# The names the experiments take for a scan over time, and for a chain of layers.
OVER_TIME = method_names.OVER_TIME
OVER_LAYERS = method_names.OVER_LAYERS


# The names of the forward passes (``--forward``), the default first.
SEQUENTIAL_FORWARD = "sequential"
NEWTON_FORWARD = "newton"
FUSED_FORWARD = "fused"
FORWARDS = (SEQUENTIAL_FORWARD, NEWTON_FORWARD, FUSED_FORWARD)


def parse_method(name: str, forms: Sequence[str] = OVER_TIME) -> bppsa.Method | bppsa.Policy:
    """The method object of a name of one of ``forms``.

    Raises:
        ValueError: for another name, listing the valid ones.
    """
    return build(method_names.parse(name, forms))


def build(name: method_names.Name) -> bppsa.Method | bppsa.Policy:
    """The method object of a parsed name: the library's method of its form
    (:func:`bppsa.scan.resolve` of the table's name), with the numbers in the name (``levels``,
    ``chunks``), in time blocks of ``block`` steps if the name has one."""
    method = bppsa.scan.resolve(method_names.FORM[name.form].library)
    numbers = {"levels": name.levels, "chunks": name.chunks}
    numbers = {key: value for key, value in numbers.items() if value is not None}
    if numbers:
        method = type(method)(**numbers)
    return method if name.block is None else bppsa.Blocked(method, name.block)


def is_baseline(name: str, forms: Sequence[str] = OVER_TIME) -> bool:
    """Whether method ``name`` is plain back-propagation (``bp``, or ``sequential``)."""
    return method_names.parse(name, forms).form in (method_names.BP, method_names.SEQUENTIAL)


def forward_of(name: str, forward: str, forms: Sequence[str] = OVER_TIME) -> str:
    """The forward pass that method ``name`` runs when the BPPSA methods run ``forward`` (a name
    of :data:`FORWARDS`): the back-propagation baseline always runs ``lax.scan``, the
    reference the others are compared with.

    Raises:
        ValueError: for an unknown method or forward name, listing the valid ones.
    """
    parse_forward(forward)  # refuses an unknown name
    return SEQUENTIAL_FORWARD if is_baseline(name, forms) else forward


def parse_forward(forward: str) -> bppsa.Newton | bppsa.Fused | None:
    """The forward object of a name of :data:`FORWARDS` (``None``: the library's default
    forward, ``lax.scan`` on a CPU, the fused kernel where it runs on a GPU).

    Raises:
        ValueError: for another name, listing the valid ones.
    """
    if forward == SEQUENTIAL_FORWARD:
        return None
    if forward == NEWTON_FORWARD:
        return bppsa.Newton()
    if forward == FUSED_FORWARD:
        return bppsa.Fused()
    raise ValueError(f"forward {forward!r} is not known; expected one of {', '.join(FORWARDS)}.")


def describe(
    name: str,
    length: int,
    hidden: int,
    backend: str | None = None,
    *,
    batch: int = 1,
    element: int | None = None,
    inputs: int = 0,
) -> str:
    """What method ``name`` runs for ``length`` steps of a ``hidden``-sized state, ``batch``
    examples vmapped, ``element`` floats per step's Jacobian, ``inputs`` features per step
    (``Auto`` resolved to its choice; ``Sequential()`` there means that it runs plain
    back-propagation)."""
    method = parse_method(name)
    if isinstance(method, bppsa.Auto):
        chosen = method.choose(length, hidden, backend, batch=batch, element=element, inputs=inputs)
        return f"{method!r} -> {chosen!r}"
    return repr(method)


def bind(
    loss: Callable[..., Any],
    *,
    method: bppsa.Method | bppsa.Policy | str | None = None,
    forward: bppsa.Newton | bppsa.AutoForward | str | None = None,
    memory_limit: float | None = None,
) -> Callable[..., Any]:
    """``loss`` with every ``bppsa.scan`` and chain of layers inside it run with ``method``,
    ``forward`` and ``memory_limit``, however it is differentiated.

    ``jax.value_and_grad(bind(loss, method=m))`` is ``bppsa.value_and_grad(loss, method=m)``;
    ``jax.vjp`` of it runs the same forward, and its pullback the same backward, also when the
    pullback is traced apart from the forward (:class:`experiments.timing.GradientPrograms`): a scan
    takes its options when its forward is traced, here inside ``loss``.

    bppsa has no public ``vjp`` with these options yet; until it has, this reads the options
    through the library's own context (:func:`bppsa.scan._core.options.ambient`, what
    ``bppsa.grad`` sets), here and nowhere else in the experiments.

    Args:
        loss: ``loss(params, *args)``.
        method, forward, memory_limit: as in :func:`bppsa.value_and_grad` (``None``: the
            library's defaults, or those of an enclosing ``bppsa.grad``).

    Returns:
        A function with ``loss``'s signature and values.

    Raises:
        ValueError, TypeError: for an unknown method or forward, or a bad limit (before any
            tracing).
    """
    options = options_from(method, memory_limit, None, forward)

    @functools.wraps(loss)
    def bound(*args: Any, **kwargs: Any) -> Any:
        with ambient(options):
            return loss(*args, **kwargs)

    return bound
