"""A cost model of a compiled JAX function, read from XLA's optimized HLO text.

``count(jax.jit(f).lower(*args).compile())`` walks the module from its ENTRY computation and
tallies the kernels it runs one after another (``steps``), their floating-point operations and
the bytes they move in device memory: the terms of :class:`bppsa.scan._core.cost.Cost`, measured on
the program XLA actually runs instead of derived by hand. :func:`fit_profile` then finds the
:class:`bppsa.Rates` under which such counts best predict measured times.

Rules: a ``fusion``, ``dot``, ``custom-call`` or any other op outside a fusion is one kernel that
reads its operands and writes its result (a ``dynamic-update-slice`` moves twice its update, in
place; a ``(dynamic-)slice`` twice its result; a fusion operand read only through slices counts
the slices, and a fused ``dynamic-update-slice`` into a parameter writes only its update). Its
flops are those of the dots (``2 x result x contracted``), elementwise ops (one per result element,
:data:`TRANSCENDENTAL_FLOPS` for ``tanh``, ``exp``, ...) and reductions (one per input element)
inside it. A ``while`` costs its body and condition times the ``known_trip_count`` XLA annotates
(else ``unknown_trip_count``, and it is counted in ``unknown_loops``); ``call`` costs its
computation; ``conditional`` the maximum over its branches, count by count.

Limits. XLA's HLO text is a debugging format, not a stable API: this parser was written against
JAX 0.10.2 (CPU and the GPU's cuBLAS calls as XLA prints them) and may silently miss costs on
another version. An unparsable line is skipped (its cost is lost), an unknown opcode is a
data-movement kernel. Every kernel counts as a dependent step (concurrent streams, async ops and
CUDA graphs are not modelled); bytes assume nothing stays in cache, and other partial reads
(gather, slices behind a bitcast) count the whole operand. Flops of convolutions, sorts, scatters
and custom calls other than cuBLAS matmuls are 0.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import re
from typing import Protocol

import numpy as np

from bppsa.scan._core.cost import Cost
from bppsa.scan._core.profiles import get_profile
from bppsa.scan._profile import Profile

# An assumption: a transcendental is evaluated as a short polynomial, a few FMAs on every device
# (XLA's own cost analysis counts them apart from flops).
TRANSCENDENTAL_FLOPS = 4


def _opcodes(names: str) -> frozenset[str]:
    return frozenset(names.split())


FREE = _opcodes(
    "parameter constant get-tuple-element tuple bitcast after-all partition-id replica-id "
    "optimization-barrier add-dependency"
)
TRANSCENDENTAL = _opcodes(
    "exponential exponential-minus-one log log-plus-one tanh logistic sqrt rsqrt cbrt power "
    "sine cosine tan atan2 erf divide"
)
ELEMENTWISE = TRANSCENDENTAL | _opcodes(
    "add subtract multiply remainder maximum minimum negate abs sign floor ceil compare select "
    "clamp and or xor not shift-left shift-right-arithmetic shift-right-logical popcnt "
    "count-leading-zeros is-finite round-nearest-afz round-nearest-even real imag complex iota "
    "map"
)
REDUCTIONS = frozenset({"reduce", "reduce-window"})
SLICES = frozenset({"dynamic-slice", "slice"})

_COMMENT = re.compile(r"/\*.*?\*/")
_HEADER = re.compile(r"(ENTRY\s+)?%?([\w.\-]+)\s*(\(.*\))?\s*->.*\{")
_INSTRUCTION = re.compile(r"(ROOT\s+)?%?([\w.\-]+)\s*=\s*(.*)")
_OPCODE = re.compile(r"\s*([\w\-]+)\(")
_ARRAY = re.compile(r"([a-z]\w*)\[([^\]]*)\]")
_METADATA = re.compile(r"metadata=\{[^}]*\}")
_TRIP_COUNT = re.compile(r'"known_trip_count":\{"n":"(\d+)"')
_GEMM_DIMS = re.compile(r'"lhs_contracting_dimensions":\[([^\]]*)\]')
_OPEN, _CLOSE = "([{", ")]}"


class Compiled(Protocol):
    def as_text(self) -> str: ...


@dataclasses.dataclass(frozen=True)
class HloCount:
    """What a compiled program does, as the cost model sees it.

    Attributes:
        steps: kernels executed one after another (each a dependent step).
        flops: floating-point operations.
        bytes: bytes read and written in device memory.
        unknown_loops: while loops without a known trip count (counted ``unknown_trip_count``
            times).
    """

    steps: int
    flops: float
    bytes: float
    unknown_loops: int = 0

    def cost(self) -> Cost:
        """These counts as a :class:`~bppsa.scan._core.cost.Cost`."""
        return Cost(self.steps, self.flops, self.bytes)


ZERO = HloCount(0, 0.0, 0.0)


@dataclasses.dataclass(frozen=True)
class _Instruction:
    name: str
    type: str
    opcode: str
    operands: tuple[str, ...]
    attrs: str


@dataclasses.dataclass
class _Computation:
    instructions: dict[str, _Instruction]
    root: str | None = None


def _depths(text: str) -> list[int]:
    """The bracket depth after each character of ``text``."""
    return list(itertools.accumulate((c in _OPEN) - (c in _CLOSE) for c in text))


def _closing(text: str, start: int) -> int:
    """The index of the bracket closing ``text[start]``, -1 if none."""
    return next((start + i for i, d in enumerate(_depths(text[start:])) if d == 0), -1)


def _split_top(text: str) -> list[str]:
    """``text`` split at the commas outside brackets."""
    cuts = [i for i, (c, d) in enumerate(zip(text, _depths(text))) if c == "," and d == 0]
    return [text[i + 1 : j] for i, j in zip([-1, *cuts], [*cuts, len(text)])]


def _parse_instruction(rest: str, name: str) -> _Instruction | None:
    """``f32[2,3]{1,0} op(%a, %b), attrs`` as an instruction; None where it does not parse."""
    if rest.startswith("("):
        end = _closing(rest, 0)
        type_, tail = rest[: end + 1], rest[end + 1 :]
    else:
        type_, _, tail = rest.partition(" ")
    opcode = _OPCODE.match(tail)
    end = _closing(tail, opcode.end() - 1) if opcode else -1
    if end < 0:
        return None
    # Older printers prefix each operand with its type: the name is the last word.
    parts = _split_top(tail[opcode.end() : end])
    operands = tuple(o.split()[-1].lstrip("%") for o in parts if o.strip())  # none: fusion()
    return _Instruction(name, type_, opcode.group(1), operands, _METADATA.sub("", tail[end + 1 :]))


def _parse(text: str) -> tuple[dict[str, _Computation], str | None]:
    """The computations of an HLO module by name, and the name of its ENTRY."""
    computations: dict[str, _Computation] = {}
    entry, current = None, None
    for raw in text.splitlines():
        line = _COMMENT.sub("", raw).strip()
        if current is None:
            if header := _HEADER.fullmatch(line):
                current = computations[header.group(2)] = _Computation({})
                entry = header.group(2) if header.group(1) else entry
        elif line == "}":
            current = None
        elif (match := _INSTRUCTION.match(line)) and (
            inst := _parse_instruction(match.group(3), match.group(2))
        ):
            current.instructions[inst.name] = inst
            current.root = inst.name if match.group(1) else current.root
    return computations, entry


def _arrays(type_: str) -> list[tuple[str, list[int]]]:
    """The (dtype, dims) of every array in a type (a tuple has several); ``<=N`` dims read N."""
    return [
        (dtype, [int(re.sub(r"\D", "", d) or 1) for d in dims.split(",") if d.strip()])
        for dtype, dims in _ARRAY.findall(type_)
    ]


def _elements(type_: str) -> int:
    return sum(math.prod(dims) for _, dims in _arrays(type_))


def _bytes(type_: str, *, first: bool = False) -> float:
    """The bytes of a type (``first``: of its first array only)."""

    def itemsize(dtype: str) -> float:  # the bit width is in the name: f32, bf16, s4, c64
        bits = re.search(r"\d+", dtype)
        return 1.0 if dtype == "pred" else int(bits.group()) / 8 if bits else 0.0

    arrays = _arrays(type_)[:1] if first else _arrays(type_)
    return sum(math.prod(dims) * itemsize(dtype) for dtype, dims in arrays)


def _called(inst: _Instruction, *keys: str) -> list[str]:
    """The computations named by ``key=%c`` or ``key={%a, %b}``, for each of ``keys``."""
    found = (re.search(rf"\b{k}=(\{{[^}}]*\}}|%?[\w.\-]+)", inst.attrs) for k in keys)
    return [c for m in found if m for c in re.findall(r"[\w.\-]+", m[1].replace("%", ""))]


def _contracted(lhs_type: str, dims: str) -> int:
    shape = (_arrays(lhs_type) or [("", [])])[0][1]
    return math.prod(shape[int(d)] for d in re.findall(r"\d+", dims) if int(d) < len(shape))


def _gemm_dims(inst: _Instruction) -> str | None:
    """A cuBLAS matmul's lhs contracting dims (GPU dots are custom calls), else None."""
    target = re.search(r'custom_call_target="([^"]*)"', inst.attrs)
    dims = _GEMM_DIMS.search(inst.attrs)
    is_gemm = target and ("gemm" in target.group(1) or "matmul" in target.group(1))
    return dims.group(1) if is_gemm and dims else None


def _op_flops(inst: _Instruction, types: dict[str, str]) -> float:
    """The flops of one instruction that calls nothing."""
    if inst.opcode == "dot" and (
        dims := re.search(r"lhs_contracting_dims=\{([^}]*)\}", inst.attrs)
    ):
        return 2.0 * _elements(inst.type) * _contracted(types.get(inst.operands[0], ""), dims[1])
    if inst.opcode == "custom-call" and (dims := _gemm_dims(inst)) is not None:
        result = _arrays(inst.type)[:1]  # the rest of the tuple is cuBLAS's workspace
        elements = math.prod(result[0][1]) if result else 0
        return 2.0 * elements * _contracted(types.get(inst.operands[0], ""), dims)
    if inst.opcode in ELEMENTWISE:
        per_element = TRANSCENDENTAL_FLOPS if inst.opcode in TRANSCENDENTAL else 1
        return float(per_element * _elements(inst.type))
    if inst.opcode in REDUCTIONS and inst.operands:
        return float(_elements(types.get(inst.operands[0], "")))
    return 0.0


def _plus(*counts: HloCount) -> HloCount:
    return HloCount(*(sum(getattr(c, f.name) for c in counts) for f in dataclasses.fields(ZERO)))


def _most(counts: list[HloCount]) -> HloCount:
    """The largest of each count over the branches of a conditional (an upper bound)."""
    fields = dataclasses.fields(ZERO)
    return HloCount(*(max((getattr(c, f.name) for c in counts), default=0) for f in fields))


def _fusion_bytes(inst: _Instruction, types: dict[str, str], fused: _Computation | None) -> float:
    """Bytes a fusion reads and writes, with slices and in-place updates of its parameters."""
    if fused is None or fused.root not in fused.instructions:
        return sum(_bytes(types.get(o, "")) for o in inst.operands) + _bytes(inst.type)
    body = fused.instructions
    params = {i.operands[0]: i.name for i in body.values() if i.opcode == "parameter"}
    root = body[fused.root]
    outputs = [body.get(o) for o in root.operands] if root.opcode == "tuple" else [root]
    written, in_place = 0.0, set()
    for out in outputs:
        if out and out.opcode == "dynamic-update-slice" and out.operands[0] in params.values():
            written += _bytes(body[out.operands[1]].type) if out.operands[1] in body else 0.0
            in_place.add(out.operands[0])
        else:
            written += _bytes(out.type if out else "")
    read = 0.0
    for index, operand in enumerate(inst.operands):
        param = params.get(str(index))
        if param in in_place:
            continue
        users = [i for i in body.values() if param in i.operands]
        if users and all(u.opcode in SLICES and u.operands[0] == param for u in users):
            read += sum(_bytes(u.type) for u in users)
        else:
            read += _bytes(types.get(operand, ""))
    return read + written


class _Walker:
    """Counts the computations of one module, each once (memoized; a cycle counts zero)."""

    def __init__(self, computations: dict[str, _Computation], unknown_trip_count: int):
        self.computations, self.unknown_trip_count = computations, unknown_trip_count
        self._memo: dict[tuple[str, bool], HloCount] = {}

    def count(self, name: str, fused: bool) -> HloCount:
        """A computation's count; ``fused``: inside a fusion, where only flops count."""
        key = (name, fused)
        if key not in self._memo:
            self._memo[key] = ZERO
            comp = self.computations.get(name, _Computation({}))
            types = {n: i.type for n, i in comp.instructions.items()}
            counts = [self._instruction(i, types, fused) for i in comp.instructions.values()]
            self._memo[key] = _plus(ZERO, *counts)
        return self._memo[key]

    def _instruction(self, inst: _Instruction, types: dict[str, str], fused: bool) -> HloCount:
        op = inst.opcode
        if op in FREE:
            return ZERO
        if op == "while":
            known = _TRIP_COUNT.search(inst.attrs)
            trip = int(known[1]) if known else self.unknown_trip_count
            loop = _plus(ZERO, *(self.count(c, fused) for c in _called(inst, "body", "condition")))
            scaled = (trip * getattr(loop, f) for f in ("steps", "flops", "bytes"))
            return HloCount(*scaled, loop.unknown_loops + (known is None))
        if op == "call" or (fused and op == "fusion"):
            return _plus(ZERO, *(self.count(c, fused) for c in _called(inst, "to_apply", "calls")))
        if op == "conditional":
            keys = ("branch_computations", "true_computation", "false_computation")
            return _most([self.count(c, fused) for c in _called(inst, *keys)])
        if fused:
            return HloCount(0, _op_flops(inst, types), 0.0)
        if op == "fusion":
            calls = _called(inst, "calls")
            body = self.computations.get(calls[0]) if len(calls) == 1 else None
            flops = sum(self.count(c, True).flops for c in calls)
            return HloCount(1, flops, _fusion_bytes(inst, types, body))
        if op == "dynamic-update-slice" and len(inst.operands) > 1:
            return HloCount(1, 0.0, 2 * _bytes(types.get(inst.operands[1], "")))
        if op in SLICES:
            return HloCount(1, 0.0, 2 * _bytes(inst.type))
        # A cuBLAS call's result is (product, workspace): the workspace is scratch.
        written = _bytes(inst.type, first=_gemm_dims(inst) is not None)
        read = sum(_bytes(types.get(o, "")) for o in inst.operands)
        return HloCount(1, _op_flops(inst, types), read + written)


def count(hlo: str | Compiled, *, unknown_trip_count: int = 1) -> HloCount:
    """Counts the kernels, flops and bytes of a compiled program.

    Args:
        hlo: XLA's optimized HLO text, or what has it as ``.as_text()``
            (``jax.jit(f).lower(*args).compile()``; a ``Lowered`` holds StableHLO, not this).
        unknown_trip_count: the trip count assumed for a while loop XLA does not know it of.

    Returns:
        The :class:`HloCount` of the ENTRY computation.
    """
    if not isinstance(hlo, str) and not hasattr(hlo, "as_text"):
        raise TypeError(f"hlo: expected HLO text or a compiled object, got {type(hlo).__name__}")
    text = hlo if isinstance(hlo, str) else hlo.as_text()
    if not isinstance(unknown_trip_count, int) or unknown_trip_count < 0:
        raise ValueError(f"unknown_trip_count: expected an int >= 0, got {unknown_trip_count!r}")
    computations, entry = _parse(text)
    if entry is None:
        raise ValueError("hlo: no ENTRY computation; pass jax.jit(f).lower(...).compile()")
    return _Walker(computations, unknown_trip_count).count(entry, fused=False)


# The search box, in log10 of: seconds per step, FLOP/s, B/s (wide enough for an accelerator:
# the H200's float32 GEMM ran at 3.9e14 FLOP/s); the coarse grid's step in decades.
BOUNDS = np.array([(-9.0, -3.0), (8.0, 16.0), (8.0, 13.0)])
GRID_STEP, REFINE_ROUNDS = 0.25, 12


def log_errors(costs: np.ndarray, log_measured: np.ndarray, params: np.ndarray) -> np.ndarray:
    """Squared log errors summed over samples ``costs`` (n, 3) of times ``exp(log_measured)``,
    for each row of ``params`` (k, 3): log10 step latency, FLOP rate, bandwidth."""
    latency, rate, bandwidth = (10.0 ** params[:, i, None] for i in range(3))
    throughput = np.maximum(costs[:, 1] / rate, costs[:, 2] / bandwidth)
    return ((np.log(costs[:, 0] * latency + throughput) - log_measured) ** 2).sum(axis=1)


def fit_profile(
    samples: list[tuple[Cost, float]], name: str, base: Profile | None = None
) -> Profile:
    """The profile whose predictions best fit measured times, in squared log error.

    A log-spaced grid search over the step latency (1 ns to 1 ms), the FLOP rate (1e8 to 1e16)
    and the bandwidth (1e8 to 1e13 B/s), refined by shrinking grids around the best point;
    deterministic. A constant that no sample is bound by is not determined by the fit.

    Args:
        samples: pairs of a :class:`Cost` and its measured time in seconds (> 0).
        name: the name of the profile.
        base: the profile whose other constants it keeps (default: the CPU's,
            ``bppsa.get_profile("cpu")``).

    Returns:
        ``base`` with the fitted rates and ``name``.
    """
    if not samples:
        raise ValueError("samples: expected at least one (Cost, seconds) pair")
    for cost, seconds in samples:
        if not (0 < seconds < math.inf) or max(cost.steps, cost.flops, cost.bytes) <= 0:
            raise ValueError(f"samples: need time > 0 and a nonzero cost, got {(cost, seconds)}")
    costs = np.array([(c.steps, c.flops, c.bytes) for c, _ in samples], dtype=float)
    log_measured = np.log([seconds for _, seconds in samples])
    axes = [np.arange(lo, hi + GRID_STEP / 2, GRID_STEP) for lo, hi in BOUNDS]
    grid = np.stack(np.meshgrid(*axes, indexing="ij"), axis=-1).reshape(-1, 3)
    best, step = grid[np.argmin(log_errors(costs, log_measured, grid))], GRID_STEP
    for _ in range(REFINE_ROUNDS):
        offsets = np.linspace(-2 * step, 2 * step, 9)
        local = np.stack(np.meshgrid(offsets, offsets, offsets, indexing="ij"), axis=-1)
        grid = np.clip(best + local.reshape(-1, 3), BOUNDS[:, 0], BOUNDS[:, 1])
        best, step = grid[np.argmin(log_errors(costs, log_measured, grid))], step / 2
    return with_rates(base or get_profile("cpu"), name, 10.0**best)


def with_rates(base: Profile, name: str, point) -> Profile:
    """``base`` with the cost model's rates of ``point = (latency, flops, bandwidth)`` (its
    other rates, such as the fused step latency, kept)."""
    latency, rate, bandwidth = point
    rates = dataclasses.replace(
        base.rates, flops=float(rate), bandwidth=float(bandwidth), step_latency=float(latency)
    )
    return dataclasses.replace(base, name=name, rates=rates)


def errors(samples: list[tuple[Cost, float]], profile: Profile) -> list[float]:
    """The measured / predicted time of every sample on ``profile`` (1 is a perfect fit)."""
    return [seconds / cost.seconds(profile) for cost, seconds in samples]
