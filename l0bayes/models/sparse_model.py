"""Any gated network with any loss, trained under Eq. 21, Eq. 22 or a target density."""

import pyro
import torch
from torch import nn

from .._checks import NON_NEGATIVE, PROBABILITY, check_args
from ..inference.free_energy import DATA_FACTOR
from ..nn.gate_set import GateSet
from ..nn.gates import gate_prior, gates_of, prior_like, pyro_gates
from ..nn.penalty import expected_l2

# The table of argument checks (a per-layer ``lam`` dict is checked value by value).
ARG_CHECKS = {"lam": NON_NEGATIVE, "weight_decay": NON_NEGATIVE, "prior_inclusion": PROBABILITY}


class SparseModel(nn.Module):
    r"""A network whose gates are :class:`~l0bayes.nn.HardConcreteGate` modules, with the loss you choose.

    ``loss_fn(output, target)`` returns the *mean* loss over the minibatch, in nats per example: the
    negative log-likelihood of one example for the Bayesian objective (Eq. 21; e.g.
    ``F.cross_entropy``, ``F.binary_cross_entropy_with_logits`` for multi-label targets, or
    ``0.5 * F.mse_loss / sigma**2`` plus a constant for a Gaussian regression), or any loss for the
    penalised (Eq. 22) and constrained objectives. The data term of a minibatch of ``B`` out of ``N`` examples is
    ``N * loss_fn(net(x), y)`` (the ``N/B`` scaling of ``pyro.plate`` subsampling).

    * :meth:`bayes_loss`: Eq. 21 for one gate draw: ``(data term, gate KL, code cost)``, all gates in
      one fused pass (:class:`~l0bayes.nn.gate_set.GateSet`) and the KL in closed-form gradient quadrature.
    * :meth:`penalized_loss`: the same without the KL (Eq. 22), likewise fused.
    * ``model`` / ``guide``: the same as Pyro functions (the data term as ``pyro.factor("data_loss", ...)``),
      for ``TraceMeanField_ELBO`` and :func:`~l0bayes.inference.free_energy`.

    :param net: the gated network, e.g. from :func:`~l0bayes.pruning.sparsify` or :class:`~l0bayes.nn.L0MLP`.
    :param loss_fn: ``loss_fn(output, target) -> mean loss``: a floating-point scalar tensor computed from
        ``output`` (attached to the graph, so that the weights train). Anything else (a loss with
        ``reduction="none"``, a Python float, ``None``, a detached tensor) is a ``TypeError`` or ``ValueError``
        naming ``loss_fn`` at the first step.
    :param lam: code cost in nats per active parameter (docs/mathematics.md, "The variational free energy":
        the paper's :math:`\lambda = 0.1/N` is ``lam = 0.1``), a float or ``{layer name: lam}`` for per-layer
        lambdas (e.g. ``{"fc1": 0.1, "fc2": 0.05}``; layers not named pay nothing).
    :param float weight_decay: coefficient of the expected L2 penalty (Eq. 15/17), in nats:
        adds ``0.5 * weight_decay * sum_g q(z_g != 0) ||theta_g||^2`` over the L0 layers
        (:func:`l0bayes.nn.penalty.expected_l2`).
    :param prior_inclusion: prior :math:`P(z \ne 0)` of every gate for the Bayesian objective.
    """

    #: What the training record reports on test data: the mean of ``loss_fn`` (a classifier: the error rate).
    test_metric = "test_loss"

    def __init__(self, net, loss_fn, lam=0.1, weight_decay=0.0, prior_inclusion=0.5):
        super().__init__()
        if not callable(loss_fn):
            raise TypeError(f"loss_fn must be a function (output, target) -> mean loss, got {loss_fn!r}")
        owner = type(self).__name__
        lams = {f"lam[{k!r}]": v for k, v in lam.items()} if isinstance(lam, dict) else {"lam": lam}
        for name, value in lams.items():
            ARG_CHECKS["lam"](owner, name, value)
        check_args(owner, ARG_CHECKS, weight_decay=weight_decay, prior_inclusion=prior_inclusion)
        self.net = net
        self.loss_fn = loss_fn
        self.lam = lam
        self.weight_decay = float(weight_decay)
        self.prior_inclusion = float(prior_inclusion)
        self._gates = gates_of(net)
        if not self._gates:
            raise ValueError("the network has no HardConcreteGate modules")
        self._gate_set = GateSet(net)
        self._priors = {}
        if isinstance(lam, dict):
            known = {_layer_name(name) for name, _ in self._gates}
            unknown = set(lam) - known
            if unknown:
                raise ValueError(f"lam names unknown layers {sorted(unknown)}; gated layers are {sorted(known)}")

    def forward(self, x):
        return self.net(x)

    def _lams(self):
        """``{gate name: lambda}``, rebuilt only when :attr:`lam` has been replaced or changed."""
        key = tuple(sorted(self.lam.items())) if isinstance(self.lam, dict) else self.lam
        if getattr(self, "_lams_key", None) != key:
            self._lams_cache = {name: self._lam(name) for name, _ in self._gates}
            self._lams_key = key
        return self._lams_cache

    def _lam(self, name):
        if isinstance(self.lam, dict):
            return float(self.lam.get(_layer_name(name), 0.0))
        return float(self.lam)

    def code_cost(self, log_alphas=None):
        r""":math:`\sum_l \lambda_l \sum_g |g|\, q(z_g \ne 0)` plus the expected L2 term (nats)."""
        if log_alphas is None:
            log_alphas = self._gate_set.log_alphas()
        total = self._gate_set.weighted_l0(log_alphas, self._lams())
        if self.weight_decay:
            total = total + 0.5 * self.weight_decay * expected_l2(self.net)
        return total

    def expected_l0(self):
        """Expected number of active parameters in gated groups (Eq. 16)."""
        return sum(gate.expected_l0() for _, gate in self._gates)

    def num_gated_parameters(self):
        return sum(gate.num_gates * gate.group_size for _, gate in self._gates)

    def _prior(self, temperature, lower, upper, like):
        """The gate prior for gates with these hyper-parameters, cached per dtype and device."""
        key = (temperature, lower, upper, like.dtype, like.device)
        if key not in self._priors:
            prior = gate_prior(self.prior_inclusion, temperature=temperature, lower=lower, upper=upper)
            self._priors[key] = prior_like(prior, like)
        return self._priors[key]

    def _prior_scalars(self, temperature, lower, upper):
        """``(log_alpha, temperature)`` of the gate prior as exact (float64) floats, cached.

        The fused KL of :meth:`bayes_loss` takes them with the gates' own float stretch, so nothing is
        rounded to the model's dtype before the quadrature.
        """
        key = (temperature, lower, upper, "floats")
        if key not in self._priors:
            prior = gate_prior(self.prior_inclusion, temperature=temperature, lower=lower, upper=upper)
            self._priors[key] = (float(prior.log_alpha), float(prior.temperature))
        return self._priors[key]

    def _gate_prior(self, gate):
        return self._prior(gate.temperature, gate.lower, gate.upper, gate.log_alpha)

    def data_term(self, output, y, num_data):
        """``num_data * loss_fn(output, y)``: the data term of Eq. 21/22 for a minibatch, in nats.

        :raises TypeError: naming ``loss_fn`` when it returns anything but a floating-point tensor.
        :raises ValueError: naming ``loss_fn`` when it returns a tensor that is not a scalar, or (while the
            network's output takes gradients) one detached from the output, or a leaf tensor not computed from it,
            which would leave the weights untrained.
        """
        loss = self.loss_fn(output, y)
        _check_loss(self.loss_fn, loss, output)
        return loss * num_data

    def model(self, x, y=None, num_data=None):
        num_data = x.shape[0] if num_data is None else int(num_data)
        with pyro_gates(self.net, self._gate_prior):
            output = self.net(x)
        pyro.factor("code_cost", -self.code_cost())
        if y is not None:
            pyro.factor(DATA_FACTOR, -self.data_term(output, y, num_data))
        return output

    def guide(self, x, y=None, num_data=None):
        for name, gate in self._gates:
            pyro.sample(name or "gate", gate.distribution().to_event(1))

    def _forward_sampled(self, x):
        """Output with one fused draw of every gate in training mode (Eq. 13 gates in eval mode)."""
        if not self.net.training:
            return self.net(x), self._gate_set.log_alphas()
        with self._gate_set.sampled() as log_alphas:
            return self.net(x), log_alphas

    def bayes_loss(self, x, y, num_data):
        r"""Eq. 21 for one gate draw, in nats: ``(nll, gate KL, code cost)``.

        ``nll`` is :meth:`data_term` (for a likelihood,
        :math:`-\tfrac{N}{B}\sum_{i \in B} \log p(y_i \mid x_i, z)`), the gate KL is
        :math:`\sum_g KL(q(z_g) \| p(z_g))` (Eq. 28) and the code cost as in :meth:`code_cost`;
        their sum is the loss ``TraceMeanField_ELBO`` computes from :meth:`model` and :meth:`guide`
        for the same draws (in float64; in float32 the KL here is the more accurate one, since Pyro's
        distributions first round the stretch, temperatures and prior to float32).
        """
        output, log_alphas = self._forward_sampled(x)
        nll = self.data_term(output, y, num_data)
        return nll, self._gate_set.kl(log_alphas, self._prior_scalars), self.code_cost(log_alphas)

    def penalized_loss(self, x, y, num_data):
        """Eq. 22 in nats: ``(num_data * mean loss, code cost)`` (one gate sample per call)."""
        output, log_alphas = self._forward_sampled(x)
        return self.data_term(output, y, num_data), self.code_cost(log_alphas)


def _check_loss(loss_fn, loss, output):
    """A clear error for a ``loss_fn`` result the data term cannot use (checked from its type, shape and flags:
    nothing is read from the device)."""
    name = f"loss_fn ({_describe(loss_fn)})"
    if not torch.is_tensor(loss) or not loss.is_floating_point():
        got = f"a {loss.dtype} tensor" if torch.is_tensor(loss) else type(loss).__name__
        raise TypeError(
            f"{name} must return the mean loss over the minibatch as a floating-point scalar tensor computed from "
            f"the output, got {got}"
        )
    if loss.dim() != 0:
        raise ValueError(
            f"{name} must return the mean loss over the minibatch, a scalar tensor, got shape {tuple(loss.shape)} "
            "(a loss with reduction='none'? take its mean, or use reduction='mean')"
        )
    if torch.compiler.is_compiling():  # the autograd graph is the compiler's while it traces (a read breaks the graph)
        return
    if torch.is_grad_enabled() and loss.grad_fn is None and _requires_grad(output) and not _is_part(loss, output):
        why = "requires_grad=False" if not loss.requires_grad else "a leaf tensor, not computed from the output"
        raise ValueError(
            f"{name} returned a tensor detached from the network's output ({why}): the weights would never train; "
            "compute it from the output with torch operations, without .detach(), .item(), torch.no_grad() or a "
            "new torch.tensor(...)"
        )


def _is_part(tensor, output):
    """Whether ``tensor`` is the output itself or one of its parts (a network whose output is a leaf)."""
    if tensor is output:
        return True
    if isinstance(output, dict):
        output = list(output.values())
    return isinstance(output, (list, tuple)) and any(_is_part(tensor, part) for part in output)


def _requires_grad(output):
    """Whether a network's output (a tensor, or a structure of them such as a Hugging Face ``ModelOutput``, a
    tuple or a dict) holds a tensor attached to the graph."""
    if torch.is_tensor(output):
        return output.requires_grad
    if isinstance(output, dict):
        output = list(output.values())
    if isinstance(output, (list, tuple)):
        return any(_requires_grad(part) for part in output)
    return False


def _describe(fn):
    """A function's name for a message: ``cross_entropy``, ``CrossEntropyLoss()``, ``<lambda>``."""
    name = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None)
    return name if isinstance(name, str) else f"{type(fn).__name__}()"


def _layer_name(gate_name):
    """``"fc1.gate"`` -> ``"fc1"``: per-layer settings are keyed by the gated layer's name."""
    return gate_name[: -len(".gate")] if gate_name.endswith(".gate") else gate_name
