"""Every read of JAX's private state, in one place.

Two things ``bppsa.scan`` needs are not in JAX's public API:

* :func:`vmapped_batch_size`: how many examples a scan serves at once under ``jax.vmap``. A scan
  written for one example and vmapped over a batch is traced once, with per-example shapes; the
  batch size only shows in the batching traces above it (``Auto()`` and the memory guard weigh
  it). It walks those traces the way JAX dispatches the scan's inputs.
* :func:`profile_overrides` / :func:`set_profile_overrides`: the profiles of
  :func:`bppsa.set_profile`, kept in a JAX configuration state in ``jax.jit``'s cache key, so
  that a new profile reaches the next call of a function jitted before (a module-level table
  would be read while tracing and left out of the key).
* :func:`options_context` / :func:`current_options`: the options of :func:`bppsa.grad` reach the
  scans traced inside it through a JAX configuration state that is part of ``jax.jit``'s cache
  key, so that a function jitted before ``bppsa.grad`` sees them (a plain context variable is
  invisible to the cache, and a jitted function would keep the options of its first trace).

* :func:`fresh_traces`: a block in which ``jax.jit``'s caches miss (a configuration state in
  its key, set to a new token), so that :func:`bppsa.trace_plans` of a function traces the
  functions it calls that were jitted and called before.

When JAX changes underneath, each of them falls back to something safe (batch 1 with a warning;
for the options, a context variable, with :func:`bppsa.grad` refusing already-jitted functions)
and :func:`problems` lists what fell back (the linear primitive of :mod:`bppsa.scan._core.linear`,
which uses JAX's extension API, records here too if it cannot be defined):
``tests/core/test_tracing.py`` fails on any entry, so a JAX upgrade cannot change behaviour
unnoticed.
"""

from __future__ import annotations

import contextlib
import contextvars
import math
import warnings
from collections.abc import Iterator
from typing import Any

import jax

_problems: dict[str, str] = {}

# The JAX minor versions these reads (and the extension API of bppsa.scan._core.linear and
# bppsa.scan._core.dependence) were tested with; pyproject.toml bounds the dependency to them.
TESTED_JAX = ("0.10", "0.11", "0.12")
if ".".join(jax.__version__.split(".")[:2]) not in TESTED_JAX:
    _problems["version"] = (
        f"JAX {jax.__version__} is not among the versions bppsa's reads of JAX internals were "
        f"tested with ({', '.join(TESTED_JAX)}); run tests/core/test_tracing.py"
    )

try:
    from jax._src import core as _core
    from jax._src.interpreters import ad as _ad
    from jax._src.interpreters import batching as _batching

    _READS_TRACES = True
except ImportError as err:  # pragma: no cover - a JAX without these modules
    _READS_TRACES = False
    _problems["traces"] = f"cannot import JAX's trace modules: {err}"

try:
    from jax._src import config as _config

    _READS_CONFIG = True
except ImportError:  # pragma: no cover - a JAX without it: every state below falls back
    _READS_CONFIG = False


def _jit_key_state(feature: str, name: str, default: Any, help_text: str) -> Any:
    """A JAX configuration state in ``jax.jit``'s cache key (and the trace context), or
    ``None`` where JAX's configuration API changed (recorded under ``feature``)."""
    if not _READS_CONFIG:  # pragma: no cover - see its import
        _problems[feature] = "cannot import JAX's configuration module (jax._src.config)"
        return None
    try:
        return _config.string_or_object_state(
            name, default, help_text, include_in_jit_key=True, include_in_trace_context=True
        )
    except Exception as err:  # pragma: no cover - JAX changed its configuration API
        _problems[feature] = f"cannot define a configuration state in jax.jit's key: {err}"
        return None


_OPTIONS_STATE = _jit_key_state(
    "options",
    "bppsa_options",
    None,
    "Options of the enclosing bppsa.grad (set by bppsa; part of jax.jit's cache key).",
)
OPTIONS_IN_JIT_KEY = _OPTIONS_STATE is not None
_PROFILES_STATE = _jit_key_state(
    "profiles",
    "bppsa_profiles",
    (),
    "The profiles bppsa.set_profile gave, as ((backend, profile), ...) (part of jax.jit's "
    "cache key, so that a new profile reaches an already-jitted function's next call).",
)
_RETRACE_STATE = _jit_key_state(
    "retrace",
    "bppsa_retrace",
    None,
    "A token of bppsa.trace_plans(fun, ...) (part of jax.jit's cache key, so that the "
    "functions traced inside it are traced again, not served from the cache).",
)
_profiles_fallback: list[tuple] = [()]  # only where JAX's configuration API changed
_options_fallback: contextvars.ContextVar[Any] = contextvars.ContextVar(
    "bppsa_options", default=None
)


def problems() -> dict[str, str]:
    """What fell back since import, by feature (empty when JAX's internals are as expected)."""
    return dict(_problems)


def record_problem(feature: str, message: str) -> None:
    """Records (and warns once) that ``feature`` fell back because JAX changed underneath."""
    if feature not in _problems:
        _problems[feature] = message
        warnings.warn(f"bppsa: {message}", RuntimeWarning, stacklevel=3)


def vmapped_batch_size(inputs: Any) -> int:
    """The product of the sizes of the ``jax.vmap`` axes over which ``inputs`` are batched (the
    largest over the leaves), or 1 outside ``jax.vmap``.

    Falls back to 1, with a warning, if JAX's traces cannot be read (pass ``batch=`` to
    :func:`bppsa.scan` to say it explicitly).
    """
    if not _READS_TRACES:
        return 1
    try:
        return max((_batch_size(leaf) for leaf in jax.tree.leaves(inputs)), default=1)
    except (AttributeError, TypeError) as err:
        record_problem(
            "batch", f"cannot read the jax.vmap batch size ({err!r}); assuming 1 example per scan"
        )
        return 1


def under_vmap(inputs: Any) -> bool:
    """Whether a ``jax.vmap`` batches any leaf of ``inputs`` (of size 1 too); ``True`` where
    JAX's traces cannot be read (the rules measured under ``jax.vmap`` then apply)."""
    if not _READS_TRACES:
        return True
    try:
        return any(_batch_sizes(leaf) for leaf in jax.tree.leaves(inputs))
    except (AttributeError, TypeError) as err:
        record_problem("batch", f"cannot read the jax.vmap traces ({err!r})")
        return True


def _batch_size(value: Any) -> int:
    return math.prod(_batch_sizes(value))


def _batch_sizes(value: Any) -> list[int]:
    sizes = []
    trace = _core.trace_ctx.trace
    while trace is not None:
        if isinstance(trace, _batching.BatchTrace):
            value, dim = trace.to_batch_info(value)
            if isinstance(dim, int):  # None when the value is not batched
                sizes.append(value.shape[dim])
        elif isinstance(trace, _ad.JVPTrace | _ad.LinearizeTrace):
            value = trace.to_primal_tangent_pair(value)[0]
        else:
            break
        trace = trace.parent_trace
    return sizes


def current_options() -> Any:
    """The options set by the innermost enclosing :func:`options_context` (``None``: none)."""
    if _OPTIONS_STATE is not None:
        return _OPTIONS_STATE.value
    return _options_fallback.get()


@contextlib.contextmanager
def options_context(options: Any) -> Iterator[None]:
    """Within the block, :func:`current_options` is ``options`` (hashable: it keys jit)."""
    if _OPTIONS_STATE is not None:
        with _OPTIONS_STATE(options):
            yield
        return
    token = _options_fallback.set(options)
    try:
        yield
    finally:
        _options_fallback.reset(token)


@contextlib.contextmanager
def fresh_traces() -> Iterator[None]:
    """Within the block, ``jax.jit``'s caches miss: the functions called are traced again (a
    new token in their key each time; where JAX's configuration API changed, the block does
    nothing and a cached function is not traced)."""
    if _RETRACE_STATE is None:  # pragma: no cover - JAX changed its configuration API
        yield
        return
    with _RETRACE_STATE(object()):
        yield


def profile_overrides() -> tuple:
    """The profiles :func:`bppsa.set_profile` gave, ``((backend, profile), ...)``."""
    if _PROFILES_STATE is not None:
        return _PROFILES_STATE.value
    return _profiles_fallback[0]


def set_profile_overrides(overrides: tuple) -> None:
    """Makes ``overrides`` the value of :func:`profile_overrides` (globally, as
    ``jax.config.update`` does: the next call of a jitted function is traced again)."""
    if _PROFILES_STATE is not None:
        jax.config.update("bppsa_profiles", overrides)
    else:
        _profiles_fallback[0] = overrides


def is_jitted(fun: Any) -> bool:
    """Whether ``fun`` is a ``jax.jit``-compiled function (it caches traces)."""
    return callable(fun) and hasattr(fun, "lower") and hasattr(fun, "trace")
