"""The memory model of a scan's backward pass: its footprint, the model's constants, bytes.

The backward methods trade memory for depth: ``Blelloch()`` forms about ``T`` dense products of
``n x n`` Jacobians, ``Chunked()`` keeps ``O(sqrt T)`` of them, a blocked sequential scan
(``Blocked(SequentialScan(), K)``) none.
When the backward pass of a scan is about to be traced,
:func:`bppsa.scan._core.methods.policy.fit` estimates what the method needs for that scan (its
``memory``, from the model here) and compares it with a limit (the user's ``memory_limit``,
else the default device's memory, :func:`capacity_bytes`: a constant of the device, so that the
choice does not depend on what else was allocated when the scan was traced; the user's
``"available"``, :func:`available_bytes`, is read once, when the options are made). Too much: an
automatic method (``bppsa.Auto()``) switches to the largest lower-memory method that fits, and
raises where none does; an explicit one raises :class:`MemoryLimitError` with the estimate, the
limit and the alternatives that fit. Plain back-propagation is held to the limit too (``lax.scan``'s
residuals), but for a complex carry, which only it supports.

The estimate is a model, not a measurement: bytes of the arrays the scan's forward and backward
keep alive at their peak (the carries kept for the backward, the Jacobians and the per-step
intermediate arrays of one time block, the dense products of a parallel scan), with constants
fitted to XLA's compiled memory analysis on CPU (RNN, GRU, LSTM and autodiff Jacobians; tested
to stay within 0.5x..2.5x of it in ``tests/test_memory.py``). It covers one scan, not the rest
of the program, and counts the ``jax.vmap`` batch the scan is traced under (a scan inside a
``jax.jit`` that is itself vmapped sees one example; ``bppsa.scan(..., batch=B)`` says it).
"""

from __future__ import annotations

import dataclasses
import math
import os

import jax

from bppsa.scan._elements import MapStack

# Model constants, in floats per time step (see the module docstring for how they were fitted).
RESIDUAL_STATES = 2.0  # the carries kept for the backward, and one copy of them
SPAN_ELEMENTS = 2.5  # per step of a block: the stacked Jacobians and their VJP's arrays
SPAN_STATES = 2.0  # per step of a block: cotangents and the VJP's state-sized arrays
BLELLOCH_DENSE = 1.6  # Blelloch: the up-sweep levels' dense products (about T maps) and operands
CHUNK_DENSE = 3.0  # Chunked: per chunk, its aggregate and the Blelloch scan over them
BP_STATES = 3.0  # plain back-propagation through lax.scan: residuals per step (approximate)
# A footprint's fused_backward before anyone asked the kernel (a footprint of numbers, too).
NOT_CHECKED = "not checked"


class MemoryLimitError(MemoryError):
    """The backward pass of a scan would need more memory than the limit allows.

    Attributes:
        estimate: bytes the method was estimated to need.
        limit: the limit in bytes.
        alternatives: ``[(method, bytes)]`` of lower-memory methods that fit.
    """

    def __init__(self, message: str, estimate: int, limit: float, alternatives: list):
        super().__init__(message)
        self.estimate = estimate
        self.limit = limit
        self.alternatives = alternatives


@dataclasses.dataclass(frozen=True)
class Footprint:
    """What the choice of a method and the memory of one scan's backward depend on.

    Attributes:
        length: ``T``, the number of steps.
        state: floats of the packed carry of one example (batch dims inside the carry included).
        element: floats of one step's transposed Jacobian as stored (structured or dense).
        dense: floats of a product of two steps' maps (what parallel products form): ``n^2``
            per example, or the element's own floats for types whose products keep their
            structure (diagonal, block-diagonal).
        itemsize: bytes per float.
        batch: examples served at once through ``jax.vmap``.
        size: the state size ``n`` that ``Auto.choose`` sees.
        inputs: floats of one step's floating-point ``xs`` for one example.
        vmapped: whether the scan runs under ``jax.vmap`` (of size 1 too).
        width: the inner dimension of such a product (``n`` for dense maps, ``k`` for
            ``k x k`` blocks, ``1`` for diagonals; ``0``: ``size``).
        structure: the name of a structure the maps keep through products (``"diagonal"``,
            ``"block-diagonal k=2"``), ``None`` for none.
        kept: the steps whose carries the forward keeps for the backward (``None``:
            ``length``): a method that runs its backward in parts (time blocks, a device's
            slice) weighs one part's ``length`` with the whole scan's ``kept`` (:meth:`part`).
        complex_leaves: the carry's complex leaves, as ``"complex64[3]"`` (only plain
            back-propagation supports them).
        fused_backward: why ``FusedSequential()``'s kernel cannot run the scan's backward loop
            (:meth:`bppsa.FusedSequential.why_not`; ``None``: it can), by which the cost model
            ranks that method; :data:`NOT_CHECKED` unless a scan's decision asked.
        fused_backward_step, fused_forward_step: the kernel lab's static estimate of a step
            of ``FusedSequential()``'s and of ``bppsa.Fused()``'s loop, the
            :attr:`~bppsa.FusedProgram.step_latency` of the program the scan's plan launches
            (:func:`bppsa.scan._core.cost.fused_step`); ``None``: no plan was made (a
            footprint of numbers), or its program has no estimate.
    """

    length: int
    state: int
    element: int
    dense: int
    itemsize: int
    batch: int = 1
    size: int = 0
    inputs: int = 0
    vmapped: bool = True
    width: int = 0
    structure: str | None = None
    kept: int | None = None
    complex_leaves: tuple[str, ...] = ()
    fused_backward: str | None = NOT_CHECKED
    fused_backward_step: float | None = None
    fused_forward_step: float | None = None

    @property
    def product_width(self) -> int:
        """The inner dimension of a product of two maps (a product costs ``2 dense width``)."""
        return self.width or self.size

    @property
    def keeps_structure(self) -> bool:
        """Whether products of the maps keep a structure narrower than dense (``width < n``)."""
        return keeps_structure(self.size, self.width)

    @property
    def aggregate(self) -> int:
        """Floats of one chunk aggregate of ``Chunked()`` (a composed map and its offset): ``n``
        dense rows per carry float (:func:`bppsa.scan.aggregate`'s form), or for maps whose
        products keep a structure a product's floats plus the offset."""
        if self.keeps_structure:
            return self.dense + self.state
        return self.state * self.size

    @property
    def single(self) -> bool:
        """One example outside ``jax.vmap``, without batch dims in its carry."""
        return not self.vmapped and self.batch == 1 and self.state == self.size

    def describe(self) -> str:
        return (
            f"T={self.length}, {self.state} carry floats per example, {self.batch} vmapped "
            f"example{'s' if self.batch != 1 else ''}, {self.itemsize}-byte floats"
        )

    def bytes(self, floats: float) -> int:
        """Bytes of ``floats`` floats per example, over the batch."""
        return math.ceil(floats * self.itemsize * self.batch)

    def residual_floats(self) -> float:
        """The carries kept by the forward for the backward."""
        kept = self.length if self.kept is None else self.kept
        return RESIDUAL_STATES * kept * self.state

    def span_bytes(self, extra: float = 0.0) -> int:
        """Bytes of a backward that evaluates all its ``length`` steps at once: the carries
        kept, the steps' Jacobians, VJP arrays and cotangents, and ``extra`` floats per example
        (what the method's scan forms beside them)."""
        return self.bytes(self.residual_floats() + (self.span_floats(self.length) + extra))

    def part(self, steps: int) -> Footprint:
        """The footprint of ``steps`` of these steps run as one part of the backward (a time
        block, a device's slice): ``length=steps``, the same carries kept."""
        kept = self.length if self.kept is None else self.kept
        return dataclasses.replace(self, length=steps, kept=kept)

    def span_floats(self, steps: int) -> float:
        """Jacobians, VJP arrays and cotangents of ``steps`` steps evaluated at once."""
        return steps * (SPAN_ELEMENTS * self.element + SPAN_STATES * self.state)


def keeps_structure(size: int, width: int | None) -> bool:
    """Whether products of maps of ``size`` floats keep a structure of inner dimension ``width``
    narrower than dense (``None`` or ``0``: no structure)."""
    return width is not None and width > 0 and width < size


def footprint(
    jac_t: MapStack | None,
    state: int,
    length: int,
    itemsize: int,
    batch: int = 1,
    inputs: int = 0,
    vmapped: bool = True,
    complex_leaves: tuple[str, ...] = (),
) -> Footprint:
    """The footprint of a scan from the shape of its stacked Jacobians.

    Args:
        jac_t: the stacked transposed Jacobians (of arrays or ``jax.ShapeDtypeStruct``), or
            ``None`` (no differentiable carry; counted as dense ``state x state``).
        state: floats of the packed carry of one example.
        length: number of steps.
        itemsize: bytes per float.
        batch: vmapped examples.
        inputs: floats of one step's floating-point ``xs`` for one example.
        vmapped: whether the scan runs under ``jax.vmap``.
        complex_leaves: the carry's complex leaves, as ``"complex64[3]"``.
    """
    if jac_t is None:
        dense = state * state
        return Footprint(
            length,
            state,
            dense,
            dense,
            itemsize,
            batch,
            state,
            inputs,
            vmapped,
            complex_leaves=complex_leaves,
        )
    return Footprint(
        length,
        state,
        element=jac_t.floats_per_step(),
        dense=jac_t.dense_floats_per_step(),
        itemsize=itemsize,
        batch=batch,
        size=jac_t.size,
        inputs=inputs,
        vmapped=vmapped,
        width=jac_t.width,
        structure=jac_t.structure,
        complex_leaves=complex_leaves,
    )


# memory_limit's word for the default device's free memory, read when the options are made.
AVAILABLE = "available"


def capacity_bytes() -> float:
    """Memory of the default device, a constant of it: the allocator's limit on accelerators
    (``bytes_limit`` of its memory statistics), the host's physical memory on the CPU (``inf``
    when neither is known). The limit of a backward without a ``memory_limit``."""
    stats = _memory_stats()
    if stats and "bytes_limit" in stats:
        return float(stats["bytes_limit"])
    return _host_bytes("MemTotal:", "SC_PHYS_PAGES")


def available_bytes() -> float:
    """Free memory of the default device now: the allocator's limit minus what is in use on
    accelerators, the host's available memory on CPU (``inf`` when neither is known). What
    ``memory_limit="available"`` stands for, read when the options are made."""
    stats = _memory_stats()
    if stats and "bytes_limit" in stats:
        return float(stats["bytes_limit"] - stats.get("bytes_in_use", 0))
    return _host_bytes("MemAvailable:", "SC_AVPHYS_PAGES")


def _memory_stats() -> dict | None:
    """The memory statistics of the default device (``jax.default_device``'s, else the first
    local device's), or ``None`` where its backend keeps none."""
    default = getattr(jax.config, "jax_default_device", None)
    try:
        if default is None or isinstance(default, str):
            default = jax.local_devices(backend=default)[0]
        return default.memory_stats()
    except Exception:  # some backends do not implement memory statistics
        return None


def _host_bytes(meminfo_field: str, pages: str) -> float:
    """The host's memory: ``meminfo_field`` of ``/proc/meminfo``, else ``pages`` of
    ``os.sysconf`` (``inf`` when neither is known)."""
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith(meminfo_field):
                    return float(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return float(os.sysconf(pages) * os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):
        return math.inf


def limit_message(method, chosen, need, limit, limit_bytes, options, fp, bp_bytes, tried=()) -> str:
    """The text of a :class:`MemoryLimitError` (``tried``: ``[(method, bytes)]`` a policy tried
    after its choice, named where none fits)."""
    name = f"{method!r} (which chose {chosen!r})" if chosen is not method else repr(method)
    source = limit_source(limit)
    if options:
        fits = ", ".join(f"bppsa.{m!r} (~{human(b)})" for m, b in options)
        advice = f"Lower-memory methods that fit: {fits}."
    else:
        also = ", ".join(f"bppsa.{m!r} (~{human(b)})" for m, b in tried)
        advice = "No lower-memory backward method fits" + (f" (tried: {also})" if also else "")
        advice += "; use a shorter sequence or fewer examples."
    return (
        f"bppsa.scan: the backward pass with method={name} needs about {human(need)} "
        f"({fp.describe()}), more than the limit of {human(limit_bytes)} ({source}). {advice} "
        f"Plain back-propagation, bppsa.Sequential(), needs about {human(bp_bytes)}. Pass a "
        "method as method=..., or raise memory_limit (math.inf turns this check off)."
    )


def limit_source(limit: float | None) -> str:
    """Where a limit of ``limit`` (``None``: the default) came from, for messages."""
    return "the default device's memory" if limit is None else "memory_limit"


def human(nbytes: float) -> str:
    """``1.3 GB``-style sizes (decimal units)."""
    if not math.isfinite(nbytes):
        return str(nbytes)
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if nbytes >= scale:
            return f"{nbytes / scale:.3g} {unit}"
    return f"{int(nbytes)} B"
