"""The text reader's split of files into train / validation / test by ``fractions``: each split
gets its share of the characters within the bound the greedy assignment guarantees, the same
split for the same seed, and the assignment the module's docstring describes on cases small
enough to follow by hand."""

import pathlib

import numpy as np
import pytest

from bppsa.data import text

FILES = 200
SIZES = np.random.default_rng(7).integers(20, 61, FILES)  # characters per file, 20..60


def write(folder: pathlib.Path, sizes) -> pathlib.Path:
    """Files ``f000.txt, f001.txt, ...`` of ``sizes`` characters, each its own group."""
    rng = np.random.default_rng(0)
    for k, n in enumerate(sizes):
        (folder / f"f{k:03d}.txt").write_text("".join(rng.choice(list("ab c\n"), n)))
    return folder


@pytest.fixture(scope="module")
def many(tmp_path_factory):
    return write(tmp_path_factory.mktemp("many"), SIZES)


def shares(corpus) -> np.ndarray:
    return np.array([corpus.characters(s) for s in text.SPLITS]) / len(corpus.ids)


# Every group goes to the split that lacks most characters, so a split ends above its target by
# less than the largest group, m; the excesses sum to 0, so a split ends below it by less than
# 2 m (the excesses of the two others): each share is within 2 m / total of its fraction, here
# 2 x 60 / ~8000 = 1.5%. A fraction read for another split misses it by >= 10%.
TOLERANCE = 2 * SIZES.max() / SIZES.sum()


@pytest.mark.parametrize(
    "fractions", [(0.8, 0.1, 0.1), (0.5, 0.3, 0.2), (0.6, 0.0, 0.4), (0.7, 0.3, 0.0), (1, 0, 0)]
)
@pytest.mark.parametrize("split_seed", [0, 3])
def test_each_split_gets_its_fraction_of_the_characters(many, fractions, split_seed):
    corpus = text.load(many, fractions=fractions, split_seed=split_seed)
    assert len(corpus.ids) == SIZES.sum()
    np.testing.assert_allclose(shares(corpus), fractions, rtol=0, atol=TOLERANCE)
    for split, fraction in zip(text.SPLITS, fractions):
        assert bool(corpus.files_in(split)) == (fraction > 0)  # a split of fraction 0 is empty
        excess = corpus.characters(split) - fraction * SIZES.sum()
        assert -2 * SIZES.max() < excess < SIZES.max(), (split, excess)


def test_the_split_is_a_function_of_the_seed(many):
    fractions = (0.5, 0.3, 0.2)
    first = text.load(many, fractions=fractions, split_seed=5)
    again = text.load(many, fractions=fractions, split_seed=5)
    assert first.splits == again.splits
    other = text.load(many, fractions=fractions, split_seed=6)
    assert other.splits != first.splits
    np.testing.assert_allclose(shares(other), fractions, rtol=0, atol=TOLERANCE)


# (fractions, characters of the group visited at each rank, the split each rank goes to)
BY_HAND = [
    # Targets 50, 30, 20. Ranks 0-2 seed train, validation, test (10 each); rank 3 (40) goes to
    # train, which lacks 40 (validation 20, test 10); rank 4 (30) to validation, which lacks
    # 20 (train 0, test 10).
    ((0.5, 0.3, 0.2), [10, 10, 10, 40, 30], ["train", "validation", "test", "train", "validation"]),
    # Targets 60, 0, 40; validation gets nothing. Ranks 0-1 seed train and test; rank 2 (30)
    # goes to train (lacks 55, test 20), rank 3 (25) to train (lacks 25, test 20), rank 4 (20)
    # to test (lacks 20, train 0): exactly 60 / 0 / 40.
    ((0.6, 0.0, 0.4), [5, 20, 30, 25, 20], ["train", "test", "train", "train", "test"]),
]


@pytest.mark.parametrize("fractions, sizes, expected", BY_HAND)
@pytest.mark.parametrize("split_seed", [0, 1])
def test_the_assignment_on_a_case_computed_by_hand(
    tmp_path, fractions, sizes, expected, split_seed
):
    """The groups (sorted names) are visited in the order of
    ``numpy.random.default_rng([split_seed, 0]).permutation``, as the module's docstring says:
    the file visited at rank ``r`` is given ``sizes[r]`` characters."""
    order = np.random.default_rng([split_seed, 0]).permutation(len(sizes))
    by_file = np.empty(len(sizes), int)
    by_file[order] = sizes
    corpus = text.load(write(tmp_path, by_file), fractions=fractions, split_seed=split_seed)
    assert corpus.groups == tuple(f"f{k:03d}" for k in range(len(sizes)))
    assert [corpus.splits[k] for k in order] == expected
