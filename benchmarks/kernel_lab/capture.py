"""The kernels the library would launch on an NVIDIA GPU, captured as Triton IR on a CPU.

Each :class:`Spec` is one fused loop of one cell: the forward (``bppsa.Fused()``) or the
sequential backward (``bppsa.FusedSequential()``), of one example or of a batch under
``jax.vmap``. :func:`capture` lowers its program for CUDA under an abstract GPU device (no GPU
is needed: JAX lowers Pallas kernels in Python) with the profile's envelope lifted, so that
kernels past it are captured too, and keeps the Triton IR (TTIR) that Pallas hands to XLA, as
text: the compiler (:mod:`benchmarks.kernel_lab.compile`) reads it as it is. The one reader of
JAX's internals here is :func:`_triton_modules` (the lowering function it wraps); it raises
where they moved.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import sys
from collections.abc import Callable, Iterator
from typing import Any

import jax
import jax.numpy as jnp

import bppsa
from benchmarks._fused_rows import CELLS

LOOPS = ("forward", "backward")
LENGTH = 1000
BATCH = 16
INPUTS = 8
# The device the programs are lowered for (no such device is needed).
DEVICE_KIND = "NVIDIA H200"
PLATFORM = "gpu"  # bppsa's profile key for a GPU whose toolkit JAX cannot name here


@dataclasses.dataclass(frozen=True)
class Spec:
    """One fused loop: ``loop`` (``"forward"``/``"backward"``) of ``cell`` with ``hidden``
    units, over ``LENGTH`` steps, of one example or (``batched``) ``BATCH`` under
    ``jax.vmap``, with or without the step-ahead loads (``prefetch``,
    ``Kernels.fused_prefetch``; the name does not say it, the rows do)."""

    cell: str
    hidden: int
    loop: str
    batched: bool
    prefetch: bool = True

    @property
    def name(self) -> str:
        return f"{self.cell}-h{self.hidden}-{self.loop}" + ("-b" if self.batched else "")


@dataclasses.dataclass(frozen=True)
class Captured:
    """A kernel's Triton IR as lowered.

    Attributes:
        ttir: the TTIR module's text.
        grid: programs launched.
    """

    spec: Spec
    ttir: str
    grid: int


def program(spec: Spec, num_warps: int | str = "auto") -> tuple[Callable, tuple]:
    """The function and arguments whose lowering holds ``spec``'s kernel (and only it),
    launched with ``num_warps`` (the kernel's code depends on them: the order of its sums)."""
    kind, cell = CELLS[spec.cell]
    params = kind.init(INPUTS, spec.hidden, key=jax.random.key(0))
    init = kind.initial_state(spec.hidden)
    xs = jnp.zeros((BATCH, LENGTH, INPUTS), jnp.float32)

    def body(state, x):
        return cell(params, state, x), None

    if spec.loop == "forward":
        forward = bppsa.Fused(num_warps=num_warps)

        def one(x):
            return kind.output(bppsa.scan(body, init, x, forward=forward)[0])

    else:

        def loss(p, x):
            def step(state, xt):
                return cell(p, state, xt), None

            final = bppsa.scan(step, init, x)[0]
            return jnp.sum(kind.output(final))

        def one(x):
            method = bppsa.FusedSequential(num_warps=num_warps)
            return bppsa.grad(loss, method=method)(params, x)

    if spec.batched:
        return jax.vmap(one), (xs,)
    return one, (xs[0],)


def planned(spec: Spec, profile: bppsa.Profile) -> tuple[Any, str | None]:
    """The library's plan of ``spec``'s loop on ``profile``: ``(loop, None)`` or
    ``(None, why not)``."""
    from bppsa.scan._core.fused import backward
    from bppsa.scan._core.problem import prepare

    kind, cell = CELLS[spec.cell]
    params = kind.init(INPUTS, spec.hidden, key=jax.random.key(0))
    init = kind.initial_state(spec.hidden)
    xs = jnp.zeros((LENGTH, INPUTS), jnp.float32)
    problem, _ = prepare(
        lambda s, x: (cell(params, s, x), None), init, xs, None, reverse=False, batch=None
    )
    if spec.loop == "forward":
        plan = bppsa.Fused().prepare(problem, profile)
        return (None, plan) if isinstance(plan, str) else (plan.loop, None)
    made = backward.plan(problem, profile.kernels, "auto", "auto")
    if isinstance(made, str):
        return None, made
    loop = made.reverse(False).loop
    return (None, loop) if isinstance(loop, str) else (loop, None)


UNBOUNDED = 1 << 62


def lifted(profile: bppsa.Profile, prefetch: bool = True) -> bppsa.Profile:
    """``profile`` with its envelope out of the way (every size admitted, at any warps) and
    the step-ahead loads ``prefetch``."""
    programs = (bppsa.FusedProgram(1, UNBOUNDED, UNBOUNDED),)
    kernels = dataclasses.replace(profile.kernels, fused_programs=programs, fused_prefetch=prefetch)
    return dataclasses.replace(profile, kernels=kernels)


def _triton_modules():
    from jax._src.pallas.triton import lowering

    return lowering


@contextlib.contextmanager
def _recording() -> Iterator[list[dict[str, Any]]]:
    """Inside the block every Pallas Triton kernel lowered is recorded: its name, TTIR text
    and grid."""
    lowering = _triton_modules()
    original = lowering.lower_jaxpr_to_triton_module
    records: list[dict[str, Any]] = []

    def recorded(*args, **kwargs):
        result = original(*args, **kwargs)
        caller = sys._getframe(1).f_locals
        records.append(
            {
                "name": caller.get("name"),
                "ttir": result.module.operation.get_asm(),
                "grid": math.prod(result.grid),
            }
        )
        return result

    lowering.lower_jaxpr_to_triton_module = recorded
    try:
        yield records
    finally:
        lowering.lower_jaxpr_to_triton_module = original


@contextlib.contextmanager
def abstract_gpu() -> Iterator[None]:
    """Lowering for CUDA under an abstract GPU (``DEVICE_KIND``), with no GPU here."""
    from jax._src.mesh import AbstractDevice, AbstractMesh

    mesh = AbstractMesh(
        (1,),
        ("x",),
        axis_types=(jax.sharding.AxisType.Explicit,),
        abstract_device=AbstractDevice(device_kind=DEVICE_KIND, num_cores=132, platform="gpu"),
    )
    with jax.sharding.use_abstract_mesh(mesh):
        yield


def footprint(spec: Spec) -> Any:
    """The footprint (tile, resident) of ``spec``'s loop, which the envelope compares."""
    from bppsa.scan._profile import built_in

    wide, _ = planned(spec, lifted(built_in("cuda")))
    if wide is None:
        raise RuntimeError(f"{spec.name}: the fused kernel cannot run it at all")
    return wide.footprint


def capture(
    spec: Spec, profile: bppsa.Profile | None = None, num_warps: int | str = "auto"
) -> Captured:
    """``spec``'s kernel as the library would launch it on ``profile`` (default: the built-in
    NVIDIA GPU profile) with ``num_warps`` (``"auto"``: the profile's), lowered with the
    envelope lifted (its footprint: :func:`footprint`; the profile's plan of it:
    :func:`planned`).

    Raises:
        RuntimeError: the lowered program holds no fused kernel, or more than one.
    """
    from bppsa.scan._profile import built_in

    profile = profile or built_in("cuda")
    saved = bppsa.get_profile(PLATFORM)
    bppsa.set_profile(PLATFORM, lifted(profile, spec.prefetch))
    try:
        fn, args = program(spec, num_warps)
        with _recording() as records, abstract_gpu():
            jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",))
    finally:
        bppsa.set_profile(PLATFORM, None if saved is built_in(PLATFORM) else saved)
    kernel = f"bppsa_fused_{spec.loop}"
    found = [r for r in records if r["name"] == kernel]
    if len(found) != 1:
        names = [r["name"] for r in records]
        raise RuntimeError(f"{spec.name}: expected one {kernel} kernel, lowered {names}")
    return Captured(spec, found[0]["ttir"], found[0]["grid"])
