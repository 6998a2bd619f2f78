"""The paper's synthetic bitstreams: class balance, per-class bit frequencies, splits, epoch
orders, determinism, and input checks.

Statistical bounds are 5 standard deviations of the binomial counts, so a correct generator
fails them with probability below 1e-5 per comparison (and the seeds are fixed anyway).
"""

import numpy as np
import pytest

from bppsa.data import Bitstreams

SIGMAS = 5.0


def test_paper_defaults():
    data = Bitstreams(length=1000)
    assert (data.size("train"), data.size("test")) == (32_000, 18_000)
    np.testing.assert_allclose(data.probabilities, 0.05 + 0.1 * np.arange(10))
    xs, labels = data.batch("train", 0, 16)
    assert xs.shape == (16, 1000, 1) and xs.dtype == np.float32
    assert labels.shape == (16,) and labels.dtype == np.int32
    assert set(np.unique(np.asarray(xs))) <= {0.0, 1.0}


def test_label_balance():
    data = Bitstreams(length=1, num_samples=50_000)
    _, labels = data.samples(np.arange(50_000))
    counts = np.bincount(np.asarray(labels), minlength=10)
    expected, p = 50_000 / 10, 1 / 10
    assert len(counts) == 10
    assert np.all(np.abs(counts - expected) <= SIGMAS * np.sqrt(50_000 * p * (1 - p))), counts


def test_bit_frequency_of_each_class():
    data = Bitstreams(length=500, num_samples=4000, seed=3)
    xs, labels = data.samples(np.arange(4000))
    bits, labels = np.asarray(xs)[..., 0], np.asarray(labels)
    for k, p in enumerate(data.probabilities):
        rows = bits[labels == k]
        n = rows.size
        assert n > 50_000  # ~400 samples x 500 bits per class
        assert abs(rows.mean() - p) <= SIGMAS * np.sqrt(p * (1 - p) / n), (k, rows.mean(), p)


def test_samples_are_functions_of_seed_and_index():
    data = Bitstreams(length=64, num_samples=100, seed=7)
    a_x, a_y = data.samples(np.array([5, 9, 5, 1]))
    np.testing.assert_array_equal(a_x[0], a_x[2])
    b_x, b_y = data.samples(np.array([0, 9, 2, 3]))
    np.testing.assert_array_equal(a_x[1], b_x[1])
    assert a_y[1] == b_y[1]
    other_x, _ = Bitstreams(length=64, num_samples=100, seed=8).samples(np.array([0, 9, 2, 3]))
    assert not np.array_equal(b_x[1], other_x[1])


def test_epochs_permute_the_training_split():
    data = Bitstreams(length=64, num_samples=40, train_fraction=0.5, seed=1)
    per_epoch = data.batches_per_epoch("train", 4)
    assert per_epoch == 5

    def epoch_labels(epoch):
        batches = data.batches("train", 4, start=epoch * per_epoch, stop=(epoch + 1) * per_epoch)
        return np.concatenate([np.asarray(y) for _, y in batches])

    train_labels = np.concatenate(
        [np.asarray(data.samples(np.arange(i, i + 4))[1]) for i in range(0, 20, 4)]
    )
    first, second = epoch_labels(0), epoch_labels(1)
    # each epoch visits every training sample once (compared through the label multiset)
    assert sorted(first) == sorted(second) == sorted(train_labels)
    xs_first = np.concatenate([np.asarray(x) for x, _ in data.batches("train", 4, stop=per_epoch)])
    xs_second = np.concatenate(
        [np.asarray(x) for x, _ in data.batches("train", 4, start=per_epoch, stop=2 * per_epoch)]
    )
    assert not np.array_equal(xs_first, xs_second)  # a new order in each epoch
    # a batch regenerated from its iteration alone equals the streamed one
    (streamed,) = data.batches("train", 4, start=7, stop=8)
    np.testing.assert_array_equal(streamed[0], data.batch("train", 7, 4)[0])


def test_test_split_is_disjoint_and_in_order():
    data = Bitstreams(length=64, num_samples=10, train_fraction=0.6)
    xs, _ = data.batch("test", 0, 4, shuffle=False)
    np.testing.assert_array_equal(xs, data.samples(np.arange(6, 10))[0])


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(length=0), "length"),
        (dict(length=2.5), "length"),
        (dict(length=10, num_samples=1), "num_samples"),
        (dict(length=10, train_fraction=1.0), "train_fraction"),
        (dict(length=10, num_samples=10, train_fraction=0.05), "train_fraction"),
        (dict(length=10, num_classes=1), "num_classes"),
        (dict(length=10, seed=-1), "seed"),
    ],
)
def test_bad_arguments_are_named(kwargs, match):
    with pytest.raises(ValueError, match=match):
        Bitstreams(**kwargs)


def test_bad_batch_arguments_are_named():
    data = Bitstreams(length=4, num_samples=100)
    with pytest.raises(ValueError, match="split"):
        data.batch("validation", 0, 4)
    with pytest.raises(ValueError, match="batch_size"):
        data.batch("train", 0, 65)
    with pytest.raises(ValueError, match="iteration"):
        data.batch("train", -1, 4)
    with pytest.raises(ValueError, match="indices"):
        data.samples(np.array([100]))
