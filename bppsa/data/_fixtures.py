"""What the synthetic fixture writers share: claiming a folder for synthetic files."""

from __future__ import annotations

import pathlib


def claim_folder(folder: pathlib.Path, marker: str, what: str) -> pathlib.Path:
    """Creates ``folder`` for a synthetic fixture and returns its marker file's path.

    Raises:
        FileExistsError: ``folder`` is not empty and holds no ``marker`` (it is not a fixture:
            real data is never written into).
    """
    if folder.exists() and any(folder.iterdir()) and not (folder / marker).exists():
        raise FileExistsError(
            f"{str(folder)!r} is not empty and is not a synthetic fixture (no {marker}); "
            f"refusing to write synthetic {what} into it."
        )
    folder.mkdir(parents=True, exist_ok=True)
    return folder / marker
