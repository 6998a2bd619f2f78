"""``make mutate``: mutmut over the structure analysis, the structured elements, Auto's
structured rule and the timing summary, within a time bound; writes
``results/mutate/report.{txt,json}`` and prints the text (counts, wall time, and each survivor
with file, line and diff).

Run from the repository root, in the environment that has the ``mutate`` extra::

    python -m tests.mutation.run [--children N] [--limit SECONDS] [--full] [PATTERN ...]

A pattern is an fnmatch pattern of mutmut's mutant names (``module.x_function__mutmut_3``,
``module.xǁClassǁmethod__mutmut_3``); the default is :data:`SCOPE`, with the files of
:data:`SAMPLED` sampled unless ``--full``. The run starts afresh (``mutants/`` is removed first).
At the limit mutmut is interrupted: the report then counts the mutants it did not reach as
``not checked`` and the command exits with 2.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import difflib
import fnmatch
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from importlib.metadata import version
from pathlib import Path

# "?" stands for "ǁ", mutmut's separator of class and method. Auto's structured rule: the CPU's
# `MeasuredRules.pick` (structured maps always take the blocked scan, and its block size),
# `Choosing.scan_method` (the width of the footprint it passes on), `_parallel_pays` and
# `_power_of_two`; the forward's policy (`budget`, `break_even`, `AutoForward.forward_for`).
# The timing summary (experiments/timing/summary.py): medians and minima of the result rows.
SCOPE = (
    "bppsa.scan._core.element_flow.*",
    "bppsa.scan._core.structure.*",
    "bppsa.scan._core.dependence.*",
    "bppsa.scan._blocks.*",
    "bppsa.scan._elements.x?Diagonal?*",
    "bppsa.scan._core.methods.auto.x?MeasuredRules?pick*",
    "bppsa.scan._core.methods.auto.x?Choosing?scan_method*",
    "bppsa.scan._core.auto_forward.*",
    "bppsa.scan._core.methods.auto.x__parallel_pays*",
    "bppsa.scan._core.methods.auto.x__power_of_two*",
    "experiments.timing.summary.*",
)
# The three largest files have ~1500 mutants, whose tests (up to ~110 per function, mostly
# compilation) take about two hours on 2 cores: a fifth of each function's mutants run, those
# numbered 1, 6, 11, ... (mutmut numbers them in source order, so the sample spans the function).
SAMPLED = (
    "bppsa.scan._core.element_flow.*",
    "bppsa.scan._core.structure.*",
    "bppsa.scan._blocks.*",
)
FIFTH = "__mutmut_*[16]"
OUT = Path("results/mutate")
MUTANTS = Path("mutants")
STOP_GRACE_S = 60  # after the interrupt, for mutmut to stop its workers and save


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--children", type=int, default=2, help="mutants tested at once")
    parser.add_argument("--limit", type=float, default=2400, help="seconds for mutmut's run")
    parser.add_argument("--full", action="store_true", help=f"no sample of {SAMPLED}")
    parser.add_argument("patterns", nargs="*", help="default: SCOPE")
    args = parser.parse_args()
    sampled = not args.full and not args.patterns
    patterns = args.patterns or [p + FIFTH if sampled and p in SAMPLED else p for p in SCOPE]

    shutil.rmtree(MUTANTS, ignore_errors=True)
    OUT.mkdir(parents=True, exist_ok=True)
    # The sources as mutated, for the survivors' lines: others may edit them during the run.
    sources = {path: Path(path).read_text() for path in mutmut_config().only_mutate}
    command = [
        str(Path(sys.executable).parent / "mutmut"),
        "run",
        "--max-children",
        str(args.children),
        *patterns,
    ]
    print("$", " ".join(command), f"(output in {OUT / 'mutmut.log'})", flush=True)
    start = time.monotonic()
    code, stopped = run_within(command, args.limit, patterns, start)
    wall = time.monotonic() - start

    report = build_report(patterns, sources)
    left_out = Counter(path for path, *_ in results(SCOPE)) - Counter(
        path for path, *_ in results(patterns)
    )
    report.update(
        sample=f"a fifth (mutants numbered 1, 6, 11, ...) of {', '.join(SAMPLED)}"
        if sampled
        else None,
        left_out_by_sample=dict(left_out),
        tool=f"mutmut {version('mutmut')}",
        command=command,
        children=args.children,
        limit_s=args.limit,
        wall_s=round(wall, 1),
        mutmut_exit_code=code,
        stopped_at_limit=stopped,
    )
    text = render(report)
    (OUT / "report.json").write_text(json.dumps(report, indent=1, ensure_ascii=False) + "\n")
    (OUT / "report.txt").write_text(text)
    print(text, end="")
    if stopped:
        return 2
    return 0 if code == 0 else 1


def run_within(command, limit, patterns, start) -> tuple[int, bool]:
    """Runs mutmut, printing its progress each minute, and interrupts it at ``limit`` seconds."""
    with (OUT / "mutmut.log").open("w") as log:
        proc = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    stopped, last = False, start
    try:
        while proc.poll() is None:
            time.sleep(2)
            now = time.monotonic()
            if now - last >= 60:
                last = now
                done = Counter(status for *_, status in results(patterns))
                checked = sum(n for s, n in done.items() if s != "not checked")
                print(f"  {now - start:5.0f} s: {checked}/{sum(done.values())} mutants", flush=True)
            if now - start > limit and not stopped:
                stopped = True
                print(f"  the {limit:.0f} s bound: interrupting mutmut", flush=True)
                proc.send_signal(signal.SIGINT)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(STOP_GRACE_S)
                break
    finally:
        if proc.poll() is None and not stopped:
            proc.send_signal(signal.SIGINT)
        with contextlib.suppress(ProcessLookupError):  # the fork server and its workers, if left
            os.killpg(proc.pid, signal.SIGKILL)
    return proc.wait(), stopped


def results(patterns):
    """``(path, name, exit code, status)`` of each mutant matching ``patterns`` so far."""
    from mutmut.mutation.data import SourceFileMutationData
    from mutmut.stats import status_by_exit_code

    for meta in sorted(MUTANTS.rglob("*.py.meta")):
        path = meta.relative_to(MUTANTS).as_posix().removesuffix(".meta")
        data = SourceFileMutationData(path=path)
        try:
            data.load()
        except (json.JSONDecodeError, KeyError):  # being written
            continue
        for name, code in data.exit_code_by_key.items():
            if any(fnmatch.fnmatchcase(name, p) for p in patterns):
                yield path, name, code, status_by_exit_code[code]


def mutmut_config():
    from mutmut.configuration import config

    return config()


def build_report(patterns, sources: dict[str, str]) -> dict:
    from mutmut.utils.format_utils import orig_function_and_class_names_from_key

    mutants = []
    for path, name, code, status in results(patterns):
        function, cls = orig_function_and_class_names_from_key(name)
        entry = {
            "name": name,
            "file": path,
            "function": f"{cls}.{function}" if cls else function,
            "status": status,
            "exit_code": code,
        }
        if status not in ("killed", "not checked"):
            source = sources.get(path) or Path(path).read_text()
            found = line_and_diff(name, path, source, cls, function)
            entry.update(zip(("line", "diff"), found))
        mutants.append(entry)
    files = {}
    for entry in mutants:
        files.setdefault(entry["file"], Counter())[entry["status"]] += 1
    return {
        "scope": list(patterns),
        "totals": dict(Counter(m["status"] for m in mutants)) | {"mutants": len(mutants)},
        "files": {path: dict(counts) for path, counts in files.items()},
        "mutants": mutants,
    }


def line_and_diff(name, path, source, cls, function) -> tuple[int | None, str]:
    """The line of ``path`` that mutant ``name`` changes first, and mutmut's diff of it (as
    ``mutmut show`` prints it: the function as libcst prints it, line for line, dedented)."""
    import libcst as cst
    from mutmut.mutation import diff_apply

    functions = diff_apply.read_functions_from_index(name, path)
    if functions is None:
        module = diff_apply.read_mutants_module(path)
        functions = (
            diff_apply.read_original_function(module, name),
            diff_apply.read_mutant_function(module, name),
        )
    old, new = (cst.Module([f]).code.strip().split("\n") for f in functions)
    diff = "\n".join(difflib.unified_diff(old, new, fromfile=path, tofile=path, lineterm=""))
    opcodes = difflib.SequenceMatcher(None, old, new, autojunk=False).get_opcodes()
    changed = next((i1 for tag, i1, *_ in opcodes if tag != "equal"), None)
    header = re.compile(rf"(async\s+)?def {function}\b")
    at_def = next((i for i, text in enumerate(old) if header.match(text)), None)
    node = find_def(source, cls, function)
    if None in (changed, at_def, node):
        return None, diff
    return node.lineno + changed - at_def, diff


def find_def(source: str, cls: str | None, function: str):
    body = ast.parse(source).body
    if cls is not None:
        body = next((n.body for n in body if isinstance(n, ast.ClassDef) and n.name == cls), [])
    kinds = (ast.FunctionDef, ast.AsyncFunctionDef)
    return next((n for n in body if isinstance(n, kinds) and n.name == function), None)


def render(report: dict) -> str:
    totals, main = report["totals"], ("killed", "survived", "timeout")
    others = [f"{s} {n}" for s, n in sorted(totals.items()) if s not in (*main, "mutants")]
    out = [
        f"make mutate: {report['tool']}, {report['children']} mutants at once, "
        f"bound {report['limit_s']:.0f} s",
        f"wall time: {report['wall_s']:.0f} s"
        + (" (stopped at the bound)" if report["stopped_at_limit"] else "")
        + f"; mutmut exit code {report['mutmut_exit_code']}",
        f"mutants: {totals['mutants']}: "
        + ", ".join([f"{s} {totals.get(s, 0)}" for s in main] + others),
    ]
    if report["sample"]:
        out.append(f"sample: {report['sample']}")
    out.append("")
    for path, per_file in report["files"].items():
        shown = ", ".join(f"{s} {n}" for s, n in sorted(per_file.items()))
        left_out = report["left_out_by_sample"].get(path)
        shown += f"; {left_out} left out by the sample" if left_out else ""
        out.append(f"  {path}: {sum(per_file.values())} ({shown})")
    for status in ("survived", "timeout", "suspicious", "no tests", "segfault"):
        listed = [m for m in report["mutants"] if m["status"] == status]
        if not listed:
            continue
        note = " (or its tests failed to collect: mutmut's exit 255)" if status == "timeout" else ""
        out += ["", f"{status} ({len(listed)}){note}:"]
        for path in dict.fromkeys(m["file"] for m in listed):
            out.append(path)
            for m in sorted((m for m in listed if m["file"] == path), key=mutant_order):
                out.append(f"  {path}:{m['line']}  {m['function']}  [{m['name'].rsplit('.')[-1]}]")
                changed = [line for line in m["diff"].splitlines()[2:] if line[:1] in "-+"]
                out += [f"      {line}" for line in changed]
    return "\n".join(out) + "\n"


def mutant_order(m: dict):
    return (m["line"] or 0, int(m["name"].rsplit("_", 1)[-1]))


if __name__ == "__main__":
    sys.exit(main())
