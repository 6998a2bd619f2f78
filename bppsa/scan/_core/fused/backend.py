"""The seam of the fused loops: what a kernel backend is, and how a loop is launched on it.

Algorithm summary. A fused loop (:mod:`~bppsa.scan._core.fused.forward`,
:mod:`~bppsa.scan._core.fused.backward`) splits the step it runs (the carry's dependence cone
in the loop, the rest hoisted) and hands the cone to a :class:`Backend`: the backend says
whether it can run it (:meth:`Backend.unsupported_loop`: its module present, every primitive
in its table), how much the cone holds after its padding (:meth:`Backend.footprint`, which the
profile's envelope compares: :func:`program_of`) and runs it as one kernel
(:func:`bppsa.scan._core.fused.kernel.carries_after`, with the backend's equations, padding and
compiler parameters). The plan of one loop (:mod:`~bppsa.scan._core.fused.plan`) is made once
per scan by the scan's decision and carried in it; the platforms a backend runs on are one
table (:mod:`~bppsa.scan._core.fused.dispatch`). A new backend is a module with a subclass of
:class:`Backend` and a line in that table.
"""

from __future__ import annotations

import abc
import dataclasses
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar

import jax.numpy as jnp
import numpy as np

if TYPE_CHECKING:
    from bppsa.scan._core.fused.lanes import Tiled
    from bppsa.scan._core.fused.split import Split
    from bppsa.scan._profile import FusedProgram, Kernels


# What tracing a step or building its kernel raises where the kernel cannot run it (a primitive
# or a parameter JAX's Pallas or our rules do not take): the loop then runs in lax.scan. Any
# other exception is a bug of a rule and propagates.
CANNOT = (NotImplementedError, TypeError, ValueError)
AUTO = "auto"  # a launch parameter left to the profile


@dataclasses.dataclass(frozen=True)
class Launch:
    """How a fused loop's kernel is launched (the profile's, or the user's where given).

    Attributes:
        num_warps: warps per program.
        num_stages: the compiler's software-pipelining stages.
        lanes: lanes of the carry per program where they are independent (``None``: one
            program per example).
        prefetch: whether the loop loads step ``t + 1``'s residuals during step ``t`` (carried
            in the loop's state), so that no load from global memory waits on the carry's
            dependency chain; ``False``: each step loads its own.
        unroll: steps the kernel's time loop runs an iteration (the remainder after it).
        padded_ahead: with ``prefetch``, the per-step residuals get one more (zero) step past
            the last, so that the step-ahead load needs no clamp; ``False``: the index is
            clamped.
    """

    num_warps: int
    num_stages: int
    lanes: int | None
    prefetch: bool = True
    unroll: int = 1
    padded_ahead: bool = True


@dataclasses.dataclass(frozen=True)
class Footprint:
    """What a loop's program holds, in entries after the backend's padding.

    Attributes:
        tile: the largest array one operation of the recurrence forms.
        resident: the constants and the carry the program keeps loaded across steps.
    """

    tile: int
    resident: int


class Backend(abc.ABC):
    """A kernel backend of the fused loops: its padding, its primitives, its launch and its
    lowering check.

    Attributes:
        name: the name a profile gives (:class:`~bppsa.scan._profile.Kernels`'
            ``fused_backend``).
        platform: the platform JAX lowers its kernels for (``lax.platform_dependent``'s).
        interpret: whether its kernels run in Pallas' interpreter.
        tiles: whether it runs a carry's independent lanes as a grid of tiles
            (:mod:`~bppsa.scan._core.fused.lanes`); ``False``: one launch holds them all.
        vmap_outside: whether ``jax.vmap`` must map each platform's branch rather than the
            choice between them (its interpreter has effects a batched choice cannot take).
        own_kernel: whether it builds its own kernel (:meth:`carries_after`) rather than
            Pallas' generic loop (:func:`bppsa.scan._core.fused.kernel.carries_after`).
    """

    name: ClassVar[str]
    platform: ClassVar[str]
    interpret: ClassVar[bool] = False
    tiles: ClassVar[bool] = True  # whether it runs independent lanes as tiles (lanes=)
    vmap_outside: ClassVar[bool] = False  # whether jax.vmap maps each platform's branch
    own_kernel: ClassVar[bool] = False  # whether it runs its own kernel (carries_after)

    @abc.abstractmethod
    def missing(self) -> str | None:
        """Why the backend cannot run anything here (its module absent), or ``None``."""

    @abc.abstractmethod
    def padded_shape(self, shape: Sequence[int]) -> tuple[int, ...]:
        """The shape an array of ``shape`` takes in the kernel (the padding policy)."""

    @abc.abstractmethod
    def unsupported(self, eqn) -> str | None:
        """Why the kernel cannot run the equation ``eqn`` (its primitive table and lowering
        check), or ``None``."""

    @abc.abstractmethod
    def largest_tile(self, eqn) -> int:
        """Entries of the largest array the kernel forms for ``eqn``."""

    @abc.abstractmethod
    def run_equations(
        self, eqns: Sequence[Any], env: dict, permuted: dict | None = None, *, num_warps: int
    ) -> dict:
        """Evaluates ``eqns`` on padded arrays into ``env`` (variables to padded values), in a
        program of ``num_warps`` warps (the launch's: a backend may arrange its arrays by
        them); ``permuted`` maps :meth:`permuted_constants`' pairs to their values."""

    def permuted_constants(
        self, eqns: Sequence[Any], constants: Sequence[Any], *, num_warps: int
    ) -> list[tuple]:
        """The ``(variable, axis order)`` pairs of the ``constants`` that ``eqns`` read
        permuted in a program of ``num_warps`` warps: the kernel passes each one permuted (and
        padded) once, rather than permuting it at every step (none by default). The order may
        be a :class:`~bppsa.scan._core.fused.matvec.Arranged` instead: the matrix arranged."""
        return []

    @abc.abstractmethod
    def masked(self, x, shape: Sequence[int], fill) -> Any:
        """``x`` (padded) with its padded entries beyond ``shape`` set to ``fill``."""

    @abc.abstractmethod
    def compiler_params(self, launch: Launch) -> Any:
        """``pallas_call``'s ``compiler_params`` for ``launch``."""

    def carries_after(
        self,
        split: Split,
        length: int,
        init: Sequence[Any],
        constants: Sequence[Any],
        steps: Sequence[Any],
        *,
        launch: Launch,
        reverse: bool = False,
        name: str = "bppsa_fused_forward",
        tiled: Tiled | None = None,
    ) -> list[Any]:
        """The carry leaves after every step from this backend's own kernel, where it has one
        (``own_kernel``; :func:`bppsa.scan._core.fused.kernel.carries_after`'s contract and
        options); the others run Pallas' generic loop there."""
        raise NotImplementedError(f"{self!r} runs Pallas' generic loop (own_kernel is False)")

    def interpretable(self) -> bool:
        """Whether its kernels can run in an interpreter on the CPU with this JAX (else the
        loops run ``lax.scan`` there)."""
        return True

    def programs(self, kernels: Kernels) -> tuple[FusedProgram, ...]:
        """The envelope its loops are held to: the profile's ``fused_programs`` by default."""
        return kernels.fused_programs

    def footprint(self, loop: Split | Tiled) -> Footprint:
        """The tile and resident entries of ``loop``'s recurrence after this backend's padding."""
        tile = max((self.largest_tile(eqn) for eqn in loop.recurrence), default=0)
        resident = sum(
            math.prod(self.padded_shape(v.aval.shape))
            for v in [*loop.constant_residuals, *loop.carry_in]
        )
        return Footprint(int(tile), int(resident))

    def unsupported_loop(self, loop: Split | Tiled) -> str | None:
        """Why the kernel cannot run the recurrence of ``loop`` (or of its tile) at any size:
        the backend absent, a type, a primitive it has no rule for (``None``: it can)."""
        missing = self.missing()
        if missing is not None:
            return missing
        for v in loop.carry_in:
            dtype = np.dtype(v.aval.dtype)
            if dtype.itemsize == 8 or jnp.issubdtype(dtype, jnp.complexfloating):
                return f"a carry of {dtype.name} (the kernel runs 32-bit and narrower types)"
        for eqn in loop.recurrence:
            reason = self.unsupported(eqn)
            if reason is not None:
                return reason
        return None


class Interpreted(Backend):
    """A backend's kernels run in Pallas' interpreter (on the CPU): its padding, primitives
    and checks, so that the interpreter runs what the device would, exactly and slowly."""

    platform: ClassVar[str] = "cpu"
    interpret: ClassVar[bool] = True

    def __init__(self, compiled: Backend):
        self.compiled = compiled
        self.name = f"{compiled.name} (interpreted)"  # type: ignore[misc]

    def missing(self):
        return self.compiled.missing()

    def padded_shape(self, shape):
        return self.compiled.padded_shape(shape)

    def unsupported(self, eqn):
        return self.compiled.unsupported(eqn)

    def largest_tile(self, eqn):
        return self.compiled.largest_tile(eqn)

    def run_equations(self, eqns, env, permuted=None, *, num_warps):
        return self.compiled.run_equations(eqns, env, permuted, num_warps=num_warps)

    def permuted_constants(self, eqns, constants, *, num_warps):
        return self.compiled.permuted_constants(eqns, constants, num_warps=num_warps)

    def masked(self, x, shape, fill):
        return self.compiled.masked(x, shape, fill)

    def compiler_params(self, launch):
        return None  # the interpreter takes none

    def carries_after(self, split, length, init, constants, steps, **options):
        # the compiled backend's kernel, run by its interpreter
        return type(self.compiled).carries_after(
            self, split, length, init, constants, steps, **options
        )

    @property
    def tiles(self):
        return self.compiled.tiles

    @property
    def own_kernel(self):
        return self.compiled.own_kernel

    def interpretable(self):
        return self.compiled.interpretable()

    def programs(self, kernels):
        return self.compiled.programs(kernels)

    def footprint(self, loop):
        return self.compiled.footprint(loop)

    def unsupported_loop(self, loop):
        return self.compiled.unsupported_loop(loop)

    def __eq__(self, other):
        return isinstance(other, Interpreted) and other.compiled == self.compiled

    def __hash__(self):
        return hash((Interpreted, self.compiled))

    def __repr__(self) -> str:
        return f"Interpreted({self.compiled!r})"


def check_options(owner: str, num_warps: int | str, lanes: int | str | None) -> None:
    """Raises ``ValueError`` naming ``owner`` unless ``num_warps`` is a positive int or
    ``"auto"`` and ``lanes`` one of those or ``None``."""
    for field, value in (("num_warps", num_warps), ("lanes", lanes)):
        if value == AUTO or (field == "lanes" and value is None):
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(
                f"{owner}: {field} must be a positive int or 'auto' (the profile's), got {value!r}."
            )


def program_of(
    footprint: Footprint, programs: Sequence[FusedProgram], num_warps: int | str = AUTO
) -> FusedProgram | str:
    """The program of ``programs`` (a backend's envelope: :meth:`Backend.programs`) a loop
    of ``footprint`` runs in, or why none holds it. ``num_warps="auto"``: the first that
    holds it (the fewest warps); a number: the envelope of the listed program of that many
    warps, else of the largest with fewer (the first where none has fewer)."""
    if num_warps == AUTO:
        for program in programs:
            if program.holds(footprint.tile, footprint.resident) is None:
                return program
        largest = programs[-1]
        return (
            f"the loop {largest.holds(footprint.tile, footprint.resident)}: beyond the "
            f"envelope's largest program ({_warps(largest.num_warps)})"
        )
    fewer = [p for p in programs if p.num_warps <= int(num_warps)]
    program = fewer[-1] if fewer else programs[0]
    reason = program.holds(footprint.tile, footprint.resident)
    if reason is None:
        return program
    return (
        f"the loop {reason}: beyond the envelope at num_warps={num_warps} (the profile's "
        f"program of {_warps(program.num_warps)})"
    )


def _warps(count: int) -> str:
    return f"{count} warp" + ("s" if count > 1 else "")


def launch_of(
    kernels: Kernels,
    program: FusedProgram,
    num_warps: int | str,
    lanes: int | str | None,
    backward: bool = False,
) -> Launch:
    """The launch of a loop in ``program`` (:func:`program_of`'s): ``num_warps`` where given,
    else (``"auto"``) the program's; the stages, the step-ahead loads and the steps an
    iteration (the forward's, or the ``backward``'s loop's) are the profile's."""
    return Launch(
        num_warps=program.num_warps if num_warps == AUTO else int(num_warps),
        num_stages=kernels.fused_num_stages,
        lanes=lanes_of(kernels, lanes),
        prefetch=kernels.fused_prefetch,
        unroll=kernels.fused_backward_unroll if backward else kernels.fused_unroll,
    )


def lanes_of(kernels: Kernels, lanes: int | str | None) -> int | None:
    """``lanes`` where given, else (``"auto"``) the profile's."""
    return kernels.fused_lanes if lanes == AUTO else lanes  # type: ignore[return-value]


def launch_fields(num_warps: int | str, lanes: int | str | None, backend: str = AUTO) -> list[str]:
    """The ``repr`` fields of a fused loop's launch settings that are not the profile's."""
    fields = [f"num_warps={num_warps}"] if num_warps != AUTO else []
    fields += [f"lanes={lanes}"] if lanes != AUTO else []
    return fields + ([f"backend={backend!r}"] if backend != AUTO else [])
