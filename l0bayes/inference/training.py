"""One training entry point: SVI on Eq. 21, the penalised Eq. 22, or constrained sparsity (slides).

:func:`train` builds a :class:`~l0bayes.inference.loop.Run` from its arguments (the data, an
:class:`~l0bayes.inference.objectives.Objective`, the optimiser) and the callbacks they ask for
(:mod:`~l0bayes.inference.callbacks`: history, checkpoints, parameter averaging, ``log_alpha`` projection,
schedule, progress), restores a checkpoint when resuming (:mod:`~l0bayes.inference.resume`), and runs the
short loop of :func:`~l0bayes.inference.loop.fit`. Data-parallel training lives in
:mod:`~l0bayes.inference.distributed`.
"""

from collections.abc import Iterator
from dataclasses import dataclass, field

import torch

from ..threads import thread_policy
from .arguments import check_arguments
from .batches import CheckedBatches, make_batches
from .callbacks import (
    CallbackList,
    Checkpointing,
    FiniteParameters,
    History,
    LRSchedule,
    ProgressBar,
)
from .callbacks.records import check_held_out
from .compiled import CompiledStep
from .data_checks import DataCheck, check_data
from .distributed import DataParallelContext, seed_everything
from .graphed import GraphedStep
from .loop import ACCELERATOR_CHECK_EVERY, FiniteCheck, Run, fit
from .optimizers import default_optimizer, describe_optimizer, describe_scheduler, gate_lr
from .resume import check_signature, held_out_signature, resume_point, run_signature

__all__ = ["TrainResult", "train"]


@dataclass
class TrainResult:
    """What :func:`train` returns: the trained model (back on the device it was given on), the per-epoch
    history, the multipliers (on that device too) and the device it trained on."""

    model: torch.nn.Module
    history: list = field(default_factory=list)
    multipliers: torch.Tensor | None = None
    device: torch.device | None = None


def train(
    model,
    x,
    y=None,
    objective="bayes",
    epochs=10,
    batch_size=100,
    lr=1e-3,
    device="auto",
    seed=0,
    test_data=None,
    validation_data=None,
    checkpoint=None,
    resume=False,
    progress=True,
    distributed=None,
    record_every=1,
    optimizer=None,
    scheduler=None,
    compile=False,
    cuda_graph=False,
    callbacks=(),
    num_data=None,
    threads="auto",
):
    r"""Train a sparse model with minibatch Adam, or the optimiser and schedule a factory builds.

    :param model: a :class:`torch.nn.Module` with ``model(x, y, num_data)`` and ``guide(x, y, num_data)`` (the
        models in :mod:`l0bayes.models`; anything else is a ``TypeError``). If it also has ``penalized_loss`` (e.g.
        :class:`~l0bayes.models.SparseClassifier`), that fast path is used for the penalised and
        constrained objectives, and if it has ``bayes_loss`` (the same free energy as
        ``TraceMeanField_ELBO`` for the same draws, computed directly), that one for ``"bayes"``.
        Any gated network with a loss of your own: :class:`~l0bayes.models.SparseModel`.
    :param x, y: the full training set as tensors (minibatches of ``batch_size`` are drawn each epoch), or
        ``x`` an iterable of ``(x, y)`` batches that can be iterated once per epoch, such as a
        ``torch.utils.data.DataLoader`` (its own order and augmentation; ``y=None``, ``batch_size`` unused).
        The data term is scaled by ``N/B`` (``pyro.plate`` subsampling). Every batch of an iterable is checked
        against the model as it streams, before its step (the error names the batch and the epoch); an epoch is
        one pass, which must yield a batch, and at most ``len(x)`` batches. An iterator (a generator,
        ``iter(batches)``), used up by one pass, trains one epoch: ``epochs > 1`` is a ``ValueError``.
    :param num_data: ``N``, the number of training examples, for an iterable of batches that is not a
        ``DataLoader`` over a sized dataset (for one, ``len(dataset)`` by default, or its own sampler's length,
        e.g. a ``SubsetRandomSampler``'s). An epoch may stream fewer examples (a dropped last batch, a rank's
        shard, a subsample of the ``N``), never more: they are counted as they stream, and a ``ValueError``
        names ``num_data`` as soon as the count passes it (so an endless iterable such as ``itertools.cycle``
        is an error). With tensors, ``None`` or the number of rows of ``x`` (another number is a
        ``ValueError``).
    :param objective: what to minimise (:mod:`l0bayes.inference.objectives`, where each objective's settings are
        defined and checked): ``"bayes"`` or :class:`~l0bayes.inference.objectives.Bayes`, SVI on the free energy
        of Eq. 21 with ``TraceMeanField_ELBO`` (analytic gate KL, code cost as a factor); ``"penalized"`` or
        :class:`~l0bayes.inference.objectives.Penalized`, Eq. 22 (no KL);
        :class:`~l0bayes.inference.objectives.Constrained`, the data term subject to a target size of the pruned
        model, e.g. ``Constrained(target_density=0.3, target_warmup=150)``: a Lagrangian on the expected size, then
        fixed gates that meet the target for the last part of the run. The history then records the expected
        fraction (``constraint``), the pruned model's (``test_time_density``, ``test_time_density_per_layer``,
        ``test_time_flops``) and the multipliers.
    :param device: where to train: ``"auto"`` (CUDA if available), ``"cpu"``, ``"cuda"``, ``"cuda:N"`` or a
        :class:`torch.device` that can train (not ``"meta"``). The model moves
        there for training and back to the device it was on when ``train`` returns (or raises), like the
        multipliers; :attr:`TrainResult.device` says where it trained. Tensor data are copied to the device
        once (where they fit) rather than one minibatch at a time.
    :param int seed: seeds torch, numpy and Python; runs are reproducible. A whole number in ``[0, 2**64)``.
    :param test_data: optional ``(x_test, y_test)`` tensors or an iterable of ``(x, y)`` batches (e.g. a
        ``DataLoader``); the test error (``test_error``; ``test_rmse`` of a linear regression, ``test_loss`` of a
        model with its own loss) is recorded with each full record. Choose nothing on it (an epoch, a setting):
        that is what ``validation_data`` is for, and the test data then estimate the chosen model's error.
    :param validation_data: optional held-out data to choose on, given like ``test_data``; its metric is recorded
        with each full record as ``validation_error`` (``validation_rmse``, ``validation_loss``), and
        :class:`~l0bayes.inference.callbacks.EarlyStopping` monitors it by default. An iterator (a generator),
        which one evaluation would use up, is refused for both; pass a list of batches or a ``DataLoader``. Each
        batch is checked against the model as it is read, like the training batches (the error names the batch);
        numpy arrays are a ``TypeError``, as for ``x`` and ``y``: convert them with ``torch.from_numpy``. For a
        model with its own loss (:class:`~l0bayes.models.SparseModel`), whose labels only its ``loss_fn`` knows,
        the first batch of each is evaluated before training, and a ``loss_fn`` that fails on a batch (e.g. labels
        beyond the model's outputs) is a ``ValueError`` naming the batch and the argument.
    :param checkpoint: path of a checkpoint written at the end of every epoch; with ``resume=True``
        training continues from it exactly (same next steps, bit for bit, on the same machine). The
        checkpoint stores the objective, learning rate, batch size and a fingerprint of the data; resuming
        with any of them changed is a ``ValueError`` naming what differs. ``epochs`` may change: a resume with
        more epochs gives the run trained for that many from the start. (The constrained objective's final
        phase begins later in a longer run, so a checkpoint written during it also keeps the state of the run
        when it began, and a longer run continues from there; a resume that could not be exact, e.g. fewer
        epochs past a final phase, is a ``ValueError`` saying which ``epochs`` would be.)
    :param distributed: data-parallel training under ``torchrun`` (see :mod:`l0bayes.inference.distributed`):
        ``None`` (default) uses ``DistributedDataParallel`` whenever there are several processes;
        ``batch_size`` is then the global minibatch, each rank takes its ``DistributedSampler`` shard
        of every epoch and draws its own gates, and only rank 0 records history, shows progress and
        writes checkpoints (other ranks return an empty history). ``False`` disables it; a
        :class:`~l0bayes.inference.distributed.DistributedConfig` sets backend, timeout and gate noise.
    :param optimizer: ``None`` (Adam at ``lr`` over every parameter, fused where possible) or a factory
        ``model -> torch.optim.Optimizer``, called once on the model (after it is moved to ``device``);
        :func:`~l0bayes.inference.parameter_groups` gives the gates (``log_alpha``) their own group, e.g.
        their own step size and no weight decay, and :func:`~l0bayes.inference.clipped` clips the weights'
        gradients to a total norm before every step. ``lr`` is then not used by the optimiser; the constrained
        objective's default multiplier step is three times the initial step size of the group holding the gates
        (as the factory built it, before any schedule).
    :param scheduler: ``None`` or a factory ``optimizer -> torch.optim.lr_scheduler.LRScheduler``; the
        schedule is stepped once at the end of every epoch (``ReduceLROnPlateau`` with the epoch's mean
        training loss), so a ``MultiStepLR(milestones=[60, 120, 160])`` drops the step size after those epochs.
        The optimiser's and the schedule's state go into the checkpoint, and resuming with another optimiser
        class, other settings of a group or another schedule is a ``ValueError`` naming what differs.
    :param int record_every: the full end-of-epoch record (free energy on a fixed subset of up to 1000
        training examples, test error, the expected FLOPs per example with a FLOPs target or
        :class:`~l0bayes.inference.callbacks.ExpectedFlops`; every pass over the
        data on at most one training minibatch's rows at a time, without gradients, so that a large model's record
        fits where its steps do) every ``record_every`` epochs and at the last; the other epochs record only the
        mean training loss, wall time and the objective's own entries. Each record says which it is (``full_record``).
    :param bool compile: run each training step's forward, loss and backward under :func:`torch.compile`
        (:class:`~l0bayes.inference.compiled.CompiledStep`): fewer, fused kernels per step, for models with the
        fused losses (e.g. :class:`~l0bayes.models.SparseClassifier`), not with ``distributed``. The first
        steps pay the compilation (seconds to tens of seconds), conditional computation is off, and the
        values agree with the eager step up to rounding; see ``docs/guide/training.md``, "Compiling the
        training step".
    :param bool cuda_graph: on a CUDA device, capture each training step's forward, loss and backward as CUDA
        graphs at the first step and replay them (:class:`~l0bayes.inference.graphed.GraphedStep`): two launches
        instead of dozens of small kernels, for models with the fused losses, not with ``distributed``; with
        ``compile`` the compiled step is captured. The optimiser, the objective's update and the callbacks run
        as usual; a minibatch of another shape (a smaller last one) runs eagerly; gate noise follows the
        seed and a checkpoint as without graphs. A step that cannot be captured is a ``RuntimeError``.
        See ``docs/guide/training.md``, "On a GPU".
    :param threads: torch's intra-op thread count during the call (:func:`~l0bayes.threads.thread_policy`; the
        caller's count is restored after, also on an error). ``"auto"`` (default): one thread, unless
        ``OMP_NUM_THREADS`` is set or an enclosing ``thread_policy`` chose (then that count): torch's default,
        one spinning OpenMP thread per core, runs many times slower as soon as another process wants a core.
        ``None``: torch's count as it is (e.g. after your own ``torch.set_num_threads``); an int: that count.
    :param callbacks: more :class:`~l0bayes.inference.callbacks.Callback` objects, called after the ones ``train``
        builds from its arguments (history, schedule, progress) and before the checkpoint, which saves their
        state: a resume continues them too. ``None``: none. E.g.
        :class:`~l0bayes.inference.callbacks.TensorBoard`, :class:`~l0bayes.inference.callbacks.EarlyStopping`,
        :class:`~l0bayes.inference.callbacks.ExpectedFlops` ``(input_shape)`` (the expected FLOPs in every full record),
        your own, and two that act on the parameters, which run before the record so that it sees their effect:
        :class:`~l0bayes.inference.callbacks.ParameterAveraging` ``(decay)``, the bias-corrected moving average of
        the parameters that every record evaluates and the returned model holds (the paper's code evaluates with
        ``0.999``), and :class:`~l0bayes.inference.callbacks.LogAlphaProjection` ``(low, high)``, every gate's
        ``log_alpha`` projected onto ``[low, high]`` after each step (the paper's code: ``(log 0.01, log 100)``).
    :returns: :class:`TrainResult` with the per-epoch history (every free-energy term, the expected
        L0, expected FLOPs, test error, multipliers and densities, wall time, and ``lr``: the step size of
        each of the optimiser's parameter groups during that epoch).
    :raises NonFiniteLossError: when the objective or a parameter becomes NaN or infinite. On the CPU the
        objective is checked every step, before its backward pass; on an accelerator a flag on the device is read
        back every 100 steps and at the end of every epoch (a read every step would stall the device), so the
        error names the first non-finite step, the parameters have taken the steps after it, and the last
        checkpoint is the clean state (:class:`~l0bayes.inference.loop.FiniteCheck`).
    """
    arguments = dict(locals())
    check_arguments(arguments, x, y)
    with thread_policy(threads):
        return _train(arguments)


def _train(arguments):
    """:func:`train` after its argument checks, under its thread policy (``arguments``: train's, by name)."""
    model, x, y, distributed, device = (arguments[k] for k in ("model", "x", "y", "distributed", "device"))
    if torch.is_tensor(x):
        x, y = check_data(model, x, y, ("x", "y"))
    for held_out in ("test_data", "validation_data"):
        if arguments[held_out] is not None:
            arguments[held_out] = _test_data(model, arguments[held_out], held_out)
    ddp = DataParallelContext(distributed, device)
    if arguments["compile"] and ddp.enabled:
        raise ValueError("compile=True is not supported with data-parallel training; leave compile off under torchrun")
    if arguments["cuda_graph"] and (ddp.enabled or ddp.device.type != "cuda"):
        where = "with data-parallel training" if ddp.enabled else f"on {ddp.device}"
        raise ValueError(f"cuda_graph=True captures CUDA graphs: it needs a CUDA device and one process, not {where}")
    seed_everything(ddp.seed(arguments["seed"]))  # the gate seed differs between ranks: each draws its own gates
    home = next((p.device for p in model.parameters()), None)
    try:
        model.to(ddp.device)
        run = _fit(model, x, y, arguments, ddp)
    finally:
        ddp.close()
        if home is not None:  # the model goes back where it came from, also on an error
            model.to(home)
    multipliers = run.objective.multipliers()
    if multipliers is not None and home is not None:
        multipliers = multipliers.to(home)
    history = run.history if ddp.is_main else []
    return TrainResult(model=model, history=history, multipliers=multipliers, device=ddp.device)


def _fit(model, x, y, arguments, ddp):
    """Build the run of ``train``'s ``arguments`` on ``ddp.device`` (the model is there), resume it if asked,
    and train it; returns the :class:`~l0bayes.inference.loop.Run`."""
    run, settings = _build_run(model, x, y, arguments, ddp)
    # The full record's fixed training examples: an iterable's are kept as its first epoch streams (read once per
    # epoch), except in a resumed run, whose first epoch here is a later one: they come from a pass of their own.
    subset = run.batches.record_subset(own_pass=bool(arguments["resume"]))
    path = arguments["checkpoint"]
    checkpointing = Checkpointing(path, ddp, settings) if path is not None else None
    run.callbacks = _callbacks(run, arguments, checkpointing, subset)
    run.callbacks.setup(run)
    for held_out in ("validation_data", "test_data"):  # targets a model's own loss cannot take: named now
        if arguments[held_out] is not None:
            check_held_out(run, arguments[held_out], held_out)
    if arguments["resume"]:
        _restore(run, checkpointing, arguments)
    return fit(run)


def _test_data(model, test_data, name="test_data"):
    """``test_data`` (or ``validation_data``: ``name``) checked against the model: a pair of tensors, or an
    iterable of batches that can be iterated again, whose batches are checked as they are read."""
    if isinstance(test_data, (tuple, list)) and test_data and torch.is_tensor(test_data[0]):
        if len(test_data) != 2:
            raise TypeError(f"{name} must be a pair (x, y) of tensors, got {type(test_data).__name__}")
        return check_data(model, *test_data, (f"{name}[0]", f"{name}[1]"))
    if isinstance(test_data, (tuple, list)) and len(test_data) == 2 and any(_array_like(v) for v in test_data):
        kinds = ", ".join(type(v).__name__ for v in test_data)
        raise TypeError(
            f"{name} must be a pair (x, y) of torch tensors (as x and y), got ({kinds}): convert them, e.g. "
            "torch.from_numpy(...) or torch.as_tensor(...)"
        )
    if torch.is_tensor(test_data) or isinstance(test_data, (str, bytes, dict)) or not hasattr(test_data, "__iter__"):
        raise TypeError(
            f"{name} must be a pair (x, y) of tensors or an iterable of (x, y) batches, got {type(test_data).__name__}"
        )
    if isinstance(test_data, Iterator):  # a generator: the first evaluation would use it up
        raise TypeError(
            f"{name} is an iterator ({type(test_data).__name__}), which the first evaluation would use up: "
            "pass a list of (x, y) batches or a DataLoader"
        )
    if hasattr(test_data, "__len__") and len(test_data) == 0:
        raise ValueError(f"{name} holds no batches")
    return CheckedBatches(test_data, DataCheck(model), name)


def _array_like(v):
    """An array of another library (numpy, ...) where a tensor is needed: it has a shape, and is no tensor."""
    return not torch.is_tensor(v) and hasattr(v, "shape") and hasattr(v, "dtype")


def _build_run(model, x, y, a, ddp):
    """The :class:`~l0bayes.inference.loop.Run` of ``train``'s arguments ``a``, and the run's signature."""
    batches = make_batches(x, y, a["batch_size"], a["seed"], ddp, a["num_data"], DataCheck(model))
    optimizer, schedule, settings = _build_optimizer(model, a["lr"], a["optimizer"], a["scheduler"])
    gate_step = settings.pop("gate_lr")  # not part of the signature: the optimiser's description holds it
    shape = tuple(x.shape[1:]) if torch.is_tensor(x) else None
    objective = a["objective"].build(model, batches.num_data, gate_lr=gate_step, input_shape=shape)
    # A host read of the objective every step stalls an accelerator: there the flag is read every so often.
    finite = FiniteCheck(1 if ddp.device.type == "cpu" else ACCELERATOR_CHECK_EVERY)
    step_function = CompiledStep(objective) if a["compile"] else objective.step_with_data
    if a["cuda_graph"]:
        step_function = GraphedStep(objective, step_function)
    step = _step(ddp.wrap(model), step_function, ddp, finite)
    run = Run(model, optimizer, objective, batches, step, int(a["epochs"]), batches.num_data, ddp.device)
    run.finite = finite
    run.steps_per_epoch, run.is_main, run.schedule = batches.steps_per_epoch, ddp.is_main, schedule
    signature = run_signature(objective.name, a["lr"], batches.batch_size, x, y)
    signature["validation"] = held_out_signature(a["validation_data"])
    return run, {**signature, **settings}


def _step(step_objective, step_function, ddp, finite):
    """One minibatch's ``(loss, value, statistics, data term)``: the objective (inside DDP when data-parallel), with
    the loss, statistics and data term averaged over the ranks, and the objective's mean handed to ``finite`` (a
    :class:`~l0bayes.inference.loop.FiniteCheck`), so that a non-finite one stops every rank alike."""

    def step(x, y):
        loss, value, statistics, *data = step_objective(step_function, x, y)
        # Means over the ranks (one all-reduce): the global-batch values, identical on every rank.
        loss_mean, value_mean, statistics, data = ddp.mean(loss, value, statistics, data[0] if data else None)
        finite.observe(value_mean)
        return loss_mean, value, statistics, data

    return step


def _callbacks(run, a, checkpointing, subset):
    """The callbacks ``train``'s arguments ``a`` ask for and the user's, then the checkpoint: the user's that act on the
    parameters (:attr:`~l0bayes.inference.callbacks.Callback.before_records`) before the record, those that add to it
    (``extends_records``) right after it, the others after the schedule and the progress bar."""
    mine = list(a["callbacks"])
    first = [cb for cb in mine if getattr(cb, "before_records", False)]
    extending = [cb for cb in mine if getattr(cb, "extends_records", False)]
    rest = [cb for cb in mine if cb not in first and cb not in extending]
    size = getattr(run.objective, "size", None)  # a constrained objective's count, FLOPs included where it has them
    shape = size.input_shape if size is not None and getattr(run.objective, "has_flops", False) else None
    built = [FiniteParameters(), *first]
    built.append(History(subset, a["test_data"], shape, a["record_every"], a["validation_data"]))
    built += extending
    if run.schedule is not None:
        built.append(LRSchedule(run.schedule))
    if a["progress"]:
        built.append(ProgressBar(run.objective.name))
    built += rest
    return CallbackList(built + ([checkpointing] if checkpointing is not None else []))


def _restore(run, checkpointing, a):
    """Continue from the checkpoint (or the state it keeps, for more epochs), checking that the run is the same."""
    path = a["checkpoint"]
    state = resume_point(checkpointing.ddp.load(path, map_location=run.device), path, run.objective, run.epochs)
    try:
        checkpointing.restore(run, state, a["seed"])
    except ValueError:  # e.g. an optimiser with other parameter groups: say what changed, if anything did
        check_signature(state, checkpointing.signature, path)
        raise
    check_signature(state, checkpointing.signature, path)


def _build_optimizer(model, lr, optimizer, scheduler):
    """The optimiser and schedule of a run and the settings a resume must match.

    :returns: ``(optimizer, schedule or None, settings)``; ``settings`` holds ``gate_lr`` (the initial step
        size of the gates' group, before any schedule) and the descriptions of the optimiser and the schedule.
    """
    if isinstance(optimizer, type):  # torch.optim.SGD itself: it would be called on the model
        raise TypeError(
            f"optimizer= takes a factory model -> torch.optim.Optimizer, not the class {optimizer.__name__}: e.g. "
            f"optimizer=lambda m: torch.optim.{optimizer.__name__}(m.parameters(), lr=...)"
        )
    built = (optimizer or default_optimizer(lr))(model)
    if not isinstance(built, torch.optim.Optimizer):
        raise TypeError(f"optimizer= must return a torch.optim.Optimizer, got {type(built).__name__}")
    settings = {"gate_lr": gate_lr(built, model), "optimizer": describe_optimizer(built)}
    schedule = None if scheduler is None else scheduler(built)
    if schedule is not None and not (hasattr(schedule, "step") and hasattr(schedule, "state_dict")):
        raise TypeError(f"scheduler= must return a learning-rate scheduler, got {type(schedule).__name__}")
    settings["scheduler"] = describe_scheduler(schedule)
    return built, schedule, settings
