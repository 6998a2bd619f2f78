"""The forward pass as each program compiles it: why a standalone jitted ``lax.scan`` forward can
run slower per step than the same forward inside a gradient (issue 33: on an H200, about 11 us
per step against 5.6-6.1 us at H = 20, B = 16).

For one configuration of :mod:`benchmarks.speed`'s problem (cell, T, B, H), compiles the
forward of the same loss as different programs:

* ``standalone``: ``benchmarks.speed``'s standalone forward, the jitted loss through one
  ``lax.scan`` over a batched state (no residuals kept);
* ``vjp``: the forward of ``jax.vjp`` of that loss, the forward inside BP's gradient (the
  program :class:`experiments.timing.GradientPrograms` times as ``forward``: the loss and the residuals);
* ``vmapped_standalone`` and ``vmapped_vjp``: the same with a ``lax.scan`` over one example,
  ``jax.vmap``-ed over the batch (how ``direct_backward.py`` beside the H200 results wrote BP);
* ``<method>_standalone`` and ``<method>_vjp``: BPPSA's loss (a ``bppsa.scan`` over one example
  with that method, ``jax.vmap``-ed), alone and as the forward of its ``jax.vjp``;

and prints, per program, its while loops read from the compiled HLO (``compiled.as_text()``):
the iterations (XLA's ``known_trip_count``; fewer than T means unrolled), what each loop carries,
and per iteration the kernels of its body (fusions with their kind and the ops fused into them,
dots, custom calls, copies; each one launch on a GPU) and of its condition; then the wall-clock
per call and per step (:func:`experiments.timing.interleaved`, medians), and on a GPU the device's kernel
time per call and per step (:func:`experiments.timing.kernel_time`; on a CPU the reason there is none).
Where the kernels' time per step is alike and the wall-clock is not, the difference is the
host's (launches, the loop's control), not the device's work.

A loop body's kernels decide how XLA's GPU runtime runs it: a run of at least
``--xla_gpu_graph_min_graph_size`` (5 by default) consecutive kernels it can capture becomes one
command buffer (a CUDA graph, one launch per iteration), fewer are launched one by one. On a GPU,
run this again with ``XLA_FLAGS=--xla_gpu_graph_min_graph_size=1`` (every body a graph) and with
``XLA_FLAGS=--xla_gpu_enable_command_buffer=`` (none): if the programs' wall-clock per step
moves together, command buffers are the difference. (The profiler may run programs without
their command buffers; the kernel times sum the kernels' own durations either way.)

Run: ``.venv/bin/python -m benchmarks.forward_programs --cell rnn --length 1000 --batch 16
--hidden 20`` (seconds on a CPU); ``--json FILE`` also writes what it prints.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import functools
import json
import os
import pathlib
import re
import statistics
import sys
from collections.abc import Callable, Iterator

import jax
import jax.numpy as jnp

from benchmarks import speed
from experiments import timing

# Instructions that launch nothing: they name, slice by address or group buffers.
FREE = frozenset(["parameter", "constant", "get-tuple-element", "tuple", "bitcast"])
_HEADER = re.compile(r"^(ENTRY )?%?([\w.\-]+) \(.*\{$")
_INSTRUCTION = re.compile(r"^(ROOT )?%?([\w.\-]+) = (.*)$")
_OPCODE = re.compile(r"^\s*([\w\-]+)\(")
_SHAPE = re.compile(r"\b([a-z]+\d*\[[\d,]*\])")


@dataclasses.dataclass(frozen=True)
class Kernel:
    """One instruction of a loop body that runs as its own kernel (or library call).

    Attributes:
        opcode: ``fusion``, ``dot``, ``custom-call``, ``copy``, ``while``, ...
        kind: a fusion's kind (``kLoop``, ``kInput``, ``kCustom``, and its backend's own kind,
            e.g. ``__triton_gemm``), a custom call's target; ``""`` otherwise.
        ops: the opcodes fused into it and how often (a fusion; empty otherwise).
    """

    opcode: str
    kind: str
    ops: tuple[tuple[str, int], ...] = ()

    def __str__(self) -> str:
        kind = f"[{self.kind}]" if self.kind else ""
        fused = ", ".join(f"{op} x{n}" if n > 1 else op for op, n in self.ops)
        return f"{self.opcode}{kind}" + (f"({fused})" if fused else "")


@dataclasses.dataclass(frozen=True)
class Loop:
    """A compiled ``while`` loop.

    Attributes:
        trip_count: XLA's ``known_trip_count`` (``None`` when XLA does not know it).
        carries: the shapes of the loop's state, in order (counter, carry, stacked outputs or
            residuals, loop-invariant operands).
        body: the kernels of one iteration of the body, in program order.
        condition: the kernels of one evaluation of the condition.
        inner: loops nested in the body.
    """

    trip_count: int | None
    carries: tuple[str, ...]
    body: tuple[Kernel, ...]
    condition: tuple[Kernel, ...]
    inner: tuple[Loop, ...] = ()


@dataclasses.dataclass
class _Instruction:
    name: str
    type: str
    opcode: str
    text: str


def _closing(text: str, start: int) -> int:
    depth = 0
    for i in range(start, len(text)):
        depth += (text[i] in "([{") - (text[i] in ")]}")
        if depth == 0:
            return i
    return -1


def computations(hlo: str) -> tuple[dict[str, list[_Instruction]], str | None]:
    """The instructions of every computation of an HLO module's text by name, and the name of
    its ENTRY computation."""
    found: dict[str, list[_Instruction]] = {}
    entry, current = None, None
    for raw in hlo.splitlines():
        line = raw.strip()
        if current is None:
            if header := _HEADER.match(line):
                current = found.setdefault(header.group(2), [])
                entry = header.group(2) if header.group(1) else entry
            continue
        if line == "}":
            current = None
        elif match := _INSTRUCTION.match(line):
            rest = match.group(3)
            if rest.startswith("("):
                end = _closing(rest, 0)
                type_, tail = rest[: end + 1], rest[end + 1 :]
            else:
                type_, _, tail = rest.partition(" ")
            if opcode := _OPCODE.match(tail):
                current.append(_Instruction(match.group(2), type_, opcode.group(1), tail))
    return found, entry


def _attribute(text: str, key: str) -> str | None:
    match = re.search(rf"\b{key}=%?([\w.\-]+)", text)
    return match.group(1) if match else None


def _kernel(inst: _Instruction, found: dict[str, list[_Instruction]]) -> Kernel:
    if inst.opcode == "fusion":
        kind = _attribute(inst.text, "kind") or ""
        backend = re.search(r'"kind":"(__[\w$]+)"', inst.text)
        kind += f" {backend.group(1)}" if backend else ""
        fused = found.get(_attribute(inst.text, "calls") or "", [])
        ops = collections.Counter(i.opcode for i in fused if i.opcode not in FREE)
        return Kernel("fusion", kind, tuple(sorted(ops.items())))
    if inst.opcode == "custom-call":
        target = re.search(r'custom_call_target="([^"]+)"', inst.text)
        return Kernel("custom-call", target.group(1) if target else "")
    return Kernel(inst.opcode, "")


def _kernels(name: str, found: dict[str, list[_Instruction]]) -> tuple[Kernel, ...]:
    return tuple(_kernel(i, found) for i in found.get(name, []) if i.opcode not in FREE)


def loops(hlo: str) -> list[Loop]:
    """The while loops of an HLO module's text reachable from its ENTRY computation (loops in
    loop bodies nested in :attr:`Loop.inner`), in program order."""
    found, entry = computations(hlo)

    def loops_in(name: str, seen: frozenset[str]) -> Iterator[Loop]:
        for inst in found.get(name, []):
            if inst.opcode == "while":
                body = _attribute(inst.text, "body") or ""
                trips = re.search(r'"known_trip_count":\{"n":"(\d+)"\}', inst.text)
                yield Loop(
                    trip_count=int(trips.group(1)) if trips else None,
                    carries=tuple(_SHAPE.findall(inst.type)),
                    body=_kernels(body, found),
                    condition=_kernels(_attribute(inst.text, "condition") or "", found),
                    inner=tuple(loops_in(body, seen | {body})) if body not in seen else (),
                )
            elif inst.opcode in ("call", "conditional"):
                called = re.findall(
                    r"\b(?:to_apply|true_computation|false_computation)=%?([\w.\-]+)", inst.text
                )
                branches = re.search(r"\bbranch_computations=\{([^}]*)\}", inst.text)
                called += re.findall(r"%?([\w.\-]+)", branches.group(1)) if branches else []
                for name_ in called:
                    if name_ not in seen:
                        yield from loops_in(name_, seen | {name_})

    return list(loops_in(entry, frozenset({entry}))) if entry else []


def _vjp_forward(loss: Callable[..., jax.Array]) -> Callable:
    """The forward of ``jax.vjp`` w.r.t. the first argument, as :class:`experiments.timing.GradientPrograms`
    compiles it."""

    def forward(params, *args):
        return jax.vjp(lambda p: loss(p, *args), params)

    return forward


def forward_losses(cell, hidden: int, methods) -> dict[str, Callable]:
    """The losses ``(params, head, xs) -> scalar`` compared: ``batched`` (BP's in
    ``benchmarks.speed``), ``vmapped`` (a ``lax.scan`` over one example, vmapped) and one
    per ``methods`` entry (BPPSA's with that method)."""
    batched, _ = speed.losses(cell, hidden)

    def vmapped(params, head, xs):
        def one(x):
            step = lambda s, x_t: (cell(params, s, x_t), None)  # noqa: E731
            state, _ = jax.lax.scan(step, cell.initial_state(hidden), x)
            return cell.output(state) @ head

        return jnp.sum(jax.vmap(one)(xs))

    out = {"batched": batched, "vmapped": vmapped}
    for name, method in methods.items():
        out[name] = speed.losses(cell, hidden, method)[1]
    return out


def programs(cell: str, length: int, batch: int, hidden: int, methods) -> dict:
    """``{name: (compiled, args)}``: every loss of :func:`forward_losses` alone and as the
    forward of its ``jax.vjp``."""
    model = speed.CELLS[cell]
    args = speed.problem(model, length, batch, hidden)
    out = {}
    for name, loss in forward_losses(model, hidden, methods).items():
        prefix = "" if name == "batched" else f"{name}_"
        for suffix, fn in (("standalone", loss), ("vjp", _vjp_forward(loss))):
            out[prefix + suffix] = (jax.jit(fn).lower(*args).compile(), args)
    return out


def report(cell, length, batch, hidden, methods, rounds: int = 5) -> dict:
    """Per program: its loops (:func:`loops`, :class:`Loop` objects), its wall-clock (median
    over ``rounds`` interleaved rounds) and its device kernel time, per call and per step."""
    compiled = programs(cell, length, batch, hidden, methods)
    calls = {name: functools.partial(fn, *args) for name, (fn, args) in compiled.items()}
    wall = timing.interleaved(calls, rounds)
    out = {}
    for name, (fn, args) in compiled.items():
        kernels = timing.kernel_time(fn, *args)
        wall_s = statistics.median(wall[name])
        out[name] = dict(
            loops=loops(fn.as_text()),
            wall_ms=1e3 * wall_s,
            wall_us_per_step=1e6 * wall_s / length,
            kernel_ms=None if kernels.seconds is None else 1e3 * kernels.seconds,
            kernel_us_per_step=None if kernels.seconds is None else 1e6 * kernels.seconds / length,
            kernel_reason=kernels.reason,
        )
    return out


def _print_loop(loop: Loop, length: int, indent: str = "  ") -> None:
    trips = loop.trip_count
    steps = f", {length / trips:g} steps each" if trips else ""
    print(f"{indent}loop: {trips} iterations{steps}; carries {', '.join(loop.carries)}")
    print(f"{indent}  per iteration {len(loop.body)} kernels: {'; '.join(map(str, loop.body))}")
    print(f"{indent}  condition {len(loop.condition)}: {'; '.join(map(str, loop.condition))}")
    for inner in loop.inner:
        _print_loop(inner, length, indent + "    ")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cell", default="rnn", choices=list(speed.CELLS))
    parser.add_argument("--length", type=int, default=1000)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--hidden", type=int, default=20)
    parser.add_argument("--methods", nargs="*", default=["blelloch"], help="BPPSA's, by name")
    parser.add_argument("--rounds", type=int, default=5, help="timed rounds of the wall-clock")
    parser.add_argument("--json", type=pathlib.Path, help="also write the report here")
    args = parser.parse_args(argv)
    for name in ("length", "batch", "hidden", "rounds"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be >= 1")
    try:
        methods = {name: speed.parse_method(name) for name in args.methods}
    except ValueError as error:
        parser.error(f"--methods: {error}")
    shape = (args.cell, args.length, args.batch, args.hidden)
    result = report(*shape, methods, args.rounds)
    flags = os.environ.get("XLA_FLAGS", "")
    print(
        f"{args.cell} T={args.length} B={args.batch} H={args.hidden} on "
        f"{jax.devices()[0].device_kind} ({jax.default_backend()}, JAX {jax.__version__}), "
        f"XLA_FLAGS={flags!r}"
    )
    for name, entry in result.items():
        kernel = (
            f"kernels {entry['kernel_ms']:.3f} ms = {entry['kernel_us_per_step']:.2f} us/step"
            if entry["kernel_ms"] is not None
            else f"kernels: {entry['kernel_reason']}"
        )
        print(
            f"{name}: {len(entry['loops'])} while loop(s); wall {entry['wall_ms']:.3f} ms = "
            f"{entry['wall_us_per_step']:.2f} us/step; {kernel}"
        )
        for loop in entry["loops"]:
            _print_loop(loop, args.length)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        payload = dict(cell=args.cell, length=args.length, batch=args.batch, hidden=args.hidden)
        payload.update(backend=jax.default_backend(), jax=jax.__version__, xla_flags=flags)
        payload["programs"] = result
        args.json.write_text(json.dumps(payload, indent=2, default=dataclasses.asdict))
    return 0


if __name__ == "__main__":
    sys.exit(main())
