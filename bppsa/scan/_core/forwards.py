"""Forward-pass names, resolved to forward objects in one place."""

from __future__ import annotations

from bppsa.scan._core.auto_forward import AutoForward
from bppsa.scan._core.forward import Forward, SequentialForward
from bppsa.scan._core.fused import Fused
from bppsa.scan._core.methods.resolve import by_name
from bppsa.scan._core.methods.sharded import Pipelined
from bppsa.scan._core.newton import Newton

FORWARDS: dict[str, type[Forward] | type[AutoForward]] = {
    cls.name: cls for cls in (SequentialForward, Newton, Fused, Pipelined, AutoForward)
}


def resolve_forward(forward: Forward | AutoForward | str | None) -> Forward | AutoForward:
    """Turns a forward object or name (``"sequential"``, ``"newton"``, ``"fused"``,
    ``"pipelined"``, ``"auto"``) into a forward
    or the forward's policy (``None``: the sequential ``lax.scan``).

    Raises:
        ValueError: for an unknown name, listing the valid ones.
        TypeError: for anything that is neither a forward nor a string.
    """
    if forward is None:
        return SequentialForward()
    if isinstance(forward, Forward | AutoForward):
        return forward
    if isinstance(forward, str):
        example = "an object such as bppsa.Newton(max_iterations=20)"
        return by_name(FORWARDS, forward, "forward", "forward pass", example)
    valid = ", ".join(repr(name) for name in FORWARDS)
    raise TypeError(
        f"forward must be None, one of {valid} or an object such as bppsa.Newton(); got "
        f"{type(forward).__name__}."
    )
