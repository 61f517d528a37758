"""Evaluate (and return) the exponential moving average of the parameters (the paper's code: ``beta = 0.999``)."""

import contextlib

from ..._checks import Rule, check_args
from ..averaging import ParameterAverage
from .base import Callback

__all__ = ["ParameterAveraging"]

_DECAY = Rule("a number in [0, 1)", lambda v: (v >= 0) & (v < 1))


class ParameterAveraging(Callback):
    r"""Keep the bias-corrected moving average of every parameter (:class:`~l0bayes.inference.ParameterAverage`).

    The average is updated after every step; each epoch's record is evaluated with it (its
    :meth:`evaluation` context swaps it in), and the model holds it when training ends. The raw
    parameters go on training and are what a checkpoint resumes from; the average itself goes into
    the checkpoint under ``"ema"``.

    :param float decay: :math:`\beta` in ``[0, 1)``.
    """

    state_key = "ema"
    before_records = True
    #: A resume needs the average (the message when the checkpoint has none).
    required_in_checkpoint = "holds no parameter average: it was not trained with ParameterAveraging"

    def __init__(self, decay):
        check_args("ParameterAveraging", {"decay": _DECAY}, decay=decay)
        self.decay = float(decay)
        self.average = None

    def setup(self, run):
        self.average = ParameterAverage(run.model, self.decay)

    def on_step_end(self, run):
        self.average.update()

    @contextlib.contextmanager
    def evaluation(self, run):
        with self.average.swapped():
            if self.average.steps:
                run.objective.finalize_parameters()  # the average of fixed gates is fixed too
            yield

    def on_fit_end(self, run):
        if self.average.steps > 0:
            self.average.copy_to_model()
            run.objective.finalize_parameters()

    def state_dict(self):
        return {} if self.average is None else self.average.state_dict()

    def load_state_dict(self, state):
        self.average.load_state_dict(state)
