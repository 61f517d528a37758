"""The hooks of the training loop: :class:`Callback` and the ordered :class:`CallbackList`.

The loop of :func:`~l0bayes.inference.loop.fit` calls, in this order::

    setup(run)                        # once the run exists, before a checkpoint is loaded into it
    on_fit_start(run)
    for each epoch:
        on_epoch_start(run)
        for each minibatch:  (objective, backward, optimiser step, objective update)
            on_step_end(run)
        on_epoch_end(run, record)     # record: the epoch's history entry, filled by the callbacks
    on_fit_end(run)                   # or on_exception(run, error) when training raised

``run`` is the loop's :class:`~l0bayes.inference.loop.Run`: the model, the optimiser, the objective,
the epoch and step counters, the history, and ``run.stop`` (set it to end training after this epoch).
"""

import contextlib

__all__ = ["Callback", "CallbackList"]


class Callback:
    """Base class of everything that acts on a training run besides its steps (as in Keras, Ignite, Lightning).

    Override the hooks you need; each receives the :class:`~l0bayes.inference.loop.Run`. A callback
    with state that must survive a resume (a best value, a counter, a moving average) returns it from
    :meth:`state_dict` as tensors and plain containers (it goes into the checkpoint, which loads with
    ``weights_only=True``) and takes it back in :meth:`load_state_dict`.

    :attr:`state_key`: the name of the callback's entry in a checkpoint (default: the class name).
    """

    state_key = None

    def setup(self, run):
        """Once the run exists (model, optimiser, objective), before a checkpoint's state is loaded."""

    def on_fit_start(self, run):
        """Before the first epoch (of this call: after a resume, before the first epoch still to train)."""

    def on_epoch_start(self, run):
        """Before epoch ``run.epoch`` (0-based)."""

    def on_step_end(self, run):
        """After each optimiser step (and the objective's update). ``run.last_loss`` is the step's loss tensor."""

    def on_epoch_end(self, run, record):
        """After epoch ``run.epoch``; add entries to ``record``, the epoch's history entry."""

    def on_fit_end(self, run):
        """After the last epoch, or when training stops early."""

    def on_exception(self, run, error):
        """When training stops with an exception (``KeyboardInterrupt`` included), instead of :meth:`on_fit_end`."""

    def evaluation(self, run):
        """A context for evaluating the model at the end of an epoch (e.g. with averaged parameters)."""
        return contextlib.nullcontext()

    def state_dict(self):
        """What a checkpoint needs to resume this callback (tensors and plain containers)."""
        return {}

    def load_state_dict(self, state):
        """Restore :meth:`state_dict`."""

    @property
    def key(self):
        """The checkpoint entry of this callback's state."""
        return self.state_key or type(self).__name__


class CallbackList(Callback):
    """Callbacks called in order; :meth:`evaluation` enters every callback's evaluation context."""

    def __init__(self, callbacks=()):
        self.callbacks = list(callbacks)
        for cb in self.callbacks:
            if not isinstance(cb, Callback):
                raise TypeError(f"callbacks must be l0bayes.inference.Callback instances, got {type(cb).__name__}")
        keys = [cb.key for cb in self.callbacks if type(cb).state_dict is not Callback.state_dict]
        duplicated = sorted({k for k in keys if keys.count(k) > 1})
        if duplicated:
            raise ValueError(
                f"two callbacks with state share the checkpoint entry {duplicated}: give them distinct state_key"
            )

    def __iter__(self):
        return iter(self.callbacks)

    def setup(self, run):
        for cb in self.callbacks:
            cb.setup(run)

    def on_fit_start(self, run):
        for cb in self.callbacks:
            cb.on_fit_start(run)

    def on_epoch_start(self, run):
        for cb in self.callbacks:
            cb.on_epoch_start(run)

    def on_step_end(self, run):
        for cb in self.callbacks:
            cb.on_step_end(run)

    def on_epoch_end(self, run, record):
        for cb in self.callbacks:
            cb.on_epoch_end(run, record)

    def on_fit_end(self, run):
        for cb in self.callbacks:
            cb.on_fit_end(run)

    def on_exception(self, run, error):
        for cb in self.callbacks:
            cb.on_exception(run, error)

    @contextlib.contextmanager
    def evaluation(self, run):
        with contextlib.ExitStack() as stack:
            for cb in self.callbacks:
                stack.enter_context(cb.evaluation(run))
            yield

    def state_dict(self):
        """``{callback key: state}`` of every callback that has state."""
        return {cb.key: s for cb in self.callbacks if (s := cb.state_dict())}

    def load_state_dict(self, state):
        """Give each callback its saved state (a callback the checkpoint does not know starts afresh)."""
        for cb in self.callbacks:
            if cb.key in state:
                cb.load_state_dict(state[cb.key])
