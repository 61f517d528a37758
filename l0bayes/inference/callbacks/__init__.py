"""Callbacks of the training loop: hooks, and the pieces of a run that are not its steps.

* :class:`Callback`, :class:`CallbackList`: the hooks (:mod:`.base`);
* :class:`ProgressBar` (:mod:`.progress`), :class:`History` (:mod:`.records`),
  :class:`FiniteParameters` (:mod:`.checks`),
  :class:`Checkpointing` (:mod:`.checkpointing`), :class:`LRSchedule` (:mod:`.schedule`):
  what :func:`~l0bayes.inference.train` builds from its arguments;
* :class:`ParameterAveraging` (:mod:`.averaging`), :class:`LogAlphaProjection` (:mod:`.projection`),
  :class:`ExpectedFlops` (:mod:`.records`),
  :class:`TensorBoard` (:mod:`.tensorboard`), :class:`EarlyStopping` and :class:`StopWhenFixed`
  (:mod:`.early_stopping`):
  add them with ``train(..., callbacks=[...])``.
"""

from .averaging import ParameterAveraging
from .base import Callback, CallbackList
from .checkpointing import Checkpointing
from .checks import FiniteParameters
from .early_stopping import EarlyStopping, StopWhenFixed
from .progress import ProgressBar
from .projection import LogAlphaProjection
from .records import ExpectedFlops, History
from .schedule import LRSchedule
from .tensorboard import TensorBoard

__all__ = [
    "Callback",
    "CallbackList",
    "Checkpointing",
    "FiniteParameters",
    "EarlyStopping",
    "ExpectedFlops",
    "History",
    "LRSchedule",
    "LogAlphaProjection",
    "ParameterAveraging",
    "ProgressBar",
    "StopWhenFixed",
    "TensorBoard",
]
