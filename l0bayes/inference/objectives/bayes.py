"""The Bayesian objective: SVI on the free energy of Eq. 21."""

from pyro.infer import TraceMeanField_ELBO

from .base import Objective, pyro_loss

__all__ = ["BayesObjective"]


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

    def step_with_data(self, x, y):
        nll = None
        if self.elbo is None:
            nll, gate_kl, code_cost = self.model.bayes_loss(x, y, self.num_data)
            loss = nll + gate_kl + code_cost
        else:
            loss = pyro_loss(self.elbo.differentiable_loss, self.model, x, y, self.num_data)
        return loss, loss / self.num_data, None, nll
