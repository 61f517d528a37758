"""``--keep-best``: the epoch a run keeps, chosen on its validation split."""

from ..inference.callbacks import EarlyStopping

#: a patience no run reaches: ``--keep-best`` keeps the best epoch and never stops a run early
NEVER = 2**62


class KeepBest(EarlyStopping):
    """Keep the parameters of the epoch with the lowest validation metric; train every epoch.

    :class:`~l0bayes.inference.callbacks.EarlyStopping` on the validation metric of
    :func:`~l0bayes.inference.train`'s ``validation_data`` (``validation_error``, ``validation_rmse`` of the
    linear regression), with ``restore_best`` and a patience no run reaches. Among epochs of equal validation
    metric the latest is kept: the gates close as training goes on, so the later of two equally good epochs is the
    sparser model. Each record holds ``best_epoch`` and ``best``; the checkpoint holds the kept parameters, so
    ``--resume`` keeps the epoch the straight run would.
    """

    def __init__(self):
        super().__init__(monitor=None, patience=NEVER, restore_best=True)

    def _improved(self, value):
        return value <= self.best
