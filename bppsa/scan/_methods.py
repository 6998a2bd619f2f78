"""Backward methods: which scan turns the per-step Jacobians into cotangents.

A method is an object (``Blelloch()``, ``Sequential()``); names are accepted as a convenience and
resolved in :func:`resolve` only. :func:`bppsa.grad` sets an ambient method for the scans traced
inside it; a method given to :func:`bppsa.scan` itself takes precedence.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
from collections.abc import Iterator
from typing import ClassVar

import jax
from jax import Array

from bppsa.scan import _algorithms
from bppsa.scan._chunked import chunked, default_chunks
from bppsa.scan._elements import Linear


class Method:
    """Base class of backward methods.

    Attributes:
        name: the string that :func:`resolve` maps to this method's default instance.
        uses_jacobians: False when the method is plain back-propagation through
            ``jax.lax.scan`` (every JAX transformation then works as on ``lax.scan``).
    """

    name: ClassVar[str]
    uses_jacobians: ClassVar[bool] = True

    def scan(self, g_last: Array, linear: Linear, offsets: Array | None) -> Array:
        """Returns ``[g_0, ..., g_T]`` (see :mod:`bppsa.scan._algorithms`; time order)."""
        raise NotImplementedError

    def block_size(self, length: int) -> int | None:
        """Steps per time block of the backward pass, or ``None`` for one block of all steps.

        With blocks, the per-step work that is parallel in t (Jacobians, parameter cotangents)
        runs block by block, from the last block back, so that its arrays stay in cache.
        """
        return None


@dataclasses.dataclass(frozen=True)
class Sequential(Method):
    """Sequential back-propagation: the reference.

    By default ``bppsa.scan`` then *is* ``jax.lax.scan`` and JAX differentiates it (forward and
    reverse mode, any order). With ``jacobians=True`` the backward instead runs the same
    Jacobian-based pipeline as the parallel methods with a sequential scan, which separates
    errors in the Jacobians from errors in a parallel scan.
    """

    jacobians: bool = False
    name: ClassVar[str] = "sequential"

    @property
    def uses_jacobians(self) -> bool:  # type: ignore[override]
        return self.jacobians

    def scan(self, g_last: Array, linear: Linear, offsets: Array | None) -> Array:
        return _algorithms.sequential(g_last, linear, offsets)


@dataclasses.dataclass(frozen=True)
class Blelloch(Method):
    """BPPSA's modified Blelloch scan: ``Theta(log T)`` levels (MLSys 2020, Wang et al.)."""

    name: ClassVar[str] = "blelloch"

    def scan(self, g_last: Array, linear: Linear, offsets: Array | None) -> Array:
        return _algorithms.blelloch(g_last, linear, offsets)


@dataclasses.dataclass(frozen=True)
class Chunked(Method):
    """Sequential inside ``chunks`` chunks, parallel across them, Blelloch between them.

    ``2 T / chunks + O(log chunks)`` dependent steps, each a large product (see
    :func:`bppsa.scan._chunked.chunked`): the paper's heterogeneous Blelloch scan for fewer
    workers than elements. ``chunks=None`` picks about ``sqrt(T / 2)``. ``block``: see
    :meth:`Method.block_size` (the chunks then split each block).
    """

    chunks: int | None = None
    block: int | None = None
    name: ClassVar[str] = "chunked"

    def __post_init__(self):
        for name in ("chunks", "block"):
            value = getattr(self, name)
            bad_type = isinstance(value, bool) or not isinstance(value, int)
            if value is not None and (bad_type or value < 1):
                raise ValueError(f"{name} must be a positive int or None, got {value!r}.")

    def block_size(self, length: int) -> int | None:
        return self.block

    def scan(self, g_last: Array, linear: Linear, offsets: Array | None) -> Array:
        chunks = default_chunks(len(linear)) if self.chunks is None else self.chunks
        return chunked(g_last, linear, offsets, chunks)


CPU_BLOCK = 1024  # steps per block on CPUs: a block's arrays then stay in cache


@dataclasses.dataclass(frozen=True)
class Auto(Method):
    """Chooses a method from the sequence length, the state size and the backend.

    :meth:`choose` says what it picks. On CPU it is ``Chunked(1)``: a sequential scan over
    the transposed Jacobians, whose steps are single matrix-vector products while the Jacobians
    and parameter gradients are computed in parallel outside the loop. With only a few cores,
    the parallel levels' extra ``~n``-fold matrix work does not pay for itself (measured with
    ``benchmarks/speed.py``). On accelerators it is ``Blelloch()`` (``Theta(log T)`` levels).
    """

    name: ClassVar[str] = "auto"

    def choose(self, length: int, size: int, backend: str | None = None) -> Method:
        """The method used for ``length`` steps of a state of ``size`` on ``backend``."""
        backend = jax.default_backend() if backend is None else backend
        if backend == "cpu":
            return Chunked(1, block=CPU_BLOCK)
        return Blelloch()

    def scan(self, g_last: Array, linear: Linear, offsets: Array | None) -> Array:
        method = self.choose(len(linear), g_last.shape[-1])
        return method.scan(g_last, linear, offsets)

    def block_size(self, length: int) -> int | None:
        return self.choose(length, 0).block_size(length)


METHODS: dict[str, type[Method]] = {cls.name: cls for cls in (Auto, Blelloch, Chunked, Sequential)}
DEFAULT = Auto()

_ambient: contextvars.ContextVar[Method | None] = contextvars.ContextVar(
    "bppsa_method", default=None
)


def resolve(method: Method | str | None, *, argname: str = "method") -> Method:
    """Turns a method object, a method name or ``None`` (the ambient/default) into a method.

    Raises:
        ValueError: for an unknown name, listing the valid ones.
        TypeError: for anything that is neither a method nor a string.
    """
    if method is None:
        ambient = _ambient.get()
        return DEFAULT if ambient is None else ambient
    if isinstance(method, Method):
        return method
    if isinstance(method, str):
        try:
            return METHODS[method.lower()]()
        except KeyError:
            valid = ", ".join(repr(name) for name in METHODS)
            raise ValueError(
                f"{argname}={method!r} is not a known backward method; expected one of "
                f"{valid}, or a method object such as bppsa.Blelloch()."
            ) from None
    raise TypeError(
        f"{argname} must be a method object (e.g. bppsa.Blelloch()) or one of "
        f"{', '.join(repr(name) for name in METHODS)}; got {type(method).__name__}."
    )


@contextlib.contextmanager
def ambient(method: Method | str) -> Iterator[Method]:
    """Within the block, ``bppsa.scan`` calls without their own method use ``method``."""
    token = _ambient.set(resolve(method))
    try:
        yield _ambient.get()
    finally:
        _ambient.reset(token)
