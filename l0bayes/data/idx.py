"""A small, strict reader for the IDX format of MNIST / Fashion-MNIST (optionally gzipped).

IDX layout: a 4-byte magic ``0x00 0x00 <type code> <ndim>``, then ``ndim`` big-endian uint32
dimensions, then the data in row-major order (big-endian for multi-byte types).
"""

import gzip
import math
import os
import zlib

import numpy as np
import torch

# IDX type code -> (numpy big-endian dtype, name)
_IDX_TYPES = {
    0x08: np.dtype(">u1"),
    0x09: np.dtype(">i1"),
    0x0B: np.dtype(">i2"),
    0x0C: np.dtype(">i4"),
    0x0D: np.dtype(">f4"),
    0x0E: np.dtype(">f8"),
}

FASHION_MNIST_DIRS = ("/usr/share/datasets/fashion-mnist",)

_KINDS = ("train", "t10k")

_CHUNK = 1 << 20

#: The most a gzipped IDX file may expand: real image and label files compress 2 to 10 times, a gzip bomb
#: (zeros behind a header) about 1000 times.
GZIP_RATIO = 64


def _head_is_gzip(path):
    """Whether the file at ``path`` starts as a gzip stream does."""
    with open(path, "rb") as f:
        return f.read(2) == b"\x1f\x8b"


def _read_bytes(path, limit):
    """The file's first ``limit`` bytes (decompressed if gzipped), or all of them if it holds fewer."""
    opener = gzip.open if _head_is_gzip(path) else open
    try:
        with opener(path, "rb") as f:
            chunks, left = [], limit
            while left > 0:  # in pieces: one read(limit) would allocate limit bytes at once
                chunk = f.read(min(left, _CHUNK))
                if not chunk:
                    break
                chunks.append(chunk)
                left -= len(chunk)
            return b"".join(chunks)
    except (OSError, EOFError, zlib.error) as err:  # corrupt or truncated gzip stream
        raise ValueError(f"{path}: cannot decompress IDX file ({err})") from err


def read_idx(path):
    """Read an IDX file (plain or gzipped, detected from its content) into a numpy array.

    :returns: a native-endian ``numpy.ndarray`` with the file's shape and dtype.
    :raises ValueError: on a bad magic number, an unknown type code, a truncated file or
        trailing bytes.
    """
    if not isinstance(path, (str, bytes, os.PathLike)):
        raise TypeError(f"read_idx: path must be a file path (a str or os.PathLike), got {type(path).__name__}")
    path = os.fspath(path)
    data = _read_bytes(path, 4 + 4 * 255)  # the header (at most 255 dimensions), then the data it declares
    if len(data) < 4:
        raise ValueError(f"{path}: too short for an IDX header ({len(data)} bytes)")
    zero1, zero2, type_code, ndim = data[0], data[1], data[2], data[3]
    if zero1 != 0 or zero2 != 0:
        raise ValueError(f"{path}: bad IDX magic number 0x{data[:4].hex()} (must start with two zero bytes)")
    if type_code not in _IDX_TYPES:
        raise ValueError(f"{path}: unknown IDX type code 0x{type_code:02x} in magic 0x{data[:4].hex()}")
    if ndim == 0:
        raise ValueError(f"{path}: IDX file declares 0 dimensions")
    header = 4 + 4 * ndim
    if len(data) < header:
        raise ValueError(f"{path}: truncated IDX header ({len(data)} bytes, need {header} for {ndim} dimensions)")
    dims = tuple(int(d) for d in np.frombuffer(data, dtype=">u4", count=ndim, offset=4))
    dtype = _IDX_TYPES[type_code]
    expected = math.prod(dims) * dtype.itemsize  # exact integers: huge dims cannot overflow
    if _head_is_gzip(path) and expected > GZIP_RATIO * os.path.getsize(path) + _CHUNK:
        raise ValueError(
            f"{path}: its header declares {expected:,} data bytes (dims {dims}), more than {GZIP_RATIO} times the "
            f"{os.path.getsize(path):,} bytes of the compressed file: not an IDX data set (image and label files "
            "compress 2 to 10 times), refused before decompressing it"
        )
    # Read no more than the header declares (and one byte to see trailing data): a gzipped stream that
    # decompresses past its declared data is refused without holding the rest in memory.
    data = _read_bytes(path, header + expected + 1)
    got = len(data) - header
    if got < expected:
        raise ValueError(f"{path}: truncated IDX file: dims {dims} need {expected} data bytes, found {got}")
    if got > expected:
        raise ValueError(f"{path}: {got - expected} unexpected trailing bytes after IDX data of dims {dims}")
    arr = np.frombuffer(data, dtype=dtype, offset=header).reshape(dims)
    return arr.astype(dtype.newbyteorder("="), copy=True)


def _find_file(directory, stem):
    for name in (stem, stem + ".gz"):
        candidate = os.path.join(directory, name)
        if os.path.isfile(candidate):
            return candidate
    raise FileNotFoundError(f"neither {stem} nor {stem}.gz found in {directory}")


def load_mnist_format(directory, kind="train"):
    """Load ``{kind}-images-idx3-ubyte[.gz]`` and ``{kind}-labels-idx1-ubyte[.gz]`` from ``directory``.

    :param kind: ``"train"`` or ``"t10k"``.
    :returns: ``(images, labels)``: a uint8 tensor ``N x H x W`` (28 x 28 for (Fashion-)MNIST) and an
        int64 tensor ``N``.
    :raises ValueError: on malformed files or mismatched image / label counts.
    """
    if kind not in _KINDS:
        raise ValueError(f"kind must be one of {_KINDS}, got {kind!r}")
    directory = os.fspath(directory)
    if not os.path.isdir(directory):
        raise FileNotFoundError(f"data directory {directory!r} does not exist")
    images_path = _find_file(directory, f"{kind}-images-idx3-ubyte")
    labels_path = _find_file(directory, f"{kind}-labels-idx1-ubyte")
    images, labels = read_idx(images_path), read_idx(labels_path)
    if images.ndim != 3 or images.dtype != np.uint8:
        raise ValueError(f"{images_path}: expected a uint8 array N x H x W, got {images.dtype} {images.shape}")
    if labels.ndim != 1 or labels.dtype != np.uint8:
        raise ValueError(f"{labels_path}: expected a uint8 vector, got {labels.dtype} {labels.shape}")
    if images.shape[0] != labels.shape[0]:
        raise ValueError(f"{directory}: {images.shape[0]} images but {labels.shape[0]} labels for kind {kind!r}")
    return torch.from_numpy(images), torch.from_numpy(labels.astype(np.int64))


def find_fashion_mnist():
    """The directory of the Debian ``dataset-fashion-mnist`` package if it is installed, else ``None``."""
    for directory in FASHION_MNIST_DIRS:
        try:
            _find_file(directory, "train-images-idx3-ubyte")
            _find_file(directory, "train-labels-idx1-ubyte")
        except FileNotFoundError:
            continue
        return directory
    return None
