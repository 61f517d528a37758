"""The penalised objective of Eq. 22: the data term plus the code cost, without the gate KL."""

from .base import Objective, traced_free_energy

__all__ = ["PenalizedObjective"]


class PenalizedObjective(Objective):
    """Eq. 22: the data term plus the code cost (no gate KL); the model's ``penalized_loss`` when it has one."""

    name = "penalized"

    def step_with_data(self, x, y):
        if self.fused:
            nll, cost = self.model.penalized_loss(x, y, self.num_data)
            loss = nll + cost
        else:
            terms = traced_free_energy(self.model, x, y, self.num_data)
            loss, nll = terms.total, terms.nll
        return loss, loss / self.num_data, None, nll
