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
* :class:`ConstrainedObjective`: the data term subject to a target density or a target fraction of
  FLOPs (one global constraint or one per gated layer), counted as the pruned model keeps them
  (:mod:`l0bayes.pruning.size`), by a Lagrangian on their expectation under :math:`q` and a final phase
  that fixes the gates so that the pruned model meets the target.
"""

import math

import torch
from pyro.infer import TraceMeanField_ELBO

from .._warnings import warn
from ..nn.density import density_names, test_time_gate_density
from ..nn.gates import gate_owners
from ..pruning.size import network_size
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
FINAL_PHASE = 0.3
#: The Lagrangian has arrived when every expected fraction is at most its target plus this; a final phase that
#: starts further above is warned about (train() and constrained_summary).
ARRIVAL = 0.02
FINAL_PHASE_GAP = ARRIVAL
#: By default the gates are fixed at the first epoch of the final phase wherever the Lagrangian is (``None``);
#: waiting for it to arrive (``arrival=ARRIVAL``) chose the same groups and left fewer epochs to train them
#: (benchmarks/RESULTS.md, "Constrained sparsity").
WAIT = None
#: How the final phase ranks the groups it keeps (benchmarks/RESULTS.md, "Constrained sparsity").
RANK = "log_alpha"
RANKS = ("log_alpha", "norm")


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
    multiplier returns to zero whenever its constraint holds.

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

    :param target_density: :math:`\epsilon` in ``(0, 1]``, of parameters: a float, or with ``per_layer`` one
        per gated layer (of that layer's own parameters).
    :param target_flops: instead, :math:`\epsilon` of FLOPs per example (needs ``input_shape``, or a model of
        :func:`~l0bayes.pruning.sparsify`).
    :param bool per_layer: one constraint (and multiplier) per gated layer instead of one for the network.
    :param multiplier_lr: :math:`\eta`, the ascent step of the multipliers per training step
        (:func:`~l0bayes.inference.train` uses ``3 * lr`` unless told otherwise).
    :param bool dual_restarts: reset a multiplier to zero whenever its constraint is satisfied.
    :param final_phase: fraction of the epochs (rounded up, at least one epoch when positive) with fixed gates
        (fewer with ``arrival``, when the Lagrangian arrives late); ``0`` trains on the Lagrangian throughout
        (the expected fraction then meets the target, the pruned model's need not).
    :param input_shape: one example's shape (no batch dimension), for FLOPs.
    :param rank: how the final phase ranks the groups.
    :param arrival: ``None`` (default) fixes the gates at :meth:`final_phase_start` wherever the Lagrangian
        is; a number waits until every expected fraction is at most its target plus it (the last epoch at
        the latest).
    """

    name = "constrained"
    fixed_log_alpha = 50.0

    def __init__(
        self,
        model,
        num_data,
        target_density=None,
        per_layer=False,
        multiplier_lr=MULTIPLIER_LR,
        dual_restarts=DUAL_RESTARTS,
        final_phase=FINAL_PHASE,
        target_flops=None,
        input_shape=None,
        rank=RANK,
        arrival=WAIT,
        target_architecture=None,
    ):
        super().__init__(model, num_data)
        given = [t for t in (target_density, target_flops, target_architecture) if t is not None]
        if len(given) != 1:
            raise ValueError(
                "the constrained objective needs exactly one of target_density (a fraction of the parameters), "
                "target_flops (a fraction of the FLOPs) and target_architecture (the sizes of every block), got "
                f"target_density={target_density!r}, target_flops={target_flops!r}, "
                f"target_architecture={target_architecture!r}"
            )
        if rank not in RANKS:
            raise ValueError(f"rank must be one of {RANKS}, got {rank!r}")
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
            if self.per_layer:
                raise ValueError("per_layer=True: a target_architecture already constrains every block on its own")
            self.architecture = _Architecture(model, target_architecture, self.layers)
            self.what, self.target_name = "architecture", "target_architecture"
            target = self.architecture.targets
        count = len(target) if self.architecture is not None else len(self.gates) if self.per_layer else 1
        targets = torch.as_tensor(target, dtype=torch.float64).reshape(-1)
        if targets.numel() == 1:
            targets = targets.expand(count)
        if targets.numel() != count:
            raise ValueError(f"{self.target_name} has {targets.numel()} entries, the model {count} gated layers")
        if not bool(((targets > 0) & (targets <= 1)).all()):
            raise ValueError(f"{self.target_name} must lie in (0, 1], got {target!r}")
        if self.what == "flops" and input_shape is None and not _has_example_inputs(model):
            raise ValueError("target_flops needs input_shape: the shape of one example, without the batch dimension")
        self.size = network_size(model, input_shape)
        self.has_flops = self.size.calls is not None
        device = self.gates[0].log_alpha.device
        self.target_values = targets.tolist()  # exact, for the final phase's budget
        self.targets = targets.to(torch.float32).to(device)
        self.multiplier_lr = float(multiplier_lr)
        self.dual_restarts = bool(dual_restarts)
        self.final_phase = float(final_phase)
        self.rank = rank
        self.arrival = None if arrival is None else float(arrival)
        self.mu = torch.zeros(count, device=device)
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
    def step(self, x, y):
        if self.fused:
            nll, _ = self.model.penalized_loss(x, y, self.num_data)
        else:
            nll = _free_energy(self.model, x, y, self.num_data).nll
        violation = self.expected().to(nll.dtype) - self.targets.to(nll.dtype)
        value = nll / self.num_data + (self.mu.to(nll.dtype) * violation).sum()
        return nll, value, violation

    @torch.no_grad()
    def update(self, violation):
        if self.fixed is not None:
            self._project()
            return
        if self.architecture is not None:  # the gates the target leaves open stay open
            self.architecture.hold_open()
        # In place: a step captured as a CUDA graph (l0bayes.inference.graphed) reads this very tensor.
        violation = violation.to(self.mu.dtype)
        self.mu.add_(violation, alpha=self.multiplier_lr).clamp_(min=0.0)
        if self.dual_restarts:
            self.mu.masked_fill_(violation <= 0, 0.0)

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
        more = _epochs_needed(self.trajectory, self.target_values, ARRIVAL)
        hint = f"about {more} more epochs" if more is not None else "more epochs"
        warn(
            f"constrained: the gates are fixed at epoch {epoch + 1} of {epochs} before the Lagrangian arrived: "
            f"expected {_word(self.what)} {d:.3f} against the target {t:.3f}, so the final phase cuts the "
            f"difference at once, which costs accuracy: train {hint} (at its recent pace), or raise "
            "multiplier_lr or the gates' learning rate",
            UserWarning,
        )

    @torch.no_grad()
    def keep_masks(self):
        """The gates kept in the final phase: greedily by rank, each group that keeps the pruned model within target
        (with a target architecture: exactly the target's number of top-ranked groups, units and blocks)."""
        scores = [_scores(layer, gate, self.rank) for layer, gate in zip(self.layers, self.gates, strict=True)]
        if self.architecture is not None:
            return self.architecture.keep_masks(scores)
        masks = _fit_groups(self.size, self.layers, scores, self.what, self.target_values, self.per_layer)
        values = {id(layer): m.double() for layer, m in zip(self.layers, masks, strict=True)}
        achieved = self.size.fraction_at(values, self.what, self.per_layer)
        over = [(a, t) for a, t in zip(achieved, self.target_values, strict=True) if a > t + 1e-12]
        if over:
            a, t = max(over, key=lambda g: g[0] - g[1])
            warn(
                f"constrained: the target {_word(self.what)} {t:.3f} cannot be met: with one group per gated layer "
                f"the pruned model still keeps {a:.3f} (what no gate can remove: ungated layers, channels that "
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

    def _project(self):
        for gate, keep in zip(self.gates, self.fixed, strict=True):
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
            "final_phase_forced": self.forced,
            "density_at_final_phase": None
            if self.density_at_fix is None
            else _scalar_or_list(self.density_at_fix, self.per_layer),
        }
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
            "forced": self.forced,
            "epochs": self.epochs,
            "checked_from": None if self.epochs is None else self.final_phase_start(self.epochs),
            "trajectory": list(self.trajectory),
            "targets": self.targets.cpu().clone(),
            "what": self.what,
            "per_layer": self.per_layer,
            "density_at_fix": self.density_at_fix,
        }

    def load_state_dict(self, state):
        super().load_state_dict(state)
        what = state.get("what", "parameters")
        if (
            what != self.what
            or bool(state["per_layer"]) != self.per_layer
            or not torch.equal(state["targets"], self.targets.cpu())
        ):
            raise ValueError(
                f"the checkpoint was trained for target {_word(what)} {state['targets'].tolist()} "
                f"(per_layer={bool(state['per_layer'])}), this run asks target {_word(self.what)} "
                f"{self.targets.tolist()} (per_layer={self.per_layer})"
            )
        self.set_multipliers(state["mu"])
        self.fixed = None if state["fixed"] is None else [m.to(self.mu.device) for m in state["fixed"]]
        self.fixed_at = state.get("fixed_at")  # (absent from checkpoints of earlier versions)
        self.forced = bool(state.get("forced", False))
        self.trajectory = [tuple(t) for t in state.get("trajectory", [])]
        self.density_at_fix = state.get("density_at_fix")  # (absent from checkpoints of earlier versions)


def _word(what):
    if what == "architecture":
        return "fraction of a block's heads, units (or of the blocks) kept"
    return "density" if what == "parameters" else "FLOPs"


class _Architecture:
    """The constraints of a target architecture on the gates of a model of ``sparsify_transformer``.

    One constraint per :class:`~l0bayes.pruning.transformer.target.Choice` with a count (a block's key-value groups,
    a block's MLP units, all the blocks): the expected fraction of its gates kept, at most ``k / n``. The gates of
    the other choices (sizes the target does not name, residual branches) are held open.
    """

    def __init__(self, model, target, layers):
        from ..pruning.transformer import TargetArchitecture, is_transformer_gated

        net = getattr(model, "net", model)
        if not is_transformer_gated(net):
            raise ValueError(
                "target_architecture needs a model of sparsify_transformer() (or a SparseModel holding one)"
            )
        self.target = TargetArchitecture.of(target)
        try:
            self.choices = self.target.choices(net)
        except ValueError as err:
            raise ValueError(f"target_architecture: {err}") from None
        covered = {id(h) for c in self.choices for h in c.holders}
        outside = [i for i, layer in enumerate(layers) if id(layer) not in covered]
        if outside:
            names = [density_names(model)[i] for i in outside]
            raise ValueError(f"target_architecture: gated layers {names} are outside the transformer's blocks")
        self.constrained = [c for c in self.choices if c.k is not None]
        self.targets = [c.k / c.num_gates for c in self.constrained]
        self.index = {id(layer): i for i, layer in enumerate(layers)}
        self.hold_open()

    def expected(self):
        return torch.stack([c.expected() for c in self.constrained])

    def keep_masks(self, scores):
        masks = [None] * len(self.index)
        for c in self.choices:
            picks = c.masks([scores[self.index[id(h)]] for h in c.holders])
            for holder, keep in zip(c.holders, picks, strict=True):
                masks[self.index[id(holder)]] = keep.cpu()
        return masks

    @torch.no_grad()
    def hold_open(self):
        for c in self.choices:
            if c.k is None:
                for holder in c.holders:
                    holder.gate.log_alpha.fill_(ConstrainedObjective.fixed_log_alpha)


def _has_example_inputs(model):
    net = getattr(model, "net", model)
    return getattr(net, "_l0_example_inputs", None) is not None


#: Epochs of expected fractions kept for the pace of the Lagrangian.
TRAJECTORY = 5


def _epochs_needed(trajectory, targets, arrival):
    """Epochs the Lagrangian would still need at its recent pace (``None`` when it is not moving down)."""
    if len(trajectory) < 2:
        return None
    (e0, d0), (e1, d1) = trajectory[0], trajectory[-1]
    needs = []
    for a, b, t in zip(d0, d1, targets, strict=True):
        gap = b - (t + arrival)
        if gap <= 0:
            continue
        pace = (a - b) / max(e1 - e0, 1)
        if pace <= 0:
            return None
        needs.append(math.ceil(gap / pace))
    return max(needs) if needs else None


def _group_norms(layer, gate):
    """The norm of each group's weights (the scale of the unit it gates), or ``None`` when not known."""
    weight = getattr(layer, "weight", None)
    if not torch.is_tensor(weight):
        return None
    n = gate.num_gates
    if isinstance(layer, torch.nn.Linear) or (weight.dim() == 2 and weight.shape[1] == n):
        return weight.detach().norm(dim=0)
    batch_norm = getattr(layer, "gated_batch_norm", None)
    if batch_norm is not None and batch_norm.weight is not None:
        return batch_norm.weight.detach().abs() * weight.detach().flatten(1).norm(dim=1)
    if weight.shape[0] == n:
        return weight.detach().flatten(1).norm(dim=1)
    return None


def _scores(layer, gate, rank):
    """Higher is kept first: ``log_alpha``, or ``log q(z != 0) + log(norm / the layer's median norm)``."""
    log_alpha = gate.log_alpha.detach().double().cpu()
    if rank == "log_alpha":
        return log_alpha
    norms = _group_norms(layer, gate)
    if norms is None:
        return log_alpha
    norms = norms.double().cpu()
    relative = norms / norms.median().clamp(min=torch.finfo(torch.float64).tiny)
    return torch.log(gate.prob_nonzero().detach().double().cpu()) + torch.log(relative)


def _fit_groups(size, layers, scores, what, targets, per_layer):
    """Masks keeping, greedily by score, each group with which the pruned model's fractions stay within targets.

    The best-scored group of every layer is kept first, whatever the target (an empty layer would
    disconnect the network), except in layers whose gates may all close (``may_close_all``: the gate of a
    residual branch, :class:`~l0bayes.pruning.LayerGate`), of which the best-scored of each ``keep_one_of`` kind
    is kept (one attention branch and one MLP branch, unless the user allowed removing them all); then each group
    in order of score is kept if every
    constrained fraction of the pruned model (counted exactly, :class:`~l0bayes.pruning.NetworkSize`) is still at
    most its target. With one
    target per layer the layers are filled from the last to the first (a layer's count depends on how many of
    its outputs the next layer reads), each in order of score.
    """
    masks = [torch.zeros(s.numel(), dtype=torch.float64) for s in scores]
    for m, s, layer in zip(masks, scores, layers, strict=True):
        if not getattr(layer, "may_close_all", False):  # e.g. a residual branch's gate may close
            m[int(s.argmax())] = 1.0
    kinds = {}  # layers of which one must stay open (keep_one_of: e.g. the attention branches of a transformer)
    for k, layer in enumerate(layers):
        if getattr(layer, "keep_one_of", None) is not None:
            kinds.setdefault(layer.keep_one_of, []).append(k)
    for ks in kinds.values():
        best = max(ks, key=lambda k: (float(scores[k].max()), -k))
        masks[best][int(scores[best].argmax())] = 1.0
    entries = [(float(v), k, i) for k, s in enumerate(scores) for i, v in enumerate(s.tolist())]
    if per_layer:  # a layer's count also depends on the next one's gates: fill from the output back
        order = sorted(entries, key=lambda t: (-t[1], -t[0], t[2]))
    else:
        order = sorted(entries, key=lambda t: (-t[0], t[1], t[2]))
    limits = [t + 1e-12 for t in targets]
    for _, k, i in order:
        if masks[k][i]:
            continue
        masks[k][i] = 1.0
        values = {id(layer): m for layer, m in zip(layers, masks, strict=True)}
        fractions = size.fraction_at(values, what, per_layer)
        if any(f > t for f, t in zip(fractions, limits, strict=True)):
            masks[k][i] = 0.0
    return [m.bool() for m in masks]


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
    target_density=None,
    per_layer=False,
    multipliers=None,
    tolerance=0.02,
    density_at_final_phase=None,
    history=None,
    target_flops=None,
    input_shape=None,
):
    """What a constrained run achieved in the pruned model, and one-line warnings when it missed.

    :param model: the :class:`~l0bayes.inference.TrainResult` of the run (its model, multipliers and
        history are then used), or the trained network (or model) holding the gates.
    :param target_density, target_flops: the run's target (one of them): a fraction of the dense model's
        parameters or FLOPs per example.
    :param multipliers: the run's final multipliers (``TrainResult.multipliers``), copied into the summary.
    :param density_at_final_phase: the expected fraction when the gates were fixed (the history's
        ``density_at_final_phase``); by default read from the history. A warning says when it exceeded
        its target by more than ``FINAL_PHASE_GAP``.
    :param history: the run's history (``TrainResult.history``) when ``model`` is not a ``TrainResult``.
    :param input_shape: one example's shape, for the FLOP fraction (a model of
        :func:`~l0bayes.pruning.sparsify` knows its own).
    :returns: ``{"target_density" or "target_flops", "test_time_density", "test_time_density_per_layer",
        "test_time_flops" (when the input shape is known), "warnings"}`` (and ``"multipliers"`` when known):
        the target (a float, or ``{layer: target}`` with ``per_layer``); the fraction of the dense model's
        parameters that :func:`~l0bayes.pruning.prune` keeps (:func:`~l0bayes.pruning.test_time_density`),
        overall and of each gated layer's own (keyed by :func:`~l0bayes.nn.density.density_names`); the
        fraction of its FLOPs per example; and one-line warnings: a constraint more than ``tolerance`` off
        its target, a layer with no gate open, a final phase that started far above the target.
    """
    if not isinstance(model, torch.nn.Module) and hasattr(model, "history") and hasattr(model, "model"):
        history = model.history if history is None else history
        multipliers = model.multipliers if multipliers is None else multipliers
        model = model.model
    if (target_density is None) == (target_flops is None):
        raise ValueError("constrained_summary needs exactly one of target_density and target_flops")
    if density_at_final_phase is None and history:
        started = [r["density_at_final_phase"] for r in history if r.get("density_at_final_phase") is not None]
        density_at_final_phase = started[-1] if started else None
    names = density_names(model)
    size = network_size(model, input_shape)
    overall = size.fraction("parameters", "test")
    layers = size.fraction("parameters", "test", per_layer=True)
    flops = size.fraction("flops", "test") if size.calls is not None else None
    what = "parameters" if target_flops is None else "flops"
    if what == "flops" and flops is None:
        raise ValueError("a FLOP target needs input_shape: the shape of one example, without the batch dimension")
    target = target_density if target_flops is None else target_flops
    achieved_all = overall if what == "parameters" else flops
    achieved_layers = layers if what == "parameters" else size.fraction("flops", "test", per_layer=True)
    warnings = []
    if per_layer:
        targets = torch.as_tensor(target, dtype=torch.float64).reshape(-1).expand(len(names)).tolist()
        target_out = dict(zip(names, targets, strict=True))
        checks = [(f"layer {n}", achieved_layers[n], t) for n, t in target_out.items()]
    else:
        target_out = float(target)
        checks = [("network", achieved_all, target_out)]
    for where, achieved, t in checks:
        if abs(achieved - t) > tolerance:
            warnings.append(
                f"{where}: the pruned model keeps {achieved:.3f} of the {_word(what)}, more than {tolerance:g} "
                f"off its target {t:.3f}"
            )
    open_gates = test_time_gate_density(model, per_layer=True)
    warnings += [f"layer {n} ended empty: no gate is open at test time" for n, d in open_gates.items() if d == 0]
    if density_at_final_phase is not None:
        started = torch.as_tensor(density_at_final_phase, dtype=torch.float64).reshape(-1).tolist()
        far = _largest_gap(started, [t for _, _, t in checks])
        if far is not None:
            d, t = far
            warnings.append(
                f"the final phase started at expected {_word(what)} {d:.3f} against the target {t:.3f}: "
                "more epochs or a larger multiplier_lr would let the Lagrangian get there first"
            )
    out = {
        ("target_density" if what == "parameters" else "target_flops"): target_out,
        "test_time_density": overall,
        "test_time_density_per_layer": layers,
        "warnings": warnings,
    }
    if flops is not None:
        out["test_time_flops"] = flops
    if multipliers is not None:
        out["multipliers"] = torch.as_tensor(multipliers).detach().cpu().tolist()
    return out


def constrained_rows(summary):
    """``(label, text)`` rows for a results table from :func:`constrained_summary`."""
    key = "target_density" if "target_density" in summary else "target_flops"
    target = summary[key]
    layers = summary["test_time_density_per_layer"]
    if isinstance(target, dict):
        target_text = ", ".join(f"{k} {v:.3g}" for k, v in target.items())
    else:
        target_text = f"{target:.3g}"
    rows = [
        ("target " + ("density (parameters)" if key == "target_density" else "FLOPs"), target_text),
        (
            "pruned model's parameters",
            f"{summary['test_time_density']:.4f} of dense  ("
            + ", ".join(f"{k} {v:.4f}" for k, v in layers.items())
            + ")",
        ),
    ]
    if "test_time_flops" in summary:
        rows.append(("pruned model's FLOPs", f"{summary['test_time_flops']:.4f} of dense"))
    if "multipliers" in summary:
        rows.append(("multipliers", ", ".join(f"{m:.4g}" for m in summary["multipliers"])))
    return rows
