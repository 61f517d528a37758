"""The per-epoch history record of a run: loss, time, the objective's entries, and every few epochs the full record.

The full record holds every free-energy term on a fixed subset of the training data, the gates
(expected L0, open gates per layer), the validation and test error (or the RMSE of a linear regression, or the
mean loss of a model with its own loss: ``validation_error`` / ``test_error``, ``validation_rmse`` /
``test_rmse``, ``validation_loss`` / ``test_loss``) and the expected FLOPs.
"""

import time

import torch

from ..._checks import check_shape
from ...nn.gates import gates_of
from ..batches import EVALUATION_BATCH, held_out_batches, random_state_kept
from ..free_energy import FreeEnergy, free_energy
from .base import Callback

__all__ = ["ExpectedFlops", "History", "VALIDATION_METRICS", "check_held_out", "full_record"]

#: The record entries of the validation data's metric, one per kind of model (the others are ``None`` or absent).
VALIDATION_METRICS = ("validation_error", "validation_rmse", "validation_loss")


class History(Callback):
    """Fill each epoch's record and append it to ``run.history`` (on the main process only).

    :param train_subset: ``(x, y)``: the fixed training examples of the full record's free energy.
    :param test_data: ``(x, y)`` tensors, or an iterable of such batches, or ``None``.
    :param validation_data: the same, recorded as ``validation_error`` (``validation_rmse``,
        ``validation_loss``): the data to choose on (:class:`~l0bayes.inference.callbacks.EarlyStopping`).
    :param input_shape: one example's shape (without the batch dimension) for the expected FLOPs of a gated
        network (``expected_flops``), or ``None``: no FLOPs (:class:`ExpectedFlops` records them for any run).
    :param int record_every: the full record every ``record_every`` epochs and at the last; the other
        epochs record only the mean training loss, wall time, step sizes and the objective's own entries.
        Each record says which it is (``full_record``).
    """

    def __init__(self, train_subset, test_data=None, input_shape=None, record_every=1, validation_data=None):
        self.train_subset = train_subset
        self.test_data = test_data
        self.validation_data = validation_data
        self.input_shape = input_shape
        self.record_every = int(record_every)
        self.start = None

    def on_epoch_start(self, run):
        self.start = time.perf_counter()

    def on_epoch_end(self, run, record):
        if not run.is_main:
            return
        record["mean_loss"] = run.mean_loss()
        record["train_loss"] = run.mean_data_loss()
        record["wall_s"] = time.perf_counter() - self.start
        record.setdefault("lr", [float(g["lr"]) for g in run.optimizer.param_groups])
        full = (run.epoch + 1) % self.record_every == 0 or run.epoch + 1 == run.epochs
        with run.callbacks.evaluation(run):
            record.update(run.objective.record())
            if full:
                record.update(
                    full_record(run, self.train_subset, self.test_data, self.input_shape, self.validation_data)
                )
        record["full_record"] = full
        run.history.append(record)


class ExpectedFlops(Callback):
    """Add the expected FLOPs per example of the gated network (``expected_flops``, Fig. 3 of the paper) to every full
    record, with the parameters the record evaluates (an average, where one is kept).

    A constrained run with a FLOPs target records them without it. Counted as :func:`~l0bayes.pruning.flops` counts
    the pruned model (:func:`~l0bayes.pruning.expected_flops`), for a network that :func:`~l0bayes.pruning.prune`
    handles. :func:`~l0bayes.inference.train` runs it right after the record, before the other callbacks.

    :param input_shape: one example's shape, without the batch dimension (e.g. ``(1, 28, 28)``).
    """

    extends_records = True

    def __init__(self, input_shape):
        self.input_shape = check_shape("ExpectedFlops", "input_shape", input_shape)

    def setup(self, run):
        from ...pruning.size import network_size

        network_size(run.model, self.input_shape).flops("expected")  # a network it cannot count: an error now

    def on_epoch_end(self, run, record):
        if not record.get("full_record") or not run.is_main:
            return
        from ...pruning.size import expected_flops

        with run.callbacks.evaluation(run), torch.no_grad():
            record["expected_flops"] = float(expected_flops(getattr(run.model, "net", run.model), self.input_shape))


def full_record(run, train_subset, test_data=None, input_shape=None, validation_data=None):
    """Every free-energy term on ``train_subset``, the gates, the validation and test metrics and the expected FLOPs.

    The random states (torch's, and the run's CUDA device's) are restored afterwards, so that recording does not
    change the training draws: neither the free energy's gate draws nor a ``DataLoader`` of held-out data,
    which draws its seed (and its order, when it shuffles) from torch's random state.
    """
    with random_state_kept(run.device):
        return _full_record(run, train_subset, test_data, input_shape, validation_data)


def _full_record(run, train_subset, test_data, input_shape, validation_data):
    model, device = run.model, run.device
    record = {}
    x, y = train_subset
    rows = _record_rows(run, x.shape[0])
    with torch.no_grad():
        terms = _chunked_terms(model, x, y, device, run.num_data, run.objective.kl, rows)
    record.update(terms.as_dict())
    gates = gates_of(model)
    record["expected_l0"] = float(sum(g.expected_l0().detach() for _, g in gates))  # 0 without gates (PlainModel)
    record["active_gates"] = [int(g.active().sum()) for _, g in gates]
    if validation_data is not None:  # test_metrics' names, "validation_" for "test_"
        metrics = test_metrics(model, validation_data, device, rows, "validation_data")
        record.update({"validation_" + k.removeprefix("test_"): v for k, v in metrics.items()})
    if test_data is not None:
        record.update(test_metrics(model, test_data, device, rows))
    if input_shape is not None:
        from ...pruning.size import expected_flops

        with torch.no_grad():
            record["expected_flops"] = float(expected_flops(getattr(model, "net", model), input_shape))
    return record


def _record_rows(run, default):
    """Rows per forward pass of the full record: a training minibatch's, where the run's batches say (a record of
    a thousand sequences of a language model in one pass would hold a thousand sequences' logits at once)."""
    rows = run.batches.record_rows()
    return default if rows is None else max(1, min(int(rows), default))


def _chunked_terms(model, x, y, device, num_data, kl, rows):
    """:func:`_free_energy_terms` of ``(x, y)`` computed ``rows`` examples at a time, each chunk's terms weighted by
    its share of the rows: the data term (scaled by ``N/B`` in each chunk) then sums to ``N/B`` times the whole
    subset's, and the terms of the gates (the same in every chunk up to their Monte Carlo draws) are averaged."""
    total = x.shape[0]
    if rows >= total:
        return _free_energy_terms(model, x.to(device), y.to(device), num_data, kl)
    sums = None
    for start in range(0, total, rows):
        xb, yb = x[start : start + rows].to(device), y[start : start + rows].to(device)
        part = _free_energy_terms(model, xb, yb, num_data, kl)
        weight = xb.shape[0] / total
        values = [torch.as_tensor(getattr(part, name)).detach() * weight for name in _TERMS]
        sums = values if sums is None else [a + b for a, b in zip(sums, values, strict=True)]
    return FreeEnergy(**dict(zip(_TERMS, sums, strict=True)))


_TERMS = ("nll", "gate_kl", "other_kl", "code_cost")


def _free_energy_terms(model, x, y, num_data, kl):
    """:func:`free_energy` of the model and guide, through the model's own fused losses when it has them.

    ``bayes_loss`` / ``penalized_loss`` give the same terms for the same draws in one pass over the
    gates instead of Pyro's traces (the record is then a few percent of a small epoch, not a third).
    """
    fused = "bayes_loss" if kl else "penalized_loss"
    if not hasattr(model, fused) or not model.training:
        return free_energy(model.model, model.guide, x, y, num_data, kl=kl)
    if kl:
        nll, gate_kl, code_cost = model.bayes_loss(x, y, num_data)
    else:
        (nll, code_cost), gate_kl = model.penalized_loss(x, y, num_data), None
    zero = torch.zeros_like(nll)
    return FreeEnergy(nll=nll, gate_kl=zero if gate_kl is None else gate_kl, other_kl=zero, code_cost=code_cost)


def check_held_out(run, data, name):
    """Evaluate the first batch of held-out ``data`` (``name``: ``"validation_data"`` or ``"test_data"``) of a model
    with its own loss, before training: targets its ``loss_fn`` cannot take (e.g. labels beyond the model's outputs)
    are then a ``ValueError`` naming ``name`` at once, not at the end of the first epoch. (A classifier's labels are
    checked against its classes as the data are read.) Tensors are read one training minibatch's rows at a time
    (one row where that is not known yet), an iterable in its own batches; the random states are kept."""
    if getattr(run.model, "test_metric", None) != "test_loss":
        return
    with random_state_kept(run.device):
        test_metrics(run.model, data, run.device, run.batches.record_rows() or 1, name, limit=1)


def test_metrics(model, test_data, device, rows=None, name="test_data", limit=None):
    """``test_error`` of a classifier (and of a logistic regression: the sign of its logit), ``test_rmse`` of a
    Gaussian linear regression, ``test_loss`` of a model with its own loss function (the mean over the test
    examples), at test time (Eq. 13 gates). Held-out tensors are read ``rows`` at a time (by default
    :data:`~l0bayes.inference.batches.EVALUATION_BATCH`); an iterable in its own batches (the first ``limit``).
    A ``loss_fn`` that fails on a batch is a ``ValueError`` naming the batch of ``name``."""
    was_training = model.training
    model.eval()
    wrong = count = 0
    squared = loss_sum = 0.0
    kind = None
    try:
        with torch.no_grad():
            for index, (xb, yb) in enumerate(held_out_batches(test_data, rows or EVALUATION_BATCH), 1):
                if limit is not None and index > limit:
                    break
                xb, yb = xb.to(device), yb.to(device)
                metric = getattr(model, "test_metric", None)
                if metric == "test_loss":
                    kind = "test_loss"
                    loss_sum += _held_out_loss(model, model(xb), yb, f"batch {index} of {name}") * xb.shape[0]
                elif hasattr(model, "noise_scale") and hasattr(model, "coefficients") and yb.is_floating_point():
                    kind = "test_rmse"
                    squared += float(((xb @ model.coefficients() + model.bias - yb) ** 2).sum())
                elif hasattr(model, "coefficients") and yb.is_floating_point():  # a logistic regression: 0/1 labels
                    kind = "test_error"
                    wrong += int(((xb @ model.coefficients() + model.bias > 0).to(yb.dtype) != yb).sum())
                elif metric == "test_error" or not yb.is_floating_point():
                    kind = "test_error"
                    pred = model(xb)
                    pred = pred.argmax(-1) if pred.dim() > 1 else (pred > 0).long()
                    wrong += int((pred != yb).sum())
                count += xb.shape[0]
    finally:
        model.train(was_training)
    if kind is None or count == 0:
        return {"test_error": None}
    if kind == "test_loss":
        return {"test_loss": loss_sum / count}
    if kind == "test_rmse":  # (a regression has no error rate)
        return {"test_error": None, "test_rmse": (squared / count) ** 0.5}
    return {"test_error": wrong / count}


def _held_out_loss(model, output, y, where):
    """``loss_fn(output, y)`` of held-out data as a float, or a ``ValueError`` naming ``where`` when it fails."""
    try:
        return float(model.loss_fn(output, y))
    except torch.cuda.OutOfMemoryError:  # (torch.OutOfMemoryError from torch 2.5 on)
        raise
    except (IndexError, ValueError, RuntimeError, TypeError) as err:
        first = str(err).splitlines()[0] if str(err) else ""
        raise ValueError(
            f"{where}: the model's loss_fn raised {type(err).__name__} ({first}); check that its targets are what "
            "loss_fn takes, e.g. class labels within the model's outputs"
        ) from err
