r"""Data-parallel training with PyTorch's own engine: ``torch.distributed`` and ``DistributedDataParallel``.

:func:`~l0bayes.inference.train` runs unchanged under ``torchrun --nproc_per_node=K`` (one or many
machines). This module holds the pieces it uses, so that the training loop itself stays short:

* :func:`init_distributed` joins the process group that ``torchrun`` describes in the environment
  (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``; ``init_method="env://"``),
  with backend ``nccl`` on GPUs and ``gloo`` on CPUs and a finite timeout, so that a rank that
  crashed or hangs stops the job with an error instead of a silent hang;
* :func:`rank`, :func:`world_size`, :func:`local_rank`, :func:`is_main_process`;
* :func:`shard_order`, the sharding of ``torch.utils.data.DistributedSampler`` applied to each
  epoch's permutation;
* :class:`ObjectiveModule`, the module wrapped in ``DistributedDataParallel``: its ``forward``
  computes the training objective, so DDP averages the gradients of the weights and of every
  gate's ``log_alpha`` over the ranks;
* :class:`DataParallelContext`, what ``train()`` holds for one run (device, seeds, sharding, the
  DDP wrapper, the all-reduce of the step statistics, checkpoint loading and RNG states).

**Scaling.** With a global minibatch of :math:`B` examples split into :math:`K` local batches
:math:`S_k` of :math:`B/K`, rank :math:`k` computes the usual single-process estimate of the
objective on its local batch, data term scaled by :math:`N/(B/K)`:

.. math::

    \hat F_k = \frac{N}{B/K} \sum_{i \in S_k} -\log p(y_i \mid x_i, \tilde\theta \odot z^{(k)})
    + \mathrm{KL}(q(z) \| p(z)) + \text{code cost},

where :math:`z^{(k)}` is rank :math:`k`'s own gate sample. DDP averages the gradients, i.e. it
differentiates :math:`\frac1K \sum_k \hat F_k = \frac{N}{B} \sum_{i \in S} (\ldots) + \mathrm{KL} +
\text{code cost}`: the data term is the single-process estimate on the global batch
:math:`S = \cup_k S_k` (with :math:`K` gate samples instead of one) and the KL and code cost,
added in full on every rank, are counted once. The same holds for Eq. 22 (no KL) and for the
Lagrangian of the constrained objective, whose constraint term is identical on every rank.
"""

import atexit
import datetime
import math
import os
import random
from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from ..io import CheckpointError, load_checkpoint
from .device import resolve_device

CHECKPOINT_KEYS = ("model", "optimizer", "multipliers", "history", "epoch", "shuffle", "rng")
DEFAULT_TIMEOUT_S = 600.0
TIMEOUT_ENV = "L0BAYES_DIST_TIMEOUT"
_RANK_SEED_STRIDE = 104_729  # a prime: rank r > 0 seeds its gate noise with seed + r * stride


class DistributedError(RuntimeError):
    """A collective operation failed: another process crashed, was killed or timed out."""


@dataclass(frozen=True)
class DistributedConfig:
    """Options of data-parallel training (the ``distributed`` argument of :func:`~l0bayes.inference.train`).

    :param backend: ``"nccl"``, ``"gloo"`` or ``None`` (``nccl`` when training on CUDA, else ``gloo``);
        used only when ``train()`` creates the process group itself.
    :param timeout_s: timeout of every collective operation in seconds; ``None`` reads
        ``$L0BAYES_DIST_TIMEOUT`` and falls back to 600 s. Used only when ``train()`` creates the group.
    :param bool shared_gate_noise: ``False`` (default, the paper's protocol): every rank draws its own
        gate sample (the global seed is offset by the rank). ``True``: every rank uses the same seed,
        hence the same gate sample as a single process would; a run on ``K`` processes then takes the
        same steps as one process on the same global batches (up to floating-point summation order).
        Meant for tests and debugging.
    """

    backend: str | None = None
    timeout_s: float | None = None
    shared_gate_noise: bool = False


# ---------------------------------------------------------------------------- rank helpers
def _env_int(name, default):
    value = os.environ.get(name)
    if value is None or value == "":
        return default
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"environment variable {name}={value!r} is not an integer") from None


def is_initialized():
    """Whether a ``torch.distributed`` process group exists in this process."""
    return dist.is_available() and dist.is_initialized()


def world_size():
    """Number of processes: the process group's size, else ``$WORLD_SIZE`` (set by ``torchrun``), else 1."""
    return dist.get_world_size() if is_initialized() else _env_int("WORLD_SIZE", 1)


def rank():
    """This process's global rank: from the process group, else ``$RANK``, else 0."""
    return dist.get_rank() if is_initialized() else _env_int("RANK", 0)


def local_rank():
    """This process's rank on its machine (``$LOCAL_RANK`` from ``torchrun``), 0 when not set."""
    return _env_int("LOCAL_RANK", 0)


def is_main_process():
    """True on rank 0 (and in a plain single-process run): the process that prints and writes files."""
    return rank() == 0


def default_backend(device):
    """``"nccl"`` for a CUDA device, ``"gloo"`` otherwise."""
    return "nccl" if torch.device(device).type == "cuda" else "gloo"


def rank_device(device="auto"):
    """The device of this rank: ``"auto"``/``"cuda"`` become ``cuda:$LOCAL_RANK`` (made current) when CUDA is used."""
    device = resolve_device(device)
    if device.type == "cuda":
        if device.index is None:
            device = torch.device("cuda", local_rank())
        if device.index >= torch.cuda.device_count():
            raise ValueError(
                f"rank {rank()} wants {device} but only {torch.cuda.device_count()} CUDA devices are visible; "
                "use --nproc_per_node <= the number of GPUs"
            )
        torch.cuda.set_device(device)
    return device


def _timeout(timeout_s):
    if timeout_s is None:
        raw = os.environ.get(TIMEOUT_ENV)
        timeout_s = float(raw) if raw else DEFAULT_TIMEOUT_S
    if not timeout_s > 0:
        raise ValueError(f"the distributed timeout must be positive, got {timeout_s!r}")
    return datetime.timedelta(seconds=float(timeout_s))


def init_distributed(device="auto", backend=None, timeout_s=None):
    """Join the process group described by ``torchrun``'s environment, if any and not joined yet.

    Does nothing (returns ``False``) when a group already exists or when ``$WORLD_SIZE`` is absent or 1.
    Otherwise calls ``torch.distributed.init_process_group(backend, init_method="env://", timeout=...)``
    and returns ``True``; the group is destroyed when the process exits.

    :param device: the training device of this rank (it chooses the default backend).
    :param backend: ``"nccl"`` or ``"gloo"``; ``None`` picks :func:`default_backend`.
    :param timeout_s: collective timeout in seconds (default ``$L0BAYES_DIST_TIMEOUT`` or 600 s): a rank
        blocked that long in a collective raises instead of hanging.
    """
    if is_initialized() or _env_int("WORLD_SIZE", 1) <= 1:
        return False
    if not dist.is_available():
        raise RuntimeError("WORLD_SIZE > 1 but this PyTorch build has no torch.distributed support")
    missing = [v for v in ("RANK", "MASTER_ADDR", "MASTER_PORT") if v not in os.environ]
    if missing:
        raise RuntimeError(
            f"WORLD_SIZE={os.environ['WORLD_SIZE']} but {', '.join(missing)} not set: launch with torchrun "
            "(e.g. torchrun --standalone --nproc_per_node=2 script.py) or set the env:// variables yourself"
        )
    device = torch.device(device) if device not in (None, "auto") else rank_device("auto")
    backend = backend or default_backend(device)
    if backend not in ("nccl", "gloo"):
        raise ValueError(f"backend must be 'nccl' or 'gloo', got {backend!r}")
    if backend == "nccl" and device.type != "cuda":
        raise ValueError("backend 'nccl' needs CUDA devices; use 'gloo' for CPU training")
    kwargs = {"device_id": device} if backend == "nccl" else {}
    dist.init_process_group(backend, init_method="env://", timeout=_timeout(timeout_s), **kwargs)
    atexit.register(_destroy)
    return True


def _destroy():
    if is_initialized():
        dist.destroy_process_group()


# ---------------------------------------------------------------------------- sharding and seeds
def shard_order(order, rank, world_size):
    """Rank ``rank``'s share of the permutation ``order``, exactly as ``DistributedSampler`` splits a data set.

    ``order`` is padded to a multiple of ``world_size`` by repeating its first elements
    (``drop_last=False``) and rank ``r`` takes elements ``r, r + K, r + 2K, ...``; so the first
    ``B/K`` elements of every shard together are the first ``B`` elements of the (padded) order.
    """
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"need 0 <= rank < world_size, got rank={rank}, world_size={world_size}")
    n = order.numel()
    total = math.ceil(n / world_size) * world_size
    if total > n:
        repeats = math.ceil((total - n) / n)
        order = torch.cat([order, order.repeat(repeats)[: total - n]])
    return order[rank:total:world_size]


def rank_seed(seed, rank, shared=False):
    """The seed of rank ``rank``'s gate noise: ``seed`` on rank 0 (and on all ranks when ``shared``), else offset."""
    return int(seed) if shared or rank == 0 else (int(seed) + rank * _RANK_SEED_STRIDE) % 2**63


def seed_everything(seed):
    """Seed torch (CPU and CUDA), numpy and Python's ``random``."""
    torch.manual_seed(seed)
    np.random.seed(seed % 2**32)
    random.seed(seed)


# ---------------------------------------------------------------------------- the DDP module
class ObjectiveModule(nn.Module):
    """Holds ``model`` so that DDP registers its parameters; ``forward(objective, *args)`` returns ``objective(*args)``.

    ``objective`` is the training objective of one step (e.g. ``TraceMeanField_ELBO().differentiable_loss``
    of ``model.model``/``model.guide`` on the local batch, or the penalised loss), a closure over
    ``model``. Computing it inside DDP's ``forward`` is what lets ``DistributedDataParallel``
    average the gradients of all of ``model``'s parameters (weights and ``log_alpha``) during
    ``backward``.
    """

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, objective, *args, **kwargs):
        return objective(*args, **kwargs)


# ---------------------------------------------------------------------------- one training run
class DataParallelContext:
    """Everything :func:`~l0bayes.inference.train` needs to run on one process or as one of ``K`` DDP ranks.

    :param distributed: ``None`` (default): data-parallel when a process group of size > 1 exists or
        ``torchrun`` set ``WORLD_SIZE > 1``; ``False``: always a single process (every rank of a
        ``torchrun`` job trains on its own); ``True``: require a group of size > 1;
        a :class:`DistributedConfig`: like ``None``, with those options.
    :param device: the requested device (``"auto"``, ``"cpu"``, ``"cuda"``, ...).
    """

    def __init__(self, distributed=None, device="auto"):
        if distributed is None or distributed is True:
            config = DistributedConfig()
        elif distributed is False:
            config = None
        elif isinstance(distributed, DistributedConfig):
            config = distributed
        else:
            raise TypeError(f"distributed must be None, a bool or a DistributedConfig, got {distributed!r}")
        self.config = config
        wanted = config is not None and (world_size() > 1)
        if distributed is True and not wanted:
            raise RuntimeError("distributed=True but there is no process group of size > 1: launch with torchrun")
        self.enabled = wanted
        if not wanted:
            self.device = resolve_device(device)
            self.rank, self.world_size = 0, 1
            # Alone, this process records and writes, unless the environment names it another rank
            # (as is_main_process() does, so that callers checking it agree with train()).
            self._main = distributed is False or is_main_process()
            return
        self.device = rank_device(device)
        init_distributed(self.device, config.backend, config.timeout_s)
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        self._main = self.rank == 0
        if self.device.type == "cpu" and dist.get_backend() == "nccl":
            raise ValueError("the process group uses nccl but training runs on the CPU: use the gloo backend")

    @property
    def is_main(self):
        """Whether this process shows progress, records the history and writes checkpoints."""
        return self._main

    def seed(self, seed):
        """This rank's seed for gate noise (see :func:`rank_seed`)."""
        shared = self.config is not None and self.config.shared_gate_noise
        return rank_seed(seed, self.rank, shared)

    def local_batch_size(self, batch_size):
        """``batch_size`` is the global minibatch; each rank takes ``batch_size / K`` examples per step."""
        if batch_size % self.world_size:
            raise ValueError(
                f"batch_size {batch_size} is the global minibatch and must be divisible by the number of "
                f"processes ({self.world_size})"
            )
        return batch_size // self.world_size

    def shard(self, order):
        """This rank's part of an epoch's permutation (:func:`shard_order`)."""
        return shard_order(order, self.rank, self.world_size) if self.enabled else order

    def wrap(self, model):
        """A callable ``step(objective, *args)`` that evaluates ``objective(*args)``, inside DDP when data-parallel."""
        if not self.enabled:
            return lambda objective, *args: objective(*args)
        from torch.nn.parallel import DistributedDataParallel

        device_ids = [self.device.index] if self.device.type == "cuda" else None
        # static_graph: the same parameters take part in every step, and unused ones (e.g. a fixed
        # noise scale) are found once instead of by a graph search per step.
        return self._collective(
            "setting up DistributedDataParallel (broadcast of rank 0's parameters)",
            DistributedDataParallel,
            ObjectiveModule(model),
            device_ids=device_ids,
            static_graph=True,
        )

    def _collective(self, what, fn, *args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except Exception as err:  # noqa: BLE001 - re-raised with context
            raise DistributedError(
                f"rank {self.rank}/{self.world_size}: {what} failed ({type(err).__name__}: {err}). Another process "
                "has probably crashed or been killed (look for the first traceback; torchrun names the failed "
                f"rank), or did not reach this point within the timeout (${TIMEOUT_ENV}, default "
                f"{DEFAULT_TIMEOUT_S:.0f} s)"
            ) from err

    def mean(self, *tensors):
        """The mean over ranks of each tensor (``None`` passes through), in one all-reduce; detached."""
        if not self.enabled:
            return tuple(None if t is None else t.detach() for t in tensors)
        present = [t for t in tensors if t is not None]
        flat = torch.cat([t.detach().reshape(-1).to(torch.float64) for t in present])
        self._collective("all-reduce of the step statistics", dist.all_reduce, flat)
        flat /= self.world_size
        out, offset = [], 0
        for t in tensors:
            if t is None:
                out.append(None)
                continue
            out.append(flat[offset : offset + t.numel()].reshape(t.shape).to(t.dtype))
            offset += t.numel()
        return tuple(out)

    def gather(self, obj):
        """``[obj of rank 0, obj of rank 1, ...]`` on every rank (``[obj]`` on one process)."""
        if not self.enabled:
            return [obj]
        out = [None] * self.world_size
        self._collective("all-gather", dist.all_gather_object, out, obj)
        return out

    def load(self, path, map_location):
        """Load a checkpoint: read by rank 0 and broadcast, so other machines need no copy of the file.

        Every tensor is loaded on the CPU, whatever ``map_location`` names (kept for callers): the RNG
        states (torch's, CUDA's, the shuffling generator's) must be CPU tensors, and the ``load_state_dict``
        of module, optimiser, average and objective put the others on their own device. Mapping them all to
        ``cuda`` made a single-process resume on a GPU fail.

        :raises FileNotFoundError: on every rank when the file does not exist.
        :raises ~l0bayes.io.CheckpointError: (a ``ValueError`` naming the file) when it is
            empty, corrupt, holds more than tensors and plain containers, or lacks a training-state entry.
        """
        if path is None:
            raise ValueError("resume=True needs the checkpoint's path (checkpoint=None was given)")
        if not self.enabled:
            return load_checkpoint(path, map_location="cpu", required=CHECKPOINT_KEYS)
        payload = [None]
        if self.is_main:
            try:
                payload[0] = ("ok", load_checkpoint(path, map_location="cpu", required=CHECKPOINT_KEYS))
            except Exception as err:  # noqa: BLE001 - sent to the other ranks, raised everywhere
                payload[0] = ("error", type(err).__name__, str(err))
        self._collective("broadcast of the checkpoint", dist.broadcast_object_list, payload, 0)
        if payload[0][0] == "error":
            kinds = {"FileNotFoundError": FileNotFoundError, "CheckpointError": CheckpointError}
            kind = kinds.get(payload[0][1], RuntimeError)
            raise kind(payload[0][2])
        return payload[0][1]

    def checkpoint_extra(self, rank_rng):
        """Fields added to a checkpoint: the world size and every rank's RNG state."""
        return {"world_size": self.world_size, "rank_rng": rank_rng}

    def restore_rng(self, state, seed, set_rng_state):
        """Restore this rank's RNG state from a checkpoint written by any number of processes.

        Rank ``r`` takes the state saved by rank ``r`` (rank 0's is ``state["rng"]``); with shared gate
        noise every rank takes rank 0's. A rank the checkpoint has no state for (resuming on more
        processes than wrote it) is seeded from ``seed``, its rank and the epoch.
        """
        saved = state.get("rank_rng") or [state["rng"]]
        shared = self.config is not None and self.config.shared_gate_noise
        if shared or self.rank == 0:
            set_rng_state(state["rng"])
        elif self.rank < len(saved):
            set_rng_state(saved[self.rank])
        else:
            seed_everything(rank_seed(int(seed) + 7919 * int(state["epoch"]), self.rank))

    def close(self):
        """Wait for every rank (so none returns while rank 0 still writes files)."""
        if self.enabled:
            self._collective("final barrier", dist.barrier)
