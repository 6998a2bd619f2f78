"""pytest plugin of ``make mutate``, loaded by mutmut (``[tool.mutmut]`` in pyproject.toml).

It keeps mutmut's runs to the tests of the mutated scope (globs, so new files join); clears
JAX's caches before each test while mutmut maps tests to the functions they call (a program
compiled for an earlier test would call no Python function, and hide the later test's use of
it); and runs a mutant's tests fastest first, as measured then, so that most mutants die in
seconds (mutmut's fork server runs them in the order of a set).

The tests' time is mostly compilation, and each mutant runs in a fresh process: they share
JAX's persistent compilation cache in mutants/ (keyed on the compiled program, so a mutant
that changes a program compiles it anew; the same program loads; about 3x faster here).
"""

import fnmatch
import json
import math
import os
from pathlib import Path

import jax

jax.config.update("jax_compilation_cache_dir", str(Path(__file__).parents[2] / "jax-cache"))
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)

TESTS = (
    "tests/core/test_structure*.py",  # test_structure.py, test_structure_*.py, ..._policy.py
    "tests/core/test_check_structure*.py",
    "tests/core/test_auto_rules.py",
    "tests/core/test_auto_forward.py",  # the forward's policy
    "tests/core/test_decision.py",
    "tests/scan/test_blocks.py",
    "tests/scan/test_diagonal_elements.py",
    "tests/experiments/timing/test_*.py",  # the timing summary
)


def pytest_ignore_collect(collection_path, config):
    if collection_path.suffix != ".py" or not collection_path.name.startswith("test_"):
        return None
    path = collection_path.relative_to(config.rootpath).as_posix()
    return None if any(fnmatch.fnmatch(path, glob) for glob in TESTS) else True


def pytest_collection_modifyitems(config, items):
    stats = config.rootpath / "mutmut-stats.json"
    if os.environ.get("MUTANT_UNDER_TEST") == "stats" or not stats.exists():
        return
    seconds = json.loads(stats.read_text())["duration_by_test"]
    items.sort(key=lambda item: seconds.get(item.nodeid, math.inf))


def pytest_runtest_setup(item):
    if os.environ.get("MUTANT_UNDER_TEST") == "stats":
        jax.clear_caches()
