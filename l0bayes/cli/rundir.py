"""The run directory of ``l0bayes fit --out DIR``: one run per directory, one writer at a time, atomic files.

Rules:

* a new run needs a directory that does not exist or is empty; a directory holding anything else
  (a finished run, an interrupted one, other files) is refused unless ``--resume`` (continue the run
  it holds) or ``--overwrite`` (remove the earlier run's outputs, :data:`OUTPUTS`, and leave any
  other file alone);
* the run holds an exclusive lock on ``DIR/.l0bayes.lock`` (``fcntl.flock``; released by the kernel
  when the process ends, however it ends): a second ``l0bayes fit`` into the same directory fails at
  once with a message naming the process that holds it;
* every file is written to a temporary file with a unique name in the same directory and moved over
  the destination with ``os.replace``: a reader sees the old file or the new one, never half of one;
* the checkpoint present when the run starts is remembered, so that Ctrl-C never reports a
  checkpoint this run did not write as its own.
"""

import io
import json
import os

from .._atomic import atomic_write
from .errors import CLIError

__all__ = ["LOCK", "OUTPUTS", "RunDirectory"]

LOCK = ".l0bayes.lock"
# Everything `l0bayes fit` writes into a run directory (removed by --overwrite).
OUTPUTS = (
    "config.json",
    "checkpoint.pt",
    "history.json",
    "history.csv",
    "pruned.pt",
    "summary.json",
    "training.png",
    "gates.png",
)

try:  # POSIX
    import fcntl
except ImportError:  # pragma: no cover - Windows: an exclusively created lock file instead
    fcntl = None


def _stat(path):
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return (st.st_ino, st.st_mtime_ns, st.st_size)


class RunDirectory:
    """The output directory of one run. Use :meth:`check`, then :meth:`open` (locks) and :meth:`close`.

    :param path: the directory (``--out``).
    """

    def __init__(self, path):
        self.path = os.fspath(path)
        self._lock = None
        self._checkpoint_at_start = None
        self.removed = []

    def file(self, name):
        return os.path.join(self.path, name)

    def _contents(self):
        return sorted(n for n in os.listdir(self.path) if n != LOCK)

    def check(self, resume=False, overwrite=False):
        """Refuse, before any work, a path that is a file, cannot be created, or holds an earlier run.

        Runs again under the lock in :meth:`open`; here it only makes the error come before the data loads.
        """
        if os.path.exists(self.path) and not os.path.isdir(self.path):
            raise CLIError(f"--out {self.path} exists and is not a directory")
        parent = os.path.dirname(os.path.abspath(self.path))
        while not os.path.exists(parent):
            parent = os.path.dirname(parent)
        if not os.path.isdir(parent):
            raise CLIError(f"--out {self.path}: {parent} is a file, so the directory cannot be created")
        target = self.path if os.path.isdir(self.path) else parent
        if not os.access(target, os.W_OK | os.X_OK):
            raise CLIError(f"--out {self.path}: {target} is not writable")
        if self._lock is None and os.path.isfile(self.file(LOCK)):
            self._take_lock()  # in use by a running fit: say so before anything else
            self.close()
        if os.path.isdir(self.path) and not resume and not overwrite:
            contents = self._contents()
            if contents:
                shown = ", ".join(contents[:4]) + (", ..." if len(contents) > 4 else "")
                raise CLIError(
                    f"--out {self.path} is not empty ({shown}): continue its run with --resume, replace it with "
                    "--overwrite, or choose a new directory"
                )

    def open(self, resume=False, overwrite=False):
        """Create the directory, take the run's lock, apply the rules above; returns ``self``."""
        try:
            os.makedirs(self.path, exist_ok=True)
        except OSError as err:
            raise CLIError(f"cannot create --out {self.path}: {err.strerror or err}", code=1) from None
        self._take_lock()
        try:
            self.check(resume=resume, overwrite=overwrite)
            if overwrite:
                self._remove_outputs()
            self._checkpoint_at_start = _stat(self.file("checkpoint.pt"))
        except BaseException:
            self.close()
            raise
        return self

    def _take_lock(self):
        path = self.file(LOCK)
        try:
            if fcntl is not None:
                fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "another process"
                    os.close(fd)
                    raise CLIError(
                        f"--out {self.path} is in use by another l0bayes fit (pid {holder}); wait for it to end "
                        "or choose another directory",
                        code=1,
                    ) from None
                os.ftruncate(fd, 0)
                os.pwrite(fd, str(os.getpid()).encode(), 0)
            else:  # pragma: no cover
                try:
                    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
                except FileExistsError:
                    message = f"--out {self.path} is in use by another l0bayes fit ({path} exists)"
                    raise CLIError(message, code=1) from None
        except OSError as err:
            raise CLIError(f"cannot lock --out {self.path}: {err.strerror or err}", code=1) from None
        self._lock = fd

    def _remove_outputs(self):
        """Delete the earlier run's outputs and the temporary files its writers may have left."""
        for name in sorted(os.listdir(self.path)):
            temporary = name.endswith(".tmp") and any(name.startswith(f".{o}.") for o in OUTPUTS)
            if name in OUTPUTS or temporary:
                os.unlink(self.file(name))
                self.removed.append(name)

    def close(self):
        """Release the lock (the lock file stays: removing it could let two runs lock two different files)."""
        if self._lock is not None:
            if fcntl is None:  # pragma: no cover
                os.close(self._lock)
                os.unlink(self.file(LOCK))
            else:
                os.close(self._lock)
            self._lock = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # ------------------------------------------------------------------ files
    def write(self, name, data):
        """Write ``bytes`` or ``str`` to ``name`` in the directory, atomically."""
        atomic_write(self.file(name), data)

    def write_json(self, name, obj):
        self.write(name, json.dumps(obj, indent=1) + "\n")

    def write_figure(self, name, fig, dpi=110):
        """A matplotlib figure as PNG, atomically."""
        buffer = io.BytesIO()
        fig.savefig(buffer, format="png", dpi=dpi)
        self.write(name, buffer.getvalue())

    # ------------------------------------------------------------------ checkpoint
    def checkpoint_written_by_this_run(self):
        """Whether ``checkpoint.pt`` was written (replaced) since :meth:`open`."""
        now = _stat(self.file("checkpoint.pt"))
        return now is not None and now != self._checkpoint_at_start

    def checkpoint_epoch(self):
        """The epoch of ``checkpoint.pt``, or ``None`` when it is missing or unreadable."""
        from ..io import load_checkpoint

        try:
            return int(load_checkpoint(self.file("checkpoint.pt"), required=("epoch",))["epoch"])
        except (FileNotFoundError, ValueError, TypeError):  # a corrupt file must not turn Ctrl-C into a traceback
            return None
