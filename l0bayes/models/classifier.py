"""A gated neural network as a Bayesian classifier (Eq. 21) or a penalised one (Eq. 9, 22)."""

import pyro
import pyro.distributions as dist
import torch
import torch.nn.functional as F

from ..nn.gates import pyro_gates
from .sparse_model import SparseModel

__all__ = ["SparseClassifier"]


class SparseClassifier(SparseModel):
    r"""A :class:`~l0bayes.models.SparseModel` with the categorical likelihood: a gated network as a classifier.

    * ``model(x, y, num_data)``: every gate is a ``pyro.sample`` site drawing from the gate prior,
      the code cost :math:`\lambda_l \sum_g |g|\, q(z_g \ne 0)` is a ``pyro.factor``, and the labels
      are ``Categorical(logits=net(x))`` in a plate of size ``num_data`` (scale ``N/B``).
    * ``guide``: the gates' :math:`q(z)` with learnable ``log_alpha``; with
      ``TraceMeanField_ELBO`` the loss is the free energy of Eq. 21 with the analytic KL (Eq. 28).
    * :meth:`bayes_loss`: the same free energy (Eq. 21) for one gate draw computed directly in torch,
      equal to ``TraceMeanField_ELBO``'s loss for the same draws (float64), several times cheaper per step.
    * :meth:`penalized_loss`: the same objective without the KL (Eq. 22 = N times Eq. 9), likewise fused.

    :param net: the gated network (e.g. :class:`~l0bayes.nn.L0MLP`); it outputs class logits.
    :param lam, weight_decay, prior_inclusion: as for :class:`~l0bayes.models.SparseModel`.
    """

    test_metric = "test_error"
    #: The targets :func:`~l0bayes.inference.train` checks for: integer class labels in ``[0, num_classes)``.
    target_type = "classes"

    def __init__(self, net, lam=0.1, weight_decay=0.0, prior_inclusion=0.5):
        super().__init__(net, _cross_entropy, lam=lam, weight_decay=weight_decay, prior_inclusion=prior_inclusion)
        self.num_classes = getattr(net, "num_classes", None)

    def model(self, x, y=None, num_data=None):
        num_data = x.shape[0] if num_data is None else int(num_data)
        with pyro_gates(self.net, self._gate_prior):
            logits = self.net(x)
        pyro.factor("code_cost", -self.code_cost())
        with pyro.plate("data", num_data, subsample=torch.arange(x.shape[0], device=x.device)):
            return pyro.sample("obs", dist.Categorical(logits=logits), obs=y)


def _cross_entropy(logits, y):
    return F.cross_entropy(logits, y, reduction="mean")
