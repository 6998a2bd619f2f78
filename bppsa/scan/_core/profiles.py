"""Which profile a backend has: the built-in one, or the one :func:`set_profile` gave.

The profiles :func:`set_profile` gives are kept in a JAX configuration state that is part of
``jax.jit``'s cache key (:mod:`bppsa.scan._core.tracing`), not in a module-level table: a scan
resolves its profile once, when it is traced (:func:`profile_of`, from
:mod:`bppsa.scan._core.decision`), and a new profile reaches the next call of a function that
was jitted before, which is traced again.
"""

from __future__ import annotations

import jax

from bppsa.scan._core import tracing
from bppsa.scan._profile import Profile, built_in


def profile_of(backend: str | None = None) -> Profile:
    """The profile of ``backend`` (default: JAX's default backend) in force now."""
    backend = backend or jax.default_backend()
    for given, profile in tracing.profile_overrides():
        if given == backend:
            return profile
    return built_in(backend)


def get_profile(backend: str | None = None) -> Profile:
    """The profile of ``backend`` (``"cpu"``, ``"gpu"``, ...; default: JAX's default backend):
    the one :func:`set_profile` gave, else the built-in one (:data:`bppsa.scan._profile.GPU`
    for any accelerator).
    """
    return profile_of(backend)


def set_profile(backend: str, profile: Profile | None) -> None:
    """Makes ``profile`` the profile of ``backend`` (``None``: back to the built-in one), from
    the next call on: of a function jitted before too (the profiles are part of ``jax.jit``'s
    cache key, as ``jax.config``'s settings are).

    Example:
        >>> import dataclasses
        >>> cpu = bppsa.get_profile("cpu")
        >>> slow = dataclasses.replace(cpu, rules=dataclasses.replace(cpu.rules, parallel_work=0))
        >>> bppsa.set_profile("cpu", slow)
        >>> bppsa.set_profile("cpu", None)

    Raises:
        TypeError: ``profile`` is not a :class:`Profile`, or ``backend`` not a string.
    """
    if not isinstance(backend, str):
        raise TypeError(f"backend must be a string such as 'cpu', got {type(backend).__name__}.")
    if profile is not None and not isinstance(profile, Profile):
        raise TypeError(f"profile must be a bppsa.Profile, got {type(profile).__name__}.")
    given = {b: p for b, p in tracing.profile_overrides() if b != backend}
    if profile is not None:
        given[backend] = profile
    tracing.set_profile_overrides(tuple(sorted(given.items(), key=lambda item: item[0])))
