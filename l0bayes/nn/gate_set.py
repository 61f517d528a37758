r"""All the gates of a network handled together: one fused pass per training step.

A network such as the MLP 784-300-100 has one :class:`~l0bayes.nn.HardConcreteGate` per layer.
Sampling each (Eq. 10-11), evaluating each one's :math:`q(z \ne 0)` (Eq. 12) and each one's KL to
the prior (Eq. 28) separately costs dozens of tiny tensor operations per layer and step, which at
minibatch sizes on a CPU cost more than the matrix products. :class:`GateSet` concatenates the
``log_alpha`` of all gates that share ``(temperature, lower, upper)`` and does each of these once
per group; the results are the same numbers as the per-gate computations.
"""

import contextlib

import torch

from ..distributions import HardConcrete, kl_hard_concrete
from ..distributions.kl import kl_shared_parameters
from .gates import gates_of, hard_concrete_rsample, log_alpha_at_half


class _Group:
    """Gates sharing ``(temperature, lower, upper)``, in registration order."""

    def __init__(self, key, members):
        self.temperature, self.lower, self.upper = key
        self.names = [name for name, _ in members]
        self.gates = [gate for _, gate in members]
        self.sizes = [gate.num_gates for gate in self.gates]
        self.log_shift = log_alpha_at_half(self.temperature, self.lower, self.upper)
        self._cache = {}
        self._prior = self._prior_scalars = None

    def prior_scalars(self, prior):
        """``(log_alpha, temperature)`` of a scalar ``prior`` with this group's stretch as floats, else ``None``.

        Cached for the last prior object seen (the models pass the same cached prior every step).
        """
        if prior is not self._prior:
            params = (prior.log_alpha, prior.temperature, prior.lower, prior.upper)
            scalars = None
            if all(t.numel() == 1 for t in params):
                log_alpha, temperature, lower, upper = (float(t) for t in params)
                if (lower, upper) == (self.lower, self.upper):
                    scalars = (log_alpha, temperature)
            self._prior, self._prior_scalars = prior, scalars
        return self._prior_scalars

    def log_alpha(self):
        if len(self.gates) == 1:
            return self.gates[0].log_alpha
        return torch.cat([gate.log_alpha for gate in self.gates])

    def open_counts(self, z):
        """The number of nonzero draws of each member, counted in one pass (for conditional computation)."""
        if z.device.type != "cpu" or torch.compiler.is_compiling():
            # counting would synchronise the device, or break a compiled graph; the layers do not need it there
            return [None] * len(self.gates)
        if len(self.gates) == 1:
            return [int(torch.count_nonzero(z))]
        key = ("members", z.device)
        if key not in self._cache:
            ids = torch.repeat_interleave(torch.arange(len(self.sizes)), torch.tensor(self.sizes))
            self._cache[key] = ids.to(z.device)
        counts = torch.zeros(len(self.sizes), dtype=torch.int64, device=z.device)
        return counts.index_add_(0, self._cache[key], (z != 0).long()).tolist()

    def per_gate(self, key, values, like):
        """A cached vector repeating ``values[i]`` over the gates of member ``i`` (dtype/device of ``like``)."""
        cache_key = (key, like.dtype, like.device)
        if cache_key not in self._cache:
            self._cache[cache_key] = torch.cat(
                [
                    torch.full((n,), float(v), dtype=like.dtype, device=like.device)
                    for n, v in zip(self.sizes, values, strict=True)
                ]
            )
        return self._cache[cache_key]


class GateSet:
    """The :class:`~l0bayes.nn.HardConcreteGate` s of ``module``, grouped for fused evaluation.

    :param module: a network (any :class:`torch.nn.Module`) with hard concrete gates.

    Example::

        gates = GateSet(net)
        with gates.sampled() as log_alphas:       # one draw for every gate (Eq. 10-11)
            logits = net(x)                        # the layers use those draws
        cost = gates.weighted_l0(log_alphas, {"fc1.gate": 0.1, "fc2.gate": 0.1, "fc3.gate": 0.1})
    """

    def __init__(self, module):
        members = gates_of(module)
        if not members:
            raise ValueError("the module has no HardConcreteGate")
        groups = {}
        for name, gate in members:
            groups.setdefault((gate.temperature, gate.lower, gate.upper), []).append((name, gate))
        self.groups = [_Group(key, items) for key, items in groups.items()]
        self.names = [name for name, _ in members]

    @contextlib.contextmanager
    def sampled(self):
        """Within the context every gate returns one reparameterised draw, made for all gates at once.

        Yields the concatenated ``log_alpha`` of each group (reuse them for :meth:`weighted_l0`
        and :meth:`kl`, so the concatenation is built once per step).
        """
        log_alphas = [group.log_alpha() for group in self.groups]
        try:
            for group, log_alpha in zip(self.groups, log_alphas, strict=True):
                z = hard_concrete_rsample(log_alpha, group.temperature, group.lower, group.upper)
                counts = group.open_counts(z)
                for gate, value, count in zip(group.gates, z.split(group.sizes), counts, strict=True):
                    gate._value, gate._num_open = value, count
            yield log_alphas
        finally:
            for group in self.groups:
                for gate in group.gates:
                    gate._value = gate._num_open = None

    def log_alphas(self):
        """The concatenated ``log_alpha`` of each group (differentiable)."""
        return [group.log_alpha() for group in self.groups]

    def weighted_l0(self, log_alphas, weights):
        r""":math:`\sum_{\text{gates } g} w_{\text{layer}(g)}\, |g|\, q(z_g \ne 0)` (Eq. 12, 16).

        :param weights: ``{gate name: weight}``; gates not named weigh 0. Cached per call site:
            pass the same dictionary (or equal values) every step.
        """
        total = None
        for group, log_alpha in zip(self.groups, log_alphas, strict=True):
            values = [
                weights.get(name, 0.0) * gate.group_size for name, gate in zip(group.names, group.gates, strict=True)
            ]
            if not any(values):
                continue
            w = group.per_gate(("l0", tuple(values)), values, log_alpha)
            term = torch.dot(w, torch.sigmoid(log_alpha - group.log_shift))
            total = term if total is None else total + term
        if total is None:
            total = log_alphas[0].new_zeros(())
        return total

    def kl(self, log_alphas, prior):
        r""":math:`\sum_g KL(q(z_g) \| p(z_g))` (Eq. 28) over all gates, one quadrature pass per group.

        :param prior: a callable ``(temperature, lower, upper) ->`` the prior of the gates of that group:
            a :class:`HardConcrete` with a scalar batch, or, with the group's stretch, its ``(log_alpha,
            temperature)`` as two floats (no tensor is read back, so the call compiles into one graph under
            :func:`torch.compile`).
        """
        total = None
        for group, log_alpha in zip(self.groups, log_alphas, strict=True):
            p = prior(group.temperature, group.lower, group.upper)
            scalars = p if isinstance(p, tuple) else group.prior_scalars(p)
            if scalars is not None:  # the usual case: no distribution objects on the hot path
                kl = kl_shared_parameters(log_alpha, group.temperature, *scalars, group.lower, group.upper)
            else:
                q = HardConcrete(log_alpha, group.temperature, group.lower, group.upper, validate_args=False)
                kl = kl_hard_concrete(q, p)
            term = kl.sum()
            total = term if total is None else total + term
        return total
