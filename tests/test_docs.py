"""The documentation builds without warnings (``make docs`` runs the same Sphinx build into
docs/_build/html): the front page (the README's front part), every page of docs/*.md, and an API
reference that holds every class and function of the public modules' ``__all__``: a name added
there is documented without editing docs/."""

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


# The pages of docs/*.md and their titles.
GUIDES = {
    "guide": "User guide",
    "feedforward": "Feed-forward networks",
    "parallel_forward": "Parallel in time both ways",
    "fused": "The sequential loop in one kernel",
    "width": "Width: Jacobians that stay structured",
    "multidevice": "Across devices and hosts",
    "performance": "Performance",
    "accuracy": "Accuracy",
    "experiments": "Experiments",
    "design": "Design",
}


def test_the_front_page_is_the_readme_front_part_with_links_to_every_page(html):
    index = (html / "index.html").read_text()
    for heading in ("Quickstart", "Your own cell (equinox, flax)", "The public API"):
        assert heading in index, heading  # the README's front part, included
    text = re.sub(r"<[^>]+>", "", index)  # the highlighted code's words, without its spans
    assert "make demo" in text and "make test" in text
    # The README's link to docs/guide.md is a link between the pages here.
    assert 'href="guide.html"' in index
    for page in GUIDES:
        assert f'href="{page}.html"' in index, page  # in a table of contents


def test_every_markdown_page_is_built_with_its_title():
    pages = {path.stem for path in (ROOT / "docs").glob("*.md")} - {"index"}
    assert pages == set(GUIDES), "a page of docs/ without an entry in GUIDES, or the reverse"


@pytest.mark.parametrize("page", GUIDES)
def test_the_page_is_built(html, page):
    text = (html / f"{page}.html").read_text()
    assert re.search(rf"<h1>{re.escape(GUIDES[page])}", text), page


def test_docs_build_without_warnings_with_the_api_pages(html):
    assert "bppsa.scan" in (html / "index.html").read_text()
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
            if f"{module}.{name}" in PAGES:  # bppsa.scan: on the page of its module
                documented |= anchors(html, f"{module}.{name}")
                where.append(f"module-{module}.{name}")
            assert documented.intersection(where), (
                f"{module}.{name} has no entry in the API reference (a docstring missing?)"
            )
