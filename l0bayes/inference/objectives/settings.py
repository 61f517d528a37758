r"""The training objectives as a user chooses them: :class:`Bayes`, :class:`Penalized` and :class:`Constrained`.

As Pyro's ``SVI`` takes a loss built with its settings (``TraceMeanField_ELBO(num_particles=...)``),
:func:`~l0bayes.inference.train` takes one of these: a small object holding an objective's settings, each
defined, checked and documented here once, when the object is built. ``train`` binds it to the model and the
number of training examples (:meth:`ObjectiveSettings.build`), which gives the estimator the loop steps
(:class:`~l0bayes.inference.objectives.Objective`); the object itself keeps no training state, so one can be
given to several runs. The strings ``"bayes"``, ``"penalized"`` and ``"constrained"`` name the first two with
their defaults (:func:`as_objective`); the constrained objective has no default target.
"""

import numbers

import numpy as np
import torch

from ..._checks import FLAG, NON_NEGATIVE, NON_NEGATIVE_COUNT, Choice, Rule, check_args, check_shape, whole
from .bayes import BayesObjective
from .constrained import DUAL_RESTARTS, MULTIPLIER_LR, MULTIPLIER_LR_PER_LR, ConstrainedObjective
from .final_phase import EACH, FINAL_PHASE, RANK, RANKS, WAIT
from .multipliers import check_factory
from .penalized import PenalizedObjective

__all__ = ["OBJECTIVES", "Bayes", "Constrained", "ObjectiveSettings", "Penalized", "as_objective"]

#: The objectives' names, as ``train(objective=...)`` takes them.
OBJECTIVES = ("bayes", "penalized", "constrained")

_FRACTION = Rule("a number in (0, 1] (or with per_layer=True one per gated layer)", lambda v: (v > 0) & (v <= 1))
_FINAL_PHASE = Rule("a number in [0, 1)", lambda v: (v >= 0) & (v < 1))
_RULES = {
    "target_density": _FRACTION.or_none(),
    "target_flops": _FRACTION.or_none(),
    "per_layer": FLAG,
    "rank": Choice(RANKS),
    "multiplier_lr": NON_NEGATIVE.or_none(),
    "dual_restarts": FLAG,
    "final_phase": _FINAL_PHASE,
    "target_warmup": NON_NEGATIVE_COUNT,
}


class ObjectiveSettings:
    """Base class: an objective's settings, bound to a model by :meth:`build`."""

    name = None

    def settings(self):
        """The settings, by name (what ``repr`` shows and two objects compare by)."""
        return {}

    def build(self, model, num_data, gate_lr=None, input_shape=None):
        """The estimator of this objective for ``model`` and ``num_data`` training examples.

        :param gate_lr: the initial step size of the optimiser's group that holds the gates (a default of the
            constrained objective's multiplier step).
        :param input_shape: one example's shape, without the batch dimension, where the data say it.
        """
        raise NotImplementedError

    def __repr__(self):
        shown = ", ".join(f"{k}={v!r}" for k, v in self.settings().items())
        return f"{type(self).__name__}({shown})"

    def __eq__(self, other):
        return type(self) is type(other) and _plain(self.settings()) == _plain(other.settings())

    __hash__ = None


class Bayes(ObjectiveSettings):
    """SVI on the free energy of Eq. 21 with ``TraceMeanField_ELBO``: the data term, the analytic gate KL
    (Eq. 28) and the code cost (:class:`~l0bayes.inference.objectives.BayesObjective`)."""

    name = "bayes"

    def build(self, model, num_data, gate_lr=None, input_shape=None):
        return BayesObjective(model, num_data)


class Penalized(ObjectiveSettings):
    """The penalised objective of Eq. 22: the data term and the code cost, without the gate KL
    (:class:`~l0bayes.inference.objectives.PenalizedObjective`)."""

    name = "penalized"

    def build(self, model, num_data, gate_lr=None, input_shape=None):
        return PenalizedObjective(model, num_data)


class Constrained(ObjectiveSettings):
    r"""Minimise the data term subject to the pruned model keeping at most a target size of the dense one.

    The target is one of: ``target_density``, a fraction of the parameters; ``target_flops``, a fraction of the
    FLOPs per example (both counted as :func:`~l0bayes.pruning.prune` removes: :mod:`l0bayes.pruning.size`); or,
    for a transformer gated by :func:`~l0bayes.pruning.sparsify_transformer`, ``target_architecture``, the sizes of
    every block, e.g. ``{"num_key_value_heads": 1, "intermediate_size": 768, "num_hidden_layers": 15}``
    (:class:`~l0bayes.pruning.TargetArchitecture`), with one constraint per block and size and one on the number of
    blocks, so that the pruned model has these sizes in every block. The algorithm (a Lagrangian on the expected
    size under :math:`q`, then a final phase with fixed gates) is
    :class:`~l0bayes.inference.objectives.ConstrainedObjective`'s; ``docs/mathematics.md``, "Constrained
    sparsity", and ``docs/guide/training.md`` say when to change which setting.

    :param target_density: :math:`\epsilon` in ``(0, 1]``, of parameters: a number, or with ``per_layer=True`` one
        per gated layer (a list, tuple, array or tensor), of that layer's own parameters.
    :param target_flops: instead, :math:`\epsilon` of FLOPs per example (the shape of one example comes from the
        training data, or ``input_shape``).
    :param target_architecture: instead, the sizes of every block of a transformer (a dict or a
        :class:`~l0bayes.pruning.TargetArchitecture`).
    :param bool per_layer: one constraint (and multiplier) per gated layer instead of one for the network.
    :param rank: how the final phase orders the groups it keeps: ``"log_alpha"`` (the order of Eq. 12 and 13) or
        ``"norm"`` (:math:`q(z_g \ne 0)` times the group's weight norm relative to its layer's median).
    :param arrival: ``None`` fixes the gates where the final phase begins, wherever the Lagrangian is (a warning
        says when the expected size is then more than 0.02 above the target, and how many more epochs it
        needed); a number waits until every expected fraction is at most its target plus it, until the last epoch
        at the latest; ``"each"`` (with ``target_architecture``) fixes each block's size on its own after the
        first step at which it arrives.
    :param multiplier_lr: :math:`\eta`, the projected gradient ascent step of the multipliers per training step;
        ``None``: three times the initial step size of the optimiser's group holding the gates (Adam moves a
        ``log_alpha`` by about its step size per step, and the multipliers move on the same time scale), fixed
        while a schedule changes the optimiser's. Not with ``multiplier_optimizer``, whose optimiser sets the step.
    :param multiplier_optimizer: ``None``: the projected gradient ascent of ``multiplier_lr``; or a factory
        ``params -> torch.optim.Optimizer`` that ascends the multipliers instead (``maximize=True``: their gradient
        is the violation :math:`d - \epsilon`), e.g. ``lambda p: torch.optim.Adam(p, lr=1.0, betas=(0.9, 0.95),
        maximize=True)``. ``params`` is a list holding one tensor, the multipliers, of shape ``(1,)`` for one
        constraint (never 0-d: FSDP2 refuses scalar parameters) or one entry per constraint; after each step of the
        optimiser they are projected onto :math:`\mu \ge 0`, and ``dual_restarts`` applies. Its step size stays
        fixed while a schedule changes the model's optimiser's; its state is saved in checkpoints, and a resume
        must give the same optimiser. With the gates in their own optimiser group at a large step size
        (:func:`~l0bayes.inference.parameter_groups`), the recipe of Sheared-LLaMA for large models
        (:class:`~l0bayes.inference.objectives.ConstrainedObjective` shows it in full).
    :param bool dual_restarts: reset a multiplier to zero whenever its constraint holds.
    :param final_phase: the fraction of the epochs in ``[0, 1)`` (rounded up, at least one epoch when positive) with
        fixed gates that meet the target in the pruned model while the weights go on training; ``0`` trains on
        the Lagrangian throughout (the expected size then meets the target, the pruned model's need not).
    :param int target_warmup: the number of steps over which the targets move linearly from the dense model to
        the target (CoFi's and Sheared-LLaMA's warm-up), so that the gates close gradually while the weights train;
        ``0``: the target from the first step.
    :param input_shape: one example's shape without the batch dimension, for ``target_flops`` where the training
        data do not say it (an iterable of batches) and the model is not one of :func:`~l0bayes.pruning.sparsify`.
    :raises TypeError: for a setting of the wrong kind (a ``multiplier_optimizer`` that is a class, not a factory);
        :class:`ValueError` for one outside its range, for no target or more than one, and for settings that do
        not go together, naming them. What ``multiplier_optimizer`` returns is checked when the objective is
        built (a :class:`torch.optim.Optimizer` over the multipliers, with ``maximize=True``).
    """

    name = "constrained"

    def __init__(
        self,
        target_density=None,
        target_flops=None,
        target_architecture=None,
        *,
        per_layer=False,
        rank=RANK,
        arrival=WAIT,
        multiplier_lr=None,
        multiplier_optimizer=None,
        dual_restarts=DUAL_RESTARTS,
        final_phase=FINAL_PHASE,
        target_warmup=0,
        input_shape=None,
    ):
        check_args(
            "Constrained",
            _RULES,
            target_density=_fractions(target_density),
            target_flops=_fractions(target_flops),
            per_layer=per_layer,
            rank=rank,
            multiplier_lr=multiplier_lr,
            dual_restarts=dual_restarts,
            final_phase=final_phase,
            target_warmup=target_warmup,
        )
        given = [t is not None for t in (target_density, target_flops, target_architecture)]
        if sum(given) != 1:
            raise ValueError(
                "Constrained needs exactly one of target_density (a fraction of the parameters), target_flops (a "
                "fraction of the FLOPs) and target_architecture (the sizes of every block of a transformer), got "
                f"target_density={target_density!r}, target_flops={target_flops!r}, "
                f"target_architecture={target_architecture!r}"
            )
        if (
            target_architecture is not None
            and not hasattr(target_architecture, "items")
            and not _is_target(target_architecture)
        ):
            raise TypeError(
                "Constrained: target_architecture must be a dict of block sizes or a TargetArchitecture, got "
                f"{type(target_architecture).__name__}"
            )
        if target_architecture is not None and per_layer:
            raise ValueError("Constrained: per_layer=True, but a target_architecture already constrains every block")
        if not _target_is_scalar(target_density if target_flops is None else target_flops) and not per_layer:
            raise ValueError(
                "Constrained: a target with one entry per gated layer needs per_layer=True, got "
                f"{target_density if target_flops is None else target_flops!r}"
            )
        _check_arrival(arrival, target_architecture)
        check_factory(multiplier_optimizer)
        if multiplier_optimizer is not None and multiplier_lr is not None:
            raise ValueError(
                f"Constrained: multiplier_lr={multiplier_lr!r} is the step of the projected ascent that "
                "multiplier_optimizer replaces (its optimiser's lr sets the step): give one of them"
            )
        if input_shape is not None:
            input_shape = check_shape("Constrained", "input_shape", input_shape)
        self.target_density, self.target_flops = _kept(target_density), _kept(target_flops)
        self.target_architecture = target_architecture
        self.per_layer, self.rank, self.dual_restarts = per_layer, rank, dual_restarts
        self.arrival = arrival if arrival is None or arrival == EACH else float(arrival)
        self.multiplier_lr = None if multiplier_lr is None else float(multiplier_lr)
        self.multiplier_optimizer = multiplier_optimizer
        self.final_phase, self.target_warmup = float(final_phase), whole(target_warmup)
        self.input_shape = input_shape

    def settings(self):
        return {
            k: getattr(self, k)
            for k in (
                "target_density", "target_flops", "target_architecture", "per_layer", "rank", "arrival",
                "multiplier_lr", "multiplier_optimizer", "dual_restarts", "final_phase", "target_warmup", "input_shape",
            )
        }  # fmt: skip

    def build(self, model, num_data, gate_lr=None, input_shape=None):
        """:class:`~l0bayes.inference.objectives.ConstrainedObjective` for ``model``; ``multiplier_lr=None`` becomes
        ``3 * gate_lr`` (:data:`~l0bayes.inference.objectives.MULTIPLIER_LR` without one; not used with
        ``multiplier_optimizer``), and ``input_shape`` the one given here, else the data's."""
        if self.multiplier_optimizer is not None:
            step = None  # the optimiser's
        elif self.multiplier_lr is not None:
            step = self.multiplier_lr
        else:
            step = MULTIPLIER_LR if gate_lr is None else MULTIPLIER_LR_PER_LR * float(gate_lr)
        shape = self.input_shape if self.input_shape is not None else input_shape
        return ConstrainedObjective(model, num_data, self, multiplier_lr=step, input_shape=shape)


def as_objective(objective):
    """``objective`` as :class:`ObjectiveSettings`: an object of one of its classes as it is, or a name of
    :data:`OBJECTIVES` with its defaults.

    :raises TypeError: for anything else; :class:`ValueError` for another name, or ``"constrained"``, which has no
        default target (build :class:`Constrained` with one).
    """
    if isinstance(objective, ObjectiveSettings):
        return objective
    if isinstance(objective, type) and issubclass(objective, ObjectiveSettings):
        return as_objective(objective.name)
    if not isinstance(objective, str):
        raise TypeError(
            "objective must be 'bayes', 'penalized' or an objective object (Bayes(), Penalized(), "
            f"Constrained(target_density=...)), got {type(objective).__name__} {objective!r}"
        )
    if objective == "bayes":
        return Bayes()
    if objective == "penalized":
        return Penalized()
    if objective == "constrained":
        raise ValueError(
            "objective='constrained' needs its target: objective=Constrained(target_density=...) (or target_flops=, "
            "target_architecture=), from l0bayes.inference"
        )
    raise ValueError(f"objective must be one of {OBJECTIVES} (or an objective object), got {objective!r}")


def _fractions(target):
    """A target as the rules read it: a list or tuple as a float64 array (numbers only), anything else as it is."""
    if isinstance(target, (list, tuple)):
        if not target or not all(isinstance(v, numbers.Real) and not isinstance(v, bool) for v in target):
            raise TypeError(f"Constrained: a target must be a number or a list of numbers, got {target!r}")
        return np.asarray(target, dtype=np.float64)
    return target


def _kept(target):
    """A target as the object keeps it: a copy the caller's later changes do not reach (a list as a tuple)."""
    if isinstance(target, (list, tuple)):
        return tuple(target)
    if torch.is_tensor(target):
        return target.detach().clone()
    if isinstance(target, np.ndarray):
        return target.copy()
    return target


def _target_is_scalar(target):
    if target is None or isinstance(target, numbers.Real):
        return True
    return (target.numel() if torch.is_tensor(target) else np.size(target)) == 1


def _is_target(value):
    from ...pruning.transformer.target import TargetArchitecture

    return isinstance(value, TargetArchitecture)


def _check_arrival(arrival, target_architecture):
    if arrival is None:
        return
    if isinstance(arrival, str):
        if arrival != EACH:
            raise ValueError(f"Constrained: arrival must be a number >= 0, None or {EACH!r}, got {arrival!r}")
        if target_architecture is None:
            raise ValueError(
                f"Constrained: arrival={EACH!r} fixes each constraint of a target_architecture on its own; with a "
                "target fraction there is no constraint per block: give target_architecture, or arrival=None or a "
                "number"
            )
        return
    Rule("a number >= 0, None or 'each'", lambda v: (v >= 0) & np.isfinite(v))("Constrained", "arrival", arrival)


def _plain(settings):
    """Settings compared by value (tensors and arrays as lists)."""
    out = {}
    for k, v in settings.items():
        if torch.is_tensor(v) or isinstance(v, (np.ndarray, list, tuple)) and k.startswith("target_"):
            v = ("array", np.asarray(v.detach().cpu() if torch.is_tensor(v) else v, dtype=np.float64).tolist())
        out[k] = v
    return out
