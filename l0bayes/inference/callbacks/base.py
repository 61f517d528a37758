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

A record holds what a checkpoint can hold (it loads with ``weights_only=True``): ``None``, numbers, strings,
tensors, and lists, tuples and dicts of them. After each callback's :meth:`~Callback.on_epoch_end`, NumPy
scalars in the record become Python numbers (:func:`plain`) and anything else is a ``TypeError`` naming the
callback and the entry.
"""

import collections
import contextlib
import numbers
import os

import numpy as np
import torch

__all__ = ["Callback", "CallbackList", "plain"]

#: What a record and a callback's state may hold (besides tensors and containers of these).
PLAIN = "None, numbers, strings, tensors, and lists, tuples and dicts of them"


class Callback:
    """Base class of everything that acts on a training run besides its steps (as in Keras, Ignite, Lightning).

    Override the hooks you need; each receives the :class:`~l0bayes.inference.loop.Run`. A callback
    with state that must survive a resume (a best value, a counter, a moving average) returns it from
    :meth:`state_dict` as tensors and plain containers (it goes into the checkpoint, which loads with
    ``weights_only=True``) and takes it back in :meth:`load_state_dict`.

    :attr:`state_key`: the name of the callback's entry in a checkpoint (default: the class name).
    :attr:`before_records`: a callback that acts on the parameters (an average, a projection) sets it, so that
    :func:`~l0bayes.inference.train` runs it before the epoch's record, which then sees its effect.
    """

    state_key = None
    before_records = False

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
        _same_directory(self.callbacks)
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
            for key, value in record.items():  # (a dict's values may be replaced while it is iterated)
                record[key] = plain(value, f"{type(cb).__name__} put record[{key!r}] =")

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


def _same_directory(callbacks):
    """Raise when two callbacks write to one directory (their ``log_dir``, e.g. two
    :class:`~l0bayes.inference.callbacks.TensorBoard`): that, not their checkpoint entry, is what to change."""
    seen = {}
    for cb in callbacks:
        log_dir = getattr(cb, "log_dir", None)
        if not isinstance(log_dir, str):
            continue
        where = os.path.normcase(os.path.abspath(log_dir))
        if where in seen:
            raise ValueError(
                f"two callbacks ({type(seen[where]).__name__} and {type(cb).__name__}) write to the same log_dir "
                f"{log_dir!r}: their events would mix in one curve; give each its own log_dir"
            )
        seen[where] = cb


def plain(value, where):
    """``value`` as a checkpoint can hold it: NumPy scalars (and other number types) as Python numbers.

    :param str where: what put ``value`` there, for the message (e.g. ``"MyCallback put record['x'] ="``).
    :raises TypeError: naming ``where`` and the value's type, for anything but ``None``, numbers, strings,
        tensors, and lists, tuples and dicts of them (e.g. a NumPy array, a function, an object of a class).
    """
    if value is None or type(value) in _KEPT or torch.is_tensor(value):
        return value
    if isinstance(value, np.generic) and isinstance(value, (np.bool_, np.number, np.str_)):
        return plain(value.item(), where)
    if isinstance(value, numbers.Integral) and not isinstance(value, np.generic):
        return int(value)
    if isinstance(value, numbers.Real) and not isinstance(value, np.generic):
        return float(value)
    if isinstance(value, str):
        return str(value)
    if isinstance(value, (list, tuple, set, frozenset)):  # (a namedtuple becomes a tuple: its class cannot load)
        items = [plain(v, where) for v in value]
        return (
            type(value)(items)
            if type(value) in _KEPT_CONTAINERS
            else (tuple if isinstance(value, tuple) else list)(items)
        )
    if isinstance(value, dict):
        items = {plain(k, where): plain(v, where) for k, v in value.items()}
        return type(value)(items) if type(value) in _KEPT_CONTAINERS else items
    shown = repr(value)
    shown = shown if len(shown) <= 60 else shown[:57] + "..."
    raise TypeError(
        f"{where} {shown}, a {type(value).__module__}.{type(value).__qualname__}, which a checkpoint cannot hold "
        f"(it loads with weights_only=True): use {PLAIN} (e.g. float(value) or value.tolist())"
    )


#: Values kept as they are (``torch.load(weights_only=True)`` rebuilds them).
_KEPT = (bool, int, float, complex, str, bytes, torch.Size, torch.dtype, torch.device)
_KEPT_CONTAINERS = (list, tuple, set, frozenset, dict, collections.OrderedDict)
