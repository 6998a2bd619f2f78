"""scikit-learn's digits as 3x32x32 images: shapes, classes, the split, values, the extra."""

import sys

import numpy as np
import pytest

from bppsa.data import digits

sklearn_datasets = pytest.importorskip("sklearn.datasets")


@pytest.fixture(scope="module")
def reference():
    """scikit-learn's own images ``(1797, 8, 8)`` (values 0..16) and labels."""
    bunch = sklearn_datasets.load_digits()
    return bunch.images, bunch.target


@pytest.mark.parametrize("split", ["train", "test"])
def test_shapes_classes_and_record(split):
    data = digits.load(split)
    assert data.images.shape == (len(data), 3, 32, 32) and data.images.dtype == np.float32
    assert data.labels.shape == (len(data),) and data.labels.dtype == np.int32
    assert data.class_names == tuple("0123456789") and data.num_classes == 10
    assert (data.name, data.split, data.synthetic) == ("digits", split, False)
    assert set(np.unique(data.labels)) == set(range(10))
    assert len(digits.load("train")) + len(digits.load("test")) == 1797


def test_split_is_stratified_disjoint_and_deterministic(reference):
    _, labels = reference
    train, test = digits.split_indices(labels, test_fraction=0.2, seed=0)
    assert not set(train.tolist()) & set(test.tolist())
    np.testing.assert_array_equal(np.sort(np.concatenate([train, test])), np.arange(1797))
    assert np.all(np.diff(train) > 0) and np.all(np.diff(test) > 0)
    for label in range(10):
        count = np.sum(labels == label)
        assert np.sum(labels[test] == label) == round(0.2 * count)
    again_train, again_test = digits.split_indices(labels, test_fraction=0.2, seed=0)
    np.testing.assert_array_equal(again_train, train)
    np.testing.assert_array_equal(again_test, test)
    _, other = digits.split_indices(labels, test_fraction=0.2, seed=1)
    assert not np.array_equal(other, test)
    _, bigger = digits.split_indices(labels, test_fraction=0.5, seed=0)
    assert len(bigger) == sum(round(0.5 * np.sum(labels == k)) for k in range(10))
    first, second = digits.load("test", seed=3), digits.load("test", seed=3)
    np.testing.assert_array_equal(first.images, second.images)
    np.testing.assert_array_equal(first.labels, second.labels)
    np.testing.assert_array_equal(first.labels, labels[digits.split_indices(labels, seed=3)[1]])


def test_bad_arguments(reference):
    _, labels = reference
    for fraction in (0, 1, -0.1, 1.5, True, "0.2"):
        with pytest.raises(ValueError, match="test_fraction must be a number in"):
            digits.load(test_fraction=fraction)
    with pytest.raises(ValueError, match="leaves a split empty"):
        digits.split_indices(labels, test_fraction=1e-4)
    with pytest.raises(ValueError, match="seed must be an int"):
        digits.load(seed=-1)
    with pytest.raises(ValueError, match="split must be one of"):
        digits.load("validation")
    with pytest.raises(ValueError, match="floating dtype"):
        digits.load(dtype=np.int64)


@pytest.mark.parametrize("split", ["train", "test"])
def test_values_are_nearest_upsampled_and_scaled_to_unit_range(reference, split):
    images, labels = reference
    train, test = digits.split_indices(labels, test_fraction=0.2, seed=0)
    chosen = train if split == "train" else test
    data = digits.load(split, normalize=False, dtype=np.float64)
    assert data.mean is None and data.std is None
    assert data.images.min() == 0.0 and data.images.max() == 1.0
    np.testing.assert_array_equal(data.images * 16, np.round(data.images * 16))  # k/16
    for channel in (1, 2):  # grey: the three channels agree
        np.testing.assert_array_equal(data.images[:, channel], data.images[:, 0])
    np.testing.assert_array_equal(data.images[:, 0, ::4, ::4] * 16, images[chosen])
    for dy in range(4):  # every pixel of the 8x8 image is a 4x4 block
        for dx in range(4):
            np.testing.assert_array_equal(
                data.images[:, :, dy::4, dx::4], data.images[:, :, ::4, ::4]
            )
    np.testing.assert_array_equal(data.labels, labels[chosen])


def test_normalization_uses_the_training_split_statistics(reference):
    images, labels = reference
    train, _ = digits.split_indices(labels, test_fraction=0.2, seed=0)
    mean, std = (images[train] / 16).mean(), (images[train] / 16).std()
    data = {split: digits.load(split) for split in ("train", "test")}
    for split, record in data.items():
        assert record.mean == pytest.approx((mean,) * 3, rel=1e-12)
        assert record.std == pytest.approx((std,) * 3, rel=1e-12)
        plain = digits.load(split, normalize=False, dtype=np.float64).images
        # float32 rounding of values up to ~2: a few ulps.
        np.testing.assert_allclose(record.images, (plain - mean) / std, rtol=0, atol=2e-6)
    train_images = data["train"].images.astype(np.float64)
    assert abs(train_images.mean()) < 1e-5 and abs(train_images.std() - 1) < 1e-5


def test_a_missing_scikit_learn_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "sklearn", None)
    monkeypatch.setitem(sys.modules, "sklearn.datasets", None)
    digits._digits.cache_clear()
    try:
        with pytest.raises(ImportError, match=r"scikit-learn.*\.\[digits\]"):
            digits.load()
    finally:
        digits._digits.cache_clear()
