"""A row of the speed benchmark: its keys, every one present from the start (``None`` where
nothing was measured), and the line printed for it.

Kept apart from :mod:`benchmarks.speed` (which measures) so that each file is one concept.
"""

from __future__ import annotations

from benchmarks._speed_cli import Config
from paper_figures.result_files import PULLBACK
from paper_figures.result_files import methods as method_names


def _quantities(prefix: str = "") -> dict:
    fields = ("total_ms", "total_min_ms", "forward_ms", "forward_min_ms", "backward_ms")
    fields += ("backward_min_ms", "backward_kernel_ms")
    return {f"{prefix}{field}": None for field in fields}


def empty_row(config: Config, methods, status: str = "ok", error: str | None = None) -> dict:
    """A row with every key (``None`` where nothing was measured)."""
    blank = _quantities()
    blank.update(backward_speedup=None, overall_speedup=None, runs=None, scan_gflop=None)
    blank.update(achieved_gflops=None, peak_bytes=None, floor_ms=None, model_ms=None)
    blank.update(hlo_backward=None, page_faults=None)
    return dict(
        cell=config.cell,
        length=config.length,
        batch=config.batch,
        hidden=config.hidden,
        status=status,
        error=error,
        backward=PULLBACK,
        seconds=None,
        rounds=0,
        **_quantities("bp_"),
        standalone_forward_ms=None,
        standalone_forward_min_ms=None,
        bp_floor_ms=None,
        bp_model_ms=None,
        bp_hlo_backward=None,
        chain_ms=None,
        chain_min_ms=None,
        parts_ms=None,
        parts_min_ms=None,
        parts_block=None,
        parts_sum_ms=None,
        parts_sum_min_ms=None,
        bp_over_parts=None,
        bp_peak_bytes=None,
        bp_page_faults=None,
        compile_s={},
        methods={name: dict(status=status, error=error, **blank) for name in methods},
    )


def _speedup(ratio: float | None) -> str:
    return "x  n/a" if ratio is None else f"x{ratio:5.2f}"


def print_row(row):
    """One line: BP's three quantities (medians; the backward's minimum in parentheses), the
    parts, and each method's, with its speedups over BP and the model's floor."""
    head = f"{row['cell']:<4} T={row['length']:<7} B={row['batch']:<4} H={row['hidden']:<5}"
    if row["status"] != "ok":
        print(f"{head} {row['status']}: {row['error'][:300]}", flush=True)
        return
    head += (
        f"BP total {row['bp_total_ms']:8.2f} fwd {row['bp_forward_ms']:8.2f} "
        f"bwd {row['bp_backward_ms']:8.2f} ({row['bp_backward_min_ms']:.2f}) ms"
        f"{_floor(row['bp_floor_ms'])}; standalone fwd {row['standalone_forward_ms']:.2f} ms"
    )
    if row["parts_sum_ms"] is not None:
        head += (
            f"; chain {row['chain_ms']:.2f} + parts {row['parts_ms']:.2f} ="
            f" {row['parts_sum_ms']:.2f} ms (BP bwd over it x{row['bp_over_parts']:.2f})"
        )
    parts = []
    for name, m in row["methods"].items():
        if m["status"] != "ok":
            parts.append(f"{name}: {m['status']} ({m['error'][:80]})")
            continue
        runs = f" [{m['runs']}]" if name == method_names.AUTO else ""
        parts.append(
            f"{name}: total {m['total_ms']:7.2f} {_speedup(m['overall_speedup'])}, "
            f"fwd {m['forward_ms']:7.2f}, bwd {m['backward_ms']:7.2f} ({m['backward_min_ms']:.2f})"
            f" ms {_speedup(m['backward_speedup'])}{_floor(m['floor_ms'])}{runs}"
        )
    print(head + "  |  " + "  |  ".join(parts), flush=True)


def _floor(floor_ms):
    return "" if floor_ms is None else f" floor {floor_ms:.2f}"
