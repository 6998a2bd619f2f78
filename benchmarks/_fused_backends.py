"""Part ``backends`` of :mod:`benchmarks.fused`: the fused loops on Pallas' Triton backend
against Mosaic GPU's (tensor cores), and the LSTM against cuDNN's.

A row is one case: the library's cell over ``B`` sequences (``jax.vmap``), timed round by round
in one process, each program its own:

* ``<backend>_forward``: the forward alone (the final states) with
  ``forward=bppsa.Fused(backend=backend)`` (``triton``, ``mosaic_gpu``), beside
  ``lax_scan_forward``;
* ``<backend>_grad``: the whole ``value_and_grad`` of a head on the final states with both
  loops fused on ``backend`` (``bppsa.Fused(backend=...)``,
  ``bppsa.FusedSequential(backend=...)``), beside ``bp`` (JAX
  through ``lax.scan``) and, for the LSTM, ``cudnn`` (``jax.experimental.rnn.lstm``, its
  forward and backward on the same weights; where it cannot run, ``cudnn_status`` says why).

Where a backend's kernels fail to compile or run, ``<backend>_error`` says how and the row goes
on without its programs. Each bppsa program records what its scan decided (``<name>_forward``,
``<name>_forward_because``: why a backend refused the case, which then runs ``lax.scan``), and
each gradient its relative difference from BP's. The LSTM's programs take cuDNN's flat weights
(:func:`benchmarks._fused_rows.lstm_params` maps them), so every gradient is of the same
array.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax

import bppsa
from benchmarks._fused_rows import (
    Case,
    Program,
    cudnn_lstm_loss,
    final_states,
    loss,
    lstm_params,
    machine,
    plan_fields,
    problem,
    relative_difference,
    timed_fields,
)

BACKENDS = ("triton", "mosaic_gpu")


def plan(dry_run: bool = False) -> list[Case]:
    """The cases, the LSTM against cuDNN first (B = 64, T = 10k), then every dense cell at
    H = 20 to 1024 (B = 16, T = 1000)."""
    if dry_run:
        return [Case("lstm", 8, 16, 2, 8), Case("rnn", 20, 8, 2, 1)]
    lstm = [Case("lstm", h, 10_000, 64, h) for h in (128, 256, 512)]
    cells = [
        Case(c, h, 1_000, 16, h) for h in (20, 128, 256, 512, 1024) for c in ("rnn", "gru", "lstm")
    ]
    return lstm + cells


def backends_row(case: Case, rounds: int) -> dict[str, Any]:
    """The row of one case (the module docstring)."""
    params, head, xs = problem(case)
    row: dict[str, Any] = {"part": "backends", **case.fields(), **machine(), "rounds": rounds}
    weights, as_params = params, _identity
    cudnn: Callable | None = None
    if case.cell == "lstm":
        from jax.experimental import rnn

        weights = rnn.init_lstm_weight(jax.random.key(0), case.inputs, case.hidden, 1, False)
        as_params = functools.partial(lstm_params, case=case)
        cudnn = cudnn_lstm_loss(case)

    def of(scan: Callable) -> Callable:
        return lambda w, h, x: loss(scan, case, as_params(w), h, x)

    def forward(scan: Callable) -> Callable:
        return lambda w, h, x: final_states(scan, case, as_params(w), x)

    args = (weights, head, xs)
    programs = {
        "lax_scan_forward": Program.of(forward(jax.lax.scan), *args),
        "bp": Program.of(jax.value_and_grad(of(jax.lax.scan)), *args),
    }
    for backend in BACKENDS:
        try:  # a backend's kernels that fail to compile or run cost its programs, not the row
            fused = bppsa.Fused(backend=backend)
            fused_grad = bppsa.value_and_grad(
                of(bppsa.scan), method=bppsa.FusedSequential(backend=backend), forward=fused
            )
            ours = {
                f"{backend}_forward": Program.of(
                    forward(functools.partial(bppsa.scan, forward=fused)), *args
                ),
                f"{backend}_grad": Program.of(fused_grad, *args),
            }
            for program in ours.values():
                jax.block_until_ready(program.compiled(*args))
        except Exception as error:
            row[f"{backend}_error"] = f"{type(error).__name__}: {str(error)[:300]}"
            continue
        programs |= ours
    if cudnn is not None:
        try:
            programs["cudnn"] = Program.of(jax.value_and_grad(cudnn), *args)
            jax.block_until_ready(programs["cudnn"].compiled(*args))
            row["cudnn_status"] = "ok"
        except Exception as error:  # no cuDNN here: recorded, the others still timed
            row["cudnn_status"] = f"not available: {type(error).__name__}: {str(error)[:300]}"
            programs.pop("cudnn", None)
    _, reference = programs["bp"].compiled(*args)
    for name, program in programs.items():
        if name.endswith("_grad") or name == "cudnn":
            _, grads = program.compiled(*args)
            row[f"{name}_difference"] = relative_difference(grads, reference)
        if name not in ("cudnn", "bp", "lax_scan_forward"):
            row |= plan_fields(name, program)
    row |= timed_fields(programs, args, rounds)
    # under 1: Mosaic GPU's whole gradient is faster than Triton's (cuDNN's)
    for field, other in (("triton", "triton_grad"), ("cudnn", "cudnn")):
        if "mosaic_gpu_grad" in programs and other in programs and row[f"{other}_ms"]:
            row[f"mosaic_gpu_over_{field}"] = row["mosaic_gpu_grad_ms"] / row[f"{other}_ms"]
    return row


def _identity(params: Any) -> Any:
    return params


def describe(row: dict[str, Any]) -> str:
    """A row's line after its case: each loop's fastest milliseconds, backend by backend."""

    def ms(name: str) -> str:
        value = row.get(f"{name}_min_ms")
        return "-" if value is None else f"{value:.2f}"

    cells = [f"lax.scan fwd {ms('lax_scan_forward')} ms, BP {ms('bp')} ms"]
    for backend in BACKENDS:
        if row.get(f"{backend}_error") is not None:
            cells.append(f"{backend} failed ({row[f'{backend}_error'][:60]})")
            continue
        runs = row.get(f"{backend}_grad_forward")
        cells.append(
            f"{backend} fwd {ms(f'{backend}_forward')} ms, grad {ms(f'{backend}_grad')} ms ({runs})"
        )
    if row.get("cudnn_status") is not None:
        cells.append(f"cuDNN {ms('cudnn')} ms ({row['cudnn_status'][:40]})")
    return " | ".join(cells)
