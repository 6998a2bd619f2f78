"""Fits this machine's cost-model profile to a speed run, and says how close it comes to every row.

Reads the JSON files of ``benchmarks.speed`` (every row keeps the HLO count of each compiled
backward: kernels in sequence, flops, bytes; see :mod:`benchmarks._speed_model`), fits the
:class:`bppsa.Profile`'s rates (step latency, FLOP rate, bandwidth) that best predicts the
measured median backward times (:func:`benchmarks.hlo_cost.fit_profile`, least squares in log
time), and prints measured / predicted for every (row, method), with the spread.

Run: ``.venv/bin/python -m benchmarks.fit_profile benchmarks/results/cpu_floor.json``
(``--out`` writes the profile and the ratios as JSON).
"""

from __future__ import annotations

import argparse
import pathlib
import statistics

from benchmarks import hlo_cost
from benchmarks._speed_cli import SWEEPS
from bppsa.scan._core.cost import Cost
from results_io import read_json, write_json


def samples(payload: dict) -> list[tuple[str, Cost, float]]:
    """``(label, HLO cost of the backward, measured seconds)`` of every measured backward."""
    out = []
    for sweep in SWEEPS:
        for row in payload.get(sweep, []):
            if row.get("status") != "ok":
                continue
            head = f"{row['cell']} T={row['length']} B={row['batch']} H={row['hidden']}"
            entries = [("bp", row.get("bp_hlo_backward"), row.get("bp_backward_ms"))]
            entries += [
                (name, m.get("hlo_backward"), m.get("backward_ms"))
                for name, m in row["methods"].items()
                if m.get("status") == "ok"
            ]
            for name, count, ms in entries:
                if count and ms and ms > 0 and count["steps"] > 0:
                    cost = Cost(count["steps"], max(count["flops"], 0), max(count["bytes"], 0))
                    out.append((f"{head} {name}", cost, ms / 1e3))
    return out


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("results", nargs="+", type=pathlib.Path, help="speed JSON files")
    parser.add_argument("--name", default="2-core CPU (fitted to HLO counts of a speed run)")
    parser.add_argument("--out", type=pathlib.Path, help="write the profile and ratios here")
    args = parser.parse_args(argv)
    rows = [s for path in args.results for s in samples(read_json(path))]
    if not rows:
        parser.error("no row with an HLO count and a measured backward")
    profile = hlo_cost.fit_profile([(c, t) for _, c, t in rows], args.name)
    ratios = hlo_cost.errors([(c, t) for _, c, t in rows], profile)
    print(
        f"fitted: {profile.step_latency * 1e9:.1f} ns per kernel, "
        f"{profile.flops / 1e9:.1f} GFLOP/s, {profile.bandwidth / 1e9:.1f} GB/s "
        f"over {len(rows)} backward passes"
    )
    for (label, _, seconds), ratio in zip(rows, ratios, strict=True):
        print(f"  {label:<40} measured {seconds * 1e3:9.2f} ms  measured/model {ratio:5.2f}")
    quartiles = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else ratios * 3
    print(
        f"measured/model: median {statistics.median(ratios):.2f}, quartiles "
        f"{quartiles[0]:.2f}-{quartiles[-1]:.2f}, range {min(ratios):.2f}-{max(ratios):.2f}"
    )
    print(
        "to use it: bppsa.set_profile('cpu', dataclasses.replace(bppsa.get_profile('cpu'), "
        f"flops={profile.flops:.4g}, bandwidth={profile.bandwidth:.4g}, "
        f"step_latency={profile.step_latency:.4g}))"
    )
    if args.out:
        write_json(
            args.out,
            dict(
                profile=dict(
                    name=profile.name,
                    step_latency=profile.step_latency,
                    flops=profile.flops,
                    bandwidth=profile.bandwidth,
                ),
                sources=[str(p) for p in args.results],
                rows=[
                    dict(label=label, measured_s=seconds, ratio=ratio)
                    for (label, _, seconds), ratio in zip(rows, ratios, strict=True)
                ],
            ),
        )


if __name__ == "__main__":
    main()
