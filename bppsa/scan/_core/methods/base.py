"""The method interface: what every backward method decides and carries out."""

from __future__ import annotations

import abc
import functools
from typing import TYPE_CHECKING, Any, ClassVar

from jax import Array

from bppsa.scan._core import arguments, backward
from bppsa.scan._core.cost import Cost
from bppsa.scan._core.memory import Footprint
from bppsa.scan._elements import MapStack

if TYPE_CHECKING:
    from bppsa.scan._core.forward import Forward
    from bppsa.scan._core.problem import Problem


class Method:
    """A backward method: owns how a scan is differentiated.

    Methods are values: hashable and compared by their settings (frozen dataclasses), since the
    options of :func:`bppsa.grad` that hold them key ``jax.jit``'s cache.

    Attributes:
        name: the string that :func:`bppsa.scan.resolve` maps to the default instance
            (methods that need arguments have none); a subclass with a name registers it.
        uses_jacobians: False when the method is plain back-propagation through ``lax.scan``
            (every JAX transformation then works as on ``lax.scan``).
    """

    name: ClassVar[str | None] = None
    uses_jacobians: ClassVar[bool] = True
    # Every method with a name, by name: filled as the classes are defined (the one registry
    # of method names; :func:`bppsa.scan.resolve` reads it).
    registry: ClassVar[dict[str, type[Method]]] = {}
    # Whether the backward also runs on a vmapped batch as an axis of its arrays
    # (Problem.batched_problem): maps and cotangents with a batch axis after the step axis.
    batches: ClassVar[bool] = True

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        name = cls.__dict__.get("name")
        if isinstance(name, str):
            if Method.registry.get(name, cls) is not cls:
                raise TypeError(
                    f"a backward method named {name!r} exists already: "
                    f"{Method.registry[name].__qualname__}."
                )
            Method.registry[name] = cls

    def concrete(self, problem: Problem) -> Method:
        """The method that runs ``problem`` (a policy such as ``Auto`` returns another one)."""
        return self

    def memory(self, fp: Footprint) -> int:
        """Estimated peak bytes of a scan's forward and backward with this method
        (:func:`memory_of`, registered beside each method)."""
        return memory_of(self, fp)

    def cost(self, fp: Footprint) -> Cost | None:
        """Predicted steps, arithmetic and bytes of the backward (:func:`cost_of`, registered
        beside each method; :mod:`bppsa.scan._core.cost`); ``None`` where the model does not
        cover the method."""
        return cost_of(self, fp)

    def for_complex_carry(self, leaves: list) -> Method:
        """The method for a carry with complex ``leaves``: the Jacobian methods refuse it."""
        arguments.refuse_complex(self, leaves)
        return self


class JacobianMethod(Method, abc.ABC):
    """A method whose backward scans the transposed Jacobians of all steps (BPPSA).

    Subclasses give the linear :meth:`scan` and its memory (:meth:`span_floats`); the default
    :meth:`backward` evaluates all steps at once (their Jacobians and VJP), scans, and takes
    the VJP (see :func:`bppsa.scan._core.backward.span_backward`).
    """

    @abc.abstractmethod
    def scan(self, g_last: Array, maps: MapStack | list[MapStack], offsets: Array | None):
        """Returns ``[g_0, ..., g_T]`` (see :mod:`bppsa.scan._algorithms`; time order).

        ``maps`` is a stack of the steps' maps (a scan over time) or a list of maps that differ
        in shape (a chain of layers, ``Chain.apply``; then ``offsets`` is ``None`` and the
        result a list). A method that has no scan over layers raises ``TypeError`` for a list.
        """

    def forward_scan(self, h_first: Array, jac_t: MapStack, offsets: Array) -> Array:
        """The linear recurrence forward in time, ``h_{t+1} = J_t h_t + offsets[t]``, by this
        method's scan: returns ``[h_0, ..., h_T]`` from ``h_0 = h_first`` and the transposed
        Jacobians ``jac_t`` (time order; ``J_t`` is their transpose).

        A forward recurrence is the backward one with time reversed: :meth:`scan` over the
        transposed maps from the last step to the first, with ``h_0`` in place of ``g_T``.
        """
        return self.scan(h_first, jac_t.transpose().flip(), offsets[::-1])[::-1]

    def forward_for(self, forward: Forward) -> Forward:
        """The forward pass this method runs when the scan asks for ``forward``: that one."""
        return forward

    def span_floats(self, fp: Footprint, steps: int) -> float:
        """Floats per example of the backward of ``steps`` steps evaluated at once
        (:func:`span_floats_of`, registered beside each method)."""
        return span_floats_of(self, fp, steps)

    def backward(
        self, problem: Problem, consts, carries_before, xs, g_last: Array, ct_ys, *, check: bool
    ) -> tuple[Array, Any, Any, Array | None]:
        """Back-propagates ``g_last`` through all steps of ``problem``.

        Returns:
            ``(g_0, ct_consts, ct_xs, flags)`` (``flags``: see :mod:`bppsa.scan._core.debug`).
        """
        return backward.span_backward(
            self.scan,
            problem.all_steps(),
            problem.layout,
            consts,
            check,
            carries_before,
            xs,
            g_last,
            ct_ys,
        )


def refuse_layers(method: Method, maps) -> None:
    """Raises for the list of maps of a chain of layers, which ``method`` does not scan."""
    if isinstance(maps, list | tuple):
        raise TypeError(
            f"{method!r} does not apply to a chain of layers; use bppsa.Auto(), "
            "bppsa.Blelloch(levels=...), bppsa.SequentialScan() (the sequential sparse chain) "
            "or bppsa.Sequential() (plain autodiff)."
        )


# -- accounting: functions registered beside each method (as lineax registers its structure
# queries beside each operator), so that a method's class says only what the method is.


@functools.singledispatch
def memory_of(method: Method, fp: Footprint) -> int:
    """Estimated peak bytes of a scan's forward and backward with ``method``."""
    raise TypeError(f"no memory estimate is registered for {type(method).__name__}.")


@memory_of.register
def _jacobian_memory(method: JacobianMethod, fp: Footprint) -> int:
    return fp.bytes(fp.residual_floats() + method.span_floats(fp, fp.length))


@functools.singledispatch
def span_floats_of(method: JacobianMethod, fp: Footprint, steps: int) -> float:
    """Floats per example of ``method``'s backward of ``steps`` steps evaluated at once."""
    raise TypeError(
        f"no span_floats is registered for {type(method).__name__}: register one with "
        "bppsa.scan._core.methods.base.span_floats_of, or define span_floats on the class."
    )


@functools.singledispatch
def cost_of(method: Method, fp: Footprint) -> Cost | None:
    """Predicted steps, arithmetic and bytes of ``method``'s backward (``None``: not modelled)."""
    return None
