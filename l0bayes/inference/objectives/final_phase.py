r"""The constrained objective's final phase: when its gates are fixed, and which groups it keeps.

The gates are fixed for the last :data:`FINAL_PHASE` of the epochs; the groups are ranked (:func:`group_scores`)
and kept greedily while the pruned model stays within its targets (:func:`fit_groups`). The pace of the
Lagrangian over the last :data:`TRAJECTORY` epochs says how many more epochs it needed when it had not
arrived (:func:`epochs_needed`).
"""

import math

import torch

__all__ = [
    "ARRIVAL",
    "EACH",
    "FINAL_PHASE",
    "FINAL_PHASE_GAP",
    "RANK",
    "RANKS",
    "TRAJECTORY",
    "HARDLY_MOVING",
    "WAIT",
    "epochs_advice",
    "epochs_needed",
    "fit_groups",
    "group_norms",
    "group_scores",
    "largest_gap",
]

# Defaults of the final phase, chosen by measurement (benchmarks/RESULTS.md, "Constrained sparsity").
FINAL_PHASE = 0.3
#: The Lagrangian has arrived when every expected fraction is at most its target plus this; a final phase that
#: starts further above is warned about (train() and constrained_summary).
ARRIVAL = 0.02
FINAL_PHASE_GAP = ARRIVAL
#: By default the gates are fixed at the first epoch of the final phase wherever the Lagrangian is (``None``);
#: waiting for it to arrive (``arrival=ARRIVAL``) chose the same groups and left fewer epochs to train them
#: (benchmarks/RESULTS.md, "Constrained sparsity").
WAIT = None
#: ``arrival=EACH``: each constraint of a target architecture is fixed on its own, the step it arrives.
EACH = "each"
#: How the final phase ranks the groups it keeps (benchmarks/RESULTS.md, "Constrained sparsity").
RANK = "log_alpha"
RANKS = ("log_alpha", "norm")
#: Epochs of expected fractions kept for the pace of the Lagrangian.
TRAJECTORY = 5


#: An estimate of the epochs the Lagrangian still needs beyond this many times the run's epochs is not advice to
#: train longer: the Lagrangian has hardly moved (:func:`epochs_advice`).
HARDLY_MOVING = 10


def epochs_advice(more, epochs):
    """What the warning of a final phase begun before the Lagrangian arrived advises, from :func:`epochs_needed`'s
    estimate ``more`` (``None``: no pace to go by) for a run of ``epochs`` epochs.

    An estimate beyond :data:`HARDLY_MOVING` times the run's epochs (a pace of almost nothing over the last epochs
    gives tens of thousands) is not given as a number of epochs: the step sizes are what to change.
    """
    faster = "raise multiplier_lr or the gates' learning rate"
    if more is None:
        return f"train more epochs, or {faster}"
    if more > HARDLY_MOVING * max(int(epochs), 1):
        return (
            f"the Lagrangian has hardly moved over the last epochs (at that pace it needs more than {HARDLY_MOVING} "
            f"times this run's {epochs} epochs): {faster}"
        )
    return f"train about {more} more epochs (at its recent pace), or {faster}"


def epochs_needed(trajectory, targets, arrival):
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


def group_norms(layer, gate):
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


def group_scores(layer, gate, rank):
    """Higher is kept first: ``log_alpha``, or ``log q(z != 0) + log(norm / the layer's median norm)``."""
    log_alpha = gate.log_alpha.detach().double().cpu()
    if rank == "log_alpha":
        return log_alpha
    norms = group_norms(layer, gate)
    if norms is None:
        return log_alpha
    norms = norms.double().cpu()
    relative = norms / norms.median().clamp(min=torch.finfo(torch.float64).tiny)
    return torch.log(gate.prob_nonzero().detach().double().cpu()) + torch.log(relative)


def fit_groups(size, layers, scores, what, targets, per_layer):
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


def largest_gap(densities, targets):
    """``(density, target)`` of the constraint furthest above its target, if by more than ``FINAL_PHASE_GAP``."""
    far = [(d, t) for d, t in zip(densities, targets, strict=True) if d - t > FINAL_PHASE_GAP]
    return max(far, key=lambda g: g[0] - g[1]) if far else None
