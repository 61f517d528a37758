r"""The multipliers of the constrained objective stepped by a ``torch.optim`` optimiser (``multiplier_optimizer``).

The multipliers :math:`\mu` are one tensor of shape ``(count,)``: ``(1,)`` for one global constraint, never 0-d
(FSDP2 refuses scalar parameters), one entry per constraint otherwise. Their gradient at a step is that step's
violation :math:`d - \epsilon` (the derivative of the Lagrangian in :math:`\mu`), so the optimiser *ascends* it
(``maximize=True``), as Sheared-LLaMA's multipliers are ascended; after its step they are projected onto
:math:`\mu \ge 0` (in :meth:`~l0bayes.inference.objectives.ConstrainedObjective.update`, with the dual restarts).
"""

import torch

from ...io import cpu_copy
from ..optimizers import describe_optimizer

__all__ = ["MultiplierOptimizer", "check_factory", "refuse_other_ascent"]

#: A factory that ascends, for the messages.
EXAMPLE = "lambda p: torch.optim.Adam(p, lr=1.0, betas=(0.9, 0.95), maximize=True)"


def check_factory(factory):
    """``factory`` as ``Constrained(multiplier_optimizer=)`` takes it: ``None`` or a callable that is not a class.

    :raises TypeError: for anything else, with an example.
    """
    if factory is None:
        return None
    if isinstance(factory, type) or not callable(factory):
        what = f"the class {factory.__name__}" if isinstance(factory, type) else f"{type(factory).__name__} {factory!r}"
        raise TypeError(
            "Constrained: multiplier_optimizer must be None or a factory params -> torch.optim.Optimizer (called with "
            f"a list holding the multipliers' tensor), e.g. {EXAMPLE}, got {what}"
        )
    return factory


class MultiplierOptimizer:
    """The optimiser of ``factory([mu])`` over the multipliers ``mu``, checked, stepped with a violation as gradient.

    :param factory: ``params -> torch.optim.Optimizer`` (:func:`check_factory`).
    :param mu: the multipliers (shape ``(count,)``); the optimiser steps this very tensor, in place.
    :raises TypeError: when ``factory`` returns something else than a :class:`torch.optim.Optimizer`;
        :class:`ValueError` when the optimiser does not hold exactly ``mu``, or does not maximise.
    """

    def __init__(self, factory, mu):
        self.mu = mu
        built = factory([mu])
        if not isinstance(built, torch.optim.Optimizer):
            raise TypeError(
                f"Constrained: multiplier_optimizer must return a torch.optim.Optimizer, got {type(built).__name__} "
                f"(e.g. {EXAMPLE})"
            )
        held = [p for group in built.param_groups for p in group["params"]]
        if len(held) != 1 or held[0] is not mu:
            raise ValueError(
                "Constrained: multiplier_optimizer's optimiser must hold exactly the tensor of multipliers it is "
                f"given (one tensor of shape {tuple(mu.shape)}), it holds {len(held)} tensor(s) of shapes "
                f"{[tuple(p.shape) for p in held]}"
            )
        if not all(group.get("maximize") is True for group in built.param_groups):
            raise ValueError(
                "Constrained: multiplier_optimizer must ascend the multipliers (maximize=True): their gradient is the "
                "violation d - target, and a multiplier grows while its constraint is violated, e.g. "
                f"{EXAMPLE}; {type(built).__name__} was built with maximize="
                f"{built.param_groups[0].get('maximize')!r}"
            )
        self.optimizer = built
        mu.grad = torch.zeros_like(mu)  # the violation of each step, copied in (the optimiser reads it)

    @torch.no_grad()
    def step(self, violation):
        """One step of the optimiser with gradient ``violation`` (``mu`` changes in place; not yet projected)."""
        self.mu.grad.copy_(violation)
        self.optimizer.step()

    def describe(self):
        """The optimiser's class and hyperparameters (:func:`~l0bayes.inference.optimizers.describe_optimizer`)."""
        return describe_optimizer(self.optimizer)

    def state_dict(self):
        """The optimiser's state (CPU copies) and its description, for a checkpoint."""
        return {"description": self.describe(), "state": cpu_copy(self.optimizer.state_dict())}

    def load_state_dict(self, state):
        """Restore :meth:`state_dict`; a checkpoint of another optimiser or other hyperparameters is refused."""
        if state["description"] != self.describe():
            raise ValueError(
                f"the checkpoint's multipliers were stepped by {state['description']}, this run's multiplier_optimizer "
                f"is {self.describe()}"
            )
        self.optimizer.load_state_dict(state["state"])


def refuse_other_ascent(saved, ascent):
    """Refuse to continue a checkpoint whose multipliers were stepped otherwise than this run's (``saved``: the
    checkpoint's ``multiplier_optimizer`` entry or ``None``; ``ascent``: this run's :class:`MultiplierOptimizer` or
    ``None``)."""
    if (saved is None) == (ascent is None):
        return
    projected = "projected gradient ascent (multiplier_optimizer=None)"
    theirs = projected if saved is None else f"the optimiser {saved['description']}"
    ours = projected if ascent is None else f"the optimiser {ascent.describe()}"
    raise ValueError(
        f"the checkpoint's multipliers were stepped by {theirs}, this run's by {ours}: its multiplier_optimizer "
        "must be the checkpoint's"
    )
