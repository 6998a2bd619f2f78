"""Every constant fitted to a machine, one profile per backend, in one place.

A :class:`Profile` holds what ``bppsa`` measured rather than derived, in three parts: the cost
model's :class:`Rates`, ``Auto()``'s thresholds on CPUs (:class:`Rules`) and the
kernels' switches (:class:`Kernels`: the small-size switches, the sparse kernels' choices, the
fused loops' envelope). :data:`CPU` was measured on this project's 2-core CPUs, :data:`GPU` on
one NVIDIA H200 (its rates, by which ``Auto()`` ranks the methods on accelerators; its rules
and kernels keep the CPU's defaults, but for the fused loops' programs: the kernel lab's
envelope with its static estimates of a step, until measured). Each
field names, in a comment, the benchmark and the result file that measured it; the
measurements themselves are on the Performance page of the documentation.

:func:`bppsa.set_profile` replaces a backend's profile (e.g. one fitted by
``python -m benchmarks.tools.fit_profile`` on another machine) and :func:`bppsa.get_profile` reads
it (:mod:`bppsa.scan._core.profiles`); ``bppsa.Auto(profile=...)`` chooses by another profile
for one scan. The kernels never read a profile themselves: its :class:`Kernels` reach them
through :mod:`bppsa.scan._kernels`, entered by the scan's derivative rules.
"""

from __future__ import annotations

import dataclasses
import functools


def _check_number(owner: str, field: str, value, *, integer: bool = False, zero: bool = False):
    """Raises unless ``value`` is a number (an ``int`` if ``integer``) above zero (at least zero
    if ``zero``), naming ``owner`` and ``field``."""
    kind = "integer" if integer else "number"
    sign = "non-negative" if zero else "positive"
    if (
        isinstance(value, bool)
        or not isinstance(value, int if integer else int | float)
        or not (value >= 0 if zero else value > 0)
    ):
        raise ValueError(f"{owner}: {field} must be a {sign} {kind}, got {value!r}.")


def _check_range(owner: str, field: str, value, *, low: int = 1):
    """Raises unless ``value`` is a pair of integers ``(first, last)`` with
    ``low <= first <= last``, naming ``owner`` and ``field``."""
    if (
        not isinstance(value, tuple)
        or len(value) != 2
        or any(isinstance(v, bool) or not isinstance(v, int) for v in value)
        or not low <= value[0] <= value[1]
    ):
        raise ValueError(
            f"{owner}: {field} must be a pair of integers ({low} <= first <= last), got {value!r}."
        )


@dataclasses.dataclass(frozen=True)
class Rates:
    """The cost model's rates (:mod:`bppsa.scan._core.cost`): a method's predicted time is
    ``steps * step_latency + max(operations / flops, bytes / bandwidth)``.

    Attributes:
        flops: float32 operations per second.
        bandwidth: bytes per second of device memory.
        step_latency: seconds per dependent kernel.
        fused_step_latency: seconds per step of a fused loop, all steps in one kernel
            (``bppsa.Fused()``, ``bppsa.FusedSequential()``), measured on a device
            (``python -m benchmarks.tools.fit_profile --fused``): a flat rate, which wins over
            the kernel lab's static estimates of the programs
            (:attr:`FusedProgram.step_latency`); ``None``: the programs' estimates where they
            have one, else the cost model does not rank the fused loops.

    Raises:
        ValueError: a rate that is not a positive number (naming it).
    """

    flops: float
    bandwidth: float
    step_latency: float
    fused_step_latency: float | None = None

    def __post_init__(self):
        for field in ("flops", "bandwidth", "step_latency"):
            _check_number("Rates", field, getattr(self, field))
        if self.fused_step_latency is not None:
            _check_number("Rates", "fused_step_latency", self.fused_step_latency)


@dataclasses.dataclass(frozen=True)
class Rules:
    """``Auto()``'s measured thresholds: what it chooses by on a profile with
    ``measured_rules`` (CPUs), and the memory guard's and ``AutoForward()``'s constants.

    Attributes:
        block_work, block_steps: ``Auto()``'s time blocks hold about ``block_work`` Jacobian
            floats (summed over the batch), as a power of two within ``block_steps``.
        parallel_work: ``Auto()`` scans the Jacobians up to this many Jacobian floats per step
            over the batch, whatever the rest.
        single_element: for one example outside ``jax.vmap``, ``Auto()`` scans the Jacobians
            only where a step's Jacobian stores at least this many floats per carry float.
        long, parallel_state: from ``long`` steps, structured Jacobians stay parallel up to
            ``parallel_state`` carry floats per step over the batch.
        inputs, inputs_length, inputs_state: with ``inputs`` floats of ``xs`` per step or more,
            structured Jacobians stay parallel from ``inputs_length`` steps up to
            ``inputs_state[0]`` carry floats over the batch, from twice as many steps up to
            ``inputs_state[1]``.
        chain_sparse_cost: a multiply-add of the sequential sparse chain over layers, in units
            of one of the dense backward's; ``Auto()`` takes the chain where it wins by it.
        fallback_block: steps per block of the memory guard's lower-memory methods.
        structured_block_work, structured_block_steps: for maps whose products keep a
            structure (diagonal, block-diagonal), ``Auto()`` runs ``SequentialScan()`` in time
            blocks of about ``structured_block_work`` Jacobian floats over the batch
            (cache-sized: one unblocked scan over all steps thrashes the cache), a power of two
            within ``structured_block_steps``. Such a step of the scan is one elementwise
            product, so on CPUs the sequential order inside a block beats ``Blelloch()``'s
            levels; what pays is evaluating every step's Jacobian and VJP at once.

    Raises:
        ValueError: a threshold of the wrong kind or sign (naming it).
    """

    # benchmarks/speed.py, benchmarks/results/floor4/cpu_b{1,16}_run{1,2,3}.json
    block_work: int = 2**20
    block_steps: tuple[int, int] = (64, 8192)
    # benchmarks/speed.py, benchmarks/results/cpu_full_v2.json and floor3/
    parallel_work: int = 1024
    # benchmarks/total.py, benchmarks/results/one_core/total_run{1,2,3}.json
    single_element: float = 2.0
    long: int = 2048
    parallel_state: int = 4096
    # experiments/gru_irmas.py breakdown (the IRMAS page of the docs) and benchmarks/speed.py
    inputs: int = 2
    inputs_length: int = 256
    inputs_state: tuple[int, int] = (640, 1280)
    # experiments/pruned_vgg11.py benchmark, benchmarks/results/pruned_vgg11/benchmark_*.json
    chain_sparse_cost: float = 15.0
    # tests/test_memory.py's limits; benchmarks/speed.py memory columns
    fallback_block: int = 1024
    # benchmarks/width.py, the diagonal GRU at T = 4096, B = 4 (benchmarks/results/width/
    # cpu_sequential_blocks.json): SequentialScan() fastest at 64-512 steps for H = 256,
    # 64-128 for H = 1024, 32 for H = 4096
    structured_block_work: int = 2**19
    structured_block_steps: tuple[int, int] = (16, 8192)

    def __post_init__(self):
        for field in (
            "block_work",
            "parallel_work",
            "long",
            "parallel_state",
            "inputs",
            "inputs_length",
            "structured_block_work",
        ):
            _check_number("Rules", field, getattr(self, field), integer=True, zero=True)
        for field in ("fallback_block",):
            _check_number("Rules", field, getattr(self, field), integer=True)
        for field in ("single_element", "chain_sparse_cost"):
            _check_number("Rules", field, getattr(self, field), zero=True)
        for field in ("block_steps", "structured_block_steps"):
            _check_range("Rules", field, getattr(self, field))
        _check_range("Rules", "inputs_state", self.inputs_state, low=0)


SPGEMM_METHODS = ("auto", "padded", "bucketed", "segment")
SPMV_METHODS = ("padded", "segment")
# The fields of Kernels that launch the fused loops' kernels.
LAUNCH = ("fused_num_stages", "fused_unroll", "fused_backward_unroll")


@dataclasses.dataclass(frozen=True)
class FusedProgram:
    """One size of the fused loops' programs, and the largest loop it runs without spilling
    registers (entries after the backend's padding).

    Attributes:
        num_warps: warps in the program.
        max_tile: the largest array one operation of the loop may form.
        max_resident: the most the constants and the carry the program keeps loaded may hold.
        step_latency: seconds a step of the loops the program runs takes: a static estimate
            of the kernel lab (``python -m benchmarks.kernel_lab``, from the compiled
            kernels' instructions, not a measurement), the slowest of the lab's kernels this
            program launches. The cost model prices a fused loop's step at the estimate of
            the program its plan launches, unless the profile has a measured
            ``Rates.fused_step_latency``; ``None``: no estimate.

    Raises:
        ValueError: a field that is not a positive integer (naming it), or a ``step_latency``
            that is not a positive number.
    """

    num_warps: int
    max_tile: int
    max_resident: int
    step_latency: float | None = None

    def __post_init__(self):
        for field in ("num_warps", "max_tile", "max_resident"):
            _check_number("FusedProgram", field, getattr(self, field), integer=True)
        if self.step_latency is not None:
            _check_number("FusedProgram", "step_latency", self.step_latency)

    def holds(self, tile: int, resident: int) -> str | None:
        """Which limit a loop of ``tile`` and ``resident`` entries passes (``None``: none)."""
        if tile > self.max_tile:
            return (
                f"forms {tile} entries in one operation after padding (max_tile: {self.max_tile})"
            )
        if resident > self.max_resident:
            return (
                f"keeps {resident} entries of constants and carry loaded after padding "
                f"(max_resident: {self.max_resident})"
            )
        return None


# The kernel lab's envelope for sm_90a (H100, H200): python -m benchmarks.kernel_lab, the
# programs of benchmarks/results/kernel_lab/kernels.jsonl (benchmarks.kernel_lab.envelope).
# step_latency: the lab's static estimates (benchmarks/results/kernel_lab/summary.json), not
# measured.
SM90_PROGRAMS = (
    FusedProgram(num_warps=1, max_tile=4096, max_resident=4288, step_latency=4.15e-7),
    FusedProgram(num_warps=2, max_tile=4096, max_resident=12544, step_latency=4.22e-7),
    FusedProgram(num_warps=4, max_tile=16384, max_resident=16768, step_latency=7.84e-7),
    FusedProgram(num_warps=8, max_tile=16384, max_resident=49664, step_latency=4.93e-7),
)
# The same envelope without the estimates: the CPU's (Pallas' interpreter runs the cases the
# device would, but a step there is nothing like the device's).
SM90_ENVELOPE = tuple(dataclasses.replace(p, step_latency=None) for p in SM90_PROGRAMS)


@dataclasses.dataclass(frozen=True)
class Kernels:
    """The kernels' switches: what a product, an application of maps or a fused loop runs as.

    They reach the kernels through :mod:`bppsa.scan._kernels` (never by reading a profile while
    the kernels are traced).

    Attributes:
        small_rows, small_size: ``Structured.apply`` multiplies-and-sums for at most
            ``small_rows`` rows of at most ``small_size`` floats.
        small_unroll, small_unroll_rows: a sequential scan over such maps unrolls
            ``small_unroll`` steps for at most ``small_unroll_rows`` rows.
        tiled_one_row_unroll: steps a sequential scan over tiled maps unrolls for one row.
        folded_diagonal_rows: ``Structured.apply`` folds its diagonal term into the product
            for this range of rows.
        spgemm_method: the SpGEMM's numeric phase: ``"auto"`` (by the pairs per output entry),
            ``"padded"``, ``"bucketed"`` or ``"segment"``.
        spmv_method: the SpMV's: ``"padded"`` or ``"segment"``.
        densify_density: a sparse product is stored dense above this output density.
        densify_pair_ratio: a sparse product runs as a GEMM above this ratio of matched pairs
            to ``n0 n1 n2``.
        fused_programs: the envelope of the fused loops (``bppsa.Fused()``,
            ``bppsa.FusedSequential()``) and the warps their programs get: the
            :class:`FusedProgram` sizes, by warps, with the largest loop each runs without
            spilling. A loop whose warps are left to the profile (``num_warps="auto"``) gets
            the first that holds it (the fewest warps); one beyond the last runs in
            ``lax.scan`` (``why_not`` names the limit). A program's ``step_latency`` (the
            kernel lab's static estimate) prices the steps of the loops it runs, where the
            profile's rates have no measured ``fused_step_latency``. The CPU runs the kernels
            in Pallas' interpreter, which has no on-chip memory; it keeps the defaults,
            sm_90a's envelope without the estimates, so that the interpreter runs the cases a
            device would and the cost model prices no fused loop there.
        fused_backend: the fused loops' kernel backend (``"triton"``: Pallas' Triton backend,
            whose kernels run in Pallas' interpreter on the CPU; ``"mosaic_gpu"``: Pallas'
            Mosaic GPU backend, tensor cores on sm_90 and newer, with its own envelope, run in
            Mosaic GPU's interpreter on the CPU where JAX has it, docs/fused.md), or a tuple of
            names in order of preference (a loop runs on the first that runs it: its
            primitives, its envelope); ``None``: the platform has none, and the fused loops
            run in ``lax.scan``. ``bppsa.Fused(backend=...)`` and
            ``bppsa.FusedSequential(backend=...)`` force one.
        fused_num_stages, fused_lanes: the fused kernels' launch: the compiler's pipelining
            stages, and lanes of the carry per program where they are independent (``None``:
            one program per example).
        fused_prefetch: whether the fused loops load step ``t + 1``'s residuals during step
            ``t`` (``False``: each step loads its own, a load on the step's dependency chain).
        fused_unroll, fused_backward_unroll: steps a fused forward's (a fused backward's)
            kernel runs an iteration of its time loop, where the carry's lanes are not split
            into tiles (a tile's loop runs one: its step is small, and the compiler unrolls
            the loop itself).

    Raises:
        ValueError: a switch of the wrong kind, sign or name (naming it).
    """

    # benchmarks/speed.py (B = 1 to 16, H = 20), benchmarks/results/floor4/ and floor5/
    small_rows: int = 8
    small_size: int = 64
    small_unroll: int = 4
    small_unroll_rows: int = 4
    tiled_one_row_unroll: int = 2
    folded_diagonal_rows: tuple[int, int] = (2, 16)
    # benchmarks/tools/sparse_kernels.py, benchmarks/results/sparse_kernels_cpu.json
    spgemm_method: str = "auto"
    spmv_method: str = "segment"
    densify_density: float = 0.4
    densify_pair_ratio: float = 0.005
    # the kernel lab's envelope for sm_90a, without its estimates (SM90_ENVELOPE)
    fused_programs: tuple[FusedProgram, ...] = SM90_ENVELOPE
    fused_backend: str | tuple[str, ...] | None = "triton"
    # stages: 1, a fori_loop's loads do not pipeline (the kernel lab: identical code); lanes:
    # ASSUMED, one lane per thread of 4 warps
    fused_num_stages: int = 1
    fused_lanes: int | None = 128
    fused_prefetch: bool = True
    # the kernel lab (sm_90a): two steps an iteration lower the forward loops' step estimates
    # (one branch and counter for both, one step's end scheduled with the next one's start);
    # the backward's longer steps gain nothing
    fused_unroll: int = 2
    fused_backward_unroll: int = 1

    @property
    def fused_max_tile(self) -> int:
        """The largest program's ``max_tile``: no fused loop forms more."""
        return self.fused_programs[-1].max_tile

    @property
    def fused_max_resident(self) -> int:
        """The largest program's ``max_resident``: no fused loop keeps more loaded."""
        return self.fused_programs[-1].max_resident

    def __post_init__(self):
        for field in ("small_rows", "small_size", "small_unroll_rows"):
            _check_number("Kernels", field, getattr(self, field), integer=True, zero=True)
        for field in ("small_unroll", "tiled_one_row_unroll", *LAUNCH):
            _check_number("Kernels", field, getattr(self, field), integer=True)
        _check_programs(self.fused_programs)
        if not isinstance(self.fused_prefetch, bool):
            raise ValueError(
                f"Kernels: fused_prefetch must be a bool, got {self.fused_prefetch!r}."
            )
        if self.fused_lanes is not None:
            _check_number("Kernels", "fused_lanes", self.fused_lanes, integer=True)
        names = self.fused_backend
        listed = isinstance(names, tuple) and names and all(isinstance(n, str) for n in names)
        if not (names is None or isinstance(names, str) or listed):
            raise ValueError(
                "Kernels: fused_backend must be a backend's name (e.g. 'triton'), a non-empty "
                f"tuple of names in order of preference, or None, got {names!r}."
            )
        for field in ("densify_density", "densify_pair_ratio"):
            _check_number("Kernels", field, getattr(self, field), zero=True)
        _check_range("Kernels", "folded_diagonal_rows", self.folded_diagonal_rows, low=0)
        if self.spgemm_method not in SPGEMM_METHODS:
            raise ValueError(
                "Kernels: spgemm_method must be 'auto', 'padded', 'bucketed' or 'segment', got "
                f"{self.spgemm_method!r}."
            )
        if self.spmv_method not in SPMV_METHODS:
            raise ValueError(
                f"Kernels: spmv_method must be 'padded' or 'segment', got {self.spmv_method!r}."
            )


def _check_programs(programs) -> None:
    """Raises unless ``programs`` is a non-empty tuple of :class:`FusedProgram` with warps
    increasing."""
    if (
        not isinstance(programs, tuple)
        or not programs
        or not all(isinstance(p, FusedProgram) for p in programs)
    ):
        raise ValueError(
            f"Kernels: fused_programs must be a non-empty tuple of bppsa.FusedProgram, got "
            f"{programs!r}."
        )
    warps = [p.num_warps for p in programs]
    if warps != sorted(set(warps)):
        raise ValueError(
            f"Kernels: fused_programs must list programs by increasing num_warps, got {warps}."
        )


@dataclasses.dataclass(frozen=True)
class Profile:
    """The measured constants of one backend.

    Example:
        >>> rates = bppsa.Rates(flops=1e12, bandwidth=1e11, step_latency=1e-5)
        >>> profile = bppsa.Profile("my machine", rates, rules=bppsa.Rules(parallel_work=0))
        >>> profile.rules.parallel_work, profile.kernels.small_rows
        (0, 8)

    Attributes:
        name: what the profile describes (and whether its numbers are measured or assumed).
        rates: the cost model's :class:`Rates`.
        measured_rules: whether ``Auto()`` chooses by ``rules`` (CPUs) rather than by the cost
            model's predictions (accelerators).
        rules: ``Auto()``'s thresholds (:class:`Rules`).
        kernels: the element kernels' switches (:class:`Kernels`).

    Raises:
        TypeError: an argument of the wrong type (naming it).
    """

    name: str
    rates: Rates
    measured_rules: bool = False
    rules: Rules = Rules()
    kernels: Kernels = Kernels()

    def __post_init__(self):
        for field, kind in (
            ("name", str),
            ("rates", Rates),
            ("measured_rules", bool),
            ("rules", Rules),
            ("kernels", Kernels),
        ):
            value = getattr(self, field)
            if not isinstance(value, kind):
                raise TypeError(
                    f"Profile: {field} must be a {_spelled(kind)}, got {type(value).__name__} "
                    f"{value!r}."
                )


def _spelled(kind: type) -> str:
    return f"bppsa.{kind.__name__}" if kind.__module__ == __name__ else kind.__name__


# The 2-core CPUs of this project. The rates: python -m benchmarks.tools.fit_profile over
# benchmarks/results/floor2/cpu_b{1,16}_run{1,2,3}.json and cpu_long_b{1,16}.json
# (benchmarks/results/floor2/cpu_profile_fit.json).
CPU = Profile(
    "2-core CPU (fitted: 31.2 GFLOP/s, 84.0 GB/s, 41.2 ns per kernel)",
    Rates(flops=31.2e9, bandwidth=84.0e9, step_latency=41.2e-9),
    measured_rules=True,
)
# One NVIDIA H200 (benchmarks/results/gpu-h200/; its README says what the files get wrong). The
# rates: python -m benchmarks.tools.fit_profile --device --choices --flops gemm over speed_gpu.json,
# total_gpu.json, width_gpu.json and gpu_backward.jsonl there (whole gradients and pullbacks
# timed alone, never total - forward). Auto() ranks by nothing else on accelerators; of its
# picks over those files' 66 rows, only T = 10 and 30, B = 16 (speed_gpu.json t_sweep) lose more
# than 10%: BP where Blelloch was 1.1x (RNN T = 10) and 1.8-1.9x (GRU) faster, which no rates
# fix: the cost model counts a step of BP as one kernel (the compiled GRU's runs 21, the RNN's
# 11). Measured at JAX's default matmul precision (TF32 there): full precision needs a new fit.
GPU = Profile(
    "NVIDIA H200 (fitted on one H200, JAX 0.11.2, whole gradients and direct backwards: "
    "7.9 us per step, 392 TFLOP/s, 3.2 TB/s)",
    Rates(
        # speed_gpu.json gemm_gflops (one 8192^3 float32 GEMM); Blelloch first at RNN H = 1024,
        # B = 1 (h_sweep) needs at least 284 TFLOP/s
        flops=392e12,
        # fitted; Blelloch before Chunked() at GRU T = 1000, B = 256 (speed_gpu.json b_sweep)
        # needs at least 1.9 TB/s; the best time fit alone, 1.4 TB/s, would pick Chunked() there
        bandwidth=3.16e12,
        # fitted; BP's pullback takes 7.4-9.1 us per RNN step (gpu_backward.jsonl, B = 16); the
        # picks at RNN T = 1000, H = 1024, B = 1 and H = 256, B = 256 (h_sweep) need 5.8-24 us
        step_latency=7.94e-6,
        # not measured: a fused loop's step is priced at the kernel lab's static estimate of
        # the program it runs in (SM90_PROGRAMS' step_latency) until gpu.sh's forward rows
        # (fused_forward_gpu.jsonl) measure it: benchmarks.tools.fit_profile --fused
        fused_step_latency=None,
    ),
    # the fused loops' envelope, warps and step estimates: the kernel lab's for sm_90a
    # (SM90_PROGRAMS)
    kernels=Kernels(fused_programs=SM90_PROGRAMS),
)


# Any other platform (TPU, ROCm, METAL, ...): nothing measured there. ASSUMED, not measured: the
# H200's rates, placeholders until a fit on such a device replaces them (bppsa.set_profile);
# no fused_step_latency, and no fused kernel backend (the fused loops' lax.platform_dependent
# runs lax.scan there), so that Auto() and AutoForward() never rank the fused loops (the
# programs' estimates are sm_90a's, and price nothing without a backend).
ACCELERATOR = Profile(
    "an accelerator other than NVIDIA's (ASSUMED: the H200's rates; no fused kernels)",
    dataclasses.replace(GPU.rates, fused_step_latency=None),
    kernels=dataclasses.replace(GPU.kernels, fused_backend=None),
)
# The platforms GPU describes: JAX's name for CUDA, and its alias for any GPU.
NVIDIA = ("cuda", "gpu")


@functools.cache  # one object per platform: a profile compared by identity stays the same
def other_platform(platform: str) -> Profile:
    """:data:`ACCELERATOR` for ``platform`` by name (the fused loops' refusal names it)."""
    return dataclasses.replace(ACCELERATOR, name=f"{platform}: {ACCELERATOR.name}")


def built_in(platform: str) -> Profile:
    """The built-in profile of ``platform``: :data:`CPU` for ``"cpu"``, :data:`GPU` for NVIDIA
    GPUs (``"cuda"``, or JAX's alias ``"gpu"``), else :data:`ACCELERATOR` for ``platform``
    (:func:`other_platform`: ``"rocm"``, ``"tpu"``, ``"METAL"``, ...).

    Example:
        >>> built_in("cuda") is GPU, built_in("tpu").rates.fused_step_latency
        (True, None)
    """
    if platform == "cpu":
        return CPU
    if platform in NVIDIA:
        return GPU
    return other_platform(platform)
