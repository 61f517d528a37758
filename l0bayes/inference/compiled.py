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

__all__ = ["RECOMPILE_LIMIT", "CompiledStep", "requirement_error"]


#: Graphs :func:`torch.compile` may keep per step function (PyTorch's default is 8). The graphs are shared
#: between models, and a model with other settings (``lam``, the prior, the data size) or a smaller last
#: minibatch adds one: a sweep over a few dozen settings in one process stays compiled.
RECOMPILE_LIMIT = 64


def requirement_error(model, objective, option="compile=True", why="which torch.compile does not capture"):
    """Why ``option`` cannot apply to ``objective`` for ``model`` (a message), or ``None`` when it can.

    ``compile=True`` and ``cuda_graph=True`` both need the model's fused loss (``bayes_loss`` for ``"bayes"``,
    ``penalized_loss`` otherwise): the other path goes through Pyro's traces, ``why`` says what that breaks.
    """
    needed = "bayes_loss" if objective == "bayes" else "penalized_loss"
    if hasattr(model, needed):
        return None
    return (
        f"{option} needs a model with the fused loss {needed} for the {objective!r} objective (e.g. "
        f"SparseClassifier); {type(model).__name__} goes through Pyro's traces, {why}"
    )


class CompiledStep:
    r"""``objective.step_with_data`` (the objective's step and the data term of its loss) compiled with
    :func:`torch.compile`, for the loop of :func:`~l0bayes.inference.train`.

    Before its first compiled call it evaluates the step once eagerly and discards the result, with the
    random number generators and the model's buffers (e.g. batch-norm statistics) saved and restored.
    That fills the caches of constants the step reads (the gate prior's parameters, the KL's quadrature
    nodes, the per-gate code-cost weights), so the compiled graph reads them instead of building them,
    and the run's draws and statistics are those of the eager run.

    :param objective: an :class:`~l0bayes.inference.objectives.Objective` whose model has the fused
        loss (``bayes_loss`` for ``"bayes"``, ``penalized_loss`` otherwise); Pyro's traces do not compile.
    :param options: keyword arguments of :func:`torch.compile`; the defaults ``dynamic=False`` and
        Inductor's ``fallback_random=True`` (the eager random stream) stay unless overridden one by one.
    :raises ValueError: when the objective would go through Pyro's traces.
    """

    def __init__(self, objective, **options):
        if not objective.fused:
            raise ValueError(requirement_error(objective.model, objective.name))
        self.objective = objective
        inductor = {"fallback_random": True, **options.pop("options", {})}
        self._compiled = torch.compile(objective.step_with_data, **{"dynamic": False, **options, "options": inductor})
        self._warm = False
        self._shapes = set()  # the minibatch shapes this step has compiled (or found) a graph for

    def __call__(self, x, y):
        if not self._warm:
            self._warm_caches(x, y)
        shape = (x.shape, y.shape)
        if shape in self._shapes:
            return self._compiled(x, y)
        # A new shape, or this model's first call, may compile a graph: allow for the graphs of other models.
        import torch._dynamo  # here, not at import: it takes seconds, and only a compiled step needs it

        limit = max(RECOMPILE_LIMIT, torch._dynamo.config.recompile_limit)
        with torch._dynamo.config.patch(recompile_limit=limit):
            out = self._compiled(x, y)
        self._shapes.add(shape)
        return out

    def _warm_caches(self, x, y):
        devices = [x.device] if x.device.type == "cuda" else []
        buffers = [(b, b.clone()) for b in self.objective.model.buffers()]
        with torch.random.fork_rng(devices=devices):
            self.objective.step_with_data(x, y)
        with torch.no_grad():
            for buffer, saved in buffers:
                buffer.copy_(saved)
        self._warm = True
