"""Atomic file writes: a uniquely named temporary file in the destination's directory, then ``os.replace``.

Two writers never share a temporary file, a reader never sees a half-written file, and a failed write
leaves the previous file in place. Imports nothing heavy (the command line uses it before torch loads).
"""

import os
import tempfile

__all__ = ["atomic_write"]


def atomic_write(path, data, check=None):
    """Write ``data`` to ``path`` atomically, with the file mode a plain ``open()`` would give.

    :param path: destination file; its directory must exist.
    :param data: ``bytes``, ``str`` (written as UTF-8), or a callable ``write(file)`` that writes to the
        binary file object it is given.
    :param check: optional ``check(temporary_path)`` called after the data is on disk and before the
        replacement; an exception from it leaves ``path`` untouched.
    """
    path = os.fspath(path)
    directory, name = os.path.split(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=directory)
    try:
        if hasattr(os, "fchmod"):  # mkstemp makes the file private to its writer
            os.fchmod(fd, 0o666 & ~_umask())
        with os.fdopen(fd, "wb") as f:
            if callable(data):
                data(f)
            else:
                f.write(data.encode("utf-8") if isinstance(data, str) else data)
            f.flush()
            os.fsync(f.fileno())
        if check is not None:
            check(tmp)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _umask():
    mask = os.umask(0)
    os.umask(mask)
    return mask
