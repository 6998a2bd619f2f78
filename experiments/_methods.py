"""The backward methods an experiment can be asked for by name on its command line.

``bp`` is the baseline, plain back-propagation (``bppsa``'s ``"sequential"`` method: JAX
differentiates ``lax.scan``); ``bppsa`` is the library's default choice (``bppsa.Auto()``: on
accelerators the fastest of BP, Blelloch and Chunked by its cost model, on CPUs a time-blocked
Jacobian-based sequential scan, or there plain back-propagation for large batches); the other
names pick a method explicitly. Names are resolved here only.
"""

from __future__ import annotations

import bppsa

BASELINE = "bp"
NAMES = ("bp", "bppsa", "blelloch", "chunked", "chunked-C (C chunks)", "sequential-jacobians")


def parse_method(name: str) -> bppsa.Method:
    """The method object of a command-line name.

    Raises:
        ValueError: for an unknown name, listing the valid ones.
    """
    if name == "bp":
        return bppsa.Sequential()
    if name == "bppsa":
        return bppsa.Auto()
    if name == "blelloch":
        return bppsa.Blelloch()
    if name == "sequential-jacobians":
        return bppsa.Sequential(jacobians=True)
    if name == "chunked":
        return bppsa.Chunked()
    if name.startswith("chunked-"):
        chunks = name.removeprefix("chunked-")
        if chunks.isdigit() and int(chunks) > 0:
            return bppsa.Chunked(int(chunks))
    raise ValueError(f"method {name!r} is not known; expected one of: {', '.join(NAMES)}.")


def describe(
    name: str,
    length: int,
    hidden: int,
    backend: str | None = None,
    *,
    batch: int = 1,
    element: int | None = None,
) -> str:
    """What method ``name`` runs for ``length`` steps of a ``hidden``-sized state, ``batch``
    examples vmapped, ``element`` floats per step's Jacobian (``Auto`` resolved to its choice;
    ``Sequential()`` there means that it runs plain back-propagation)."""
    method = parse_method(name)
    if isinstance(method, bppsa.Auto):
        chosen = method.choose(length, hidden, backend, batch=batch, element=element)
        return f"{method!r} -> {chosen!r}"
    return repr(method)
