r"""One small estimator object per training objective, behind the one loop of :func:`~l0bayes.inference.train`.

As Pyro's ``SVI`` holds an ELBO, the loop holds an :class:`Objective`. Each knows:

* :meth:`~Objective.step`: its loss on a minibatch, in nats (data term scaled by ``N/B``), and the
  differentiable per-example value the optimiser minimises, plus any step statistics (a tensor or
  ``None``) that must be averaged over data-parallel ranks before :meth:`~Objective.update`;
* :meth:`~Objective.update`: what happens after the optimiser's step (the multiplier ascent of the
  constrained objective, its projection of the gates);
* :meth:`~Objective.record`: its entries of the per-epoch history;
* :meth:`~Objective.state_dict` / :meth:`~Objective.load_state_dict`: its state in a checkpoint.

The objectives (``docs/mathematics.md``, "The variational free energy" and "Constrained sparsity"):

* :class:`BayesObjective`: the free energy of Eq. 21 (``TraceMeanField_ELBO``, or the model's own
  ``bayes_loss``);
* :class:`PenalizedObjective`: Eq. 22, the same without the gate KL;
* :class:`ConstrainedObjective`: the data term subject to a target density (one global constraint
  or one per gated layer), by a Lagrangian on the expected density and a final phase that fixes the
  gates so that the *test-time* density meets the target.
"""

import math
import warnings

import torch
from pyro.infer import TraceMeanField_ELBO

from ..nn.density import density_names, expected_density, test_time_density
from ..nn.gates import gates_of
from .errors import NonFiniteLossError
from .free_energy import free_energy

__all__ = [
    "FINAL_PHASE",
    "MULTIPLIER_LR",
    "MULTIPLIER_LR_PER_LR",
    "BayesObjective",
    "ConstrainedObjective",
    "Objective",
    "PenalizedObjective",
    "constrained_rows",
    "constrained_summary",
    "make_objective",
]

# Defaults of the constrained objective, chosen by measurement (benchmarks/RESULTS.md, "Constrained sparsity").
MULTIPLIER_LR_PER_LR = 3.0  # train(): multiplier_lr = 3 * lr unless given
MULTIPLIER_LR = 0.03  # 3 * 1e-2, the digits learning rate
DUAL_RESTARTS = True
FINAL_PHASE = 0.1
#: The final phase warns when the expected density it starts from exceeds the target by more than this.
FINAL_PHASE_GAP = 0.1


class Objective:
    """Base class: the loss of one minibatch, the per-epoch record and the checkpoint state of one objective."""

    name = None
    kl = False  # whether the recorded free energy includes the gate KL

    def __init__(self, model, num_data):
        self.model = model
        self.num_data = int(num_data)

    @property
    def fused(self):
        """Whether :meth:`step` uses the model's own fused loss (which compiles) rather than Pyro's traces."""
        return hasattr(self.model, "penalized_loss")

    def start_epoch(self, epoch, epochs):
        """Called before epoch ``epoch`` (0-based) of ``epochs``."""

    def final_phase_start(self, epochs):
        """The epoch (0-based) from which a run of ``epochs`` epochs trains in a final phase, or ``None``.

        A resumed run that changes the number of epochs must not carry a final phase begun for another
        number into its continuation (:func:`~l0bayes.inference.train`).
        """
        return None

    @property
    def final_phase_began(self):
        """The epoch (0-based) at which this run's final phase began, or ``None`` while it has not."""
        return None

    def step(self, x, y):
        """``(loss in nats, differentiable per-example objective, step statistics or None)`` on a minibatch."""
        raise NotImplementedError

    def update(self, statistics):
        """After the optimiser's step, with the step statistics averaged over ranks."""

    def record(self):
        """This objective's entries of the end-of-epoch history record."""
        return {}

    def finalize_parameters(self):
        """Make the model's parameters obey this objective's hard constraints (e.g. after parameter averaging)."""

    def multipliers(self):
        """The Lagrange multipliers (a zero tensor of one entry for the unconstrained objectives)."""
        p = next(self.model.parameters())
        return torch.zeros(1, device=p.device)

    def state_dict(self):
        """What a checkpoint needs to continue this objective exactly."""
        return {"name": self.name}

    def load_state_dict(self, state):
        """Restore :meth:`state_dict`."""
        if state.get("name", self.name) != self.name:
            raise ValueError(f"the checkpoint was trained with objective {state['name']!r}, not {self.name!r}")


class BayesObjective(Objective):
    r"""SVI on the free energy of Eq. 21: data term, analytic gate KL (Eq. 28) and code cost.

    Uses the model's ``bayes_loss`` when it has one (the same value as ``TraceMeanField_ELBO`` for the
    same draws), else ``TraceMeanField_ELBO().differentiable_loss`` on its ``model`` and ``guide``.
    """

    name = "bayes"
    kl = True

    def __init__(self, model, num_data):
        super().__init__(model, num_data)
        self.elbo = None if hasattr(model, "bayes_loss") else TraceMeanField_ELBO()

    @property
    def fused(self):
        return self.elbo is None

    def step(self, x, y):
        if self.elbo is None:
            loss = sum(self.model.bayes_loss(x, y, self.num_data))
        else:
            loss = _pyro_loss(self.elbo.differentiable_loss, self.model, x, y, self.num_data)
        return loss, loss / self.num_data, None


class PenalizedObjective(Objective):
    """Eq. 22: the data term plus the code cost (no gate KL); the model's ``penalized_loss`` when it has one."""

    name = "penalized"

    def step(self, x, y):
        if self.fused:
            nll, cost = self.model.penalized_loss(x, y, self.num_data)
            loss = nll + cost
        else:
            loss = _free_energy(self.model, x, y, self.num_data).total
        return loss, loss / self.num_data, None


class ConstrainedObjective(Objective):
    r"""Minimise the data term subject to a density of at most ``target_density`` (the slides' constrained form).

    **Phase 1, the Lagrangian** (``docs/mathematics.md``, "Constrained sparsity"): gradient descent on the
    model for :math:`\frac1N \text{nll} + \sum_k \mu_k (d_k - \epsilon_k)`, with :math:`d_k` the expected
    density (Eq. 12, 16) of the whole network or of layer :math:`k`, and projected gradient ascent
    :math:`\mu_k \leftarrow \max(0, \mu_k + \eta\,(d_k - \epsilon_k))` after every step (``multiplier_lr``
    is :math:`\eta`); with ``dual_restarts`` a multiplier returns to zero whenever its constraint holds.

    **Phase 2, the final phase** (the last ``final_phase`` fraction of the epochs): the gates are fixed.
    In each constraint's group of gates the gates are ranked by ``log_alpha`` (the order of both Eq. 12
    and Eq. 13) and the largest set of top-ranked groups whose parameters fit within the target is kept
    (at least one gate per layer); kept gates get ``log_alpha = +fixed_log_alpha`` and the others
    ``-fixed_log_alpha``, so that the training gates are 1 or 0 except with probability below
    :math:`\sigma(\beta\log(-\gamma/\zeta) - 50) \approx 10^{-21}`, and the Eq. 13 gates are exactly
    these. The weights then train for the data term alone, with the test-time architecture.
    The test-time density then lies below the target by less than one group's share of parameters.

    :param target_density: :math:`\epsilon` in ``(0, 1]``: a float, or with ``per_layer`` one per gated layer.
    :param bool per_layer: one constraint (and multiplier) per gated layer instead of one for the network.
    :param multiplier_lr: :math:`\eta`, the ascent step of the multipliers per training step
        (:func:`~l0bayes.inference.train` uses ``3 * lr`` unless told otherwise).
    :param bool dual_restarts: reset a multiplier to zero whenever its constraint is satisfied.
    :param final_phase: fraction of the epochs (rounded up, at least one epoch when positive) with fixed gates;
        ``0`` trains on the Lagrangian throughout (the expected density then meets the target, the
        test-time density need not).
    """

    name = "constrained"
    fixed_log_alpha = 50.0

    def __init__(
        self,
        model,
        num_data,
        target_density,
        per_layer=False,
        multiplier_lr=MULTIPLIER_LR,
        dual_restarts=DUAL_RESTARTS,
        final_phase=FINAL_PHASE,
    ):
        super().__init__(model, num_data)
        self.gates = [g for _, g in gates_of(model)]
        self.layer_names = density_names(model)
        self.per_layer = bool(per_layer)
        count = len(self.gates) if self.per_layer else 1
        targets = torch.as_tensor(target_density, dtype=torch.float64).reshape(-1)
        if targets.numel() == 1:
            targets = targets.expand(count)
        if targets.numel() != count:
            raise ValueError(f"target_density has {targets.numel()} entries, the model {count} gated layers")
        if not bool(((targets > 0) & (targets <= 1)).all()):
            raise ValueError(f"target_density must lie in (0, 1], got {target_density!r}")
        device = self.gates[0].log_alpha.device
        self.target_values = targets.tolist()  # exact, for the final phase's budget
        self.targets = targets.to(torch.float32).to(device)
        self.multiplier_lr = float(multiplier_lr)
        self.dual_restarts = bool(dual_restarts)
        self.final_phase = float(final_phase)
        self.mu = torch.zeros(count, device=device)
        self.fixed = None  # the kept-gate masks during the final phase
        self.fixed_at = None  # the epoch (0-based) at which they were fixed
        self.density_at_fix = None  # the expected density(ies) when the gates were fixed

    # ------------------------------------------------------------------ phase 1
    def step(self, x, y):
        if self.fused:
            nll, _ = self.model.penalized_loss(x, y, self.num_data)
        else:
            nll = _free_energy(self.model, x, y, self.num_data).nll
        violation = expected_density(self.model, self.per_layer) - self.targets.to(nll.dtype)
        value = nll / self.num_data + (self.mu.to(nll.dtype) * violation).sum()
        return nll, value, violation

    @torch.no_grad()
    def update(self, violation):
        if self.fixed is not None:
            self._project()
            return
        violation = violation.to(self.mu.dtype)
        self.mu = (self.mu + self.multiplier_lr * violation).clamp_(min=0.0)
        if self.dual_restarts:
            self.mu = torch.where(violation <= 0, torch.zeros_like(self.mu), self.mu)

    # ------------------------------------------------------------------ phase 2
    def final_phase_start(self, epochs):
        """``epochs - ceil(final_phase * epochs)``: the first epoch (0-based) with fixed gates (``None`` for ``0``)."""
        if self.final_phase <= 0 or epochs <= 0:
            return None
        return int(epochs) - math.ceil(self.final_phase * int(epochs))

    @property
    def final_phase_began(self):
        return self.fixed_at

    def start_epoch(self, epoch, epochs):
        start = self.final_phase_start(epochs)
        if self.fixed is None and start is not None and epoch >= start:
            with torch.no_grad():
                self.density_at_fix = expected_density(self.model, self.per_layer).tolist()
            self._warn_if_far(epoch, epochs)
            self.fixed = self.keep_masks()
            self.fixed_at = int(epoch)
            with torch.no_grad():
                self._project()

    def _warn_if_far(self, epoch, epochs):
        """Warn when the Lagrangian phase ended far above the target: the final phase then prunes a lot at once."""
        far = _largest_gap(self.density_at_fix, self.target_values)
        if far is not None:
            d, t = far
            warnings.warn(
                f"constrained: the gates are fixed for the final phase (epoch {epoch + 1} of {epochs}) at expected "
                f"density {d:.3f} against the target {t:.3f}; the final phase removes the difference at once, "
                "which can cost much accuracy: train more epochs or raise multiplier_lr",
                UserWarning,
                stacklevel=7,  # the caller of train() (train, _train, fit, the epochs loop, start_epoch, this)
            )

    @torch.no_grad()
    def keep_masks(self):
        """The gates kept in the final phase: per constraint, the top-``log_alpha`` groups that fit in the target."""
        if self.per_layer:
            return [_top_groups([g], t)[0] for g, t in zip(self.gates, self.target_values, strict=True)]
        return _top_groups(self.gates, self.target_values[0])

    @torch.no_grad()
    def finalize_parameters(self):
        """In the final phase, the fixed gates (an average of parameters would otherwise blur them)."""
        if self.fixed is not None:
            self._project()

    def _project(self):
        for gate, keep in zip(self.gates, self.fixed, strict=True):
            value = torch.full_like(gate.log_alpha, -self.fixed_log_alpha)
            gate.log_alpha.copy_(value.masked_fill_(keep.to(value.device), self.fixed_log_alpha))

    # ------------------------------------------------------------------ record and state
    def multipliers(self):
        return self.mu

    def record(self):
        with torch.no_grad():
            expected = expected_density(self.model, self.per_layer).tolist()
        return {
            "multipliers": self.mu.tolist(),
            "constraint": expected,
            "target_density": _scalar_or_list(self.target_values, self.per_layer),
            "test_time_density": test_time_density(self.model),
            "test_time_density_per_layer": test_time_density(self.model, per_layer=True),
            "gates_fixed": self.fixed is not None,
            "density_at_final_phase": None
            if self.density_at_fix is None
            else _scalar_or_list(self.density_at_fix, self.per_layer),
        }

    def state_dict(self):
        return {
            "name": self.name,
            "mu": self.mu.detach().cpu().clone(),
            "fixed": None if self.fixed is None else [m.cpu().clone() for m in self.fixed],
            "fixed_at": self.fixed_at,
            "targets": self.targets.cpu().clone(),
            "per_layer": self.per_layer,
            "density_at_fix": self.density_at_fix,
        }

    def load_state_dict(self, state):
        super().load_state_dict(state)
        if bool(state["per_layer"]) != self.per_layer or not torch.equal(state["targets"], self.targets.cpu()):
            raise ValueError(
                f"the checkpoint was trained for target density {state['targets'].tolist()} "
                f"(per_layer={bool(state['per_layer'])}), this run asks {self.targets.tolist()} "
                f"(per_layer={self.per_layer})"
            )
        self.mu = state["mu"].to(self.mu.device)
        self.fixed = None if state["fixed"] is None else [m.to(self.mu.device) for m in state["fixed"]]
        self.fixed_at = state.get("fixed_at")  # (absent from checkpoints of earlier versions)
        self.density_at_fix = state.get("density_at_fix")  # (absent from checkpoints of earlier versions)


def _top_groups(gates, target):
    """Masks keeping the top-``log_alpha`` groups of ``gates`` whose parameters fit in ``target`` of them all.

    Greedy in the order of ``log_alpha``: a group that does not fit is skipped and smaller ones after it
    may still fit. The best gate of every layer is kept even if that exceeds the target (an empty
    layer would disconnect the network).
    """
    sizes = torch.cat([torch.full((g.num_gates,), g.group_size, dtype=torch.float64) for g in gates])
    scores = torch.cat([g.log_alpha.detach().cpu().double() for g in gates])
    layer = torch.cat([torch.full((g.num_gates,), k) for k, g in enumerate(gates)])
    keep = torch.zeros(scores.numel(), dtype=torch.bool)
    for k in range(len(gates)):  # the best gate of every layer first
        idx = (layer == k).nonzero().squeeze(1)
        keep[idx[scores[idx].argmax()]] = True
    budget = target * float(sizes.sum()) - float(sizes[keep].sum())
    for i in torch.argsort(scores, descending=True, stable=True).tolist():
        if not keep[i] and sizes[i] <= budget + 1e-9 * float(sizes.sum()):
            keep[i] = True
            budget -= float(sizes[i])
    return list(keep.split([g.num_gates for g in gates]))


def _largest_gap(densities, targets):
    """``(density, target)`` of the constraint furthest above its target, if by more than ``FINAL_PHASE_GAP``."""
    far = [(d, t) for d, t in zip(densities, targets, strict=True) if d - t > FINAL_PHASE_GAP]
    return max(far, key=lambda g: g[0] - g[1]) if far else None


def _scalar_or_list(values, per_layer):
    return values if per_layer else values[0]


def _pyro_loss(loss_fn, model, x, y, num_data):
    """A Pyro loss; a Pyro validation error raised because a parameter went non-finite becomes that error."""
    try:
        return loss_fn(model.model, model.guide, x, y, num_data)
    except ValueError as err:
        names = [n for n, p in model.named_parameters() if not bool(torch.isfinite(p).all())]
        if names:
            raise NonFiniteLossError(f"parameters {names} are NaN or infinite ({str(err).splitlines()[0]})") from None
        raise


def _free_energy(model, x, y, num_data):
    """The terms of Eq. 22 (no gate KL) for one draw, by tracing the model's ``model`` and ``guide``."""
    return _pyro_loss(lambda m, g, *a: free_energy(m, g, *a, kl=False), model, x, y, num_data)


def make_objective(objective, model, num_data, **constrained):
    """The :class:`Objective` named ``objective`` (``"bayes"``, ``"penalized"`` or ``"constrained"``)."""
    if objective == "bayes":
        return BayesObjective(model, num_data)
    if objective == "penalized":
        return PenalizedObjective(model, num_data)
    return ConstrainedObjective(model, num_data, **constrained)


def constrained_summary(
    model,
    target_density,
    per_layer=False,
    multipliers=None,
    tolerance=0.02,
    density_at_final_phase=None,
    history=None,
):
    """What a constrained run achieved at test time, and one-line warnings when it missed.

    :param model: the :class:`~l0bayes.inference.TrainResult` of the run (its model, multipliers and
        history are then used), or the trained network (or model) holding the gates.
    :param multipliers: the run's final multipliers (``TrainResult.multipliers``), copied into the summary.
    :param density_at_final_phase: the expected density when the gates were fixed (the history's
        ``density_at_final_phase``); by default read from the history. A warning says when it exceeded
        its target by more than ``FINAL_PHASE_GAP``.
    :param history: the run's history (``TrainResult.history``) when ``model`` is not a ``TrainResult``.
    :returns: ``{"target_density", "test_time_density", "test_time_density_per_layer", "warnings"}``
        (and ``"multipliers"`` when known): the target (a float, or ``{layer: target}`` with
        ``per_layer``), the test-time density of the network and of each gated layer
        (:func:`~l0bayes.nn.density.test_time_density`, keyed by :func:`~l0bayes.nn.density.density_names`),
        and a list of one-line warnings: a constraint more than ``tolerance`` off its target, a layer with no
        gate open, a final phase that started far above the target.
    """
    if not isinstance(model, torch.nn.Module) and hasattr(model, "history") and hasattr(model, "model"):
        history = model.history if history is None else history
        multipliers = model.multipliers if multipliers is None else multipliers
        model = model.model
    if density_at_final_phase is None and history:
        started = [r["density_at_final_phase"] for r in history if r.get("density_at_final_phase") is not None]
        density_at_final_phase = started[-1] if started else None
    names = density_names(model)
    overall = test_time_density(model)
    layers = test_time_density(model, per_layer=True)
    warnings = []
    if per_layer:
        targets = torch.as_tensor(target_density, dtype=torch.float64).reshape(-1).expand(len(names)).tolist()
        target_out = dict(zip(names, targets, strict=True))
        checks = [(f"layer {n}", layers[n], t) for n, t in target_out.items()]
    else:
        target_out = float(target_density)
        checks = [("network", overall, target_out)]
    for what, achieved, target in checks:
        if abs(achieved - target) > tolerance:
            warnings.append(
                f"{what}: test-time density {achieved:.3f} is more than {tolerance:g} off its target {target:.3f}"
            )
    warnings += [f"layer {n} ended empty: no gate is open at test time" for n, d in layers.items() if d == 0]
    if density_at_final_phase is not None:
        started = torch.as_tensor(density_at_final_phase, dtype=torch.float64).reshape(-1).tolist()
        far = _largest_gap(started, [t for _, _, t in checks])
        if far is not None:
            d, t = far
            warnings.append(
                f"the final phase started at expected density {d:.3f} against the target {t:.3f}: "
                "more epochs or a larger multiplier_lr would let the Lagrangian get there first"
            )
    out = {
        "target_density": target_out,
        "test_time_density": overall,
        "test_time_density_per_layer": layers,
        "warnings": warnings,
    }
    if multipliers is not None:
        out["multipliers"] = torch.as_tensor(multipliers).detach().cpu().tolist()
    return out


def constrained_rows(summary):
    """``(label, text)`` rows for a results table from :func:`constrained_summary`."""
    target = summary["target_density"]
    layers = summary["test_time_density_per_layer"]
    if isinstance(target, dict):
        target_text = ", ".join(f"{k} {v:.3g}" for k, v in target.items())
    else:
        target_text = f"{target:.3g}"
    rows = [
        ("target density", target_text),
        (
            "test-time density (Eq. 13)",
            f"{summary['test_time_density']:.4f}  (" + ", ".join(f"{k} {v:.4f}" for k, v in layers.items()) + ")",
        ),
    ]
    if "multipliers" in summary:
        rows.append(("multipliers", ", ".join(f"{m:.4g}" for m in summary["multipliers"])))
    return rows
