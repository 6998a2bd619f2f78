"""A small SYNTHETIC dataset in the exact CIFAR-10 "python version" layout, for tests and demos.

It is NOT CIFAR-10: every image is a synthesized 32x32 RGB picture (a class-specific colour and
grating, phased and tinted at random per image, plus noise). :func:`write_fixture` writes the
folder ``cifar-10-batches-py/`` with ``data_batch_1`` ... ``data_batch_5``, ``test_batch`` and
``batches.meta``, the keys, dtypes and encoding of the real files: protocol-2 pickles as Python 2
wrote them (bytes keys and strings, arrays named by ``numpy.core.multiarray._reconstruct``), so
:func:`bppsa.data.cifar10.load` reads them exactly as it reads the real ones. Every
``batch_label`` starts with ``"SYNTHETIC"`` (which the reader reports as ``ImageSet.synthetic``),
the file names of the images say ``synthetic`` and the folder holds ``SYNTHETIC_FIXTURE.txt``.
"""

from __future__ import annotations

import os
import pathlib
import pickle
from collections.abc import Callable
from typing import Any, ClassVar

import numpy as np

from bppsa.data._fixtures import claim_folder
from bppsa.data.cifar10 import (
    CLASS_NAMES,
    DIRECTORY,
    META_FILE,
    PIXELS,
    SYNTHETIC_TAG,
    TEST_FILES,
    TRAIN_FILES,
)

MARKER = "SYNTHETIC_FIXTURE.txt"
MARKER_TEXT = (
    "SYNTHETIC FIXTURE - NOT CIFAR-10.\n"
    "Synthesized 32x32 images in the CIFAR-10 python-version layout, written by\n"
    "bppsa.data.cifar10_fixture.write_fixture (per_batch={per_batch}, seed={seed}).\n"
    "Results computed on it say nothing about image classification.\n"
)


class _Python2Pickler(pickle._Pickler):
    """Protocol-2 pickles with Python 2's encoding: str and bytes as Python 2 ``str``
    (``SHORT_BINSTRING``/``BINSTRING``), NumPy's globals by their NumPy 1 names.

    The pure-Python pickler is used because only it dispatches on ``bytes`` and ``str``."""

    # The pure-Python pickler's undocumented internals, which typeshed leaves out (write,
    # memoize) or types as the unpickler's (dispatch).
    write: Callable[[bytes], Any]
    memoize: Callable[[Any], None]
    dispatch: ClassVar[dict[type, Callable[[Any, Any], None]]] = pickle._Pickler.dispatch.copy()
    # What NumPy reduces an array to -> its name in the real files.
    _GLOBALS: ClassVar[dict[Any, str]] = {
        np.zeros(0).__reduce__()[0]: "numpy.core.multiarray\n_reconstruct\n",
        np.ndarray: "numpy\nndarray\n",
        np.dtype: "numpy\ndtype\n",
    }

    def __init__(self, file):
        super().__init__(file, protocol=2)

    def save_py2_str(self, obj: bytes | str) -> None:
        data = obj.encode("ascii") if isinstance(obj, str) else obj
        if len(data) < 256:
            self.write(pickle.SHORT_BINSTRING + bytes([len(data)]) + data)
        else:
            self.write(pickle.BINSTRING + len(data).to_bytes(4, "little") + data)
        self.memoize(obj)

    dispatch[bytes] = save_py2_str
    dispatch[str] = save_py2_str

    def save_global(self, obj: Any, name: str | None = None) -> None:
        if obj not in self._GLOBALS:
            raise pickle.PicklingError(f"the fixture pickles only NumPy arrays, not {obj!r}")
        self.write(pickle.GLOBAL + self._GLOBALS[obj].encode("ascii"))
        self.memoize(obj)


def write_pickle(path: str | os.PathLike, obj: Any) -> pathlib.Path:
    """Writes ``obj`` (dicts, lists, ints, bytes, ASCII str, NumPy arrays) as Python 2 did."""
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        _Python2Pickler(f).dump(obj)
    return path


def write_batch(
    path: str | os.PathLike,
    data: np.ndarray,
    labels,
    *,
    batch_label: str = f"{SYNTHETIC_TAG} batch",
    filenames=None,
) -> pathlib.Path:
    """Writes one batch file: ``data: (n, 3072)`` uint8 and ``n`` labels, keys as bytes."""
    if filenames is None:
        filenames = [f"synthetic_{i:06d}.png" for i in range(len(data))]
    return write_pickle(
        path,
        {
            b"batch_label": batch_label.encode("ascii"),
            b"labels": [int(label) for label in labels],
            b"data": np.ascontiguousarray(data, np.uint8),
            b"filenames": [name.encode("ascii") for name in filenames],
        },
    )


def synthetic_images(labels: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """``(n, 3072)`` uint8 rows (R, G, B planes) of synthetic images of classes ``labels``."""
    labels = np.asarray(labels)
    y, x = np.mgrid[0:32, 0:32] / 32.0
    angle = np.pi * labels / len(CLASS_NAMES)
    frequency = 2.0 + labels % 4
    phase = rng.uniform(0.0, 2.0 * np.pi, len(labels))
    along = np.cos(angle)[:, None, None] * x + np.sin(angle)[:, None, None] * y
    grating = 0.5 + 0.5 * np.sin(
        2.0 * np.pi * frequency[:, None, None] * along + phase[:, None, None]
    )
    hue = 2.0 * np.pi * labels / len(CLASS_NAMES)
    colour = 0.5 + 0.4 * np.cos(hue[:, None] - np.array([0.0, 2.1, 4.2]))  # (n, 3)
    colour = colour + rng.normal(0.0, 0.05, colour.shape)
    images = colour[:, :, None, None] * (0.4 + 0.6 * grating[:, None])
    images = images + rng.normal(0.0, 0.03, images.shape)
    return np.round(np.clip(images, 0.0, 1.0) * 255).astype(np.uint8).reshape(-1, PIXELS)


def write_fixture(root: str | os.PathLike, *, per_batch: int = 20, seed: int = 0) -> pathlib.Path:
    """Writes a synthetic ``cifar-10-batches-py`` folder into ``root``.

    Args:
        root: the folder to hold ``cifar-10-batches-py``; created if missing. An existing
            ``cifar-10-batches-py`` is only written into if it is a fixture already (holds
            ``SYNTHETIC_FIXTURE.txt``); anything else raises ``FileExistsError``.
        per_batch: images in each of the six batches (the real files: 10,000), at least 1; the
            labels of a batch cycle through the classes in a random order.
        seed: the files are a deterministic function of ``(per_batch, seed)``.

    Returns:
        The ``cifar-10-batches-py`` folder.
    """
    if isinstance(per_batch, bool) or not isinstance(per_batch, int) or per_batch < 1:
        raise ValueError(f"per_batch must be a positive int, got {per_batch!r}.")
    directory = pathlib.Path(root) / DIRECTORY
    marker = claim_folder(directory, MARKER, "batches")
    marker.write_text(MARKER_TEXT.format(per_batch=per_batch, seed=seed))
    names = (*TRAIN_FILES, *TEST_FILES)
    for index, name in enumerate(names):
        rng = np.random.default_rng([seed, index])
        labels = rng.permutation(np.arange(per_batch) % len(CLASS_NAMES))
        if name in TRAIN_FILES:
            what = f"training batch {index + 1} of {len(TRAIN_FILES)}"
        else:
            what = "testing batch 1 of 1"
        filenames = [
            f"synthetic_{CLASS_NAMES[label]}_s_{index * per_batch + i:06d}.png"
            for i, label in enumerate(labels)
        ]
        write_batch(
            directory / name,
            synthetic_images(labels, rng),
            labels,
            batch_label=f"{SYNTHETIC_TAG} {what} - NOT CIFAR-10",
            filenames=filenames,
        )
    write_pickle(
        directory / META_FILE,
        {
            b"num_cases_per_batch": per_batch,
            b"label_names": [name.encode("ascii") for name in CLASS_NAMES],
            b"num_vis": PIXELS,
        },
    )
    return directory
