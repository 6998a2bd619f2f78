"""The typed front door: ``bppsa.scan(...)`` and ``bppsa.grad(...)`` type-check under mypy.

``bppsa.scan`` is a module made callable at run time; to a type checker it is
``bppsa.scan._ScanModule``, the function's signature with the subpackage's names. mypy runs on
the README's examples and on a snippet of the front door, and must reject a wrong argument
(so that the check can fail). The package itself type-checks clean under pyproject.toml's
``[tool.mypy]``, as ``make lint`` runs it.
"""

import inspect
import os
import pathlib
import subprocess
import sys

import bppsa
from bppsa.scan import _ScanModule
from tests.interop.test_readme_examples import code_blocks

ROOT = pathlib.Path(__file__).parents[1]

FRONT_DOOR = """
import jax
import jax.numpy as jnp

import bppsa
import bppsa.scan as s
from bppsa.scan import Blelloch, Dense

carry, ys = bppsa.scan(lambda h, x: (h + x, h), jnp.zeros(3), jnp.ones((4, 3)), method="blelloch")
loss = lambda w: bppsa.scan(lambda h, x: (jnp.tanh(w * h + x), None), jnp.zeros(()), jnp.ones(5))[0]
g = bppsa.grad(loss, method=Blelloch(), check_structure=True)(0.5)
value, g = bppsa.value_and_grad(loss, precision="highest")(0.5)
maps = bppsa.scan.Dense(jnp.ones((2, 3, 3)))
same: Dense = s.Dense(jnp.ones((2, 3, 3)))
g_all = bppsa.scan.blelloch(jnp.ones(3), maps, None)
method: bppsa.Method = bppsa.scan.Chunked(4)
"""

WRONG = """
import jax.numpy as jnp

import bppsa

bppsa.scan(lambda h, x: (h, h), 0.0, jnp.ones(3), method=3)
"""


def _mypy(tmp_path: pathlib.Path, sources: dict[str, str]) -> subprocess.CompletedProcess:
    for name, text in sources.items():
        (tmp_path / f"{name}.py").write_text(text)
    command = [sys.executable, "-m", "mypy", "--cache-dir", str(tmp_path / ".mypy_cache")]
    command += ["--no-error-summary", "--follow-imports=silent"]
    command += sorted(f"{name}.py" for name in sources)
    # The editable install exposes bppsa through an import hook, which mypy does not read: it
    # finds the package on MYPYPATH (its own errors silenced, as an installed package's are).
    env = {**os.environ, "MYPYPATH": str(ROOT)}
    return subprocess.run(
        command, cwd=tmp_path, capture_output=True, text=True, timeout=300, env=env
    )


def test_the_readme_and_the_front_door_type_check(tmp_path):
    readme = (ROOT / "README.md").read_text()
    sources = {f"readme_{i}": code for i, (code, run) in enumerate(code_blocks(readme)) if run}
    assert len(sources) >= 2
    result = _mypy(tmp_path, {**sources, "front_door": FRONT_DOOR})
    assert result.returncode == 0, result.stdout + result.stderr


def test_a_wrong_argument_is_a_type_error(tmp_path):
    result = _mypy(tmp_path, {"wrong": WRONG})
    assert result.returncode == 1
    assert 'Argument "method"' in result.stdout and "Method | Policy | str | None" in result.stdout


def test_the_package_type_checks(tmp_path):
    # The configuration of pyproject.toml (run from the repository root), with a cache of its
    # own: about 10 s.
    command = [sys.executable, "-m", "mypy", "--cache-dir", str(tmp_path / ".mypy_cache")]
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    # Every module was checked (not a configuration that finds none).
    modules = len(list((ROOT / "bppsa").rglob("*.py")))
    assert f"no issues found in {modules} source files" in result.stdout, result.stdout


def test_the_type_of_bppsa_scan_lists_the_names_of_the_subpackage():
    listed = {
        name: getattr(_ScanModule, name) for name in vars(_ScanModule) if not name.startswith("_")
    }
    assert sorted(listed) == sorted(bppsa.scan.__all__)
    for name, value in listed.items():
        assert value is getattr(bppsa.scan, name), name
    assert inspect.signature(_ScanModule.__call__) == inspect.signature(bppsa.scan)
