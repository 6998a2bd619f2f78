"""Result files that survive a crash: JSON-lines logs appended one whole line at a time (a torn
last line is skipped when read) and JSON files replaced atomically (never half written)."""

from __future__ import annotations

import json
import os
import pathlib
from collections.abc import Callable, Iterable
from typing import Any


def replace_atomically(path: str | os.PathLike, data: bytes) -> None:
    """Writes ``data`` to a hidden file beside ``path``, syncs it, and renames it to ``path``."""
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def write_json(path: str | os.PathLike, payload: Any) -> None:
    """Writes ``payload`` as JSON, replacing ``path`` atomically."""
    replace_atomically(path, json.dumps(payload, indent=2).encode())


def read_json(path: str | os.PathLike) -> Any:
    return json.loads(pathlib.Path(path).read_text())


class JsonLines:
    """A JSON-lines log. ``append`` writes one whole line with a single ``write`` to a file
    opened for appending, then syncs it; ``read`` ignores a torn last line left by a crash."""

    def __init__(self, path: str | os.PathLike):
        self.path = pathlib.Path(path)

    def read(self) -> list[dict[str, Any]]:
        if not self.path.exists():
            return []
        rows = []
        for line in self.path.read_bytes().split(b"\n"):
            if not line.strip():
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                continue  # a line cut short by a crash
        return rows

    def append(self, row: dict[str, Any]) -> None:
        self.extend([row])

    def extend(self, rows: Iterable[dict[str, Any]]) -> None:
        data = b"".join(json.dumps(row).encode() + b"\n" for row in rows)
        if not data:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            if os.fstat(fd).st_size and not self._ends_with_newline():
                data = b"\n" + data  # leave a torn line on its own line
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)

    def keep(self, predicate: Callable[[dict[str, Any]], bool]) -> list[dict[str, Any]]:
        """Atomically rewrites the log with only the rows for which ``predicate`` holds."""
        rows = [row for row in self.read() if predicate(row)]
        replace_atomically(self.path, b"".join(json.dumps(row).encode() + b"\n" for row in rows))
        return rows

    def _ends_with_newline(self) -> bool:
        with open(self.path, "rb") as f:
            f.seek(-1, os.SEEK_END)
            return f.read(1) == b"\n"


def read_rows(path: str | os.PathLike) -> list[dict[str, Any]]:
    """Rows of a JSON-lines results file (a torn last line is ignored).

    Raises:
        FileNotFoundError: naming the missing file.
    """
    path = pathlib.Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no results file at {path}")
    return JsonLines(path).read()


def read_points(
    path: str | os.PathLike, log_name: str, key: Callable[[dict[str, Any]], Any]
) -> tuple[dict[str, Any], dict[Any, dict[str, Any]]]:
    """A sweep log (``path`` or ``path/log_name``): its first ``"sweep"`` metadata row (``{}``
    if none) and the last ``"point"`` row of each ``key(row["point"])``, in first-seen order.

    Raises:
        FileNotFoundError: naming the missing file.
    """
    path = pathlib.Path(path)
    rows = read_rows(path / log_name if path.is_dir() else path)
    meta = next((row for row in rows if row.get("kind") == "sweep"), {})
    points = {key(row["point"]): row for row in rows if row.get("kind") == "point"}
    return meta, points
