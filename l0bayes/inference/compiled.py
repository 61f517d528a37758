r"""An objective's training step under :func:`torch.compile`: the gated network's forward, the loss and its backward.

A training step of a gated network at minibatch sizes is dozens of small tensor operations (the gate
draw of Eq. 10-11, Eq. 12, the gated products, the gate KL of Eq. 28), each with its own dispatch cost.
:func:`torch.compile` fuses them into a few generated kernels, and through AOTAutograd does the same
for the backward pass; the matrix products stay library calls. The values are those of the eager step
up to the rounding of the fused kernels.

What changes inside the compiled region (``docs/guide/training.md``, "Compiling the training step"):

* conditional computation (:mod:`l0bayes.nn.gated_ops`) is off: the number of open groups would be a
  data-dependent shape, so every product is the full one (the same values);
* the graph is specialised to the minibatch shape (``dynamic=False``): an epoch whose last minibatch
  is smaller compiles a second graph once, and every later epoch reuses both, so a resumed run takes
  the same kernels as an uninterrupted one.
"""

import torch

__all__ = ["CompiledStep"]


class CompiledStep:
    r"""``objective.step`` compiled with :func:`torch.compile`, for the loop of :func:`~l0bayes.inference.train`.

    Before its first compiled call it evaluates the step once eagerly, with the random number generators
    saved and restored and the result discarded. That fills the caches of constants the step reads (the
    gate prior's parameters, the KL's quadrature nodes, the per-gate code-cost weights), so the compiled
    graph reads them as constants instead of building them, and the draws of the run are unchanged.

    :param objective: an :class:`~l0bayes.inference.objectives.Objective` whose model has the fused
        losses (``penalized_loss``, and ``bayes_loss`` for ``"bayes"``); Pyro's traces do not compile.
    :param options: keyword arguments of :func:`torch.compile` (default ``dynamic=False``).
    :raises ValueError: when the objective would go through Pyro's traces.
    """

    def __init__(self, objective, **options):
        if not objective.fused:
            raise ValueError(
                f"compile=True needs a model with the fused losses (penalized_loss, and bayes_loss for the "
                f"'bayes' objective), e.g. SparseClassifier; {type(objective.model).__name__} goes through Pyro's "
                "traces, which torch.compile does not capture"
            )
        self.objective = objective
        options = {"dynamic": False, "options": {"fallback_random": True}, **options}
        self._compiled = torch.compile(objective.step, **options)
        self._warm = False

    def __call__(self, x, y):
        if not self._warm:
            self._warm_caches(x, y)
        return self._compiled(x, y)

    def _warm_caches(self, x, y):
        devices = [x.device] if x.device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices):
            self.objective.step(x, y)
        self._warm = True
