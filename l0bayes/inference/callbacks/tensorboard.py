"""Log a run to TensorBoard (``torch.utils.tensorboard``; ``pip install tensorboard``, the ``tensorboard`` extra)."""

import os

from ...nn.density import density_names
from ...nn.gates import gates_of
from .base import Callback

__all__ = ["TensorBoard"]


class TensorBoard(Callback):
    """Write every numeric entry of each epoch's record, and the open gates per layer, as TensorBoard scalars.

    Scalars are logged at the epoch number (1-based) under their record name (``free_energy``,
    ``test_error``, ``expected_l0``, ``lr/0``, ...); the open gates of each gated layer (Eq. 13) under
    ``open_gates/<layer>``; list entries (per-layer densities, multipliers) as ``name/<index>``. A run
    resumed from a checkpoint purges what an interrupted run wrote after its last checkpoint, so the
    curves continue without duplicates. A new run refuses a directory that already holds event files
    (it would mix two runs in one curve); pass another ``log_dir``.

    :param log_dir: the directory of the event files.
    :param bool log_histograms: also log a histogram of every gated layer's ``log_alpha`` each epoch.
    """

    def __init__(self, log_dir, log_histograms=False):
        self.log_dir = os.fspath(log_dir)
        self.log_histograms = bool(log_histograms)
        self.writer = None
        self.layer_names = None

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
        if not resumed and os.path.isdir(self.log_dir) and any("tfevents" in f for f in os.listdir(self.log_dir)):
            raise FileExistsError(
                f"TensorBoard log_dir {self.log_dir!r} already holds event files of another run; choose a new directory"
            )
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
