"""Method names, resolved to method objects in one place."""

from __future__ import annotations

from bppsa.scan._core.auto_forward import AutoForward
from bppsa.scan._core.forward import Forward, SequentialForward
from bppsa.scan._core.methods.auto import Auto
from bppsa.scan._core.methods.base import Method
from bppsa.scan._core.newton import Newton

METHODS = Method.registry  # filled by the method classes as they are defined


def resolve(method: Method | str | None, *, argname: str = "method") -> Method:
    """Turns a method object or a method name into a method (``None``: ``Auto()``).

    Raises:
        ValueError: for an unknown name, listing the valid ones.
        TypeError: for anything that is neither a method nor a string.
    """
    if method is None:
        return Auto()
    if isinstance(method, Method):
        return method
    if isinstance(method, str):
        example = "a method object such as bppsa.Blelloch()"
        return _by_name(METHODS, method, argname, "backward method", example)
    raise TypeError(
        f"{argname} must be a method object (e.g. bppsa.Blelloch()) or one of "
        f"{', '.join(repr(name) for name in sorted(METHODS))}; got {type(method).__name__}."
    )


FORWARDS: dict[str, type[Forward]] = {
    cls.name: cls for cls in (SequentialForward, Newton, AutoForward)
}


def resolve_forward(forward: Forward | str | None) -> Forward:
    """Turns a forward object or name (``"sequential"``, ``"newton"``, ``"auto"``) into a forward
    (``None``: the sequential ``lax.scan``).

    Raises:
        ValueError: for an unknown name, listing the valid ones.
        TypeError: for anything that is neither a forward nor a string.
    """
    if forward is None:
        return SequentialForward()
    if isinstance(forward, Forward):
        return forward
    if isinstance(forward, str):
        example = "an object such as bppsa.Newton(max_iterations=20)"
        return _by_name(FORWARDS, forward, "forward", "forward pass", example)
    valid = ", ".join(repr(name) for name in FORWARDS)
    raise TypeError(
        f"forward must be None, one of {valid} or an object such as bppsa.Newton(); got "
        f"{type(forward).__name__}."
    )


def _by_name(registry: dict, name: str, argname: str, what: str, example: str):
    """The default instance of the class ``registry`` has under ``name`` (case-insensitive).

    Raises:
        ValueError: for an unknown name, listing the valid ones.
    """
    try:
        return registry[name.lower()]()
    except KeyError:
        valid = ", ".join(repr(key) for key in sorted(registry))
        raise ValueError(
            f"{argname}={name!r} is not a known {what}; expected one of {valid}, or {example}."
        ) from None
