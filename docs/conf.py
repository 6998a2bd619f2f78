"""Sphinx configuration of bppsa's documentation: the README's front part as the front page, the
pages of docs/*.md (MyST markdown: guide, measurements, experiments, design), then the API
reference generated from the docstrings (Google style) of what each package's ``__all__``
exports. Built by ``make docs`` and by tests/test_docs.py, with warnings as errors."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # bppsa from this checkout

import bppsa

project = "bppsa"
author = "bppsa contributors"
release = bppsa.__version__

extensions = ["sphinx.ext.autodoc", "sphinx.ext.napoleon", "myst_parser"]
source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
exclude_patterns = ["_build"]
# Anchors for the headings of the pages (down to ###), so that ``[text](page.md#a-heading)`` and
# ``[text](#a-heading)`` links resolve.
myst_heading_anchors = 3
html_theme = "alabaster"

# ``:members:`` follows each module's ``__all__``, in its order: a name added there is documented
# without editing the docs. Members not in ``__all__`` (private modules) stay out.
autodoc_default_options = {"members": True, "member-order": "bysource"}

napoleon_google_docstring = True
napoleon_numpy_docstring = False
# "Attributes:" sections as fields of their class: as ``.. attribute::`` entries they would
# duplicate the fields autodoc documents itself (NamedTuple and dataclass fields).
napoleon_use_ivar = True

# One page per public module, docs/api/<module>.rst. A package re-exports some names of its
# subpackages (``bppsa`` the methods of ``bppsa.scan``, ``bppsa.data`` the ``ImageSet`` of
# ``bppsa.data.cifar10``): each object is documented once, under its shortest public name, so a
# module's page skips what a package above it exports (documenting it twice would register the
# class's private canonical name twice: a "duplicate object description" warning).
API_PAGES = "api/"


def _exported_above(module, name, obj):
    parts = module.split(".")
    for i in range(1, len(parts)):
        package = sys.modules.get(".".join(parts[:i]))
        if name in getattr(package, "__all__", ()) and getattr(package, name, None) is obj:
            return True
    return False


def _skip_member(app, what, name, obj, skip, options):
    page = app.env.docname
    if (
        what == "module"
        and page.startswith(API_PAGES)
        and _exported_above(page.removeprefix(API_PAGES), name, obj)
    ):
        return True
    # The function bppsa.scan has the name of the module bppsa.scan, which its page documents
    # (with the function, :no-index:): as a member of bppsa it would be a second object so named.
    if what == "module" and f"{page.removeprefix(API_PAGES)}.{name}" in sys.modules:
        return True
    # A NamedTuple's fields ("Alias for field number i"): the class's "Attributes:" section
    # describes them.
    if what == "class" and (getattr(obj, "__doc__", None) or "").startswith("Alias for field"):
        return True
    return None


def setup(app):
    app.connect("autodoc-skip-member", _skip_member)
