r"""An automatic guide for the :class:`~l0bayes.distributions.HardConcrete` sites of any Pyro model.

Pyro's own autoguides do not fit a gate. ``AutoNormal`` and ``AutoDelta`` guide a site through
its support, here ``unit_interval``: a Gaussian (or a point) pushed through a sigmoid. Training
runs without a word, but a sigmoid never returns exactly 0 or 1. The fitted :math:`q(z)` has no
atom at zero (Eq. 26), so no gate is ever closed and nothing is pruned. The KL also leaves
the mixture form of Eq. 28. Guide gate sites with :class:`AutoHardConcrete` instead: it gives
each gate site :math:`q(z) = \mathrm{HardConcrete}(\log\alpha, \beta, \gamma, \zeta)` with a
learnable ``log_alpha`` and the temperature and stretch of the site's prior. With
``TraceMeanField_ELBO`` the KL to the prior is then the exact one of Eq. 28 (see the
mathematics page of the documentation).

:func:`auto_guide_list` builds the usual combination: :class:`AutoHardConcrete` for the gates
and a Pyro autoguide (``AutoNormal`` by default) for every other latent site, in an
:class:`~pyro.infer.autoguide.AutoGuideList`.
"""

import operator
from contextlib import ExitStack

import pyro
import torch
from pyro import poutine
from pyro.distributions import constraints
from pyro.infer.autoguide import AutoGuide, AutoGuideList, AutoNormal
from pyro.infer.autoguide.utils import deep_setattr
from pyro.nn import PyroModule, PyroParam
from torch.distributions import Independent

from .._checks import PROBABILITY, check_args
from ..distributions import HardConcrete
from ..nn.gates import init_log_alpha


def gate_of(fn):
    """``(HardConcrete, event_dim)`` if ``fn`` is a hard concrete (``to_event`` too), else ``(None, 0)``."""
    event_dim = 0
    while isinstance(fn, Independent):
        event_dim += fn.reinterpreted_batch_ndims
        fn = fn.base_dist
    return (fn, event_dim) if isinstance(fn, HardConcrete) else (None, 0)


def is_gate_site(msg):
    """True for a latent ``pyro.sample`` site drawing from a :class:`HardConcrete` (a ``poutine.block`` filter)."""
    return msg["type"] == "sample" and not msg["is_observed"] and gate_of(msg["fn"])[0] is not None


def _constant(t):
    """A gate shape parameter as a float when it is the same everywhere (so subsampled sites broadcast)."""
    t = t.detach()
    return float(t.reshape(-1)[0]) if bool((t == t.reshape(-1)[0]).all()) else t.clone()


class AutoHardConcrete(AutoGuide):
    r"""Mean-field hard concrete :math:`q(z)` for every :class:`HardConcrete` site of ``model``.

    Other latent sites of ``model`` are left out (blocked), so the guide can stand alone for a
    model whose only latent sites are gates, or be one part of an
    :class:`~pyro.infer.autoguide.AutoGuideList` (see :func:`auto_guide_list`).

    :param callable model: a Pyro model with one or more ``HardConcrete`` sample sites
        (``HardConcrete(...).expand(shape).to_event(k)`` included).
    :param float init_drop_rate: the paper's initialisation (Section 4):
        :math:`\log\alpha \sim N(\mathrm{logit}(1 - d), 0.01^2)`.
    :param callable create_plates: as for Pyro's autoguides.

    The learnable parameters are ``guide.log_alpha.<site name>``, of the site's full shape.
    """

    def __init__(self, model, init_drop_rate=0.5, *, create_plates=None):
        check_args("AutoHardConcrete", {"init_drop_rate": PROBABILITY}, init_drop_rate=init_drop_rate)
        self.init_drop_rate = float(init_drop_rate)
        super().__init__(poutine.block(model, expose_fn=is_gate_site), create_plates=create_plates)

    def _setup_prototype(self, *args, **kwargs):
        super()._setup_prototype(*args, **kwargs)
        self.log_alpha = PyroModule()
        self._gate_shapes = {}
        for name, site in self.prototype_trace.iter_stochastic_nodes():
            gate, event_dim = gate_of(site["fn"])
            shape = list(site["fn"].shape())
            for frame in site["cond_indep_stack"]:  # a subsampled plate: the parameter has the full size
                full_size = frame.full_size or frame.size
                if full_size != frame.size:
                    shape[frame.dim - event_dim + len(shape)] = full_size
            like = site["value"]
            init = init_log_alpha(torch.Size(shape).numel(), self.init_drop_rate).reshape(shape).to(like)
            deep_setattr(self.log_alpha, name, PyroParam(init, constraints.real, event_dim))
            self._gate_shapes[name] = (
                event_dim,
                _constant(gate.temperature),
                _constant(gate.lower),
                _constant(gate.upper),
            )

    def forward(self, *args, **kwargs):
        """Sample every gate site from its :math:`q(z)`; returns ``{site name: value}``."""
        if self.prototype_trace is None:
            self._setup_prototype(*args, **kwargs)
        plates = self._create_plates(*args, **kwargs)
        result = {}
        for name, site in self.prototype_trace.iter_stochastic_nodes():
            with ExitStack() as stack:
                for frame in site["cond_indep_stack"]:
                    if frame.vectorized:
                        stack.enter_context(plates[frame.name])
                q = self._q(name)
                result[name] = pyro.sample(name, q.to_event(self._gate_shapes[name][0]))
        return result

    def _q(self, name):
        _, temperature, lower, upper = self._gate_shapes[name]
        return HardConcrete(operator.attrgetter(name)(self.log_alpha), temperature, lower, upper)

    @torch.no_grad()
    def distributions(self):
        """``{site name: HardConcrete}``: the fitted :math:`q(z)` of each gate site (full size, detached)."""
        if self.prototype_trace is None:
            raise RuntimeError("AutoHardConcrete: call the guide once (or train it) before asking for its gates")
        return {
            name: HardConcrete(
                operator.attrgetter(name)(self.log_alpha).detach(), *self._gate_shapes[name][1:], validate_args=False
            )
            for name in self._gate_shapes
        }

    def prob_nonzero(self):
        r"""``{site name: tensor}`` of Eq. 12, :math:`q(z \ne 0)`, per gate."""
        return {name: q.prob_nonzero for name, q in self.distributions().items()}

    def median(self, *args, **kwargs):
        """``{site name: tensor}``: the test-time gate of Eq. 13 (exact zeros for pruned gates)."""
        if self.prototype_trace is None:
            self._setup_prototype(*args, **kwargs)
        return {name: q.deterministic_gate for name, q in self.distributions().items()}


def auto_guide_list(model, other=AutoNormal, **other_kwargs):
    """An :class:`~pyro.infer.autoguide.AutoGuideList`: :class:`AutoHardConcrete` for the gates, ``other`` for the rest.

    :param callable model: a Pyro model with hard concrete sites and possibly other latent sites.
    :param other: a Pyro autoguide class for the non-gate latent sites (``AutoNormal``,
        ``AutoDelta``, ...), built as ``other(blocked_model, **other_kwargs)``.
    """
    guide = AutoGuideList(model)
    guide.append(AutoHardConcrete(model))
    guide.append(other(poutine.block(model, hide_fn=is_gate_site), **other_kwargs))
    return guide
