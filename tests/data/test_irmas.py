"""IRMAS reader on the synthetic fixture: layout, feature shapes, labels, cache, gradients."""

import functools
import os
import wave

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import bppsa
from bppsa.data import _irmas_audio, irmas, irmas_fixture
from bppsa.models import GRU, SequenceClassifier
from tests.helpers import assert_trees_close, classifier_loss_reference

CLIPS_PER_CLASS = 2
# (frames, features) of a 3 s clip: 1 + 132300 // hop frames, 2 * (n_mfcc - 1) features.
SHAPES = {"S": (259, 38), "M": (517, 24), "L": (1034, 12)}


@pytest.fixture(scope="module")
def fixture_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("irmas") / "IRMAS-TrainingData"
    irmas_fixture.write_fixture(root, CLIPS_PER_CLASS, seed=0)
    return root


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("cache")


@pytest.fixture(scope="module")
def features(fixture_root, cache_dir):
    """Features of every variant, computed once for the module (and cached in cache_dir)."""
    return {
        name: irmas.load(fixture_root, name, cache_dir=cache_dir, progress=False)
        for name in irmas.VARIANTS
    }


def test_fixture_has_the_irmas_layout_and_format(fixture_root):
    assert (fixture_root / irmas.SYNTHETIC_MARKER).read_text().startswith("SYNTHETIC")
    assert sorted(p.name for p in fixture_root.iterdir() if p.is_dir()) == list(irmas.CLASSES)
    for name in irmas.CLASSES:
        clips = sorted((fixture_root / name).iterdir())
        assert len(clips) == CLIPS_PER_CLASS
        for clip in clips:
            assert clip.name.startswith(f"[{name}][synthetic]")
            with wave.open(str(clip)) as f:  # the standard library, not the reader under test
                assert (f.getnchannels(), f.getsampwidth(), f.getframerate()) == (2, 2, 44100)
                assert f.getnframes() == 3 * 44100


def test_fixture_is_deterministic_and_refuses_foreign_folders(tmp_path, fixture_root):
    again = irmas_fixture.write_fixture(tmp_path / "again", CLIPS_PER_CLASS, seed=0)
    first = fixture_root / "vio" / again[-3].name
    assert again[-3].read_bytes() == first.read_bytes()
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "mine.txt").write_text("not a fixture")
    with pytest.raises(FileExistsError, match="not a synthetic fixture"):
        irmas_fixture.write_fixture(tmp_path / "data")
    with pytest.raises(ValueError, match="clips_per_class"):
        irmas_fixture.write_fixture(tmp_path / "other", 0)


def test_variants_are_the_papers():
    assert {n: (v.hop_length, v.n_fft, v.n_mfcc) for n, v in irmas.VARIANTS.items()} == {
        "S": (512, 4096, 20),
        "M": (256, 2048, 13),
        "L": (128, 1024, 7),
    }
    for name, (frames, feats) in SHAPES.items():
        assert irmas.VARIANTS[name].num_frames() == frames
        assert irmas.VARIANTS[name].num_features == feats
    assert irmas.resolve_variant("s") is irmas.VARIANTS["S"]
    with pytest.raises(ValueError, match="variant must be one of S, M, L"):
        irmas.resolve_variant("XL")


@pytest.mark.parametrize("name", ["S", "M", "L"])
def test_feature_shapes_and_standardization(features, name):
    data = features[name]
    n = CLIPS_PER_CLASS * irmas.NUM_CLASSES
    assert data.xs.shape == (n, *SHAPES[name]) and data.xs.dtype == np.float32
    assert data.labels.shape == (n,) and data.labels.dtype == np.int32
    assert data.synthetic and not data.skipped and np.all(np.isfinite(data.xs))
    # Every (channel, coefficient) column is standardized over the frames of its clip.
    np.testing.assert_allclose(data.xs.mean(axis=1), 0.0, atol=1e-4)
    np.testing.assert_allclose(data.xs.std(axis=1), 1.0, atol=1e-3)


def test_labels_follow_the_folders(features):
    data = features["S"]
    assert " ".join(irmas.CLASSES) == "cel cla flu gac gel org pia sax tru vio voi"
    for file, label in zip(data.files, data.labels, strict=True):
        assert file.split("/")[0] == irmas.CLASSES[label]
    assert list(data.files) == sorted(data.files)
    np.testing.assert_array_equal(np.bincount(data.labels), [CLIPS_PER_CLASS] * 11)


def test_channels_are_concatenated_left_first(fixture_root):
    variant = irmas.VARIANTS["S"]
    samples = irmas.read_clip(fixture_root / "gac" / "[gac][synthetic]0001__1.wav")
    assert samples.shape == (2, 132300) and samples.dtype == np.float32
    both = irmas.clip_features(samples, variant)
    swapped = irmas.clip_features(samples[::-1], variant)
    half = variant.n_mfcc - 1
    np.testing.assert_array_equal(both[:, :half], swapped[:, half:])
    np.testing.assert_array_equal(both[:, half:], swapped[:, :half])
    assert not np.allclose(both[:, :half], both[:, half:])  # the fixture's channels differ


def test_second_load_reads_the_cache(features, fixture_root, cache_dir, monkeypatch):
    def fail(*args, **kwargs):
        raise AssertionError("features were recomputed")

    monkeypatch.setattr(_irmas_audio, "clip_features", fail)
    for name, first in features.items():
        assert not first.from_cache and first.cache_file.exists()
        again = irmas.load(fixture_root, name, cache_dir=cache_dir, progress=False)
        assert again.from_cache and again.cache_file == first.cache_file
        np.testing.assert_array_equal(again.xs, first.xs)
        np.testing.assert_array_equal(again.labels, first.labels)
        assert again.files == first.files


def test_changed_settings_or_files_recompute(tmp_path, cache_dir, features):
    root = tmp_path / "irmas"
    irmas_fixture.write_fixture(root, 1, seed=1)
    tiny = irmas.Variant("T", hop_length=4096, n_fft=4096, n_mfcc=4)  # cheap to compute
    first = irmas.load(root, tiny, cache_dir=cache_dir, progress=False)
    assert not first.from_cache and first.xs.shape == (11, 33, 6)
    assert irmas.load(root, tiny, cache_dir=cache_dir, progress=False).from_cache
    other = irmas.Variant("T", hop_length=4096, n_fft=4096, n_mfcc=5)
    changed = irmas.load(root, other, cache_dir=cache_dir, progress=False)
    assert not changed.from_cache and changed.xs.shape == (11, 33, 8)
    assert changed.cache_file != first.cache_file
    # Rewriting one clip (new content and modification time) changes the key.
    clip = root / "pia" / "[pia][synthetic]0001__1.wav"
    irmas_fixture.write_wav(clip, 0.5 * irmas.read_clip(clip))
    os.utime(clip, ns=(1, 1))
    rewritten = irmas.load(root, tiny, cache_dir=cache_dir, progress=False)
    assert not rewritten.from_cache and rewritten.cache_file != first.cache_file
    # A corrupt cache file is recomputed, not trusted.
    rewritten.cache_file.write_bytes(b"garbage")
    repaired = irmas.load(root, tiny, cache_dir=cache_dir, progress=False)
    assert not repaired.from_cache
    np.testing.assert_array_equal(repaired.xs, rewritten.xs)
    # cache=False neither reads nor writes.
    uncached = irmas.load(root, tiny, cache=False, progress=False)
    assert not uncached.from_cache and uncached.cache_file is None


def test_progress_bar_and_workers(tmp_path, capsys):
    root = tmp_path / "irmas"
    irmas_fixture.write_fixture(root, 1, seed=2)
    tiny = irmas.Variant("T", hop_length=4096, n_fft=4096, n_mfcc=4)
    serial = irmas.load(root, tiny, cache=False, progress=True)
    assert "IRMAS MFCC T" in capsys.readouterr().err
    parallel = irmas.load(root, tiny, cache=False, progress=False, workers=2)
    np.testing.assert_array_equal(parallel.xs, serial.xs)
    np.testing.assert_array_equal(parallel.labels, serial.labels)
    with pytest.raises(ValueError, match="workers must be a positive int"):
        irmas.load(root, tiny, cache=False, workers=0)


def test_bppsa_gradients_equal_bp_on_fixture_features(features):
    data = features["S"]
    batch = np.array([0, 5, 10, 21])  # four classes
    xs, labels = jnp.asarray(data.xs[batch]), jnp.asarray(data.labels[batch])
    model = SequenceClassifier(xs.shape[-1], 20, irmas.NUM_CLASSES, cell=GRU())
    params = model.init(key=jax.random.key(0))
    reference = jax.jit(jax.grad(functools.partial(classifier_loss_reference, model)))(
        params, xs, labels
    )
    for method in ("auto", "blelloch"):  # the default, and the paper's scan
        grads = jax.jit(bppsa.grad(model.loss, method=method))(params, xs, labels)
        assert_trees_close(grads, reference, jnp.float32)
