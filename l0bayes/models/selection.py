r"""Variable selection for people who are not Pyro users: :func:`select_variables`.

Gaussian family (the default). Three steps, each chosen by measurement (the variable-selection
guide of the docs has the numbers):

1. Standardise: every column of ``X`` is centred and scaled to unit sample standard deviation
   (``ddof=1``), ``y`` is centred. ``slab_scale`` (the prior sd of a coefficient)
   and ``noise_scale`` are therefore in units of ``y`` per standard deviation of a feature,
   exactly the model of :func:`~l0bayes.analysis.exact_inclusion_probabilities` applied to the
   standardised data. The selection is invariant to rescaling the columns of ``X``, and to rescaling
   ``y`` together with ``slab_scale`` and ``noise_scale`` (the estimated ones follow ``y``): inside, ``y``
   is also divided by a power of two near its standard deviation, and the scales with it.
2. Fit a structured guide, a sum of single effects
   (:func:`~l0bayes.inference.single_effects.fit_single_effects`): each effect picks one of a
   group of correlated features and spreads its probability over the group, where a mean-field
   guide commits to one member. The number of effects grows until one stays empty, and the
   fit stops when its ELBO has stabilised.
3. Check and correct: the fit's probabilities define a product-Bernoulli proposal; its draws are
   reweighted to the exact collapsed posterior of the spike-and-slab model with
   ``prior_inclusion``, ``slab_scale`` and ``noise_scale`` (Pareto-smoothed importance sampling,
   :mod:`l0bayes.analysis.importance`), in two or three adaptive rounds; the last round's
   probabilities are Rao-Blackwellised (each drawn model contributes every feature's conditional
   inclusion probability, not its 0/1 indicator). With Pareto :math:`\hat k \le 0.7` the
   reweighted probabilities estimate the exact ones.

4. Then (``method="auto"``, the default) the exact posterior is sampled by weighted tempered
   Gibbs sampling (Zanella & Roberts, 2019; :mod:`l0bayes.inference.tempered_gibbs`), started
   from the fit: 4 chains x 1,250 steps, as many weighted draws as millipede's default run, at most
   ``time_budget`` seconds. Where the check failed its Rao-Blackwellised probabilities, with
   R-hat, ESS and a Monte Carlo standard error each, are returned (``result.method == "mcmc"``);
   where it passed a short run (4 chains x 150 steps after 50 of warm-up) tests it: :math:`\hat k`
   only sees what the fit proposes, and a sampler that moves a probability by more than 0.2 (plus
   twice its Monte Carlo error) has found mass the fit missed, so the full run's answer is returned
   instead. No probability above 0.9 is returned without a
   passed check or a mixed chain: such a probability is returned as 0.9 (``result.capped``).

Bernoulli family: the mean-field hard concrete model
(:class:`~l0bayes.models.SparseLogisticRegression`, Gaussian slab) fitted full batch until the
free energy stabilises; its draws :math:`(z, \tilde\theta)` are reweighted to the exact joint
density (the mixed log-density of the gates, Eq. 26, and the slab), with the same
:math:`\hat k` diagnostic; where it fails, the sampler runs on the Pólya-Gamma augmented model. The credible
sets are those of a sum of single effects fitted to the centred labels.
"""

import math
import warnings
from dataclasses import dataclass, field

import numpy as np
import torch

from .._checks import COUNT, POSITIVE, PROBABILITY, Rule, check_args, check_seed, whole
from ..analysis.importance import KHAT_THRESHOLD, _conditional_inclusion, importance_check, khat_meaning, psis
from ..distributions import kl_hard_concrete
from ..inference.single_effects import credible_sets, fit_single_effects
from ..inference.tempered_gibbs import ESS_MIN, NOISE_FLOOR, RELEVANT, RHAT_MAX, full_gram_pays, tempered_gibbs
from ..nn.gates import prior_like
from ..threads import thread_policy

FAMILIES = ("gaussian", "bernoulli")
METHODS = ("auto", "variational", "mcmc")
CAP = 0.9  # no probability above this without a passed check or a mixed chain
TIME_BUDGET = 15.0  # default seconds for the sampler (an upper bound; its steps usually end it first)
MCMC_STEPS = 1250  # method="auto": steps per chain after warm-up; 4 chains give 5,000 weighted draws (millipede's T)
MCMC_WARMUP = 500  # warm-up steps per chain of the sampler's runs (but the short test of a passed check)
MAX_MCMC_STEPS = 100_000  # method="mcmc": until mixed or the time budget, at most this many
AGREE = 0.2  # a passed check is confirmed when no probability differs from the sampler's by more than this
VERIFY_WARMUP, VERIFY_STEPS = 50, 150  # the test of a passed check: a short run per chain (a full one if it fails)
# Bernoulli family, methods "auto" and "mcmc": at most this many steps of the logistic fit, which there is the
# importance check's proposal and the sampler's start (benchmarks/RESULTS.md, "Choice of the sampler, by
# measurement": 3-6 s less than the fit's own stopping rule, AUPRC unchanged within its spread); "variational"
# keeps 5000, as its answer is the fit itself
LOGISTIC_START_STEPS = 800
MIN_DRAWS = 100  # importance draws per round at least: Pareto k-hat is fitted to the largest fifth of them
CONSTANT = 1e-12  # a column whose standard deviation is below this fraction of its magnitude is constant
# slab_scale and noise_scale (Gaussian) within this range times the standard deviation of y: the fit's own noise
# estimate is floored at its lower end
SCALE_RANGE = (NOISE_FLOOR, 1e6)
LOGIT_SLAB_RANGE = (1e-6, 1e6)  # slab_scale of the Bernoulli family (logits per standard deviation of a feature)
# Gaussian family, noise_scale=None, a sampler: with at most this many observations and p >= n - 1 the sampler
# reaches models that fit y exactly, where the noise posterior under the Jeffreys prior is improper
FEW_ROWS = 10
ARG_CHECKS = {
    "prior_inclusion": PROBABILITY.or_none(),
    "slab_scale": POSITIVE.or_none(),
    "noise_scale": POSITIVE.or_none(),
    "num_draws": Rule(f"a whole number >= {MIN_DRAWS}", lambda v: v >= MIN_DRAWS, integer=True),
    "time_budget": Rule("a number of seconds > 0 (inf: no limit)", lambda v: v > 0).or_none(),
}
OPTION_CHECKS = {  # the advanced options of select_variables
    "num_effects": COUNT,
    "tol": POSITIVE,
    "max_iter": COUNT,
    "rounds": COUNT,
    "lr": POSITIVE,
    "max_steps": COUNT,
    "num_chains": COUNT,
    "mcmc_steps": COUNT,
}
UNRELIABLE = (
    "Pareto k-hat = {khat:.2f} > 0.7 ({meaning}): these inclusion probabilities could not be checked "
    "against the exact posterior; do not trust individual probabilities, trust only the credible sets (if any)."
)


@dataclass
class SelectionResult:
    r"""What :func:`select_variables` returns.

    :ivar inclusion_probabilities: ``(p,)`` numpy, :math:`P(\gamma_j = 1 \mid y)`.
    :ivar coefficients: ``(p,)`` numpy, posterior mean coefficients in the units of the
        original ``X`` and ``y``.
    :ivar credible_sets: list of arrays of feature indices, each a 95% set that holds one effect (minimum absolute
        correlation within a set at least 0.5): those of the sum of single effects fitted to ``y`` (Gaussian
        family) or to the centred labels (bernoulli: a linear probability model, which groups the features that
        carry one signal).
    :ivar khat: Pareto :math:`\hat k` of the importance check (passed at :math:`\hat k \le 0.7`).
        Negative values are the best case: the importance weights have a bounded tail, lighter than
        exponential. Below 0.5 their variance is finite; from 0.5 to 0.7 it is infinite but the
        smoothed estimate is still reliable; above 0.7 it is not
        (:func:`~l0bayes.analysis.importance.khat_meaning`, and :attr:`diagnostic` in words).
    :ivar method: how the probabilities were obtained: ``"reweighted"`` (the check passed),
        ``"mcmc"`` (weighted tempered Gibbs sampling on the exact posterior) or ``"variational"``
        (the fit's own, unchecked).
    :ivar mcse: ``(p,)`` Monte Carlo standard error of each probability (``"mcmc"``; else ``None``).
    :ivar ess: ``(p,)`` its effective sample size, :math:`\hat P (1 - \hat P) / \mathrm{MCSE}^2` (``"mcmc"``).
    :ivar rhat: ``(p,)`` its rank-normalised split R-hat across chains (``"mcmc"``; ``nan`` where every
        chain puts it below 0.001).
    :ivar capped: indices of the features whose probability was above 0.9 without a passed check or
        a mixed chain, and is returned as 0.9 (the estimate is in ``details["uncapped"]``).
    :ivar family: ``"gaussian"`` or ``"bernoulli"``.
    :ivar prior_inclusion: :math:`\pi_0` of the model the probabilities refer to.
    :ivar slab_scale: its :math:`\tau` (standardised units, see :func:`select_variables`).
    :ivar noise_scale: its :math:`\sigma` (``nan`` for bernoulli).
    :ivar variational_probabilities: ``(p,)`` the fit's probabilities before reweighting.
    :ivar feature_names: names of the features.
    :ivar details: everything else (ELBO trace, number of effects, ESS, seconds).
    """

    inclusion_probabilities: np.ndarray
    coefficients: np.ndarray
    credible_sets: list
    khat: float
    method: str
    family: str
    prior_inclusion: float
    slab_scale: float
    noise_scale: float
    variational_probabilities: np.ndarray
    feature_names: list
    draws: np.ndarray = field(repr=False, default=None)
    log_weights: np.ndarray = field(repr=False, default=None)
    details: dict = field(default_factory=dict)
    mcse: np.ndarray = None
    ess: np.ndarray = None
    rhat: np.ndarray = None
    capped: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    sampler: object = field(repr=False, default=None)

    @property
    def mixed(self):
        """``"mcmc"``: every probability of at least 0.01 has R-hat <= 1.01 and ESS >= 100; else ``None``."""
        return None if self.sampler is None else self.sampler.mixed

    @property
    def reliable(self):
        r"""``True`` when the probabilities can be trusted: the importance check passed (:math:`\hat k \le 0.7`)
        and they are its reweighted estimates, or they come from a mixed sampler."""
        if self.method == "mcmc":
            return bool(self.mixed)
        return self.method == "reweighted" and bool(self.khat <= KHAT_THRESHOLD)

    @property
    def diagnostic(self):
        """One line: which method produced the probabilities, when (not) to trust them, what k-hat means."""
        meaning = khat_meaning(self.khat)
        if self.method == "reweighted":
            line = (
                f"Pareto k-hat = {self.khat:.2f} <= 0.7 ({meaning}): the probabilities are importance-reweighted "
                "to the exact posterior of the stated model and can be trusted up to Monte Carlo error"
            )
            verified = self.details.get("verified")
            if verified is None:
                return line + "."
            return line + (
                f"; the exact sampler, run from the fit, agrees (largest difference {verified['max_gap']:.2f})."
            )
        if self.method == "mcmc":
            run = self.sampler
            head = (
                f"Weighted tempered Gibbs sampling on the exact posterior (k-hat of the fit {self.khat:.2f}), "
                f"{len(run.chain_inclusion)} chains x {run.num_steps} steps in {run.seconds:.1f} s"
            )
            contradicted = self.details.get("check_contradicted")
            if contradicted is not None:
                head += (
                    f" (the check passed, but the sampler moved the probability of feature "
                    f"{self.feature_names[contradicted['feature']]} by {contradicted['max_gap']:.2f})"
                )
            if run.mixed:
                return head + (
                    f": mixed (R-hat <= {RHAT_MAX} and ESS >= {ESS_MIN} for every probability >= {RELEVANT}); "
                    "Monte Carlo standard errors in result.mcse."
                )
            return head + (
                f": NOT mixed, {_unmixed_words(run)}; {self.capped.size} above {CAP} capped at {CAP}; "
                f"{_mixing_advice(run)}."
            )
        line = UNRELIABLE.format(khat=self.khat, meaning=meaning)
        if self.capped.size:
            line += f" {self.capped.size} probabilities above {CAP} are capped at {CAP}."
        return line

    def selected(self, threshold=0.5):
        """Indices of the features whose inclusion probability exceeds ``threshold`` (median probability model)."""
        return np.flatnonzero(self.inclusion_probabilities > threshold)

    def summary(self):
        """A pandas table: probability, coefficient and credible set of every feature, most probable first."""
        import pandas as pd

        cs = np.full(len(self.feature_names), -1)
        for k, members in enumerate(self.credible_sets):
            cs[members] = k
        table = pd.DataFrame(
            {
                "inclusion": self.inclusion_probabilities,
                "variational": self.variational_probabilities,
                "coefficient": self.coefficients,
                "credible_set": cs,
            },
            index=pd.Index(self.feature_names, name="feature"),
        )
        return table.sort_values("inclusion", ascending=False)

    def to_inference_data(self, num_draws=1000, seed=0):
        r"""An :class:`arviz.InferenceData`: ``posterior["gamma"]`` with dims ``(chain, draw, feature)``.

        ``"mcmc"``: the sampler's chains. Each chain's thinned states carry importance weights
        :math:`1/Z(\gamma)` (weighted tempered Gibbs samples :math:`p(\gamma \mid y) Z(\gamma)`);
        they are resampled within the chain by systematic resampling, which keeps their order,
        so the chain means estimate the posterior and ArviZ's diagnostics compare real chains.
        Otherwise the draws are resampled from the importance-weighted proposal draws (with the
        weights, so their means are :attr:`inclusion_probabilities` up to Monte Carlo error;
        when the check failed the weights are still used and :attr:`reliable` is ``False``).
        The ``selection`` group holds ``inclusion``, ``variational`` and ``coefficient`` per
        feature (and ``mcse``, ``ess``, ``rhat`` for ``"mcmc"``); its ``attrs`` hold ``khat``,
        ``reliable``, ``method`` and the prior.
        """
        from .._optional import import_arviz

        az = import_arviz()
        rng = np.random.default_rng(seed)
        p = len(self.feature_names)
        if self.method == "mcmc":
            chains = len(self.sampler.states)
            per_chain = max(num_draws // chains, 1)
            gamma = np.zeros((chains, per_chain, p), dtype=np.int8)
            for c, (states, logw) in enumerate(zip(self.sampler.states, self.sampler.state_log_weights, strict=True)):
                w = np.exp(logw - logw.max())
                cdf = np.cumsum(w / w.sum())
                rows = np.minimum(np.searchsorted(cdf, (rng.random() + np.arange(per_chain)) / per_chain), len(w) - 1)
                for d, r in enumerate(rows):
                    gamma[c, d, states[r]] = 1
        else:
            w = np.exp(self.log_weights - np.max(self.log_weights))
            rows = rng.choice(len(w), size=num_draws, p=w / w.sum())
            chains = 4 if num_draws % 4 == 0 else 1  # chains of i.i.d. draws, as in to_inference_data for gates
            gamma = self.draws[rows].astype(np.int8).reshape(chains, num_draws // chains, -1)
        names = np.asarray(self.feature_names)
        idata = az.from_dict(posterior={"gamma": gamma}, coords={"feature": names}, dims={"gamma": ["feature"]})
        import xarray as xr

        per_feature = {
            "inclusion": ("feature", self.inclusion_probabilities),
            "variational": ("feature", self.variational_probabilities),
            "coefficient": ("feature", self.coefficients),
        }
        if self.method == "mcmc":
            per_feature.update(mcse=("feature", self.mcse), ess=("feature", self.ess), rhat=("feature", self.rhat))
        selection = xr.Dataset(
            per_feature,
            coords={"feature": names},
            attrs={
                "khat": self.khat,
                "reliable": int(self.reliable),
                "method": self.method,
                "family": self.family,
                "prior_inclusion": self.prior_inclusion,
                "slab_scale": self.slab_scale,
                "noise_scale": self.noise_scale,
            },
        )
        idata.add_groups({"selection": selection})
        return idata

    def plot(self, ax=None, top=30, exact=None):
        """Bar chart of the ``top`` largest inclusion probabilities, with a legend that explains it.

        Filled bars are :attr:`inclusion_probabilities`, coloured by credible set (features of one
        set share a colour; grey: in no set); open bars the fit's own probabilities
        (:attr:`variational_probabilities`); crosses ``exact`` (e.g. from
        :func:`~l0bayes.analysis.exact_inclusion_probabilities`) when given; a dashed line the 0.5
        of the median-probability model. Returns ``(fig, ax)``.
        """
        from matplotlib.lines import Line2D
        from matplotlib.patches import Patch

        from ..analysis.plots import _axes

        shown = min(top, len(self.feature_names))
        fig, ax = _axes(ax, figsize=(max(7.5, 0.45 * shown + 4.0), 3.8))
        order = np.argsort(-self.inclusion_probabilities)[:shown]
        names = [str(self.feature_names[j]) for j in order]
        colours = np.full(len(self.feature_names), "0.65", dtype=object)
        for k, members in enumerate(self.credible_sets):
            colours[members] = f"C{k % 10}"
        pos = np.arange(shown)
        ax.bar(pos, self.inclusion_probabilities[order], color=list(colours[order]), width=0.8)
        ax.bar(pos, self.variational_probabilities[order], width=0.8, fill=False, edgecolor="k", lw=0.8)
        if exact is not None:
            ax.plot(pos, np.asarray(exact)[order], "kx", ms=7, mew=1.5)
        ax.axhline(0.5, color="0.35", ls="--", lw=1)
        ax.set_xticks(
            pos, names, fontsize=9, rotation=0 if shown <= 12 else 60, ha="center" if shown <= 12 else "right"
        )
        ax.set_xlim(-0.6, shown - 0.4)
        ax.set_ylim(0, 1.02)
        ax.set_ylabel("inclusion probability")
        state = "reliable" if self.reliable else "not reliable: the fit's own probabilities"
        ax.set_title(f"Pareto k-hat = {self.khat:.2f} ({state})", fontsize=10)
        handles = []
        on_plot = set(order.tolist())
        for k, members in enumerate(self.credible_sets):
            members = [j for j in members.tolist() if j in on_plot]
            if not members:
                continue
            if len(handles) == 8:
                handles.append(Patch(color="none", label="(more sets: colours repeat)"))
                break
            listed = ", ".join(str(self.feature_names[j]) for j in members[:3])
            listed += f" +{len(members) - 3}" if len(members) > 3 else ""
            handles.append(Patch(color=f"C{k % 10}", label=f"credible set {k + 1}: {listed}"))
        handles.append(Patch(color="0.65", label="in no credible set"))
        handles.append(Patch(fill=False, edgecolor="k", lw=0.8, label="variational fit (before the check)"))
        if exact is not None:
            handles.append(Line2D([], [], color="k", marker="x", ms=7, mew=1.5, ls="none", label="exact"))
        handles.append(Line2D([], [], color="0.35", ls="--", lw=1, label="0.5: median-probability model"))
        ax.legend(
            handles=handles,
            title=f"filled bars: {self.method} probabilities",
            title_fontsize=8,
            fontsize=8,
            loc="upper left",
            bbox_to_anchor=(1.01, 1.0),
        )
        return fig, ax


# ------------------------------------------------------------------ inputs
def _unmixed_words(run):
    """Which of the sampler's criteria failed, for how many probabilities, and the worst value of each."""
    bad = run.unmixed()
    parts = []
    high_rhat = bad & ~(run.rhat <= RHAT_MAX)  # nan (not computed) fails too
    if high_rhat.any():
        worst = run.rhat[high_rhat & np.isfinite(run.rhat)]
        value = f"worst {worst.max():.3f}" if worst.size else "not computed"
        parts.append(f"{_count(high_rhat.sum())} with R-hat above {RHAT_MAX} ({value})")
    low_ess = bad & ~(run.ess >= ESS_MIN)
    if low_ess.any():
        worst = run.ess[low_ess & np.isfinite(run.ess)]
        value = f"lowest {worst.min():.0f}" if worst.size else "not computed"
        parts.append(f"{_count(low_ess.sum())} with ESS below {ESS_MIN} ({value})")
    return " and ".join(parts)


def _mixing_advice(run):
    """What would mix an unmixed run: the steps per chain of :meth:`TemperedGibbsResult.steps_to_mix` (a lower
    estimate: a slow mode can need several times more) and the time they take at the run's own pace."""
    steps = run.steps_to_mix()
    if steps is None:
        return "raise mcmc_steps (and time_budget)"
    pace = run.seconds / max(run.num_steps + run.num_warmup, 1)
    seconds = (steps + MCMC_WARMUP) * pace
    return (
        f"at least about {steps:,} steps per chain would mix them (R-hat^2 - 1 falls as 1/steps), {seconds:.0f} s "
        "at this run's pace: method='mcmc' with a larger time_budget samples until they have mixed"
    )


def _count(k):
    k = int(k)
    return f"{k} probability" if k == 1 else f"{k} probabilities"


def _as_float64(a, name, device):
    """``a`` as a float64 tensor on ``device``: any real (or boolean) array or tensor, finite; else a clear error."""
    if isinstance(a, torch.Tensor):
        if a.is_complex():
            raise TypeError(f"select_variables: {name} must be real, got a {a.dtype} tensor")
        t = a.detach().to(device=device, dtype=torch.float64)
    else:
        try:
            array = np.asarray(a)
        except (TypeError, ValueError) as err:
            raise TypeError(f"select_variables: {name} must be a numeric array or tensor") from err
        if array.dtype.kind not in "biuf":
            raise TypeError(f"select_variables: {name} must be a real numeric array or tensor, got dtype {array.dtype}")
        t = torch.as_tensor(array.astype(np.float64), device=device)
    if not torch.isfinite(t).all():
        raise ValueError(f"select_variables: {name} contains NaN or infinite values")
    return t


def _to_unit(v):
    r"""``v`` (float64, columns last) divided by a power of two near the largest magnitude of each column, and the
    exponents: exact, so means and standard deviations are then computed without overflow or underflow at any
    scale, and a column rescaled by a power of two gives the same bits."""
    _, exponent = torch.frexp(v.abs().amax(0))
    half = torch.div(exponent, 2, rounding_mode="floor")  # two steps: 2**exponent alone can overflow
    one = torch.ones(exponent.shape, dtype=v.dtype, device=v.device)
    return v * torch.ldexp(one, -half) * torch.ldexp(one, half - exponent), exponent


def _nearly_constant(mean, scale):
    """Columns (in the units of :func:`_to_unit`, magnitudes below 1) whose spread is at rounding level."""
    return ~(scale > CONSTANT * (1.0 + mean.abs()))


def _standardise(x, y, family):
    r"""Centre and scale the columns of ``x`` (``ddof=1``); centre ``y`` and scale it by a power of two near its
    standard deviation for the Gaussian family.

    Everything in float64. Returns the standardised ``x`` and ``y``, the columns' standard deviations as
    ``(mantissa, exponent)`` (``std = mantissa * 2**exponent``), the exponent ``k`` of the scale ``2**k`` that
    divides ``y`` (0 for bernoulli) and ``y``'s standard deviation in those units. Standardising ``X`` makes the
    selection invariant to rescaling its columns; scaling ``y`` keeps every computation near unit scale whatever
    its units (``slab_scale`` and ``noise_scale`` are divided by the same power of two).
    """
    if x.dim() != 2:
        raise ValueError(f"select_variables: X must have shape (n, p), got {tuple(x.shape)}")
    if y.dim() != 1 or y.shape[0] != x.shape[0]:
        raise ValueError(
            f"select_variables: y must have shape ({x.shape[0]},) to match X of shape {tuple(x.shape)}, "
            f"got {tuple(y.shape)}"
        )
    n, p = x.shape
    if n < 3:
        raise ValueError(f"select_variables: need at least 3 observations (rows of X and y), got {n}")
    if p < 1:
        raise ValueError("select_variables: X has no columns")
    unit, exponent = _to_unit(x)
    mean, scale = unit.mean(0), unit.std(0)
    constant = torch.nonzero(_nearly_constant(mean, scale)).flatten()
    if constant.numel():
        raise ValueError(
            f"select_variables: X has constant columns {constant.tolist()[:10]}: drop them (they cannot be selected)"
        )
    xs = (unit - mean) / scale
    if family == "bernoulli":
        if not bool(((y == 0) | (y == 1)).all()):
            raise ValueError("select_variables: family='bernoulli' needs y in {0, 1}")
        if bool((y == y[0]).all()):
            raise ValueError(
                f"select_variables: y has one class only (every label is {int(y[0])}): nothing to tell apart, "
                "family='bernoulli' needs both 0 and 1 in y"
            )
        return xs, y, (scale, exponent), 0, 1.0
    y_unit, y_exponent = _to_unit(y[:, None])
    y_mean, y_sd = y_unit.mean(0), y_unit.std(0)
    if bool(_nearly_constant(y_mean, y_sd)):
        raise ValueError("select_variables: y is constant: nothing to select")
    _, k = math.frexp(float(y_sd))  # y_sd = m * 2**k with m in [0.5, 1): divide by 2**k
    centred = torch.ldexp(y_unit[:, 0] - y_mean, torch.tensor(-k, device=y.device))
    return xs, centred, (scale, exponent), int(y_exponent) + k, math.ldexp(float(y_sd), -k)


# ------------------------------------------------------------------ Gaussian
def _target_defaults(fit, pip, prior_inclusion, slab_scale, noise_scale):
    """Empirical-Bayes values of the target model's prior where the user gave none."""
    p = pip.numel()
    if noise_scale is None:
        noise_scale = math.sqrt(fit.noise_variance)
    if prior_inclusion is None:
        prior_inclusion = min(max(float(pip.sum()), 1.0) / p, 0.5)
    if slab_scale is None:
        coef = fit.coefficients()[pip > 0.5]
        slab_scale = float(coef.pow(2).mean().sqrt()) if coef.numel() else math.sqrt(float(fit.prior_variance.max()))
        slab_scale = max(slab_scale, 1e-3 * noise_scale)
    return float(prior_inclusion), float(slab_scale), float(noise_scale)


CORE = 1e-3  # features below this probability are proposed as one exchangeable background block
MAX_CORE = 200  # and so are all but the MAX_CORE most probable ones


def _residual_inclusion(x, y, coef, prior_inclusion, slab_scale, noise_scale):
    r"""Probability that feature :math:`j` enters a model that already holds the fit, one at a time.

    With the residual :math:`r = y - X\bar b`, :math:`\hat\beta_j = x_j^\top r / d_j` and
    :math:`s_j^2 = \sigma^2 / d_j`: :math:`\pi_0 \mathrm{BF}_j / (1 - \pi_0 + \pi_0 \mathrm{BF}_j)`
    with the Bayes factor of the single-effect regression at :math:`V = \tau^2`. It gives the
    proposal the weak signals that the fit's effects left out.
    """
    d = (x * x).sum(0)
    bhat = (x.T @ (y - x @ coef)) / d
    s2 = noise_scale**2 / d
    lbf = 0.5 * torch.log(s2 / (slab_scale**2 + s2)) + 0.5 * bhat**2 * slab_scale**2 / (s2 * (slab_scale**2 + s2))
    return torch.sigmoid(lbf + math.log(prior_inclusion) - math.log1p(-prior_inclusion))


def _proposals(probs, p):
    """Two product-Bernoulli components and the core mask.

    The first is the probabilities clipped to ``[0.1/p, 1 - 0.1/p]``; the second, defensive,
    moves them towards 1/2 by ``1/p``, :math:`(a_j + 1/p) / (1 + 2/p)`: about one extra feature
    per draw for large ``p``, a visible flattening for small ``p``. Features below :data:`CORE`
    (and all but the :data:`MAX_CORE` most probable) are the exchangeable background of
    :class:`~l0bayes.analysis.importance.BernoulliMixture`.
    """
    floor = 0.1 / p
    clipped = probs.clamp(floor, 1.0 - floor)
    flat = (clipped + 1.0 / p) / (1.0 + 2.0 / p)
    core = probs >= CORE
    if int(core.sum()) > MAX_CORE:
        core = torch.zeros_like(core)
        core[torch.topk(probs, MAX_CORE).indices] = True
    return torch.stack([clipped, flat]), core


def _reweight(x, y, pip, hyper, num_draws, rounds, generator, gram=None):
    r"""Adaptive importance sampling: round ``r + 1`` proposes from round ``r``'s reweighted probabilities.

    Stops at the first round with k-hat at most 0.7 and an effective sample size of at least a
    tenth of the draws. ``gram``: :math:`X^\top X` where it is computed once for the check and the sampler.
    """
    p = x.shape[1]
    probs, check = pip, None
    for _ in range(rounds):
        proposals, core = _proposals(probs, p)
        check = importance_check(
            x, y, proposals, *hyper, num_draws=num_draws, generator=generator, core=core, rao_blackwell=False, gram=gram
        )
        if check.reliable and check.ess >= 0.1 * num_draws:
            break
        # the next round adapts the core features only: a background feature's estimate rests on
        # the few draws that happened to include it
        probs = torch.where(core, torch.as_tensor(check.inclusion, dtype=x.dtype, device=x.device), pip)
    draws = torch.as_tensor(check.draws, device=x.device)
    weights = torch.as_tensor(np.exp(check.log_weights), dtype=x.dtype, device=x.device)
    check.inclusion = _conditional_inclusion(x, y, draws, weights, *hyper, gram=gram).cpu().numpy()
    return check


def _select_gaussian(xs, yc, prior_inclusion, slab_scale, noise_scale, opts):
    fit = fit_single_effects(
        xs,
        yc,
        num_effects=opts["num_effects"],
        noise_variance=None if noise_scale is None else noise_scale**2,
        tol=opts["tol"],
        max_iter=opts["max_iter"],
    )
    pip = fit.inclusion_probabilities()
    hyper = _target_defaults(fit, pip, prior_inclusion, slab_scale, noise_scale)
    sets, effects = credible_sets(xs, fit.alpha, fit.active)
    # The proposal uses only the effects with a credible set: a diffuse effect (a tiny prior
    # variance spread over every feature) would only add random features to each draw.
    kept = fit.active.clone()
    if effects:
        kept[:] = False
        kept[effects] = True
    start = -torch.expm1(torch.log1p(-fit.alpha[kept]).sum(0))
    start = torch.maximum(start, _residual_inclusion(xs, yc, fit.coefficients(), *hyper))
    # X^T X once, for the check, its Rao-Blackwellised probabilities and the sampler, where the sampler would use it
    gram = xs.T @ xs if full_gram_pays(*xs.shape) else None
    check = _reweight(xs, yc, start, hyper, opts["num_draws"], opts["rounds"], opts["generator"], gram)
    variational = pip.cpu().numpy()
    out = {"inclusion": check.inclusion, "coef": check.coef_mean, "method": "reweighted"}
    if not check.reliable:
        out = {"inclusion": variational, "coef": fit.coefficients().cpu().numpy(), "method": "variational"}
    details = {
        "num_effects": int(fit.alpha.shape[0]),
        "active_effects": int(fit.active.sum()),
        "elbo": fit.elbo,
        "converged": fit.converged,
        "ess": check.ess,
        "max_shift": check.max_shift,
    }
    return {
        **out,
        "start": start,
        "variational": variational,
        "sets": sets,
        "khat": check.khat,
        "draws": check.draws,
        "log_weights": check.log_weights,
        "hyper": hyper,
        "details": details,
        "gram": gram,
    }


# ------------------------------------------------------------------ Bernoulli
def _logistic_free_energy(model, x, y):
    """One-sample estimate of the free energy (Eq. 21): NLL + gate KL (Eq. 28) + slab cost (Eq. 20)."""
    z = model.gate()
    noise = torch.randn_like(model.weight)
    logits = x @ model._coefficients(z, noise) + model.bias
    nll = torch.nn.functional.binary_cross_entropy_with_logits(logits, y, reduction="sum")
    gate_kl = kl_hard_concrete(model.gate.distribution(), prior_like(model.prior, model.weight)).sum()
    return nll + gate_kl + model._code_cost(x.shape[0])


def _logistic_fit(xs, y, prior_inclusion, slab_scale, opts):
    """Full-batch Adam on the mean-field free energy until it stops improving.

    Every ``window`` steps the mean of the last ``window`` one-sample estimates is compared
    with the mean of the ``window`` before: the fit stops when, at two checks in a row, they
    differ by less than two standard errors of the difference (the objective has stabilised
    within its own noise) or by less than ``tol`` relative.
    """
    from .regression import SparseLogisticRegression

    model = SparseLogisticRegression(
        xs.shape[1], prior_inclusion=prior_inclusion, slab="gaussian", prior_scale=slab_scale
    ).to(device=xs.device, dtype=xs.dtype)
    optim = torch.optim.Adam(model.parameters(), lr=opts["lr"])
    history, window, calm = [], 200, 0
    for step in range(1, opts["max_steps"] + 1):
        optim.zero_grad()
        loss = _logistic_free_energy(model, xs, y)
        loss.backward()
        optim.step()
        history.append(loss.item())
        if step >= 3 * window and step % window == 0:
            now, before = np.asarray(history[-window:]), np.asarray(history[-2 * window : -window])
            gap = abs(before.mean() - now.mean())
            se = math.sqrt((now.var() + before.var()) / window)
            calm = calm + 1 if gap < 2.0 * se or gap < opts["tol"] * (1.0 + abs(now.mean())) else 0
            if calm == 2:
                break
    return model, history


def _logistic_check(model, xs, y, slab_scale, num_draws, generator):
    """Importance weights of the guide's joint draws ``(z, theta)`` against the exact joint density."""
    from torch.distributions import Bernoulli, Normal

    with torch.no_grad():
        q_gate, prior = model.gate.distribution(), prior_like(model.prior, model.weight)
        z = q_gate.sample((num_draws,))
        mu, s = model.weight, model.slab_log_scale.exp()
        theta = mu + s * torch.randn(num_draws, mu.numel(), dtype=xs.dtype, device=xs.device, generator=generator)
        logits = (theta * z) @ xs.T + model.bias
        log_lik = Bernoulli(logits=logits).log_prob(y).sum(1)
        log_gate = (prior.log_prob(z) - q_gate.log_prob(z)).sum(1)
        slab = Normal(0.0, slab_scale).log_prob(theta) - Normal(mu, s).log_prob(theta)
        log_slab = torch.where(z != 0, slab, torch.zeros_like(slab)).sum(1)
        smoothed, khat = psis((log_lik + log_gate + log_slab).cpu().numpy())
        w = torch.as_tensor(np.exp(smoothed), dtype=xs.dtype, device=xs.device)
        draws = z != 0
        inclusion = (w @ draws.to(xs.dtype)).clamp(0.0, 1.0)  # a sum of normalised weights: above 1 by rounding only
        return khat, inclusion.cpu().numpy(), (w @ (theta * z)).cpu().numpy(), draws, smoothed


def _screening(xs, y, opts):
    r"""A sum of single effects fitted to the centred labels (a linear probability model): its credible sets, and
    the empirical-Bayes :math:`\pi_0` of the logistic model, its expected number of effects over :math:`p` (at most
    1/2).

    The sets group the features that carry one signal, as the Gaussian family's do: a group of correlated features
    explains the labels' linear part as it explains their logits.
    """
    p = xs.shape[1]
    fit = fit_single_effects(xs, y - y.mean(), num_effects=opts["num_effects"], tol=1e-3, max_iter=opts["max_iter"])
    sets, _ = credible_sets(xs, fit.alpha, fit.active)
    return min(max(float(fit.inclusion_probabilities().sum()), 1.0) / p, 0.5), sets


def _select_bernoulli(xs, y, prior_inclusion, slab_scale, opts):
    screened, sets = _screening(xs, y, opts)
    prior_inclusion = screened if prior_inclusion is None else prior_inclusion
    slab_scale = 1.0 if slab_scale is None else slab_scale
    model, history = _logistic_fit(xs, y, prior_inclusion, slab_scale, opts)
    khat, inclusion, coef, draws, logw = _logistic_check(model, xs, y, slab_scale, opts["num_draws"], opts["generator"])
    variational = model.inclusion_probabilities().cpu().numpy()
    out = {"inclusion": inclusion, "coef": coef, "method": "reweighted"}
    if khat > KHAT_THRESHOLD:
        out = {"inclusion": variational, "coef": model.coefficients().cpu().numpy(), "method": "variational"}
    return {
        **out,
        "start": torch.as_tensor(variational, dtype=xs.dtype, device=xs.device),
        "variational": variational,
        "sets": sets,
        "khat": khat,
        "draws": draws.cpu().numpy(),
        "log_weights": logw,
        "hyper": (prior_inclusion, slab_scale, float("nan")),
        "details": {"steps": len(history), "free_energy": history},
    }


# ------------------------------------------------------------------ exact sampler
def _refine(fit, xs, y, family, opts, time_budget, noise_given, warmup=MCMC_WARMUP, diagnose=True):
    r"""Weighted tempered Gibbs sampling of the exact posterior of the fit's target model, started from the fit.

    Gaussian family without a given ``noise_scale``: :math:`\sigma` is sampled too (Jeffreys prior,
    started at the fit's estimate), since the fit's estimate is least reliable where its check fails.
    """
    prior_inclusion, slab_scale, noise_scale = fit["hyper"]
    sample_noise = family == "gaussian" and not noise_given
    run = tempered_gibbs(
        xs,
        y,
        prior_inclusion,
        slab_scale,
        noise_scale if family == "gaussian" else None,
        family=family,
        start=fit["start"],
        num_chains=opts["num_chains"],
        warmup=warmup,
        max_steps=opts["mcmc_steps"],
        time_budget=time_budget,
        noise_prior="jeffreys" if sample_noise else None,
        generator=opts["generator"],
        gram=fit.get("gram"),
        diagnose=diagnose,
    )
    details = {**fit["details"], "sampler_steps": run.num_steps, "sampler_seconds": run.seconds, **run.details}
    hyper = fit["hyper"]
    if sample_noise:
        hyper = (prior_inclusion, slab_scale, run.details["noise_scale_mean"])
        details["noise_prior"] = "jeffreys"
    return {
        **fit,
        "hyper": hyper,
        "inclusion": run.inclusion,
        "coef": run.coef_mean,
        "method": "mcmc",
        "mcse": run.mcse,
        "ess": run.ess,
        "rhat": run.rhat,
        "sampler": run,
        "details": details,
    }


def _verify(fit, xs, y, family, opts, budget, noise_given):
    r"""A passed check, tested by a short run of the sampler started from the fit.

    Pareto :math:`\hat k` only sees the states the fit proposes: a fit that misses a mode entirely can pass it.
    The sampler, started from the fit, finds such a mode. Where every probability of the checked fit lies within
    :data:`AGREE` (plus twice its Monte Carlo error) of the short run's (:data:`VERIFY_STEPS` steps per chain),
    the checked fit stands; else the answer of a full run is returned.
    """
    short = {**opts, "mcmc_steps": min(opts["mcmc_steps"], VERIFY_STEPS)}
    run = _refine(fit, xs, y, family, short, budget, noise_given, warmup=VERIFY_WARMUP, diagnose=False)
    gap = np.abs(np.asarray(run["inclusion"]) - np.asarray(fit["inclusion"]))
    excess = gap - AGREE  # the Monte Carlo errors only matter where a gap exceeds AGREE (they are never negative)
    if (excess > 0).any():
        excess = excess - 2 * np.nan_to_num(run["sampler"].diagnose().mcse)
    verdict = {
        "max_gap": float(gap.max()),
        "feature": int(np.argmax(excess)),
        "steps": run["sampler"].num_steps,
        "seconds": run["sampler"].seconds,
    }
    if not (excess > 0).any():
        fit["details"]["verified"] = verdict
        return fit
    # the fit missed mass: the sampler's answer, from a full run (the short one has few draws)
    left = max(budget - verdict["seconds"], 0.1 * budget)
    full = _refine(fit, xs, y, family, opts, left, noise_given)
    full["details"]["check_contradicted"] = verdict
    return full


def _cap(fit):
    """Probabilities above :data:`CAP` without a passed check or a mixed chain, returned as :data:`CAP`."""
    inclusion = np.asarray(fit["inclusion"], dtype=np.float64).copy()
    if fit["method"] == "reweighted":
        return inclusion, np.zeros(0, dtype=np.int64)
    if fit["method"] == "mcmc":
        doubtful = fit["sampler"].unmixed()
    else:  # the fit's own probabilities: trusted only when the check passed
        doubtful = np.full(inclusion.shape, not fit["khat"] <= KHAT_THRESHOLD)
    capped = np.flatnonzero(doubtful & (inclusion > CAP))
    inclusion[capped] = CAP
    return inclusion, capped


# ------------------------------------------------------------------ entry point
def select_variables(
    X,
    y,
    family="gaussian",
    prior_inclusion=None,
    slab_scale=None,
    noise_scale=None,
    feature_names=None,
    device=None,
    dtype=torch.float64,
    num_draws=2000,
    seed=0,
    method="auto",
    time_budget=None,
    threads="auto",
    **options,
):
    r"""Which features of ``X`` matter for ``y``? Inclusion probabilities you can check.

    :param X: ``(n, p)`` numpy array or tensor of any real dtype (no NaN, no constant column; ``n >= 3``;
        ``p > n`` is fine).
    :param y: ``(n,)``: real for ``family="gaussian"``, 0/1 for ``family="bernoulli"`` (both labels present).
    :param prior_inclusion: :math:`\pi_0`, the prior probability that a feature is included;
        ``None``: estimated (the fit's expected number of effects over :math:`p`, at most 0.5; for
        bernoulli that of a sum of single effects fitted to the centred labels).
    :param slab_scale: :math:`\tau`, the prior sd of an included coefficient per standard
        deviation of its feature, in units of ``y`` (bernoulli: logits); ``None``: the root mean square of
        the selected coefficients (1 for bernoulli). Gaussian: within ``[1e-6, 1e6]`` times the standard
        deviation of ``y`` (bernoulli: within ``[1e-6, 1e6]``); beyond, the posterior is its limit (every
        probability at the prior, or at 0) and the computation overflows.
    :param noise_scale: :math:`\sigma`, fixed when given (Gaussian family; within ``[1e-6, 1e6]`` times the
        standard deviation of ``y``); else estimated by the fit, and sampled by the exact sampler when it runs
        (prior :math:`p(\sigma^2) \propto 1/\sigma^2`; ``result.noise_scale`` is then its posterior mean).
        That posterior is improper where a model fits ``y`` exactly (``n - 1`` features can): with ``n <= 10``
        and ``p >= n - 1`` a sampler (``method`` ``"auto"`` or ``"mcmc"``) needs ``noise_scale``, and a chain
        whose noise collapses stops with an error that says so.
    :param feature_names: names for the result (default the column indices).
    :param device: where to compute (``"cpu"``, ``"cuda"``; default: the device of a tensor ``X``, else CPU).
    :param int num_draws: importance-sampling draws per round (at least 100).
    :param int seed: the seed of every random draw, a whole number in ``[0, 2**64)``.
    :param dtype: the precision of the computation, ``torch.float64`` (default) or ``torch.float32``;
        ``X`` and ``y`` of any real dtype (or a mix) are converted to it after being standardised in float64.
    :param str method: ``"auto"`` (default): the fit, checked by importance sampling, then weighted
        tempered Gibbs sampling of the exact posterior
        (:func:`~l0bayes.inference.tempered_gibbs.tempered_gibbs`) started from the fit, 4 chains x 1,250
        steps (5,000 weighted draws). Where the check fails (Pareto :math:`\hat k > 0.7`) the answer is the
        sampler's; where it passes, a short run (4 chains x 150 steps) tests it: the reweighted fit stands if
        no probability differs from the short run's by more than 0.2 plus twice its Monte Carlo error
        (``details["verified"]``), else the full run's answer is returned (``details["check_contradicted"]``):
        :math:`\hat k` cannot see a mode the fit never proposes. ``"mcmc"``: the sampler until it mixes or
        ``time_budget`` ends. ``"variational"``: no sampler.
    :param time_budget: at most this many seconds for the sampler (default 15; ``inf``: no limit); it stops
        earlier once every probability of at least 0.01 has R-hat <= 1.01 and ESS >= 100, or (``"auto"``)
        after its steps.
    :param threads: torch's intra-op thread count during the fit, as in :func:`~l0bayes.inference.train`
        (:func:`~l0bayes.threads.thread_policy`): ``"auto"`` one thread unless the environment or an enclosing
        ``thread_policy`` chose, ``None`` torch's count, or an int; the caller's count is restored after.
    :param options: advanced: ``num_effects`` (10, the starting number of single effects),
        ``tol`` (1e-3 nats for the ELBO; 1e-4 relative for bernoulli), ``max_iter`` (100 sweeps),
        ``rounds`` (3 adaptive rounds at most), ``lr`` (0.05) and ``max_steps`` (5000 with ``"variational"``,
        else 800: there the fit is the check's proposal and the sampler's start) for bernoulli;
        for the sampler ``num_chains`` (4) and ``mcmc_steps`` (steps per chain after warm-up: 1,250 for
        ``"auto"``, at most 100,000 for ``"mcmc"``). Counts are whole numbers >= 1, ``tol`` and ``lr`` finite
        and positive.
    :returns: :class:`SelectionResult`; ``result.method`` says which method produced the
        probabilities and ``result.diagnostic`` in one line whether to trust them.

    No probability above 0.9 is returned without a passed check or a mixed chain: a feature the
    sampler puts above 0.9 whose own R-hat or ESS fails (R-hat > 1.01 or ESS < 100), or any
    probability above 0.9 of an unchecked fit (``"variational"`` with :math:`\hat k > 0.7`), is
    returned as 0.9 and listed in ``result.capped``.

    With ``prior_inclusion``, ``slab_scale`` and ``noise_scale`` all given, the Gaussian result
    estimates :func:`~l0bayes.analysis.exact_inclusion_probabilities` of the standardised data
    with the same arguments. A warning is issued when the check fails.
    """
    owner = "select_variables"
    for name, value, allowed in (("family", family, FAMILIES), ("method", method, METHODS)):
        if not isinstance(value, str) or value not in allowed:
            raise ValueError(f"{owner}: {name} must be one of {allowed}, got {value!r}")
    check_args(
        owner,
        ARG_CHECKS,
        prior_inclusion=prior_inclusion,
        slab_scale=slab_scale,
        noise_scale=noise_scale,
        num_draws=num_draws,
        time_budget=time_budget,
    )
    if family == "bernoulli" and noise_scale is not None:
        raise ValueError(f"{owner}: noise_scale is for family='gaussian' (bernoulli has no noise), got {noise_scale!r}")
    seed = check_seed(seed)
    if dtype not in (torch.float32, torch.float64):
        raise ValueError(
            f"{owner}: dtype must be torch.float32 or torch.float64 (the precision of the computation; X and y of "
            f"any real dtype are converted to it), got {dtype!r}"
        )
    if feature_names is not None and isinstance(feature_names, (str, bytes)):
        raise TypeError(f"{owner}: feature_names must be a sequence of names (one per column), got {feature_names!r}")
    unknown = set(options) - set(OPTION_CHECKS)
    if unknown:
        raise TypeError(f"{owner}: unknown options {sorted(unknown)}; the options are {sorted(OPTION_CHECKS)}")
    check_args(owner, OPTION_CHECKS, **options)
    options = {k: whole(v) if OPTION_CHECKS[k].integer else float(v) for k, v in options.items()}
    hyper = tuple(None if v is None else float(v) for v in (prior_inclusion, slab_scale, noise_scale))
    budget = None if time_budget is None else float(time_budget)
    with thread_policy(threads):
        run = dict(device=device, dtype=dtype, num_draws=whole(num_draws), seed=seed, method=method, time_budget=budget)
        return _select(X, y, family, hyper, feature_names, run, options)


def _device(device, X):
    """The device to compute on: ``device``, else that of a tensor ``X``, else the CPU; checked to be usable."""
    if device is None:
        return X.device if isinstance(X, torch.Tensor) else torch.device("cpu")
    if not isinstance(device, (str, torch.device)):
        raise TypeError(f"select_variables: device must be None, a string or a torch.device, got {device!r}")
    try:
        device = torch.device(device)
        torch.empty(0, device=device)
    except (RuntimeError, AssertionError) as err:
        raise ValueError(f"select_variables: device {str(device)!r} cannot be used here: {err}") from None
    return device


def _internal_scales(hyper, family, k, y_sd):
    r"""``slab_scale`` and ``noise_scale`` in the units of the standardised ``y`` (divided by ``2**k``), each
    checked to lie within :data:`SCALE_RANGE` times ``y``'s standard deviation (Gaussian) or in
    :data:`LOGIT_SLAB_RANGE` (bernoulli, logit units)."""
    prior_inclusion, slab_scale, noise_scale = hyper
    out = [prior_inclusion]
    for name, value in (("slab_scale", slab_scale), ("noise_scale", noise_scale)):
        if value is None:
            out.append(None)
            continue
        if family == "bernoulli":
            lo, hi = LOGIT_SLAB_RANGE
            if not lo <= value <= hi:
                raise ValueError(
                    f"select_variables: slab_scale must lie in [{lo:g}, {hi:g}] for family='bernoulli' (the prior sd "
                    f"of a coefficient, in logits per standard deviation of its feature), got {value!r}"
                )
            out.append(value)
            continue
        inner = math.ldexp(value, -k)
        lo, hi = SCALE_RANGE
        if not lo * y_sd <= inner <= hi * y_sd:
            sd = math.ldexp(y_sd, k)
            raise ValueError(
                f"select_variables: {name} must lie within [{lo:g}, {hi:g}] x the standard deviation of y ({sd:.6g}), "
                f"that is in [{lo * sd:.6g}, {hi * sd:.6g}], got {value!r}: beyond, the spike-and-slab posterior "
                "is its limit (every probability at the prior, or at 0) and its computation overflows"
            )
        out.append(inner)
    return tuple(out)


def _select(X, y, family, hyper, feature_names, run, options):
    """:func:`select_variables` after its argument checks, under its thread policy.

    ``hyper``: ``(prior_inclusion, slab_scale, noise_scale)``; ``run``: device, dtype, num_draws, seed,
    method and time_budget, checked.
    """
    device, dtype, num_draws, seed = run["device"], run["dtype"], run["num_draws"], run["seed"]
    method, time_budget = run["method"], run["time_budget"]
    device = _device(device, X)
    x = _as_float64(X, "X", device)
    yt = _as_float64(y, "y", device)
    xs, yc, (x_scale, x_exponent), k, y_sd = _standardise(x, yt, family)
    xs, yc = xs.to(dtype), yc.to(dtype)
    noise_given = hyper[2] is not None
    n, p = xs.shape
    if family == "gaussian" and not noise_given and method != "variational" and n - 1 <= p and n <= FEW_ROWS:
        raise ValueError(
            f"select_variables: {n} observations for {p} features: with noise_scale=None the sampler draws the noise "
            "under the Jeffreys prior, whose posterior is improper where a model of n - 1 features fits y exactly, "
            f"and with n <= {FEW_ROWS} the sampler reaches such models. Pass noise_scale, or method='variational' "
            f"(the fit's own noise estimate), or use more than {FEW_ROWS} (or more than p + 1) observations"
        )
    prior_inclusion, slab_scale, noise_scale = _internal_scales(hyper, family, k, y_sd)
    names = list(feature_names) if feature_names is not None else list(range(x.shape[1]))
    if len(names) != x.shape[1]:
        raise ValueError(
            f"select_variables: feature_names holds {len(names)} feature names for the {x.shape[1]} columns of X"
        )
    generator = torch.Generator(device=device).manual_seed(seed)
    opts = {
        "num_effects": 10,
        "tol": 1e-3 if family == "gaussian" else 1e-4,
        "max_iter": 100,
        "rounds": 3,
        "lr": 0.05,
        "max_steps": 5000 if method == "variational" else LOGISTIC_START_STEPS,
        "num_draws": num_draws,
        "generator": generator,
        "num_chains": 4,
        "mcmc_steps": MCMC_STEPS if method == "auto" else MAX_MCMC_STEPS,
        **options,
    }
    # the Bernoulli fit draws its gates from the global generator: seed it, leaving the caller's state alone
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        torch.manual_seed(seed)
        if family == "gaussian":
            fit = _select_gaussian(xs, yc, prior_inclusion, slab_scale, noise_scale, opts)
        else:
            fit = _select_bernoulli(xs, yc, prior_inclusion, slab_scale, opts)
        budget = TIME_BUDGET if time_budget is None else time_budget
        if method == "mcmc" or (method == "auto" and not fit["khat"] <= KHAT_THRESHOLD):
            fit = _refine(fit, xs, yc, family, opts, budget, noise_given=noise_given)
        elif method == "auto":
            fit = _verify(fit, xs, yc, family, opts, budget, noise_given=noise_given)
    inclusion, capped = _cap(fit)
    if capped.size:
        fit["details"]["uncapped"] = np.asarray(fit["inclusion"], dtype=np.float64)
    prior_out, slab_out, noise_out = fit["hyper"]
    if family == "gaussian":  # back to the units of y
        slab_out, noise_out = math.ldexp(slab_out, k), math.ldexp(noise_out, k)
        if "noise_scale_mean" in fit["details"]:
            fit["details"]["noise_scale_mean"] = math.ldexp(fit["details"]["noise_scale_mean"], k)
        if "elbo" in fit["details"]:  # log p(y) = log p(y / 2**k) - n k log 2
            fit["details"]["elbo"] = [e - x.shape[0] * k * math.log(2.0) for e in fit["details"]["elbo"]]
    coefficients = np.ldexp(
        np.asarray(fit["coef"], dtype=np.float64) / x_scale.cpu().numpy(), k - x_exponent.cpu().numpy()
    )
    result = SelectionResult(
        inclusion_probabilities=inclusion,
        coefficients=coefficients,
        credible_sets=fit["sets"],
        khat=float(fit["khat"]),
        method=fit["method"],
        family=family,
        prior_inclusion=prior_out,
        slab_scale=slab_out,
        noise_scale=noise_out,
        variational_probabilities=np.asarray(fit["variational"], dtype=np.float64),
        feature_names=names,
        draws=np.asarray(fit["draws"]),
        log_weights=np.asarray(fit["log_weights"]),
        details=fit["details"],
        mcse=fit.get("mcse"),
        ess=fit.get("ess"),
        rhat=fit.get("rhat"),
        capped=capped,
        sampler=fit.get("sampler"),
    )
    if not result.reliable:
        warnings.warn(result.diagnostic, RuntimeWarning, stacklevel=3)
    return result
