"""The fused forward: a scan's loop in one Pallas kernel (:class:`Fused`)."""

from bppsa.scan._core.fused.forward import Fused

__all__ = ["Fused"]
