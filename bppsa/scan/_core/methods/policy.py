"""Policy: which concrete method runs a scan within a memory limit, and the guard's error.

What a method *is* lives in its own file (its linear scan); what runs for a given scan and
memory limit is decided here. :func:`fit` is a ``functools.singledispatch`` function: a policy
(``Auto``) registers its own rule beside its class, as a new structure query in lineax does.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable

from bppsa.scan._core import memory
from bppsa.scan._core.memory import Footprint, MemoryLimitError, limit_message
from bppsa.scan._core.methods.base import Method
from bppsa.scan._core.methods.fallbacks import fallbacks
from bppsa.scan._core.methods.sequential import Sequential


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


@functools.singledispatch
def for_chain(method: Method, work: Callable[[], ChainWork]) -> Method:
    """The method that back-propagates through a chain of layers (``Chain.apply``) for the
    requested ``method``: that method itself (a policy such as ``Auto`` registers its own rule,
    which may weigh the chain's ``work()``)."""
    return method


@functools.singledispatch
def checking(method: Method, problem) -> Method:
    """The concrete method of a scan whose backward checks for non-finite values
    (``check_finite``): ``method.concrete(problem)`` (a policy registers a rule that keeps to
    the Jacobian backward, which holds the check)."""
    return method.concrete(problem)


@functools.singledispatch
def fit(method: Method, fp, limit: float | None, backend: str | None = None) -> Method:
    """The memory guard of every backward: the method that runs the backward of a scan of
    footprint ``fp`` (over time steps, a :class:`~bppsa.scan._core.memory.Footprint`; over
    layers, the chain's) within ``limit`` bytes (``None``: the default device's available
    memory): ``method`` itself, if it fits.

    Raises:
        MemoryLimitError: it does not fit; the error lists lower-memory methods that do.
    """
    need, limit_bytes = bytes_needed(fp, method), bytes_allowed(limit)
    if need <= limit_bytes:
        return method
    raise over_limit(fp, method, method, need, limit, limit_bytes)


def bytes_allowed(limit: float | None) -> float:
    """The bytes a backward may use: ``limit``, or the default device's available memory."""
    return memory.available_bytes() if limit is None else limit


@functools.singledispatch
def bytes_needed(fp: Footprint, method: Method) -> int:
    """Estimated peak bytes of ``method``'s forward and backward on a scan of footprint ``fp``
    (a kind of footprint registers its own accounting, as the chain of layers does)."""
    return method.memory(fp)


@functools.singledispatch
def over_limit(fp: Footprint, requested, chosen, need, limit, limit_bytes) -> MemoryLimitError:
    """The guard's error for a scan of footprint ``fp`` (registered per kind of footprint)."""
    return memory_error(requested, chosen, need, limit, limit_bytes, fp)


def memory_error(requested, chosen, need, limit, limit_bytes, fp) -> MemoryLimitError:
    """The error for a backward that does not fit, listing the lower-memory methods that do."""
    options = lower_memory(fallbacks(), fp, need, limit_bytes)
    message = limit_message(
        requested, chosen, need, limit, limit_bytes, options, fp, Sequential().memory(fp)
    )
    return MemoryLimitError(message, need, limit_bytes, options)


def lower_memory(candidates, fp: Footprint, need: int, limit_bytes: float) -> list:
    """``[(method, bytes)]`` of the ``candidates`` that need less than ``need`` and fit."""
    options = []
    for candidate in candidates:
        bytes_ = candidate.memory(fp)
        if bytes_ < need and bytes_ <= limit_bytes and candidate not in (c for c, _ in options):
            options.append((candidate, bytes_))
    return options
