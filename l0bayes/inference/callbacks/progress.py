"""A progress bar over the steps of a run (tqdm), with the epoch's main figures beside it."""

from .base import Callback

__all__ = ["ProgressBar"]

#: The record entries shown beside the bar.
SHOWN = ("free_energy", "test_error", "test_rmse")


class ProgressBar(Callback):
    """One ``tqdm`` bar over every step still to train; the free energy and test error after each epoch.

    :param str description: the bar's label (``train()`` uses the objective's name).
    """

    def __init__(self, description="train"):
        self.description = description
        self.bar = None

    def on_fit_start(self, run):
        if not run.is_main:
            return
        from tqdm.auto import tqdm

        total = (run.epochs - run.epoch) * run.steps_per_epoch if run.steps_per_epoch else None
        self.bar = tqdm(total=total, desc=self.description, unit="step", leave=False)

    def on_step_end(self, run):
        if self.bar is not None:
            self.bar.update(1)

    def on_epoch_end(self, run, record):
        if self.bar is not None:
            self.bar.set_postfix({k: f"{v:.4g}" for k, v in record.items() if k in SHOWN and v is not None})

    def on_exception(self, run, error):
        self.on_fit_end(run)

    def on_fit_end(self, run):
        if self.bar is not None:
            self.bar.close()
            self.bar = None
