"""One training entry point: SVI on Eq. 21, the penalised Eq. 22, or constrained sparsity (slides).

:func:`train` is one short loop over an :class:`~l0bayes.inference.objectives.Objective` (one small
object per objective, as Pyro's ``SVI`` holds an ELBO); data-parallel training, checkpoints and parameter
averaging live in :mod:`~l0bayes.inference.distributed`, :mod:`~l0bayes.inference.checkpoint` and
:mod:`~l0bayes.inference.averaging`.
"""

import contextlib
import math
import random
import time
from dataclasses import dataclass, field

import numpy as np
import torch

from ..nn.gates import gates_of
from ..threads import choose_threads, thread_policy
from ..utils import all_finite, check_xy
from .averaging import ParameterAverage
from .checkpoint import numpy_rng_state, save_checkpoint, set_numpy_rng_state
from .compiled import CompiledStep, requirement_error
from .device import resolve_device
from .distributed import DataParallelContext
from .errors import NonFiniteLossError
from .free_energy import FreeEnergy, free_energy
from .objectives import DUAL_RESTARTS, FINAL_PHASE, MULTIPLIER_LR_PER_LR, make_objective
from .optimizers import default_optimizer, describe_optimizer, describe_scheduler, gate_lr, step_scheduler

__all__ = ["NonFiniteLossError", "OBJECTIVES", "ParameterAverage", "TrainResult", "resolve_device", "train"]

OBJECTIVES = ("bayes", "penalized", "constrained")


@dataclass
class TrainResult:
    """What :func:`train` returns: the trained model, the per-epoch history and the multipliers."""

    model: torch.nn.Module
    history: list = field(default_factory=list)
    multipliers: torch.Tensor | None = None


def _is_number(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool) or (torch.is_tensor(v) and v.numel() == 1)


def _finite_positive(v):
    return _is_number(v) and math.isfinite(float(v)) and float(v) > 0


def _threads_ok(v):
    try:
        choose_threads(v, environ={})
    except ValueError:
        return False
    return True


def _density_ok(v):
    if v is None:
        return False
    t = torch.as_tensor(v, dtype=torch.float64)
    return t.numel() >= 1 and bool(((t > 0) & (t <= 1)).all())


# Every argument check of train() in one place: (applies when, holds when, message: a template or a function of
# the arguments). `a` holds the arguments.
_ARGUMENT_RULES = (
    (
        lambda a: True,
        lambda a: a["objective"] in OBJECTIVES,
        "objective must be one of {OBJECTIVES}, got {objective!r}",
    ),
    (
        lambda a: True,
        lambda a: _is_number(a["epochs"]) and int(a["epochs"]) >= 0,
        "epochs must be >= 0, got {epochs!r}",
    ),
    (
        lambda a: True,
        lambda a: _is_number(a["batch_size"]) and int(a["batch_size"]) >= 1,
        "batch_size must be >= 1, got {batch_size!r}",
    ),
    (lambda a: True, lambda a: _finite_positive(a["lr"]), "lr must be a finite number > 0, got {lr!r}"),
    (
        lambda a: True,
        lambda a: _is_number(a["record_every"]) and int(a["record_every"]) >= 1,
        "record_every must be >= 1, got {record_every!r}",
    ),
    (
        lambda a: a["objective"] == "constrained",
        lambda a: _density_ok(a["target_density"]),
        "constrained training needs target_density in (0, 1], got {target_density!r}",
    ),
    (
        lambda a: a["objective"] == "constrained" and a["multiplier_lr"] is not None,
        lambda a: (
            _is_number(a["multiplier_lr"]) and math.isfinite(float(a["multiplier_lr"])) and a["multiplier_lr"] >= 0
        ),
        "multiplier_lr must be a finite number >= 0, got {multiplier_lr!r}",
    ),
    (
        lambda a: a["objective"] == "constrained",
        lambda a: _is_number(a["final_phase"]) and 0 <= float(a["final_phase"]) < 1,
        "final_phase must lie in [0, 1), got {final_phase!r}",
    ),
    (
        lambda a: a["log_alpha_range"] is not None,
        lambda a: len(a["log_alpha_range"]) == 2 and float(a["log_alpha_range"][0]) < float(a["log_alpha_range"][1]),
        "log_alpha_range must be (low, high) with low < high, got {log_alpha_range!r}",
    ),
    (
        lambda a: a["ema_decay"] is not None,
        lambda a: _is_number(a["ema_decay"]) and 0.0 <= float(a["ema_decay"]) < 1.0,
        "ema_decay must lie in [0, 1), got {ema_decay!r}",
    ),
    (
        lambda a: a["resume"],
        lambda a: a["checkpoint"] is not None,
        "resume=True needs checkpoint= (the file to resume from)",
    ),
    (
        lambda a: True,
        lambda a: isinstance(a["compile"], bool),
        "compile must be True or False, got {compile!r}",
    ),
    (
        lambda a: a["compile"] is True and a["objective"] in OBJECTIVES,
        lambda a: requirement_error(a["model"], a["objective"]) is None,
        lambda a: requirement_error(a["model"], a["objective"]),
    ),
    (
        lambda a: True,
        lambda a: _threads_ok(a["threads"]),
        "threads must be 'auto', None or a positive int, got {threads!r}",
    ),
    (
        lambda a: a["optimizer"] is not None,
        lambda a: callable(a["optimizer"]),
        "optimizer must be a factory model -> torch.optim.Optimizer (or None), got {optimizer!r}",
    ),
    (
        lambda a: a["scheduler"] is not None,
        lambda a: callable(a["scheduler"]),
        "scheduler must be a factory optimizer -> LRScheduler (or None), got {scheduler!r}",
    ),
)
# Checks of the data: (holds when, error type, message).
_DATA_RULES = (
    (lambda x, y: torch.is_tensor(x) and (y is None or torch.is_tensor(y)), TypeError, "x and y must be torch tensors"),
    (
        lambda x, y: y is not None,
        ValueError,
        "y is None: train() needs targets (labels or responses) for every row of x",
    ),
    (lambda x, y: x.dim() >= 1 and x.shape[0] > 0, ValueError, "the training data is empty (x has no rows)"),
    (lambda x, y: y.shape[0] == x.shape[0], ValueError, "x has {rows} rows but y has {labels}"),
)


def _check_arguments(args, x, y):
    """Raise the first failed rule of :data:`_ARGUMENT_RULES` and :data:`_DATA_RULES`."""
    for applies, holds, message in _ARGUMENT_RULES:
        if applies(args) and not holds(args):
            raise ValueError(message(args) if callable(message) else message.format(OBJECTIVES=OBJECTIVES, **args))
    for holds, error, message in _DATA_RULES:
        if not holds(x, y):
            raise error(message.format(rows=x.shape[0], labels=y.shape[0] if y is not None else 0))


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
    multiplier_lr=None,
    dual_restarts=DUAL_RESTARTS,
    checkpoint=None,
    resume=False,
    progress=True,
    input_shape=None,
    distributed=None,
    log_alpha_range=None,
    ema_decay=None,
    final_phase=FINAL_PHASE,
    record_every=1,
    optimizer=None,
    scheduler=None,
    compile=False,
    threads="auto",
):
    r"""Train a sparse model with minibatch Adam, or the optimiser and schedule a factory builds.

    :param model: a module with ``model(x, y, num_data)`` and ``guide(x, y, num_data)`` (the
        models in :mod:`l0bayes.models`). If it also has ``penalized_loss`` (e.g.
        :class:`~l0bayes.models.SparseClassifier`), that fast path is used for the penalised and
        constrained objectives, and if it has ``bayes_loss`` (the same free energy as
        ``TraceMeanField_ELBO`` for the same draws, computed directly), that one for ``"bayes"``.
    :param x, y: the full training set (tensors; ``y`` is required); minibatches of ``batch_size`` are
        drawn each epoch and the data term is scaled by ``N/B`` (``pyro.plate`` subsampling).
    :param str objective: ``"bayes"``: SVI on the free energy of Eq. 21 with
        ``TraceMeanField_ELBO`` (analytic gate KL, code cost as a factor); ``"penalized"``:
        Eq. 22 (no KL); ``"constrained"``: minimise the data term subject to a density of at most
        ``target_density`` (one global constraint, or one per gated layer with ``per_layer=True``, where
        ``target_density`` may list one target per layer):
        :class:`~l0bayes.inference.objectives.ConstrainedObjective`. A Lagrangian on the expected density
        (projected gradient ascent on the multipliers, step ``multiplier_lr``, by default ``3 * lr``: Adam moves a
        ``log_alpha`` by at most about ``lr`` per step, and the multiplier moves on the same time scale; with
        ``dual_restarts``
        resetting a multiplier to zero whenever its constraint holds), then, for the last
        ``final_phase`` fraction of the epochs, fixed gates that meet the target at test time while the
        weights go on training. The history records the expected and the test-time density
        (``constraint``, ``test_time_density``, ``test_time_density_per_layer``) and the multipliers.
    :param device: ``"auto"`` (CUDA if available), ``"cpu"`` or ``"cuda"``.
    :param int seed: seeds torch, numpy and Python; runs are reproducible.
    :param test_data: optional ``(x_test, y_test)``; the test error is recorded each epoch.
    :param checkpoint: path of a checkpoint written at the end of every epoch; with ``resume=True``
        training continues from it exactly (same next steps, bit for bit, on the same machine). The
        checkpoint stores the objective, learning rate, batch size and a fingerprint of the data; resuming
        with any of them changed is a ``ValueError`` naming what differs.
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
        for the whole run instead of vanishing as ``log_alpha`` grows without bound. ``None``: no
        projection. (The constrained objective's final phase fixes the gates outside this range.)
    :param ema_decay: ``beta`` in ``[0, 1)``: keep the exponential moving average of all parameters,
        :math:`\bar\theta_t = \sum_{s \le t} (1-\beta)\beta^{t-s}\theta_s / (1-\beta^t)` (bias-corrected),
        and report every epoch's record (free energy, gates, test error, FLOPs) for the averaged
        parameters, which the returned model holds at the end (the raw ones go on training and are
        what a checkpoint resumes from). The paper's code evaluates with ``beta = 0.999``. ``None``: no
        averaging.
    :param optimizer: ``None`` (Adam at ``lr`` over every parameter, fused where possible) or a factory
        ``model -> torch.optim.Optimizer``, called once on the model (after it is moved to ``device``);
        :func:`~l0bayes.inference.parameter_groups` gives the gates (``log_alpha``) their own group, e.g.
        their own step size and no weight decay. ``lr`` is then not used by the optimiser; the constrained
        objective's multiplier step is still ``3 *`` a step size unless ``multiplier_lr`` is given: three
        times the initial step size of the group holding the gates (as the factory built it, before any
        schedule), and it stays fixed while a schedule changes the optimiser's.
    :param scheduler: ``None`` or a factory ``optimizer -> torch.optim.lr_scheduler.LRScheduler``; the
        schedule is stepped once at the end of every epoch (``ReduceLROnPlateau`` with the epoch's mean
        training loss), so a ``MultiStepLR(milestones=[60, 120, 160])`` drops the step size after those epochs.
        The optimiser's and the schedule's state go into the checkpoint, and resuming with another optimiser
        class, other settings of a group or another schedule is a ``ValueError`` naming what differs.
    :param int record_every: the full end-of-epoch record (free energy on a fixed subset of up to 1000
        training examples, test error, FLOPs) every ``record_every`` epochs and at the last; the other
        epochs record only the mean training loss, wall time and the objective's own entries. Each
        record says which it is (``full_record``).
    :param bool compile: run each training step's forward, loss and backward under :func:`torch.compile`
        (:class:`~l0bayes.inference.compiled.CompiledStep`): fewer, fused kernels per step, for models with the
        fused losses (e.g. :class:`~l0bayes.models.SparseClassifier`), not with ``distributed``. The first
        steps pay the compilation (seconds to tens of seconds), conditional computation is off, and the
        values agree with the eager step up to rounding; see ``docs/guide/training.md``, "Compiling the
        training step".
    :param threads: torch's intra-op thread count during the call (:func:`~l0bayes.threads.thread_policy`; the
        caller's count is restored after, also on an error). ``"auto"`` (default): one thread, unless
        ``OMP_NUM_THREADS`` is set or an enclosing ``thread_policy`` chose (then that count): torch's default,
        one spinning OpenMP thread per core, runs many times slower as soon as another process wants a core.
        ``None``: torch's count as it is (e.g. after your own ``torch.set_num_threads``); an int: that count.
    :returns: :class:`TrainResult` with the per-epoch history (every free-energy term, the expected
        L0, expected FLOPs, test error, multipliers and densities, wall time, and ``lr``: the step size of
        each of the optimiser's parameter groups during that epoch).
    :raises NonFiniteLossError: when the objective or a parameter becomes NaN or infinite.
    """
    arguments = dict(locals())
    _check_arguments(arguments, x, y)
    with thread_policy(threads):
        return _train(**arguments)


def _train(
    model,
    x,
    y,
    *,
    objective,
    epochs,
    batch_size,
    lr,
    device,
    seed,
    test_data,
    target_density,
    per_layer,
    multiplier_lr,
    dual_restarts,
    checkpoint,
    resume,
    progress,
    input_shape,
    distributed,
    log_alpha_range,
    ema_decay,
    final_phase,
    record_every,
    optimizer,
    scheduler,
    compile,
    threads,
):
    """:func:`train` after its argument checks, under its thread policy."""
    _check_data(model, x, y, "training")
    if test_data is not None:
        _check_data(model, test_data[0], test_data[1], "test")

    ddp = DataParallelContext(distributed, device)
    if compile and ddp.enabled:
        raise ValueError("compile=True is not supported with data-parallel training; leave compile off under torchrun")
    device = ddp.device
    gate_seed = ddp.seed(seed)  # differs between ranks: each draws its own gates
    torch.manual_seed(gate_seed)
    np.random.seed(gate_seed % 2**32)
    random.seed(gate_seed)
    model.to(device)
    num_data = x.shape[0]
    batch_size = min(int(batch_size), num_data)
    local_batch = ddp.local_batch_size(batch_size)
    optimizer, schedule, run_settings = _build_optimizer(model, lr, optimizer, scheduler)
    gate_step = run_settings.pop("gate_lr")  # not part of the signature: the optimiser's description holds it
    multiplier_lr = MULTIPLIER_LR_PER_LR * gate_step if multiplier_lr is None else multiplier_lr
    estimator = make_objective(
        objective,
        model,
        num_data,
        target_density=target_density,
        per_layer=per_layer,
        multiplier_lr=multiplier_lr,
        dual_restarts=dual_restarts,
        final_phase=final_phase,
    )
    step_function = CompiledStep(estimator) if compile else estimator.step
    shuffle = torch.Generator().manual_seed(seed)
    signature = {**_run_signature(objective, lr, batch_size, x, y), **run_settings}
    history, start_epoch = [], 0
    average = ParameterAverage(model, ema_decay) if ema_decay is not None else None
    if resume:
        state = ddp.load(checkpoint, map_location=device)
        try:
            _resume(state, checkpoint, ddp, model, (optimizer, schedule), estimator, shuffle, average, seed)
        except ValueError:  # e.g. an optimiser with other parameter groups: say what changed, if anything did
            _check_signature(state, signature, checkpoint)
            raise
        _check_signature(state, signature, checkpoint)
        history, start_epoch = state["history"], state["epoch"]
    projection = _log_alpha_projection(model, log_alpha_range)
    steps = math.ceil(num_data / batch_size)
    step_objective = ddp.wrap(model)  # DistributedDataParallel when data-parallel
    bar = _progress_bar(progress and ddp.is_main, (epochs - start_epoch) * steps, objective)

    for epoch in range(start_epoch, epochs):
        model.train()
        estimator.start_epoch(epoch, epochs)
        start = time.perf_counter()
        order = ddp.shard(torch.randperm(num_data, generator=shuffle))
        total_loss = 0.0
        for step in range(steps):
            idx = order[step * local_batch : (step + 1) * local_batch]
            xb, yb = x[idx].to(device), y[idx].to(device)
            optimizer.zero_grad(set_to_none=True)
            loss, value, statistics = step_objective(step_function, xb, yb)
            # Means over the ranks (one all-reduce): the global-batch values, identical on every rank.
            loss_mean, value_mean, statistics = ddp.mean(loss, value, statistics)
            if not torch.isfinite(value_mean):
                raise NonFiniteLossError(
                    f"non-finite objective ({float(value_mean)}) at epoch {epoch + 1}, step {step + 1}; "
                    "lower the learning rate or check the data"
                )
            value.backward()
            optimizer.step()
            projection()
            if average is not None:
                average.update()
            estimator.update(statistics)
            total_loss += float(loss_mean)
            if bar is not None:
                bar.update(1)
        _check_parameters(model, epoch)
        step_sizes = [float(g["lr"]) for g in optimizer.param_groups]  # those of this epoch
        step_scheduler(schedule, total_loss / steps)
        if not ddp.is_main:  # rank 0 records, reports and writes; the others only train
            if checkpoint is not None:
                ddp.gather(_rng_state())
            continue
        full = (epoch + 1) % int(record_every) == 0 or epoch + 1 == epochs
        record = {"epoch": epoch + 1, "mean_loss": total_loss / steps, "wall_s": time.perf_counter() - start}
        record["lr"] = step_sizes
        with average.swapped() if average is not None else contextlib.nullcontext():
            if average is not None:
                estimator.finalize_parameters()  # the average of fixed gates is fixed too
            record.update(estimator.record())
            if full:
                record.update(_full_record(model, x, y, estimator, batch_size, device, test_data, input_shape))
        record["full_record"] = full
        history.append(record)
        if bar is not None:
            shown = ("free_energy", "test_error", "test_rmse")
            bar.set_postfix({k: f"{v:.4g}" for k, v in record.items() if k in shown and v is not None})
        if checkpoint is not None:
            extra = ddp.checkpoint_extra(ddp.gather(_rng_state())) if ddp.enabled else {}
            if average is not None:
                extra["ema"] = average.state_dict()
            extra.update(objective_state=estimator.state_dict(), run=signature)
            if schedule is not None:
                extra["scheduler"] = schedule.state_dict()
            _save(checkpoint, model, optimizer, estimator.multipliers(), history, epoch + 1, shuffle, extra)
    if bar is not None:
        bar.close()
    if average is not None and average.steps > 0:
        average.copy_to_model()
        estimator.finalize_parameters()
    ddp.close()
    if not ddp.is_main:
        history = []
    return TrainResult(model=model, history=history, multipliers=estimator.multipliers())


def _progress_bar(show, total, desc):
    if not show:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, unit="step", leave=False)


def _log_alpha_projection(model, log_alpha_range):
    """A function projecting every gate's ``log_alpha`` onto ``[low, high]`` after a step (a no-op for ``None``)."""
    if log_alpha_range is None:
        return lambda: None
    low, high = (float(v) for v in log_alpha_range)
    log_alphas = [g.log_alpha for _, g in gates_of(model)]

    @torch.no_grad()
    def project():
        torch._foreach_clamp_min_(log_alphas, low)
        torch._foreach_clamp_max_(log_alphas, high)

    return project


def _check_parameters(model, epoch):
    """Refuse to go on (or to return) with a NaN or infinite parameter, e.g. a ``log_alpha`` pushed to infinity."""
    params = [p.detach() for p in model.parameters()]
    if params and not all(bool(torch.isfinite(p).all()) for p in params):
        names = [n for n, p in model.named_parameters() if not bool(torch.isfinite(p).all())]
        raise NonFiniteLossError(f"parameters {names} became NaN or infinite in epoch {epoch + 1}")


def _resume(state, checkpoint, ddp, model, optimization, estimator, shuffle, average, seed):
    """Load the checkpoint's ``state`` into the run's objects (``optimization``: optimiser and schedule)."""
    optimizer, schedule = optimization
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    if schedule is not None and "scheduler" in state:
        schedule.load_state_dict(state["scheduler"])
    if "objective_state" in state:
        estimator.load_state_dict(state["objective_state"])
    elif estimator.name == "constrained":  # a checkpoint written before objects held their state
        estimator.mu = state["multipliers"].to(next(model.parameters()).device)
    shuffle.set_state(state["shuffle"])
    ddp.restore_rng(state, seed, _set_rng_state)
    if average is not None:
        if "ema" not in state:
            raise ValueError(f"checkpoint {checkpoint!r} holds no parameter average: it was not trained with ema_decay")
        average.load_state_dict(state["ema"])


def _run_signature(objective, lr, batch_size, x, y):
    """What must not change when a run is resumed: objective, learning rate, batch size and the data."""
    with torch.no_grad():
        data = [list(x.shape), float(x.sum(dtype=torch.float64)), list(y.shape), float(y.sum(dtype=torch.float64))]
    return {"objective": objective, "lr": float(lr), "batch_size": int(batch_size), "data": data}


def _build_optimizer(model, lr, optimizer, scheduler):
    """The optimiser and schedule of a run and the settings a resume must match.

    :returns: ``(optimizer, schedule or None, settings)``; ``settings`` holds ``gate_lr`` (the initial step
        size of the gates' group, before any schedule) and the descriptions of the optimiser and the schedule.
    """
    built = (optimizer or default_optimizer(lr))(model)
    if not isinstance(built, torch.optim.Optimizer):
        raise TypeError(f"optimizer= must return a torch.optim.Optimizer, got {type(built).__name__}")
    settings = {"gate_lr": gate_lr(built, model), "optimizer": describe_optimizer(built)}
    schedule = None if scheduler is None else scheduler(built)
    if schedule is not None and not (hasattr(schedule, "step") and hasattr(schedule, "state_dict")):
        raise TypeError(f"scheduler= must return a learning-rate scheduler, got {type(schedule).__name__}")
    settings["scheduler"] = describe_scheduler(schedule)
    return built, schedule, settings


def _check_signature(state, signature, checkpoint):
    saved = state.get("run")
    if saved is None:  # written before checkpoints stored it
        return
    # Entries a checkpoint of an earlier version lacks (the optimiser, the schedule) are not compared.
    keys = [k for k in signature if k in saved]
    changed = [c for k in keys for c in _differences(k, saved[k], signature[k])]
    if changed:
        raise ValueError(f"cannot resume from {checkpoint!r}: the run changed: {'; '.join(changed)}")


def _differences(name, old, new):
    """``["name.key old -> new", ...]`` for every leaf where two plain containers differ."""
    if name == "data":
        return [] if old == new else ["data (shape or values of x, y)"]
    if isinstance(old, dict) and isinstance(new, dict) and old.get("type") == new.get("type"):
        return [c for k in sorted(set(old) | set(new)) for c in _differences(f"{name}.{k}", old.get(k), new.get(k))]
    if isinstance(old, list) and isinstance(new, list) and len(old) == len(new):
        return [c for k, (a, b) in enumerate(zip(old, new, strict=True)) for c in _differences(f"{name}[{k}]", a, b)]
    if isinstance(old, dict) and "type" in old or isinstance(new, dict) and "type" in new:  # another class
        kinds = [v.get("type") if isinstance(v, dict) else v for v in (old, new)]
        return [f"{name} {kinds[0]} -> {kinds[1]}"]
    return [] if old == new else [f"{name} {old!r} -> {new!r}"]


def _full_record(model, x, y, estimator, batch_size, device, test_data, input_shape):
    """Every free-energy term on a fixed subset of the training set, the gates, test error and expected FLOPs.

    The RNG state is restored afterwards so that recording does not change the training draws.
    """
    record = {}
    rng_state = torch.get_rng_state()
    take = min(x.shape[0], max(batch_size, 1000))
    with torch.no_grad():
        xb, yb = x[:take].to(device), y[:take].to(device)
        terms = _free_energy_terms(model, xb, yb, x.shape[0], estimator.kl)
    torch.set_rng_state(rng_state)
    record.update(terms.as_dict())
    gates = gates_of(model)
    record["expected_l0"] = float(sum(g.expected_l0() for _, g in gates).detach())
    record["active_gates"] = [int(g.active().sum()) for _, g in gates]
    if test_data is not None:
        record["test_error"] = _error_rate(model, test_data[0], test_data[1], 1000, device)
        rmse = _test_rmse(model, test_data[0], test_data[1], device)
        if rmse is not None:
            record["test_rmse"] = rmse
    if input_shape is not None:
        record.update(_flops_record(model, input_shape))
    return record


def _free_energy_terms(model, x, y, num_data, kl):
    """:func:`free_energy` of the model and guide, through the model's own fused losses when it has them.

    ``bayes_loss`` / ``penalized_loss`` give the same terms for the same draws in one pass over the
    gates instead of Pyro's traces (the record is then a few percent of a small epoch, not a third).
    """
    fused = "bayes_loss" if kl else "penalized_loss"
    if not hasattr(model, fused) or not model.training:
        return free_energy(model.model, model.guide, x, y, num_data, kl=kl)
    if kl:
        nll, gate_kl, code_cost = model.bayes_loss(x, y, num_data)
    else:
        (nll, code_cost), gate_kl = model.penalized_loss(x, y, num_data), None
    zero = torch.zeros_like(nll)
    return FreeEnergy(nll=nll, gate_kl=zero if gate_kl is None else gate_kl, other_kl=zero, code_cost=code_cost)


def _save(path, model, optimizer, multipliers, history, epoch, shuffle, extra=None):
    state = {
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "multipliers": multipliers.detach().cpu(),
        "history": history,
        "epoch": epoch,
        "shuffle": shuffle.get_state(),
        "rng": _rng_state(),
        **(extra or {}),
    }
    save_checkpoint(path, state)


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
        if not all_finite(x):
            raise ValueError(f"{name} inputs contain NaN or infinite values")
        if y is not None and y.shape[0] != x.shape[0]:
            raise ValueError(f"{name}: {x.shape[0]} inputs but {y.shape[0]} labels")


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


def _test_rmse(model, x, y, device):
    """Root mean squared error of a linear regression's test-time prediction (Eq. 13 coefficients).

    ``None`` unless ``y`` holds real values and the model is a Gaussian linear regression (it has a
    ``noise_scale`` and test-time ``coefficients()``).
    """
    if y is None or not y.is_floating_point() or not (hasattr(model, "noise_scale") and hasattr(model, "coefficients")):
        return None
    with torch.no_grad():
        pred = x.to(device) @ model.coefficients() + model.bias
        return float(torch.sqrt(((pred - y.to(device)) ** 2).mean()))


def _flops_record(model, input_shape):
    from ..nn.prune import expected_flops

    net = getattr(model, "net", model)
    with torch.no_grad():
        return {"expected_flops": float(expected_flops(net, input_shape))}
