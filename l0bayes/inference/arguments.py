"""The argument checks of :func:`~l0bayes.inference.train`, in one table."""

import math
import numbers
from collections.abc import Iterable

import torch

from .._checks import check_seed, whole
from ..threads import choose_threads
from .batches import is_iterator
from .callbacks.base import Callback
from .compiled import requirement_error
from .device import resolve_device
from .graphed import GRAPH_REQUIREMENT
from .objectives.settings import as_objective

__all__ = ["check_arguments"]


def _is_number(v):
    """A real number: a Python or numpy int or float (not a bool), or a real tensor of one element."""
    if torch.is_tensor(v):
        return v.numel() == 1 and not v.is_complex() and v.dtype != torch.bool
    return isinstance(v, numbers.Real) and not isinstance(v, bool)


def _whole(v, low):
    """``v`` (a number) is a whole number ``>= low``: an int, or a float such as ``3.0`` (not infinity)."""
    if isinstance(v, numbers.Integral):
        return int(v) >= low
    f = float(v)
    return math.isfinite(f) and f == math.floor(f) and f >= low


def _count_rules(name, low):
    """The two rules of a count such as ``epochs``: a number (else a ``TypeError``), whole and ``>= low``."""
    message = f"{name} must be a whole number >= {low}, got {{{name}!r}}"
    return (
        (lambda a: True, lambda a: _is_number(a[name]), message, TypeError),
        (lambda a: True, lambda a: _whole(a[name], low), message),
    )


def _finite_positive(v):
    return _is_number(v) and math.isfinite(float(v)) and float(v) > 0


def _threads_ok(v):
    try:
        choose_threads(v, environ={})
    except ValueError:
        return False
    return True


def _fused_loss_flag(name, requirement):
    """The two rules of a flag that needs the model's fused loss (``compile``, ``cuda_graph``): a bool, and the loss."""
    return (
        (lambda a: True, lambda a: isinstance(a[name], bool), f"{name} must be True or False, got {{{name}!r}}"),
        (
            lambda a: a[name] is True,
            lambda a: requirement_error(a["model"], a["objective"].name, **requirement) is None,
            lambda a: requirement_error(a["model"], a["objective"].name, **requirement),
        ),
    )


# Every argument check of train() in one place: (applies when, holds when, message: a template or a function of
# the arguments[, error type: ValueError unless given]). `a` holds the arguments.
_ARGUMENT_RULES = (
    (
        lambda a: True,
        lambda a: _trainable(a["model"]),
        lambda a: (
            "model must be a torch.nn.Module with model(x, y, num_data) and guide(x, y, num_data) methods (the models "
            "of l0bayes.models; a network with a loss of your own: SparseModel(net, loss_fn), or PlainModel(net, "
            f"loss_fn) without gates), got {type(a['model']).__name__}"
        ),
        TypeError,
    ),
    *_count_rules("epochs", 0),
    *_count_rules("batch_size", 1),
    (lambda a: True, lambda a: _finite_positive(a["lr"]), "lr must be a finite number > 0, got {lr!r}"),
    *_count_rules("record_every", 1),
    (
        lambda a: is_iterator(a["x"]),
        lambda a: whole(a["epochs"]) <= 1,
        lambda a: (
            f"x is an iterator ({type(a['x']).__name__}), used up by one epoch, but epochs={a['epochs']!r}: pass "
            "an iterable that can be iterated once per epoch (a list of (x, y) batches, a DataLoader), or epochs=1"
        ),
    ),
    (
        lambda a: a["num_data"] is not None,
        lambda a: _is_number(a["num_data"]),
        "num_data must be a whole number >= 1 (or None), got {num_data!r}",
        TypeError,
    ),
    (
        lambda a: a["num_data"] is not None,
        lambda a: _whole(a["num_data"], 1),
        "num_data must be a whole number >= 1 (or None), got {num_data!r}",
    ),
    (
        lambda a: a["num_data"] is not None and torch.is_tensor(a["x"]) and a["x"].dim() >= 1,
        lambda a: whole(a["num_data"]) == a["x"].shape[0],
        lambda a: (
            f"num_data={a['num_data']!r} but x holds {a['x'].shape[0]} rows: with tensors the number of training "
            "examples is x's; num_data= is for an iterable of batches (leave it None)"
        ),
    ),
    (
        lambda a: a["callbacks"] is not None,
        lambda a: not isinstance(a["callbacks"], (Callback, str, bytes)) and _iterable(a["callbacks"]),
        lambda a: (
            f"callbacks must be a list of Callback objects (or None), got {type(a['callbacks']).__name__}"
            + (": put it in a list, callbacks=[...]" if isinstance(a["callbacks"], Callback) else "")
        ),
        TypeError,
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


def _trainable(model):
    """A module ``train`` can fit: the Pyro ``model`` and ``guide`` of the full record's free energy (its fused
    losses, ``penalized_loss`` / ``bayes_loss``, are optional)."""
    return isinstance(model, torch.nn.Module) and all(callable(getattr(model, m, None)) for m in ("model", "guide"))


def _iterable(x):
    """Whether ``x`` can be iterated, read from its type: ``iter(x)`` would start a ``DataLoader``'s workers and
    draw its seed, a read of the data before training."""
    return isinstance(x, Iterable) or callable(getattr(type(x), "__getitem__", None))


def check_arguments(args, x, y):
    """Raise the first failed rule of :data:`_ARGUMENT_RULES` and :data:`_DATA_RULES`; ``args["objective"]`` becomes
    its :class:`~l0bayes.inference.objectives.ObjectiveSettings` (the objective's own settings are checked where
    they are defined, when it is built)."""
    args["objective"] = as_objective(args["objective"])
    for applies, holds, message, *error in _ARGUMENT_RULES:
        if applies(args) and not holds(args):
            raise (error[0] if error else ValueError)(message(args) if callable(message) else message.format(**args))
    resolve_device(args["device"])  # a clear error naming device= (not one deep inside torch.device)
    args["seed"] = check_seed(args["seed"])  # (torch.manual_seed raised "Overflow when unpacking long long")
    for name in ("epochs", "batch_size", "record_every", "num_data"):  # whole numbers as Python ints
        if args[name] is not None:
            args[name] = whole(args[name])
    args["callbacks"] = () if args["callbacks"] is None else args["callbacks"]
    for holds, error, message in _DATA_RULES:
        if not holds(x, y):
            raise error(message)
