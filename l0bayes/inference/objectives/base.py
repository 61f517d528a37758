"""The base class of the training objectives, and the Pyro losses that the objectives without a fused loss trace."""

import torch

from ..errors import NonFiniteLossError
from ..free_energy import free_energy

__all__ = ["Objective", "pyro_loss", "traced_free_energy"]


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
        """``(loss in nats, differentiable per-example objective, step statistics or None)`` on a minibatch.

        A subclass defines this or :meth:`step_with_data`."""
        if type(self).step_with_data is Objective.step_with_data:
            raise NotImplementedError
        return self.step_with_data(x, y)[:3]

    def step_with_data(self, x, y):
        """:meth:`step` and the data term of its loss: the ``nll`` (:math:`N` times the minibatch's mean loss per
        example, e.g. a language model's loss per token, without what the objective adds to it), or ``None`` where
        it is not known apart (Pyro's ELBO). What :func:`~l0bayes.inference.train` steps (the history's
        ``train_loss``)."""
        return (*self.step(x, y), None)

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


def pyro_loss(loss_fn, model, x, y, num_data):
    """A Pyro loss; a Pyro validation error raised because a parameter went non-finite becomes that error."""
    try:
        return loss_fn(model.model, model.guide, x, y, num_data)
    except ValueError as err:
        names = [n for n, p in model.named_parameters() if not bool(torch.isfinite(p).all())]
        if names:
            raise NonFiniteLossError(f"parameters {names} are NaN or infinite ({str(err).splitlines()[0]})") from None
        raise


def traced_free_energy(model, x, y, num_data):
    """The terms of Eq. 22 (no gate KL) for one draw, by tracing the model's ``model`` and ``guide``."""
    return pyro_loss(lambda m, g, *a: free_energy(m, g, *a, kl=False), model, x, y, num_data)
