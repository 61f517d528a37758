r"""Importance scores of the gated groups from calibration data, and gates that start from them.

Learned hard concrete gates spend much of their budget finding what one pass of importance scores finds at once
(first-order Taylor scores, Wanda's activation scores). :func:`importance_scores` computes such a score for every
gate of a gated network from a few calibration batches, without changing the network; :func:`init_from_importance`
sets every gate's ``log_alpha`` from them, so that training starts where one-shot pruning ends: at step 0 the
test-time gates (Eq. 13) are the cut that the constrained objective's final phase makes of the scores, and the
expected size under :math:`q` (Eq. 12) is the objective's target.

Both work on every gated model: the L0 layers of :mod:`l0bayes.nn`, a model of :func:`~l0bayes.pruning.sparsify`
(gated ``nn.Linear`` inputs, convolution channels, :class:`~l0bayes.pruning.Group` s) and a transformer of
:func:`~l0bayes.pruning.sparsify_transformer` (key-value groups, MLP units, residual branches, blocks), or a
:class:`~l0bayes.models.SparseModel` holding one.
"""

import contextlib
import math

import torch
import torch.nn.functional as F

from .._checks import Choice
from .._warnings import warn
from ..nn.gates import gate_owners, gates_of
from .transformer.projections import weight as projection_weight

__all__ = ["IMPORTANCE_KINDS", "importance_scores", "init_from_importance"]

#: The kinds of :func:`importance_scores`.
IMPORTANCE_KINDS = ("taylor", "activation")
#: Normalised log-scores are clipped to ``[-LOG_SCORE_RANGE, LOG_SCORE_RANGE]`` (a zero score is the lowest).
LOG_SCORE_RANGE = 20.0
#: The least distance in ``log_alpha`` between a gate and the Eq. 13 threshold (more in low-precision dtypes).
MARGIN = 0.01
_SHIFT_RANGE = 60.0  # the bisection's interval of shifts, [-_SHIFT_RANGE, _SHIFT_RANGE]
_BISECTIONS = 64
_TOLERANCE = 1e-4  # an expected fraction further than this from its target is reported


def importance_scores(model, batches, loss_fn=None, kind="taylor"):
    r"""A score per gate of ``model``: how much its groups matter to the network with every gate open.

    Every gate is held at 1 (the dense network) and the network runs in ``eval()`` mode on the calibration
    batches. ``kind="taylor"``: the first-order Taylor estimate of the loss change from removing a group,
    :math:`|\sum_b \partial L_b / \partial z_g|` at :math:`z = 1`, summed over the batches :math:`b` before the
    absolute value. For a gate that scales a linear layer's input column :math:`g` it equals
    :math:`|\sum_b \sum_{w \in g} w\, \partial L_b / \partial w|` over the weights that read it (torch-pruning's
    ``GroupTaylorImportance(multivariable=True)``). ``kind="activation"`` (Wanda-style): with :math:`s_g` the signal
    that gate :math:`g` multiplies (the site computes :math:`s \odot z`), the norm :math:`\|s_g\|_2` over every
    calibration example and position (and over every site of the gate: a block gate scales both its branches),
    times, where the signal is a linear layer's input (an :class:`~l0bayes.nn.L0Linear` or ``nn.Linear`` gated by
    :func:`~l0bayes.pruning.sparsify`, a transformer's MLP units and attention heads), the L1 norm of the weights
    that read it, :math:`\sum_o |W_{o,g}|` (over the head's columns for a head), so that the score is the sum
    of Wanda's :math:`|W_{o,j}|\,\|X_j\|_2` over the group. Where the gates scale an output (convolution channels,
    :class:`~l0bayes.pruning.Group` s, residual branches and blocks) the score is :math:`\|s_g\|_2` alone.

    Nothing of ``model`` changes: no gradient reaches a parameter's ``.grad``, no batch norm statistic moves,
    the gates' state, every module's training mode and the random number generators are as they were.

    :param model: a gated network, or a :class:`~l0bayes.models.SparseModel` holding one.
    :param batches: an iterable of ``(x, y)`` pairs (a list, a ``DataLoader``); ``x`` is what ``model`` takes (a
        tensor, a tuple of positional arguments or a dict of keywords), moved to the gates' device.
    :param loss_fn: ``loss_fn(output, y) -> mean loss`` (a scalar tensor), for ``kind="taylor"``; default: the
        model's own data term for a :class:`~l0bayes.models.SparseModel` (its ``loss_fn``, the cross entropy of a
        classifier). ``kind="activation"`` reads no loss, nor ``y``.
    :param kind: one of :data:`IMPORTANCE_KINDS`.
    :returns: ``{gate name: float64 tensor of shape (num_gates,)}``, the names and order of
        :func:`~l0bayes.nn.gates_of` of ``model``; what :func:`init_from_importance` takes.
    :raises ValueError: for an unknown ``kind``, no batches, a model without gates, a loss that is not a scalar,
        and (``"activation"``) a gate whose site reports no signal.
    :raises TypeError: for a batch that is not an ``(x, y)`` pair, or ``kind="taylor"`` without a loss.
    """
    Choice(IMPORTANCE_KINDS)("importance_scores", "kind", kind)
    named = gates_of(model)
    if not named:
        raise ValueError("importance_scores: the model has no HardConcreteGate")
    if loss_fn is not None and not callable(loss_fn):
        raise TypeError(f"importance_scores: loss_fn must be a function (output, y) -> mean loss, got {loss_fn!r}")
    if kind == "taylor" and loss_fn is None and not callable(getattr(model, "data_term", None)):
        raise TypeError(
            "importance_scores: kind='taylor' needs a loss: give loss_fn(output, y) -> mean loss (a SparseModel "
            "brings its own)"
        )
    taylor = kind == "taylor"
    gates = [gate for _, gate in named]
    device = gates[0].log_alpha.device
    with _probing(model, gates, taylor) as (ones, recorders):
        totals = [torch.zeros(g.num_gates, dtype=torch.float64, device=device) for g in gates] if taylor else None
        reached = [False] * len(gates)  # whether the loss depends on each gate
        seen = 0
        with torch.enable_grad() if taylor else torch.no_grad():
            for batch in batches:
                x, y = _pair(batch, seen)
                output = _call(model, _to(x, device))
                seen += 1
                if not taylor:
                    continue
                loss = _loss(model, loss_fn, output, _to(y, device))
                if not loss.requires_grad:  # no gate on the way to the loss
                    continue
                grads = torch.autograd.grad(loss, ones, allow_unused=True)
                for i, grad in enumerate(grads):
                    if grad is not None:
                        totals[i] += grad.detach().to(torch.float64)
                        reached[i] = True
        if not seen:
            raise ValueError("importance_scores: batches is empty; give at least one (x, y) calibration batch")
        if taylor:
            scores = [total.abs().cpu() for total in totals]
            unused = [name for (name, _), hit in zip(named, reached, strict=True) if not hit]
            if unused:
                warn(f"importance_scores: the loss does not depend on the gates {unused[:8]}: their scores are 0")
        else:
            scores = [r.scores() for r in recorders]
            silent = [name for (name, _), s in zip(named, scores, strict=True) if s is None]
            if silent:
                raise ValueError(
                    f"importance_scores: kind='activation': the gates {silent[:8]} reported no signal (no site that "
                    "multiplies by them ran, or their model's layer does not report to HardConcreteGate.observer); "
                    "use kind='taylor'"
                )
    return {name: score for (name, _), score in zip(named, scores, strict=True)}


class _Recorder:
    """The observer of one gate for the activation scores: sums of squares of its signal, per gate."""

    def __init__(self, gate):
        self.num_gates = gate.num_gates
        self.sum_sq = None
        self.reader = None

    def __call__(self, signal, dim, reader=None):
        s = signal.detach().float().pow(2)
        if dim is None:
            sq = s.sum(dtype=torch.float64).reshape(1)
        else:
            s = s.movedim(dim, -1)
            if s.shape[-1] != self.num_gates:
                raise ValueError(
                    f"importance_scores: a site reported a signal of {s.shape[-1]} units for {self.num_gates} gates"
                )
            sq = s.reshape(-1, self.num_gates).sum(0, dtype=torch.float64)
        self.sum_sq = sq if self.sum_sq is None else self.sum_sq + sq
        if reader is not None and self.reader is None:
            self.reader = reader

    def scores(self):
        if self.sum_sq is None:
            return None
        out = self.sum_sq.sqrt()
        if self.reader is not None:
            columns = projection_weight(self.reader).detach().to(torch.float64).abs().sum(0)
            out = out * columns.reshape(self.num_gates, -1).sum(1)
        return out.cpu()


@contextlib.contextmanager
def _probing(model, gates, taylor):
    """The network with every gate held at 1 in ``eval()`` mode, its parameters without gradients; yields the
    gate values (``taylor``: leaves that take gradients) and the recorders (activation). Everything is put back."""
    modes = [(m, m.training) for m in model.modules()]
    grads = [(p, p.requires_grad) for p in model.parameters()]
    held = [(m, m.__dict__["_z"]) for m in model.modules() if "_z" in m.__dict__]
    keys = ("_value", "_num_open", "site_name", "prior")
    states = [({k: getattr(g, k) for k in keys}, g.__dict__.get("observer", _ABSENT)) for g in gates]
    rng = torch.get_rng_state()
    cuda_rng = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None
    ones, recorders = [], []
    try:
        model.eval()
        for p, _ in grads:
            p.requires_grad_(False)
        for g in gates:
            z = torch.ones(g.num_gates, dtype=g.log_alpha.dtype, device=g.log_alpha.device, requires_grad=taylor)
            g.site_name = g.prior = None
            g._value, g._num_open = z, g.num_gates
            ones.append(z)
            if not taylor:
                recorders.append(_Recorder(g))
                g.observer = recorders[-1]
        yield ones, recorders
    finally:
        for g, (state, observer) in zip(gates, states, strict=True):
            for k, v in state.items():
                setattr(g, k, v)
            g.__dict__.pop("observer", None)
            if observer is not _ABSENT:
                g.observer = observer
        for m, z in held:
            m._z = z
        for p, flag in grads:
            p.requires_grad_(flag)
        for m, flag in modes:
            m.training = flag
        torch.set_rng_state(rng)
        if cuda_rng is not None:
            torch.cuda.set_rng_state_all(cuda_rng)


_ABSENT = object()


def _pair(batch, index):
    if not isinstance(batch, (tuple, list)) or len(batch) != 2:
        raise TypeError(
            f"importance_scores: batches must yield (x, y) pairs; batch {index} is a {type(batch).__name__}"
            + (f" of {len(batch)} items" if isinstance(batch, (tuple, list)) else "")
        )
    return batch


def _to(value, device):
    if torch.is_tensor(value):
        return value.to(device)
    if isinstance(value, (tuple, list)):
        return type(value)(_to(v, device) for v in value)
    if isinstance(value, dict):
        return {k: _to(v, device) for k, v in value.items()}
    return value


def _call(model, x):
    if isinstance(x, dict):
        return model(**x)
    if isinstance(x, (tuple, list)):
        return model(*x)
    return model(x)


def _loss(model, loss_fn, output, y):
    loss = loss_fn(output, y) if loss_fn is not None else model.data_term(output, y, 1)
    if not torch.is_tensor(loss) or not loss.is_floating_point() or loss.dim() != 0:
        got = f"shape {tuple(loss.shape)} ({loss.dtype})" if torch.is_tensor(loss) else type(loss).__name__
        raise ValueError(f"importance_scores: the loss must be a floating-point scalar tensor, got {got}")
    return loss


def init_from_importance(model, scores, objective):
    r"""Set every gate's ``log_alpha`` from importance ``scores``, for training with the constrained ``objective``.

    At step 0, then:

    * the test-time gates (Eq. 13) are the cut of the scores that ``objective``'s final phase makes (its own
      greedy fit of the groups to the target, or the target architecture's top-ranked groups): a cut of the
      gates at step 0 (``prune``) keeps what one-shot pruning by the scores keeps;
    * the expected size under :math:`q` (Eq. 12), as the objective counts it, equals its target (for a target
      architecture, each of its constraints; the gates the target leaves open are held open, as the objective
      holds them);
    * within each gate vector the gates rank as the scores do, among the kept groups and among the dropped ones
      (every kept group ranks above every dropped one).

    Scores are compared across layers after normalising each gate vector by its median (by its mean where the
    median is 0; the one-gate vectors of one kind, such as the attention branches of all blocks, are normalised
    together): :math:`r_g = \log(s_g / \mathrm{median})`, clipped to :math:`\pm` :data:`LOG_SCORE_RANGE`, ranks the
    groups for the cut. With :math:`t = \log(-\gamma/\zeta)` the Eq. 13 threshold (a gate is open at test time iff
    :math:`\log\alpha > t`), :math:`\epsilon` = :data:`MARGIN` and a shift :math:`c`,

    .. math::
        \log\alpha_g = t + \epsilon + \operatorname{softplus}(c + r_g) \quad \text{(kept)},

    .. math::
        \log\alpha_g = t - \epsilon - \operatorname{softplus}(-(c + r_g)) \quad \text{(dropped)},

    so far from the threshold :math:`\log\alpha_g \approx t + c + r_g`: the odds :math:`\alpha_g` are proportional
    to the normalised score. Every :math:`\log\alpha` grows with :math:`c`, and so does the expected size, from
    that of the kept groups at the threshold and the dropped ones closed (:math:`c \to -\infty`) to that of the
    kept groups open and the dropped ones at the threshold (:math:`c \to \infty`); :math:`c` (one per constraint)
    is found by bisection so that the expected size equals the target. Where the target lies outside that range
    (a target below what one group per layer keeps), the gates start at the closest end and a warning says so.

    :param model: the gated network scored by :func:`importance_scores` (the same object: the names must match).
    :param scores: ``{gate name: non-negative tensor of shape (num_gates,)}`` for every gate of ``model``, as
        :func:`importance_scores` returns them.
    :param objective: the :class:`~l0bayes.inference.Constrained` objective the model will train with
        (``target_density``, ``target_flops`` or ``target_architecture``), with ``rank="log_alpha"`` and one
        constraint for the network or a target architecture (not ``per_layer``).
    :returns: ``{gate name: bool tensor}``, the groups open at test time.
    :raises TypeError: for an ``objective`` that is not a ``Constrained`` object, or scores that are not tensors.
    :raises ValueError: for scores missing a gate, naming an unknown one, of the wrong shape, negative or not
        finite, and for an objective with ``per_layer=True`` or ``rank="norm"``.
    """
    if getattr(objective, "name", None) != "constrained" or not callable(getattr(objective, "build", None)):
        raise TypeError(
            "init_from_importance: objective must be a Constrained(...) objective (from l0bayes.inference), got "
            f"{type(objective).__name__}"
        )
    if objective.per_layer:
        raise ValueError(
            "init_from_importance: an objective with per_layer=True is not supported (the layers' counts share "
            "their units); give one target for the network"
        )
    if objective.rank != "log_alpha":
        raise ValueError(
            f"init_from_importance: the objective's rank must be 'log_alpha' (its final phase then cuts by the "
            f"order of the gates set here), got {objective.rank!r}"
        )
    named = gates_of(model)
    values = _checked_scores(named, scores)
    ranks = _normalised_log_scores(model, named, values)
    gates = [gate for _, gate in named]
    saved = [g.log_alpha.detach().clone() for g in gates]
    try:
        built = objective.build(model, 1)
        keep = _cut(built, gates, ranks)
        groups = _constraint_groups(built, gates)
        targets = torch.tensor(built.target_values, dtype=torch.float64)
        achieved, low, high = _fit_shifts(built, gates, ranks, keep, groups, targets)
    except BaseException:
        with torch.no_grad():
            for g, la in zip(gates, saved, strict=True):
                g.log_alpha.copy_(la)
        raise
    gap = (achieved - targets).abs()
    if bool((gap > _TOLERANCE).any()):
        k = int(gap.argmax())
        warn(
            f"init_from_importance: no shift of the gates gives the target expected size {float(targets[k]):.4f}: "
            f"with the kept groups above the Eq. 13 threshold and the dropped ones below it, it lies between "
            f"{float(low[k]):.4f} and {float(high[k]):.4f}; the gates start at the closest, {float(achieved[k]):.4f}"
        )
    wrong = [name for (name, gate), k in zip(named, keep, strict=True) if not torch.equal(gate.active().cpu(), k)]
    if wrong:  # pragma: no cover - the margin keeps every gate on its side of the threshold
        raise RuntimeError(f"init_from_importance: the test-time gates of {wrong} are not the cut")
    return {name: gate.active().cpu() for name, gate in named}


def _checked_scores(named, scores):
    if not isinstance(scores, dict):
        raise TypeError(
            f"init_from_importance: scores must be a dict {{gate name: tensor}} (from importance_scores), got "
            f"{type(scores).__name__}"
        )
    names = [name for name, _ in named]
    missing = [n for n in names if n not in scores]
    unknown = [n for n in scores if n not in set(names)]
    if missing or unknown:
        raise ValueError(
            f"init_from_importance: scores must have one entry per gate of the model, named as gates_of(model) "
            f"names them {names[:4]}...; missing {missing[:8]}, unknown {unknown[:8]}"
        )
    out = []
    for name, gate in named:
        s = scores[name]
        if not torch.is_tensor(s):
            raise TypeError(f"init_from_importance: scores[{name!r}] must be a tensor, got {type(s).__name__}")
        s = s.detach().to("cpu", torch.float64)
        if s.shape != (gate.num_gates,):
            raise ValueError(
                f"init_from_importance: scores[{name!r}] must have shape ({gate.num_gates},), got {tuple(s.shape)}"
            )
        if not bool(torch.isfinite(s).all()) or bool((s < 0).any()):
            raise ValueError(f"init_from_importance: scores[{name!r}] must be finite and >= 0")
        out.append(s)
    return out


def _normalised_log_scores(model, named, values):
    """``log(score / scale)`` per gate vector, clipped; the one-gate vectors of one holder kind share a scale."""
    units = {}
    for i, ((name, gate), (layer, _)) in enumerate(zip(named, gate_owners(model), strict=True)):
        key = (type(layer).__name__, name.rpartition(".")[0].rpartition(".")[2]) if gate.num_gates == 1 else i
        units.setdefault(key, []).append(i)
    out = [None] * len(values)
    for members in units.values():
        joined = torch.cat([values[i] for i in members])
        scale = float(joined.median())
        scale = scale if scale > 0 else float(joined.mean())
        scale = scale if scale > 0 else 1.0
        for i in members:
            out[i] = torch.log(values[i] / scale).clamp(-LOG_SCORE_RANGE, LOG_SCORE_RANGE)
    return out


@torch.no_grad()
def _cut(built, gates, ranks):
    """The objective's own final-phase cut of the groups ranked by ``ranks`` (read from ``log_alpha``, exactly)."""
    originals = [g.log_alpha.data for g in gates]
    try:
        for g, r in zip(gates, ranks, strict=True):
            g.log_alpha.data = r.to(g.log_alpha.device)  # float64 while the cut reads them: no ties from rounding
        masks = built.keep_masks()
    finally:
        for g, data in zip(gates, originals, strict=True):
            g.log_alpha.data = data
    return [m.cpu().bool() for m in masks]


def _constraint_groups(built, gates):
    """Per constraint of the objective, the indices of the gates it bounds (a target architecture: disjoint)."""
    architecture = getattr(built, "architecture", None)
    if architecture is None:
        return [list(range(len(gates)))]
    index = {id(g): i for i, g in enumerate(gates)}
    return [[index[id(h.gate)] for h in c.holders] for c in architecture.constrained]


def _threshold(gate):
    return math.log(-gate.lower / gate.upper)


def _margin(gate):
    eps = torch.finfo(gate.log_alpha.dtype).eps
    return max(MARGIN, 16 * eps * abs(_threshold(gate)))


@torch.no_grad()
def _set(gates, ranks, keep, members, shift):
    for i in members:
        g, r, k = gates[i], ranks[i], keep[i]
        x = r + shift
        t, m = _threshold(g), _margin(g)
        la = torch.where(k, t + m + F.softplus(x), t - m - F.softplus(-x))
        g.log_alpha.copy_(la.to(g.log_alpha))


@torch.no_grad()
def _fit_shifts(built, gates, ranks, keep, groups, targets):
    """Bisection of one shift per constraint (their gates are disjoint) to the expected size at its target: the
    expected sizes reached, and those at the ends of the interval of shifts."""
    lo = torch.full((len(groups),), -_SHIFT_RANGE, dtype=torch.float64)
    hi = torch.full((len(groups),), _SHIFT_RANGE, dtype=torch.float64)

    def expected_at(shifts):
        for members, c in zip(groups, shifts.tolist(), strict=True):
            _set(gates, ranks, keep, members, c)
        return built.expected().detach().to("cpu", torch.float64).reshape(-1)

    low, high = expected_at(lo), expected_at(hi)
    for _ in range(_BISECTIONS):
        mid = (lo + hi) / 2
        below = expected_at(mid) < targets
        lo, hi = torch.where(below, mid, lo), torch.where(below, hi, mid)
    at_lo, at_hi = expected_at(lo), expected_at(hi)
    best = torch.where((at_lo - targets).abs() <= (at_hi - targets).abs(), lo, hi)
    return expected_at(best), low, high
