"""The variational free energy of Appendix A (Eq. 20-22), term by term."""

from dataclasses import dataclass

import torch
from pyro import poutine
from pyro.distributions import Independent, Unit
from pyro.poutine.util import site_is_subsample
from torch.distributions import kl_divergence

from ..distributions import HardConcrete

#: A ``pyro.factor`` site with this name holds a data term (a loss that is not a Pyro likelihood, as in
#: :class:`~l0bayes.models.SparseModel`): :func:`free_energy` counts it in ``nll``, every other factor in
#: ``code_cost``.
DATA_FACTOR = "data_loss"


@dataclass
class FreeEnergy:
    r"""The terms of Eq. 21 for one model/guide pair (all in nats, data term over the full data set).

    ``total = nll + gate_kl + other_kl + code_cost``.

    :ivar nll: expected negative log-likelihood :math:`-E_q[\log p(D \mid \tilde\theta \odot z)]`
        (Monte Carlo over the gates, minibatch terms scaled by ``N/B``).
    :ivar gate_kl: :math:`\sum_j KL(q(z_j) \| p(z_j))`, analytic (Eq. 28); zero for the
        penalised objective (Eq. 22).
    :ivar other_kl: KL of any other latent sites (analytic when registered, else Monte Carlo).
    :ivar code_cost: the negated ``pyro.factor`` terms of the model: the code cost
        :math:`\lambda \sum_j |g_j| q(z_j \ne 0)` of Eq. 21 or the Gaussian slab cost
        :math:`\sum_j q(z_j \ne 0) KL(q(\theta_j) \| p(\theta_j))` of Eq. 20.
    """

    nll: torch.Tensor
    gate_kl: torch.Tensor
    other_kl: torch.Tensor
    code_cost: torch.Tensor

    @property
    def total(self):
        return self.nll + self.gate_kl + self.other_kl + self.code_cost

    def as_dict(self):
        """Float values of every term and the total (for histories and logs)."""
        return {
            "free_energy": float(self.total.detach()),
            "nll": float(self.nll.detach()),
            "gate_kl": float(self.gate_kl.detach()),
            "other_kl": float(self.other_kl.detach()),
            "code_cost": float(self.code_cost.detach()),
        }


def _is_gate(fn):
    while isinstance(fn, Independent):
        fn = fn.base_dist
    return isinstance(fn, HardConcrete)


def free_energy(model, guide, *args, kl=True, num_particles=1, **kwargs):
    """Evaluate the free energy of Eq. 21 (``kl=True``) or the penalised objective of Eq. 22 (``kl=False``).

    The guide is traced, the model replayed against it, and every site assigned to one term:
    latent gate sites give the analytic hard concrete KL (Eq. 28, registered with
    :func:`torch.distributions.kl_divergence`), other latent sites their KL, ``pyro.factor``
    sites the code cost, and observed sites the data term. Plate subsampling scales are applied
    as Pyro does, so the result equals ``TraceMeanField_ELBO().differentiable_loss`` for the same
    random draws. Differentiable.

    :param int num_particles: gate samples averaged for the data term.
    :returns: :class:`FreeEnergy`.
    """
    if num_particles < 1:
        raise ValueError(f"num_particles must be positive, got {num_particles}")
    terms = {"nll": 0.0, "gate_kl": 0.0, "other_kl": 0.0, "code_cost": 0.0}
    for _ in range(num_particles):
        guide_trace = poutine.trace(guide).get_trace(*args, **kwargs)
        model_trace = poutine.trace(poutine.replay(model, trace=guide_trace)).get_trace(*args, **kwargs)
        for name, site in model_trace.nodes.items():
            if site["type"] != "sample" or site_is_subsample(site):
                continue
            scale = site["scale"]
            if site["is_observed"]:
                log_p = site["fn"].log_prob(site["value"])
                if site["mask"] is not None and site["mask"] is not True:
                    log_p = log_p * site["mask"]
                if isinstance(site["fn"], Unit) and name != DATA_FACTOR:
                    terms["code_cost"] = terms["code_cost"] - scale * log_p.sum()
                else:
                    terms["nll"] = terms["nll"] - scale * log_p.sum()
                continue
            guide_site = guide_trace.nodes.get(name)
            if guide_site is None:
                raise ValueError(f"latent site {name!r} of the model has no counterpart in the guide")
            is_gate = _is_gate(guide_site["fn"]) and _is_gate(site["fn"])
            if is_gate and not kl:
                continue
            try:
                term = kl_divergence(guide_site["fn"], site["fn"]).sum()
            except NotImplementedError:
                value = guide_site["value"]
                term = (guide_site["fn"].log_prob(value) - site["fn"].log_prob(value)).sum()
            key = "gate_kl" if is_gate else "other_kl"
            terms[key] = terms[key] + scale * term
    values = {k: torch.as_tensor(v / num_particles) for k, v in terms.items()}
    return FreeEnergy(**values)
