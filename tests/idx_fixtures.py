"""Tiny MNIST-format IDX files for the loader and command-line tests (written with struct, not the reader)."""

import gzip
import struct

import numpy as np


def idx_bytes(arr, type_code=0x08, dims=None):
    """The IDX encoding of ``arr``: magic ``00 00 type ndim``, big-endian uint32 dims, big-endian data."""
    arr = np.asarray(arr)
    dims = arr.shape if dims is None else dims
    header = struct.pack(">BBBB", 0, 0, type_code, len(dims)) + struct.pack(f">{len(dims)}I", *dims)
    dtype = {0x08: ">u1", 0x0C: ">i4", 0x0D: ">f4"}[type_code]
    return header + arr.astype(dtype).tobytes()


def write(path, payload, gz=False):
    if gz:
        with gzip.open(path, "wb") as f:
            f.write(payload)
    else:
        path.write_bytes(payload)
    return path


def write_mnist_dir(directory, n_train=60, n_test=20, size=28, gz=False, seed=0, num_classes=10):
    """``{train,t10k}-{images-idx3,labels-idx1}-ubyte[.gz]`` with learnable images: class k lights up row block k.

    Returns ``{"train": (images, labels), "t10k": (images, labels)}`` as uint8 numpy arrays.
    """
    directory.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    out = {}
    for kind, n in (("train", n_train), ("t10k", n_test)):
        labels = (np.arange(n) % num_classes).astype(np.uint8)
        rng.shuffle(labels)
        images = rng.integers(0, 60, size=(n, size, size), dtype=np.uint8)
        rows = max(size // num_classes, 1)
        for i, k in enumerate(labels):
            images[i, k * rows : (k + 1) * rows] = 250
        suffix = ".gz" if gz else ""
        write(directory / f"{kind}-images-idx3-ubyte{suffix}", idx_bytes(images), gz)
        write(directory / f"{kind}-labels-idx1-ubyte{suffix}", idx_bytes(labels), gz)
        out[kind] = (images, labels)
    return out
