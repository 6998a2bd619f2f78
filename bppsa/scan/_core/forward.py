"""The forward pass of a scan, as a swappable part.

A :class:`Forward` runs the steps of a scan forward in time and, for a backward pass, also
returns the carry that entered every step. :class:`SequentialForward` is ``lax.scan`` (the
default); :class:`bppsa.Newton` (:mod:`bppsa.scan._core.newton`) solves the whole trajectory by
Newton iterations, each a parallel linear scan. The backward methods do not change with it.
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar

from jax import lax

if TYPE_CHECKING:
    from bppsa.scan._core.memory import Footprint
    from bppsa.scan._core.problem import Problem
    from bppsa.scan._profile import Profile


class Forward(abc.ABC):
    """How the forward pass of a scan runs."""

    name: ClassVar[str | None] = None
    sequential: ClassVar[bool] = False  # whether this is lax.scan itself

    @abc.abstractmethod
    def __call__(
        self, problem: Problem, consts: list, init: Any, xs: Any, *, keep: bool, prepared=None
    ) -> tuple[Any, Any]:
        """Runs the steps of ``problem`` (``problem.body.step(carry, x, *consts) -> (carry, y,
        ...)``) over ``xs`` (time order). What a forward needs besides (Newton's solver of its
        linear recurrences) is its own setting, not the backward's; ``prepared`` is what its
        :meth:`prepare` made for the scan (the scan's decision hands it over).

        Returns:
            ``(final carry, ys)``, or with ``keep``: ``(final carry, (ys, carries_before))``,
            where ``carries_before[t]`` is the carry that entered step ``t``.
        """

    def resolved(self, problem: Problem, fp: Footprint, policy: Any, profile: Profile) -> Forward:
        """This forward with the choices it leaves to the scan made by the scan's ``policy`` on
        ``profile`` (Newton's solver); most forwards leave none."""
        return self

    def prepare(self, problem: Problem, profile: Profile | None = None) -> Any:
        """What this forward prepares for ``problem`` on ``profile`` (a kernel's plan), made
        once by the scan's decision; a string: why its kernel cannot run the scan (the scan
        then runs ``lax.scan``). ``None``: nothing to prepare."""
        return None

    def forms_jacobians(self, problem: Problem) -> bool:
        """Whether this forward forms the Jacobians of ``problem``'s steps (Newton's
        iterations do; ``lax.scan`` does not)."""
        return False

    def shares_jacobians(self, problem: Problem) -> bool:
        """Whether :meth:`with_jacobians` hands the backward the Jacobians of ``problem``'s
        steps (a forward that formed them at its final trajectory), so that it does not form
        them again."""
        return False

    def with_jacobians(self, problem: Problem, consts: list, init: Any, xs: Any):
        """``(final carry, (ys, carries_before, jac_t))``: what ``keep=True`` returns, and the
        steps' transposed Jacobians at ``carries_before`` as
        :meth:`bppsa.scan._core.problem.Problem.all_steps` forms them (only called where
        :meth:`shares_jacobians`)."""
        raise NotImplementedError(f"{self!r} does not keep the Jacobians of its steps.")


@dataclasses.dataclass(frozen=True)
class SequentialForward(Forward):
    """``lax.scan``: ``T`` dependent steps, ``problem.unroll`` of them per loop iteration."""

    name: ClassVar[str] = "sequential"
    sequential: ClassVar[bool] = True

    def __call__(self, problem, consts, init, xs, *, keep, prepared=None):
        return run_sequentially(
            problem.body.step, consts, init, xs, problem.length, keep, unroll=problem.unroll
        )

    def __repr__(self) -> str:
        return "'sequential'"


def run_sequentially(
    step: Callable, consts, init, xs, length: int, keep: bool, *, unroll: int | bool = 1
):
    """``lax.scan`` of ``step(carry, x, *consts) -> (carry, y, ...)`` (see :class:`Forward`),
    ``unroll`` as in ``jax.lax.scan``."""

    def body(carry, x):
        new_carry, y, *_ = step(carry, x, *consts)
        return new_carry, ((y, carry) if keep else y)

    return lax.scan(body, init, xs, length=length, unroll=unroll)
