"""Stop training when a metric of the epoch's record stops improving, and keep the best parameters."""

import math

import torch

from .base import Callback

__all__ = ["EarlyStopping"]


class EarlyStopping(Callback):
    """Stop after ``patience`` epochs without improvement of ``monitor``, and restore the best parameters.

    The metric is read from each epoch's record (so it must be recorded every epoch: a metric of the
    full record, such as ``test_error``, needs ``record_every=1``). An epoch improves when the metric
    is below the best so far by more than ``min_delta`` (``mode="min"``) or above it (``mode="max"``).
    With ``restore_best`` the model's parameters and buffers at the best epoch are kept (on the CPU)
    and put back when training ends; the best value, its epoch, the count of epochs without improvement
    and these parameters go into the checkpoint, so a resumed run stops where the straight run would.

    :param str monitor: a record entry, e.g. ``"test_error"``, ``"test_loss"``, ``"free_energy"``.
    :param int patience: epochs without improvement before stopping (``>= 1``).
    :param str mode: ``"min"`` or ``"max"``.
    :param float min_delta: the smallest change that counts as an improvement (``>= 0``).
    :param bool restore_best: put the best epoch's parameters back when training ends.

    The record of the epoch that stops the run says ``"stopped_early": True``; ``best_epoch`` (1-based)
    and ``best`` hold the best epoch and value.
    """

    state_key = "early_stopping"

    def __init__(self, monitor="test_error", patience=5, mode="min", min_delta=0.0, restore_best=True):
        if mode not in ("min", "max"):
            raise ValueError(f"mode must be 'min' or 'max', got {mode!r}")
        if isinstance(patience, bool) or not isinstance(patience, int) or patience < 1:
            raise ValueError(f"patience must be an integer >= 1, got {patience!r}")
        if not (isinstance(min_delta, (int, float)) and math.isfinite(min_delta) and min_delta >= 0):
            raise ValueError(f"min_delta must be a finite number >= 0, got {min_delta!r}")
        self.monitor, self.patience, self.mode = monitor, patience, mode
        self.min_delta, self.restore_best = float(min_delta), bool(restore_best)
        self.best = math.inf if mode == "min" else -math.inf
        self.best_epoch = None
        self.waited = 0
        self.best_state = None

    def _improved(self, value):
        if self.mode == "min":
            return value < self.best - self.min_delta
        return value > self.best + self.min_delta

    def on_epoch_end(self, run, record):
        if not run.is_main:
            return
        if self.monitor not in record or record[self.monitor] is None:
            available = sorted(k for k, v in record.items() if isinstance(v, (int, float)))
            raise KeyError(
                f"EarlyStopping: the epoch's record has no {self.monitor!r} (it has {available}); a metric of "
                "the full record (test_error, test_loss, free_energy) needs record_every=1 and test_data"
            )
        value = float(record[self.monitor])
        if self._improved(value):
            self.best, self.best_epoch, self.waited = value, run.epoch + 1, 0
            if self.restore_best:
                with run.callbacks.evaluation(run):  # what the record was evaluated with (e.g. the average)
                    self.best_state = {k: v.detach().cpu().clone() for k, v in run.model.state_dict().items()}
        else:
            self.waited += 1
            if self.waited >= self.patience:
                run.stop = True
                record["stopped_early"] = True
        record["best_epoch"], record["best"] = self.best_epoch, self.best

    def on_fit_end(self, run):
        if self.restore_best and self.best_state is not None:
            with torch.no_grad():
                run.model.load_state_dict(self.best_state)

    def state_dict(self):
        return {
            "best": self.best,
            "best_epoch": self.best_epoch,
            "waited": self.waited,
            "best_state": self.best_state,
        }

    def load_state_dict(self, state):
        self.best, self.best_epoch = float(state["best"]), state["best_epoch"]
        self.waited, self.best_state = int(state["waited"]), state["best_state"]
