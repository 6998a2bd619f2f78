"""CIFAR-10 images and labels for the paper's VGG-11 experiment, read from the "python version".

Layout read (``cifar-10-python.tar.gz`` as distributed, extracted): a folder
``cifar-10-batches-py/`` holding ``data_batch_1`` ... ``data_batch_5`` (the 50,000 training images),
``test_batch`` (the 10,000 test images) and ``batches.meta``. Each batch is a pickle of a dict:
``data`` a ``(n, 3072)`` uint8 array whose row is one image as three row-major 32x32 planes
(1024 red, 1024 green, then 1024 blue values), ``labels`` a list of ``n`` ints in ``0..9``,
``batch_label`` and ``filenames``. ``batches.meta`` holds ``label_names`` (the ten class names),
``num_cases_per_batch`` and ``num_vis`` (3072). The files were written by Python 2, so they are
read with ``encoding="bytes"`` (keys and strings come back as bytes; str keys, as in pickles
re-written by Python 3, are accepted too).

Safety: a pickle can run any code it names. The batches are read by :func:`read_pickle`, whose
unpickler resolves only the globals that NumPy arrays and scalars need (see :data:`_ALLOWED`)
and refuses every other one with :class:`CifarError`, before anything is called.

Values (:func:`load`): ``images`` ``(N, 3, 32, 32)`` (NCHW, the VGG-11's input), pixels scaled to
``[0, 1]`` and, with ``normalize=True``, standardized per channel with the fixed training-set
statistics :data:`TRAIN_MEAN` and :data:`TRAIN_STD` (the same constants for both splits, so the
test split is never looked at). They are the mean and the standard deviation over all pixels of
the 50,000 training images in ``[0, 1]`` units; the often copied ``(0.2023, 0.1994, 0.2010)``
is not that standard deviation and is not used.

The record :class:`ImageSet` that :func:`load` returns, and :func:`standardize`, live in
:mod:`bppsa.data._images` (shared with :mod:`bppsa.data.digits`) and are re-exported here.

Reference: Krizhevsky, *Learning Multiple Layers of Features from Tiny Images*, 2009
(https://www.cs.toronto.edu/~kriz/cifar.html).
"""

from __future__ import annotations

import dataclasses
import importlib
import os
import pathlib
import pickle
from typing import Any

import numpy as np

from bppsa.data._images import SPLITS, ImageSet, _check_split, _float_dtype, standardize

# NumPy >= 2 (its pickles name numpy._core); NumPy 1.x only has numpy.core. Imported by name:
# the private functions read from them below are not in NumPy's stubs.
try:
    _multiarray = importlib.import_module("numpy._core.multiarray")
    _numeric = importlib.import_module("numpy._core.numeric")
except ImportError:  # pragma: no cover - NumPy 1.x
    _multiarray = importlib.import_module("numpy.core.multiarray")
    _numeric = importlib.import_module("numpy.core.numeric")

DIRECTORY = "cifar-10-batches-py"
TRAIN_FILES = tuple(f"data_batch_{i}" for i in range(1, 6))
TEST_FILES = ("test_batch",)
META_FILE = "batches.meta"
CLASS_NAMES = (
    "airplane",
    "automobile",
    "bird",
    "cat",
    "deer",
    "dog",
    "frog",
    "horse",
    "ship",
    "truck",
)
NUM_CLASSES = len(CLASS_NAMES)
IMAGE_SHAPE = (3, 32, 32)  # (channels, height, width) of one image
PIXELS = 3 * 32 * 32  # values per row of a batch's ``data``
# Mean and standard deviation of every pixel of the 50,000 training images, per channel (R, G, B),
# in [0, 1] units.
TRAIN_MEAN = (0.49139968, 0.48215841, 0.44653091)
TRAIN_STD = (0.24703223, 0.24348513, 0.26158784)
SYNTHETIC_TAG = "SYNTHETIC"  # batch_label prefix of the batches of bppsa.data.cifar10_fixture

__all__ = [
    "CLASS_NAMES",
    "DIRECTORY",
    "IMAGE_SHAPE",
    "META_FILE",
    "NUM_CLASSES",
    "PIXELS",
    "SPLITS",
    "SYNTHETIC_TAG",
    "TEST_FILES",
    "TRAIN_FILES",
    "TRAIN_MEAN",
    "TRAIN_STD",
    "Batch",
    "CifarError",
    "ImageSet",
    "find_batches",
    "load",
    "read_batch",
    "read_meta",
    "read_pickle",
    "standardize",
]


class CifarError(ValueError):
    """A CIFAR-10 file that is not what the layout promises; the message names file and fault.

    Attributes:
        path: the file.
        reason: what is wrong with it.
    """

    def __init__(self, path: str | os.PathLike, reason: str):
        self.path = pathlib.Path(path)
        self.reason = reason
        super().__init__(f"{str(self.path)!r}: {reason}")


def _latin1_bytes(text, encoding="utf-8", errors="strict"):
    # Python 3 writes bytes at pickle protocol <= 2 as _codecs.encode(text, "latin1"); that call,
    # and no other codec, is let through.
    if not isinstance(text, str) or encoding not in ("latin1", "latin-1") or errors != "strict":
        raise pickle.UnpicklingError("_codecs.encode is allowed only as text.encode('latin1')")
    return text.encode("latin-1")


# Every global a pickle may name, (module, name) -> the object it resolves to. The real batches
# (NumPy 1, Python 2) need the first three; NumPy 2 names numpy._core; Python 3 at protocol 5
# writes arrays as _frombuffer, at protocol <= 2 writes bytes as _codecs.encode (b"" as bytes()).
_ALLOWED = {
    ("numpy.core.multiarray", "_reconstruct"): _multiarray._reconstruct,
    ("numpy", "ndarray"): np.ndarray,
    ("numpy", "dtype"): np.dtype,
    ("numpy._core.multiarray", "_reconstruct"): _multiarray._reconstruct,
    ("numpy.core.multiarray", "scalar"): _multiarray.scalar,
    ("numpy._core.multiarray", "scalar"): _multiarray.scalar,
    ("numpy.core.numeric", "_frombuffer"): _numeric._frombuffer,
    ("numpy._core.numeric", "_frombuffer"): _numeric._frombuffer,
    ("_codecs", "encode"): _latin1_bytes,
    ("builtins", "bytes"): bytes,
    ("__builtin__", "bytes"): bytes,
}


class _ForbiddenGlobal(pickle.UnpicklingError):
    pass


class _RestrictedUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        try:
            return _ALLOWED[module, name]
        except KeyError:
            raise _ForbiddenGlobal(f"{module}.{name}") from None


def read_pickle(path: str | os.PathLike) -> Any:
    """The object in the pickle file ``path``, unpickled with only NumPy's globals allowed.

    Strings of Python 2 pickles come back as bytes (``encoding="bytes"``).

    Raises:
        FileNotFoundError: ``path`` is missing.
        CifarError: the file is not a pickle, is truncated, or names any other global (a class
            or function that is not NumPy array or scalar reconstruction); nothing it names is
            called then.
    """
    path = pathlib.Path(path)
    with open(path, "rb") as f:
        try:
            return _RestrictedUnpickler(f, encoding="bytes").load()
        except _ForbiddenGlobal as error:
            raise CifarError(
                path,
                f"the pickle names the global {error}, which a CIFAR-10 batch never needs; "
                "refusing to unpickle it (only NumPy array reconstruction is allowed).",
            ) from None
        except EOFError:
            raise CifarError(path, "not a pickle: the file is empty or truncated.") from None
        except Exception as error:
            raise CifarError(
                path, f"not a pickle, or a corrupt one ({type(error).__name__}: {error})."
            ) from None


def _expected() -> str:
    return f"{', '.join(TRAIN_FILES)}, {', '.join(TEST_FILES)} and {META_FILE}"


def find_batches(root: str | os.PathLike) -> pathlib.Path:
    """The batches folder: ``root`` itself if it holds CIFAR-10 batch files, else
    ``root / "cifar-10-batches-py"``.

    Raises:
        FileNotFoundError: ``root`` is missing, or neither folder holds a batch file.
        NotADirectoryError: ``root`` is a file (the archive, not yet extracted, say).
    """
    root = pathlib.Path(root)
    if not root.exists():
        raise FileNotFoundError(
            f"CIFAR-10 root {str(root)!r} does not exist; pass the {DIRECTORY} folder or the "
            "folder that holds it."
        )
    if not root.is_dir():
        hint = " (extract it first: tar xzf ...)" if root.name.endswith((".tar.gz", ".tgz")) else ""
        raise NotADirectoryError(f"CIFAR-10 root {str(root)!r} is a file, not a folder{hint}.")
    names = (*TRAIN_FILES, *TEST_FILES, META_FILE)
    if any((root / name).exists() for name in names):
        return root
    if (root / DIRECTORY).is_dir():
        return root / DIRECTORY
    hint = ""
    if (root / "cifar-10-python.tar.gz").exists():
        hint = " (cifar-10-python.tar.gz is there: extract it)"
    raise FileNotFoundError(
        f"no CIFAR-10 batches in {str(root)!r} nor in {str(root / DIRECTORY)!r}; the python "
        f"version of CIFAR-10 is a folder {DIRECTORY} holding {_expected()}{hint}."
    )


def _file(directory: pathlib.Path, name: str) -> pathlib.Path:
    path = directory / name
    if not path.is_file():
        raise FileNotFoundError(
            f"{str(directory)!r} lacks the CIFAR-10 file {name}; the folder holds "
            f"{_expected()} (an incomplete download or extraction?)."
        )
    return path


def _entries(path: pathlib.Path, obj: Any, required: tuple[str, ...]) -> dict[str, Any]:
    """The dict ``obj`` with bytes keys decoded; every key of ``required`` present."""
    if not isinstance(obj, dict):
        raise CifarError(path, f"expected a pickled dict, found a {type(obj).__name__}.")
    entries = {(k.decode("latin-1") if isinstance(k, bytes) else k): v for k, v in obj.items()}
    missing = [key for key in required if key not in entries]
    if missing:
        found = ", ".join(sorted(map(str, entries))) or "none"
        raise CifarError(path, f"missing key(s) {', '.join(missing)} (keys found: {found}).")
    return entries


def _text(path: pathlib.Path, value: Any, what: str) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    if isinstance(value, str):
        return value
    raise CifarError(path, f"{what} must be a string, found a {type(value).__name__}.")


def _texts(path: pathlib.Path, value: Any, what: str) -> tuple[str, ...]:
    if not isinstance(value, list | tuple):
        raise CifarError(path, f"{what} must be a list of strings, found {type(value).__name__}.")
    return tuple(_text(path, item, f"each entry of {what}") for item in value)


def read_meta(directory: str | os.PathLike) -> tuple[str, ...]:
    """The class names of ``directory / "batches.meta"`` (label ``k`` is the ``k``-th name).

    Raises:
        FileNotFoundError: the file is missing.
        CifarError: not a pickle, no ``label_names``, not ten names, or ``num_vis != 3072``.
    """
    path = _file(pathlib.Path(directory), META_FILE)
    entries = _entries(path, read_pickle(path), ("label_names",))
    names = _texts(path, entries["label_names"], "label_names")
    if len(names) != NUM_CLASSES:
        raise CifarError(
            path, f"label_names has {len(names)} names; CIFAR-10 has {NUM_CLASSES} classes."
        )
    num_vis = entries.get("num_vis", PIXELS)
    if num_vis != PIXELS:
        raise CifarError(path, f"num_vis is {num_vis!r}, expected {PIXELS} (3 x 32 x 32).")
    return names


@dataclasses.dataclass(frozen=True, eq=False)
class Batch:
    """One batch file, as stored.

    Attributes:
        data: ``(n, 3072)`` uint8, a row per image: red, green, blue 32x32 planes, row-major.
        labels: ``(n,)`` int32.
        batch_label: e.g. ``"training batch 1 of 5"``.
        filenames: the ``n`` file names of the images (empty if the file has none).
    """

    data: np.ndarray
    labels: np.ndarray
    batch_label: str
    filenames: tuple[str, ...]


def read_batch(path: str | os.PathLike, num_classes: int = NUM_CLASSES) -> Batch:
    """One batch file (``data_batch_i`` or ``test_batch``), checked.

    Raises:
        FileNotFoundError: the file is missing.
        CifarError: not a pickle, a key missing (``data``, ``labels``), ``data`` not a
            ``(n, 3072)`` uint8 array, ``labels`` not ``n`` ints in ``0..num_classes-1``, or
            ``filenames`` not ``n`` strings.
    """
    path = pathlib.Path(path)
    entries = _entries(path, read_pickle(path), ("data", "labels"))
    data = entries["data"]
    if not isinstance(data, np.ndarray):
        raise CifarError(path, f"data must be a NumPy array, found a {type(data).__name__}.")
    if data.dtype != np.uint8:
        raise CifarError(path, f"data has dtype {data.dtype}, expected uint8.")
    if data.ndim != 2 or data.shape[1] != PIXELS or data.shape[0] == 0:
        raise CifarError(
            path,
            f"data has shape {data.shape}, expected (n, {PIXELS}) with n >= 1: one row per "
            "image of 1024 red, 1024 green and 1024 blue values.",
        )
    n = data.shape[0]
    try:
        labels = np.asarray(entries["labels"])
    except (TypeError, ValueError):  # ragged nested lists
        labels = np.asarray(None)
    if labels.ndim != 1 or labels.dtype.kind not in "iu":
        raise CifarError(
            path,
            f"labels must be a list of ints, found {type(entries['labels']).__name__} "
            f"of dtype {labels.dtype} and shape {labels.shape}.",
        )
    if len(labels) != n:
        raise CifarError(path, f"labels has {len(labels)} entries but data has {n} rows.")
    low, high = int(labels.min()), int(labels.max())
    if low < 0 or high >= num_classes:
        raise CifarError(
            path,
            f"labels out of range: values from {low} to {high}, expected 0..{num_classes - 1}.",
        )
    filenames = _texts(path, entries.get("filenames", ()), "filenames")
    if filenames and len(filenames) != n:
        raise CifarError(path, f"filenames has {len(filenames)} entries but data has {n} rows.")
    batch_label = _text(path, entries.get("batch_label", ""), "batch_label")
    return Batch(data, labels.astype(np.int32), batch_label, filenames)


def load(
    root: str | os.PathLike,
    split: str = "train",
    *,
    dtype=np.float32,
    normalize: bool = True,
) -> ImageSet:
    """The images and labels of one CIFAR-10 split, in file order.

    Args:
        root: the ``cifar-10-batches-py`` folder, or the folder holding it.
        split: ``"train"`` (``data_batch_1`` ... ``data_batch_5``) or ``"test"``
            (``test_batch``).
        dtype: floating dtype of the images.
        normalize: standardize each channel with :data:`TRAIN_MEAN` and :data:`TRAIN_STD`;
            otherwise the pixels are only scaled to ``[0, 1]``.

    Returns:
        An :class:`ImageSet` named ``"cifar10"``.

    Raises:
        FileNotFoundError, NotADirectoryError: see :func:`find_batches`; or a batch file or
            ``batches.meta`` is missing.
        CifarError: a file is not a valid batch (see :func:`read_batch` and :func:`read_meta`).

    Example (on the synthetic fixture; the real training split is ``(50000, 3, 32, 32)``):
        >>> import tempfile
        >>> from bppsa.data import cifar10_fixture
        >>> with tempfile.TemporaryDirectory() as folder:
        ...     _ = cifar10_fixture.write_fixture(folder, per_batch=4)
        ...     train = load(folder, "train")
        >>> train.images.shape, train.labels.dtype, train.synthetic
        ((20, 3, 32, 32), dtype('int32'), True)
        >>> images, labels = train.batch(0, batch_size=8, seed=0)
        >>> images.shape, labels.shape
        ((8, 3, 32, 32), (8,))
    """
    _check_split(split)
    chosen = _float_dtype(dtype)
    directory = find_batches(pathlib.Path(root).expanduser())
    class_names = read_meta(directory)
    names = TRAIN_FILES if split == "train" else TEST_FILES
    paths = [_file(directory, name) for name in names]  # all missing files fail before reading
    batches = [read_batch(path, len(class_names)) for path in paths]
    images = np.concatenate([b.data for b in batches]).reshape(-1, *IMAGE_SHAPE)
    # Compute in at least float32 (float16 would round the standardization twice).
    work = np.dtype(np.float32) if chosen.itemsize < 4 else chosen
    images = images.astype(work)
    images /= work.type(255)  # in place: the training split is 600 MB in float32
    if normalize:
        standardize(images, TRAIN_MEAN, TRAIN_STD)
    return ImageSet(
        images=images.astype(chosen, copy=False),
        labels=np.concatenate([b.labels for b in batches]),
        class_names=class_names,
        name="cifar10",
        split=split,
        synthetic=any(b.batch_label.startswith(SYNTHETIC_TAG) for b in batches),
        mean=TRAIN_MEAN if normalize else None,
        std=TRAIN_STD if normalize else None,
    )
