"""CIFAR-10 reader on the synthetic fixture: layout, encoding, pixels, normalization, bad files,
the restricted unpickler and the batch order."""

import os
import pickle
import pickletools
import shutil

import numpy as np
import pytest

from bppsa.data import cifar10, cifar10_fixture

PER_BATCH = 12
SIZES = {"train": 5 * PER_BATCH, "test": PER_BATCH}
FILES = {"train": [f"data_batch_{i}" for i in range(1, 6)], "test": ["test_batch"]}
NAMES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")
# The usual CIFAR-10 training-set statistics (per channel R, G, B, pixels in [0, 1]).
MEAN = np.array([0.49139968, 0.48215841, 0.44653091])
STD = np.array([0.24703223, 0.24348513, 0.26158784])


@pytest.fixture(scope="module")
def parent(tmp_path_factory):
    root = tmp_path_factory.mktemp("cifar")
    cifar10_fixture.write_fixture(root, per_batch=PER_BATCH, seed=0)
    return root


@pytest.fixture(scope="module")
def batches_dir(parent):
    return parent / "cifar-10-batches-py"


def raw(path):
    """The fixture's own pickle, read with the standard library (it is trusted: we wrote it)."""
    with open(path, "rb") as f:
        return pickle.load(f, encoding="bytes")


@pytest.fixture
def copy(tmp_path, batches_dir):
    """A fresh copy of the fixture's batches folder, to be damaged by the test."""
    return shutil.copytree(batches_dir, tmp_path / "cifar-10-batches-py")


def test_fixture_has_the_layout_and_encoding_of_the_real_files(batches_dir):
    names = {p.name for p in batches_dir.iterdir()}
    assert names == {*FILES["train"], *FILES["test"], "batches.meta", "SYNTHETIC_FIXTURE.txt"}
    assert (batches_dir / "SYNTHETIC_FIXTURE.txt").read_text().startswith("SYNTHETIC")
    for name in FILES["train"] + FILES["test"]:
        blob = (batches_dir / name).read_bytes()
        ops = list(pickletools.genops(blob))
        assert ops[0][0].name == "PROTO" and ops[0][1] == 2
        # Python 2 strings, NumPy 1 names: what the real files hold.
        assert not {op.name for op, _, _ in ops} & {"BINUNICODE", "SHORT_BINUNICODE"}
        globals_ = {arg for op, arg, _ in ops if op.name == "GLOBAL"}
        assert globals_ == {"numpy.core.multiarray _reconstruct", "numpy ndarray", "numpy dtype"}
        with pytest.raises(UnicodeDecodeError):  # like the real files: encoding="bytes" needed
            pickle.loads(blob)
        batch = raw(batches_dir / name)
        assert set(batch) == {b"data", b"labels", b"batch_label", b"filenames"}
        assert batch[b"data"].dtype == np.uint8 and batch[b"data"].shape == (PER_BATCH, 3072)
        assert all(type(label) is int for label in batch[b"labels"])
        assert (
            batch[b"batch_label"].startswith(b"SYNTHETIC")
            and b"NOT CIFAR-10" in batch[b"batch_label"]
        )
        assert len(batch[b"filenames"]) == PER_BATCH
    meta = raw(batches_dir / "batches.meta")
    assert meta == {
        b"num_cases_per_batch": PER_BATCH,
        b"label_names": [name.encode() for name in NAMES],
        b"num_vis": 3072,
    }


def test_fixture_is_deterministic_and_refuses_foreign_folders(tmp_path, batches_dir):
    again = cifar10_fixture.write_fixture(tmp_path / "again", per_batch=PER_BATCH, seed=0)
    for name in ("data_batch_4", "test_batch", "batches.meta"):
        assert (again / name).read_bytes() == (batches_dir / name).read_bytes()
    other = cifar10_fixture.write_fixture(tmp_path / "other", per_batch=PER_BATCH, seed=1)
    assert (other / "data_batch_1").read_bytes() != (batches_dir / "data_batch_1").read_bytes()
    cifar10_fixture.write_fixture(tmp_path / "again", per_batch=3, seed=0)  # a fixture: rewritten
    assert raw(again / "test_batch")[b"data"].shape == (3, 3072)
    (tmp_path / "real" / "cifar-10-batches-py").mkdir(parents=True)
    (tmp_path / "real" / "cifar-10-batches-py" / "data_batch_1").write_bytes(b"precious")
    with pytest.raises(FileExistsError, match="not a synthetic fixture"):
        cifar10_fixture.write_fixture(tmp_path / "real")
    for bad in (0, -1, 2.0, True):
        with pytest.raises(ValueError, match="per_batch"):
            cifar10_fixture.write_fixture(tmp_path / "bad", per_batch=bad)


@pytest.mark.parametrize("split", ["train", "test"])
@pytest.mark.parametrize("form", ["parent", "batches_dir"])
def test_load_shapes_dtypes_and_labels(request, split, form, batches_dir):
    data = cifar10.load(request.getfixturevalue(form), split)
    n = SIZES[split]
    assert len(data) == n
    assert data.images.shape == (n, 3, 32, 32) and data.images.dtype == np.float32
    assert data.labels.shape == (n,) and data.labels.dtype == np.int32
    expected = np.concatenate([raw(batches_dir / name)[b"labels"] for name in FILES[split]])
    np.testing.assert_array_equal(data.labels, expected)
    assert data.class_names == NAMES and data.num_classes == 10
    assert (data.name, data.split, data.synthetic) == ("cifar10", split, True)
    assert set(np.unique(data.labels)) == set(range(10))  # the fixture cycles through classes


@pytest.mark.parametrize("split", ["train", "test"])
def test_normalization_uses_the_training_statistics(batches_dir, split):
    pixels = np.concatenate([raw(batches_dir / name)[b"data"] for name in FILES[split]])
    pixels = pixels.reshape(-1, 3, 32, 32) / 255.0
    plain = cifar10.load(batches_dir, split, normalize=False, dtype=np.float64)
    assert plain.mean is None and plain.std is None
    np.testing.assert_allclose(plain.images, pixels, rtol=0, atol=1e-12)
    standardized = cifar10.load(batches_dir, split)
    np.testing.assert_allclose(cifar10.TRAIN_MEAN, MEAN, rtol=1e-7)
    np.testing.assert_allclose(cifar10.TRAIN_STD, STD, rtol=1e-7)
    assert standardized.mean == cifar10.TRAIN_MEAN and standardized.std == cifar10.TRAIN_STD
    reference = (pixels - MEAN[:, None, None]) / STD[:, None, None]
    # float32 rounding of values of size ~2: a few ulps.
    np.testing.assert_allclose(standardized.images, reference, rtol=0, atol=2e-6)
    half = cifar10.load(batches_dir, split, dtype=np.float16)
    assert half.images.dtype == np.float16
    np.testing.assert_allclose(half.images, reference, rtol=1e-3, atol=1e-3)


def test_pixels_are_red_green_blue_planes_in_row_major_order(copy):
    """data[i, c * 1024 + y * 32 + x] is channel c, row y, column x of image i."""
    i, c, y, x = np.indices((4, 3, 32, 32))
    values = (i + 3 * c + 5 * y + 7 * x) % 256
    data = np.zeros((4, 3072), np.uint8)
    data[i, c * 1024 + y * 32 + x] = values
    cifar10_fixture.write_batch(copy / "test_batch", data, [0, 1, 2, 9])
    images = cifar10.load(copy, "test", normalize=False, dtype=np.float64).images
    np.testing.assert_array_equal(np.round(images * 255), values)


def test_load_accepts_python3_pickles_with_str_keys(copy):
    """Pickles re-written by Python 3 (str keys, NumPy 2 names, any protocol) read the same."""
    expected = cifar10.load(copy, "train")
    for protocol, name in zip([2, 3, 4, 5, 5], FILES["train"]):
        batch = {key.decode(): value for key, value in raw(copy / name).items()}
        batch["labels"] = [np.int64(label) for label in batch["labels"]]  # NumPy scalars too
        (copy / name).write_bytes(pickle.dumps(batch, protocol=protocol))
    meta = {key.decode(): value for key, value in raw(copy / "batches.meta").items()}
    meta["label_names"] = [name.decode() for name in meta["label_names"]]
    (copy / "batches.meta").write_bytes(pickle.dumps(meta, protocol=4))
    again = cifar10.load(copy, "train")
    np.testing.assert_array_equal(again.images, expected.images)
    np.testing.assert_array_equal(again.labels, expected.labels)
    assert again.class_names == NAMES


def test_bad_arguments(batches_dir):
    with pytest.raises(ValueError, match="split must be one of"):
        cifar10.load(batches_dir, "validation")
    for dtype in (np.int32, np.uint8, "not a dtype"):
        with pytest.raises(ValueError, match="floating dtype"):
            cifar10.load(batches_dir, dtype=dtype)


def test_missing_root_folder_and_files(tmp_path, copy):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        cifar10.load(tmp_path / "nowhere")
    archive = tmp_path / "cifar-10-python.tar.gz"
    archive.write_bytes(b"")
    with pytest.raises(NotADirectoryError, match="extract it first"):
        cifar10.load(archive)
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match=r"no CIFAR-10 batches .* data_batch_1"):
        cifar10.load(tmp_path / "empty")
    (copy / "data_batch_3").unlink()
    with pytest.raises(FileNotFoundError, match="lacks the CIFAR-10 file data_batch_3"):
        cifar10.load(copy, "train")
    cifar10.load(copy, "test")  # the test split does not need it
    (copy / "batches.meta").unlink()
    with pytest.raises(FileNotFoundError, match=r"lacks the CIFAR-10 file batches\.meta"):
        cifar10.load(copy.parent, "test")


def _batch(**changes):
    entries = {
        b"batch_label": b"SYNTHETIC bad batch",
        b"labels": [k % 10 for k in range(PER_BATCH)],
        b"data": np.zeros((PER_BATCH, 3072), np.uint8),
        b"filenames": [b"x.png"] * PER_BATCH,
    }
    for key, value in changes.items():
        if value is None:
            del entries[key.encode()]
        else:
            entries[key.encode()] = value
    return entries


def _meta(**changes):
    entries = {b"num_cases_per_batch": PER_BATCH, b"label_names": list(NAMES), b"num_vis": 3072}
    for key, value in changes.items():
        if value is None:
            del entries[key.encode()]
        else:
            entries[key.encode()] = value
    return entries


BAD_CONTENTS = {
    "not a dict": ("test_batch", [1, 2, 3], "expected a pickled dict, found a list"),
    "no data": ("test_batch", _batch(data=None), r"missing key\(s\) data"),
    "no labels": ("test_batch", _batch(labels=None), r"missing key\(s\) labels"),
    "data a list": ("test_batch", _batch(data=[[0] * 3072]), "data must be a NumPy array"),
    "data float": (
        "test_batch",
        _batch(data=np.zeros((PER_BATCH, 3072), np.float32)),
        "data has dtype float32, expected uint8",
    ),
    "data NCHW": (
        "test_batch",
        _batch(data=np.zeros((PER_BATCH, 3, 32, 32), np.uint8)),
        r"data has shape \(12, 3, 32, 32\), expected \(n, 3072\)",
    ),
    "data too narrow": (
        "test_batch",
        _batch(data=np.zeros((PER_BATCH, 1024), np.uint8)),
        r"data has shape \(12, 1024\)",
    ),
    "data empty": (
        "test_batch",
        _batch(data=np.zeros((0, 3072), np.uint8), labels=[], filenames=[]),
        r"data has shape \(0, 3072\)",
    ),
    "label 10": ("test_batch", _batch(labels=[10] * PER_BATCH), r"labels out of range: .* 10"),
    "label -1": ("test_batch", _batch(labels=[-1] * PER_BATCH), r"labels out of range: .* -1"),
    "labels float": ("test_batch", _batch(labels=[0.0] * PER_BATCH), "labels must be a list of"),
    "labels ragged": ("test_batch", _batch(labels=[[0], [1, 2]]), "labels must be a list of"),
    "labels short": (
        "test_batch",
        _batch(labels=[0] * (PER_BATCH - 1)),
        "labels has 11 entries but data has 12 rows",
    ),
    "filenames short": (
        "test_batch",
        _batch(filenames=[b"x.png"]),
        "filenames has 1 entries but data has 12 rows",
    ),
    "filenames ints": ("test_batch", _batch(filenames=[1] * PER_BATCH), "filenames must be a"),
    "meta not a dict": ("batches.meta", "label names", "expected a pickled dict, found a bytes"),
    "no label_names": ("batches.meta", _meta(label_names=None), r"missing key\(s\) label_names"),
    "nine names": ("batches.meta", _meta(label_names=list(NAMES[:9])), "has 9 names"),
    "num_vis": ("batches.meta", _meta(num_vis=1024), "num_vis is 1024, expected 3072"),
}


@pytest.mark.parametrize("case", list(BAD_CONTENTS))
def test_bad_contents_are_named(copy, case):
    name, obj, message = BAD_CONTENTS[case]
    cifar10_fixture.write_pickle(copy / name, obj)
    with pytest.raises(cifar10.CifarError, match=message) as caught:
        cifar10.load(copy, "test")
    assert caught.value.path == copy / name
    assert str(copy / name) in str(caught.value)


@pytest.mark.parametrize(
    "blob, message",
    [
        (b"", "the file is empty or truncated"),
        (b"hello, I am a text file\n", "not a pickle"),
        (b"<html>404 Not Found</html>", "not a pickle"),
        (b"\x1f\x8b\x08\x00 a gzip file", "not a pickle"),
    ],
)
def test_a_file_that_is_not_a_pickle_is_named(copy, blob, message):
    (copy / "test_batch").write_bytes(blob)
    with pytest.raises(cifar10.CifarError, match=message) as caught:
        cifar10.load(copy, "test")
    assert caught.value.path.name == "test_batch" and isinstance(caught.value, ValueError)


def test_a_truncated_pickle_is_named(copy):
    blob = (copy / "test_batch").read_bytes()
    (copy / "test_batch").write_bytes(blob[: len(blob) // 2])
    with pytest.raises(cifar10.CifarError, match=r"test_batch.*(empty or truncated|not a pickle)"):
        cifar10.load(copy, "test")


class _Payload:
    """Unpickling it would run ``os.system(command)``."""

    def __init__(self, command):
        self.command = command

    def __reduce__(self):
        return os.system, (self.command,)


@pytest.mark.parametrize("protocol", [0, 2, 4, 5])
def test_the_unpickler_refuses_a_pickle_that_runs_code(tmp_path, copy, protocol):
    marker = tmp_path / "pwned"
    batch = _batch(data=_Payload(f"touch {marker}"))
    (copy / "test_batch").write_bytes(pickle.dumps(batch, protocol=protocol))
    with pytest.raises(cifar10.CifarError, match=r"names the global \w+\.system") as caught:
        cifar10.load(copy, "test")
    assert caught.value.path.name == "test_batch"
    assert not marker.exists()


@pytest.mark.parametrize(
    "module, name",
    [
        ("builtins", "eval"),
        ("__builtin__", "eval"),
        ("subprocess", "Popen"),
        ("collections", "OrderedDict"),  # harmless, but no CIFAR-10 batch holds one
        ("numpy", "load"),  # NumPy, but not array reconstruction
        ("numpy.testing", "assert_equal"),
        ("builtins", "getattr"),
    ],
)
def test_the_unpickler_allows_only_numpy_reconstruction(tmp_path, module, name):
    path = tmp_path / "batch"
    path.write_bytes(b"\x80\x02c" + f"{module}\n{name}\n".encode() + b")R.")  # module.name()
    with pytest.raises(cifar10.CifarError, match=f"names the global {module}.{name}"):
        cifar10.read_pickle(path)


def test_codecs_encode_is_allowed_only_as_latin1(tmp_path):
    path = tmp_path / "batch"
    path.write_bytes(pickle.dumps(b"\xffbytes", protocol=2))  # _codecs.encode(..., "latin1")
    assert cifar10.read_pickle(path) == b"\xffbytes"
    path.write_bytes(b"\x80\x02c_codecs\nencode\nX\x03\x00\x00\x00abcX\x05\x00\x00\x00rot13\x86R.")
    with pytest.raises(cifar10.CifarError, match=r"only as text\.encode"):
        cifar10.read_pickle(path)


def test_batches_are_a_reproducible_function_of_seed_and_iteration(batches_dir):
    data = cifar10.load(batches_dir, "train")  # 60 images
    assert data.batches_per_epoch(16) == 3  # the last, incomplete batch is dropped
    epoch0 = np.concatenate([data.batch_indices(i, 16, seed=5) for i in range(3)])
    assert len(set(epoch0.tolist())) == 48  # no image twice in one epoch
    epoch1 = np.concatenate([data.batch_indices(i, 16, seed=5) for i in range(3, 6)])
    assert not np.array_equal(epoch0, epoch1)  # a fresh order every epoch
    np.testing.assert_array_equal(data.batch_indices(4, 16, seed=5), epoch1[16:32])
    assert not np.array_equal(data.batch_indices(0, 16, seed=6), epoch0[:16])
    np.testing.assert_array_equal(data.batch_indices(4, 16, shuffle=False), np.arange(16, 32))
    batches = list(data.batches(16, seed=5, start=2, stop=5))
    assert len(batches) == 3
    for iteration, (images, labels) in enumerate(batches, start=2):
        indices = data.batch_indices(iteration, 16, seed=5)
        np.testing.assert_array_equal(images, data.images[indices])
        np.testing.assert_array_equal(labels, data.labels[indices])
        assert images.shape == (16, 3, 32, 32) and labels.dtype == np.int32
    with pytest.raises(ValueError, match="larger than the cifar10 train split"):
        data.batches_per_epoch(61)
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="batch_size must be an int"):
            data.batch(0, bad)
    with pytest.raises(ValueError, match="iteration must be an int"):
        data.batch(-1, 4)
    with pytest.raises(ValueError, match="stop must be an int >= 3"):
        next(data.batches(4, start=3, stop=2))
