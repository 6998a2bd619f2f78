"""One decision per scan: every choice a scan's derivatives depend on, made once, as one value.

A :class:`Decision` holds the backward method, the forward (with Newton's solver), the profile
those were chosen by, the precision of the library's products and the kernels' switches (the
profile's). :func:`decide` makes it for a scan over time steps and :func:`decide_chain` for a
chain of layers, when the scan is traced, from explicit inputs only: the scan's footprint, its
:class:`~bppsa.scan._core.options.Options` (method or policy, memory limit, forward, precision,
checks) and the profile of the default backend, resolved here once
(:func:`bppsa.scan._core.profiles.profile_of`: :func:`bppsa.set_profile`'s profiles are part of
``jax.jit``'s cache key). The policy is consulted once for the backward; the forward's policy
(:class:`~bppsa.scan._core.auto_forward.AutoForward`) takes the backward's method as Newton's
solver. The derivative rules (:mod:`bppsa.scan._core.vjp`, :mod:`bppsa.scan._core.layer_scan`)
and the plan record (:func:`bppsa.trace_plans`) consume the decision; nothing below it chooses
again.

A backward that does not fit the memory limit is not an error of the forward: the decision keeps
the :class:`~bppsa.scan._core.memory.MemoryLimitError` and raises it where the backward is
traced (:meth:`Decision.backward_method`). So does a backward that cannot apply the step's
``jax.custom_vjp`` rules exactly (:mod:`bppsa.scan._core.jaxprs.rules`): unless the user declares
them linear in the cotangent (``linear_vjp=True``), a scan whose carry reaches one back-propagates
where a policy chooses, and an explicit method that forms Jacobians is refused. An explicit
request that runs by another, exact route (a fused kernel that cannot run the step) warns here,
once per trace, with the reason (:class:`~bppsa.scan._core.fallback.FallbackWarning`); the
policies' own choices do not.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from bppsa.scan import _kernels
from bppsa.scan._core import cost, fallback
from bppsa.scan._core.auto_forward import AutoForward
from bppsa.scan._core.forward import Forward, SequentialForward
from bppsa.scan._core.memory import MemoryLimitError
from bppsa.scan._core.methods import Auto, Method, Policy, Sequential, as_policy
from bppsa.scan._core.methods.auto import checked_footprint
from bppsa.scan._core.methods.base import because
from bppsa.scan._core.methods.policy import ChainWork, bytes_allowed, guard
from bppsa.scan._core.methods.sequential_scan import SequentialScan
from bppsa.scan._core.options import Options
from bppsa.scan._core.profiles import profile_of
from bppsa.scan._precision import Precision
from bppsa.scan._profile import Kernels, Profile

if TYPE_CHECKING:
    from bppsa.scan._core.problem import Problem

SEQUENTIAL = SequentialForward()


@dataclasses.dataclass(frozen=True, eq=False)
class Decision:
    """What a scan runs, decided once (see :mod:`bppsa.scan._core.decision`).

    Attributes:
        requested: the method or policy the scan was asked for.
        method: the policy's method for this scan (``Sequential()``: plain back-propagation).
        backward: the method that runs the backward (``method``, or the sequential scan over
            the Jacobians where plain back-propagation meets a forward other than
            ``lax.scan``); ``None`` where it does not fit the memory limit (``memory_error``).
        forward: the forward pass (Newton with its solver picked).
        forward_because: why, where the forward's policy chose it (``None``: asked for), or
            why the fused forward asked for cannot run (the envelope: the profile's).
        shares_jacobians: whether the forward hands its Jacobians to the backward.
        profile: the measured constants the choices were made by.
        precision: of the library's own products (``None``: ``"highest"``).
        memory_limit: bytes the backward may use (``None``: the default device's memory, its
            capacity).
        check_finite: whether the backward reports the first non-finite step.
        memory_error: the memory guard's error, or the refusal of a method that cannot apply
            the step's ``jax.custom_vjp`` rules exactly, raised where the backward is traced.
        backward_because: why the backward's kernel (``FusedSequential()``'s reverse loop,
            alone or in ``Blocked``) does not run the scan (its ``prepare`` on the profile;
            ``None``: it does, or the backward has no kernel).
        forward_prepared, backward_prepared: what the forward's and the backward's
            ``prepare`` made for this scan (a kernel's plan; ``None``: nothing), handed to
            them when they run: nothing is planned again.
    """

    requested: Method | Policy
    method: Method
    backward: Method | None
    forward: Forward
    forward_because: str | None
    shares_jacobians: bool
    profile: Profile
    precision: Precision | None
    memory_limit: float | None
    check_finite: bool
    memory_error: MemoryLimitError | ValueError | None = None
    backward_because: str | None = None
    forward_prepared: Any = None
    backward_prepared: Any = None

    @property
    def kernels(self) -> Kernels:
        """The element kernels' switches (the profile's)."""
        return self.profile.kernels

    @property
    def plain(self) -> bool:
        """Whether the scan is ``lax.scan`` itself, differentiated by JAX (not where its
        backward does not fit the memory limit: the library's derivative rules raise it)."""
        return (
            not self.method.keeps_carries and self.forward.sequential and self.memory_error is None
        )

    def backward_method(self) -> Method:
        """The backward's method.

        Raises:
            MemoryLimitError: it does not fit the scan's memory limit.
            ValueError: it cannot apply the step's ``jax.custom_vjp`` rules exactly.
        """
        if self.backward is None:
            assert self.memory_error is not None
            raise self.memory_error
        return self.backward

    def run_forward(self, problem: Problem, consts, init, xs, *, keep: bool):
        """The forward, with what it prepared (see :class:`~bppsa.scan._core.forward.Forward`;
        ``prepared`` is passed only where it prepared something, so a user's forward without
        the argument runs as it did)."""
        given = {} if self.forward_prepared is None else {"prepared": self.forward_prepared}
        return self.forward(problem, consts, init, xs, keep=keep, **given)

    @contextlib.contextmanager
    def library(self) -> Iterator[None]:
        """The context of the library's own work for this scan: its products' precision and
        the kernels' switches (:func:`bppsa.scan._kernels.library`), the one place where
        the derivative rules enter them."""
        with _kernels.library(self.precision, self.kernels):
            yield


def _asked(options: Options) -> tuple[Method | Policy, Policy, Profile]:
    """What was asked for (``Auto()`` unless given), its policy, and the profile it chooses by
    (its own, else the default backend's, resolved here once)."""
    requested = options.method or Auto()
    policy = as_policy(requested)
    return requested, policy, policy.profile_or(profile_of())


def decide(problem: Problem, options: Options) -> Decision:
    """The decision for the scan ``problem`` with ``options`` (its own over the enclosing
    :func:`bppsa.grad`'s): the policy's method within the memory limit, the forward, whether
    the forward's Jacobians go to the backward, and what the forward and the backward prepared
    (each method's and forward's ``prepare``, called at most once per scan)."""
    requested, policy, profile = _asked(options)
    prepare = _Preparations(problem, profile)
    opaque = () if options.linear_vjp else problem.opaque_rules
    if opaque and isinstance(requested, Policy):  # back-propagation applies any rule exactly
        policy = as_policy(Sequential())
    fp, limit = checked_footprint(problem, profile, prepare), options.memory_limit
    # The choices a method or forward leaves to the scan, by the scan's policy (Auto() where a
    # method was asked for): Sharded()'s local method, Newton's solver.
    chooser = requested if isinstance(requested, Policy) else Auto()
    if not isinstance(requested, Policy):
        policy = as_policy(requested.resolved(fp, chooser, profile))
    check_finite = bool(options.check_finite)
    error: MemoryLimitError | ValueError | None = None
    backward: Method | None
    try:
        method = backward = policy.scan_method(fp, limit, profile=profile, jacobians=check_finite)
    except MemoryLimitError as err:  # the forward runs; the backward's trace raises
        method = policy.scan_method(fp, math.inf, profile=profile, jacobians=check_finite)
        backward, error = None, err
    asked = options.forward or AutoForward()
    forward_because = None
    forward: Forward
    if isinstance(asked, AutoForward) and opaque:
        forward, forward_because = SEQUENTIAL, f"{_rules_of(opaque)}: back-propagation"
    elif isinstance(asked, AutoForward):
        solver = backward if backward is not None and backward.keeps_carries else None
        made = None if profile.measured_rules else prepare(asked.kernel)
        # the static estimate of a step of the fused forward's loop, its plan's program's
        step = None if made is None or isinstance(made, str) else made.step_latency
        fused_because = because(made)
        if fused_because is None and made is not None:  # planned: priced by its own estimate
            fused_because = cost.unpriced(profile, step)
        forward, forward_because = asked.forward_for(
            dataclasses.replace(fp, fused_forward_step=step), method, solver, profile, fused_because
        )
    else:
        forward = asked.resolved(problem, fp, chooser, profile)
        reason = prepare(forward)
        if isinstance(reason, str):  # its kernel cannot run the scan: lax.scan runs it
            forward_because = f"the {forward.name} kernel: {reason}"
            fallback.warn(f"forward={asked!r}", "lax.scan", forward_because)
            forward = SEQUENTIAL
    if not method.keeps_carries and not forward.sequential:
        # lax.scan's own derivatives need lax.scan's forward: back-propagate through the other
        # forward's trajectory with the sequential scan over the Jacobians instead.
        try:
            backward, error = guard(SequentialScan(), fp, limit, profile=profile), None
        except MemoryLimitError as err:
            backward, error = None, err
    if opaque and (method.keeps_carries or not forward.sequential):
        backward, error = None, _refusal(opaque, method, options.forward)
    shares = (
        backward is not None
        and forward.shares_jacobians(problem)
        and backward.supports.forward_jacobians
        and backward.memory(fp) + fp.bytes(fp.length * fp.element) <= bytes_allowed(limit)
    )
    backward_prepared = None if backward is None else prepare(backward)
    backward_because = None
    if (reason := because(backward_prepared)) is not None:
        backward_because = f"the fused kernel: {reason}"
        if not isinstance(requested, Policy):  # asked for, not Auto()'s choice
            fallback.warn(f"method={requested!r}", "its loop outside the kernel", backward_because)
    return Decision(
        requested=requested,
        method=method,
        backward=backward,
        forward=forward,
        forward_because=forward_because,
        shares_jacobians=shares,
        profile=profile,
        precision=options.precision,
        memory_limit=limit,
        check_finite=check_finite,
        memory_error=error,
        backward_because=backward_because,
        forward_prepared=None if forward.sequential else prepare(forward),
        backward_prepared=backward_prepared,
    )


class _Preparations:
    """``prepare(method_or_forward)``: its ``prepare(problem, profile)``, made at most once
    for one decision (a policy's check of a kernel and the run of the one it picks share it)."""

    def __init__(self, problem: Problem, profile: Profile):
        self.problem, self.profile = problem, profile
        self.made: dict[Method | Forward, Any] = {}

    def __call__(self, what: Method | Forward) -> Any:
        if what not in self.made:
            self.made[what] = what.prepare(self.problem, self.profile)
        return self.made[what]


def _rules_of(opaque: tuple[str, ...]) -> str:
    return (
        "the step's jax.custom_vjp function"
        + ("s " if len(opaque) > 1 else " ")
        + (", ".join(opaque))
    )


def _refusal(opaque: tuple[str, ...], method: Method, forward) -> ValueError:
    """The error of a backward that would form the Jacobians of a step whose carry reaches
    ``jax.custom_vjp`` functions (``opaque``) not declared linear."""
    how = (
        f"method={method!r} forms"
        if method.keeps_carries
        else f"with forward={forward!r}, the backward forms"
    )
    return ValueError(
        f"bppsa.scan: {_rules_of(opaque)} may have a backward that is not linear in its "
        f"cotangent (JAX calls it, nothing reads it), and {how} the step's Jacobians from it "
        "(columns of jax.vjp), which is exact only for a linear one. Back-propagation applies "
        "any rule exactly: method=bppsa.Sequential() with the sequential forward, what "
        "bppsa.Auto() runs for such a step. If the backward is linear in the cotangent (a "
        "straight-through estimator, a scaled or negated gradient), say so with "
        "linear_vjp=True (on bppsa.scan or bppsa.grad) and any method runs it."
    )


def decide_chain(work: Callable[[], ChainWork], options: Options) -> Decision:
    """The decision for a chain of layers (``Chain.apply``): the policy's method for the
    chain's ``work`` (its forward is the layers' own; the chain's memory guard, which needs
    the layers' maps, runs where the backward is traced)."""
    requested, policy, profile = _asked(options)
    method = policy.chain_method(work, profile=profile)
    return Decision(
        requested=requested,
        method=method,
        backward=method,
        forward=SEQUENTIAL,
        forward_because=None,
        shares_jacobians=False,
        profile=profile,
        precision=options.precision,
        memory_limit=options.memory_limit,
        check_finite=bool(options.check_finite),
    )
