"""The front door's one resolution of what a user asked for into :class:`Options`.

``bppsa.scan``, ``bppsa.grad`` and ``bppsa.value_and_grad`` take methods, forwards and their
names (``"blelloch"``, ``"fused"``), limits and switches; :func:`options_from` validates them and
resolves the names here, once, so that :class:`~bppsa.scan._core.options.Options` holds plain
values only and imports no method nor forward.
"""

from __future__ import annotations

from bppsa.scan import _precision
from bppsa.scan._core.forwards import resolve_forward
from bppsa.scan._core.methods.resolve import resolve
from bppsa.scan._core.options import Options, check_bool, check_limit


def options_from(
    method=None,
    memory_limit=None,
    check_finite=None,
    forward=None,
    precision=None,
    check_structure=None,
    linear_vjp=None,
) -> Options:
    """Validated options from user arguments, method and forward names resolved (``None``
    fields: unset).

    Raises:
        TypeError, ValueError: an argument of the wrong kind or value, naming it.
    """
    return Options(
        method=None if method is None else resolve(method),
        memory_limit=check_limit(memory_limit),
        check_finite=None if check_finite is None else check_bool(check_finite),
        check_structure=(
            None if check_structure is None else check_bool(check_structure, "check_structure")
        ),
        forward=None if forward is None else resolve_forward(forward),
        precision=None if precision is None else _precision.canonical(precision),
        linear_vjp=None if linear_vjp is None else check_bool(linear_vjp, "linear_vjp"),
    )
