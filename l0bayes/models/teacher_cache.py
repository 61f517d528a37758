"""What a frozen teacher computed on a batch, kept for the next time the same batch comes: :class:`TeacherCache`.

A distilled run often shows the teacher the same batches again: several epochs over a list of batches, or the
phase that learns the masks and the phase that trains the pruned model on the same training windows. The teacher
is frozen and runs in ``eval()`` mode, so its output on a batch never changes; :class:`TeacherCache` keeps it,
keyed by the content of the inputs, within a budget of bytes, and drops the least recently used entry first.
"""

import hashlib
import numbers
from collections import OrderedDict

import torch

__all__ = ["TeacherCache"]


class TeacherCache:
    """Teacher outputs keyed by the inputs they were computed on, least recently used out first.

    The key of a call's ``(args, kwargs)`` holds, for each tensor among them (also inside tuples, lists and
    dicts), its place, shape, dtype, device and a BLAKE2b digest of its bytes, and every other value (``None``,
    a bool, a number, a string) as itself; an entry also keeps a copy of the input tensors' bytes, compared on
    every hit, so that a hit is the same input byte for byte. Inputs that hold anything else are not cached.
    Reading the key copies the input tensors to the host (token ids: a few bytes a token).

    :param int max_bytes: the budget: the bytes of the cached output tensors (their storage) and of the kept
        inputs, together. An output larger than the budget is not kept; ``0`` keeps nothing and reads no key.
    :ivar hits: calls answered from the cache.
    :ivar misses: calls that ran the teacher (including those that could not be cached).
    :ivar evictions: entries dropped to stay within the budget.
    """

    def __init__(self, max_bytes):
        self.max_bytes = int(max_bytes)
        self._entries = OrderedDict()  # key -> (input bytes, output, size)
        self.nbytes = 0
        self.hits = self.misses = self.evictions = 0

    def __len__(self):
        return len(self._entries)

    def __repr__(self):
        return (
            f"TeacherCache({len(self)} batches, {self.nbytes} of {self.max_bytes} bytes, hits={self.hits}, "
            f"misses={self.misses}, evictions={self.evictions})"
        )

    def clear(self):
        """Drop every entry (the counts stay)."""
        self._entries.clear()
        self.nbytes = 0

    def get_or_compute(self, compute, args, kwargs):
        """The cached output for these inputs, or ``compute(args, kwargs)``, kept for the next call with them."""
        tensors = []
        key = _key((args, kwargs), tensors) if self.max_bytes > 0 else None
        if key is not None:
            entry = self._entries.get(key)
            if entry is not None and all(torch.equal(a, b) for a, b in zip(entry[0], tensors, strict=True)):
                self._entries.move_to_end(key)
                self.hits += 1
                return entry[1]
        self.misses += 1
        output = compute(args, kwargs)
        if key is not None:
            self._store(key, tensors, output)
        return output

    def _store(self, key, tensors, output):
        stored = [t.clone() for t in tensors]
        size = sum(t.numel() for t in stored) + _nbytes(output, set())
        old = self._entries.pop(key, None)
        if old is not None:
            self.nbytes -= old[2]
        if size > self.max_bytes:
            return
        while self._entries and self.nbytes + size > self.max_bytes:
            self.nbytes -= self._entries.popitem(last=False)[1][2]
            self.evictions += 1
        self._entries[key] = (stored, output, size)
        self.nbytes += size


def _key(value, tensors):
    """A hashable key of ``value`` (the raw bytes of its tensors appended to ``tensors``), or ``None`` where it
    holds something other than tensors, containers of them and plain values."""
    if torch.is_tensor(value):
        raw = value.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8)
        tensors.append(raw)
        digest = hashlib.blake2b(raw.numpy(), digest_size=16).digest()
        return ("tensor", tuple(value.shape), str(value.dtype), str(value.device), digest)
    if value is None or isinstance(value, (bool, numbers.Number, str)):
        return (type(value).__name__, value)
    if isinstance(value, (tuple, list)):
        parts = tuple(_key(v, tensors) for v in value)
        return None if None in parts else (type(value).__name__, parts)
    if isinstance(value, dict) and all(isinstance(k, str) for k in value):
        parts = tuple((k, _key(value[k], tensors)) for k in sorted(value))
        return None if any(p is None for _, p in parts) else ("dict", parts)
    return None


def _nbytes(value, seen):
    """The bytes of the storages of the tensors in ``value`` (each storage counted once)."""
    if torch.is_tensor(value):
        storage = value.untyped_storage()
        if storage.data_ptr() in seen:
            return 0
        seen.add(storage.data_ptr())
        return storage.nbytes()
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, (tuple, list)):
        return sum(_nbytes(v, seen) for v in value)
    return 0
