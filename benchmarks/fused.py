"""The fused forward (``bppsa.Fused()``, issue 43) on one device, in six parts (``--parts``), each
a step of ``benchmarks/gpu.sh``:

* ``forward``: the forward alone (the final states of ``B`` sequences, ``jax.vmap`` over a
  per-example scan), ``lax.scan`` against ``forward="fused"`` and ``bppsa.scan``'s default
  forward, in milliseconds and microseconds per step: the library's RNN, GRU and LSTM at
  H = 20, B = 16, T = 10k, 30k, 1k (input 1), and ParaRNN's diagonal GRU at H = 1024 and 4096,
  T = 4096, B = 8 (256 inputs), whose lanes the kernel splits into programs of 128 (timed
  against ``Fused(lanes=None)``, one program per example: ``lanes_speedup``). Where the
  kernel cannot run a case the row says why (``fused_why_not``) and does not time
  ``forward="fused"``;
* ``lab``: each library cell's fused forward and fused backward (``bppsa.FusedSequential()``)
  loop at H = 20, 64, 128 over the kernel lab's problem (T = 1000, B = 16), at the warps the
  profile picks and at 4, with the step-ahead loads on and off: the measured step beside the
  kernel lab's estimate of the same kernel (:mod:`benchmarks._fused_lab`);
* ``grad``: whole gradients (``value_and_grad`` of a head on the final states): BP
  (``jax.value_and_grad`` through ``lax.scan``), bppsa's defaults (``bppsa.value_and_grad``)
  and ``forward="fused"`` with ``method=bppsa.Blelloch()``; RNN and GRU, H = 20, B = 16,
  T = 10k and 30k; each bppsa row records what its scans decided (forward and why, method);
* ``cudnn``: cuDNN's LSTM (``jax.experimental.rnn.lstm``, its forward and backward) against
  bppsa's LSTM with its defaults on the same weights, H = 20 and 128 (inputs H), T = 10k and
  1k, B = 16, and the ratio; where cuDNN's LSTM cannot run (a CPU) the row says so;
* ``backends``: the fused loops on Pallas' Triton backend against Mosaic GPU's (tensor cores),
  forward alone and whole ``value_and_grad`` with both loops fused, and the LSTM against
  cuDNN's: the LSTM at H = 128, 256, 512, B = 64, T = 10k first, then RNN, GRU and LSTM at
  H = 20 to 1024, B = 16, T = 1000 (:mod:`benchmarks._fused_backends`);
* ``compile``: the envelope's compile grid (:mod:`benchmarks._fused_compile`): RNN, GRU, LSTM
  and diagonal GRU at H = 16 to 4096 (powers of two, 20 and 100), whether the fused forward
  compiles and runs on the device, in how long; its last row (``"part": "compile-summary"``)
  gives the largest size each cell compiled at and the points the profile admits that did not
  compile and run right (the check of the kernel lab's envelope, ``fused_programs``:
  ``benchmarks.tools.fit_profile --compile``).

The language model's training step (issue 43's item 4d) is ``experiments/char_lm.py --gpu``,
whose defaults pick the fused forward on a GPU; its summary records each run's plan.

Each row is one case: its programs compiled once, checked against the reference, then timed
round by round (:mod:`benchmarks._fused_rows`), ``<name>_ms`` the median and ``<name>_min_ms``
the minimum, with the device kind. Rows are appended to a JSON-lines file as they finish
(``--out``), each case after a ``"started"`` line: a rerun of the same command skips the cases
done and records a case whose process died as ``"crashed"`` (a crash inside XLA or Triton
costs one case, not the step). A table of the part's rows ends each part.

Run: ``python3 -m benchmarks.fused --parts forward grad --out results/fused.jsonl``;
``--dry-run``: every part at tiny sizes (on a CPU the kernel runs in Pallas' interpreter).
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import jax

from benchmarks import _fused_backends as backends
from benchmarks import _fused_compile as grid
from benchmarks import _fused_lab as lab
from benchmarks._fused_rows import Case, cudnn_row, forward_row, grad_row, machine
from paper_figures.result_files import JsonLines

PARTS = ("forward", "lab", "grad", "cudnn", "backends", "compile")
FIELDS = ("cell", "hidden", "length", "batch", "inputs")
STARTED = "started"


def plan(part: str, dry_run: bool = False) -> list[Case]:
    """The cases of ``part``, in the order they run (the issue's targets first)."""
    small = ("rnn", "gru", "lstm")
    if part == "forward":
        if dry_run:
            return [Case(c, 20, 16, 2, 1) for c in small] + [Case("diagonal-gru", 8, 16, 2, 4)]
        paper = [Case(c, 20, t, 16, 1) for t in (10_000, 30_000, 1_000) for c in small]
        wide = [Case("diagonal-gru", h, 4096, 8, 256) for h in (1024, 4096)]
        return paper[:3] + wide + paper[3:]
    if part == "lab":
        return list(lab.plan(dry_run))
    if part == "grad":
        lengths = (16,) if dry_run else (10_000, 30_000)
        return [Case(c, 20, t, 2 if dry_run else 16, 1) for t in lengths for c in ("rnn", "gru")]
    if part == "cudnn":
        if dry_run:
            return [Case("lstm", 8, 16, 2, 8)]
        return [Case("lstm", h, t, 16, h) for t in (10_000, 1_000) for h in (20, 128)]
    if part == "backends":
        return backends.plan(dry_run)
    if part == "compile":
        if dry_run:
            return grid.grid(grid.CELLS, (4, 20), 8, 2, 2)
        return grid.grid(grid.CELLS, grid.HIDDENS, 128, 8, 4)
    raise ValueError(f"part must be one of {PARTS}, got {part!r}")


def key(row: dict[str, Any]) -> tuple:
    return tuple(row.get(k) for k in ("part", *FIELDS, "loop"))


def case_of(part: str, row: dict[str, Any]) -> Case:
    """The case a row of ``part`` is of."""
    if part == "lab":
        return lab.LoopCase(*(row[k] for k in (*FIELDS, "loop")))
    return Case(*(row[k] for k in FIELDS))


def run_part(
    part: str, log: JsonLines, rounds: int, dry_run: bool, deadline: float | None
) -> list[dict[str, Any]]:
    """Runs the cases of ``part`` not yet in ``log`` (a case started and not finished by an
    earlier process is recorded as crashed), appending each row as it finishes; stops
    starting cases after ``deadline`` (``time.perf_counter()``); returns the part's rows."""
    rows = log.read()
    done = {key(r) for r in rows if r.get("event") is None}
    for row in rows:
        if row.get("event") == STARTED and row["part"] == part and key(row) not in done:
            log.append(grid.crashed_row(case_of(part, row)) | {"part": part})
            done.add(key(row))
    cases = [c for c in plan(part, dry_run) if key({"part": part, **c.fields()}) not in done]
    for i, case in enumerate(cases):
        if deadline is not None and time.perf_counter() > deadline:
            print(f"benchmarks.fused: {part}: time is up, {len(cases) - i} case(s) not run")
            break
        if part == "compile" and (why := grid.stopped(log.read()).get(case.cell)):
            log.append(grid.skipped_row(case, why))
            continue
        log.append({"part": part, **case.fields(), "event": STARTED})
        try:
            row = build(part, case, rounds)
        except Exception as error:  # e.g. out of device memory: recorded, the part goes on
            row = {"part": part, **case.fields(), **machine(), "status": "error",
                   "error": f"{type(error).__name__}: {str(error)[:400]}"}  # fmt: skip
        log.append(row)
        print(describe(row), flush=True)
    return [r for r in log.read() if r.get("part") == part and r.get("event") is None]


def build(part: str, case: Case, rounds: int) -> dict[str, Any]:
    """The row of one case of ``part``."""
    if part == "compile":
        return grid.compile_row(case)
    builders: dict[str, Callable[[Any, int], dict[str, Any]]] = {
        "forward": forward_row,
        "lab": lab.lab_row,
        "grad": grad_row,
        "cudnn": cudnn_row,
        "backends": backends.backends_row,
    }
    return builders[part](case, rounds) | {"status": "ok"}


def _ms(value: float | None) -> str:
    return "      -" if value is None else f"{value:7.2f}"


def _x(value: float | None) -> str:
    return "    -" if value is None else f"{value:5.2f}x"


def describe(row: dict[str, Any]) -> str:
    """One line of a row, as the log and the table print it."""
    head = f"{row['part']:<8} {row['cell']:<13} H={row['hidden']:<5} T={row['length']:<6} "
    head += f"B={row['batch']:<3}"
    if row.get("status") in ("error", "crashed", "skipped"):
        return f"{head} {row['status']}: {row.get('error') or row.get('because')}"
    part = row["part"]
    if part == "forward":
        fused = f"fused {row['fused_min_us_per_step'] or 0:8.3f} us/step"
        if row["fused_why_not"]:
            fused = f"fused not run ({row['fused_why_not']})"
        return (
            f"{head} lax.scan {row['lax_scan_min_us_per_step']:8.3f} us/step | {fused} "
            f"{_x(row['fused_speedup_min'])} | default {row['default_forward']} "
            f"{_x(row['default_speedup_min'])}"
            + (f" | lanes split {_x(row['lanes_speedup_min'])}" if "lanes_speedup" in row else "")
        )
    if part == "lab":
        return f"{head} {lab.describe(row)}"
    if part == "grad":
        return (
            f"{head} BP {_ms(row['bp_min_ms'])} ms | defaults {_ms(row['defaults_min_ms'])} ms "
            f"{_x(row['defaults_speedup_min'])} ({row['defaults_forward']}, "
            f"{row['defaults_method']}) | fused+Blelloch {_ms(row['fused_blelloch_min_ms'])} "
            f"ms {_x(row['fused_blelloch_speedup_min'])} ({row['fused_blelloch_forward']}) | "
            f"fused both ways {_ms(row['fused_sequential_min_ms'])} ms "
            f"{_x(row['fused_sequential_speedup_min'])}"
        )
    if part == "cudnn":
        return (
            f"{head} cuDNN {_ms(row['cudnn_min_ms'])} ms ({row['cudnn_status'][:40]}) | bppsa "
            f"{_ms(row['bppsa_min_ms'])} ms ({row['bppsa_forward']}, {row['bppsa_method']}) | "
            f"bppsa/cuDNN {_x(row['bppsa_over_cudnn_min'])}"
        )
    if part == "backends":
        return f"{head} {backends.describe(row)}"
    compiled = "-" if row.get("compile_s") is None else f"{row['compile_s']:.2f} s"
    return (
        f"{head} {row['status']:<10} compile {compiled} (tile {row['tile']}, resident "
        f"{row['resident']}; library: {row['library_why_not'] or 'fused'})"
        + (f" {row['error'][:160]}" if row.get("error") else "")
    )


def report(part: str, rows: Sequence[dict[str, Any]]) -> Iterator[str]:
    """The table that ends a part."""
    yield f"--- benchmarks.fused {part}: {len(rows)} row(s) on {machine()['device_kind']} ---"
    for row in rows:
        yield describe(row)
    if part == "compile":
        yield from grid.report(rows)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parts", nargs="+", choices=PARTS, default=list(PARTS))
    parser.add_argument("--rounds", type=int, default=5, help="timing rounds (default 5)")
    parser.add_argument("--seconds", type=float, help="start no case after this many seconds")
    parser.add_argument("--dry-run", action="store_true", help="tiny sizes: checks the path")
    parser.add_argument("--require-backend", help="stop at once unless JAX runs on this backend")
    parser.add_argument(
        "--out", type=pathlib.Path, default=pathlib.Path("results/fused.jsonl"), help="JSON lines"
    )
    args = parser.parse_args(argv)
    if args.dry_run:
        args.rounds = 1
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    backend = jax.default_backend()
    if args.require_backend and backend != args.require_backend:
        print(
            f"benchmarks.fused: this run needs JAX's {args.require_backend!r} backend, but the "
            f"default backend is {backend!r}; nothing was measured.",
            file=sys.stderr,
        )
        return 2
    deadline = None if args.seconds is None else time.perf_counter() + args.seconds
    log = JsonLines(args.out)
    for part in args.parts:
        rows = run_part(part, log, args.rounds, args.dry_run, deadline)
        if part == "compile" and rows:
            log.append(grid.summary(rows))
        print("\n".join(report(part, rows)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
