"""Exponential moving average of a module's parameters, for evaluation (the paper's code uses ``beta = 0.999``)."""

import contextlib

import torch

__all__ = ["ParameterAverage"]


class ParameterAverage:
    r"""Bias-corrected exponential moving average of a module's parameters (Polyak-Ruppert style).

    After ``t`` calls of :meth:`update`, the average is
    :math:`\bar\theta_t = (1-\beta)\sum_{s=1}^{t}\beta^{t-s}\theta_s / (1-\beta^t)`: a weighted mean of the
    iterates with weights summing to one (the accumulator starts at zero, as Adam's moments do).
    :meth:`swapped` puts the average into the module for evaluation and the raw parameters back after.
    """

    def __init__(self, module, decay):
        self.decay = float(decay)
        if not 0.0 <= self.decay < 1.0:
            raise ValueError(f"decay must lie in [0, 1), got {decay!r}")
        self.params = [p for p in module.parameters()]
        self.sums = [torch.zeros_like(p, memory_format=torch.preserve_format) for p in self.params]
        self.steps = 0

    @torch.no_grad()
    def update(self):
        """Fold the current parameters into the average: ``s <- beta s + (1 - beta) theta``."""
        torch._foreach_lerp_(self.sums, [p.detach() for p in self.params], 1.0 - self.decay)
        self.steps += 1

    def averaged(self):
        """The bias-corrected averages, one tensor per parameter."""
        if self.steps == 0:
            raise RuntimeError("no update yet: the average is undefined")
        correction = 1.0 - self.decay**self.steps
        return [s / correction for s in self.sums]

    @torch.no_grad()
    def copy_to_model(self):
        """Overwrite the module's parameters with the average."""
        torch._foreach_copy_(self.params, self.averaged())

    @contextlib.contextmanager
    def swapped(self):
        """Within the context the module holds the averaged parameters (no-op before the first update)."""
        if self.steps == 0:
            yield
            return
        with torch.no_grad():
            raw = [p.detach().clone() for p in self.params]
            self.copy_to_model()
        try:
            yield
        finally:
            with torch.no_grad():
                torch._foreach_copy_(self.params, raw)

    def state_dict(self):
        """Decay, number of updates and the (uncorrected) accumulators, on the CPU, for a checkpoint."""
        return {"decay": self.decay, "steps": self.steps, "sums": [s.detach().cpu().clone() for s in self.sums]}

    def load_state_dict(self, state):
        """Restore :meth:`state_dict`; the decay and the number of tensors must match this average's."""
        if float(state["decay"]) != self.decay:
            raise ValueError(f"the saved average has decay {state['decay']}, this one {self.decay}")
        if len(state["sums"]) != len(self.sums):
            raise ValueError(f"average holds {len(state['sums'])} tensors, the model {len(self.sums)} parameters")
        with torch.no_grad():
            for s, saved in zip(self.sums, state["sums"], strict=True):
                s.copy_(saved)
        self.steps = int(state["steps"])
