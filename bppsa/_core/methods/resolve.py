"""Method names, resolved to method objects in one place."""

from __future__ import annotations

from bppsa._core.auto_forward import AutoForward
from bppsa._core.forward import Forward, SequentialForward
from bppsa._core.methods.auto import Auto
from bppsa._core.methods.base import Method
from bppsa._core.methods.blelloch import Blelloch
from bppsa._core.methods.chunked import Chunked
from bppsa._core.methods.sequential import Sequential
from bppsa._core.newton import Newton

METHODS: dict[str, type[Method]] = {cls.name: cls for cls in (Auto, Blelloch, Chunked, Sequential)}


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
    valid = ", ".join(repr(name) for name in FORWARDS)
    if isinstance(forward, str):
        try:
            return FORWARDS[forward.lower()]()
        except KeyError:
            raise ValueError(
                f"forward={forward!r} is not a known forward pass; expected one of {valid}, "
                "or an object such as bppsa.Newton(max_iterations=20)."
            ) from None
    raise TypeError(
        f"forward must be None, one of {valid} or an object such as bppsa.Newton(); got "
        f"{type(forward).__name__}."
    )
