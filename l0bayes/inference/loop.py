"""The training loop: data, objective, optimiser, callbacks (the shape of Pyro's ``SVI`` loop).

:func:`fit` runs a :class:`Run` for its epochs. Everything besides the step (progress, history,
checkpoints, parameter averaging, ``log_alpha`` projection, schedules, TensorBoard, early stopping)
is a :class:`~l0bayes.inference.callbacks.Callback`; :func:`~l0bayes.inference.train` builds the usual
ones from its arguments.
"""

from dataclasses import dataclass, field

import torch

from .callbacks import CallbackList
from .errors import NonFiniteLossError

__all__ = ["Run", "fit"]


@dataclass
class Run:
    """The state of one training run, which the loop advances and the callbacks read.

    :ivar model: the module being trained.
    :ivar optimizer: its ``torch.optim.Optimizer``.
    :ivar objective: the :class:`~l0bayes.inference.objectives.Objective` (loss and its own state).
    :ivar batches: ``batches(run)`` gives the epoch's ``(x, y)`` minibatches on the device.
    :ivar step: ``step(x, y) -> (loss, value, statistics)``: the objective on one minibatch, ``value`` the
        differentiable quantity to minimise, ``statistics`` what the objective's update takes; it raises
        :class:`~l0bayes.inference.NonFiniteLossError` for a NaN or infinite objective (one check per step,
        where the step can read its value; :func:`~l0bayes.inference.train`'s step checks the value averaged
        over data-parallel ranks, so that every rank stops alike).
    :ivar schedule: the learning-rate schedule, if any (stepped by a callback).
    :ivar epochs: the last epoch to train (exclusive, 0-based ``epoch`` runs up to ``epochs - 1``).
    :ivar epoch: the current epoch (0-based); after a resume, the first epoch still to train.
    :ivar global_step: optimiser steps taken so far in this call.
    :ivar history: the per-epoch records (on the main process).
    :ivar stop: set by a callback to end training after the current epoch.
    """

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    objective: object
    batches: object
    step: object
    epochs: int
    num_data: int
    device: torch.device
    steps_per_epoch: int | None = None
    schedule: object = None
    epoch: int = 0
    global_step: int = 0
    history: list = field(default_factory=list)
    stop: bool = False
    is_main: bool = True
    callbacks: CallbackList = field(default_factory=CallbackList)
    last_loss: torch.Tensor | None = None
    epoch_loss: torch.Tensor | float = 0.0
    epoch_steps: int = 0

    def mean_loss(self):
        """The mean training loss of the current epoch (one read from the device)."""
        return float(self.epoch_loss) / max(self.epoch_steps, 1)


def fit(run, callbacks=None):
    """Train ``run`` from ``run.epoch`` to ``run.epochs``, calling ``callbacks`` (or ``run.callbacks``) on the way.

    :raises NonFiniteLossError: when ``run.step`` raises it (a NaN or infinite objective, before its backward
        pass), with the epoch and step.
    :returns: ``run``.
    """
    if callbacks is not None:
        run.callbacks = callbacks if isinstance(callbacks, CallbackList) else CallbackList(callbacks)
    hooks = run.callbacks
    hooks.on_fit_start(run)
    try:
        _epochs(run, hooks)
    except BaseException as error:  # Ctrl-C included: the callbacks release what they hold, then it propagates
        hooks.on_exception(run, error)
        raise
    hooks.on_fit_end(run)
    return run


def _epochs(run, hooks):
    while run.epoch < run.epochs and not run.stop:
        run.model.train()
        run.epoch_loss, run.epoch_steps = 0.0, 0
        hooks.on_epoch_start(run)
        run.objective.start_epoch(run.epoch, run.epochs)
        for x, y in run.batches(run):
            run.optimizer.zero_grad(set_to_none=True)
            try:
                loss, value, statistics = run.step(x, y)
            except NonFiniteLossError as err:  # say where
                where = f"at epoch {run.epoch + 1}, step {run.epoch_steps + 1}"
                raise NonFiniteLossError(f"{err} {where}; lower the learning rate or check the data") from None
            value.backward()
            run.optimizer.step()
            run.objective.update(statistics)
            run.last_loss = loss.detach()
            run.epoch_loss = run.epoch_loss + run.last_loss.double()
            run.epoch_steps += 1
            run.global_step += 1
            hooks.on_step_end(run)
        record = {"epoch": run.epoch + 1}
        hooks.on_epoch_end(run, record)
        run.epoch += 1
