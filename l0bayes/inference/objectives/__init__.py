r"""The training objectives: the settings a user chooses, and the small estimator each becomes in a run.

A user builds :class:`Bayes`, :class:`Penalized` or :class:`Constrained` (:mod:`.settings`: every objective
setting defined and checked there) and gives it to :func:`~l0bayes.inference.train`, which binds it to the model
(:meth:`ObjectiveSettings.build`). As Pyro's ``SVI`` holds an ELBO, the loop holds the :class:`Objective` that
gives. Each knows:

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
  that fixes the gates so that the pruned model meets the target
  (:mod:`~l0bayes.inference.objectives.final_phase`); with a target architecture, its constraints
  (:mod:`~l0bayes.inference.objectives.architecture`). :func:`constrained_summary` says what a constrained
  run achieved.
"""

from .base import Objective
from .bayes import BayesObjective
from .constrained import MULTIPLIER_LR, MULTIPLIER_LR_PER_LR, ConstrainedObjective
from .final_phase import FINAL_PHASE
from .penalized import PenalizedObjective
from .settings import OBJECTIVES, Bayes, Constrained, ObjectiveSettings, Penalized, as_objective
from .summary import constrained_rows, constrained_summary

__all__ = [
    "FINAL_PHASE",
    "OBJECTIVES",
    "Bayes",
    "Constrained",
    "ObjectiveSettings",
    "Penalized",
    "as_objective",
    "MULTIPLIER_LR",
    "MULTIPLIER_LR_PER_LR",
    "BayesObjective",
    "ConstrainedObjective",
    "Objective",
    "PenalizedObjective",
    "constrained_rows",
    "constrained_summary",
]
