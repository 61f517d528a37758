"""The IDX reader on tiny fixture files (no real data needed)."""

import gzip

import numpy as np
import pytest
import torch
from idx_fixtures import idx_bytes as _idx_bytes
from idx_fixtures import write as _write

from l0bayes.data import find_fashion_mnist, load_mnist_format, read_idx


def _fixture_dir(tmp_path, n_images=3, n_labels=3, gz=False, kind="train"):
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, size=(n_images, 28, 28), dtype=np.uint8)
    labels = rng.integers(0, 10, size=n_labels, dtype=np.uint8)
    suffix = ".gz" if gz else ""
    _write(tmp_path / f"{kind}-images-idx3-ubyte{suffix}", _idx_bytes(images), gz)
    _write(tmp_path / f"{kind}-labels-idx1-ubyte{suffix}", _idx_bytes(labels), gz)
    return images, labels


@pytest.mark.parametrize("gz", [False, True])
def test_load_valid(tmp_path, gz):
    images, labels = _fixture_dir(tmp_path, gz=gz, kind="t10k")
    x, y = load_mnist_format(tmp_path, kind="t10k")
    assert x.dtype == torch.uint8 and x.shape == (3, 28, 28)
    assert y.dtype == torch.int64 and y.shape == (3,)
    assert np.array_equal(x.numpy(), images) and np.array_equal(y.numpy(), labels)


def test_read_idx_multibyte_big_endian(tmp_path):
    arr = np.array([[1, -2], [70000, 3]], dtype=np.int32)
    out = read_idx(_write(tmp_path / "a.idx", _idx_bytes(arr, type_code=0x0C)))
    assert out.dtype == np.int32 and np.array_equal(out, arr)
    farr = np.array([0.5, -1.25], dtype=np.float32)
    assert np.array_equal(read_idx(_write(tmp_path / "f.idx", _idx_bytes(farr, type_code=0x0D))), farr)


def test_wrong_magic(tmp_path):
    good = _idx_bytes(np.zeros((2, 2), dtype=np.uint8))
    with pytest.raises(ValueError, match="magic"):
        read_idx(_write(tmp_path / "bad", b"\x01\x00" + good[2:]))
    with pytest.raises(ValueError, match="type code"):
        read_idx(_write(tmp_path / "badtype", good[:2] + b"\x07" + good[3:]))


@pytest.mark.parametrize("gz", [False, True])
def test_truncated(tmp_path, gz):
    payload = _idx_bytes(np.zeros((4, 28, 28), dtype=np.uint8))
    with pytest.raises(ValueError, match="truncated"):
        read_idx(_write(tmp_path / "t", payload[:-10], gz))
    with pytest.raises(ValueError, match="truncated"):
        read_idx(_write(tmp_path / "h", payload[:9], gz))
    with pytest.raises(ValueError, match="too short"):
        read_idx(_write(tmp_path / "s", payload[:3], gz))
    with pytest.raises(ValueError, match="trailing"):
        read_idx(_write(tmp_path / "x", payload + b"\x00", gz))


def test_truncated_gzip_stream(tmp_path):
    raw = gzip.compress(_idx_bytes(np.arange(1000, dtype=np.uint8).reshape(10, 100) % 7))
    with pytest.raises(ValueError):
        read_idx(_write(tmp_path / "cut.gz", raw[: len(raw) // 2]))


def test_mismatched_counts(tmp_path):
    _fixture_dir(tmp_path, n_images=3, n_labels=2)
    with pytest.raises(ValueError, match="3 images but 2 labels"):
        load_mnist_format(tmp_path)


def test_missing_and_bad_kind(tmp_path):
    with pytest.raises(FileNotFoundError):
        load_mnist_format(tmp_path)
    with pytest.raises(ValueError, match="kind"):
        load_mnist_format(tmp_path, kind="test")


def test_find_fashion_mnist_type():
    found = find_fashion_mnist()
    assert found is None or isinstance(found, str)


def test_corrupt_gzip_payload(tmp_path):
    # gzip magic followed by garbage: a clear ValueError, not a zlib/OSError traceback
    path = _write(tmp_path / "train-images-idx3-ubyte.gz", b"\x1f\x8b\x08\x00" + bytes(range(200)))
    with pytest.raises(ValueError, match="cannot decompress"):
        read_idx(path)


def test_missing_directory(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_mnist_format(tmp_path / "nowhere")


def test_missing_labels_file(tmp_path):
    _fixture_dir(tmp_path, gz=True)
    (tmp_path / "train-labels-idx1-ubyte.gz").unlink()
    with pytest.raises(FileNotFoundError, match="train-labels-idx1-ubyte"):
        load_mnist_format(tmp_path)


def test_wrong_dimensionality_and_type(tmp_path):
    # labels stored as a 2-d array, images as int32: both rejected with the file named
    _write(tmp_path / "train-images-idx3-ubyte", _idx_bytes(np.zeros((2, 28, 28), dtype=np.uint8)))
    _write(tmp_path / "train-labels-idx1-ubyte", _idx_bytes(np.zeros((2, 1), dtype=np.uint8)))
    with pytest.raises(ValueError, match="labels-idx1-ubyte: expected a uint8 vector"):
        load_mnist_format(tmp_path)
    _write(tmp_path / "train-images-idx3-ubyte", _idx_bytes(np.zeros((2, 28, 28)), type_code=0x0C))
    with pytest.raises(ValueError, match="images-idx3-ubyte: expected a uint8 array"):
        load_mnist_format(tmp_path)


def test_gz_and_raw_give_the_same(tmp_path):
    (tmp_path / "raw").mkdir()
    (tmp_path / "gz").mkdir()
    _fixture_dir(tmp_path / "raw", gz=False)
    _fixture_dir(tmp_path / "gz", gz=True)
    for a, b in zip(load_mnist_format(tmp_path / "raw"), load_mnist_format(tmp_path / "gz"), strict=True):
        assert torch.equal(a, b)


def test_find_fashion_mnist_searches_the_known_directories(tmp_path, monkeypatch):
    import l0bayes.data.idx as idx

    empty, full = tmp_path / "empty", tmp_path / "full"
    empty.mkdir()
    full.mkdir()
    _fixture_dir(full, gz=True)
    monkeypatch.setattr(idx, "FASHION_MNIST_DIRS", (str(empty), str(full)))
    assert find_fashion_mnist() == str(full)
    monkeypatch.setattr(idx, "FASHION_MNIST_DIRS", (str(empty),))
    assert find_fashion_mnist() is None


@pytest.mark.parametrize("declared", [(2, 3), (2**31, 2**31)])
def test_a_gzip_bomb_is_refused_before_it_inflates(tmp_path, declared):
    """50 MB of zeros compressed into a ~50 KB file, behind a small header: refused (trailing data, or data
    that a plain file of its declared size would hold) without the 50 MB, or the declared size, in memory."""
    import tracemalloc

    dims = np.array(declared, dtype=">u4").tobytes()
    header = bytes([0, 0, 0x08, len(declared)]) + dims
    path = tmp_path / "bomb.gz"
    with gzip.open(path, "wb") as f:
        f.write(header)
        zeros = bytes(1 << 20)
        for _ in range(50):
            f.write(zeros)
    assert path.stat().st_size < 200_000
    tracemalloc.start()
    try:
        with pytest.raises(ValueError, match="trailing|more than 64 times"):
            read_idx(path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 8 * 2**20, peak


@pytest.mark.parametrize("path", [3, None, 2.5])
def test_a_path_that_is_no_path_is_named(path):
    with pytest.raises(TypeError, match="read_idx: path must be a file path"):
        read_idx(path)
