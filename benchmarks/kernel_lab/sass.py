"""Reading the compiler's output: ``ptxas -v``'s log and ``cuobjdump -sass``'s listing.

A kernel's *resources* come from the log (registers a thread, spill bytes, stack frame, shared
memory); its *time loop* from the listing: of the loops (from a backward branch's target to the
branch), the one with the most floating-point work (the fused loops' ``fori_loop`` over the
steps; Triton unrolls everything inside a step, and the kernel's other loops only move data),
and the steps an iteration of it runs (LLVM unrolls a small body). Each instruction keeps the
control word the compiler scheduled it with (Volta and newer, the high 23 bits of its second
64-bit word): the stall cycles before the next instruction issues, the scoreboard a
variable-latency result sets (``write``), the one a source read releases (``read``) and the
scoreboards it waits on (``wait``), as decoded by Jia et al., "Dissecting the NVIDIA Volta GPU
architecture via microbenchmarking" (2018), Section 2.2; :mod:`benchmarks.kernel_lab.model`
walks them.
"""

from __future__ import annotations

import dataclasses
import re
from collections import Counter
from collections.abc import Sequence

NO_SCOREBOARD = 7

_LINE = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;\s*/\*\s*0x([0-9a-f]{16})\s*\*/")
_HIGH = re.compile(r"^\s*/\*\s*0x([0-9a-f]{16})\s*\*/\s*$")
_PREDICATE = re.compile(r"^(@!?U?P[T0-9]+)\s+")
_REGISTERS = re.compile(r"Used (\d+) registers")
_SPILLS = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_SHARED = re.compile(r"(\d+) bytes smem")
_BRANCH = re.compile(r"^BRA(?:\.\S+)?\s+(?:`\(\.L_x_\d+\)\s*)?0x([0-9a-f]+)")


@dataclasses.dataclass(frozen=True)
class Resources:
    """What ``ptxas -v`` says of one kernel (a thread's registers, bytes a thread)."""

    registers: int
    spill_stores: int
    spill_loads: int
    stack: int
    shared: int

    @property
    def spills(self) -> bool:
        return self.spill_stores > 0 or self.spill_loads > 0


def resources(log: str) -> Resources:
    """The resources of the one kernel ``ptxas -v``'s ``log`` describes.

    Raises:
        ValueError: the log has no register count (not a ``-v`` log of one kernel).
    """
    registers = _REGISTERS.findall(log)
    if len(registers) != 1:
        raise ValueError(f"expected one 'Used N registers' line in the ptxas log, got {registers}")
    spill = _SPILLS.search(log)
    stack, stores, loads = (int(g) for g in spill.groups()) if spill else (0, 0, 0)
    shared = _SHARED.search(log)
    return Resources(int(registers[0]), stores, loads, stack, int(shared.group(1)) if shared else 0)


@dataclasses.dataclass(frozen=True)
class Instruction:
    """One SASS instruction and its control word.

    Attributes:
        address: its byte offset in the kernel.
        opcode: the mnemonic with its modifiers (``LDG.E.128``), without the predicate.
        operands: the text after the mnemonic.
        predicated: whether a predicate guards it (``@P0``).
        stall: cycles before the warp's next instruction issues.
        write: the scoreboard its result sets (``NO_SCOREBOARD``: a fixed-latency result).
        read: the scoreboard its sources' read releases.
        wait: the scoreboards it waits on before issuing.
    """

    address: int
    opcode: str
    operands: str
    predicated: bool
    stall: int
    write: int
    read: int
    wait: frozenset[int]

    @property
    def base(self) -> str:
        """The mnemonic without modifiers (``LDG``)."""
        return self.opcode.split(".")[0]


def _control(high: int) -> tuple[int, int, int, frozenset[int]]:
    bits = high >> 41
    wait = (bits >> 11) & 0x3F
    return (
        bits & 0xF,
        (bits >> 5) & 0x7,
        (bits >> 8) & 0x7,
        frozenset(i for i in range(6) if wait >> i & 1),
    )


def instructions(listing: str) -> list[Instruction]:
    """The instructions of the one kernel in ``cuobjdump -sass``'s ``listing``, in order."""
    out: list[Instruction] = []
    lines = listing.splitlines()
    for i, line in enumerate(lines):
        match = _LINE.search(line)
        if match is None:
            continue
        address, text = int(match.group(1), 16), match.group(2).strip()
        high = _HIGH.match(lines[i + 1]) if i + 1 < len(lines) else None
        if high is None:
            raise ValueError(f"instruction at {address:#x} has no control word on the next line")
        predicate = _PREDICATE.match(text)
        if predicate:
            text = text[predicate.end() :]
        opcode, _, operands = text.partition(" ")
        out.append(
            Instruction(
                address,
                opcode,
                operands.strip(),
                bool(predicate),
                *_control(int(high.group(1), 16)),
            )
        )
    if not out:
        raise ValueError("no SASS instructions found in the listing")
    return out


def loops(code: Sequence[Instruction]) -> list[list[Instruction]]:
    """Every loop of ``code``: the instructions from a backward branch's target to the branch."""
    out = []
    for i, ins in enumerate(code):
        if ins.base != "BRA":
            continue
        match = _BRANCH.match(f"{ins.opcode} {ins.operands}")
        if match is None:
            continue
        target = int(match.group(1), 16)
        if target >= ins.address:  # a forward jump or the final self-loop
            continue
        start = next(j for j, other in enumerate(code) if other.address >= target)
        out.append(list(code[start : i + 1]))
    return out


def arithmetic(loop: Sequence[Instruction]) -> int:
    """Floating-point and special-function instructions of ``loop``."""
    return sum(1 for ins in loop if ins.base[0] in "FH" or ins.base == "MUFU")


def time_loop(code: Sequence[Instruction]) -> list[Instruction]:
    """The instructions of ``code``'s time loop, in order: of its loops, the one with the most
    floating-point work (the step's), the widest among equals. A kernel's other loops move
    data (LLVM turns the stores of lanes known to be zero into a loop of their own).

    Raises:
        ValueError: ``code`` has no backward branch.
    """
    found = loops(code)
    if not found:
        raise ValueError("no backward branch: the kernel has no loop")
    return max(found, key=lambda loop: (arithmetic(loop), len(loop)))


_COUNTER = re.compile(r"^(U?R\d+), U?P\d, \1, (-?0x[0-9a-f]+)")
_IMMEDIATE = re.compile(r"(-?)0x([0-9a-f]+)")


def _signed(text: str) -> int | None:
    match = _IMMEDIATE.search(text)
    if match is None:
        return None
    value = int(match.group(2), 16)
    if value >= 1 << 31:  # a 32-bit two's complement
        value -= 1 << 32
    return -value if match.group(1) else value


def steps_per_iteration(
    loop: Sequence[Instruction], code: Sequence[Instruction], length: int
) -> int:
    """Steps one iteration of the time loop ``loop`` (of ``code``, a loop of ``length`` steps)
    runs: LLVM unrolls a small body, the trip count being known. The loop's 64-bit counter
    (``IADD3 R, P, R, k``, counting up or down) runs ``span / |k|`` iterations, its span the
    bound it is compared with or, where it counts up to zero, the value it starts from (set
    before the loop); counting down, from the value it starts from to the bound; 1 where the
    counter, or the start of one counting down, is not found."""
    counter = None
    for ins in reversed(loop):
        if ins.base in ("IADD3", "UIADD3") and (match := _COUNTER.match(ins.operands)):
            counter = match.group(1), _signed(match.group(2))
            break
    if counter is None or not counter[1]:
        return 1
    register, increment = counter
    bound = None
    for ins in loop:
        operands = [o.strip() for o in ins.operands.split(",")]
        if ins.base in ("ISETP", "UISETP") and register in operands:
            bound = next((_signed(o) for o in operands if o.startswith(("0x", "-0x"))), bound)
    start = None
    for ins in code:
        if ins.address >= loop[0].address:
            break
        if ins.operands.startswith(f"{register},") and ins.base in ("MOV", "UMOV", "IMAD"):
            start = _signed(ins.operands.split(",")[-1])
    if increment < 0:  # counting down: the span needs where it starts
        span = None if start is None else abs(start - (bound or 0))
    else:
        span = abs(bound) if bound else (None if start is None else abs(start))
    if not span:
        return 1
    iterations = span / abs(increment)
    return max(1, round(length / iterations))


# The instruction mix's classes: mnemonic -> class (everything else counts as "other").
CLASSES = {
    "LDG": "global_loads",
    "STG": "global_stores",
    "LDS": "shared_loads",
    "LDSM": "shared_loads",
    "STS": "shared_stores",
    "LDL": "local_loads",
    "STL": "local_stores",
    "BAR": "barriers",
    "SHFL": "shuffles",
    "MUFU": "special_functions",
}
MIX = tuple(dict.fromkeys(CLASSES.values()))


def mix(loop: Sequence[Instruction]) -> dict[str, int]:
    """Counts of ``loop``'s instructions by class (:data:`MIX`), and ``total``."""
    counts = Counter(CLASSES.get(ins.base, "other") for ins in loop)
    return {name: counts.get(name, 0) for name in MIX} | {"total": len(loop)}
