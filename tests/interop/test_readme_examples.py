"""The README's section "Your own cell (equinox, flax)" runs: every ``python`` code block under
that heading (up to the next ``## `` heading), each on its own, as a reader would paste it."""

import pathlib
import re

import pytest

pytest.importorskip("equinox")
pytest.importorskip("flax")

README = pathlib.Path(__file__).parents[2] / "README.md"
HEADING = "## Your own cell (equinox, flax)"


def examples() -> list[str]:
    text = README.read_text()
    assert HEADING in text, f"README.md has no section {HEADING!r}"
    section = text.split(HEADING, 1)[1].split("\n## ", 1)[0]
    return re.findall(r"^```python\n(.*?)^```", section, re.S | re.M)


def test_the_section_has_the_examples():
    code = examples()
    assert len(code) >= 5
    for library in ("import equinox", "import flax.linen", "from flax import nnx", "import optax"):
        assert any(library in block for block in code), library
    assert any("transposed_jacobian" in block for block in code)


@pytest.mark.parametrize("index", range(len(examples())))
def test_the_example_runs(index):
    exec(compile(examples()[index], f"README.md, {HEADING!r}, example {index}", "exec"), {})
