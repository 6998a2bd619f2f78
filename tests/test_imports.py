"""The package's import structure: the contract of pyproject.toml holds (for bppsa's subpackages
and for the research code: benchmarks -> experiments -> paper_figures), fails on a planted
back-arrow, and no module imports inside a function except an optional dependency; the
installed package exposes only ``bppsa``, not the research folders."""

from __future__ import annotations

import ast
import json
import os
import pathlib
import shutil
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "bppsa"
# The root packages of the import contract: the library and the research code.
ROOTS = ("bppsa", "benchmarks", "experiments", "paper_figures")
# Top-level names of this repository that the installed package must not expose (timing,
# results_io and mutation were top-level packages once; the names are also taken on the index).
NOT_EXPOSED = ("timing", "results_io", "mutation", "experiments", "benchmarks", "paper_figures")

# Imports a function may make: optional dependencies, each behind an extra of pyproject.toml.
OPTIONAL = {"librosa", "soundfile", "sklearn", "tqdm", "matplotlib"}


def lint_imports(root: pathlib.Path) -> subprocess.CompletedProcess:
    command = [
        str(pathlib.Path(sys.executable).with_name("lint-imports")),
        "--config",
        str(root / "pyproject.toml"),
        "--no-cache",
    ]
    env = {"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"}
    return subprocess.run(command, cwd=root, env=env, capture_output=True, text=True, timeout=300)


def test_the_import_contract_holds():
    result = lint_imports(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


@pytest.mark.parametrize(
    ("module", "planted", "contract"),
    [
        ("scan/_core/api.py", "import bppsa.models", "Subpackages point one way"),
        ("scan/_elements.py", "from bppsa.jacobians import _cells", "Subpackages point one way"),
        ("scan/_core/methods/base.py", "from bppsa.scan._core.methods import auto", "No import"),
        ("data/synthetic.py", "import bppsa.scan", "The data readers stand apart"),
        ("../paper_figures/fig7.py", "import experiments.methods", "The research code points"),
        ("../experiments/demo.py", "from benchmarks import speed", "The research code points"),
        ("../paper_figures/result_files/files.py", "import jax", "The figures and the result"),
        ("scan/_core/api.py", "import paper_figures.result_files", "bppsa imports none"),
    ],
)
def test_the_contract_fails_on_a_planted_back_arrow(tmp_path, module, planted, contract):
    ignore = shutil.ignore_patterns("__pycache__", "results", "output")
    for root in ROOTS:
        shutil.copytree(ROOT / root, tmp_path / root, ignore=ignore)
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    target = tmp_path / "bppsa" / module
    target.write_text(target.read_text() + f"\n{planted}\n")
    result = lint_imports(tmp_path)
    assert result.returncode == 1, result.stdout
    broken = [line for line in result.stdout.splitlines() if line.endswith("BROKEN")]
    assert any(line.startswith(contract) for line in broken), result.stdout


def _local_imports(tree: ast.AST) -> list[tuple[int, str]]:
    """``(line, module)`` of every import inside a function body."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            for inner in ast.walk(node):
                if isinstance(inner, ast.Import):
                    found += [(inner.lineno, alias.name) for alias in inner.names]
                elif isinstance(inner, ast.ImportFrom):
                    found.append((inner.lineno, "." * inner.level + (inner.module or "")))
    return found


def test_no_function_imports_a_module_except_an_optional_dependency():
    offending = []
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        for line, module in _local_imports(tree):
            if module.split(".")[0] not in OPTIONAL:
                offending.append(f"{path.relative_to(ROOT)}:{line}: {module}")
    assert offending == []


def test_the_local_import_check_sees_one():
    tree = ast.parse("def f():\n    from bppsa.scan import _core\n    import tqdm\n")
    assert _local_imports(tree) == [(2, "bppsa.scan"), (3, "tqdm")]


def test_the_installed_package_exposes_only_bppsa(tmp_path):
    """Outside the repository (no PYTHONPATH), the environment running the tests finds
    ``bppsa`` and none of the research folders: the editable install is exact
    (``dev-mode-exact`` in pyproject.toml), not the repository root on ``sys.path``. Fails in
    an environment installed before that (``make test`` reinstalls when pyproject.toml
    changes)."""
    names = ("bppsa", *NOT_EXPOSED)
    code = (
        "import importlib.util, json, sys\n"
        f"names = {names!r}\n"
        "specs = {n: importlib.util.find_spec(n) for n in names}\n"
        "print(json.dumps({n: s and (s.origin or str(s.submodule_search_locations))"
        " for n, s in specs.items()}))\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONSAFEPATH")}
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout.splitlines()[-1])
    assert found.pop("bppsa"), "bppsa is not installed in this environment"
    assert {name: origin for name, origin in found.items() if origin} == {}
