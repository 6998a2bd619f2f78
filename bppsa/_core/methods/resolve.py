"""Method names, resolved to method objects in one place."""

from __future__ import annotations

from bppsa._core.methods.auto import Auto
from bppsa._core.methods.base import Method
from bppsa._core.methods.blelloch import Blelloch
from bppsa._core.methods.chunked import Chunked
from bppsa._core.methods.sequential import Sequential

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
