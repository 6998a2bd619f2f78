"""A cost model of a scan's backward pass on a device: dependent steps, arithmetic, bytes.

Each backward method predicts, for a scan's :class:`~bppsa.scan._core.memory.Footprint`, the number
of dependent steps on its critical path (each one at least a kernel launch), the floating-point
operations and the bytes it moves; on a :class:`Profile` the time is

    steps x step latency + max(flops / rate, bytes / bandwidth)

This is the rule by which ``Auto()`` chooses on accelerators (see
:meth:`bppsa.Auto.predictions`). The counts are analytic, per method (``n`` the state size,
``B`` the vmapped batch, ``T`` the steps; ``dense`` = ``n^2`` floats per example):

* back-propagation (``lax.scan``): ``T`` steps of a ``(B, n) x (n, n)`` product;
* ``Blelloch()``: ``2 ceil(log2(T + 1))`` levels of a few kernels each, about ``T`` dense
  ``n x n`` products (``2 T B n^3`` flops) plus ``O(T B n^2)`` matrix-vector work;
* ``Chunked(C)``: ``2 ceil(T / C) + 2 ceil(log2 C)`` steps, ``2 (T - T/C) B n^2 (n + 1)``
  flops;
* ``SequentialScan()``: ``T`` matrix-vector steps, plus the Jacobians of all steps;
* ``FusedSequential()``: back-propagation's ``T`` steps in one kernel, each at the fused step
  latency (:func:`fused_step`) where the profile has one, plus two evaluations of all steps at
  once;
* ``Blocked(m, K)``: ``ceil(T / K)`` times ``m`` on ``K`` steps.

The rates are those of the backend's :class:`bppsa.Profile` (:mod:`bppsa.scan._profile`); the
accelerator one was fitted on one H200 (``benchmarks/results/gpu-h200/``). A step of BP counts
as one kernel here, where a compiled cell's step runs several (the GRU's 21 on that GPU): at
T = 10 and 30 the model prefers BP where ``Blelloch()`` measured faster.

A step of a fused loop (``bppsa.Fused()``, ``bppsa.FusedSequential()``: all steps in one
kernel) costs the profile's measured ``Rates.fused_step_latency`` where it has one; else the
kernel lab's static estimate (not a measurement) of the program the loop's plan launches
(:attr:`bppsa.FusedProgram.step_latency`, carried by the footprint:
:func:`fused_step`). A profile with neither, or without a fused backend, prices no fused loop
(:func:`fused_rated`), and ``Auto()`` and ``AutoForward()`` do not rank them there.
"""

from __future__ import annotations

import dataclasses
import math

from bppsa.scan._core.memory import Footprint
from bppsa.scan._profile import Profile

KERNELS_PER_LEVEL = 3  # a Blelloch level: the products, the offsets, the interleave


@dataclasses.dataclass(frozen=True)
class Cost:
    """Predicted work of one backward pass.

    Attributes:
        steps: dependent steps on the critical path.
        flops: floating-point operations.
        bytes: bytes read and written in device memory.
    """

    steps: float
    flops: float
    bytes: float

    def seconds(self, profile: Profile) -> float:
        """The predicted time on ``profile``'s rates."""
        rates = profile.rates
        throughput = max(self.flops / rates.flops, self.bytes / rates.bandwidth)
        return self.steps * rates.step_latency + throughput

    def times(self, blocks: float) -> Cost:
        return Cost(self.steps * blocks, self.flops * blocks, self.bytes * blocks)


def back_propagation(fp: Footprint) -> Cost:
    """``lax.scan``'s backward: ``T`` steps of a ``(B, n) x (n, n)`` product."""
    per_step = fp.batch * fp.dense
    return Cost(
        steps=fp.length,
        flops=2 * fp.length * per_step,
        bytes=fp.itemsize * fp.length * (4 * fp.batch * fp.state + fp.batch * fp.element),
    )


def jacobians(fp: Footprint, steps: int) -> Cost:
    """Building and storing the Jacobians and the VJP of ``steps`` steps at once."""
    floats = steps * fp.batch * (fp.element + 4 * fp.state)
    return Cost(steps=2, flops=4 * steps * fp.batch * fp.dense, bytes=3 * fp.itemsize * floats)


def sequential_scan(fp: Footprint, steps: int) -> Cost:
    """``steps`` matrix-vector steps over stored Jacobians."""
    return Cost(
        steps=steps,
        flops=2 * steps * fp.batch * fp.dense,
        bytes=fp.itemsize * steps * fp.batch * (fp.element + 2 * fp.state),
    )


def blelloch_scan(fp: Footprint, steps: int) -> Cost:
    """BPPSA's modified Blelloch scan of ``steps`` elements (a product of two maps forms
    ``dense`` floats of ``width`` multiply-adds each: ``n^3`` dense, ``n k^2`` blocks)."""
    levels = 2 * math.ceil(math.log2(steps + 1)) if steps else 0
    products = steps * fp.batch * fp.dense
    return Cost(
        steps=KERNELS_PER_LEVEL * levels,
        flops=2 * products * fp.product_width + 4 * products,
        bytes=3 * fp.itemsize * products,
    )


def chunked_scan(fp: Footprint, steps: int, chunks: int) -> Cost:
    """The chunked scan of ``steps`` elements in ``chunks`` chunks."""
    if chunks <= 1:
        return sequential_scan(fp, steps)
    per_chunk = math.ceil(steps / chunks)
    # Each map multiplies the aggregate (n + 1 dense rows, or a structured map and its offset).
    composed = (steps - per_chunk) * fp.batch * fp.dense
    if fp.keeps_structure:  # the aggregates keep the maps' structure, and so does their scan
        aggregates = dataclasses.replace(fp, length=chunks)
    else:  # dense rows whatever the element: a dense scan across them
        aggregates = dataclasses.replace(fp, length=chunks, dense=fp.aggregate, width=0)
    tree = blelloch_scan(aggregates, chunks)
    return Cost(
        steps=2 * per_chunk + tree.steps,
        flops=2 * composed * (fp.product_width + 1) + 2 * steps * fp.batch * fp.dense + tree.flops,
        bytes=fp.itemsize * 3 * (steps * fp.batch * fp.element + chunks * fp.batch * fp.aggregate)
        + tree.bytes,
    )


def footprint_of(
    length: int, size: int, batch: int, element: int | None = None, width: int | None = None
) -> Footprint:
    """The footprint of ``length`` steps of a float32 carry of ``size`` floats for ``batch``
    examples, whose Jacobian stores ``element`` floats per step (default dense, ``size**2``);
    ``width``: the inner dimension of a product of two maps (default ``size``: products are
    dense; ``1`` diagonal, ``k`` for ``k x k`` blocks, whose products keep ``element``)."""
    dense = size * size
    element = dense if element is None else element
    if width is None or width >= size:
        return Footprint(length, size, element, dense, 4, batch, size)
    return Footprint(length, size, element, element, 4, batch, size, width=width)


def sequential_forward(fp: Footprint) -> Cost:
    """``lax.scan``'s forward: ``T`` steps of a ``(B, n) x (n, n)`` product and the cell."""
    return Cost(
        steps=fp.length,
        flops=2 * fp.length * fp.batch * fp.dense,
        bytes=fp.itemsize * fp.length * fp.batch * 4 * fp.state,
    )


def fused_rated(profile: Profile) -> bool:
    """Whether ``profile`` prices a step of the fused loops: it has a fused backend, and a
    measured ``Rates.fused_step_latency`` or the kernel lab's estimates on its programs
    (:attr:`bppsa.FusedProgram.step_latency`)."""
    kernels = profile.kernels
    return kernels.fused_backend is not None and (
        profile.rates.fused_step_latency is not None
        or any(p.step_latency is not None for p in kernels.fused_programs)
    )


UNPRICED = (
    "its backend has no estimate of its step (its kernels are unmeasured) and the profile no "
    "measured fused_step_latency"
)


def unpriced(profile: Profile, estimate: float | None) -> str | None:
    """Why a fused loop that a plan runs, with ``estimate`` the static estimate of its step
    (``None``: its program has none, as Mosaic GPU's), is not ranked: neither that nor a
    measured ``Rates.fused_step_latency`` prices it (another backend's estimates do not);
    ``None``: it is priced."""
    if estimate is not None or profile.rates.fused_step_latency is not None:
        return None
    return UNPRICED


def fused_step(profile: Profile, estimate: float | None = None) -> float | None:
    """Seconds of one step of a fused loop on ``profile``: its measured
    ``Rates.fused_step_latency`` where set (a flat rate, which wins), else ``estimate`` (the
    static estimate of the program the loop's plan launches, a footprint's
    ``fused_backward_step`` or ``fused_forward_step``), else, without one (no plan: a
    footprint of numbers), the slowest of the profile's programs' estimates; ``None`` where
    the profile prices no fused loop (:func:`fused_rated`)."""
    if not fused_rated(profile):
        return None
    if profile.rates.fused_step_latency is not None:
        return profile.rates.fused_step_latency
    if estimate is not None:
        return estimate
    estimates = [p.step_latency for p in profile.kernels.fused_programs]
    return max(e for e in estimates if e is not None)


def fused_forward(fp: Footprint, profile: Profile) -> float | None:
    """Predicted seconds of ``bppsa.Fused()``'s forward: ``T`` fused steps (:func:`fused_step`
    of ``fp.fused_forward_step``: one kernel, the carry on chip) over ``lax.scan``'s
    arithmetic (``None`` where the profile prices no fused loop)."""
    latency = fused_step(profile, fp.fused_forward_step)
    if latency is None:
        return None
    work = sequential_forward(fp)
    return fp.length * latency + Cost(0, work.flops, work.bytes).seconds(profile)


def newton_forward(fp: Footprint, iterations: float, solver, shared: bool = False) -> Cost:
    """``bppsa.Newton()``: every iteration evaluates all steps with their Jacobians, checks the
    residuals and solves the linear recurrence by ``solver``'s scan (a method: its cost over
    the steps' Jacobians, which includes evaluating them); then the evaluation that certifies
    the last iterate. ``shared``: its Jacobians go to the backward, which then does not form
    them, so that evaluation is counted as the backward's saving (free)."""
    iteration = plus(solver.cost(fp), Cost(1, 0, 0))
    final = Cost(0, 0, 0) if shared else jacobians(fp, fp.length)
    return plus(iteration.times(iterations), final)


def plus(*costs: Cost) -> Cost:
    return Cost(*(sum(getattr(c, f) for c in costs) for f in ("steps", "flops", "bytes")))


def aggregate(fp: Footprint, steps: int) -> Cost:
    """Composing ``steps`` maps into one affine map (:func:`bppsa.scan.aggregate`): ``steps``
    dependent products of a map with the aggregate (``n`` dense rows and the offset)."""
    composed = steps * fp.batch * fp.dense
    return Cost(
        steps=steps,
        flops=2 * composed * (fp.product_width + 1),
        bytes=fp.itemsize * steps * fp.batch * (fp.element + 2 * fp.aggregate),
    )


def exchange(fp: Footprint, devices: int, rounds: int = 0) -> Cost:
    """``Sharded``'s exchange of the ``devices`` slices' aggregates: one ``all_gather`` and a
    fold of ``devices`` matrix-vector products (``rounds=0``), or ``rounds`` dependent
    neighbour exchanges each composing two aggregates (``ppermute``)."""
    moved = devices * fp.batch * fp.aggregate
    if rounds:
        products = rounds * fp.batch * fp.dense
        return Cost(
            steps=2 * rounds + 1,
            flops=2 * products * (fp.product_width + 1),
            bytes=fp.itemsize * 3 * rounds * fp.batch * fp.aggregate,
        )
    return Cost(
        steps=1 + devices, flops=2 * devices * fp.batch * fp.dense, bytes=fp.itemsize * moved
    )
