"""Checkpoints that load without running code: the file format beneath training, pruning and export.

A checkpoint is a ``dict`` of tensors and plain Python containers (``dict``, ``list``, ``tuple``, ``str``,
numbers, ``None``), written with ``torch.save`` and read back with ``torch.load(..., weights_only=True)``:
PyTorch's restricted unpickler, which rebuilds tensors and containers and refuses every other global, so a
crafted file cannot execute code. NumPy's random state is stored as a tensor for the same reason
(:func:`numpy_rng_state`).

Loading bounds the memory a file may take before ``torch.load`` reads it (:mod:`l0bayes._archive`): torch
believes the sizes a file declares, so a file that is not torch's zip format (the legacy format of torch before
1.6 included), whose entries are compressed (``torch.save`` stores them as they are) or declare more bytes than
the file holds, or whose pickle calls a function ``torch.save`` does not write for tensors and plain values or
would build more than the file's size plus 64 MiB of objects, is refused first. A file that loads takes at most
about twice its size plus that.

Writes are atomic: the state goes to a temporary file with a unique name in the same directory, which then
replaces ``path`` in one ``os.replace``; two writers never share a temporary file and a reader never sees a
half-written checkpoint.
"""

import os
import pickle

import numpy as np
import torch

from ._archive import check_archive
from ._atomic import atomic_write

__all__ = [
    "CheckpointError",
    "CheckpointTypeError",
    "cpu_copy",
    "load_checkpoint",
    "numpy_rng_state",
    "save_checkpoint",
    "set_numpy_rng_state",
]


class CheckpointError(ValueError):
    """A checkpoint file exists but cannot be used: empty, truncated, corrupt, not ours, or missing entries."""


class CheckpointTypeError(CheckpointError, TypeError):
    """A value of the wrong type: in a state to save (one that could not be saved or loaded back safely), or in
    a file (an entry of another type than its format has). Both a :class:`CheckpointError` and a ``TypeError``."""


def save_checkpoint(path, state):
    """Write ``state`` to ``path`` atomically (unique temporary file in the same directory, then ``os.replace``).

    An existing file at ``path`` is replaced in one step; a failed write leaves it as it was and no
    temporary file behind.

    :param path: destination file; its directory must exist.
    :param dict state: tensors and plain containers only (anything else would not load with
        ``weights_only=True``, so it is refused here, at save time).
    :raises TypeError: when ``path`` is not a path; a :class:`CheckpointTypeError` when ``state`` holds an
        object that cannot be saved or would not load back with ``weights_only=True`` (a function, a NumPy
        value, an object of your own class).
    :raises FileNotFoundError: when the directory of ``path`` does not exist.
    :raises IsADirectoryError: when ``path`` is a directory.
    """
    path = _output_path(path)

    def write(f):
        try:
            torch.save(state, f)
        except (pickle.PicklingError, TypeError, AttributeError) as err:
            raise CheckpointTypeError(
                f"{path!r} was not written: the state holds an object that cannot be saved ({err})"
            ) from None

    def check(tmp):  # refuses, at save time, what a safe load could not read back
        try:
            load_checkpoint(tmp)
        except CheckpointError as err:
            reason = str(err)
            for before_reason in ("loading is allowed): ", "before it was loaded: "):
                reason = reason.split(before_reason, 1)[-1]
            reason = reason.replace(repr(tmp), "the file")
            raise CheckpointTypeError(
                f"{path!r} was not written: the state would not load back safely: {reason}"
            ) from None

    atomic_write(path, write, check=check)


def _output_path(path):
    """``path`` as a ``str`` or ``bytes``, checked: not a directory, in a directory that exists."""
    try:
        path = os.fspath(path)
    except TypeError:
        raise TypeError(f"path must be a str or an os.PathLike, got {type(path).__name__}") from None
    if os.path.isdir(path):
        raise IsADirectoryError(f"path {path!r} is a directory; give the name of a file in it")
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        raise FileNotFoundError(f"the directory of path {path!r} does not exist")
    return path


def load_checkpoint(path, map_location="cpu", required=()):
    """Read a checkpoint written by :func:`save_checkpoint` with ``torch.load(weights_only=True)``.

    :param path: the file.
    :param map_location: as for ``torch.load``.
    :param required: keys the checkpoint must hold.
    :raises TypeError: when ``path`` is not a path.
    :raises FileNotFoundError: when ``path`` does not exist.
    :raises CheckpointError: (a ``ValueError``) naming the file when it is empty, truncated, corrupt, holds
        anything but tensors and plain containers (e.g. a pickle that would run code), is not a ``dict``,
        or lacks one of ``required``; before anything is read into memory, when it is not in torch's zip format
        or declares more than it holds (see the module's docstring), saying why.
    """
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"path must be a file path (a str or os.PathLike), got {type(path).__name__}")
    path = os.fspath(path)
    if not os.path.exists(path):
        raise FileNotFoundError(f"checkpoint {path!r} does not exist")
    if os.path.isdir(path):
        raise CheckpointError(f"checkpoint {path!r} is a directory, not a file")
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size == 0:
            raise CheckpointError(f"checkpoint {path!r} is empty")
        try:
            check_archive(f, size)
        except ValueError as err:
            raise CheckpointError(f"checkpoint {path!r} {err}") from None
        f.seek(0)
        state = _load(f, path, map_location)
    shared = _first_overlapping(state)
    if shared is not None:
        raise CheckpointError(
            f"checkpoint {path!r} holds a tensor whose elements share memory ({shared}: strides that read one "
            "value many times, as expand() makes): the checkpoints and pruned models l0bayes writes hold each value "
            "once, and such a tensor would take its full size in memory as soon as it trains"
        )
    if not isinstance(state, dict):
        raise CheckpointError(f"checkpoint {path!r} holds a {type(state).__name__}, not a dict of training state")
    missing = [k for k in required if k not in state]
    if missing:
        raise CheckpointError(f"checkpoint {path!r} lacks {', '.join(map(repr, missing))}: not an l0bayes checkpoint")
    return state


def _first_overlapping(value, where="the checkpoint", depth=0):
    """Where in ``value`` (dicts, lists and tuples of tensors) a tensor's elements overlap in memory, or ``None``.

    A tensor's elements are distinct when, its dimensions of size > 1 sorted by stride, each stride exceeds the
    farthest offset the dimensions before it reach."""
    if torch.is_tensor(value):
        reach = 0
        for stride, size in sorted((st, sz) for st, sz in zip(value.stride(), value.shape, strict=True) if sz > 1):
            if stride <= reach:
                return f"{where}: shape {tuple(value.shape)}, strides {value.stride()}"
            reach += (size - 1) * stride
        return None
    if depth > 100:  # (the pickle check bounds nesting already)
        return None
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, (list, tuple)) else ()
    for key, item in items:
        found = _first_overlapping(item, f"{where}[{key!r}]", depth + 1)
        if found is not None:
            return found
    return None


def _load(f, path, map_location):
    """``torch.load(f, weights_only=True)``, any failure a :class:`CheckpointError` naming ``path``."""
    try:
        return torch.load(f, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as err:
        raise CheckpointError(
            f"checkpoint {path!r} holds objects other than tensors and plain containers and was not loaded "
            f"(only weights_only=True loading is allowed): {_unpickler_reason(err)}"
        ) from None
    except Exception as err:  # noqa: BLE001 - any failure to parse a file is a corrupt file (KeyError, IndexError, ...)
        raise CheckpointError(
            f"checkpoint {path!r} is truncated or corrupt ({type(err).__name__}{_first_line(err, ': ')})"
        ) from None


def _unpickler_reason(err):
    """What the restricted unpickler refused (its own line of torch's long message), or the message's first line."""
    lines = str(err).splitlines()
    for k, line in enumerate(lines):
        if "WeightsUnpickler error:" in line:  # its reason follows, on this line or the next that is not empty
            after = [line.split("WeightsUnpickler error:", 1)[1], *lines[k + 1 :]]
            reason = next((text.strip() for text in after if text.strip()), "")
            return reason.split(" Please use", 1)[0].strip()
    return _first_line(err)


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


def cpu_copy(state):
    """A copy of a state (tensors in nested dicts, lists and tuples) whose tensors are CPU copies: it stays as it is
    while training goes on (the state kept for a later checkpoint, an optimiser's state to save)."""
    if torch.is_tensor(state):
        return state.detach().to("cpu", copy=True)
    if isinstance(state, dict):
        return {k: cpu_copy(v) for k, v in state.items()}
    if isinstance(state, (list, tuple)):
        return type(state)(cpu_copy(v) for v in state)
    return state
