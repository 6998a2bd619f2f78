"""IRMAS instrument recognition, training set: MFCC sequences for the paper's GRU experiment.

Layout read (the IRMAS training set as distributed): a root folder with one sub-folder per
class, ``cel cla flu gac gel org pia sax tru vio voi`` (the label of a clip is its folder's index
in :data:`CLASSES`), each holding stereo 16-bit PCM WAV clips of exactly 3 s at 44.1 kHz. Features
(:func:`load`): per channel librosa's MFCCs with the variant's settings, the 0th coefficient
dropped, each coefficient standardized over the clip, both channels concatenated per frame:

========  ==========  =======  ======  =========  ========
variant   hop_length  n_fft    n_mfcc  features   frames
========  ==========  =======  ======  =========  ========
``S``     512         4096     20      38         259
``M``     256         2048     13      24         517
``L``     128         1024     7       12         1034
========  ==========  =======  ======  =========  ========

Bad data (policy):

* the root missing, empty or not the IRMAS layout (a class folder missing or without any
  ``.wav``), is an error that names the expected folders: ``FileNotFoundError``,
  ``NotADirectoryError`` or :class:`LayoutError`;
* a bad clip (unreadable or corrupt, not WAV/16-bit, mono, not 44.1 kHz, not exactly 3 s, or a
  file whose name starts with another class's tag, e.g. ``[sax]...`` in ``cel/``) is skipped by
  default: it is counted, listed in :attr:`IrmasFeatures.skipped` with its reason, and one
  :class:`IrmasWarning` names the files. With ``strict=True`` the first one raises
  :class:`ClipError` naming the file. If no clip is usable, :class:`IrmasError`;
* folders that are not classes, ``.wav`` files outside the class folders, and entries of class
  folders that are not ``.wav`` files are ignored with an :class:`IrmasWarning`; hidden files
  and other files at the root (a readme) are ignored silently.

Features need the ``irmas`` extra (``pip install -e '.[irmas]'``: librosa, soundfile).
Reference: IRMAS, Bosch, Janer, Fuhrmann & Herrera, ISMIR 2012; features as in the BPPSA
artifact (Wang, Bai & Pekhimenko, MLSys 2020).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import functools
import multiprocessing
import os
import pathlib
import warnings

import numpy as np

from bppsa.data import _irmas_cache
from bppsa.data._irmas_audio import (
    CHANNELS,
    CLIP_SAMPLES,
    CLIP_SECONDS,
    SAMPLE_RATE,
    ClipError,
    IrmasError,
    LayoutError,
    Variant,
    audio_libraries,
    clip_features,
    file_features,
    read_clip,
)
from bppsa.data._irmas_cache import default_cache_dir

CLASSES = ("cel", "cla", "flu", "gac", "gel", "org", "pia", "sax", "tru", "vio", "voi")
NUM_CLASSES = len(CLASSES)
VARIANTS = {
    "S": Variant("S", hop_length=512, n_fft=4096, n_mfcc=20),
    "M": Variant("M", hop_length=256, n_fft=2048, n_mfcc=13),
    "L": Variant("L", hop_length=128, n_fft=1024, n_mfcc=7),
}
SYNTHETIC_MARKER = "SYNTHETIC_FIXTURE.txt"  # written by bppsa.data.irmas_fixture
_NAMED_IN_WARNINGS = 10

__all__ = [
    "CHANNELS",
    "CLASSES",
    "CLIP_SAMPLES",
    "CLIP_SECONDS",
    "NUM_CLASSES",
    "SAMPLE_RATE",
    "SYNTHETIC_MARKER",
    "VARIANTS",
    "ClipError",
    "IrmasError",
    "IrmasFeatures",
    "IrmasWarning",
    "LayoutError",
    "Variant",
    "clip_features",
    "default_cache_dir",
    "find_clips",
    "load",
    "read_clip",
    "resolve_variant",
]


class IrmasWarning(UserWarning):
    """Data was skipped or ignored; the message says which."""


@dataclasses.dataclass(frozen=True, eq=False)
class IrmasFeatures:
    """MFCC sequences of the usable clips, in sorted (class, file name) order.

    Attributes:
        xs: ``(N, frames, features)`` float32.
        labels: ``(N,)`` int32, indices into :data:`CLASSES`.
        files: ``N`` paths relative to the root (``"cel/....wav"``).
        variant: the MFCC settings.
        skipped: ``(path, reason)`` of every bad clip that was skipped.
        synthetic: True for a fixture written by :mod:`bppsa.data.irmas_fixture` (NOT IRMAS).
        from_cache: True when the features were read from the cache, not computed.
        cache_file: the cache file read or written, or ``None`` without a cache.
    """

    xs: np.ndarray
    labels: np.ndarray
    files: tuple[str, ...]
    variant: Variant
    skipped: tuple[tuple[str, str], ...] = ()
    synthetic: bool = False
    from_cache: bool = False
    cache_file: pathlib.Path | None = None

    def __len__(self) -> int:
        return len(self.labels)


def resolve_variant(name: str | Variant) -> Variant:
    """The :class:`Variant` named ``"S"``, ``"M"`` or ``"L"`` (any case); a variant passes."""
    if isinstance(name, Variant):
        return name
    if isinstance(name, str) and name.upper() in VARIANTS:
        return VARIANTS[name.upper()]
    raise ValueError(f"variant must be one of {', '.join(VARIANTS)}, got {name!r}.")


def _expected() -> str:
    return ", ".join(CLASSES)


def find_clips(root: str | os.PathLike) -> tuple[list[tuple[str, int]], list[str]]:
    """The ``.wav`` files of an IRMAS training layout, checked, without reading them.

    Returns:
        ``(clips, ignored)``: ``clips`` are ``(path relative to root, label)`` in sorted order;
        ``ignored`` are the non-class folders and non-``.wav`` entries that were passed over.

    Raises:
        FileNotFoundError, NotADirectoryError: ``root`` is missing or a file.
        LayoutError: ``root`` is empty, lacks a class folder, or a class folder has no ``.wav``.
    """
    root = pathlib.Path(root)
    if not root.exists():
        raise FileNotFoundError(
            f"IRMAS root {str(root)!r} does not exist; pass the folder of the IRMAS training "
            f"set, which holds the class folders {_expected()}."
        )
    if not root.is_dir():
        raise NotADirectoryError(f"IRMAS root {str(root)!r} is a file, not a folder.")
    entries = sorted(p for p in root.iterdir() if not p.name.startswith("."))
    if not entries:
        raise LayoutError(
            f"IRMAS root {str(root)!r} is empty; expected one folder per class: {_expected()}."
        )
    folders = {p.name for p in entries if p.is_dir()}
    missing = [name for name in CLASSES if name not in folders]
    if missing:
        hint = ""
        nested = [p for p in entries if p.is_dir() and all((p / c).is_dir() for c in CLASSES)]
        if nested:
            hint = f" (the class folders are in {str(nested[0])!r}: pass that folder)"
        raise LayoutError(
            f"{str(root)!r} is not the IRMAS training layout: missing class folder(s) "
            f"{', '.join(missing)}; expected one folder per class: {_expected()}{hint}."
        )
    # Other files at the root (a readme, the fixture marker) are not data; folders and clips
    # that cannot be labelled are worth a warning.
    ignored = [
        p.name
        for p in entries
        if p.name not in CLASSES and (p.is_dir() or p.suffix.lower() == ".wav")
    ]
    clips, empty = [], []
    for label, name in enumerate(CLASSES):
        found = 0
        for path in sorted((root / name).iterdir()):
            if path.name.startswith("."):
                continue
            if path.is_file() and path.suffix.lower() == ".wav":
                clips.append((f"{name}/{path.name}", label))
                found += 1
            else:
                ignored.append(f"{name}/{path.name}")
        if not found:
            empty.append(name)
    if empty:
        raise LayoutError(
            f"{str(root)!r}: class folder(s) {', '.join(empty)} hold no .wav clip; every class "
            f"of the IRMAS training set ({_expected()}) has clips."
        )
    return clips, ignored


def _tag_mismatch(relative: str, label: int) -> str | None:
    """A reason if the file name starts with another class's tag (``[sax]...`` in ``cel/``)."""
    name = relative.split("/", 1)[1]
    for other in CLASSES:
        if other != CLASSES[label] and name.lower().startswith(f"[{other}]"):
            return (
                f"file name starts with the tag [{other}] but the clip is in folder "
                f"{CLASSES[label]}/ (label {CLASSES[label]}); refusing a possibly wrong label"
            )
    return None


def _named(items: list[str]) -> str:
    shown = ", ".join(items[:_NAMED_IN_WARNINGS])
    more = len(items) - _NAMED_IN_WARNINGS
    return shown + (f" and {more} more" if more > 0 else "")


def load(
    root: str | os.PathLike,
    variant: str | Variant = "M",
    *,
    strict: bool = False,
    cache: bool = True,
    cache_dir: str | os.PathLike | None = None,
    workers: int = 1,
    progress: bool = True,
) -> IrmasFeatures:
    """MFCC features and labels of every usable clip of an IRMAS training layout.

    Args:
        root: the folder holding the class folders (``.../IRMAS-TrainingData``).
        variant: ``"S"``, ``"M"``, ``"L"`` or a :class:`Variant`.
        strict: raise :class:`ClipError` at the first bad clip instead of skipping it.
        cache: read and write the feature cache (a second load with the same settings and
            unchanged files then computes nothing).
        cache_dir: folder of the cache; default :func:`default_cache_dir`.
        workers: processes that compute features (1: in this process).
        progress: show a progress bar while computing features.

    Returns:
        An :class:`IrmasFeatures`.

    Raises:
        FileNotFoundError, NotADirectoryError, LayoutError: see :func:`find_clips`.
        ClipError: a bad clip with ``strict=True``.
        IrmasError: no clip is usable.
        ImportError: the ``irmas`` extra is not installed.
    """
    chosen = resolve_variant(variant)
    if not isinstance(workers, int) or workers < 1:
        raise ValueError(f"workers must be a positive int, got {workers!r}.")
    root = pathlib.Path(root)
    clips, ignored = find_clips(root)
    if ignored:
        warnings.warn(
            f"{root}: ignored {len(ignored)} entries that are not class folders or .wav clips: "
            f"{_named(ignored)}",
            IrmasWarning,
            stacklevel=2,
        )
    librosa, _ = audio_libraries()
    synthetic = (root / SYNTHETIC_MARKER).exists()
    files = [name for name, _ in clips]
    settings = {**dataclasses.asdict(chosen), "sample_rate": SAMPLE_RATE, "classes": CLASSES}
    key = _irmas_cache.cache_key(root, files, settings, librosa.__version__)
    path = None
    if cache:
        path = _irmas_cache.cache_file(cache_dir or default_cache_dir(), chosen.name, key)
        hit = _irmas_cache.load(path, key)
        if hit is not None:
            xs, labels, meta = hit
            skipped = tuple((str(f), str(r)) for f, r in meta["skipped"])
            features = IrmasFeatures(
                xs, labels, tuple(meta["files"]), chosen, skipped, synthetic, True, path
            )
            return _report(root, features, strict)
    xs, labels, kept, skipped = _compute(root, clips, chosen, strict, workers, progress)
    if not kept:
        raise IrmasError(
            f"{root}: none of the {len(clips)} clips is usable; first problem: "
            f"{skipped[0][0]}: {skipped[0][1]}"
        )
    if path is not None:
        meta = {"files": kept, "skipped": skipped, "settings": settings}
        _irmas_cache.save(path, key, xs, labels, meta)
    features = IrmasFeatures(
        xs, labels, tuple(kept), chosen, tuple(skipped), synthetic, False, path
    )
    return _report(root, features, strict)


def _report(root: pathlib.Path, features: IrmasFeatures, strict: bool) -> IrmasFeatures:
    if features.skipped and strict:  # only possible for features cached by a lenient load
        name, reason = features.skipped[0]
        raise ClipError(root / name, reason)
    if features.skipped:
        names = [name for name, _ in features.skipped]
        warnings.warn(
            f"{root}: skipped {len(names)} bad clip(s) of {len(names) + len(features)}: "
            f"{_named(names)} (reasons in IrmasFeatures.skipped; strict=True raises instead)",
            IrmasWarning,
            stacklevel=3,
        )
    return features


def _compute(root, clips, chosen, strict, workers, progress):
    from tqdm.auto import tqdm

    reasons = {name: _tag_mismatch(name, label) for name, label in clips}
    if strict:
        for name, reason in reasons.items():
            if reason is not None:
                raise ClipError(root / name, reason)
    todo = [name for name, _ in clips if reasons[name] is None]
    extract = functools.partial(file_features, variant=chosen)
    features = {}
    bar = tqdm(total=len(todo), desc=f"IRMAS MFCC {chosen.name}", unit="clip", disable=not progress)
    paths = [str(root / name) for name in todo]
    with bar, contextlib.ExitStack() as stack:
        if workers == 1:
            outputs = map(extract, paths)
        else:
            pool = _pool(workers)
            # On an error (strict, Ctrl-C) drop the queued clips instead of finishing them.
            stack.callback(pool.shutdown, wait=True, cancel_futures=True)
            outputs = pool.map(extract, paths, chunksize=4)
        for name, (feature, reason) in zip(todo, outputs, strict=True):
            if reason is not None and strict:
                raise ClipError(root / name, reason)
            features[name], reasons[name] = feature, reason
            bar.update()
    kept = [(name, label) for name, label in clips if reasons[name] is None]
    skipped = [(name, reason) for name, reason in reasons.items() if reason is not None]
    if not kept:
        return None, None, [], skipped
    xs = np.stack([features[name] for name, _ in kept])
    labels = np.asarray([label for _, label in kept], np.int32)
    return xs, labels, [name for name, _ in kept], skipped


def _pool(workers: int) -> concurrent.futures.ProcessPoolExecutor:
    # "spawn": forking a process that runs JAX's threads can deadlock.
    context = multiprocessing.get_context("spawn")
    return concurrent.futures.ProcessPoolExecutor(workers, mp_context=context)
