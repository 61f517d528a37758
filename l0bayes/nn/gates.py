"""Learnable hard concrete gates: the trainable part of every L0 layer and model."""

import contextlib
import math

import pyro
import torch
from torch import nn

from .._checks import COUNT, GATE_SHAPE, NON_NEGATIVE, PROBABILITY, check_args
from ..distributions import HardConcrete
from ..distributions.stretched_concrete import stretched_concrete_rsample

# Arguments of HardConcreteGate: finite stretch and temperature (an infinite one gives NaN gates).
GATE_ARG_CHECKS = {
    "num_gates": COUNT,
    "group_size": COUNT,
    "init_drop_rate": PROBABILITY,
    "init_std": NON_NEGATIVE,
    **GATE_SHAPE,
}
#: The keyword arguments of every gate that :func:`~l0bayes.pruning.sparsify` and
#: :func:`~l0bayes.pruning.sparsify_transformer` pass on (``**gate_kwargs``).
GATE_KWARGS = ("init_drop_rate", "temperature", "lower", "upper", "init_std")


def check_gate_kwargs(owner, gate_kwargs):
    """Check the ``**gate_kwargs`` a function passes on to every gate it builds, before it builds any.

    :raises TypeError: naming an unknown keyword (and listing :data:`GATE_KWARGS`), or a value that is not one
        real number (a string, a bool, a tensor of several elements).
    :raises ValueError: naming the argument for a number outside its range (``init_drop_rate`` in (0, 1), ...).
    """
    unknown = sorted(set(gate_kwargs) - set(GATE_KWARGS))
    if unknown:
        raise TypeError(f"{owner}: unknown gate arguments {unknown}; the gate arguments are {list(GATE_KWARGS)}")
    for name, value in gate_kwargs.items():
        shape = tuple(getattr(value, "shape", ()))
        if shape:
            raise TypeError(f"{owner}: {name} must be one number (the same for every gate), got shape {shape}")
    check_args(owner, GATE_ARG_CHECKS, **gate_kwargs)


def log_alpha_for_inclusion(prior_inclusion, temperature=2.0 / 3.0, lower=-0.1, upper=1.1):
    r"""The ``log_alpha`` whose gate has :math:`P(z \ne 0)` = ``prior_inclusion`` (inverts Eq. 12).

    :math:`\log\alpha = \mathrm{logit}(\pi_0) + \beta \log(-\gamma/\zeta)`.
    """
    pi0 = torch.as_tensor(prior_inclusion, dtype=torch.float64)
    if not torch.all((pi0 > 0) & (pi0 < 1)):
        raise ValueError(f"prior_inclusion must lie in (0, 1), got {prior_inclusion!r}")
    return torch.log(pi0) - torch.log1p(-pi0) + temperature * math.log(-lower / upper)


def log_alpha_at_half(temperature, lower, upper):
    r""":math:`\beta \log(-\gamma/\zeta)`, the ``log_alpha`` at which :math:`q(z \ne 0) = 1/2` (Eq. 12), for floats."""
    return temperature * (math.log(-lower) - math.log(upper))


def gate_prior(prior_inclusion=None, log_alpha=None, temperature=2.0 / 3.0, lower=-0.1, upper=1.1, validate_args=None):
    r"""A hard concrete gate prior :math:`p(z)`, from a prior inclusion probability or explicit parameters.

    Give exactly one of ``prior_inclusion`` (:math:`P(z \ne 0) = \pi_0`, Appendix A: "gates being
    active 10% of the time") or ``log_alpha``. A prior built from ``prior_inclusion`` is float64
    (exact); :func:`prior_like` casts it to a model's dtype and device.
    """
    if (prior_inclusion is None) == (log_alpha is None):
        raise ValueError("give exactly one of prior_inclusion or log_alpha")
    if prior_inclusion is not None:
        log_alpha = log_alpha_for_inclusion(prior_inclusion, temperature, lower, upper)
    return HardConcrete(log_alpha, temperature, lower, upper, validate_args=validate_args)


def prior_like(prior, tensor):
    """``prior`` (a :class:`HardConcrete`) with its parameters cast to ``tensor``'s dtype and device."""
    params = (prior.log_alpha, prior.temperature, prior.lower, prior.upper)
    return HardConcrete(*(p.to(tensor) for p in params), validate_args=False)


def init_log_alpha(num_gates, init_drop_rate=0.5, init_std=0.01, generator=None):
    r"""The paper's initialisation: :math:`\log\alpha \sim N(\mathrm{logit}(1 - d), 0.01^2)`.

    Section 4: the mean makes :math:`\alpha/(\alpha + 1)` match the network's original dropout
    rate; as in the authors' code it is the *keep* probability ``1 - init_drop_rate``, so a
    gate starts open with probability about ``1 - init_drop_rate`` under Eq. 13.
    """
    if not 0.0 < init_drop_rate < 1.0:
        raise ValueError(f"init_drop_rate must lie in (0, 1), got {init_drop_rate!r}")
    mean = math.log(1.0 - init_drop_rate) - math.log(init_drop_rate)
    out = torch.empty(num_gates)
    return out.normal_(mean, init_std, generator=generator)


class HardConcreteGate(nn.Module):
    r"""A vector of ``num_gates`` hard concrete gates with learnable :math:`\log\alpha` (Eq. 10-13).

    Each gate is shared by a group of ``group_size`` parameters (Section 2.4). Calling the module
    returns gate values ``z`` of shape ``(num_gates,)``:

    * in ``train()`` mode a reparameterised sample (one per call, i.e. per minibatch, as in the paper);
    * in ``eval()`` mode the test-time gate of Eq. 13;
    * inside :func:`pyro_gates` a ``pyro.sample`` site, so the same network serves as a Pyro model
      (the site draws from the prior) and the guide supplies :meth:`distribution`.

    Every place that multiplies a signal by the gates (the *site*: a gated layer's input or output, a head's
    features, a residual branch) reports that signal to :attr:`observer` when one is set, before multiplying.
    """

    #: ``None``, or a callable ``observer(signal, dim, reader)`` that each site of this gate calls with the
    #: tensor ``s`` it multiplies by the gates (the site computes ``s * z``, ``z`` broadcast along ``dim``), the
    #: dimension of ``signal`` that indexes the gates (``None`` for a gate of one entry, which scales all of
    #: ``signal``) and the linear layer whose input ``signal`` is (``None`` where the gates scale an output).
    #: :func:`~l0bayes.pruning.importance_scores` sets it for its activation scores; unset, a site pays one
    #: attribute check.
    observer = None

    def __init__(
        self, num_gates, group_size=1, init_drop_rate=0.5, temperature=2.0 / 3.0, lower=-0.1, upper=1.1, init_std=0.01
    ):
        super().__init__()
        check_args(
            type(self).__name__,
            GATE_ARG_CHECKS,
            num_gates=num_gates,
            group_size=group_size,
            init_drop_rate=init_drop_rate,
            temperature=temperature,
            lower=lower,
            upper=upper,
            init_std=init_std,
        )
        self.num_gates = int(num_gates)
        self.group_size = int(group_size)
        self.temperature, self.lower, self.upper = float(temperature), float(lower), float(upper)
        self.log_alpha = nn.Parameter(init_log_alpha(num_gates, init_drop_rate, init_std))
        self.site_name = None  # set by pyro_gates()
        self.prior = None
        self._value = None  # set by GateSet.sampled()
        self._num_open = None  # the number of nonzero entries of _value, counted by GateSet.sampled()

    def extra_repr(self):
        return f"num_gates={self.num_gates}, group_size={self.group_size}, temperature={self.temperature:.4g}"

    def distribution(self):
        """The variational gate distribution :math:`q(z)`: a :class:`HardConcrete` of batch ``(num_gates,)``."""
        return HardConcrete(self.log_alpha, self.temperature, self.lower, self.upper)

    def forward(self):
        if self.site_name is not None:
            prior = self.prior.expand(torch.Size([self.num_gates]))
            return pyro.sample(self.site_name, prior.to_event(1))
        if self._value is not None:
            return self._value
        if self.training:
            return hard_concrete_rsample(self.log_alpha, self.temperature, self.lower, self.upper)
        return self.deterministic()

    def num_open(self, z):
        """The number of nonzero entries of ``z`` if this gate has already counted them for its draw, else ``None``."""
        return self._num_open if z is self._value else None

    def deterministic(self):
        """Eq. 13, the test-time gate."""
        return torch.sigmoid(self.log_alpha).mul(self.upper - self.lower).add(self.lower).clamp(0.0, 1.0)

    def prob_nonzero(self):
        r"""Eq. 12 per gate, :math:`q(z_g \ne 0) = \sigma(\log\alpha_g - \beta\log(-\gamma/\zeta))`."""
        return torch.sigmoid(self.log_alpha - log_alpha_at_half(self.temperature, self.lower, self.upper))

    def expected_l0(self):
        r"""Eq. 16: :math:`\sum_g |g|\, q(z_g \ne 0)`, the expected number of active parameters."""
        return self.group_size * self.prob_nonzero().sum()

    def active(self):
        """Boolean mask of the gates that are open at test time (Eq. 13 gate > 0)."""
        return self.deterministic() > 0


def hard_concrete_rsample(log_alpha, temperature, lower, upper):
    r"""One reparameterised draw of Eq. 10-11 for gates with float ``temperature``, ``lower``, ``upper``.

    The same draws (the same noise, the same operations) as :meth:`HardConcrete.rsample`,
    without building a distribution object: this is the hot path of every training step.
    """
    return stretched_concrete_rsample(log_alpha.shape, log_alpha, temperature, lower, upper).clamp(0.0, 1.0)


def gates_of(module):
    """``(name, HardConcreteGate)`` pairs of a module, in registration order."""
    return [(name, m) for name, m in module.named_modules() if isinstance(m, HardConcreteGate)]


def gate_owners(module):
    """``(layer, HardConcreteGate)`` pairs in registration order: each gate with the module that holds it.

    The layer is the gate's parent (``fc1`` for ``fc1.gate``; ``module`` itself for a gate it holds directly).
    """
    return [(module.get_submodule(name.rpartition(".")[0]), gate) for name, gate in gates_of(module)]


def gate_parameter_ids(module):
    """The ``id`` of every parameter of every gate in ``module`` (each gate's ``log_alpha``): what a count of the
    module's own parameters leaves out."""
    return {id(p) for m in module.modules() if isinstance(m, HardConcreteGate) for p in m.parameters()}


@contextlib.contextmanager
def pyro_gates(module, prior, prefix=""):
    """Within this context every gate of ``module`` is a ``pyro.sample`` site drawing from ``prior``.

    ``prior`` is a scalar-batch :class:`HardConcrete` (or a callable ``gate -> HardConcrete``);
    site names are ``prefix + gate module name``. Used by the Bayesian (Eq. 21) models.
    """
    gates = gates_of(module)
    try:
        for name, gate in gates:
            gate.site_name = prefix + (name or "gate")
            chosen = prior if isinstance(prior, torch.distributions.Distribution) else prior(gate)
            gate.prior = prior_like(chosen, gate.log_alpha)
        yield gates
    finally:
        for _, gate in gates:
            gate.site_name = None
            gate.prior = None
