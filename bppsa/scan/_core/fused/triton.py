"""Pallas' Triton backend of the fused loops: the one module that imports it.

Its padding is to powers of two (Triton's blocks), its primitives are those of
:mod:`~bppsa.scan._core.fused.padded` that Triton's lowering has a rule for, and its launch is
the profile's warps and stages. Both imports are guarded: Pallas' Triton backend is deprecated
since JAX 0.11.0, and where it (or its private table of lowering rules) is absent, ``import
bppsa`` still works and the fused loops fall back to ``lax.scan`` with the reason
(:meth:`Triton.missing`). Where the table alone moved, every primitive with a padded rule counts
as lowerable (a lowering error on the device is then the fallback's trigger) and the problem is
recorded in :func:`bppsa.scan._core.tracing.problems`, which the tests require to be empty.
"""

from __future__ import annotations

from typing import ClassVar

from bppsa.scan._core import tracing
from bppsa.scan._core.fused import padded
from bppsa.scan._core.fused.backend import Backend, Launch

NAME = "triton"


_MISSING: str | None = None
_RULES: frozenset[str] | None = None
try:
    from jax.experimental.pallas import triton as _pallas_triton
except ImportError as err:  # JAX dropped it: the loops fall back, naming it
    _pallas_triton = None  # type: ignore[assignment]
    _MISSING = f"Pallas' Triton backend cannot be imported here ({type(err).__name__}: {err})"
else:
    try:
        from jax._src.pallas.triton.lowering import triton_lowering_rules

        _RULES = frozenset(p.name for p in triton_lowering_rules)
    except (ImportError, AttributeError, TypeError) as err:  # pragma: no cover - JAX moved it
        tracing.record_problem("fused", f"cannot read Pallas' Triton lowering rules: {err}")


def has_rule(name: str) -> bool:
    """Whether Triton's lowering has a rule for the primitive called ``name`` (``True`` where
    its table cannot be read)."""
    return True if _RULES is None else name in _RULES


class Triton(Backend):
    """Pallas' Triton backend (NVIDIA GPUs)."""

    name: ClassVar[str] = NAME
    platform: ClassVar[str] = "cuda"

    def missing(self):
        return _MISSING

    def padded_shape(self, shape):
        return padded.padded_shape(shape)

    def unsupported(self, eqn):
        return padded.unsupported(eqn, has_rule)

    def largest_tile(self, eqn):
        return padded.largest_tile(eqn)

    def run_equations(self, eqns, env, permuted=None, *, num_warps):
        return padded.run_padded(eqns, env, permuted, num_warps)

    def permuted_constants(self, eqns, constants, *, num_warps):
        return padded.permuted_constants(eqns, constants, num_warps)

    def masked(self, x, shape, fill):
        return padded.masked(x, shape, range(len(shape)), fill)

    def compiler_params(self, launch: Launch):
        assert _pallas_triton is not None  # why_not refused every loop without it
        return _pallas_triton.CompilerParams(
            num_warps=launch.num_warps, num_stages=launch.num_stages
        )

    def __eq__(self, other):
        return type(other) is Triton

    def __hash__(self):
        return hash(Triton)

    def __repr__(self) -> str:
        return "Triton()"
