"""Runs tests/multidevice/ in a subprocess with 8 emulated CPU devices and reports every case.

The suite keeps one device (tests/conftest.py ignores this folder there), so the outer tests of
tests/core/test_sharded.py run these cases in ONE subprocess per session and selection (the
compilation cache and the import of JAX are shared by every case), read its JUnit report, and
fail per group of cases (one test function here) with the names and messages of the cases that
failed.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import os
import shlex
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ElementTree

MODULE = "tests.multidevice.test_sharded"
PATH = "tests/multidevice/test_sharded.py"
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@dataclasses.dataclass(frozen=True)
class Case:
    """One case as the subprocess ran it: ``name`` such as ``test_x[float32-gru]``."""

    name: str
    outcome: str  # "passed", "failed", "error" or "skipped"
    message: str = ""

    @property
    def group(self) -> str:
        return self.name.split("[", 1)[0]


def _is_slow(marks) -> bool:
    return any(getattr(mark, "name", None) == "slow" for mark in marks)


def _has_cases(fn, slow: bool) -> bool:
    """Whether ``fn`` has a case that ``-m slow`` (``slow``) or ``-m 'not slow'`` selects."""
    marks = getattr(fn, "pytestmark", [])
    if _is_slow(marks):
        return slow
    grids = [mark.args[1] for mark in marks if mark.name == "parametrize"]
    flags = [[_is_slow(getattr(value, "marks", ())) for value in grid] for grid in grids]
    if slow:  # a case is slow when any of its values is
        return any(any(grid) for grid in flags)
    return all(not all(grid) for grid in flags)


def groups(slow: bool = False) -> list[str]:
    """The test functions of tests/multidevice/test_sharded.py that have cases in the default
    suite (``slow=False``) or in ``-m slow``, in file order (the module imports on one device:
    its devices are only asked for inside the tests)."""
    module = importlib.import_module(MODULE)
    functions = [
        fn
        for name, fn in vars(module).items()
        if name.startswith("test_") and inspect.isfunction(fn) and fn.__module__ == MODULE
    ]
    functions.sort(key=lambda fn: fn.__code__.co_firstlineno)
    return [fn.__name__ for fn in functions if _has_cases(fn, slow)]


def command(group_names, marks: str) -> list[str]:
    """The pytest command line of the subprocess (also what a person reruns by hand, with
    ``JAX_NUM_CPU_DEVICES=8``)."""
    nodes = [f"{PATH}::{name}" for name in group_names]
    return [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", marks, *nodes]


def rerun(group_names, marks: str, devices: int) -> str:
    """The shell command that runs these cases by hand, from the repository's root."""
    command_line = shlex.join(["python", *command(group_names, marks)[1:]])
    return f"JAX_NUM_CPU_DEVICES={devices} PYTHONPATH=. {command_line}"


def run(group_names, marks: str, devices: int) -> tuple[dict[str, list[Case]], str]:
    """Runs the cases of ``group_names`` that ``marks`` selects on ``devices`` emulated devices.

    Returns:
        ``({group: [Case, ...]}, log)``: every case the subprocess reported, by group (a group
        with no case is absent), and the tail of its output.
    """
    env = dict(os.environ, JAX_NUM_CPU_DEVICES=str(devices), PYTHONPATH=ROOT)
    with tempfile.TemporaryDirectory() as folder:
        report = os.path.join(folder, "report.xml")
        out = subprocess.run(
            [*command(group_names, marks), f"--junitxml={report}"],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=1800,
        )
        log = out.stdout[-5000:] + out.stderr[-2000:]
        cases = _read(report) if os.path.exists(report) else []
    by_group: dict[str, list[Case]] = {}
    for case in cases:
        by_group.setdefault(case.group, []).append(case)
    return by_group, log


def _read(report: str) -> list[Case]:
    cases = []
    for element in ElementTree.parse(report).iter("testcase"):
        name = element.get("name", "")
        outcome, message = "passed", ""
        for kind in ("failure", "error", "skipped"):
            found = element.find(kind)
            if found is not None:
                outcome = {"failure": "failed"}.get(kind, kind)
                message = (found.get("message") or "") + "\n" + (found.text or "")
                break
        cases.append(Case(name, outcome, message.strip()))
    return cases
