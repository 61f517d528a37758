r"""An objective's training step replayed as CUDA graphs: its forward with the loss, and its backward.

On a GPU a gated network's step at minibatch sizes is bound by kernel launches, not by arithmetic: the gate
draw (Eq. 10-11), Eq. 12, the gated products and their backward are dozens of small kernels, each launched
from Python (``benchmarks/RESULTS.md``, "GPU"). :class:`GraphedStep` captures the objective's forward and
backward once with :func:`torch.cuda.make_graphed_callables` and then replays them: two launches instead of
dozens. The optimiser, the objective's update and the callbacks (``log_alpha`` projection, parameter
averaging, checkpoints) stay as they are, outside the graphs, so everything :func:`~l0bayes.inference.train`
does with a step it does with a graphed one.

What a graph changes (``docs/guide/training.md``, "On a GPU"):

* the minibatch shape is fixed at the first step: a minibatch of another shape (an epoch's smaller last one)
  and any call with the model in evaluation mode run the eager step;
* gate noise still comes from the default CUDA generator, which the capture registers: every replay draws new
  gates, from the generator's state at that replay, so seeding, checkpoints and resuming work as without
  graphs. The capture's own warm-up steps run with the random state and the model's buffers saved and
  restored;
* the step may not read anything back to the host, which the fused losses of the networks in
  :mod:`l0bayes.models` do not on CUDA (conditional computation is off there); a step that cannot be
  captured is a ``RuntimeError`` saying why (a failed capture leaves CUDA's generator unusable for the
  process, so there is no eager fallback).
"""

import torch

from .compiled import requirement_error

__all__ = ["GRAPH_REQUIREMENT", "GraphedStep"]

#: ``requirement_error``'s arguments for ``cuda_graph=True``.
GRAPH_REQUIREMENT = {"option": "cuda_graph=True", "why": "which read values back to the host"}


class _Step(torch.nn.Module):
    """A step (``objective.step_with_data``) as a module over the model's parameters, returning tensors only:
    ``(value, loss, data term..., statistics...)``, with only ``value`` differentiable (what the graphed backward
    starts from)."""

    def __init__(self, step, model):
        super().__init__()
        self.model = model  # a submodule: its parameters are the graph's inputs
        self._step = step  # not a submodule (an objective, a compiled function)

    def forward(self, x, y):
        loss, value, statistics, *data = self._step(x, y)
        data = () if not data or data[0] is None else (data[0].detach(),)
        rest = () if statistics is None else (statistics.detach(),)
        return (value, loss.detach(), *data, *rest)


class GraphedStep:
    r"""``step(x, y) -> (loss, value, statistics)`` of an objective (and the data term, when the step it captures
    gives one: ``objective.step_with_data``), captured as CUDA graphs at its first call.

    :param objective: an :class:`~l0bayes.inference.objectives.Objective` whose model has the fused loss
        (``bayes_loss`` for ``"bayes"``, ``penalized_loss`` otherwise).
    :param step: the function to capture, ``objective.step_with_data`` by default (e.g. a
        :class:`~l0bayes.inference.compiled.CompiledStep` of it).
    :param int warmup: eager iterations before the capture (:func:`torch.cuda.make_graphed_callables`).
    :raises ValueError: when the objective would go through Pyro's traces.

    :ivar graphed: ``True`` once captured, ``False`` when the capture failed, ``None`` before the first call.
    """

    def __init__(self, objective, step=None, warmup=3):
        if not objective.fused:
            raise ValueError(requirement_error(objective.model, objective.name, **GRAPH_REQUIREMENT))
        self.objective = objective
        self._eager = objective.step_with_data if step is None else step
        self.warmup = int(warmup)
        self.graphed = None
        self._module = None
        self._signature = None  # (shape, dtype) of x and y at the capture
        self._with_statistics = False
        self._with_data = False

    @staticmethod
    def _signature_of(x, y):
        return (tuple(x.shape), x.dtype, tuple(y.shape), y.dtype)

    def __call__(self, x, y):
        if self.graphed is None:
            self._capture(x, y)
        if not self.graphed or self._signature_of(x, y) != self._signature or not self.objective.model.training:
            return self._eager(x, y)
        out = self._module(x, y)
        value, loss = out[0], out[1]
        statistics = out[-1] if self._with_statistics else None
        return (loss, value, statistics, out[2]) if self._with_data else (loss, value, statistics)

    def _capture(self, x, y):
        model = self.objective.model
        module = _Step(self._eager, model)
        buffers = [(b, b.clone()) for b in model.buffers()]
        try:
            with torch.random.fork_rng(devices=[x.device] if x.device.type == "cuda" else []):
                # One step first, to know the outputs (and fill the caches of constants the step reads), without
                # gradients: an autograd graph alive during the capture would tie the parameters' gradient
                # accumulation to this stream, and the capture's backward would wait on it (which breaks it).
                with torch.no_grad():
                    first = self._eager(x, y)
                    self._with_statistics = first[2] is not None
                    self._with_data = len(first) > 3 and first[3] is not None
                self._module = capture(module, (x, y), self.warmup)
        except Exception as err:  # e.g. a read back to the host inside the step
            self.graphed = False
            self._module = None
            reason = f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"[:300]
            raise RuntimeError(
                f"cuda_graph=True: the training step could not be captured as a CUDA graph ({reason}); "
                "train without cuda_graph"
            ) from err
        else:
            self.graphed = True
            self._signature = self._signature_of(x, y)
        finally:
            with torch.no_grad():
                for buffer, saved in buffers:
                    buffer.copy_(saved)


def capture(module, sample_args, warmup):
    """``module`` (forward and backward) as CUDA graphs; a function of the same arguments that replays them.

    :func:`torch.cuda.make_graphed_callables` with unused parameters allowed (e.g. gates fixed by the
    constrained objective's final phase).
    """
    if sample_args[0].device.type != "cuda":
        raise ValueError(f"a CUDA graph needs the minibatch on a CUDA device, got {sample_args[0].device}")
    return torch.cuda.make_graphed_callables(module, sample_args, num_warmup_iters=warmup, allow_unused_input=True)
