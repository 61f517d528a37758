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

__all__ = ["FiniteCheck", "Run", "fit"]

#: Steps between two host reads of the finiteness flag on an accelerator (the CPU checks every step).
ACCELERATOR_CHECK_EVERY = 100


class FiniteCheck:
    """Refuses a NaN or infinite objective, reading it back to the host only every ``every`` steps.

    A read every step stalls an accelerator: the host waits for the step's kernels before it launches the
    next step's. With ``every > 1`` the steps only update a flag on the device (is any objective since the
    last read non-finite, and for how many steps), and :meth:`check` reads it every ``every`` steps and at the
    end of every epoch, before anything is recorded or saved. The error then names the first non-finite step;
    the steps after it, up to the read, updated the parameters with non-finite gradients, so the model is not
    usable, while the last checkpoint (written at an epoch's end, after the read) is clean. With ``every=1``
    (the default, and ``train``'s on the CPU, where a read costs nothing) the error comes before the step's
    backward pass.

    :param int every: steps between host reads (``>= 1``).
    """

    def __init__(self, every=1):
        if isinstance(every, bool) or not isinstance(every, int) or every < 1:
            raise ValueError(f"every must be a whole number >= 1, got {every!r}")
        self.every = every
        self._bad = None  # device bool: some objective since the last read was not finite
        self._since = None  # device int: steps since the first such one, that one included

    def observe(self, value):
        """Record one step's objective ``value`` (a scalar tensor, the same on every data-parallel rank).

        :raises NonFiniteLossError: at once, when ``every == 1`` and ``value`` is not finite.
        """
        bad = ~torch.isfinite(value.detach())
        if self.every == 1:
            if bad:
                raise NonFiniteLossError(f"non-finite objective ({float(value.detach())})")
            return
        if self._bad is None:
            self._bad, self._since = bad.clone(), bad.long()
        else:
            self._bad.logical_or_(bad)
            self._since.add_(self._bad)

    def due(self, steps):
        """Whether the flag is to be read after ``steps`` steps of the epoch."""
        return self.every > 1 and steps % self.every == 0

    def check(self):
        """Read the flag (one host read) and clear it.

        :raises NonFiniteLossError: when some objective since the last read was not finite; its ``steps_ago``
            attribute says how many steps before this read the first one was (1: the last step).
        """
        if self._bad is None:
            return
        bad, since = bool(self._bad), int(self._since)
        self._bad = self._since = None
        if bad:
            err = NonFiniteLossError("non-finite objective")
            err.steps_ago = since
            raise err


@dataclass
class Run:
    """The state of one training run, which the loop advances and the callbacks read.

    :ivar model: the module being trained.
    :ivar optimizer: its ``torch.optim.Optimizer``.
    :ivar objective: the :class:`~l0bayes.inference.objectives.Objective` (loss and its own state).
    :ivar batches: ``batches(run)`` gives the epoch's ``(x, y)`` minibatches on the device.
    :ivar step: ``step(x, y) -> (loss, value, statistics[, data term])``: the objective on one minibatch, ``value``
        the differentiable quantity to minimise, ``statistics`` what the objective's update takes, and optionally
        the data term of the loss (``N`` times the minibatch's mean loss per example, or ``None``); it hands the
        objective to ``finite`` (:func:`~l0bayes.inference.train`'s step hands the value averaged over the
        data-parallel ranks, so that every rank stops alike) or raises
        :class:`~l0bayes.inference.NonFiniteLossError` itself.
    :ivar finite: the :class:`FiniteCheck` the step reports to; the loop reads it every ``finite.every``
        steps and at the end of every epoch.
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
    epoch_data: torch.Tensor | float | None = 0.0
    epoch_steps: int = 0
    finite: FiniteCheck = field(default_factory=FiniteCheck)

    def mean_loss(self):
        """The mean training loss of the current epoch (one read from the device)."""
        return float(self.epoch_loss) / max(self.epoch_steps, 1)

    def mean_data_loss(self):
        """The mean over the current epoch's steps of the data term per training example (``nll / N``: the mean of a
        :class:`~l0bayes.models.SparseModel`'s ``loss_fn``, e.g. a language model's loss per token), or ``None``
        where a step did not give its data term."""
        if self.epoch_data is None or self.epoch_steps == 0:
            return None
        return float(self.epoch_data) / self.epoch_steps / self.num_data


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
        run.epoch_loss, run.epoch_data, run.epoch_steps = 0.0, 0.0, 0
        hooks.on_epoch_start(run)
        run.objective.start_epoch(run.epoch, run.epochs)
        for x, y in run.batches(run):
            run.optimizer.zero_grad(set_to_none=True)
            try:
                loss, value, statistics, *data = run.step(x, y)
            except NonFiniteLossError as err:
                _read_finite(run)  # an earlier non-finite objective not read yet is the cause: name that one
                _nonfinite(run, err, run.epoch_steps + 1)
            except Exception:
                _read_finite(run)  # e.g. a distribution refusing NaN parameters, after a non-finite objective
                raise
            value.backward()
            run.optimizer.step()
            run.objective.update(statistics)
            run.last_loss = loss.detach()
            run.epoch_loss = run.epoch_loss + run.last_loss.double()
            data = data[0] if data else None
            run.epoch_data = None if data is None or run.epoch_data is None else run.epoch_data + data.detach().double()
            run.epoch_steps += 1
            run.global_step += 1
            if run.finite.due(run.epoch_steps):
                _read_finite(run)
            hooks.on_step_end(run)
        _read_finite(run)
        record = {"epoch": run.epoch + 1}
        hooks.on_epoch_end(run, record)
        run.epoch += 1


def _read_finite(run):
    try:
        run.finite.check()
    except NonFiniteLossError as err:
        _nonfinite(run, err, run.epoch_steps - err.steps_ago + 1)


def _nonfinite(run, err, step):
    """Raise ``err`` again, saying at which step of which epoch the objective was first not finite."""
    where = f"at epoch {run.epoch + 1}, step {step}"
    late = getattr(err, "steps_ago", None)
    if late is not None:  # found by a delayed read: say so
        where += f" (found {late - 1} step(s) later: on this device the flag is read every {run.finite.every} steps)"
    raise NonFiniteLossError(f"{err} {where}; lower the learning rate or check the data") from None
