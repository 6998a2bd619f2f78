"""``python -m benchmarks.kernel_lab``: the fused kernels compiled on a CPU, read and estimated.

Captures every kernel of the grid (:mod:`benchmarks.kernel_lab.lab`), compiles it for sm_90a
and sm_80 at 1 to 16 warps with the ``triton`` wheel (the ``kernels`` extra), and writes to
``--out`` (default ``benchmarks/results/kernel_lab``):

* ``kernels.jsonl``: a row per kernel, target and warps (resources, the time loop's instruction
  mix, the model's estimate);
* ``summary.json``: the envelope each target's rows give (:mod:`benchmarks.kernel_lab.envelope`),
  and each kernel as the profile launches it (warps, estimate, spills);
* ``kernels.png``: the estimated microseconds a step against the hidden size, forward and
  backward, per cell, at the warps the profile picks (refused kernels marked).

``--check`` exits with status 1 where a kernel the profile admits spills at the warps it gets.
``make kernels`` runs the whole grid with ``--check`` (a few minutes on 2 cores).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from benchmarks.kernel_lab import capture, lab, report

DEFAULT_OUT = os.path.join("benchmarks", "results", "kernel_lab")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.kernel_lab", description=__doc__)
    parser.add_argument("--out", default=DEFAULT_OUT, help="folder of the result files")
    parser.add_argument("--cells", nargs="+", default=list(capture.CELLS))
    parser.add_argument("--hiddens", nargs="+", type=int, default=list(lab.HIDDENS))
    parser.add_argument("--loops", nargs="+", default=list(capture.LOOPS))
    parser.add_argument("--warps", nargs="+", type=int, default=list(lab.WARPS))
    parser.add_argument("--archs", nargs="+", type=int, default=list(lab.ARCHS))
    parser.add_argument("--workers", type=int, default=2, help="kernels compiled at a time")
    parser.add_argument(
        "--report-only", action="store_true", help="redraw the summary and figure from the rows"
    )
    parser.add_argument(
        "--check", action="store_true", help="fail where a kernel the profile admits spills"
    )
    args = parser.parse_args(argv)
    unknown = sorted(set(args.cells) - set(capture.CELLS))
    if unknown:
        parser.error(f"--cells: unknown {unknown} (known: {sorted(capture.CELLS)})")
    bad_loops = sorted(set(args.loops) - set(capture.LOOPS))
    if bad_loops:
        parser.error(f"--loops: unknown {bad_loops} (known: {list(capture.LOOPS)})")
    os.makedirs(args.out, exist_ok=True)
    rows_path = os.path.join(args.out, "kernels.jsonl")
    if not args.report_only:
        from benchmarks.kernel_lab.compile import available, version

        missing = available()
        if missing is not None:
            print(f"kernel lab: {missing}", file=sys.stderr)
            return 2
        start = time.perf_counter()
        grid = lab.specs(args.cells, args.hiddens, args.loops)
        print(f"kernel lab: {len(grid)} kernels, triton {version()}", flush=True)
        lab.run(
            grid,
            rows_path,
            warps=args.warps,
            archs=args.archs,
            workers=args.workers,
            progress=lambda m: print(f"[{time.perf_counter() - start:6.0f} s] {m}", flush=True),
        )
    rows = lab.read_rows(rows_path)
    if not rows:
        print(f"kernel lab: no rows in {rows_path}", file=sys.stderr)
        return 2
    summary = report.summary(rows)
    report.write_json(os.path.join(args.out, "summary.json"), summary)
    report.figure(rows, os.path.join(args.out, "kernels.png"))
    print(report.table(summary))
    if args.check:
        spilling = report.admitted_spills(rows)
        for row in spilling:
            print(
                f"kernel lab: {row['kernel']} spills at sm_{row['arch']}, {row['num_warps']} "
                f"warps ({row.get('spill_stores')} B stores), yet the profile admits it",
                file=sys.stderr,
            )
        if spilling:
            return 1
        print(json.dumps({"admitted_kernels_spilling": 0}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
