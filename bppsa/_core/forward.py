"""The forward pass of a scan, as a swappable part.

A :class:`Forward` runs the steps of a scan forward in time and, for a backward pass, also
returns the carry that entered every step. :class:`SequentialForward` is ``lax.scan`` (every
method uses it today); a parallel-in-time forward implements the same call, and the backward
methods do not change.
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Callable
from typing import Any

from jax import lax


class Forward(abc.ABC):
    """How the forward pass of a scan runs."""

    @abc.abstractmethod
    def __call__(
        self, step: Callable, consts: list, init: Any, xs: Any, *, length: int, keep: bool
    ) -> tuple[Any, Any]:
        """Runs ``step(carry, x, *consts) -> (carry, y, ...)`` over ``xs`` (time order).

        Returns:
            ``(final carry, ys)``, or with ``keep``: ``(final carry, (ys, carries_before))``,
            where ``carries_before[t]`` is the carry that entered step ``t``.
        """


@dataclasses.dataclass(frozen=True)
class SequentialForward(Forward):
    """``lax.scan``: ``T`` dependent steps."""

    def __call__(self, step, consts, init, xs, *, length, keep):
        def body(carry, x):
            new_carry, y, *_ = step(carry, x, *consts)
            return new_carry, ((y, carry) if keep else y)

        return lax.scan(body, init, xs, length=length)
