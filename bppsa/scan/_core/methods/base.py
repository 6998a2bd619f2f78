"""The method interface: a backward method is its linear scan, its memory and its cost.

One abstract base, in the spirit of lineax's solvers and diffrax's adjoints: three abstract
methods (:meth:`Method.scan`, :meth:`Method.memory`, :meth:`Method.cost`), one optional
override of the backward for methods that do not evaluate all steps at once (``Blocked``,
``Sharded``), and declarations: a ``name``, whether it scans Jacobians at all
(``keeps_carries``: only plain back-propagation does not) and what it supports
(:class:`Supports`), checked in one place (:func:`require`) before anything is traced. Which
method runs a given scan is a policy's choice (:mod:`bppsa.scan._core.methods.policy`), not a
method's.
"""

from __future__ import annotations

import abc
import dataclasses
import functools
from typing import TYPE_CHECKING, Any, ClassVar

from jax import Array

from bppsa.scan._core import backward
from bppsa.scan._core.cost import Cost
from bppsa.scan._core.memory import Footprint
from bppsa.scan._elements import MapStack

if TYPE_CHECKING:
    from bppsa.scan._core.problem import Problem
    from bppsa.scan._profile import Profile


@dataclasses.dataclass(frozen=True)
class Supports:
    """What a method can back-propagate besides a scan over time of a real carry.

    Attributes:
        layers: a chain of layers (``Chain.apply``): :meth:`Method.scan` then gets a list of
            maps that differ in shape, and ``offsets=None``.
        complex_carry: a carry with complex leaves (only plain back-propagation: the Jacobian
            methods' maps are real).
        tangents: forward mode (``jax.jvp``): the tangent recurrence solved by the method's scan
            forward in time (:meth:`Method.forward_scan`).
        whole_batch: a ``jax.vmap`` batch as an axis of the arrays of one backward (maps and
            cotangents with a batch axis after the step axis), rather than example by example.
        forward_jacobians: the Jacobians of all steps from the forward (``jacobians=`` of
            :meth:`Method.backward`: the Newton forward's last evaluation has them), instead of
            forming them again. Methods that back-propagate a part of the steps at a time to
            bound their memory (``Blocked``, ``Sharded``) form their own.
    """

    layers: bool = False
    complex_carry: bool = False
    tangents: bool = True
    whole_batch: bool = True
    forward_jacobians: bool = True


WHAT = {
    "layers": "a chain of layers",
    "complex_carry": "a carry with complex leaves",
    "tangents": "forward mode (jax.jvp, jax.jacfwd, jax.linearize)",
    "whole_batch": "a whole vmapped batch at once",
    "forward_jacobians": "the Jacobians a forward formed (it forms its own, a part at a time)",
}


class Method(abc.ABC):
    """A backward method: its linear scan over the steps' transposed Jacobians, its memory and
    its cost.

    Methods are values: hashable and compared by their settings (frozen dataclasses), since the
    options of :func:`bppsa.grad` that hold them key ``jax.jit``'s cache.

    Attributes:
        name: the string :func:`bppsa.scan.resolve` maps to the class's default instance.
        keeps_carries: whether the backward is the library's, over the carries the forward
            kept; False for plain back-propagation through ``lax.scan`` (every JAX
            transformation then works as on ``lax.scan``), the one method that is special.
        forms_jacobians: whether the backward forms the steps' Jacobians (from the step's
            VJP) and scans them: not plain back-propagation, nor the fused reverse loop over
            the step's VJP (``FusedSequential()``).
        kernel_loop: whether its loop runs in a kernel where its plan (:meth:`prepare`) says
            the kernel runs the scan, and in ``lax.scan`` elsewhere: its cost is its kernel's
            only where it runs, so the cost model ranks it only there.
        supports: what it can back-propagate (:class:`Supports`; checked by :func:`require`).
    """

    name: ClassVar[str | None] = None
    keeps_carries: ClassVar[bool] = True
    forms_jacobians: ClassVar[bool] = True
    kernel_loop: ClassVar[bool] = False
    supports: ClassVar[Supports] = Supports()

    def resolved(self, fp: Footprint, policy: Any, profile: Profile) -> Method:
        """This method with the choices it leaves to the scan made by the scan's ``policy``
        on ``profile`` (``Sharded()``'s local method); most methods leave none."""
        return self

    def prepare(self, problem: Problem, profile: Profile | None = None) -> Any:
        """What this method prepares for ``problem``'s backward on ``profile`` (a kernel's
        plan), made once by the scan's decision and handed to :meth:`backward` as
        ``prepared``; a string: why its kernel cannot run the scan (it then runs another
        exact route). ``None``: nothing to prepare (most methods)."""
        return None

    @abc.abstractmethod
    def scan(self, g_last: Array, maps: MapStack | list[MapStack], offsets: Array | None):
        """Returns ``[g_0, ..., g_T]`` (see :mod:`bppsa.scan._algorithms`; time order).

        ``maps`` is a stack of the steps' maps (a scan over time), or, for a method that
        supports layers, a list of maps that differ in shape (a chain of layers; then
        ``offsets`` is ``None`` and the result a list).
        """

    @abc.abstractmethod
    def memory(self, fp: Footprint) -> int:
        """Estimated peak bytes of a scan's forward and backward with this method (a method
        that evaluates all steps at once: ``fp.span_bytes(extra)``, ``extra`` the floats per
        example its scan forms; :mod:`bppsa.scan._core.memory`)."""

    @abc.abstractmethod
    def cost(self, fp: Footprint) -> Cost:
        """Predicted dependent steps, arithmetic and bytes of the backward of a scan of
        footprint ``fp`` (:mod:`bppsa.scan._core.cost`)."""

    def backward(
        self,
        problem: Problem,
        consts,
        carries_before,
        xs,
        g_last: Array,
        ct_ys,
        *,
        check: bool,
        jacobians: MapStack | None = None,
        prepared: Any = None,
    ) -> tuple[Array, Any, Any, Array | None]:
        """Back-propagates ``g_last`` through all steps of ``problem``: evaluates all steps at
        once (their Jacobians and VJP), scans, and takes the VJP
        (:func:`bppsa.scan._core.backward.span_backward`). Overridden by methods that run it
        otherwise (in time blocks, across devices).

        ``jacobians``: the steps' transposed Jacobians at ``carries_before``, where the forward
        has them (only given to a method whose ``supports.forward_jacobians``); the evaluation
        then forms no Jacobians. ``prepared``: what :meth:`prepare` made for the scan.

        Returns:
            ``(g_0, ct_consts, ct_xs, flags)`` (``flags``: see :mod:`bppsa.scan._core.debug`).
        """
        return backward.span_backward(
            self.scan,
            problem.all_steps(jacobians=jacobians is None),
            problem.layout,
            consts,
            check,
            carries_before,
            xs,
            g_last,
            ct_ys,
            jacobians,
        )

    def forward_scan(self, h_first: Array, jac_t: MapStack, offsets: Array) -> Array:
        """The linear recurrence forward in time, ``h_{t+1} = J_t h_t + offsets[t]``, by this
        method's scan: returns ``[h_0, ..., h_T]`` from ``h_0 = h_first`` and the transposed
        Jacobians ``jac_t`` (time order; ``J_t`` is their transpose).

        A forward recurrence is the backward one with time reversed: :meth:`scan` over the
        transposed maps from the last step to the first, with ``h_0`` in place of ``g_T``.
        """
        return self.scan(h_first, jac_t.transpose().flip(), offsets[::-1])[::-1]


def because(prepared: Any) -> str | None:
    """Why the kernel a :meth:`Method.prepare` (or a forward's) planned does not run the scan:
    its reason string, or its plan's ``reason`` (``None``: it runs, or nothing was planned)."""
    if prepared is None or isinstance(prepared, str):
        return prepared
    return getattr(prepared, "reason", None)


@functools.singledispatch
def chain_levels(method: Method) -> int | None:
    """The parallel up-sweep levels ``method``'s scan over a chain of layers forms (``None``: all
    of them; ``0``: none), by which the memory guard of a chain counts the products formed: a
    query of the chain capability (``supports.layers``), registered beside each method that has
    it (:class:`~bppsa.scan._core.methods.blelloch.Blelloch`,
    :class:`~bppsa.scan._core.methods.sequential_scan.SequentialScan`)."""
    return None


def require(method: Method, feature: str, *, leaves=()) -> None:
    """The one check of what a method supports (``feature``: a field of :class:`Supports`),
    made before anything is traced (``leaves``: a complex carry's complex leaves, as
    ``"complex64[3]"``).

    Raises:
        TypeError: ``method`` does not support ``feature``, naming it and what does.
    """
    if getattr(method.supports, feature):
        return
    if feature == "complex_carry":
        kinds = ", ".join(leaves)
        raise TypeError(
            f"bppsa.scan: the carry has complex leaves ({kinds}), which the backward method "
            f"{method!r} does not support (its Jacobians are real); use method='sequential' "
            "(plain jax.lax.scan), or carry the real and imaginary parts as separate leaves."
        )
    if feature == "layers":
        raise TypeError(
            f"{method!r} does not apply to a chain of layers; use bppsa.Auto(), "
            "bppsa.Blelloch(levels=...), bppsa.SequentialScan() (the sequential sparse chain) "
            "or bppsa.Sequential() (plain autodiff)."
        )
    raise TypeError(
        f"bppsa.scan: {method!r} does not support {WHAT[feature]}; use bppsa.Blelloch(), "
        "bppsa.Chunked() or bppsa.Sequential()."
    )
