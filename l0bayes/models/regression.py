"""Spike-and-slab variable selection with hard concrete gates (Appendix A, Eq. 18-21)."""

import math

import pyro
import pyro.distributions as dist
import torch
from pyro.nn import PyroModule, pyro_method
from torch import nn

from .._checks import COUNT, GATE_SHAPE, NON_NEGATIVE, POSITIVE, PROBABILITY, check_args
from ..nn.gates import HardConcreteGate, gate_prior, prior_like
from ..utils import check_xy

SLABS = ("point", "gaussian")

# The table of argument checks of the regression models.
ARG_CHECKS = {
    "num_features": COUNT,
    "prior_inclusion": PROBABILITY,
    "prior_scale": POSITIVE,
    "code_cost": NON_NEGATIVE.or_none(),
    "init_drop_rate": PROBABILITY,
    "noise_scale": POSITIVE.or_none(),
    **GATE_SHAPE,
}


class _SpikeSlabGLM(PyroModule):
    r"""Shared machinery: :math:`\theta_j = \tilde\theta_j z_j`, one hard concrete gate per coefficient.

    A :class:`~pyro.nn.PyroModule`: ``model`` and ``guide`` are Pyro methods, so inside them the
    module's parameters are ``pyro.param`` sites and Pyro's own ``SVI`` with a ``pyro.optim``
    optimiser trains them; :func:`~l0bayes.inference.train` optimises ``module.parameters()``
    with a torch optimiser instead. As with any ``PyroModule``, parameter names in Pyro's global
    parameter store are the attribute paths (``weight``, ``gate$$$log_alpha``...): call
    ``pyro.clear_param_store()`` before fitting a second model with Pyro's ``SVI`` in one session.

    The model's gate sites ``"z"`` draw from the prior :math:`p(z)` (a hard concrete with
    :math:`P(z \ne 0)` = ``prior_inclusion``), the guide's from :math:`q(z)` with learnable
    ``log_alpha``; ``TraceMeanField_ELBO`` therefore uses the analytic KL of Eq. 28.

    Slab:

    * ``"point"`` (Eq. 21): :math:`\tilde\theta` is a point estimate and each active coefficient
      costs ``code_cost`` nats, added as ``pyro.factor("code_cost", -lambda * sum_j q(z_j != 0))``.
      ``code_cost=None`` uses :math:`\tfrac12 \log N` (the BIC price of one parameter).
    * ``"gaussian"`` (Eq. 20): :math:`q(\tilde\theta_j) = N(\mu_j, s_j^2)` against the prior
      :math:`N(0, \mathrm{prior\_scale}^2)`, paid only when the gate is on:
      ``pyro.factor("code_cost", -sum_j q(z_j != 0) KL_j)``; the slab is sampled by
      reparameterisation from a standard normal site ``"slab_noise"`` present in both model and
      guide (their KL is zero).
    """

    def __init__(
        self,
        num_features,
        prior_inclusion=0.5,
        slab="point",
        prior_scale=1.0,
        code_cost=None,
        init_drop_rate=0.5,
        temperature=2.0 / 3.0,
        lower=-0.1,
        upper=1.1,
    ):
        super().__init__()
        if slab not in SLABS:
            raise ValueError(f"slab must be one of {SLABS}, got {slab!r}")
        check_args(
            type(self).__name__,
            ARG_CHECKS,
            num_features=num_features,
            prior_inclusion=prior_inclusion,
            prior_scale=prior_scale,
            code_cost=code_cost,
            init_drop_rate=init_drop_rate,
            temperature=temperature,
            lower=lower,
            upper=upper,
        )
        self.num_features = int(num_features)
        self.slab = slab
        self.prior_scale = float(prior_scale)
        self.code_cost = code_cost
        self.prior_inclusion = float(prior_inclusion)
        self.gate = HardConcreteGate(num_features, 1, init_drop_rate, temperature, lower, upper)
        self.prior = gate_prior(prior_inclusion, temperature=temperature, lower=lower, upper=upper)
        self.weight = nn.Parameter(torch.zeros(num_features))
        self.bias = nn.Parameter(torch.zeros(()))
        if slab == "gaussian":
            self.slab_log_scale = nn.Parameter(torch.full((num_features,), math.log(0.1)))

    # -------------------------------------------------------------- pieces
    def slab_kl(self):
        r""":math:`KL(N(\mu_j, s_j^2) \| N(0, \mathrm{prior\_scale}^2))` per coefficient (Gaussian slab)."""
        scale = self.slab_log_scale.exp()
        ratio = scale / self.prior_scale
        return 0.5 * (ratio**2 + (self.weight / self.prior_scale) ** 2 - 1.0) - torch.log(ratio)

    def _code_cost(self, num_data):
        q_nonzero = self.gate.prob_nonzero()
        if self.slab == "gaussian":
            return (q_nonzero * self.slab_kl()).sum()
        lam = 0.5 * math.log(num_data) if self.code_cost is None else self.code_cost
        return lam * q_nonzero.sum()

    def _coefficients(self, z, noise=None):
        theta = self.weight if noise is None else self.weight + self.slab_log_scale.exp() * noise
        return theta * z

    def _linear_predictor(self, x, y, num_data):
        x, y = check_xy(x, y, self.num_features)
        num_data = x.shape[0] if num_data is None else int(num_data)
        z = pyro.sample("z", prior_like(self.prior, self.weight).expand([self.num_features]).to_event(1))
        noise = None
        if self.slab == "gaussian":
            noise = pyro.sample("slab_noise", dist.Normal(torch.zeros_like(self.weight), 1.0).to_event(1))
        pyro.factor("code_cost", -self._code_cost(num_data))
        return x @ self._coefficients(z, noise) + self.bias, y, num_data

    @pyro_method
    def guide(self, x, y=None, num_data=None):
        """The mean-field guide: :math:`q(z_j)` hard concrete with learnable ``log_alpha`` (and the slab noise)."""
        pyro.sample("z", self.gate.distribution().to_event(1))
        if self.slab == "gaussian":
            pyro.sample("slab_noise", dist.Normal(torch.zeros_like(self.weight), 1.0).to_event(1))

    # -------------------------------------------------------------- results
    def inclusion_probabilities(self):
        r"""Posterior inclusion probabilities :math:`q(z_j \ne 0)` (Eq. 12), detached."""
        return self.gate.prob_nonzero().detach()

    def coefficients(self):
        r"""Test-time coefficients :math:`\tilde\theta \odot \hat z` (Eq. 13), detached."""
        return (self.weight * self.gate.deterministic()).detach()


class SparseLinearRegression(_SpikeSlabGLM):
    r"""Bayesian variable selection for :math:`y = X\theta + b + \epsilon`, :math:`\epsilon \sim N(0, \sigma^2)`.

    ``noise_scale=None`` learns :math:`\sigma` as a point estimate. See :class:`_SpikeSlabGLM`
    for the gates, slab and code cost. ``model(x, y, num_data=None)``: ``x`` of shape
    ``(B, num_features)``, ``y`` of shape ``(B,)``; ``num_data`` is the full data-set size when
    ``(x, y)`` is a minibatch (the likelihood is scaled by ``num_data / B``).
    """

    #: The targets :func:`~l0bayes.inference.train` checks for: real (or integer) responses.
    target_type = "real"

    def __init__(self, num_features, noise_scale=None, **kwargs):
        super().__init__(num_features, **kwargs)
        check_args(type(self).__name__, ARG_CHECKS, noise_scale=noise_scale)
        self.fixed_noise_scale = noise_scale
        self.log_noise_scale = nn.Parameter(torch.zeros(()))

    @property
    def noise_scale(self):
        if self.fixed_noise_scale is not None:
            return torch.as_tensor(self.fixed_noise_scale, dtype=self.weight.dtype, device=self.weight.device)
        return self.log_noise_scale.exp()

    @pyro_method
    def model(self, x, y=None, num_data=None):
        mean, y, num_data = self._linear_predictor(x, y, num_data)
        with pyro.plate("data", num_data, subsample=torch.arange(mean.shape[0], device=mean.device)):
            return pyro.sample("obs", dist.Normal(mean, self.noise_scale), obs=y)


class SparseLogisticRegression(_SpikeSlabGLM):
    r"""Bayesian variable selection for a binary outcome, :math:`y \sim \mathrm{Bernoulli}(\sigma(X\theta + b))`."""

    #: The targets :func:`~l0bayes.inference.train` checks for: labels 0 or 1.
    target_type = "binary"

    @pyro_method
    def model(self, x, y=None, num_data=None):
        logits, y, num_data = self._linear_predictor(x, y, num_data)
        if y is not None and not torch.all((y == 0) | (y == 1)):
            raise ValueError("SparseLogisticRegression needs labels y in {0, 1}")
        with pyro.plate("data", num_data, subsample=torch.arange(logits.shape[0], device=logits.device)):
            return pyro.sample("obs", dist.Bernoulli(logits=logits), obs=y)
