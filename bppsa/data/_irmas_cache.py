"""On-disk cache of IRMAS features: one ``.npz`` per variant and key.

The key hashes everything the features depend on: the cache format, the variant's settings,
the sample rate, the MFCC library's version, and every clip's path, size and modification time
(bad clips included, so that replacing one changes the key). A stale or corrupt cache file is
never read as valid; it is recomputed.
"""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
import zipfile
from collections.abc import Sequence
from typing import Any

import numpy as np

FORMAT = 2  # bump when the features or the file format change


def default_cache_dir() -> pathlib.Path:
    """``$XDG_CACHE_HOME/bppsa/irmas`` (``~/.cache/bppsa/irmas`` by default)."""
    base = os.environ.get("XDG_CACHE_HOME") or pathlib.Path.home() / ".cache"
    return pathlib.Path(base) / "bppsa" / "irmas"


def cache_key(
    root: pathlib.Path, files: Sequence[str], settings: dict[str, Any], library_version: str
) -> str:
    """A hex digest of the settings and of each file's relative path, size and mtime."""
    digest = hashlib.sha256()
    header = {"format": FORMAT, "settings": settings, "library": library_version}
    digest.update(json.dumps(header, sort_keys=True).encode())
    for name in files:
        stat = (root / name).stat()
        digest.update(f"\n{name}\t{stat.st_size}\t{stat.st_mtime_ns}".encode())
    return digest.hexdigest()


def cache_file(cache_dir: str | os.PathLike, variant_name: str, key: str) -> pathlib.Path:
    return pathlib.Path(cache_dir) / f"irmas-{variant_name}-{key[:20]}.npz"


def save(path: pathlib.Path, key: str, xs: np.ndarray, labels: np.ndarray, meta: dict) -> None:
    """Writes the arrays and JSON ``meta`` atomically (a crash leaves no partial file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    payload = json.dumps({"key": key, **meta}).encode()
    with open(tmp, "wb") as f:
        np.savez(f, xs=xs, labels=labels, meta=np.frombuffer(payload, np.uint8))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def load(path: pathlib.Path, key: str) -> tuple[np.ndarray, np.ndarray, dict] | None:
    """``(xs, labels, meta)`` if ``path`` holds a readable cache for ``key``, else ``None``."""
    if not path.exists():
        return None
    try:
        with np.load(path) as data:
            meta = json.loads(data["meta"].tobytes().decode())
            if meta.get("key") != key:
                return None
            return data["xs"], data["labels"], meta
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile):  # truncated, foreign
        return None
