"""The examples of the README and of the documentation pages run: every ```python code block of
README.md and docs/*.md, each on its own, as a reader would paste it. A block is left out only
when the line before its fence is a comment saying so (``<!-- not run ... -->`` or
``% not run ...``); output and shell commands go in ```text, ```console or ```bash blocks, which
are not run. A block that imports equinox or flax is skipped when that package is missing."""

import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).parents[2]
FILES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
OPTIONAL = ("equinox", "flax")  # the interop extra

FENCE = re.compile(r"^```python\n(.*?)^```", re.S | re.M)
NOT_RUN = re.compile(r"^(<!--|%)\s*not run\b")


def code_blocks(text: str) -> list[tuple[str, bool]]:
    """The ```python blocks of a markdown text, in order, each with whether it is to run."""
    blocks = []
    for match in FENCE.finditer(text):
        before = text[: match.start()].rstrip("\n").rpartition("\n")[2]
        blocks.append((match.group(1), not NOT_RUN.match(before.strip())))
    return blocks


def examples() -> list[tuple[pathlib.Path, int, str]]:
    return [
        (path, index, code)
        for path in FILES
        for index, (code, run) in enumerate(code_blocks(path.read_text()))
        if run
    ]


def test_blocks_marked_not_run_and_other_languages_are_left_out():
    text = (
        "```python\nx = 1\n```\n\n<!-- not run: needs 2 devices -->\n```python\ny = 2\n```\n"
        "% not run\n```python\nz = 3\n```\n```text\nw = 4\n```\n```console\n$ make\n```\n"
    )
    assert code_blocks(text) == [("x = 1\n", True), ("y = 2\n", False), ("z = 3\n", False)]


def test_the_readme_and_the_guide_have_their_examples():
    names = {path.name: [] for path in FILES}
    for path, _, code in examples():
        names[path.name].append(code)
    readme, guide = names["README.md"], names["guide.md"]
    assert any("bppsa.grad(loss" in block for block in readme)  # the quickstart
    assert any("import equinox" in block for block in readme)  # the interop snippet
    for library in ("import equinox", "import flax.linen", "from flax import nnx", "import optax"):
        assert any(library in block for block in guide), library
    assert any("transposed_jacobian" in block for block in guide)
    for page in ("feedforward.md", "parallel_forward.md", "multidevice.md"):
        assert names[page], f"docs/{page} has no runnable example"


@pytest.mark.parametrize(
    "path, index, code",
    examples(),
    ids=[f"{path.relative_to(ROOT)}-block{index}" for path, index, _ in examples()],
)
def test_the_example_runs(path, index, code):
    for module in OPTIONAL:
        if re.search(rf"^\s*(import|from) {module}\b", code, re.M):
            pytest.importorskip(module)
    exec(compile(code, f"{path.relative_to(ROOT)}, python block {index}", "exec"), {})
