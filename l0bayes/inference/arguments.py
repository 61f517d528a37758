"""The argument checks of :func:`~l0bayes.inference.train`, in one table."""

import math

import torch

from .._checks import check_seed
from ..threads import choose_threads
from .compiled import requirement_error
from .graphed import GRAPH_REQUIREMENT

__all__ = ["OBJECTIVES", "check_arguments"]

OBJECTIVES = ("bayes", "penalized", "constrained")
RANKS = ("log_alpha", "norm")  # the constrained objective's ranking of groups (objectives.RANKS)


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


def _fused_loss_flag(name, requirement):
    """The two rules of a flag that needs the model's fused loss (``compile``, ``cuda_graph``): a bool, and the loss."""
    return (
        (lambda a: True, lambda a: isinstance(a[name], bool), f"{name} must be True or False, got {{{name}!r}}"),
        (
            lambda a: a[name] is True and a["objective"] in OBJECTIVES,
            lambda a: requirement_error(a["model"], a["objective"], **requirement) is None,
            lambda a: requirement_error(a["model"], a["objective"], **requirement),
        ),
    )


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
        lambda a: (a["target_density"] is None) != (a["target_flops"] is None),
        "constrained training needs one of target_density (a fraction of the parameters) and target_flops "
        "(a fraction of the FLOPs), got target_density={target_density!r}, target_flops={target_flops!r}",
    ),
    (
        lambda a: a["objective"] == "constrained" and a["target_flops"] is None,
        lambda a: _density_ok(a["target_density"]),
        "constrained training needs target_density in (0, 1], got {target_density!r}",
    ),
    (
        lambda a: a["objective"] == "constrained" and a["target_flops"] is not None,
        lambda a: _density_ok(a["target_flops"]),
        "constrained training needs target_flops in (0, 1], got {target_flops!r}",
    ),
    (
        lambda a: a["objective"] == "constrained" and a["arrival"] is not None,
        lambda a: _is_number(a["arrival"]) and 0 <= float(a["arrival"]) < math.inf,
        "arrival must be a number >= 0 or None, got {arrival!r}",
    ),
    (
        lambda a: a["objective"] == "constrained",
        lambda a: a["rank"] in RANKS,
        "rank must be one of {RANKS}, got {rank!r}",
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
    *_fused_loss_flag("compile", {}),
    *_fused_loss_flag("cuda_graph", GRAPH_REQUIREMENT),
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
# Checks of the data: (holds when, error type, message). An iterable of batches (x not a tensor) is the user's.
_DATA_RULES = (
    (
        lambda x, y: y is None or (torch.is_tensor(x) and torch.is_tensor(y)),
        TypeError,
        "x and y must be torch tensors (or x an iterable of (x, y) batches, with y=None)",
    ),
    (
        lambda x, y: not torch.is_tensor(x) or y is not None,
        ValueError,
        "y is None: train() needs targets (labels or responses) for every row of x",
    ),
    (
        lambda x, y: torch.is_tensor(x) or _iterable(x),
        TypeError,
        "x must be a tensor (with targets y) or an iterable of (x, y) batches such as a DataLoader (with y=None)",
    ),
    (
        lambda x, y: not torch.is_tensor(x) or (x.dim() >= 1 and x.shape[0] > 0),
        ValueError,
        "the training data is empty (x has no rows)",
    ),
)
# (The checks of the data against the model, shapes, dtypes, the first layer's size and the labels, are in
# data_checks.check_data, for the training and the test data.)


def _iterable(x):
    try:
        iter(x)
    except TypeError:
        return False
    return True


def check_arguments(args, x, y):
    """Raise the first failed rule of :data:`_ARGUMENT_RULES` and :data:`_DATA_RULES`."""
    for applies, holds, message in _ARGUMENT_RULES:
        if applies(args) and not holds(args):
            raise ValueError(
                message(args) if callable(message) else message.format(OBJECTIVES=OBJECTIVES, RANKS=RANKS, **args)
            )
    args["seed"] = check_seed(args["seed"])  # (torch.manual_seed raised "Overflow when unpacking long long")
    for holds, error, message in _DATA_RULES:
        if not holds(x, y):
            raise error(message)
