"""A learning-rate schedule stepped once per epoch."""

from ..optimizers import describe_scheduler, step_scheduler
from .base import Callback

__all__ = ["LRSchedule"]


class LRSchedule(Callback):
    """Step ``scheduler`` at the end of every epoch (``ReduceLROnPlateau`` with the epoch's mean training loss).

    The record's ``lr`` (the step size of each parameter group during the epoch) is taken before the step.
    Its state goes into the checkpoint under ``"scheduler"``.
    """

    state_key = "scheduler"

    def __init__(self, scheduler):
        if not (hasattr(scheduler, "step") and hasattr(scheduler, "state_dict")):
            raise TypeError(f"scheduler= must return a learning-rate scheduler, got {type(scheduler).__name__}")
        self.scheduler = scheduler

    def description(self):
        """The schedule's class and settings (what a resume must match)."""
        return describe_scheduler(self.scheduler)

    def on_epoch_end(self, run, record):
        record.setdefault("lr", [float(g["lr"]) for g in run.optimizer.param_groups])
        step_scheduler(self.scheduler, run.mean_loss())

    def state_dict(self):
        return self.scheduler.state_dict()

    def load_state_dict(self, state):
        self.scheduler.load_state_dict(state)
