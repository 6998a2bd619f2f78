"""IRMAS reader on bad data: every problem is named, skipped with a warning or raised."""

import os
import shutil
import wave

import numpy as np
import pytest

from bppsa.data import irmas, irmas_fixture

TINY = irmas.Variant("T", hop_length=4096, n_fft=4096, n_mfcc=4)  # cheap features


def tone(channels=2, samples=irmas.CLIP_SAMPLES):
    t = np.arange(samples) / irmas.SAMPLE_RATE
    return np.stack([0.3 * np.sin(2 * np.pi * (220 + 110 * c) * t) for c in range(channels)])


def write_bad_clips(folder):
    """One clip of each bad kind in ``folder``; returns {file name: expected reason}."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "[cel]bad_corrupt.wav").write_bytes(os.urandom(2000))
    (folder / "[cel]bad_empty.wav").write_bytes(b"")
    irmas_fixture.write_wav(folder / "[cel]bad_mono.wav", tone(channels=1))
    irmas_fixture.write_wav(folder / "[cel]bad_short.wav", tone(samples=2 * 44100))
    irmas_fixture.write_wav(folder / "[cel]bad_rate.wav", tone(), sample_rate=22050)
    with wave.open(str(folder / "[cel]bad_8bit.wav"), "wb") as f:
        f.setnchannels(2)
        f.setsampwidth(1)
        f.setframerate(44100)
        f.writeframes(bytes(2 * irmas.CLIP_SAMPLES))
    good = irmas_fixture.write_wav(folder / "[cel]bad_truncated.wav", tone()).read_bytes()
    (folder / "[cel]bad_truncated.wav").write_bytes(good[: len(good) // 2])
    irmas_fixture.write_wav(folder / "[sax]bad_misfiled.wav", tone())
    return {
        "[cel]bad_corrupt.wav": "unreadable or corrupt",
        "[cel]bad_empty.wav": "unreadable or corrupt",
        "[cel]bad_mono.wav": "mono, expected stereo",
        "[cel]bad_short.wav": "88200 frames",
        "[cel]bad_rate.wav": "sample rate 22050 Hz",
        "[cel]bad_8bit.wav": "expected WAV/PCM_16",
        "[cel]bad_truncated.wav": "66144 frames",  # the data that is left
        "[sax]bad_misfiled.wav": "starts with the tag [sax]",
    }


@pytest.fixture(scope="module")
def good_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("good") / "irmas"
    irmas_fixture.write_fixture(root, 1, seed=3)
    return root


@pytest.fixture
def bad_root(tmp_path, good_root):
    """One good clip per class, the bad ones in cel/, and no synthetic marker."""
    root = tmp_path / "irmas"
    shutil.copytree(good_root, root)
    (root / irmas.SYNTHETIC_MARKER).unlink()
    expected = write_bad_clips(root / "cel")
    return root, expected


def test_missing_root(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"does not exist.*cel, cla, flu.*voi"):
        irmas.load(tmp_path / "nowhere", progress=False)


def test_root_is_a_file(tmp_path):
    (tmp_path / "file").write_text("")
    with pytest.raises(NotADirectoryError, match="is a file"):
        irmas.load(tmp_path / "file", progress=False)


def test_empty_root(tmp_path):
    with pytest.raises(irmas.LayoutError, match=r"is empty; expected .*cel, cla, .*voi"):
        irmas.load(tmp_path, progress=False)


def test_not_the_irmas_layout(tmp_path):
    for name in ("cats", "dogs", "cel"):
        (tmp_path / name).mkdir()
    with pytest.raises(irmas.LayoutError, match=r"missing class folder\(s\) cla, flu, .*voi"):
        irmas.load(tmp_path, progress=False)


def test_parent_folder_gets_a_hint(tmp_path, good_root):
    shutil.copytree(good_root, tmp_path / "IRMAS-TrainingData")
    with pytest.raises(irmas.LayoutError, match="pass that folder"):
        irmas.find_clips(tmp_path)


def test_class_folder_without_clips(tmp_path, good_root):
    root = tmp_path / "irmas"
    shutil.copytree(good_root, root)
    for clip in (root / "org").iterdir():
        clip.unlink()
    (root / "org" / "notes.txt").write_text("")
    with pytest.raises(irmas.LayoutError, match=r"class folder\(s\) org hold no .wav"):
        irmas.load(root, progress=False)


def test_each_bad_clip_is_named_by_read_clip(tmp_path):
    expected = write_bad_clips(tmp_path)
    for name, reason in expected.items():
        if name.startswith("[sax]"):
            continue  # a well-formed clip; only its place in the layout is wrong
        with pytest.raises(irmas.ClipError, match=reason) as info:
            irmas.read_clip(tmp_path / name)
        assert info.value.path == str(tmp_path / name)
        assert name in str(info.value)


def test_bad_clips_are_skipped_counted_and_named(bad_root):
    root, expected = bad_root
    with pytest.warns(irmas.IrmasWarning, match=r"skipped 8 bad clip\(s\) of 19") as record:
        data = irmas.load(root, TINY, cache=False, progress=False)
    message = str(record[0].message)
    for name in expected:
        assert f"cel/{name}" in message
    assert len(data) == 11 and not data.synthetic
    np.testing.assert_array_equal(data.labels, np.arange(11))  # the good clips, one per class
    assert {f: r for f, r in data.skipped}.keys() == {f"cel/{n}" for n in expected}
    for file, reason in data.skipped:
        assert expected[file.split("/")[1]] in reason


def test_strict_raises_naming_the_first_bad_clip(bad_root):
    root, _ = bad_root
    with pytest.raises(irmas.ClipError, match=r"\[sax\]bad_misfiled.wav: file name starts"):
        irmas.load(root, TINY, cache=False, progress=False, strict=True)
    (root / "cel" / "[sax]bad_misfiled.wav").unlink()
    with pytest.raises(irmas.ClipError, match=r"\[cel\]bad_8bit.wav: format WAV/PCM_U8"):
        irmas.load(root, TINY, cache=False, progress=False, strict=True)


def test_strict_also_applies_to_a_lenient_cache(bad_root, tmp_path):
    root, _ = bad_root
    with pytest.warns(irmas.IrmasWarning, match="skipped 8"):
        irmas.load(root, TINY, cache_dir=tmp_path / "cache", progress=False)
    with pytest.warns(irmas.IrmasWarning, match="skipped 8"):
        assert irmas.load(root, TINY, cache_dir=tmp_path / "cache", progress=False).from_cache
    with pytest.raises(irmas.ClipError, match="bad_"):
        irmas.load(root, TINY, cache_dir=tmp_path / "cache", progress=False, strict=True)


def test_no_usable_clip(tmp_path):
    root = tmp_path / "irmas"
    for name in irmas.CLASSES:
        irmas_fixture.write_wav(root / name / "mono.wav", tone(channels=1, samples=100))
    with pytest.raises(irmas.IrmasError, match=r"none of the 11 clips is usable.*mono"):
        irmas.load(root, TINY, cache=False, progress=False)


def test_unlabelled_entries_are_ignored_with_a_warning(tmp_path, good_root):
    root = tmp_path / "irmas"
    shutil.copytree(good_root, root)
    (root / "drums").mkdir()
    irmas_fixture.write_wav(root / "stray.wav", tone())
    (root / "vio" / "take.mp3").write_bytes(b"")
    (root / "vio" / ".DS_Store").write_bytes(b"")
    (root / "README.txt").write_text("")
    with pytest.warns(irmas.IrmasWarning, match=r"ignored 3 .*drums, stray.wav, vio/take.mp3"):
        data = irmas.load(root, TINY, cache=False, progress=False)
    assert len(data) == 11


def test_without_the_extra_the_error_names_it(monkeypatch, good_root):
    import builtins

    real_import = builtins.__import__

    def no_librosa(name, *args, **kwargs):
        if name == "librosa":
            raise ImportError("No module named 'librosa'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_librosa)
    with pytest.raises(ImportError, match=r"'irmas' extra"):
        irmas.load(good_root, TINY, cache=False, progress=False)
