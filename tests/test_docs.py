"""The documentation builds without warnings (``make docs`` runs the same Sphinx build into
docs/_build/html), and its API reference holds every class and function of the public modules'
``__all__``: a name added there is documented without editing docs/."""

import importlib
import inspect
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent

# The modules with a page docs/api/<module>.rst; a name that a package above re-exports is
# documented (once) on that package's page.
PAGES = [
    "bppsa",
    "bppsa.scan",
    "bppsa.jacobians",
    "bppsa.models",
    "bppsa.data",
    "bppsa.data.synthetic",
    "bppsa.data.cifar10",
    "bppsa.data.digits",
    "bppsa.data.irmas",
    "bppsa.data.text",
]


@pytest.fixture(scope="module")
def html(tmp_path_factory):
    out = tmp_path_factory.mktemp("docs")
    command = [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html"]
    command += ["-d", str(out / "doctrees"), str(ROOT / "docs"), str(out / "html")]
    result = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert result.returncode == 0 and "WARNING" not in result.stderr, result.stderr
    return out / "html"


def anchors(html, module):
    return set(re.findall(r'id="([^"]+)"', (html / "api" / f"{module}.html").read_text()))


def test_docs_build_without_warnings_with_the_usage_and_api_pages(html):
    assert "bppsa.scan" in (html / "index.html").read_text()
    assert "What it does" in (html / "usage.html").read_text()  # the README, included
    assert {"module-bppsa", "bppsa.Blelloch", "bppsa.grad"} <= anchors(html, "bppsa")
    assert {"module-bppsa.scan", "bppsa.scan.Dense"} <= anchors(html, "bppsa.scan")
    # bppsa.scan is also the function: documented with the signature and docstring of the call.
    for page in ("bppsa", "bppsa.scan"):
        text = (html / "api" / f"{page}.html").read_text()
        assert "drop-in for" in text and "memory_limit" in text, page


@pytest.mark.parametrize("module", PAGES)
def test_every_public_class_and_function_is_documented(html, module):
    mod = importlib.import_module(module)
    above = [".".join(module.split(".")[:i]) for i in range(1, module.count(".") + 1)]
    documented = anchors(html, module).union(*(anchors(html, p) for p in above))
    for name in getattr(mod, "__all__", ()):
        obj = getattr(mod, name)
        if inspect.isclass(obj) or inspect.isfunction(obj):
            where = [f"{p}.{name}" for p in [module, *above]]
            assert documented.intersection(where), (
                f"{module}.{name} has no entry in the API reference (a docstring missing?)"
            )
