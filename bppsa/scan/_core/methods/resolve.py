"""Method names, resolved to method objects in one place: the names of the classes
:mod:`bppsa.scan._core.methods` exports (:data:`METHODS`), no registry."""

from __future__ import annotations

from bppsa.scan._core.methods.auto import Auto
from bppsa.scan._core.methods.base import Method
from bppsa.scan._core.methods.policy import Policy


def names(*classes: type[Method] | type[Policy]) -> dict[str, type[Method] | type[Policy]]:
    """``{cls.name: cls}`` of method and policy classes (each needs a distinct name)."""
    table: dict[str, type[Method] | type[Policy]] = {}
    for cls in classes:
        if not isinstance(cls.name, str) or cls.name in table:
            raise TypeError(f"{cls.__qualname__} needs a name of its own, got {cls.name!r}.")
        table[cls.name] = cls
    return table


METHODS: dict[str, type[Method] | type[Policy]] = {}  # filled by bppsa.scan._core.methods


def resolve(method: Method | Policy | str | None, *, argname: str = "method") -> Method | Policy:
    """Turns a method or policy object, or a name, into one (``None``: ``Auto()``).

    Raises:
        ValueError: for an unknown name, listing the valid ones.
        TypeError: for anything that is neither a method nor a string.
    """
    if method is None:
        return Auto()
    if isinstance(method, Method | Policy):
        return method
    if isinstance(method, str):
        example = "a method object such as bppsa.Blelloch()"
        return by_name(METHODS, method, argname, "backward method", example)
    raise TypeError(
        f"{argname} must be a method object (e.g. bppsa.Blelloch()) or one of "
        f"{', '.join(repr(name) for name in sorted(METHODS))}; got {type(method).__name__}."
    )


def by_name(registry: dict, name: str, argname: str, what: str, example: str):
    """The default instance of the class ``registry`` has under ``name``: the one place where
    method and forward names are read, case-insensitive and with ``_`` and ``-`` alike
    (``"sequential_scan"`` is ``"sequential-scan"``).

    Raises:
        ValueError: for an unknown name, listing the valid ones.
    """
    try:
        return registry[canonical_name(name)]()
    except KeyError:
        valid = ", ".join(repr(key) for key in sorted(registry))
        raise ValueError(
            f"{argname}={name!r} is not a known {what}; expected one of {valid} (with '_' or "
            f"'-' alike), or {example}."
        ) from None


def canonical_name(name: str) -> str:
    """``name`` as the tables spell it: lower case, words joined by ``-``."""
    return name.lower().replace("_", "-")
