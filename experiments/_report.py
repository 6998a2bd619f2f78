"""Plain-text tables of training runs and sweeps, for the terminal (from result rows only)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from experiments._training import step_rows
from paper_figures.result_files import methods as method_names

BACKWARD_NOTE = (
    "forward: the forward of each method's jax.vjp; backward: its pullback on saved residuals, "
    "its own program (not value_and_grad - forward)"
)


def loss_differences(
    runs: Mapping[str, list[dict[str, Any]]], baseline: str = method_names.BASELINE
) -> dict[str, float]:
    """Max over common iterations of ``|loss - loss_baseline| / |loss_baseline|`` per method."""
    if baseline not in runs:
        return {}
    base = {row["iteration"]: row["loss"] for row in step_rows(runs[baseline])}
    out = {}
    for name, rows in runs.items():
        if name == baseline:
            continue
        diffs = [
            abs(row["loss"] - base[row["iteration"]]) / max(abs(base[row["iteration"]]), 1e-30)
            for row in step_rows(rows)
            if row["iteration"] in base
        ]
        out[name] = max(diffs, default=float("nan"))
    return out


def loss_table(
    runs: Mapping[str, list[dict[str, Any]]], baseline: str = method_names.BASELINE, shown: int = 8
) -> str:
    """Losses of every method at ``shown`` iterations spread over the run, and their largest
    relative difference from the baseline over ALL iterations."""
    names = list(runs)
    losses = {name: {r["iteration"]: r["loss"] for r in step_rows(runs[name])} for name in names}
    common = sorted(set.intersection(*(set(v) for v in losses.values()))) if names else []
    if not common:
        return "(no common iterations)"
    picks = sorted({common[round(k * (len(common) - 1) / max(shown - 1, 1))] for k in range(shown)})
    lines = [f"{'iteration':>9} " + " ".join(f"{name + ' loss':>16}" for name in names)]
    for i in picks:
        lines.append(f"{i:>9} " + " ".join(f"{losses[name][i]:>16.9f}" for name in names))
    for name, diff in loss_differences(runs, baseline).items():
        lines.append(
            f"max |loss_{name} - loss_{baseline}| / |loss_{baseline}| over {len(common)} "
            f"iterations: {diff:.1e}"
        )
    return "\n".join(lines)


def timing_table(comparison: Mapping[str, Any], baseline: str = method_names.BASELINE) -> str:
    """Median per-iteration times (ms) and speedups of :func:`experiments._sweep.compare`: the
    forward and the backward each its own program (the forward of ``jax.vjp``, its pullback)."""
    lines = [
        f"{'method':<10} {'step (ms)':>10} {'forward (ms)':>13} {'backward (ms)':>14} "
        f"{'bwd speedup':>12} {'overall':>8}",
    ]
    for name, m in comparison["methods"].items():
        lines.append(
            f"{name:<10} {_ms(m['step_s']):>10} {_ms(m.get('forward_s')):>13} "
            f"{_ms(m.get('backward_s')):>14} {_x(m.get('backward_speedup')):>12} "
            f"{_x(m.get('overall_speedup')):>8}"
        )
    return "\n".join([*lines, BACKWARD_NOTE])


def sweep_table(points: Sequence[Mapping[str, Any]], baseline: str = method_names.BASELINE) -> str:
    """One line per point and method: times (ms) and speedups over ``baseline``."""
    lines = [
        f"{'sweep':<5} {'T':>6} {'B':>4} {'method':<9} {'fwd ms':>8} {'BP step':>9} "
        f"{'step ms':>9} {'BP bwd':>8} {'bwd ms':>8} {'bwd x':>7} {'overall x':>9}"
    ]
    for row in points:
        point, methods = row["point"], row["methods"]
        base = methods.get(baseline, {})
        for name, m in methods.items():
            if name == baseline:
                continue
            lines.append(
                f"{point['sweep']:<5} {point['length']:>6} {point['batch']:>4} {name:<9} "
                f"{_ms(m.get('forward_s')):>8} {_ms(base.get('step_s')):>9} "
                f"{_ms(m['step_s']):>9} {_ms(base.get('backward_s')):>8} "
                f"{_ms(m.get('backward_s')):>8} {_x(m.get('backward_speedup')):>7} "
                f"{_x(m.get('overall_speedup')):>9}"
            )
    return "\n".join([*lines, BACKWARD_NOTE])


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{1e3 * seconds:.2f}"


def _x(ratio: float | None) -> str:
    return "-" if ratio is None else f"{ratio:.2f}x"
