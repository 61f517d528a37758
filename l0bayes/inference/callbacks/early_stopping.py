"""Stop training when a metric of the epoch's record stops improving, and keep the best parameters."""

import math
import numbers
import warnings

import torch

from .base import Callback
from .records import VALIDATION_METRICS

__all__ = ["EarlyStopping", "StopWhenFixed"]

#: Record entries that are never one number: a flag, the step sizes of the groups, counts per layer.
NOT_NUMBERS = {
    "full_record": "a flag (True or False)",
    "stopped_early": "a flag (True or False)",
    "gates_fixed": "a flag (True or False)",
    "lr": "a list (the step size of each parameter group)",
    "active_gates": "a list (the open gates of each layer)",
}


class EarlyStopping(Callback):
    """Stop after ``patience`` epochs without improvement of ``monitor``, and restore the best parameters.

    The metric is read from each epoch's record (so it must be recorded every epoch: a metric of the
    full record, such as ``validation_error``, needs ``record_every=1``); it must be one number (not a flag
    such as ``full_record``, nor a list such as ``lr``). An epoch improves when the metric is below the best
    so far by more than ``min_delta`` (``mode="min"``) or above it (``mode="max"``). With ``restore_best`` the
    model's parameters and buffers at the best epoch are kept (on the CPU) and put back when training ends;
    the best value, its epoch, the count of epochs without improvement, the metric, the mode and these
    parameters go into the checkpoint, so a resumed run stops where the straight run would. A resume that
    monitors another metric, in another mode, or with ``restore_best`` where the checkpoint's run kept no
    parameters is a ``ValueError`` naming what differs (its best value would mean something else);
    ``patience`` and ``min_delta`` may change, and apply from the first epoch trained after the resume.

    :param str monitor: a record entry, e.g. ``"validation_error"``, ``"validation_loss"``, ``"free_energy"``.
        ``None`` (the default): the validation metric of :func:`~l0bayes.inference.train`'s ``validation_data``
        (``validation_error`` of a classifier, ``validation_rmse`` of a linear regression, ``validation_loss``
        of a model with its own loss); ``train`` without ``validation_data`` is then a ``ValueError``. The best
        epoch is a choice made on this metric: a metric of the test data (``test_error``) makes the test
        error of the chosen model optimistic (a warning says so); keep the test data for the final evaluation.
    :param int patience: epochs without improvement before stopping (``>= 1``).
    :param str mode: ``"min"`` or ``"max"``.
    :param float min_delta: the smallest change that counts as an improvement (``>= 0``).
    :param bool restore_best: put the best epoch's parameters back when training ends.

    The record of the epoch that stops the run says ``"stopped_early": True``; ``best_epoch`` (1-based)
    and ``best`` hold the best epoch and value.
    """

    state_key = "early_stopping"

    def __init__(self, monitor=None, patience=5, mode="min", min_delta=0.0, restore_best=True):
        if monitor is not None and not isinstance(monitor, str):
            raise TypeError(f"monitor must be the name of a record entry (a str) or None, got {monitor!r}")
        if monitor in NOT_NUMBERS:
            raise ValueError(
                f"monitor={monitor!r}: the record's {monitor!r} is {NOT_NUMBERS[monitor]}, not one number; monitor "
                "a metric such as 'validation_error', 'validation_loss' or 'free_energy'"
            )
        if mode not in ("min", "max"):
            raise ValueError(f"mode must be 'min' or 'max', got {mode!r}")
        if isinstance(patience, bool) or not isinstance(patience, int) or patience < 1:
            raise ValueError(f"patience must be an integer >= 1, got {patience!r}")
        if not (
            isinstance(min_delta, numbers.Real)
            and not isinstance(min_delta, bool)
            and math.isfinite(min_delta)
            and min_delta >= 0
        ):
            raise ValueError(f"min_delta must be a finite number >= 0, got {min_delta!r}")
        if not isinstance(restore_best, bool):
            raise TypeError(f"restore_best must be True or False, got {restore_best!r}")
        self.monitor, self.patience, self.mode = monitor, patience, mode
        self.min_delta, self.restore_best = float(min_delta), restore_best
        self._monitored = monitor  # the entry read: with monitor=None, the validation metric's name once seen
        self.best = math.inf if mode == "min" else -math.inf
        self.best_epoch = None
        self.waited = 0
        self.best_state = None
        if monitor is not None and monitor.startswith("test_"):
            warnings.warn(
                f"EarlyStopping(monitor={monitor!r}) chooses the best epoch on the test data: the chosen "
                f"model's {monitor} is then optimistic. Pass validation_data= to train() and monitor its "
                "metric (the default), and keep the test data for the final evaluation",
                UserWarning,
                stacklevel=2,
            )

    def setup(self, run):
        validation = _history_validation(run)
        if self.monitor is None and validation is False:
            raise ValueError(
                "EarlyStopping() monitors the validation metric by default, but train() was given no "
                "validation_data: pass validation_data=(x_val, y_val) (or a DataLoader of them), or name the "
                "record entry to monitor, e.g. EarlyStopping('free_energy')"
            )

    def _improved(self, value):
        if self.mode == "min":
            return value < self.best - self.min_delta
        return value > self.best + self.min_delta

    def _value(self, record):
        """The monitored entry of ``record`` as a float, or a clear error when it is missing or not one number."""
        if self._monitored is None:  # the validation metric, whichever the model records
            self._monitored = next((k for k in VALIDATION_METRICS if record.get(k) is not None), None)
        name = self._monitored
        if name is None or record.get(name) is None:
            available = sorted(k for k, v in record.items() if _number(v) is not None)
            wanted = repr(name) if name is not None else f"validation metric ({', '.join(VALIDATION_METRICS)})"
            raise KeyError(
                f"EarlyStopping: the epoch's record has no {wanted} (it has {available}); a metric of "
                "the full record (validation_error, validation_loss, free_energy) needs record_every=1, and a "
                "validation metric needs train(validation_data=...)"
            )
        value = _number(record[name])
        if value is None:
            held = record[name]
            numeric = sorted(k for k, v in record.items() if _number(v) is not None)
            raise ValueError(
                f"EarlyStopping(monitor={name!r}): the record's {name!r} is {held!r:.60} (a {type(held).__name__}), "
                f"not one number; monitor a numeric entry such as {numeric}"
            )
        return value

    def on_epoch_end(self, run, record):
        if not run.is_main:
            return
        value = self._value(record)
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
            "monitor": self._monitored,
            "mode": self.mode,
            "restore_best": self.restore_best,
        }

    def load_state_dict(self, state):
        if "monitor" in state:  # (checkpoints of earlier versions hold neither the metric nor the mode)
            self._check_same(state)
            self._monitored = state["monitor"]
        self.best, self.best_epoch = float(state["best"]), state["best_epoch"]
        self.waited, self.best_state = int(state["waited"]), state["best_state"]

    def _check_same(self, state):
        """A ``ValueError`` naming every setting of the checkpoint's early stopping that this one changes."""
        saved = state["monitor"]
        changed = []
        if self.monitor is None and saved is not None and saved not in VALIDATION_METRICS:
            changed.append(f"monitor {saved!r} -> None (the validation metric)")
        elif self.monitor is not None and saved is not None and saved != self.monitor:
            changed.append(f"monitor {saved!r} -> {self.monitor!r}")
        if state["mode"] != self.mode:
            changed.append(f"mode {state['mode']!r} -> {self.mode!r}")
        if self.restore_best and not state["restore_best"] and state["best_epoch"] is not None:
            changed.append("restore_best False -> True (the best epoch's parameters were not kept)")
        if changed:
            raise ValueError(
                f"cannot resume EarlyStopping: its checkpoint compared another best value: {'; '.join(changed)}; "
                "resume with the checkpoint's settings, or train anew"
            )


def _number(value):
    """``value`` as a float when it is one real number (a bool is a flag, not a number), else ``None``."""
    if torch.is_tensor(value):
        if value.numel() != 1 or value.dtype == torch.bool or value.is_complex():
            return None
        return float(value)
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        return float(value)
    return None


def _history_validation(run):
    """Whether the run's :class:`~l0bayes.inference.callbacks.History` records validation metrics (``None``:
    the run has no ``History``: the record says at its end)."""
    from .records import History

    histories = [cb for cb in getattr(run.callbacks, "callbacks", ()) if isinstance(cb, History)]
    if not histories:
        return None
    return any(h.validation_data is not None for h in histories)


class StopWhenFixed(Callback):
    """End training after the epoch in which the constrained objective has fixed every gate: with
    ``Constrained(target_architecture=..., arrival="each")`` each block's size is fixed the step its constraint
    arrives, and once all are the gated model is the pruned architecture, so the steps left are better spent on the
    pruned model (:func:`~l0bayes.pruning.prune`, then training it on). The record of that epoch says so
    (``stopped_early``). For a stop at the very step, give ``train`` one batch per epoch (e.g. ``epochs=steps`` over
    an iterable that yields one batch per pass).

    :raises ValueError: at the start of training, for an objective that never fixes its gates on its own (not
        :class:`~l0bayes.inference.Constrained`).
    """

    def setup(self, run):
        if not hasattr(run.objective, "all_fixed"):
            raise ValueError(
                f"StopWhenFixed waits for the constrained objective to fix its gates; the {run.objective.name!r} "
                "objective never does: train with objective=Constrained(...)"
            )

    def on_epoch_end(self, run, record):
        if run.objective.all_fixed:
            record["stopped_early"] = True
            run.stop = True
