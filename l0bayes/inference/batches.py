"""Where a run's minibatches come from: tensors in memory, or any iterable of batches (a ``DataLoader``).

Both give ``batches(run)``, the epoch's ``(x, y)`` minibatches on the run's device, and the state a
checkpoint needs to continue the same sequence of minibatches.
"""

import math

import torch

__all__ = ["IterableBatches", "TensorBatches", "make_batches"]

#: Training examples kept for the full record's free energy (at least one minibatch).
RECORD_EXAMPLES = 1000


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

    def record_subset(self):
        """The fixed training examples of the full record: the first ``max(batch_size, 1000)`` rows."""
        take = min(self.num_data, max(self.batch_size, RECORD_EXAMPLES))
        return self.x[:take], self.y[:take]

    def state_dict(self):
        return {"shuffle": self.shuffle.get_state()}

    def load_state_dict(self, state):
        self.shuffle.set_state(state["shuffle"])


class IterableBatches:
    """The ``(x, y)`` batches of an iterable that can be iterated once per epoch (e.g. a ``DataLoader``).

    Its order and augmentation are its own. A ``DataLoader`` that shuffles without a ``generator`` of its
    own draws each epoch's order from torch's global random state, which a checkpoint restores, so a
    resumed run sees the same batches as the straight one (with ``num_workers=0``; workers seed their
    own streams from it too). A ``sampler`` with ``set_epoch`` (``DistributedSampler``) is told the epoch.

    :param num_data: the number of training examples ``N`` (the data term is scaled by ``N/B``);
        by default ``len(data.dataset)`` or ``len(data)``.
    """

    def __init__(self, data, num_data=None):
        self.data = data
        if num_data is None:
            num_data = _length(getattr(data, "dataset", None))
        if num_data is None:
            raise ValueError(
                "train() with an iterable of batches needs num_data= (the number of training examples), "
                "unless it is a DataLoader over a dataset with a length"
            )
        if isinstance(num_data, bool) or not isinstance(num_data, int) or num_data < 1:
            raise ValueError(f"num_data must be a positive integer, got {num_data!r}")
        self.num_data = num_data
        self.steps_per_epoch = _length(data)
        self.batch_size = None

    def __call__(self, run):
        sampler = getattr(self.data, "sampler", None)
        if hasattr(sampler, "set_epoch"):
            sampler.set_epoch(run.epoch)
        for batch in self.data:
            x, y = _pair(batch)
            yield x.to(run.device), y.to(run.device)

    def record_subset(self):
        """The first batches, up to 1000 examples, taken without touching torch's random state."""
        xs, ys, count = [], [], 0
        state = torch.get_rng_state()
        try:
            for batch in self.data:
                x, y = _pair(batch)
                xs.append(x)
                ys.append(y)
                count += x.shape[0]
                if count >= RECORD_EXAMPLES:
                    break
        finally:
            torch.set_rng_state(state)
        if not xs:
            raise ValueError("the training data is empty (the iterable gave no batch)")
        return torch.cat(xs), torch.cat(ys)

    def state_dict(self):
        return {}

    def load_state_dict(self, state):
        pass


def make_batches(x, y, batch_size, seed, ddp, num_data=None):
    """:class:`TensorBatches` for tensors ``x, y``; :class:`IterableBatches` for an iterable ``x`` (``y=None``)."""
    if torch.is_tensor(x):
        return TensorBatches(x, y, batch_size, seed, ddp)
    if y is not None:
        raise ValueError("with an iterable of (x, y) batches as data, leave y=None (the batches hold the targets)")
    return IterableBatches(x, num_data)


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


def _pair(batch):
    if isinstance(batch, (tuple, list)) and len(batch) == 2:
        return batch[0], batch[1]
    raise TypeError(f"each batch must be a pair (x, y), got {type(batch).__name__}")


def _length(obj):
    try:
        return len(obj)
    except TypeError:
        return None
