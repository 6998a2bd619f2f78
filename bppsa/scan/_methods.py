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


CPU_BLOCK = 1024  # steps per block of the lower-memory fallbacks (see bppsa._memory)

# Auto() on CPUs, in Jacobian floats per step summed over the vmapped batch ("work"). Blocks of
# about CPU_BLOCK_WORK / work steps (a power of two within CPU_BLOCK_STEPS) keep a block's
# arrays in cache; above CPU_PARALLEL_WORK back-propagation itself is faster. Measured with
# benchmarks/speed.py on a 2-core CPU at T = 1000: the RNN (20 floats per step) still wins at
# B = 64 (1.25x) and loses at B = 128; the GRU (80 floats per step) wins at B = 8 (1.07x) and
# loses from B = 16 on (0.75x).
CPU_BLOCK_WORK = 2**19
CPU_BLOCK_STEPS = (64, 1024)
CPU_PARALLEL_WORK = 1024


@dataclasses.dataclass(frozen=True)
class Auto(Method):
    """Chooses a method from the sequence length, the Jacobian and batch sizes, and the backend.

    :meth:`choose` says what it picks. On accelerators it is ``Blelloch()`` (``Theta(log T)``
    levels). On CPUs, with only a few cores, the parallel levels' extra ``~n``-fold matrix work
    does not pay for itself (measured with ``benchmarks/speed.py``); there it is
    ``Chunked(1, block=K)``: a sequential scan over the transposed Jacobians, whose steps are
    single matrix-vector products, while the Jacobians and parameter gradients are computed for
    a block of ``K`` steps at once (``K`` chosen so that the block's arrays stay in cache); and
    where even that loses, for large batches, plain back-propagation (``Sequential()``).
    """

    name: ClassVar[str] = "auto"

    def choose(
        self,
        length: int,
        size: int,
        backend: str | None = None,
        *,
        batch: int = 1,
        element: int | None = None,
    ) -> Method:
        """The method used for a scan.

        Args:
            length: number of steps ``T``.
            size: floats of the differentiable carry of one example (``n``).
            backend: ``"cpu"``, ``"gpu"``, ... (default: JAX's default backend).
            batch: examples served at once through ``jax.vmap``.
            element: floats of one step's transposed Jacobian as stored (e.g. ``n`` for the
                RNN's ``W^T diag(d)``, ``4n`` for the GRU's); default ``n * n`` (dense).

        Returns:
            A concrete method; ``Sequential()`` means plain back-propagation.
        """
        if _on_cpu(backend) and batch * _element(size, element) > CPU_PARALLEL_WORK:
            return Sequential()
        return self.parallel(length, size, backend, batch=batch, element=element)

    def parallel(
        self,
        length: int,
        size: int,
        backend: str | None = None,
        *,
        batch: int = 1,
        element: int | None = None,
    ) -> Method:
        """The method :meth:`choose` would use with the Jacobians (never ``Sequential()``)."""
        if not _on_cpu(backend):
            return Blelloch()
        work = max(batch * _element(size, element), 1)
        low, high = CPU_BLOCK_STEPS
        block = min(max(1 << (max(CPU_BLOCK_WORK // work, 1).bit_length() - 1), low), high)
        return Chunked(1, block=block)

    def scan(self, g_last: Array, linear: Linear, offsets: Array | None) -> Array:
        method = self.parallel(len(linear), g_last.shape[-1])
        return method.scan(g_last, linear, offsets)

    def block_size(self, length: int) -> int | None:
        return self.parallel(length, 0, element=1).block_size(length)


def _on_cpu(backend: str | None) -> bool:
    return (jax.default_backend() if backend is None else backend) == "cpu"


def _element(size: int, element: int | None) -> int:
    return size * size if element is None else element


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
