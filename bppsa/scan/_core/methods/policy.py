"""Policies: which method runs a scan or a chain of layers, within what memory, on what profile.

What a method *is* lives in its own file (its linear scan, memory and cost); which method runs
a given scan is a :class:`Policy`'s choice. A policy has three questions to answer:
:meth:`Policy.scan_method` (the method of a scan over time steps, within a memory limit),
:meth:`Policy.chain_method` (the method of a chain of layers) and :meth:`Policy.profile_or` (the
measured constants it chooses by, which the derivative rules pass down to the kernels). Each is
asked once per scan, by :func:`bppsa.scan._core.decision.decide`, with the profile resolved
there: a policy reads no global state.
``bppsa.Auto()`` is the library's policy; a method passed as ``method=`` is the policy
:class:`Fixed` that always answers with it, after the one check of what it supports
(:func:`~bppsa.scan._core.methods.base.require`) and the memory guard (:func:`guard`).
"""

from __future__ import annotations

import abc
import dataclasses
import math
from collections.abc import Callable
from typing import ClassVar

from bppsa.scan._core import memory
from bppsa.scan._core.memory import Footprint, MemoryLimitError, limit_message
from bppsa.scan._core.methods.base import Method, require
from bppsa.scan._core.methods.fallbacks import fallbacks
from bppsa.scan._core.methods.sequential import Sequential
from bppsa.scan._profile import Profile


@dataclasses.dataclass(frozen=True)
class ChainWork:
    """What a policy needs to choose a chain's backward: multiply-adds per example of the layers
    whose Jacobians pruning thins (convolutions and linear layers).

    Attributes:
        sparse: stored entries of their transposed Jacobians (the sequential sparse chain's
            multiply-adds per example).
        dense: the multiply-adds of their input gradients in JAX's dense back-propagation.
    """

    sparse: int
    dense: int


class Policy(abc.ABC):
    """Chooses the backward method of each scan and chain of layers.

    Policies are values (frozen dataclasses), like methods: they key ``jax.jit``'s cache.

    Attributes:
        name: the string :func:`bppsa.scan.resolve` maps to the default instance.
    """

    name: ClassVar[str | None] = None

    @abc.abstractmethod
    def scan_method(
        self,
        fp: Footprint,
        limit: float | None = math.inf,
        *,
        profile: Profile,
        jacobians: bool = False,
    ) -> Method:
        """The method that runs the backward of a scan of footprint ``fp`` within ``limit``
        bytes (``None``: the default device's memory, its capacity; ``math.inf``: no limit), by
        ``profile`` (:meth:`profile_or` of the backend's). The limit applies to every method,
        plain back-propagation too (its ``lax.scan``'s residuals), but to none for a complex
        carry, which only plain back-propagation supports.

        ``jacobians``: one that scans the Jacobians (never plain back-propagation), as a
        parallel forward's linear solves and the finiteness check need.

        Raises:
            MemoryLimitError: nothing the policy would run fits.
            TypeError: the scan needs what the method does not support (a complex carry).
        """

    @abc.abstractmethod
    def chain_method(self, work: Callable[[], ChainWork], *, profile: Profile) -> Method:
        """The method that back-propagates through a chain of layers (``Chain.apply``) by
        ``profile``; ``work()`` gives what it costs (computed only if asked for).

        Raises:
            TypeError: the method does not apply to a chain of layers.
        """

    def profile_or(self, backend_profile: Profile) -> Profile:
        """The measured constants this policy chooses by, passed down to the kernels of the
        backward it chooses: those of the backend (``backend_profile``)."""
        return backend_profile


@dataclasses.dataclass(frozen=True)
class Fixed(Policy):
    """The policy of a method given by the user: always that method, checked and guarded."""

    method: Method

    def scan_method(self, fp, limit=math.inf, *, profile, jacobians=False):
        if fp.complex_leaves:
            require(self.method, "complex_carry", leaves=fp.complex_leaves)
            if not self.method.keeps_carries:
                return self.method
        return guard(self.method, fp, limit, profile=profile)

    def chain_method(self, work, *, profile):
        require(self.method, "layers")
        return self.method


def as_policy(requested: Method | Policy) -> Policy:
    """The policy of what the user asked for: a policy itself, a method :class:`Fixed`."""
    return requested if isinstance(requested, Policy) else Fixed(requested)


def memory_guard(
    method: Method, need: int, limit: float | None, error: Callable[[float], MemoryLimitError]
) -> Method:
    """The one memory guard of every backward, over time steps and over layers: ``method``
    itself if its ``need`` bytes fit ``limit`` (``None``: the default device's available
    memory).

    Raises:
        MemoryLimitError: ``error(limit_bytes)``, where it does not fit (the error of the
            assembly, listing what does fit).
    """
    limit_bytes = bytes_allowed(limit)
    if need <= limit_bytes:
        return method
    raise error(limit_bytes)


def guard(
    method: Method, fp: Footprint, limit: float | None, requested=None, *, profile: Profile
) -> Method:
    """The memory guard of a backward over time steps (:func:`memory_guard`): ``method`` itself
    if its :meth:`~bppsa.scan._core.methods.base.Method.memory` for ``fp`` fits ``limit``.

    Raises:
        MemoryLimitError: it does not fit; the error lists the lower-memory methods that do
            (in blocks of ``profile``'s fallback block).
    """
    need = method.memory(fp)

    def error(limit_bytes):
        return memory_error(requested or method, method, need, limit, limit_bytes, fp, profile)

    return memory_guard(method, need, limit, error)


def bytes_allowed(limit: float | None) -> float:
    """The bytes a backward may use: ``limit``, or the default device's memory (a constant of
    the device, not what is free while the scan is traced)."""
    return memory.capacity_bytes() if limit is None else limit


def memory_error(requested, chosen, need, limit, limit_bytes, fp, profile) -> MemoryLimitError:
    """The error for a backward that does not fit, listing the lower-memory methods that do
    (and, for a policy's choice, where none does, the fallbacks it tried)."""
    candidates = fallbacks(profile)
    options = lower_memory(candidates, fp, need, limit_bytes)
    tried = [(m, m.memory(fp)) for m in candidates] if requested is not chosen else []
    message = limit_message(
        requested, chosen, need, limit, limit_bytes, options, fp, Sequential().memory(fp), tried
    )
    return MemoryLimitError(message, need, limit_bytes, options)


def lower_memory(candidates, fp: Footprint, need: int, limit_bytes: float) -> list:
    """``[(method, bytes)]`` of the ``candidates`` that need less than ``need`` and fit."""
    options: list[tuple[Method, int]] = []
    for candidate in candidates:
        bytes_ = candidate.memory(fp)
        if bytes_ < need and bytes_ <= limit_bytes and candidate not in (c for c, _ in options):
            options.append((candidate, bytes_))
    return options
