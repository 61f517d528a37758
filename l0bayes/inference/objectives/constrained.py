r"""The constrained objective: the data term subject to a target size of the pruned model.

A Lagrangian on the expected fraction of parameters or FLOPs that the pruned model keeps (or, for a
transformer, on the fractions of a target architecture: :mod:`~l0bayes.inference.objectives.architecture`),
then a final phase that fixes the gates (:mod:`~l0bayes.inference.objectives.final_phase`).
"""

import math

import torch

from ..._warnings import warn
from ...nn.density import density_names
from ...nn.gates import gate_owners
from ...pruning.size import network_size
from .architecture import ArchitectureConstraints
from .base import Objective, traced_free_energy
from .final_phase import (
    ARRIVAL,
    EACH,
    TRAJECTORY,
    epochs_advice,
    epochs_needed,
    fit_groups,
    group_scores,
)
from .multipliers import MultiplierOptimizer, refuse_other_ascent

__all__ = ["DUAL_RESTARTS", "MULTIPLIER_LR", "MULTIPLIER_LR_PER_LR", "ConstrainedObjective", "measure_name"]

# Defaults of the constrained objective's Lagrangian, chosen by measurement (benchmarks/RESULTS.md,
# "Constrained sparsity").
MULTIPLIER_LR_PER_LR = 3.0  # train(): multiplier_lr = 3 * lr unless given
MULTIPLIER_LR = 0.03  # 3 * 1e-2, the digits learning rate
DUAL_RESTARTS = True


class ConstrainedObjective(Objective):
    r"""Minimise the data term subject to the pruned model keeping at most a target fraction of the dense one.

    The fraction is of parameters (``target_density``) or of FLOPs per example (``target_flops``), counted
    as :func:`~l0bayes.pruning.prune` keeps them: a weight counts only when its input and its output unit
    both survive, through every layer (:mod:`l0bayes.pruning.size`, ``docs/mathematics.md``,
    "Constrained sparsity").

    **Phase 1, the Lagrangian**: gradient descent on the model for
    :math:`\frac1N \text{nll} + \sum_k \mu_k (d_k - \epsilon_k)`, with :math:`d_k` the *expected* fraction
    under :math:`q` (every unit alive with the product of its gates' :math:`q(z \ne 0)`, Eq. 12) of the whole
    network or of layer :math:`k`, and projected gradient ascent :math:`\mu_k \leftarrow \max(0, \mu_k +
    \eta\,(d_k - \epsilon_k))` after every step (``multiplier_lr`` is :math:`\eta`); with ``dual_restarts`` a
    multiplier returns to zero whenever its constraint holds. With ``multiplier_optimizer`` a ``torch.optim``
    optimiser takes that step instead: it ascends (``maximize=True``) the multipliers, one tensor of shape
    ``(1,)`` or ``(L,)``, with gradient :math:`d_k - \epsilon_k`; they are then projected onto :math:`\mu_k \ge 0`
    and restarted as above (:mod:`~l0bayes.inference.objectives.multipliers`). Its state is part of
    :meth:`state_dict`, so a resume continues it exactly.

    **Large models** (Sheared-LLaMA's recipe): the gates' ``log_alpha`` in their own group of the optimiser at a
    step size about :math:`10^4` times the weights' (Adam moves a ``log_alpha`` by about its step size per step,
    so at a language model's step size a gate barely moves while the multipliers grow), and the multipliers
    ascended by Adam at that same step size::

        train(model, ids, ids, objective=Constrained(target_architecture=target, multiplier_optimizer=lambda p:
                  torch.optim.Adam(p, lr=1.0, betas=(0.9, 0.95), maximize=True)),
              optimizer=lambda m: torch.optim.AdamW(parameter_groups(m, gates={"lr": 1.0, "weight_decay": 0.0}),
                  lr=1e-4, betas=(0.9, 0.95)))

    (:func:`~l0bayes.inference.parameter_groups`; without ``multiplier_optimizer`` the multiplier step is three
    times the gates' group's, here 3.0.) On a small model these rates overshoot: on the digits MLP (Adam 1e-2,
    target density 0.1) the gates at 100 times the weights' step size with Adam ascent at 1.0 take the expected
    density to 0.004 within six steps, and the pruned model errs 7.1% against the default's 3.9%; there the default
    projected ascent and Adam ascent at 0.01 to 0.1 give the same error within the seeds' spread
    (``benchmarks/bench_multipliers.py``; ``benchmarks/RESULTS.md``, "Constrained sparsity").

    **Phase 2, the final phase**: the gates are fixed for the last ``final_phase`` of the epochs (from
    :meth:`final_phase_start`). If the Lagrangian has not arrived by then (an expected fraction more than
    :data:`ARRIVAL` above its target), ``train()`` warns in one line how many more epochs it needed at its
    recent pace; with ``arrival`` the gates wait for it instead, until the last epoch at the latest (measured:
    the same groups are chosen, with fewer epochs left to train them).
    The groups are ranked (``rank``: ``"log_alpha"``, the order of Eq. 12 and 13, or ``"norm"``,
    :math:`q(z_g \ne 0)` times the group's weight norm relative to its layer's median) and, greedily in that
    order, each is kept when the pruned model's fractions still fit within the targets (at least one gate
    per layer). Kept gates get ``log_alpha = +fixed_log_alpha`` and the others ``-fixed_log_alpha``, so that
    the training gates are 1 or 0 except with probability below
    :math:`\sigma(\beta\log(-\gamma/\zeta) - 50) \approx 10^{-21}`, and the Eq. 13 gates are exactly these.
    The weights then train for the data term alone, with the test-time architecture.

    :param settings: the :class:`~l0bayes.inference.objectives.Constrained` object whose settings (the target,
        ``per_layer``, ``rank``, ``arrival``, ``dual_restarts``, ``final_phase``, ``target_warmup``) this run
        follows; they are defined, checked and documented there. Build one with its
        :meth:`~l0bayes.inference.objectives.Constrained.build`.
    :param multiplier_lr: :math:`\eta`, the ascent step of the multipliers per training step (``None`` when the
        settings' ``multiplier_optimizer`` steps them; then not used).
    :param input_shape: one example's shape (no batch dimension), for FLOPs.

    With ``arrival="each"`` each constraint's gates are fixed on their own, to exactly its ``k`` top-ranked
    groups, after the first step at which its expected fraction is at most its target (its multiplier is then
    zero): the blocks that arrive first do not go on past their targets while the others catch up (measured on
    SmolLM2: Adam's momentum and the multipliers built up meanwhile carried early blocks to half of their target
    width). Once every constraint is fixed (:attr:`all_fixed`) the gated model is the pruned architecture; the
    constraints not fixed by :meth:`final_phase_start` are fixed there, wherever they are. With ``target_warmup``
    :math:`W`, at step :math:`s` (from 0) the constraint is :math:`d_k \le 1 - (1 - \epsilon_k) \min(1, (s + 1) /
    W)`; the final phase, ``arrival`` and ``"each"`` judge arrival against the final target.
    """

    name = "constrained"
    fixed_log_alpha = 50.0

    def __init__(self, model, num_data, settings, multiplier_lr=MULTIPLIER_LR, input_shape=None):
        super().__init__(model, num_data)
        self.settings = settings
        target_density, target_flops = settings.target_density, settings.target_flops
        target_architecture, per_layer, arrival = settings.target_architecture, settings.per_layer, settings.arrival
        each = isinstance(arrival, str) and arrival == EACH
        self.what = "parameters" if target_flops is None else "flops"
        self.target_name = "target_density" if target_flops is None else "target_flops"
        target = target_density if target_flops is None else target_flops
        owners = gate_owners(model)
        self.gates = [gate for _, gate in owners]
        self.layers = [layer for layer, _ in owners]
        self.layer_names = density_names(model)
        self.per_layer = bool(per_layer)
        self.architecture = None
        if target_architecture is not None:  # one constraint per block and size named, and one on the blocks
            self.architecture = ArchitectureConstraints(model, target_architecture, self.layers, self.fixed_log_alpha)
            self.what, self.target_name = "architecture", "target_architecture"
            target = self.architecture.targets
        count = len(target) if self.architecture is not None else len(self.gates) if self.per_layer else 1
        targets = torch.as_tensor(target, dtype=torch.float64).reshape(-1)
        if targets.numel() == 1:
            targets = targets.expand(count)
        if targets.numel() != count:
            raise ValueError(f"{self.target_name} has {targets.numel()} entries, the model {count} gated layers")
        if self.what == "flops" and input_shape is None and not _has_example_inputs(model):
            raise ValueError(
                "target_flops needs the shape of one example, without the batch dimension: training data as tensors "
                "give it, else Constrained(input_shape=...)"
            )
        self.size = network_size(model, input_shape)
        self.has_flops = self.size.calls is not None
        device = self.gates[0].log_alpha.device
        self.target_values = targets.tolist()  # exact, for the final phase's budget
        self.final_targets = targets.to(torch.float32).to(device)
        self.target_warmup = settings.target_warmup
        self.updates = 0  # the steps taken, for the warm-up of the targets
        self.targets = self.final_targets.clone()  # the targets of the next step (in place: a captured step reads it)
        self._warm_targets()
        self.multiplier_lr = None if settings.multiplier_optimizer is not None else float(multiplier_lr)
        self.dual_restarts = settings.dual_restarts
        self.final_phase = settings.final_phase
        self.rank = settings.rank
        self.each = each
        self.arrival = None if arrival is None or self.each else float(arrival)
        self.fixed_each = {}  # with arrival="each": constraint index -> the kept-gate masks of its holders
        self.mu = torch.zeros(count, device=device)  # (1,) for one constraint, never 0-d: FSDP2 refuses scalars
        factory = settings.multiplier_optimizer
        self.ascent = None if factory is None else MultiplierOptimizer(factory, self.mu)
        self.fixed = None  # the kept-gate masks during the final phase
        self.fixed_at = None  # the epoch (0-based) at which they were fixed
        self.forced = False  # whether they were fixed at the last epoch without the Lagrangian having arrived
        self.density_at_fix = None  # the expected fraction(s) when the gates were fixed
        self.epochs = None  # the number of epochs of the run, from start_epoch
        self.trajectory = []  # (epoch, expected fractions) at the start of the last few epochs

    def expected(self):
        """The expected fraction(s) under :math:`q` that the constraints bound: shape ``(1,)`` or ``(L,)`` (with a
        target architecture: one per constraint, the expected fraction of its gates kept)."""
        if self.architecture is not None:
            return self.architecture.expected()
        return self.size.fraction(self.what, "expected", self.per_layer).reshape(-1)

    def test_time(self, what=None, per_layer=None):
        """The pruned model's fraction(s) with the Eq. 13 gates (a float, or ``{layer: fraction}``)."""
        return self.size.fraction(what or self.what, "test", self.per_layer if per_layer is None else per_layer)

    # ------------------------------------------------------------------ phase 1
    def step_with_data(self, x, y):
        if self.fused:
            nll, _ = self.model.penalized_loss(x, y, self.num_data)
        else:
            nll = traced_free_energy(self.model, x, y, self.num_data).nll
        violation = self.expected().to(nll.dtype) - self.targets.to(nll.dtype)
        value = nll / self.num_data + (self.mu.to(nll.dtype) * violation).sum()
        return nll, value, violation, nll

    @torch.no_grad()
    def update(self, violation):
        if self.fixed is not None:
            self._project()
            self._advance()
            return
        if self.architecture is not None:  # the gates the target leaves open stay open
            self.architecture.hold_open()
        # In place: a step captured as a CUDA graph (l0bayes.inference.graphed) reads this very tensor.
        violation = violation.to(self.mu.dtype)
        if self.ascent is None:
            self.mu.add_(violation, alpha=self.multiplier_lr).clamp_(min=0.0)
        else:  # the optimiser's step on this very tensor, then the same projection
            self.ascent.step(violation)
            self.mu.clamp_(min=0.0)
        if self.dual_restarts:
            self.mu.masked_fill_(violation <= 0, 0.0)
        if self.each:  # arrived at the final target (the warm-up's current one may lie above it)
            self._fix_arrived(violation + (self.targets - self.final_targets).to(violation.dtype))
        self._advance()

    def _advance(self):
        """One step taken: the warm-up's targets of the next step."""
        self.updates += 1
        self._warm_targets()

    def _warm_targets(self):
        """Set the targets of the next step: ``1 - (1 - target) * min(1, (step + 1) / target_warmup)``."""
        if self.target_warmup == 0:
            return
        share = min(1.0, (self.updates + 1) / self.target_warmup)
        self.targets.copy_(1.0 - (1.0 - self.final_targets) * share)

    def _fix_arrived(self, violation):
        """``arrival="each"``: fix the gates of every constraint whose expected fraction was at most its target at this
        step (one read from the device), keep those fixed before fixed, and zero their multipliers."""
        arrived = (violation <= 0).tolist()
        for i, (choice, done) in enumerate(zip(self.architecture.constrained, arrived, strict=True)):
            if done and i not in self.fixed_each:
                scores = [group_scores(holder, holder.gate, self.rank) for holder in choice.holders]
                self.fixed_each[i] = [keep.cpu() for keep in choice.masks(scores)]
        if self.fixed_each:
            self.mu[torch.tensor(sorted(self.fixed_each), device=self.mu.device)] = 0.0
            self._project_each()

    @property
    def all_fixed(self):
        """Whether the gates of every constraint are fixed (with ``arrival="each"``, or in the final phase)."""
        if self.fixed is not None:
            return True
        return self.each and len(self.fixed_each) == len(self.architecture.constrained)

    # ------------------------------------------------------------------ phase 2
    def final_phase_start(self, epochs):
        """``epochs - ceil(final_phase * epochs)``: the earliest epoch (0-based) with fixed gates (``None`` for ``0``).

        The gates are fixed there if the Lagrangian has arrived (:data:`ARRIVAL`), else at the first later
        epoch where it has, and at the last epoch at the latest.
        """
        if self.final_phase <= 0 or epochs <= 0:
            return None
        return int(epochs) - math.ceil(self.final_phase * int(epochs))

    @property
    def final_phase_began(self):
        return self.fixed_at

    def arrived(self, expected):
        """Whether every expected fraction is at most its target plus ``arrival`` (always, with ``arrival=None``)."""
        if self.arrival is None:
            return True
        return all(d <= t + self.arrival for d, t in zip(expected, self.target_values, strict=True))

    def start_epoch(self, epoch, epochs):
        self.epochs = int(epochs)
        start = self.final_phase_start(epochs)
        if self.fixed is not None:
            return
        with torch.no_grad():
            expected = self.expected().tolist()
        self.trajectory = [*self.trajectory[-(TRAJECTORY - 1) :], (int(epoch), expected)]
        if start is None or epoch < start:
            return
        if not self.arrived(expected) and epoch < epochs - 1:
            return  # (only with `arrival`: wait for the Lagrangian)
        self.density_at_fix = expected
        self.forced = self.arrival is not None and not self.arrived(expected)
        if any(d > t + ARRIVAL for d, t in zip(expected, self.target_values, strict=True)):
            self._warn_not_arrived(epoch, epochs)
        self.fixed = self.keep_masks()
        self.fixed_at = int(epoch)
        with torch.no_grad():
            self._project()

    def _warn_not_arrived(self, epoch, epochs):
        """One line: the Lagrangian has not reached the target when the gates are fixed, and what to change."""
        far = max(zip(self.density_at_fix, self.target_values, strict=True), key=lambda g: g[0] - g[1])
        d, t = far
        advice = epochs_advice(epochs_needed(self.trajectory, self.target_values, ARRIVAL), epochs)
        if self.updates + 1 < self.target_warmup:
            advice += f" (the target warm-up had {self.target_warmup - self.updates - 1} of its steps to go)"
        warn(
            f"constrained: the gates are fixed at epoch {epoch + 1} of {epochs} before the Lagrangian arrived: "
            f"expected {measure_name(self.what)} {d:.3f} against the target {t:.3f}, so the final phase cuts the "
            f"difference at once, which costs accuracy: {advice}",
            UserWarning,
        )

    @torch.no_grad()
    def keep_masks(self):
        """The gates kept in the final phase: greedily by rank, each group that keeps the pruned model within target
        (with a target architecture: exactly the target's number of top-ranked groups, units and blocks)."""
        scores = [group_scores(layer, gate, self.rank) for layer, gate in zip(self.layers, self.gates, strict=True)]
        if self.architecture is not None:
            return self.architecture.keep_masks(scores)
        masks = fit_groups(self.size, self.layers, scores, self.what, self.target_values, self.per_layer)
        values = {id(layer): m.double() for layer, m in zip(self.layers, masks, strict=True)}
        achieved = self.size.fraction_at(values, self.what, self.per_layer)
        over = [(a, t) for a, t in zip(achieved, self.target_values, strict=True) if a > t + 1e-12]
        if over:
            a, t = max(over, key=lambda g: g[0] - g[1])
            warn(
                f"constrained: the target {measure_name(self.what)} {t:.3f} cannot be met: with one group per gated "
                f"layer the pruned model still keeps {a:.3f} (what no gate can remove: ungated layers, channels that "
                "enter a residual addition); lower the target's ambition or gate more layers",
                UserWarning,
            )
        return masks

    @torch.no_grad()
    def finalize_parameters(self):
        """In the final phase, the fixed gates (an average of parameters would otherwise blur them)."""
        if self.fixed is not None:
            self._project()
        elif self.architecture is not None:
            self.architecture.hold_open()
            self._project_each()

    def _project(self):
        for gate, keep in zip(self.gates, self.fixed, strict=True):
            self._fix(gate, keep)

    def _project_each(self):
        for i, masks in self.fixed_each.items():
            for holder, keep in zip(self.architecture.constrained[i].holders, masks, strict=True):
                self._fix(holder.gate, keep)

    def _fix(self, gate, keep):
        """``log_alpha = +fixed_log_alpha`` where ``keep``, ``-fixed_log_alpha`` elsewhere (in place)."""
        value = torch.full_like(gate.log_alpha, -self.fixed_log_alpha)
        gate.log_alpha.copy_(value.masked_fill_(keep.to(value.device), self.fixed_log_alpha))

    # ------------------------------------------------------------------ record and state
    @torch.no_grad()
    def set_multipliers(self, values):
        """Set the multipliers in place (a captured step keeps reading the same tensor)."""
        values = torch.as_tensor(values)
        if values.shape != self.mu.shape:
            raise ValueError(f"the checkpoint has {values.numel()} multipliers, this run {self.mu.numel()}")
        self.mu.copy_(values)

    def multipliers(self):
        return self.mu.clone()

    def record(self):
        with torch.no_grad():
            expected = self.expected().tolist()
        out = {
            "multipliers": self.mu.tolist(),
            "constraint": expected,
            self.target_name: self.architecture.target.as_dict()
            if self.architecture is not None
            else _scalar_or_list(self.target_values, self.per_layer),
            "test_time_density": self.test_time("parameters", False),
            "test_time_density_per_layer": self.test_time("parameters", True),
            "gates_fixed": self.fixed is not None,
            "constraints_fixed": len(self.targets) if self.fixed is not None else len(self.fixed_each),
            "final_phase_forced": self.forced,
            "density_at_final_phase": None
            if self.density_at_fix is None
            else _scalar_or_list(self.density_at_fix, self.per_layer),
        }
        if self.target_warmup:
            out["target_now"] = _scalar_or_list(self.targets.tolist(), self.per_layer or self.architecture is not None)
        if self.has_flops:
            out["test_time_flops"] = self.test_time("flops", False)
            out["test_time_flops_per_layer"] = self.test_time("flops", True)
        return out

    def state_dict(self):
        return {
            "name": self.name,
            "mu": self.mu.detach().cpu().clone(),
            "fixed": None if self.fixed is None else [m.cpu().clone() for m in self.fixed],
            "fixed_at": self.fixed_at,
            "fixed_each": {i: [m.cpu().clone() for m in masks] for i, masks in self.fixed_each.items()},
            "forced": self.forced,
            "epochs": self.epochs,
            "checked_from": None if self.epochs is None else self.final_phase_start(self.epochs),
            "trajectory": list(self.trajectory),
            "targets": self.final_targets.cpu().clone(),
            "updates": self.updates,
            "target_warmup": self.target_warmup,
            "what": self.what,
            "per_layer": self.per_layer,
            "density_at_fix": self.density_at_fix,
            "architecture": None if self.architecture is None else self.architecture.target.as_dict(),
            "multiplier_optimizer": None if self.ascent is None else self.ascent.state_dict(),
        }

    def load_state_dict(self, state):
        super().load_state_dict(state)
        what = state.get("what", "parameters")
        if (
            what != self.what
            or bool(state["per_layer"]) != self.per_layer
            or not torch.equal(state["targets"], self.final_targets.cpu())
        ):
            if what == self.what == "architecture" and state.get("architecture") is not None:
                raise ValueError(
                    f"the checkpoint was trained for target_architecture={state['architecture']}, this run asks "
                    f"target_architecture={self.architecture.target.as_dict()}"
                )
            raise ValueError(
                f"the checkpoint was trained for target {measure_name(what)} {state['targets'].tolist()} "
                f"(per_layer={bool(state['per_layer'])}), this run asks target {measure_name(self.what)} "
                f"{self.final_targets.tolist()} (per_layer={self.per_layer})"
            )
        if int(state.get("target_warmup", 0)) != self.target_warmup:  # (absent from checkpoints of earlier versions)
            raise ValueError(
                f"the checkpoint was trained with target_warmup={int(state.get('target_warmup', 0))}, this run asks "
                f"target_warmup={self.target_warmup}"
            )
        saved = state.get("multiplier_optimizer")  # (absent from checkpoints of earlier versions: projected ascent)
        refuse_other_ascent(saved, self.ascent)
        self.set_multipliers(state["mu"])
        if saved is not None:
            self.ascent.load_state_dict(saved)
        self.updates = int(state.get("updates", 0))
        self._warm_targets()
        self.fixed = None if state["fixed"] is None else [m.to(self.mu.device) for m in state["fixed"]]
        self.fixed_at = state.get("fixed_at")  # (absent from checkpoints of earlier versions)
        each = (state.get("fixed_each") or {}) if self.each else {}  # (absent from checkpoints of earlier versions)
        self.fixed_each = {int(i): [m.to(self.mu.device) for m in masks] for i, masks in each.items()}
        self.forced = bool(state.get("forced", False))
        self.trajectory = [tuple(t) for t in state.get("trajectory", [])]
        self.density_at_fix = state.get("density_at_fix")  # (absent from checkpoints of earlier versions)


def measure_name(what):
    """The words for what a target of ``what`` (``"parameters"``, ``"flops"`` or ``"architecture"``) bounds."""
    if what == "architecture":
        return "fraction of a block's heads, units (or of the blocks) kept"
    return "density" if what == "parameters" else "FLOPs"


def _has_example_inputs(model):
    net = getattr(model, "net", model)
    return getattr(net, "_l0_example_inputs", None) is not None


def _scalar_or_list(values, per_layer):
    return values if per_layer else values[0]
