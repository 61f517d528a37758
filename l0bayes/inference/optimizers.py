"""Optimisers and learning-rate schedules for :func:`~l0bayes.inference.train`.

``train(optimizer=..., scheduler=...)`` takes two factories, as a PyTorch user would write them:

* ``optimizer``: ``model -> torch.optim.Optimizer`` (default: fused Adam at ``lr`` over every parameter);
  :func:`clipped` makes one that clips the weights' gradients before every step;
* ``scheduler``: ``optimizer -> torch.optim.lr_scheduler.LRScheduler``, stepped once at the end of every
  epoch (``ReduceLROnPlateau`` is stepped with the epoch's mean training loss).

:func:`parameter_groups` splits a model's parameters into the gates' ``log_alpha`` and everything else, so
that a factory can give the gates their own step size and no weight decay, e.g. the Wide ResNet schedule
of Louizos et al. (2018), Section 4.2 (SGD 0.1 with Nesterov momentum 0.9, the step size divided by 5 at
epochs 60, 120 and 160)::

    optimizer = lambda m: torch.optim.SGD(parameter_groups(m, weights={"weight_decay": 5e-4}),
                                          lr=0.1, momentum=0.9, nesterov=True)
    scheduler = lambda o: torch.optim.lr_scheduler.MultiStepLR(o, milestones=[60, 120, 160], gamma=0.2)

or Sheared-LLaMA's for pruning a language model to a target architecture (Xia et al., 2024): the gates at
:math:`10^4` times the weights' step size, with the multipliers of the constrained objective ascended by Adam at
the gates' (``Constrained(multiplier_optimizer=...)``)::

    optimizer = lambda m: torch.optim.AdamW(parameter_groups(m, gates={"lr": 1.0, "weight_decay": 0.0}),
                                            lr=1e-4, betas=(0.9, 0.95))
"""

import math
import numbers

import torch

from ..nn.gates import gates_of

__all__ = [
    "clipped",
    "default_optimizer",
    "describe_optimizer",
    "describe_scheduler",
    "gate_lr",
    "parameter_groups",
    "step_scheduler",
]


def parameter_groups(model, gates=None, weights=None):
    """The parameters of ``model`` as two ``torch.optim`` parameter groups: weights first, then gates.

    :param model: any module; its gates are found with :func:`~l0bayes.nn.gates_of` (every
        :class:`~l0bayes.nn.HardConcreteGate`, including those that :func:`~l0bayes.pruning.sparsify` attached).
    :param dict gates: optimiser settings of the gates' ``log_alpha`` group (e.g. ``{"lr": 0.01,
        "weight_decay": 0.0}``); the optimiser's defaults fill in the rest.
    :param dict weights: settings of the group of every other parameter.
    :returns: ``[{"params": [...], **weights}, {"params": [...], **gates}]``, without a group that would be
        empty (a model without gates gives one group).

    E.g. the gates in a group of their own step size and betas, the rest at the optimiser's::

        torch.optim.AdamW(parameter_groups(model, gates={"lr": 1.0, "betas": (0.9, 0.95), "weight_decay": 0.0}),
                          lr=1e-4)
    """
    gate_ids = {id(g.log_alpha) for _, g in gates_of(model)}
    params = [p for p in model.parameters()]
    gate_params = [p for p in params if id(p) in gate_ids]
    weight_params = [p for p in params if id(p) not in gate_ids]
    groups = []
    if weight_params:
        groups.append({"params": weight_params, **dict(weights or {})})
    if gate_params:
        groups.append({"params": gate_params, **dict(gates or {})})
    return groups


def default_optimizer(lr):
    """The factory ``train()`` uses without ``optimizer=``: Adam at ``lr``, fused where every parameter allows."""

    def build(model):
        params = list(model.parameters())
        fused = bool(params) and all(p.is_floating_point() and p.device.type in ("cpu", "cuda") for p in params)
        return torch.optim.Adam(params, lr=lr, fused=fused)

    return build


#: The attribute of an optimiser built by :func:`clipped` holding its clipping settings (part of its description).
CLIPPING = "l0bayes_clip_grad_norm"


def clipped(optimizer, max_norm, norm_type=2.0, gates=False):
    """A factory of ``optimizer``'s optimiser that clips the weights' gradients before every step.

    Before each ``step()`` the gradients of the weights are scaled together so that their total norm is at most
    ``max_norm``, as ``torch.nn.utils.clip_grad_norm_(weights, max_norm, norm_type)`` does (Pyro's ``ClippedAdam``
    and Keras's ``clipnorm`` also put it on the optimiser), e.g. the ``max_norm=1.0`` of language-model recipes::

        train(model, ids, ids, optimizer=clipped(lambda m: torch.optim.AdamW(m.parameters(), lr=3e-4), 1.0))

    It runs after the backward pass, outside the compiled or graphed step, so it applies alike with
    ``compile=True``, ``cuda_graph=True`` and data-parallel training (where every rank clips the same averaged
    gradients).

    :param optimizer: a factory ``model -> torch.optim.Optimizer``, as ``train(optimizer=...)`` takes (e.g.
        ``default_optimizer(lr)``, the one train uses without ``optimizer=``).
    :param max_norm: the largest total norm of the clipped gradients, a finite number ``> 0``.
    :param norm_type: the norm's order, ``> 0`` (``float("inf")``: the largest absolute value).
    :param bool gates: whether the gates' ``log_alpha`` gradients are clipped too (in the same total norm). By
        default they are not: their gradients come from the code cost or the constraint as much as from the data,
        and their steps (and the constrained objective's multiplier step, set from the gates' step size) stay
        those of the optimiser.
    :returns: the factory; the optimiser's description (what a resume compares) includes the clipping.
    """
    if not callable(optimizer) or isinstance(optimizer, type):  # a class (torch.optim.SGD) would get the model
        raise TypeError(
            f"clipped: optimizer must be a factory model -> torch.optim.Optimizer (e.g. default_optimizer(lr), or "
            f"lambda m: torch.optim.SGD(m.parameters(), lr=...)), got {optimizer!r}"
        )
    max_norm = _positive("max_norm", max_norm)
    norm_type = _positive("norm_type", norm_type, infinite=True)
    if not isinstance(gates, bool):
        raise TypeError(f"clipped: gates must be True or False, got {gates!r}")
    settings = {"max_norm": max_norm, "norm_type": norm_type, "gates": gates}

    def build(model):
        built = optimizer(model)
        if not isinstance(built, torch.optim.Optimizer):
            raise TypeError(f"optimizer= must return a torch.optim.Optimizer, got {type(built).__name__}")
        if getattr(built, CLIPPING, None) is not None:
            raise ValueError("clipped: this optimiser already clips its gradients (clipped() applied twice)")
        gate_ids = set() if gates else {id(g.log_alpha) for _, g in gates_of(model)}
        params = [p for group in built.param_groups for p in group["params"] if id(p) not in gate_ids]
        built.register_step_pre_hook(_ClipGradNorm(params, max_norm, norm_type))
        setattr(built, CLIPPING, dict(settings))
        return built

    return build


class _ClipGradNorm:
    """A step pre-hook: ``clip_grad_norm_`` of the parameters (those with a gradient) before the step."""

    def __init__(self, params, max_norm, norm_type):
        self.params, self.max_norm, self.norm_type = params, max_norm, norm_type

    def __call__(self, optimizer, args, kwargs):
        torch.nn.utils.clip_grad_norm_(self.params, self.max_norm, self.norm_type)


def _positive(name, value, infinite=False):
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"clipped: {name} must be a number > 0, got {value!r}")
    value = float(value)
    if not (value > 0 and (math.isfinite(value) or (infinite and value == math.inf))):
        allowed = "a number > 0 (or inf)" if infinite else "a finite number > 0"
        raise ValueError(f"clipped: {name} must be {allowed}, got {value!r}")
    return value


def gate_lr(optimizer, model):
    """The step size of the group holding the gates' ``log_alpha`` (the first group's if the model has no gates).

    ``train()`` sets the constrained objective's multiplier step to three times this value unless
    ``multiplier_lr`` or ``multiplier_optimizer`` is given.
    """
    gate_ids = {id(g.log_alpha) for _, g in gates_of(model)}
    for group in optimizer.param_groups:
        if any(id(p) in gate_ids for p in group["params"]):
            return float(group["lr"])
    return float(optimizer.param_groups[0]["lr"])


def _plain(value):
    if torch.is_tensor(value):
        return value.tolist()
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value if isinstance(value, (bool, int, float, str, type(None))) else repr(value)


def describe_optimizer(optimizer):
    """What identifies an optimiser's settings: its class and every group's hyperparameters and size."""
    groups = [
        {**{k: _plain(v) for k, v in g.items() if k != "params"}, "num_params": len(g["params"])}
        for g in optimizer.param_groups
    ]
    described = {"type": type(optimizer).__name__, "groups": groups}
    if getattr(optimizer, CLIPPING, None) is not None:
        described["clip_grad_norm"] = dict(getattr(optimizer, CLIPPING))
    return described


# Scheduler state that changes as it steps (not a setting).
_SCHEDULER_PROGRESS = (
    "last_epoch",
    "_step_count",
    "_last_lr",
    "_is_initial",
    "_get_lr_called_within_step",
    "best",
    "num_bad_epochs",
    "cooldown_counter",
)


def describe_scheduler(scheduler):
    """What identifies a schedule: its class and the settings in its ``state_dict`` (``None`` for no schedule)."""
    if scheduler is None:
        return None
    state = scheduler.state_dict()
    settings = {k: _plain(dict(v) if isinstance(v, dict) else v) for k, v in state.items()}
    settings = {k: v for k, v in settings.items() if k not in _SCHEDULER_PROGRESS}
    return {"type": type(scheduler).__name__, "settings": settings}


def step_scheduler(scheduler, mean_loss):
    """One end-of-epoch step; ``ReduceLROnPlateau`` watches the epoch's mean training loss."""
    if scheduler is None:
        return
    if isinstance(scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau):
        scheduler.step(mean_loss)
    else:
        scheduler.step()
