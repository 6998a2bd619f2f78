"""Which profile a platform has: the built-in one, or the one :func:`set_profile` gave.

The profiles :func:`set_profile` gives are kept in a JAX configuration state that is part of
``jax.jit``'s cache key (:mod:`bppsa.scan._core.tracing`), not in a module-level table: a scan
resolves its profile once, when it is traced (:func:`profile_of`, from
:mod:`bppsa.scan._core.decision`), for the platform it is traced for (:func:`platform_now`),
and a new profile reaches the next call of a function that was jitted before, which is traced
again.
"""

from __future__ import annotations

import jax
from jax.extend import backend as jax_backend

from bppsa.scan._core import tracing
from bppsa.scan._profile import Profile, built_in

# JAX's platforms behind its alias "gpu", named in their client's platform_version.
GPU_PLATFORMS = ("cuda", "rocm", "oneapi")


def platform_now() -> str:
    """The platform what is traced now is placed on, as far as JAX says while tracing.

    In this order: the device of the abstract mesh in force (``jax.set_mesh``,
    ``jax.sharding.use_abstract_mesh``, inside ``jax.shard_map``), else
    ``jax.config.jax_default_device`` (``jax.default_device(...)``: a device or a platform's
    name), else JAX's default backend (``jax.default_backend()``). All three key ``jax.jit``'s
    cache: the abstract mesh and the default device are configuration states in its key
    (``include_in_jit_key`` in ``jax._src.config``), and the default backend is fixed once
    JAX has started; so a function traced for one platform is traced again for another.

    JAX does not say, while tracing, the platform of ``jax.jit(..., backend=...)``, of the
    arguments' devices (they are tracers), nor of ``lower(lowering_platforms=...)`` and
    ``jax.export``'s platforms: such a scan is traced by the default device's profile (the
    default backend's).

    GPUs are named by their toolkit, ``"cuda"`` or ``"rocm"`` (JAX's devices say ``"gpu"`` for
    both on most builds): by their client's ``platform_version``, as JAX's own tests tell them
    apart (``jax._src.test_util.is_device_rocm``). A GPU whose toolkit is not named there
    stays ``"gpu"``.

    Returns:
        ``"cpu"``, ``"cuda"``, ``"rocm"``, ``"tpu"``, ``"METAL"``, ...: a key of
        :func:`set_profile`, and of the built-in profiles (:func:`bppsa.scan._profile.built_in`).
    """
    device = getattr(jax.sharding.get_abstract_mesh(), "abstract_device", None)
    if device is not None:
        return _toolkit(device.platform)
    default = getattr(jax.config, "jax_default_device", None)
    if default is None:
        return _toolkit(jax.default_backend())
    if isinstance(default, str):
        return _toolkit(default)
    return platform_of(default)


def platform_of(device) -> str:
    """The platform of ``device`` (a ``jax.Device``), a GPU named by its toolkit
    (:func:`platform_now`)."""
    return _toolkit(device.platform, device.client)


def _toolkit(platform: str, client=None) -> str:
    """``platform``, or for ``"gpu"`` the toolkit its client's ``platform_version`` names
    (``client``: default, JAX's ``"gpu"`` backend, if any)."""
    if platform != "gpu":
        return platform
    try:
        version = (client or jax_backend.get_backend("gpu")).platform_version.lower()
    except Exception:  # no GPU backend here (a platform named ahead of its devices)
        return platform
    return next((name for name in GPU_PLATFORMS if name in version), platform)


def profile_of(platform: str | None = None) -> Profile:
    """The profile of ``platform`` (default: :func:`platform_now`) in force now: the one
    :func:`set_profile` gave it (for ``"cuda"``, ``"rocm"`` and ``"oneapi"``, else the one
    it gave ``"gpu"``), else the built-in one."""
    platform = platform or platform_now()
    given = dict(tracing.profile_overrides())
    for name in (platform, "gpu") if platform in GPU_PLATFORMS else (platform,):
        if name in given:
            return given[name]
    return built_in(platform)


def get_profile(backend: str | None = None) -> Profile:
    """The profile of ``backend`` (``"cpu"``, ``"cuda"``, ``"gpu"``, ``"rocm"``, ``"tpu"``,
    ...; default: the platform traced for now, :func:`platform_now`, outside any trace the
    default device's): the one :func:`set_profile` gave, else the built-in one
    (:func:`bppsa.scan._profile.built_in`: :data:`~bppsa.scan._profile.CPU`,
    :data:`~bppsa.scan._profile.GPU` for NVIDIA GPUs, :data:`~bppsa.scan._profile.ACCELERATOR`
    for any other platform).

    Example:
        >>> bppsa.get_profile("tpu").kernels.fused_backend is None
        True
    """
    return profile_of(backend)


def set_profile(backend: str, profile: Profile | None) -> None:
    """Makes ``profile`` the profile of ``backend`` (``None``: back to the built-in one), from
    the next call on: of a function jitted before too (the profiles are part of ``jax.jit``'s
    cache key, as ``jax.config``'s settings are). ``backend`` is a platform as
    :func:`platform_now` names it (``"cpu"``, ``"cuda"``, ``"rocm"``, ``"tpu"``, ...), or
    ``"gpu"``: any GPU without a profile of its own toolkit.

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
