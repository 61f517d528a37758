"""Checkpoints that load without running code: the file format beneath training, pruning and export.

A checkpoint is a ``dict`` of tensors and plain Python containers (``dict``, ``list``, ``tuple``, ``str``,
numbers, ``None``), written with ``torch.save`` and read back with ``torch.load(..., weights_only=True)``:
PyTorch's restricted unpickler, which rebuilds tensors and containers and refuses every other global, so a
crafted file cannot execute code. NumPy's random state is stored as a tensor for the same reason
(:func:`numpy_rng_state`).

Writes are atomic: the state goes to a temporary file with a unique name in the same directory, which then
replaces ``path`` in one ``os.replace``; two writers never share a temporary file and a reader never sees a
half-written checkpoint.
"""

import os
import pickle

import numpy as np
import torch

from ._atomic import atomic_write

__all__ = ["CheckpointError", "load_checkpoint", "numpy_rng_state", "save_checkpoint", "set_numpy_rng_state"]


class CheckpointError(ValueError):
    """A checkpoint file exists but cannot be used: empty, truncated, corrupt, not ours, or missing entries."""


def save_checkpoint(path, state):
    """Write ``state`` to ``path`` atomically (unique temporary file in the same directory, then ``os.replace``).

    :param path: destination file; its directory must exist.
    :param dict state: tensors and plain containers only (anything else would not load with
        ``weights_only=True``, so it is refused here, at save time).
    """
    # load_checkpoint on the temporary file refuses, at save time, what a safe load could not read back.
    atomic_write(path, lambda f: torch.save(state, f), check=load_checkpoint)


def load_checkpoint(path, map_location="cpu", required=()):
    """Read a checkpoint written by :func:`save_checkpoint` with ``torch.load(weights_only=True)``.

    :param path: the file.
    :param map_location: as for ``torch.load``.
    :param required: keys the checkpoint must hold.
    :raises FileNotFoundError: when ``path`` does not exist.
    :raises CheckpointError: (a ``ValueError``) naming the file when it is empty, truncated, corrupt, holds
        anything but tensors and plain containers (e.g. a pickle that would run code), is not a ``dict``,
        or lacks one of ``required``.
    """
    path = os.fspath(path)
    if not os.path.exists(path):
        raise FileNotFoundError(f"checkpoint {path!r} does not exist")
    if os.path.isdir(path):
        raise CheckpointError(f"checkpoint {path!r} is a directory, not a file")
    if os.path.getsize(path) == 0:
        raise CheckpointError(f"checkpoint {path!r} is empty")
    try:
        state = torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as err:
        raise CheckpointError(
            f"checkpoint {path!r} holds objects other than tensors and plain containers and was not loaded "
            f"(only weights_only=True loading is allowed): {_first_line(err)}"
        ) from None
    except Exception as err:  # noqa: BLE001 - any failure to parse a file is a corrupt file (KeyError, IndexError, ...)
        raise CheckpointError(
            f"checkpoint {path!r} is truncated or corrupt ({type(err).__name__}{_first_line(err, ': ')})"
        ) from None
    if not isinstance(state, dict):
        raise CheckpointError(f"checkpoint {path!r} holds a {type(state).__name__}, not a dict of training state")
    missing = [k for k in required if k not in state]
    if missing:
        raise CheckpointError(f"checkpoint {path!r} lacks {', '.join(map(repr, missing))}: not an l0bayes checkpoint")
    return state


def _first_line(err, prefix=""):
    """The first line of an exception's message after ``prefix`` (``""`` for an empty message, e.g. ``EOFError()``)."""
    lines = str(err).splitlines()
    return prefix + lines[0] if lines else ""


def numpy_rng_state():
    """NumPy's global (legacy) random state as ``(name, tensor of keys, pos, has_gauss, cached_gaussian)``."""
    name, keys, pos, has_gauss, cached = np.random.get_state()
    return (name, torch.from_numpy(np.asarray(keys, dtype=np.int64)), int(pos), int(has_gauss), float(cached))


def set_numpy_rng_state(state):
    """Restore a state from :func:`numpy_rng_state`."""
    name, keys, pos, has_gauss, cached = state
    keys = keys.numpy() if torch.is_tensor(keys) else np.asarray(keys)
    np.random.set_state((name, keys.astype(np.uint32), int(pos), int(has_gauss), float(cached)))
