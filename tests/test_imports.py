"""The package's import structure: the contract of pyproject.toml holds, fails on a planted
back-arrow, and no module imports inside a function except an optional dependency."""

from __future__ import annotations

import ast
import pathlib
import shutil
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "bppsa"

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
    ],
)
def test_the_contract_fails_on_a_planted_back_arrow(tmp_path, module, planted, contract):
    shutil.copytree(PACKAGE, tmp_path / "bppsa", ignore=shutil.ignore_patterns("__pycache__"))
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
