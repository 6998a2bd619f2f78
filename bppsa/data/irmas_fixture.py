"""A small SYNTHETIC dataset in the exact IRMAS training layout, for tests and smoke runs.

It is NOT IRMAS: every clip is a synthesized stereo tone (a class-specific pitch, harmonic
spectrum, vibrato and envelope, detuned and phased at random per clip, plus a little noise),
written as a 16-bit PCM WAV of 3 s at 44.1 kHz into the class folders ``cel ... voi``. File
names carry ``[synthetic]`` and the root holds ``SYNTHETIC_FIXTURE.txt``, which
:func:`bppsa.data.irmas.load` reports as ``IrmasFeatures.synthetic``. Only NumPy and the
standard library's ``wave`` are used, so the fixture can be written without the ``irmas`` extra.

The command-line front end is ``python -m experiments.gru_irmas fixture --out DIR``.
"""

from __future__ import annotations

import os
import pathlib
import wave

import numpy as np

from bppsa.data._fixtures import claim_folder
from bppsa.data.irmas import CLASSES, CLIP_SAMPLES, SAMPLE_RATE, SYNTHETIC_MARKER

MARKER_TEXT = (
    "SYNTHETIC FIXTURE - NOT IRMAS.\n"
    "Synthesized stereo tones in the IRMAS training layout, written by\n"
    "bppsa.data.irmas_fixture.write_fixture (clips_per_class={clips}, seed={seed}).\n"
    "Results computed on it say nothing about instrument recognition.\n"
)


def write_wav(
    path: str | os.PathLike, samples: np.ndarray, sample_rate: int = SAMPLE_RATE
) -> pathlib.Path:
    """Writes ``(channels, n)`` float samples in ``[-1, 1]`` as a 16-bit PCM WAV file."""
    samples = np.atleast_2d(np.asarray(samples, np.float64))
    pcm = np.round(np.clip(samples, -1.0, 1.0) * 32767).astype("<i2")
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with wave.open(str(path), "wb") as f:
        f.setnchannels(pcm.shape[0])
        f.setsampwidth(2)
        f.setframerate(sample_rate)
        f.writeframes(pcm.T.tobytes())  # interleaved frames
    return path


def synthetic_tone(label: int, rng: np.random.Generator, samples: int = CLIP_SAMPLES) -> np.ndarray:
    """``(2, samples)`` float samples of one synthetic clip of class ``label``."""
    t = np.arange(samples) / SAMPLE_RATE
    f0 = 110.0 * 2 ** (label * 5 / 12) * rng.uniform(0.97, 1.03)
    harmonics = np.arange(1, 2 + label % 6)
    weights = harmonics ** -(0.6 + 0.15 * label)
    vibrato = 1 + 0.004 * (label % 3) * np.sin(2 * np.pi * (4 + label % 4) * t)
    phase = 2 * np.pi * np.cumsum(f0 * vibrato) / SAMPLE_RATE
    tone = sum(
        w * np.sin(h * phase + rng.uniform(0, 2 * np.pi))
        for h, w in zip(harmonics, weights, strict=True)
    )
    attack = 0.01 + 0.05 * (label % 5)
    envelope = np.minimum(t / attack, 1.0) * np.exp(-t * (0.2 + 0.3 * (label % 4)))
    tone = tone * envelope / np.max(np.abs(tone))
    pan = 0.5 + 0.3 * np.sin(label + rng.uniform(-0.3, 0.3))
    delay = int(rng.integers(0, 40))
    left = pan * tone
    right = (1 - pan) * np.roll(tone, delay)
    noise = rng.normal(0.0, 0.01, (2, samples))
    return 0.6 * np.stack([left, right]) + noise


def write_fixture(
    root: str | os.PathLike, clips_per_class: int = 2, *, seed: int = 0
) -> list[pathlib.Path]:
    """Writes ``clips_per_class`` synthetic clips into each of the 11 class folders of ``root``.

    Args:
        root: the fixture's root; created if missing. An existing non-empty folder is only
            written into if it is a fixture already (its earlier ``[synthetic]`` clips are
            replaced); anything else raises ``FileExistsError``.
        clips_per_class: clips per class, at least 1.
        seed: the clips are a deterministic function of ``seed``.

    Returns:
        The paths of the written clips, in class order.
    """
    if not isinstance(clips_per_class, int) or clips_per_class < 1:
        raise ValueError(f"clips_per_class must be a positive int, got {clips_per_class!r}.")
    root = pathlib.Path(root)
    marker = claim_folder(root, SYNTHETIC_MARKER, "clips")
    for old in root.glob("*/*[[]synthetic[]]*.wav"):
        old.unlink()
    marker.write_text(MARKER_TEXT.format(clips=clips_per_class, seed=seed))
    paths = []
    for label, name in enumerate(CLASSES):
        for index in range(clips_per_class):
            rng = np.random.default_rng([seed, label, index])
            path = root / name / f"[{name}][synthetic]{index + 1:04d}__1.wav"
            paths.append(write_wav(path, synthetic_tone(label, rng)))
    return paths
