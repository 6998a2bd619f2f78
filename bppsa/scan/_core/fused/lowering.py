"""What Pallas' Triton lowering can lower: the one read of JAX internals of the fused forward.

:func:`has_rule` looks a primitive up in the Triton lowering's table of rules. When JAX moves
that table, :func:`has_rule` answers ``True`` for the elementwise primitives the padded rules
bind as they are (a lowering error on the device is then the fallback's trigger) and records the
problem in :func:`bppsa.scan._core.tracing.problems`, which ``tests/core/test_tracing.py`` and
``tests/core/test_fused_forward.py`` require to be empty.
"""

from __future__ import annotations

from bppsa.scan._core import tracing

try:
    from jax._src.pallas.triton.lowering import triton_lowering_rules as _RULES

    _NAMES: frozenset[str] | None = frozenset(p.name for p in _RULES)
except Exception as err:  # pragma: no cover - JAX moved the Triton lowering's table
    _NAMES = None
    tracing.record_problem("fused", f"cannot read Pallas' Triton lowering rules: {err}")


def has_rule(name: str) -> bool:
    """Whether the Triton lowering has a rule for the primitive called ``name``."""
    return True if _NAMES is None else name in _NAMES
