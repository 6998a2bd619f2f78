"""The element kernels' switches in force, and the context that sets them.

The kernels (:class:`~bppsa.scan.Structured`'s application and unrolling, the SpMV of
:class:`~bppsa.scan.Sparse`, the SpGEMM plans of :mod:`bppsa.scan._spgemm`) choose among
their variants by a :class:`~bppsa.scan._profile.Kernels`. They never read a backend's profile
while they are traced: the switches reach them through :func:`using`, a context entered in one
place, :meth:`bppsa.scan._core.decision.Decision.library`, by the scan's derivative rules, with
the ``kernels`` of the profile the scan's decision was made by, together with the precision of
:func:`bppsa.scan._precision.products` (:func:`library`). That profile is part of what keys
``jax.jit``'s cache (the policy's own, or the backend's: :func:`bppsa.set_profile` keeps them in
``jax.jit``'s key). Outside any such context (the scan algorithms or the elements called
directly) the kernels run with the built-in defaults, ``Kernels()``.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator

from bppsa.scan import _precision
from bppsa.scan._profile import Kernels

DEFAULT = Kernels()

_current: contextvars.ContextVar[Kernels] = contextvars.ContextVar("bppsa_kernels", default=DEFAULT)


def current() -> Kernels:
    """The kernels' switches for what is traced now."""
    return _current.get()


@contextlib.contextmanager
def using(kernels: Kernels | None) -> Iterator[None]:
    """Within the block, the kernels run with ``kernels`` (``None``: the defaults).

    Raises:
        TypeError: ``kernels`` is neither a :class:`~bppsa.scan._profile.Kernels` nor ``None``.
    """
    if kernels is not None and not isinstance(kernels, Kernels):
        raise TypeError(f"kernels must be a bppsa.Kernels or None, got {type(kernels).__name__}.")
    token = _current.set(DEFAULT if kernels is None else kernels)
    try:
        yield
    finally:
        _current.reset(token)


@contextlib.contextmanager
def library(precision, kernels: Kernels | None) -> Iterator[None]:
    """The context of the library's own work in a derivative rule: its products at
    ``precision`` (:func:`bppsa.scan._precision.products`) and the kernels with ``kernels``."""
    with _precision.products(precision), using(kernels):
        yield
