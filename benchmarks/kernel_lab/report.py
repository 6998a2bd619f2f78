"""What the kernel lab's rows say: the envelope per target, each kernel as the profile launches
it, the issue's targets, and the figure."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from typing import Any

from benchmarks.kernel_lab import envelope

# The step targets in the model on sm_90a (microseconds a step), batched kernels at the
# profile's warps: (cell, hidden, loop) -> target.
TARGETS = {
    ("rnn", 20, "forward"): 0.15,
    ("rnn", 20, "backward"): 0.15,
    ("gru", 20, "forward"): 0.25,
    ("lstm", 64, "forward"): 0.4,
}
# The largest dense cells that must run spill-free (at least this hidden size).
LARGEST = {"rnn": 128, "gru": 64, "lstm": 64}
DENSE = ("rnn", "gru", "lstm")


def _profile_programs() -> list[tuple[int, int, int]]:
    from bppsa.scan._profile import built_in

    return [
        (p.num_warps, p.max_tile, p.max_resident) for p in built_in("cuda").kernels.fused_programs
    ]


def launched(rows: Sequence[dict[str, Any]], arch: int = 90) -> list[dict[str, Any]]:
    """Each kernel's row at the warps the built-in NVIDIA profile launches it with (``arch``'s
    rows), or its row at the most warps, marked ``refused``, where the profile refuses it."""
    programs = _profile_programs()
    by_kernel: dict[tuple[str, bool], dict[int, dict[str, Any]]] = {}
    for row in rows:
        if row["arch"] == arch:
            name = (row["kernel"], row.get("prefetch", True))
            by_kernel.setdefault(name, {})[row["num_warps"]] = row
    out = []
    for kernel in sorted(by_kernel):
        warps = by_kernel[kernel]
        first = next(iter(warps.values()))
        program = envelope.admitted(first, programs)
        if program is not None and program[0] in warps:
            out.append({**warps[program[0]], "refused": False})
        else:
            out.append({**warps[max(warps)], "refused": True})
    return out


def admitted_spills(rows: Sequence[dict[str, Any]], arch: int = 90) -> list[dict[str, Any]]:
    """The rows of ``arch`` whose kernel spills at the warps of a program of the profile that
    holds it (explicit warps included): none where the envelope is right."""
    programs = _profile_programs()
    bad = []
    for row in rows:
        if row["arch"] != arch:
            continue
        for program in programs:
            if (
                row["num_warps"] == program[0]
                and envelope.holds(program, row)
                and envelope.spills(row)
            ):
                bad.append(row)
    return bad


def summary(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The envelope each target's rows give, the kernels as the profile launches them, the
    targets and how they stand."""
    archs = sorted({row["arch"] for row in rows})
    kernels = launched(rows)
    targets = []
    for (cell, hidden, loop), target in TARGETS.items():
        found = [
            k
            for k in kernels
            if (k["cell"], k["hidden"], k["loop"], k["batched"], k.get("prefetch", True))
            == (cell, hidden, loop, True, True)
        ]
        estimate = found[0].get("step_us") if found else None
        targets.append(
            {
                "cell": cell,
                "hidden": hidden,
                "loop": loop,
                "target_us": target,
                "estimate_us": estimate,
                "num_warps": found[0]["num_warps"] if found else None,
                "met": estimate is not None and estimate <= target,
            }
        )
    largest = {}
    for cell in DENSE:
        clean = [
            k["hidden"]
            for k in kernels
            if k["cell"] == cell and not k["refused"] and not envelope.spills(k)
        ]
        largest[cell] = {"largest_spill_free": max(clean, default=None), "at_least": LARGEST[cell]}
    return {
        "compiler": sorted({row["triton"] for row in rows if "triton" in row}),
        "jax": sorted({row["jax"] for row in rows if "jax" in row}),
        "programs": {f"sm_{a}": envelope.programs(rows, a) for a in archs},
        "step_latency": {
            f"sm_{a}": envelope.step_estimates(rows, envelope.programs(rows, a), a) for a in archs
        },
        "profile_programs": _profile_programs(),
        "admitted_spilling": [r["kernel"] for r in admitted_spills(rows)],
        "targets": targets,
        "largest_dense": largest,
        "launched": [
            {
                key: k.get(key)
                for key in (
                    "kernel",
                    "prefetch",
                    "num_warps",
                    "refused",
                    "registers",
                    "spill_stores",
                    "step_us",
                    "tile",
                    "resident",
                )
            }
            | {"instructions": k.get("mix", {}).get("total")}
            for k in kernels
        ],
    }


def table(summary: dict[str, Any]) -> str:
    """The summary's targets and envelopes as text."""
    lines = ["target (sm_90a, batched, profile's warps)    estimate   target  warps  met"]
    for t in summary["targets"]:
        name = f"{t['cell']} H = {t['hidden']} {t['loop']}"
        estimate = "-" if t["estimate_us"] is None else f"{t['estimate_us']:.3f} us"
        lines.append(
            f"  {name:42s} {estimate:>9s}  {t['target_us']:.2f} us  {t['num_warps']!s:>5s}  "
            f"{t['met']}"
        )
    for cell, found in summary["largest_dense"].items():
        lines.append(f"  largest spill-free {cell}: H = {found['largest_spill_free']}")
    for arch, programs in summary["programs"].items():
        lines.append(f"  envelope {arch} (warps, max_tile, max_resident): {programs}")
    lines.append(f"  admitted kernels that spill: {len(summary['admitted_spilling'])}")
    return "\n".join(lines)


def write_json(path: str, value: Any) -> None:
    """Writes ``value`` to ``path`` atomically."""
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(value, f, indent=1, sort_keys=True)
        f.write("\n")
    os.replace(tmp, path)


def figure(rows: Sequence[dict[str, Any]], path: str) -> None:
    """Estimated microseconds a step against the hidden size, forward and backward, a line per
    cell, at the profile's warps (batched kernels, sm_90a); refused kernels (spilling at the
    most warps compiled) marked with crosses."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    kernels = [
        k for k in launched(rows) if k["batched"] and k.get("prefetch", True) and "step_us" in k
    ]
    loops = ("forward", "backward")
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
    for ax, loop in zip(axes, loops):
        for cell in sorted({k["cell"] for k in kernels}):
            points = sorted(
                (k["hidden"], k["step_us"], k["refused"])
                for k in kernels
                if k["cell"] == cell and k["loop"] == loop
            )
            if not points:
                continue
            (line,) = ax.plot([p[0] for p in points], [p[1] for p in points], "-", label=cell)
            kept = [p for p in points if not p[2]]
            refused = [p for p in points if p[2]]
            ax.plot([p[0] for p in kept], [p[1] for p in kept], "o", color=line.get_color())
            ax.plot(
                [p[0] for p in refused], [p[1] for p in refused], "x", color=line.get_color(), ms=9
            )
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("hidden size H")
        ax.set_title(f"fused {loop} loop (sm_90a, model estimate)")
        ax.grid(True, which="both", alpha=0.3)
    axes[0].set_ylabel("estimated us a step (x: refused, spills)")
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    tmp = f"{path}.tmp.png"
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    os.replace(tmp, path)
