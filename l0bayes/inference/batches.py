"""Where a run's minibatches come from: tensors in memory, or any iterable of batches (a ``DataLoader``).

Both give ``batches(run)``, the epoch's ``(x, y)`` minibatches on the run's device, and the state a
checkpoint needs to continue the same sequence of minibatches. Held-out data, given in the same two forms,
is read in order by :func:`held_out_batches`; a pass over data that is not training (the full record's
examples, its test and validation metrics) runs under :func:`random_state_kept`.
"""

import contextlib
import math
from collections.abc import Iterator

import torch

__all__ = [
    "CheckedBatches",
    "IterableBatches",
    "TensorBatches",
    "checked_batch",
    "held_out_batches",
    "make_batches",
    "random_state_kept",
]

#: Training examples kept for the full record's free energy (at least one minibatch).
RECORD_EXAMPLES = 1000
#: Rows per batch when held-out tensors are evaluated (the full record's test and validation metrics).
EVALUATION_BATCH = 1000


class TensorBatches:
    """Minibatches of ``batch_size`` rows of ``(x, y)`` in a new random order every epoch.

    The order comes from a generator of its own seeded with ``seed`` (so that the gate noise does not
    change the data order), sharded between data-parallel ranks as ``DistributedSampler`` does;
    ``batch_size`` is the global minibatch. On an accelerator, ``x`` and ``y`` are copied to it once (where
    they fit) and each epoch's order too, so that a step neither copies from the host nor waits for a copy.
    """

    def __init__(self, x, y, batch_size, seed, ddp):
        self.x, self.y = _resident(x, y, ddp.device)
        self.num_data = x.shape[0]
        self.batch_size = min(int(batch_size), self.num_data)
        self.local_batch = ddp.local_batch_size(self.batch_size)
        self.steps_per_epoch = math.ceil(self.num_data / self.batch_size)
        self.ddp = ddp
        self.shuffle = torch.Generator().manual_seed(int(seed))

    def __call__(self, run):
        order = self.ddp.shard(torch.randperm(self.num_data, generator=self.shuffle)).to(self.x.device)
        for step in range(self.steps_per_epoch):
            idx = order[step * self.local_batch : (step + 1) * self.local_batch]
            yield self.x[idx].to(run.device), self.y[idx].to(run.device)

    def record_subset(self, own_pass=False):
        """The fixed training examples of the full record: the first ``max(batch_size, 1000)`` rows (``own_pass``:
        :meth:`IterableBatches.record_subset`'s, the same here)."""
        take = min(self.num_data, max(self.batch_size, RECORD_EXAMPLES))
        return self.x[:take], self.y[:take]

    def record_rows(self):
        """Rows per forward pass of the full record and the held-out metrics: a training step's minibatch (the
        global one, so that a data-parallel run records what one process would), without gradients."""
        return self.batch_size

    def state_dict(self):
        return {"shuffle": self.shuffle.get_state()}

    def load_state_dict(self, state):
        self.shuffle.set_state(state["shuffle"])


class IterableBatches:
    """The ``(x, y)`` batches of an iterable of batches (e.g. a ``DataLoader``), checked as they stream.

    Its order and augmentation are its own. A ``DataLoader`` that shuffles without a ``generator`` of its
    own draws each epoch's order from torch's global random state, which a checkpoint restores, so a
    resumed run sees the same batches as the straight one (with ``num_workers=0``; workers seed their
    own streams from it too). A ``sampler`` with ``set_epoch`` (``DistributedSampler``) is told the epoch.

    Every batch is checked against the model (``check``, a :class:`~l0bayes.inference.data_checks.DataCheck`)
    before the step that uses it, and each epoch is one pass: an iterable with a length (a ``DataLoader``)
    yields at most ``len(data)`` batches, and at least one batch. A ``DataLoader`` over a dataset with a length
    trains on ``N = len(dataset)`` examples (its epochs may drop the last batch, or shard the data between
    ranks); any other iterable yields exactly ``num_data`` examples each epoch: one that yields more is an error
    as soon as its count passes ``num_data`` (so an endless iterable such as ``itertools.cycle`` is an error, not
    a run that never ends), one that yields fewer at the end of the epoch.

    The full record's fixed training examples are the first batches of the first epoch, kept as they stream: the
    data are read once per epoch and never more (a ``DataLoader``'s workers start once per epoch, and nothing is
    read that is not trained on). A resumed run, whose first epoch here is a later one, reads them from a pass of
    its own before training instead (the same batches, where the order follows the seed as the epochs' does). An
    iterator (a generator, ``iter(batches)``: exhausted after one pass) trains one epoch.

    :param num_data: the number of training examples ``N`` (the data term is scaled by ``N/B``); by default, for
        a ``DataLoader`` over a dataset with a length, ``len(data.dataset)`` (the length of its sampler where that
        is one of its own, e.g. a ``SubsetRandomSampler`` or a list of indices). An epoch may stream fewer
        examples (a dropped last batch, a rank's shard, a subsample of the ``N``); one that streams more is a
        ``ValueError`` naming ``num_data``.
    :param check: ``check(x, y, names) -> (x, y)``, the checks of one batch (by default none).
    """

    def __init__(self, data, num_data=None, check=None):
        self.data = data
        self.check = check
        self.one_shot = is_iterator(data)
        self.steps_per_epoch = None if self.one_shot else _length(data)
        if self.steps_per_epoch == 0:
            raise ValueError(
                f"the training data is empty: x ({type(data).__name__}) yields no batches (its len() is 0)"
            )
        # A DataLoader over a dataset with a length: N is the dataset's (its sampler's for a SubsetRandomSampler);
        # its epochs may yield fewer examples (drop_last, a DistributedSampler's shard of each rank).
        dataset_size = _dataset_size(data)
        if dataset_size == 0:
            raise ValueError(f"the training data is empty: x ({type(data).__name__}) has an empty dataset")
        if num_data is None:
            num_data = dataset_size
        if num_data is None:
            raise ValueError(
                "train() with an iterable of batches needs num_data= (the number of training examples), "
                "unless it is a DataLoader over a dataset with a length"
            )
        if isinstance(num_data, bool) or not isinstance(num_data, int) or num_data < 1:
            raise ValueError(f"num_data must be a positive integer, got {num_data!r}")
        # An epoch streams at most num_data examples: fewer where a last batch is dropped, a rank takes its shard
        # or the data are a subsample of the N training examples; more means num_data is not N.
        self.num_data = num_data
        self.batch_size = None
        self._streamed = _StreamedExamples()  # the full record's examples, kept as the first epoch streams
        self._rows = None
        self._yielded = False  # whether a pass over the data has yielded a batch yet

    def __call__(self, run):
        sampler = getattr(self.data, "sampler", None)
        if hasattr(sampler, "set_epoch"):
            sampler.set_epoch(run.epoch)
        index = examples = 0
        for index, batch in enumerate(self.data, 1):
            where = f"batch {index} of x in epoch {run.epoch + 1}"
            if self.steps_per_epoch is not None and index > self.steps_per_epoch:
                raise ValueError(
                    f"x yielded more batches in epoch {run.epoch + 1} than its len(), {self.steps_per_epoch}: "
                    "an epoch is one pass over an iterable"
                )
            x, y = self._checked(batch, where, values=index == 1)
            examples += len(x)
            if examples > self.num_data:
                raise ValueError(
                    f"x yielded more than num_data={self.num_data} examples in epoch {run.epoch + 1} ({examples} "
                    f"by {where}): an epoch of an iterable of batches is one pass over exactly num_data examples "
                    "(an endless iterable such as itertools.cycle never ends one); give the number of training "
                    "examples as num_data"
                )
            if self._streamed is not None and not self._yielded:  # the first epoch
                self._streamed.keep(x, y)
            yield x.to(run.device), y.to(run.device)
        if index == 0:
            again = (
                " (it yielded batches before: an iterable of batches must yield them anew each time it is iterated)"
                if self._yielded
                else ""
            )
            raise ValueError(f"the training data is empty: x yielded no batches in epoch {run.epoch + 1}{again}")
        self._yielded = True

    def _checked(self, batch, where, values=True):
        """The batch as ``(x, y)`` on the model's terms, or a clear error naming it. Its values (finite, labels in
        range) are read where that costs no device synchronisation: batches on the CPU, and the first batch of
        each epoch of batches already on an accelerator (``values``)."""
        x = batch[0] if isinstance(batch, (tuple, list)) and batch else None
        values = values or not torch.is_tensor(x) or x.device.type == "cpu"
        return checked_batch(self.check, batch, where, values)

    def record_subset(self, own_pass=False):
        """The full record's fixed training examples: the first batches, up to 1000 examples.

        Those of the first epoch, kept as they stream (a pair that is complete after that epoch); with ``own_pass``
        (a resumed run), of an iterable that can be iterated again, from a pass of their own, taken without touching
        torch's random state.
        """
        if not own_pass or self.one_shot:
            return self._streamed
        self._streamed = None
        xs, ys, count = [], [], 0
        with random_state_kept():
            for index, batch in enumerate(self.data, 1):
                x, y = self._checked(batch, f"batch {index} of x")
                xs.append(x)
                ys.append(y)
                count += x.shape[0]
                if count >= RECORD_EXAMPLES:
                    break
        if not xs:
            raise ValueError("the training data is empty: x yielded no batches")
        self._yielded = True
        self._rows = xs[0].shape[0]
        return torch.cat(xs), torch.cat(ys)

    def record_rows(self):
        """Rows per forward pass of the full record and the held-out metrics: the first batch's, so that recording
        needs no more memory than a step (``None`` before any batch was read)."""
        if self._streamed is not None:
            return self._streamed.rows
        return self._rows

    def state_dict(self):
        return {}

    def load_state_dict(self, state):
        pass


class _StreamedExamples:
    """The full record's training examples of an iterator: copies of its first batches, up to 1000 examples,
    kept as its one epoch streams; unpacks as the pair ``(x, y)`` once that epoch has yielded a batch."""

    def __init__(self):
        self.xs, self.ys, self.count = [], [], 0

    def keep(self, x, y):
        if self.count < RECORD_EXAMPLES:
            self.xs.append(x.detach().clone())
            self.ys.append(y.detach().clone())
            self.count += x.shape[0]

    @property
    def rows(self):
        """The first batch's rows (``None`` before it streamed)."""
        return self.xs[0].shape[0] if self.xs else None

    def __iter__(self):
        if not self.xs:
            raise RuntimeError("the full record's training examples are kept as the first epoch streams: none yet")
        return iter((torch.cat(self.xs), torch.cat(self.ys)))

    def __len__(self):
        return 2


def make_batches(x, y, batch_size, seed, ddp, num_data=None, check=None):
    """:class:`TensorBatches` for tensors ``x, y``; :class:`IterableBatches` for an iterable ``x`` (``y=None``).

    :param check: ``check(x, y, names) -> (x, y)``, the checks of every batch of an iterable as it streams.
    """
    if torch.is_tensor(x):
        return TensorBatches(x, y, batch_size, seed, ddp)
    if y is not None:
        raise ValueError("with an iterable of (x, y) batches as data, leave y=None (the batches hold the targets)")
    return IterableBatches(x, num_data, check)


class CheckedBatches:
    """Held-out data given as an iterable of ``(x, y)`` batches (``test_data``, ``validation_data``), each batch
    checked against the model as it is read, like the training batches: ``check(x, y, names)`` (a
    :class:`~l0bayes.inference.data_checks.DataCheck`), the error naming the batch of ``name``.

    It can be iterated once per evaluation, as the data it wraps; its length is theirs, where they have one.
    """

    def __init__(self, data, check, name):
        self.data, self.check, self.name = data, check, name

    def __iter__(self):
        for index, batch in enumerate(self.data, 1):
            yield checked_batch(self.check, batch, f"batch {index} of {self.name}")

    def __len__(self):
        return len(self.data)


def checked_batch(check, batch, where, values=True):
    """``batch`` as ``(x, y)``, checked by ``check`` (a :class:`~l0bayes.inference.data_checks.DataCheck`, or
    ``None`` for none; ``values`` as it takes them), or a clear error naming it (``where``: e.g. "batch 3 of x")."""
    if not (isinstance(batch, (tuple, list)) and len(batch) == 2):
        raise TypeError(f"{where} must be a pair (x, y), got {type(batch).__name__}")
    if check is None:
        return batch[0], batch[1]
    return check(batch[0], batch[1], (f"the x of {where}", f"the y of {where}"), values)


def held_out_batches(data, batch_size=EVALUATION_BATCH):
    """The ``(x, y)`` batches of held-out data, in order: a pair of tensors cut into ``batch_size`` rows, or the
    ``(batch[0], batch[1])`` of each batch of an iterable of batches (a ``DataLoader``), as it yields them."""
    if isinstance(data, (tuple, list)) and len(data) == 2 and torch.is_tensor(data[0]):
        x, y = data
        for i in range(0, x.shape[0], batch_size):
            yield x[i : i + batch_size], y[i : i + batch_size]
    else:
        for batch in data:
            yield batch[0], batch[1]


@contextlib.contextmanager
def random_state_kept(device=None):
    """Within it, draws from torch's random state (a ``DataLoader``'s seed and order, gate noise) are undone on exit.

    torch's CPU state is restored, and ``device``'s own when it is a CUDA device: so that evaluating or reading
    data outside the training steps leaves the training draws as they would have been.
    """
    cuda = [] if device is None or torch.device(device).type != "cuda" else [device]
    with torch.random.fork_rng(devices=cuda, device_type="cuda"):
        yield


def is_iterator(data):
    """Whether ``data`` is an iterator (a generator, ``iter(...)``, ``itertools.cycle``): exhausted after one pass.

    Read from its type (``__next__``), without iterating it (which would start a ``DataLoader``'s workers).
    """
    return isinstance(data, Iterator)


def _resident(x, y, device):
    """``x, y`` where the steps read them: on the CPU as given; on an accelerator, moved there once (a copy
    from pageable host memory makes every step wait for it), or left on the host if they do not fit."""
    device = torch.device(device)
    if device.type == "cpu" or (x.device == device and y.device == device):
        return x, y
    try:
        return x.to(device), y.to(device)
    except torch.cuda.OutOfMemoryError:  # (torch.OutOfMemoryError from torch 2.5 on)
        return x, y


def _dataset_size(data):
    """The number of training examples of a ``DataLoader`` over a dataset with a length (``None`` otherwise): the
    dataset's, or the indices its sampler draws from where that is a sampler of its own (a
    ``SubsetRandomSampler``, a list of indices, a ``batch_sampler``'s sampler), which trains on those only."""
    whole = (torch.utils.data.SequentialSampler, torch.utils.data.RandomSampler)
    batch_sampler = getattr(data, "batch_sampler", None)
    sampler = getattr(batch_sampler, "sampler", None)
    if sampler is None:
        sampler = getattr(data, "sampler", None)
    if sampler is not None and not isinstance(sampler, whole) and not hasattr(sampler, "set_epoch"):
        size = _length(sampler)  # a DistributedSampler (set_epoch) holds one rank's shard: N is the dataset's
        if size is not None:
            return size
    return _length(getattr(data, "dataset", None))


def _length(obj):
    try:
        return len(obj)
    except TypeError:
        return None
