"""One IRMAS clip: reading a WAV file strictly, and its MFCC features (the ``irmas`` extra).

The audio libraries are imported on first use, so that ``bppsa.data.irmas`` imports (and its
layout checks and fixture writer work) without the extra installed.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import numpy as np

SAMPLE_RATE = 44_100
CHANNELS = 2
CLIP_SECONDS = 3
CLIP_SAMPLES = SAMPLE_RATE * CLIP_SECONDS  # 132,300 frames per channel
SUBTYPE = "PCM_16"


@dataclasses.dataclass(frozen=True)
class Variant:
    """MFCC settings of one feature variant of the paper's IRMAS experiment.

    Attributes:
        name: ``"S"``, ``"M"`` or ``"L"`` (short, medium, long sequences).
        hop_length, n_fft: STFT hop and window, in samples at 44.1 kHz.
        n_mfcc: MFCCs computed per channel; the 0th is dropped.
    """

    name: str
    hop_length: int
    n_fft: int
    n_mfcc: int

    @property
    def num_features(self) -> int:
        """Features per frame: ``n_mfcc - 1`` per channel, both channels."""
        return CHANNELS * (self.n_mfcc - 1)

    def num_frames(self, samples: int = CLIP_SAMPLES) -> int:
        """Frames of a clip of ``samples`` samples (centred frames, as librosa computes them)."""
        return 1 + samples // self.hop_length


class IrmasError(ValueError):
    """The data is not usable IRMAS training data; the message says what and where."""


class LayoutError(IrmasError):
    """The folder does not have the IRMAS training layout."""


class ClipError(IrmasError):
    """One clip cannot be used. ``path`` names the file, ``reason`` says why."""

    def __init__(self, path: str | os.PathLike, reason: str):
        self.path = os.fspath(path)
        self.reason = reason
        super().__init__(f"{self.path}: {reason}")


def audio_libraries() -> tuple[Any, Any]:
    """``(librosa, soundfile)``, or an ``ImportError`` that names the extra to install."""
    try:
        import librosa
        import soundfile
    except ImportError as error:
        raise ImportError(
            "IRMAS features need the 'irmas' extra (librosa, soundfile): pip install -e '.[irmas]'"
        ) from error
    return librosa, soundfile


def read_clip(path: str | os.PathLike) -> np.ndarray:
    """Reads one IRMAS clip: a stereo 16-bit PCM WAV of exactly 3 s at 44.1 kHz.

    Returns:
        ``(2, 132300)`` float32 samples in ``[-1, 1)``.

    Raises:
        ClipError: naming the file, for an unreadable or corrupt file, or one that is not a
            stereo 16-bit 44.1 kHz WAV of 132,300 frames (mono, truncated, resampled...).
    """
    _, soundfile = audio_libraries()
    try:
        info = soundfile.info(os.fspath(path))
    except (RuntimeError, OSError) as error:  # soundfile's errors are RuntimeErrors
        raise ClipError(path, f"unreadable or corrupt audio file ({error})") from None
    problems = []
    if info.format != "WAV" or info.subtype != SUBTYPE:
        problems.append(f"format {info.format}/{info.subtype}, expected WAV/{SUBTYPE}")
    if info.channels != CHANNELS:
        kind = "mono" if info.channels == 1 else f"{info.channels} channels"
        problems.append(f"{kind}, expected stereo")
    if info.samplerate != SAMPLE_RATE:
        problems.append(f"sample rate {info.samplerate} Hz, expected {SAMPLE_RATE} Hz")
    if info.frames != CLIP_SAMPLES:
        problems.append(
            f"{info.frames} frames ({info.frames / info.samplerate:.3f} s), expected "
            f"{CLIP_SAMPLES} ({CLIP_SECONDS} s)"
        )
    if problems:
        raise ClipError(path, "; ".join(problems))
    try:
        samples, _ = soundfile.read(os.fspath(path), dtype="float32", always_2d=True)
    except (RuntimeError, OSError) as error:
        raise ClipError(path, f"corrupt audio data ({error})") from None
    if samples.shape != (CLIP_SAMPLES, CHANNELS):
        raise ClipError(path, f"read {samples.shape} samples, expected {(CLIP_SAMPLES, 2)}")
    return np.ascontiguousarray(samples.T)


def clip_features(samples: np.ndarray, variant: Variant) -> np.ndarray:
    """MFCC features of one stereo clip, as in the paper's artifact.

    Per channel: librosa's MFCCs (``n_mfcc``, ``n_fft``, ``hop_length`` of the variant, 44.1 kHz,
    librosa's other defaults), the 0th coefficient dropped, each remaining coefficient
    standardized over the clip's frames (zero mean, unit population std; a constant coefficient
    becomes zeros). The channels are concatenated per frame, left channel first.

    Args:
        samples: ``(2, samples)`` float audio.
        variant: the MFCC settings.

    Returns:
        ``(variant.num_frames(samples), variant.num_features)`` float32.
    """
    librosa, _ = audio_libraries()
    if samples.ndim != 2 or samples.shape[0] != CHANNELS:
        raise ValueError(f"samples must have shape (2, n), got {samples.shape}.")
    # One channel at a time: a channel's features then do not depend on its position in the
    # array (librosa's batched transforms round differently per position).
    mfcc = np.stack(
        [
            librosa.feature.mfcc(
                y=np.ascontiguousarray(channel, np.float32),
                sr=SAMPLE_RATE,
                n_mfcc=variant.n_mfcc,
                n_fft=variant.n_fft,
                hop_length=variant.hop_length,
            )
            for channel in samples
        ]
    )[:, 1:, :]  # (channel, coefficient, frame), 0th coefficient dropped
    mfcc = mfcc.astype(np.float64)
    mean = mfcc.mean(axis=-1, keepdims=True)
    std = mfcc.std(axis=-1, keepdims=True)
    standardized = (mfcc - mean) / np.where(std > 0, std, 1.0)
    frames = standardized.shape[-1]
    return standardized.transpose(2, 0, 1).reshape(frames, -1).astype(np.float32)


def file_features(path: str, variant: Variant) -> tuple[np.ndarray | None, str | None]:
    """``(features, None)`` for a good clip, ``(None, reason)`` for a bad one (for workers)."""
    try:
        return clip_features(read_clip(path), variant), None
    except ClipError as error:
        return None, error.reason
