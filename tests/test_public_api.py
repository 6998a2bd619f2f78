"""The public surface: ``bppsa.scan`` is both the function and the subpackage, ``__all__`` lists
public names only, docstring examples run, and importing bppsa needs no plotting or progress
libraries."""

import doctest
import importlib
import inspect
import pydoc
import subprocess
import sys

import jax
import jax.numpy as jnp
import pytest

import bppsa
from tests.helpers import assert_trees_close

XS = jnp.linspace(-1.0, 1.0, 21).reshape(7, 3)


def body(h, x):
    return jnp.tanh(0.5 * h + x), h


def test_scan_is_the_function_and_the_subpackage():
    import bppsa.scan as s
    from bppsa.scan import Blelloch, Dense

    assert s is bppsa.scan
    assert s.Blelloch is Blelloch is bppsa.Blelloch
    assert s.Dense is Dense
    assert_trees_close(s(body, jnp.zeros(3), XS), jax.lax.scan(body, jnp.zeros(3), XS), "float32")
    assert "method" in inspect.signature(bppsa.scan).parameters
    assert "exactly like ``jax.lax.scan``" in bppsa.scan.__doc__
    module = sys.modules["bppsa.scan"]  # the subpackage, callable too
    assert "drop-in for ``jax.lax.scan``" in module.__doc__ and module.Dense is Dense
    assert_trees_close(module(body, jnp.zeros(3), XS), s(body, jnp.zeros(3), XS), "float32")


def test_help_on_bppsa_scan_is_the_function_s_page():
    page = pydoc.render_doc(bppsa.scan, renderer=pydoc.plaintext)
    assert page.startswith("Python Library Documentation: function scan")
    assert len(page) < 20_000  # the function's docstring, not the subpackage's every class
    assert "\n    Args:\n        f: ``f(carry, x) -> (carry, y)``" in page
    assert "unroll: 'int | bool' = 1" in page  # the signature, through the wrapper


@pytest.mark.parametrize("module", ["bppsa", "bppsa.scan", "bppsa.models", "bppsa.jacobians"])
def test_all_lists_public_names_that_exist(module):
    mod = importlib.import_module(module)
    for name in mod.__all__:
        assert not name.startswith("_"), name
        assert hasattr(mod, name), name


DOCTEST_MODULES = [
    "bppsa.scan._core.api",
    "bppsa.scan._core.grad",
    "bppsa.scan._core.plans",
    "bppsa.scan._core.fallback",
    "bppsa.scan._core.body",
    "bppsa.scan._core.methods.auto",
    "bppsa.scan._core.methods.sharded",
    "bppsa.scan._core.methods.fused_sequential",
    "bppsa.scan._core.newton",
    "bppsa.scan._core.fused.forward",
    "bppsa.scan._core.auto_forward",
    "bppsa.scan._profile",
    "bppsa.scan._core.profiles",
    "bppsa.models._classifier",
    "bppsa.models._chain",
    "bppsa.models._pruning",
    "bppsa.data.synthetic",
    "bppsa.data.cifar10",
    "bppsa.data.text",
    "bppsa.data._text_files",
]


@pytest.mark.parametrize("module", DOCTEST_MODULES)
def test_docstring_examples_run(module):
    mod = importlib.import_module(module)
    globs = dict(jax=jax, jnp=jnp, bppsa=bppsa) | vars(mod)
    result = doctest.testmod(mod, globs=globs, optionflags=doctest.ELLIPSIS, verbose=False)
    assert result.attempted > 0, f"{module} has no examples"
    assert result.failed == 0, f"{result.failed} of {result.attempted} examples failed"


def test_every_docstring_example_is_run():
    """A module with examples that is not in DOCTEST_MODULES would go unchecked."""
    import pkgutil

    with_examples = set()
    for info in pkgutil.walk_packages(bppsa.__path__, "bppsa."):
        source = inspect.getsource(importlib.import_module(info.name))
        if ">>> " in source:
            with_examples.add(info.name)
    assert with_examples == set(DOCTEST_MODULES)


def test_importing_bppsa_needs_no_plotting_or_progress_bars():
    code = (
        "import sys, bppsa, bppsa.models, bppsa.jacobians, bppsa.data; "
        "print(sorted(m for m in ('matplotlib', 'tqdm', 'librosa') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_package_ships_py_typed():
    """PEP 561: the marker makes type checkers read the annotations of the public API."""
    import pathlib

    assert (pathlib.Path(bppsa.__file__).parent / "py.typed").is_file()
