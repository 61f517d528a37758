"""Log a run to TensorBoard (``torch.utils.tensorboard``; ``pip install tensorboard``, the ``tensorboard`` extra)."""

import os
import re
import uuid

from ..._atomic import atomic_write
from ...nn.density import density_names
from ...nn.gates import gates_of
from .base import Callback

__all__ = ["RUN_ID_FILE", "TensorBoard"]

#: The file in a log directory naming the run that writes its events (a random id, also in the run's checkpoint).
RUN_ID_FILE = "l0bayes_run_id"


class TensorBoard(Callback):
    """Write every numeric entry of each epoch's record, and the open gates per layer, as TensorBoard scalars.

    Scalars are logged at the epoch number (1-based) under their record name (``free_energy``,
    ``test_error``, ``expected_l0``, ``lr/0``, ...); the open gates of each gated layer (Eq. 13) under
    ``open_gates/<layer>``; list entries (per-layer densities, multipliers) as ``name/<index>``.

    Another run's events are never changed. A run writes a random id into ``log_dir``
    (:data:`RUN_ID_FILE`) and keeps it in its checkpoint. A new run refuses a directory that already holds
    event files (it would mix two runs in one curve), and so does a resumed run unless the directory's id is
    the one in its checkpoint: then it is the same run, and it continues after the last checkpointed epoch,
    purging only what it wrote itself after that checkpoint (the curves continue without duplicates). A
    refused directory is a ``FileExistsError``; pass another ``log_dir``.

    :param log_dir: the directory of the event files (a ``str`` or ``os.PathLike``, not empty).
    :param bool log_histograms: also log a histogram of every gated layer's ``log_alpha`` each epoch.
    """

    state_key = "tensorboard"

    def __init__(self, log_dir, log_histograms=False):
        if not isinstance(log_dir, (str, os.PathLike)):
            raise TypeError(f"TensorBoard: log_dir must be a path (a str or os.PathLike), got {type(log_dir).__name__}")
        self.log_dir = os.fspath(log_dir)
        if not isinstance(self.log_dir, str):  # a bytes path: the event writer takes text
            raise TypeError(f"TensorBoard: log_dir must be a path (a str or os.PathLike), got {log_dir!r}")
        if not self.log_dir:
            raise ValueError(f"TensorBoard: log_dir must name a directory, got the empty path {log_dir!r}")
        self.log_histograms = bool(log_histograms)
        self.writer = None
        self.layer_names = None
        self.run_id = None  # this run's id: new, or the checkpoint's on a resume

    def state_dict(self):
        return {"run_id": self.run_id} if self.run_id is not None else {}

    def load_state_dict(self, state):
        self.run_id = _valid_id(state.get("run_id"))

    def on_fit_start(self, run):
        if not run.is_main:
            return
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as err:  # tensorboard itself is missing
            raise ImportError(
                "the TensorBoard callback needs the tensorboard package: pip install tensorboard"
            ) from err
        resumed = run.epoch > 0
        if os.path.isdir(self.log_dir) and any("tfevents" in f for f in os.listdir(self.log_dir)):
            owner = _read_id(self.log_dir)
            if not resumed or self.run_id is None or owner != self.run_id:
                raise FileExistsError(_refusal(self.log_dir, resumed, run.epoch, owner, self.run_id))
        else:  # nothing logged there yet: the directory becomes this run's
            self.run_id = self.run_id or uuid.uuid4().hex
            if os.path.exists(self.log_dir) and not os.path.isdir(self.log_dir):
                raise FileExistsError(f"TensorBoard: log_dir {self.log_dir!r} is a file, not a directory")
            os.makedirs(self.log_dir, exist_ok=True)
            atomic_write(os.path.join(self.log_dir, RUN_ID_FILE), self.run_id)
        # The same run: what it wrote after its checkpoint (an interrupted epoch) is purged
        self.writer = SummaryWriter(self.log_dir, purge_step=run.epoch + 1 if resumed else None)
        self.layer_names = density_names(run.model) if gates_of(run.model) else []  # fc1, as the user named it

    def on_epoch_end(self, run, record):
        if self.writer is None:
            return
        step = run.epoch + 1
        for name, value in record.items():
            if name == "epoch":
                continue
            if name == "active_gates" and isinstance(value, list) and len(value) == len(self.layer_names):
                for layer, count in zip(self.layer_names, value, strict=True):
                    self.writer.add_scalar(f"open_gates/{layer}", count, step)
            elif isinstance(value, bool):
                self.writer.add_scalar(name, int(value), step)
            elif isinstance(value, (int, float)):
                self.writer.add_scalar(name, value, step)
            elif isinstance(value, (list, tuple)) and all(isinstance(v, (int, float)) for v in value):
                for i, v in enumerate(value):
                    self.writer.add_scalar(f"{name}/{i}", v, step)
            elif isinstance(value, dict) and all(isinstance(v, (int, float)) for v in value.values()):
                for key, v in value.items():
                    self.writer.add_scalar(f"{name}/{key}", v, step)  # (per-layer entries: density_names)
        if self.log_histograms:
            for layer, (_, gate) in zip(self.layer_names, gates_of(run.model), strict=True):
                self.writer.add_histogram(f"log_alpha/{layer}", gate.log_alpha.detach().cpu(), step)
        self.writer.flush()

    def on_exception(self, run, error):
        self.on_fit_end(run)

    def on_fit_end(self, run):
        if self.writer is not None:
            self.writer.close()
            self.writer = None


def _valid_id(run_id):
    """``run_id`` when it is one of ours (32 hex digits), else ``None``."""
    return run_id if isinstance(run_id, str) and re.fullmatch(r"[0-9a-f]{32}", run_id) else None


def _read_id(log_dir):
    """The run id written into ``log_dir``, or ``None`` (no file, or not an id)."""
    try:
        with open(os.path.join(log_dir, RUN_ID_FILE), "rb") as f:
            return _valid_id(f.read(64).decode("ascii", "replace").strip())
    except OSError:
        return None


def _refusal(log_dir, resumed, epoch, owner, run_id):
    """Why a log directory holding event files is refused."""
    if not resumed:
        return f"TensorBoard log_dir {log_dir!r} already holds event files of another run; choose a new directory"
    if run_id is None:
        whose = "this run's checkpoint holds no TensorBoard run id, so they cannot be its own"
    elif owner is None:
        whose = f"no {RUN_ID_FILE} file there names the run that wrote them"
    else:
        whose = f"they belong to run {owner}, and this is run {run_id}"
    return (
        f"TensorBoard log_dir {log_dir!r} holds event files of another run ({whose}); resuming into it would "
        f"overwrite that run's steps after {epoch}: choose a new directory"
    )
