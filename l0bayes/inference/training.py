"""One training entry point: SVI on Eq. 21, the penalised Eq. 22, or constrained sparsity (slides)."""

import contextlib
import math
import random
import time
from dataclasses import dataclass, field

import numpy as np
import torch
from pyro.infer import TraceMeanField_ELBO

from ..utils import check_xy
from .checkpoint import numpy_rng_state, save_checkpoint, set_numpy_rng_state
from .distributed import DataParallelContext
from .free_energy import free_energy

OBJECTIVES = ("bayes", "penalized", "constrained")


class NonFiniteLossError(FloatingPointError):
    """Raised when a training step produces a NaN or infinite objective."""


@dataclass
class TrainResult:
    """What :func:`train` returns: the trained model, the per-epoch history and the multipliers."""

    model: torch.nn.Module
    history: list = field(default_factory=list)
    multipliers: torch.Tensor | None = None


def resolve_device(device="auto"):
    """``"auto"`` picks CUDA when available, else CPU."""
    if device in (None, "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("device 'cuda' was requested but CUDA is not available")
    return device


def _check_data(model, x, y, name):
    num_features = getattr(model, "num_features", None)
    if y is not None and not y.is_floating_point():
        num_classes = getattr(model, "num_classes", None)
        if y.min() < 0 or (num_classes is not None and y.max() >= num_classes):
            low, high = int(y.min()), int(y.max())
            raise ValueError(f"{name} labels must lie in [0, {num_classes}), got range [{low}, {high}]")
    if x.dim() == 2:
        check_xy(x, y if y is None or y.is_floating_point() else y.to(x.dtype), num_features)
    else:
        if not torch.isfinite(x).all():
            raise ValueError(f"{name} inputs contain NaN or infinite values")
        if y is not None and y.shape[0] != x.shape[0]:
            raise ValueError(f"{name}: {x.shape[0]} inputs but {y.shape[0]} labels")


def _gates(model):
    from ..nn.gates import gates_of

    return gates_of(model)


def _constraint_values(model, per_layer):
    """Expected density E[||z||_0] / |theta| (globally or per gated layer)."""
    gates = _gates(model)
    if per_layer:
        return torch.stack([g.expected_l0() / (g.num_gates * g.group_size) for _, g in gates])
    total = sum(g.num_gates * g.group_size for _, g in gates)
    return (sum(g.expected_l0() for _, g in gates) / total).reshape(1)


def _rng_state():
    return {
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
        "numpy": numpy_rng_state(),
        "python": random.getstate(),
    }


def _set_rng_state(state):
    torch.set_rng_state(state["torch"])
    if state.get("cuda") is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    set_numpy_rng_state(state["numpy"])
    random.setstate(state["python"])


def _error_rate(model, x, y, batch_size, device):
    if y is None or y.is_floating_point():
        return None
    was_training = model.training
    model.eval()
    wrong = 0
    with torch.no_grad():
        for i in range(0, x.shape[0], batch_size):
            xb = x[i : i + batch_size].to(device)
            pred = model(xb)
            pred = pred.argmax(-1) if pred.dim() > 1 else (pred > 0).long()
            wrong += int((pred.cpu() != y[i : i + batch_size]).sum())
    model.train(was_training)
    return wrong / x.shape[0]


def train(
    model,
    x,
    y,
    objective="bayes",
    epochs=10,
    batch_size=100,
    lr=1e-3,
    device="auto",
    seed=0,
    test_data=None,
    target_density=None,
    per_layer=False,
    multiplier_lr=1.0,
    dual_restarts=True,
    checkpoint=None,
    resume=False,
    progress=True,
    input_shape=None,
    distributed=None,
    log_alpha_range=None,
    ema_decay=None,
):
    r"""Train a sparse model with minibatch Adam.

    :param model: a module with ``model(x, y, num_data)`` and ``guide(x, y, num_data)`` (the
        models in :mod:`l0bayes.models`). If it also has ``penalized_loss`` (e.g.
        :class:`~l0bayes.models.SparseClassifier`), that fast path is used for the penalised and
        constrained objectives, and if it has ``bayes_loss`` (the same free energy as
        ``TraceMeanField_ELBO`` for the same draws, computed directly), that one for ``"bayes"``.
    :param x, y: the full training set (tensors); minibatches of ``batch_size`` are drawn each epoch
        and the data term is scaled by ``N/B`` (``pyro.plate`` subsampling).
    :param str objective: ``"bayes"``: SVI on the free energy of Eq. 21 with
        ``TraceMeanField_ELBO`` (analytic gate KL, code cost as a factor); ``"penalized"``:
        Eq. 22 (no KL); ``"constrained"``: minimise the data term subject to expected density
        :math:`E\|z\|_0 / |\theta| \le \epsilon` (``target_density``), by gradient descent on the model
        and projected gradient ascent on the multiplier(s) :math:`\mu \ge 0` (one global or one
        per gated layer with ``per_layer=True``); ``multiplier_lr`` is the ascent step and
        ``dual_restarts`` resets a multiplier to zero whenever its constraint is satisfied.
    :param device: ``"auto"`` (CUDA if available), ``"cpu"`` or ``"cuda"``.
    :param int seed: seeds torch, numpy and Python; runs are reproducible.
    :param test_data: optional ``(x_test, y_test)``; the test error is recorded each epoch.
    :param checkpoint: path of a checkpoint written at the end of every epoch; with ``resume=True``
        training continues from it exactly (same next steps, bit for bit, on the same machine).
    :param input_shape: input shape (without batch) for the expected FLOPs of a gated network.
    :param distributed: data-parallel training under ``torchrun`` (see :mod:`l0bayes.inference.distributed`):
        ``None`` (default) uses ``DistributedDataParallel`` whenever there are several processes;
        ``batch_size`` is then the global minibatch, each rank takes its ``DistributedSampler`` shard
        of every epoch and draws its own gates, and only rank 0 records history, shows progress and
        writes checkpoints (other ranks return an empty history). ``False`` disables it; a
        :class:`~l0bayes.inference.distributed.DistributedConfig` sets backend, timeout and gate noise.
    :param log_alpha_range: ``(low, high)``: after every step each gate's ``log_alpha`` is projected onto
        ``[low, high]``. The paper's code uses ``(log 0.01, log 100)``: a kept gate then stays exactly 1
        only with probability about 0.95 (Eq. 12 with ``temperature=2/3``), so some gate noise remains
        for the whole run instead of vanishing as ``log_alpha`` grows without bound. ``None``: no projection.
    :param ema_decay: ``beta`` in ``[0, 1)``: keep the exponential moving average of all parameters,
        :math:`\bar\theta_t = \sum_{s \le t} (1-\beta)\beta^{t-s}\theta_s / (1-\beta^t)` (bias-corrected),
        and report every epoch's record (free energy, gates, test error, FLOPs) for the averaged
        parameters, which the returned model holds at the end (the raw ones go on training and are
        what a checkpoint resumes from). The paper's code evaluates with ``beta = 0.999``. ``None``: no
        averaging.
    :returns: :class:`TrainResult` with the per-epoch history (every free-energy term, the expected
        L0, expected FLOPs, test error, multipliers and constraint values, wall time).
    :raises NonFiniteLossError: when the objective becomes NaN or infinite.
    """
    if objective not in OBJECTIVES:
        raise ValueError(f"objective must be one of {OBJECTIVES}, got {objective!r}")
    if objective == "constrained":
        if target_density is None or not 0.0 < float(target_density) <= 1.0:
            raise ValueError(f"constrained training needs target_density in (0, 1], got {target_density!r}")
    if int(epochs) < 0 or int(batch_size) < 1 or not lr > 0:
        raise ValueError("epochs must be >= 0, batch_size >= 1 and lr > 0")
    if log_alpha_range is not None:
        low, high = (float(v) for v in log_alpha_range)
        if not low < high:
            raise ValueError(f"log_alpha_range must be (low, high) with low < high, got {log_alpha_range!r}")
    if ema_decay is not None and not 0.0 <= float(ema_decay) < 1.0:
        raise ValueError(f"ema_decay must lie in [0, 1), got {ema_decay!r}")
    if not torch.is_tensor(x) or (y is not None and not torch.is_tensor(y)):
        raise TypeError("x and y must be torch tensors")
    if y is not None and y.shape[0] != x.shape[0]:
        raise ValueError(f"x has {x.shape[0]} rows but y has {y.shape[0]}")
    _check_data(model, x, y, "training")
    if test_data is not None:
        _check_data(model, test_data[0], test_data[1], "test")

    ddp = DataParallelContext(distributed, device)
    device = ddp.device
    gate_seed = ddp.seed(seed)  # differs between ranks: each draws its own gates
    torch.manual_seed(gate_seed)
    np.random.seed(gate_seed % 2**32)
    random.seed(gate_seed)
    model.to(device)
    num_data = x.shape[0]
    batch_size = min(int(batch_size), num_data)
    local_batch = ddp.local_batch_size(batch_size)
    optimizer = torch.optim.Adam(model.parameters(), lr=lr, fused=_fused_adam(model))
    elbo = TraceMeanField_ELBO()
    shuffle = torch.Generator().manual_seed(seed)
    num_constraints = len(_gates(model)) if per_layer else 1
    multipliers = torch.zeros(num_constraints, device=device)
    history, start_epoch = [], 0
    log_alphas = [g.log_alpha for _, g in _gates(model)] if log_alpha_range is not None else []
    average = ParameterAverage(model, ema_decay) if ema_decay is not None else None

    if resume:
        state = ddp.load(checkpoint, map_location=device)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        multipliers = state["multipliers"].to(device)
        history = state["history"]
        start_epoch = state["epoch"]
        shuffle.set_state(state["shuffle"])
        ddp.restore_rng(state, seed, _set_rng_state)
        if average is not None:
            if "ema" not in state:
                raise ValueError(
                    f"checkpoint {checkpoint!r} holds no parameter average: it was not trained with ema_decay"
                )
            average.load_state_dict(state["ema"])

    fast = hasattr(model, "penalized_loss")
    fast_bayes = hasattr(model, "bayes_loss")
    steps = math.ceil(num_data / batch_size)
    bar = None
    step_objective = ddp.wrap(model)  # DistributedDataParallel when data-parallel
    if progress and ddp.is_main:
        from tqdm.auto import tqdm

        bar = tqdm(total=(epochs - start_epoch) * steps, desc=objective, unit="step", leave=False)

    def step_loss(xb, yb):
        """The objective on this process's minibatch (run inside DDP's forward when data-parallel)."""
        violation = None
        if objective == "bayes" and fast_bayes:
            loss = sum(model.bayes_loss(xb, yb, num_data))
        elif objective == "bayes":
            loss = elbo.differentiable_loss(model.model, model.guide, xb, yb, num_data)
        elif fast:
            nll, cost = model.penalized_loss(xb, yb, num_data)
            loss = nll + cost if objective == "penalized" else nll
        else:
            terms = free_energy(model.model, model.guide, xb, yb, num_data, kl=False)
            loss = terms.total if objective == "penalized" else terms.nll
        if objective == "constrained":
            violation = _constraint_values(model, per_layer) - float(target_density)
            lagrangian = loss / num_data + (multipliers * violation).sum()
            objective_value = lagrangian
        else:
            objective_value = loss / num_data
        return loss, objective_value, violation

    for epoch in range(start_epoch, epochs):
        model.train()
        start = time.perf_counter()
        order = ddp.shard(torch.randperm(num_data, generator=shuffle))
        sums = {"loss": 0.0}
        for step in range(steps):
            idx = order[step * local_batch : (step + 1) * local_batch]
            xb, yb = x[idx].to(device), (None if y is None else y[idx].to(device))
            optimizer.zero_grad(set_to_none=True)
            loss, objective_value, violation = step_objective(step_loss, xb, yb)
            # Means over the ranks (one all-reduce): the global-batch values, identical on every rank.
            loss_mean, value_mean, violation = ddp.mean(loss, objective_value, violation)
            if not torch.isfinite(value_mean):
                raise NonFiniteLossError(
                    f"non-finite objective ({float(value_mean)}) at epoch {epoch + 1}, step {step + 1}; "
                    "lower the learning rate or check the data"
                )
            objective_value.backward()
            optimizer.step()
            if log_alphas:
                with torch.no_grad():
                    torch._foreach_clamp_min_(log_alphas, low)
                    torch._foreach_clamp_max_(log_alphas, high)
            if average is not None:
                average.update()
            if objective == "constrained":
                # Projected gradient ascent on the multipliers (d Lagrangian / d mu = violation).
                with torch.no_grad():
                    multipliers = (multipliers + multiplier_lr * violation.detach()).clamp_(min=0.0)
                    if dual_restarts:
                        # Reset a multiplier once its constraint holds, so accumulated pressure does
                        # not keep pruning past the target (Gallego-Posada et al., 2022).
                        multipliers = torch.where(violation.detach() <= 0, torch.zeros_like(multipliers), multipliers)
            sums["loss"] += float(loss_mean)
            if bar is not None:
                bar.update(1)
        if not ddp.is_main:  # rank 0 records, reports and writes; the others only train
            if checkpoint is not None:
                ddp.gather(_rng_state())
            continue
        wall = time.perf_counter() - start
        with average.swapped() if average is not None else contextlib.nullcontext():
            record = _epoch_record(model, x, y, num_data, objective, epoch, steps, sums, elbo, device, batch_size)
            record["wall_s"] = wall
            if objective == "constrained":
                record["multipliers"] = multipliers.tolist()
                record["constraint"] = _constraint_values(model, per_layer).detach().tolist()
                record["target_density"] = float(target_density)
            if test_data is not None:
                record["test_error"] = _error_rate(model, test_data[0], test_data[1], 1000, device)
            if input_shape is not None:
                record.update(_flops_record(model, input_shape))
        history.append(record)
        if bar is not None:
            bar.set_postfix({k: f"{v:.4g}" for k, v in record.items() if k in ("free_energy", "test_error")})
        if checkpoint is not None:
            extra = ddp.checkpoint_extra(ddp.gather(_rng_state())) if ddp.enabled else {}
            if average is not None:
                extra["ema"] = average.state_dict()
            _save(checkpoint, model, optimizer, multipliers, history, epoch + 1, shuffle, extra)
    if bar is not None:
        bar.close()
    if average is not None and average.steps > 0:
        average.copy_to_model()
    ddp.close()
    if not ddp.is_main:
        history = []
    return TrainResult(model=model, history=history, multipliers=multipliers)


class ParameterAverage:
    r"""Bias-corrected exponential moving average of a module's parameters (Polyak-Ruppert style).

    After ``t`` calls of :meth:`update`, the average is
    :math:`\bar\theta_t = (1-\beta)\sum_{s=1}^{t}\beta^{t-s}\theta_s / (1-\beta^t)`: a weighted mean of the
    iterates with weights summing to one (the accumulator starts at zero, as Adam's moments do).
    :meth:`swapped` puts the average into the module for evaluation and the raw parameters back after.
    """

    def __init__(self, module, decay):
        self.decay = float(decay)
        if not 0.0 <= self.decay < 1.0:
            raise ValueError(f"decay must lie in [0, 1), got {decay!r}")
        self.params = [p for p in module.parameters()]
        self.sums = [torch.zeros_like(p, memory_format=torch.preserve_format) for p in self.params]
        self.steps = 0

    @torch.no_grad()
    def update(self):
        """Fold the current parameters into the average: ``s <- beta s + (1 - beta) theta``."""
        torch._foreach_lerp_(self.sums, [p.detach() for p in self.params], 1.0 - self.decay)
        self.steps += 1

    def averaged(self):
        """The bias-corrected averages, one tensor per parameter."""
        if self.steps == 0:
            raise RuntimeError("no update yet: the average is undefined")
        correction = 1.0 - self.decay**self.steps
        return [s / correction for s in self.sums]

    @torch.no_grad()
    def copy_to_model(self):
        """Overwrite the module's parameters with the average."""
        torch._foreach_copy_(self.params, self.averaged())

    @contextlib.contextmanager
    def swapped(self):
        """Within the context the module holds the averaged parameters (no-op before the first update)."""
        if self.steps == 0:
            yield
            return
        with torch.no_grad():
            raw = [p.detach().clone() for p in self.params]
            self.copy_to_model()
        try:
            yield
        finally:
            with torch.no_grad():
                torch._foreach_copy_(self.params, raw)

    def state_dict(self):
        """Decay, number of updates and the (uncorrected) accumulators, on the CPU, for a checkpoint."""
        return {"decay": self.decay, "steps": self.steps, "sums": [s.detach().cpu().clone() for s in self.sums]}

    def load_state_dict(self, state):
        """Restore :meth:`state_dict`; the decay and the number of tensors must match this average's."""
        if float(state["decay"]) != self.decay:
            raise ValueError(f"the saved average has decay {state['decay']}, this one {self.decay}")
        if len(state["sums"]) != len(self.sums):
            raise ValueError(f"average holds {len(state['sums'])} tensors, the model {len(self.sums)} parameters")
        with torch.no_grad():
            for s, saved in zip(self.sums, state["sums"], strict=True):
                s.copy_(saved)
        self.steps = int(state["steps"])


def _fused_adam(model):
    """Use PyTorch's fused Adam (one kernel for all parameters) where it supports every parameter.

    The same update rule as the default implementation (up to rounding); on a CPU at minibatch sizes it
    halves the optimiser's share of a step, which is mostly per-tensor dispatch.
    """
    params = list(model.parameters())
    return bool(params) and all(p.is_floating_point() and p.device.type in ("cpu", "cuda") for p in params)


def _epoch_record(model, x, y, num_data, objective, epoch, steps, sums, elbo, device, batch_size):
    """Every free-energy term at the end of an epoch, estimated on a fixed subset scaled to N.

    The RNG state is restored afterwards so that recording does not change the training draws.
    """
    record = {"epoch": epoch + 1, "mean_loss": sums["loss"] / steps}
    rng_state = torch.get_rng_state()
    take = min(num_data, max(batch_size, 1000))
    with torch.no_grad():
        xb, yb = x[:take].to(device), None if y is None else y[:take].to(device)
        terms = free_energy(model.model, model.guide, xb, yb, num_data, kl=(objective == "bayes"))
    torch.set_rng_state(rng_state)
    record.update(terms.as_dict())
    gates = _gates(model)
    record["expected_l0"] = float(sum(g.expected_l0() for _, g in gates).detach())
    record["active_gates"] = [int(g.active().sum()) for _, g in gates]
    return record


def _flops_record(model, input_shape):
    from ..nn.prune import expected_flops

    net = getattr(model, "net", model)
    with torch.no_grad():
        return {"expected_flops": float(expected_flops(net, input_shape))}


def _save(path, model, optimizer, multipliers, history, epoch, shuffle, extra=None):
    state = {
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "multipliers": multipliers.cpu(),
        "history": history,
        "epoch": epoch,
        "shuffle": shuffle.get_state(),
        "rng": _rng_state(),
        **(extra or {}),
    }
    save_checkpoint(path, state)
