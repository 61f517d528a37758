r"""What :func:`~l0bayes.selection.select_variables` returns: :class:`SelectionResult`, and the cap on what it
cannot vouch for.

No probability above :data:`CAP` is returned without a passed check or a mixed chain (:func:`cap_probabilities`);
:attr:`SelectionResult.diagnostic` says in one line which method produced the probabilities and whether to trust
them.
"""

from dataclasses import dataclass, field

import numpy as np

from .._optional import figure_axes
from .importance import KHAT_THRESHOLD, khat_meaning
from .mcmc import MCMC_WARMUP
from .sampler.diagnostics import ESS_MIN, RELEVANT, RHAT_MAX

CAP = 0.9  # no probability above this without a passed check or a mixed chain
UNRELIABLE = (
    "Pareto k-hat = {khat:.2f} > 0.7 ({meaning}): these inclusion probabilities could not be checked "
    "against the exact posterior; do not trust individual probabilities, trust only the credible sets (if any)."
)


@dataclass
class SelectionResult:
    r"""What :func:`~l0bayes.selection.select_variables` returns.

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
        (:func:`~l0bayes.selection.khat_meaning`, and :attr:`diagnostic` in words).
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
        """Indices of the features whose inclusion probability is at least ``threshold`` (0.5: the median
        probability model; 0.9 keeps a capped probability, see :attr:`capped`)."""
        return np.flatnonzero(self.inclusion_probabilities >= threshold)

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
        :func:`~l0bayes.selection.exact_inclusion_probabilities`) when given; a dashed line the 0.5
        of the median-probability model. Returns ``(fig, ax)``.
        """
        from matplotlib.lines import Line2D
        from matplotlib.patches import Patch

        shown = min(top, len(self.feature_names))
        fig, ax = figure_axes(ax, figsize=(max(7.5, 0.45 * shown + 4.0), 3.8))
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


def cap_probabilities(fit):
    """Probabilities above :data:`CAP` without a passed check or a mixed chain, returned as :data:`CAP`.

    :param dict fit: the record of a family's fit (:func:`~l0bayes.selection.gaussian.select_gaussian`), after the
        sampler where it ran (:func:`~l0bayes.selection.mcmc.refine`).
    :returns: ``(inclusion, capped)``: the ``(p,)`` probabilities to report and the indices of those capped.
    """
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
