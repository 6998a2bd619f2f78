"""Reading UTF-8 text files from a folder or tar archive, and the :class:`Vocabulary` of their
characters (the file layer of :mod:`bppsa.data.text`, which re-exports everything here)."""

from __future__ import annotations

import dataclasses
import fnmatch
import os
import pathlib
import posixpath
import tarfile
import zlib
from collections.abc import Callable, Sequence

import numpy as np

__all__ = ["TextError", "Vocabulary", "read_texts"]


class TextError(ValueError):
    """A text source or file that cannot be used; the message names it and the fault.

    Attributes:
        path: the folder or archive.
        member: the file, relative to ``path`` (``None`` when the fault is the source's).
        reason: what is wrong.
    """

    def __init__(self, path: str | os.PathLike, reason: str, member: str | None = None):
        self.path = pathlib.Path(path)
        self.member = member
        self.reason = reason
        where = repr(str(self.path)) + ("" if member is None else f", file {member!r}")
        super().__init__(f"{where}: {reason}")


def _codes(text: str) -> np.ndarray:
    """The code points of ``text``, ``(len(text),)`` uint32."""
    return np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)


@dataclasses.dataclass(frozen=True)
class Vocabulary:
    """Characters and their ids: ``chars[k]`` has id ``k``; ``chars`` sorted by code point.

    >>> vocabulary = Vocabulary.of(["abca", "b!"])
    >>> vocabulary.chars, len(vocabulary)
    ('!abc', 4)
    >>> ids = vocabulary.encode("cab")
    >>> ids.tolist(), vocabulary.decode(ids)
    ([3, 1, 2], 'cab')
    """

    chars: str

    def __post_init__(self):
        codes = _codes(self.chars)
        if not len(codes) or np.any(np.diff(codes.astype(np.int64)) <= 0):
            raise ValueError(
                f"chars must be a non-empty string of distinct characters in code point order, "
                f"got {self.chars[:40]!r}."
            )

    @classmethod
    def of(cls, texts: Sequence[str]) -> Vocabulary:
        """The vocabulary of the characters of ``texts``."""
        codes = np.unique(np.concatenate([_codes(text) for text in texts] or [_codes("")]))
        return cls(codes.astype("<u4").tobytes().decode("utf-32-le"))

    def __len__(self) -> int:
        return len(self.chars)

    def encode(self, text: str) -> np.ndarray:
        """The ids ``(len(text),)`` int32 of ``text``'s characters; each must be in ``chars``."""
        known = _codes(self.chars)
        codes = _codes(text)
        ids = np.searchsorted(known, codes)
        bad = np.flatnonzero(known[np.minimum(ids, len(known) - 1)] != codes)
        if bad.size:
            position = int(bad[0])
            raise ValueError(
                f"character {text[position]!r} at position {position} is not in the "
                f"vocabulary ({len(self)} characters)."
            )
        return ids.astype(np.int32)

    def decode(self, ids) -> str:
        """The text of ids ``(n,)`` (ints in ``0..len - 1``)."""
        ids = np.asarray(ids)
        if ids.ndim != 1 or not (ids.size == 0 or np.issubdtype(ids.dtype, np.integer)):
            raise ValueError(f"ids must be a 1-D integer array, got shape {ids.shape}.")
        if ids.size and (ids.min() < 0 or ids.max() >= len(self)):
            raise ValueError(
                f"ids must lie in [0, {len(self)}), got values from {ids.min()} to {ids.max()}."
            )
        return _codes(self.chars)[ids.astype(np.int64)].astype("<u4").tobytes().decode("utf-32-le")


def _in_folder(name: str, folder: str | None) -> bool:
    if folder is None:
        return True
    parent = posixpath.dirname(name)
    return parent == folder or parent.endswith("/" + folder)


def _files(source: pathlib.Path, keep: Callable[[str], bool]) -> tuple[list[str], dict]:
    """The regular files of a folder or archive (sorted relative POSIX names), and the bytes of
    those that ``keep`` accepts."""
    if source.is_dir():
        names = sorted(p.relative_to(source).as_posix() for p in source.rglob("*") if p.is_file())
        return names, {name: (source / name).read_bytes() for name in names if keep(name)}
    names, data = [], {}
    try:
        with tarfile.open(source, "r:*") as archive:
            for member in archive:  # in archive order: a compressed stream only reads forward
                if member.isfile():
                    names.append(member.name.removeprefix("./"))
                    if keep(names[-1]):
                        file = archive.extractfile(member)
                        assert file is not None  # None only for members that are not files
                        data[names[-1]] = file.read()
    except (tarfile.TarError, EOFError, OSError, zlib.error) as error:
        raise TextError(source, f"neither a folder nor a readable tar archive ({error}).") from None
    return sorted(names), data


def read_texts(
    source: str | os.PathLike,
    *,
    folder: str | None = None,
    pattern: str = "*.txt",
    exclude: Sequence[str] = (),
) -> dict[str, str]:
    """The decoded text of every file of ``source`` that is selected, by sorted name.

    Args:
        source: a folder, or a tar archive, of text files.
        folder: only files directly inside a folder whose path is or ends with this one
            (``"a/b"`` matches ``a/b/`` and ``x/a/b/``); ``None``: files at any depth.
        pattern: glob the file name must match.
        exclude: globs of file names to leave out.

    Returns:
        ``{name: text}``, ``name`` the file's path relative to ``source`` (POSIX).

    Raises:
        FileNotFoundError: ``source`` does not exist.
        TextError: ``source`` is neither a folder nor a tar archive, has no such ``folder``, no
            file is selected, or a selected file is empty or not UTF-8 (named, with the byte
            offset of the first bad byte).
    """
    source = pathlib.Path(source).expanduser()
    if not source.exists():
        raise FileNotFoundError(
            f"text source {str(source)!r} does not exist; pass a folder of UTF-8 text files or "
            "a tar archive (.tar.gz) of them."
        )
    folder = None if folder is None else folder.strip("/")

    def selected(name: str) -> bool:
        base = posixpath.basename(name)
        return (
            _in_folder(name, folder)
            and fnmatch.fnmatchcase(base, pattern)
            and not any(fnmatch.fnmatchcase(base, glob) for glob in exclude)
        )

    names, data = _files(source, selected)
    if not names:
        raise TextError(source, "holds no files.")
    inside = [name for name in names if _in_folder(name, folder)]
    if not inside:
        raise TextError(source, f"no file lies in a folder {folder!r} (e.g. {names[0]!r}).")
    if not data:
        where = "" if folder is None else f" in folder {folder!r}"
        outside = f" outside {tuple(exclude)!r}" if exclude else ""
        raise TextError(
            source,
            f"no file{where} matches {pattern!r}{outside} ({len(inside)} other file(s), "
            f"e.g. {inside[0]!r}).",
        )
    texts = {}
    for name in sorted(data):
        if not data[name]:
            raise TextError(source, "the file is empty.", member=name)
        try:
            texts[name] = data[name].decode("utf-8")
        except UnicodeDecodeError as error:
            raise TextError(
                source,
                f"not UTF-8: byte {error.object[error.start]:#04x} at byte offset "
                f"{error.start} ({error.reason}).",
                member=name,
            ) from None
    return texts
