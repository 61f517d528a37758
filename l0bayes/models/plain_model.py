"""A network without gates and the loss you choose, for :func:`~l0bayes.inference.train`: a pruned model trained
further."""

import pyro
import torch
from torch import nn

from ..inference.free_energy import DATA_FACTOR
from ..nn.gates import gates_of
from .sparse_model import _check_loss


class PlainModel(nn.Module):
    """A network without gates (e.g. :func:`~l0bayes.pruning.prune`'s result) with the loss you choose.

    :func:`~l0bayes.inference.train` trains it with ``objective="penalized"`` (or ``"bayes"``: without gates both
    are the data term alone, ``N * loss_fn(net(x), y)`` for a minibatch of ``N`` examples), with the optimiser,
    schedule, checkpoints and callbacks of any run, e.g. to go on training a pruned model with the loss it was
    pruned with, such as a :class:`~l0bayes.models.Distillation`.

    :param net: the network; one with gates is trained with :class:`~l0bayes.models.SparseModel`.
    :param loss_fn: ``loss_fn(output, target) -> mean loss`` over the minibatch, a floating-point scalar tensor
        computed from ``output`` (as for :class:`~l0bayes.models.SparseModel`).
    """

    #: What the training record reports on held-out data: the mean of ``loss_fn``.
    test_metric = "test_loss"

    def __init__(self, net, loss_fn):
        super().__init__()
        if not isinstance(net, nn.Module):
            raise TypeError(f"PlainModel: net must be a torch.nn.Module, got {type(net).__name__}")
        if not callable(loss_fn):
            raise TypeError(f"PlainModel: loss_fn must be a function (output, target) -> mean loss, got {loss_fn!r}")
        gates = gates_of(net)
        if gates:
            raise ValueError(
                f"PlainModel: net has {len(gates)} HardConcreteGate modules ({gates[0][0]!r}, ...); train a gated "
                "network with SparseModel, or prune it first (l0bayes.pruning.prune)"
            )
        self.net = net
        self.loss_fn = loss_fn

    def forward(self, x):
        return self.net(x)

    def data_term(self, output, y, num_data):
        """``num_data * loss_fn(output, y)`` in nats, the loss checked as :class:`~l0bayes.models.SparseModel`
        checks it."""
        loss = self.loss_fn(output, y)
        _check_loss(self.loss_fn, loss, output)
        return loss * num_data

    def penalized_loss(self, x, y, num_data):
        """``(num_data * mean loss, 0)``: Eq. 22 without gates (no code cost)."""
        nll = self.data_term(self.net(x), y, num_data)
        return nll, torch.zeros_like(nll)

    def bayes_loss(self, x, y, num_data):
        """``(num_data * mean loss, 0, 0)``: Eq. 21 without gates (no gate KL, no code cost)."""
        nll = self.data_term(self.net(x), y, num_data)
        zero = torch.zeros_like(nll)
        return nll, zero, zero

    def model(self, x, y=None, num_data=None):
        num_data = x.shape[0] if num_data is None else int(num_data)
        output = self.net(x)
        if y is not None:
            pyro.factor(DATA_FACTOR, -self.data_term(output, y, num_data))
        return output

    def guide(self, x, y=None, num_data=None):
        pass
