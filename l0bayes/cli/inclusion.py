r"""The checked inclusion probabilities of a Bayes regression run (``--model linear/logistic --objective bayes``).

The mean-field gates of :class:`~l0bayes.models.SparseLinearRegression` commit to one of a group of
correlated features and can put a feature the posterior includes near 0 (on diabetes, ``sex``). The
table therefore gives, beside the trained gates' :math:`q(z_j \ne 0)`, the probabilities of
:func:`~l0bayes.selection.select_variables` for the *same* model: prior inclusion probability
``--prior-inclusion``, slab :math:`N(0, \tau^2)` with the model's ``prior_scale`` :math:`\tau`
per standardised feature, and for the linear model the noise standard deviation of the least-squares
fit on all features; :func:`~l0bayes.selection.select_variables` reweights its own fit to the exact
posterior of that model (Pareto :math:`\hat k`) and tests it with an exact sampler. Those checked
probabilities are the headline ones; each feature's status says whether the gates agree with them.

Units. The command standardises each column with the training split's *population* standard deviation;
:func:`~l0bayes.selection.select_variables` standardises with ``ddof=1``. A coefficient with prior sd
:math:`\tau` per population sd therefore has prior sd :math:`\tau s_j` per ``ddof=1`` sd, :math:`s_j`
the column's ``ddof=1`` standard deviation in the command's units (:math:`\sqrt{n/(n-1)}` for every
column of a standardised training split); that is the ``slab_scale`` passed on.
"""

import math
import time
import warnings

#: a feature "agrees" when its trained gate's probability is within this of the checked one
#: (plus twice the checked probability's Monte Carlo standard error, where the sampler gives one)
AGREE = 0.1

STATUS_WORDS = {
    "agrees": "the trained gate's q(z != 0) agrees with the checked probability",
    "corrected": "the trained gate's q(z != 0) is off; the checked probability is the answer",
    "unchecked": "the check failed: neither probability can be trusted on its own",
    "capped": "the check failed and the estimate was above 0.9: reported as 0.9",
}


def cap_unchecked(probabilities, capped=()):
    """The probabilities of a failed check as the table reports them: none above 0.9.

    A check that failed vouches for no probability, so every one above 0.9 (the cap of
    :func:`~l0bayes.selection.select_variables`, :data:`l0bayes.selection.result.CAP`) is reported as 0.9: a
    feature that mixed on its own in a sampler that did not, or a trained gate's where the check could not run,
    as well as those that ``select_variables`` capped itself (``capped``, their indices).

    :returns: ``(probabilities, status)``: the capped copy and ``"capped"`` or ``"unchecked"`` per feature.
    """
    import numpy as np

    from ..selection.result import CAP

    probabilities = np.asarray(probabilities, dtype=np.float64)
    over = probabilities > CAP
    over[np.asarray(capped, dtype=np.int64)] = True
    return np.where(over, np.minimum(probabilities, CAP), probabilities), np.where(over, "capped", "unchecked").tolist()


def _noise_scale(x, y, model):
    """The noise sd of the check: the least-squares residual sd with every feature (``n > p + 1``), else the
    model's own estimate."""
    from ..selection import ols_noise_scale

    n, p = x.shape
    if n > p + 1:
        xc, yc = x - x.mean(0), y - y.mean()
        return float(ols_noise_scale(xc, yc) * math.sqrt((n - p) / (n - p - 1))), "least squares with every feature"
    return float(model.noise_scale.detach()), "the model's estimate"


class _NotRun:
    """In place of a :class:`~l0bayes.selection.SelectionResult` when the check could not run."""

    method = "not run"
    reliable = False
    khat = math.nan
    mcse = None
    capped = ()

    def __init__(self, diagnostic):
        self.diagnostic = diagnostic


def check_inclusion(cfg, model, data, y_train, feature_names):
    """The checked inclusion probabilities of the trained regression ``model`` (see the module docstring).

    :returns: a dict for ``summary.json``: ``feature_names``, and in their order the ``checked`` and ``variational``
        probabilities and the ``status`` of each feature,
        ``method``, ``reliable``, ``khat`` (``None`` when not finite), ``diagnostic`` (one line), the check's
        prior (``prior_inclusion``, ``slab_scale`` and ``noise_scale`` in the command's standardised units),
        ``max_gap`` and the feature with it, ``mcse`` (sampler only), ``seconds``.
    """
    import numpy as np

    from ..selection import select_variables

    start = time.perf_counter()
    x = data.x_train.detach().cpu().double().numpy()
    y = y_train.detach().cpu().double().numpy()
    family = "gaussian" if cfg["model"] == "linear" else "bernoulli"
    tau = float(model.prior_scale)
    spread = x.std(0, ddof=1) if x.shape[0] > 1 else np.ones(x.shape[1])  # (one row: the check refuses it)
    noise, noise_from = (None, None) if family == "bernoulli" else _noise_scale(x, y, model)
    variational = model.inclusion_probabilities().detach().cpu().double().numpy()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # an unreliable result says so in the table instead
            warnings.filterwarnings("ignore", "y takes two values only", UserWarning)  # a split of 2 rows: refused
            result = select_variables(
                x,
                y,
                family=family,
                prior_inclusion=float(model.prior_inclusion),
                slab_scale=tau * float(spread.mean()),
                noise_scale=noise,
                feature_names=list(feature_names),
                seed=cfg["seed"],
            )
    except ValueError as err:  # e.g. a training split of 2 rows, or of one class: the table says why
        result = None
        reason = str(err)
    if result is None:
        checked = variational
        result = _NotRun(f"the check could not run ({reason}): the probabilities are the trained gates' own")
    else:
        checked = np.asarray(result.inclusion_probabilities, dtype=np.float64)
    if result.reliable:
        gap = np.abs(variational - checked)
        allowed = AGREE + (2 * np.nan_to_num(result.mcse) if result.mcse is not None else 0.0)
        status = np.where(gap <= allowed, "agrees", "corrected").tolist()
    else:
        checked, status = cap_unchecked(checked, result.capped)
        gap = np.abs(variational - checked)
    worst = int(np.argmax(gap))
    khat = float(result.khat)
    return {
        "feature_names": [str(n) for n in feature_names],
        "checked": checked.tolist(),
        "variational": variational.tolist(),
        "status": status,
        "method": result.method,
        "reliable": bool(result.reliable),
        "khat": khat if math.isfinite(khat) else None,
        "diagnostic": result.diagnostic,
        "prior_inclusion": float(model.prior_inclusion),
        "slab_scale": tau,
        "noise_scale": noise,
        "noise_scale_from": noise_from,
        "max_gap": float(gap[worst]),
        "max_gap_feature": str(feature_names[worst]),
        "mcse": None if result.mcse is None else [float(v) for v in result.mcse],
        "median_model": [str(n) for n, pi in zip(feature_names, checked, strict=True) if pi > 0.5],
        "slab": model.slab,
        "seconds": time.perf_counter() - start,
    }


def check_lines(check, selected=None):
    """The lines under the feature table: what the check did, whether to trust it, the prior it used, and
    (``selected``: the features of the trained gates' model) where the checked median-probability model differs."""
    if check["reliable"]:
        off = [s for s in check["status"] if s == "corrected"]
        verdict = (
            f"reliable; the trained gates are off for {len(off)} feature{'s' if len(off) != 1 else ''} "
            f"(largest difference {check['max_gap']:.2f}, {check['max_gap_feature']})"
            if off
            else f"reliable; the trained gates agree (largest difference {check['max_gap']:.2f})"
        )
    else:
        verdict = "NOT reliable: do not trust individual probabilities"
    prior = f"P(include) {check['prior_inclusion']:g}, slab N(0, {check['slab_scale']:g}^2) per standardised feature"
    if check["noise_scale"] is not None:
        prior += f", noise sd {check['noise_scale']:.4g} ({check['noise_scale_from']})"
    if check["slab"] == "point":
        prior += "; the point slab states no prior on the coefficients: this is the Gaussian slab's model"
    lines = [
        f"inclusion check ({check['method']}, {check['seconds']:.1f} s): {verdict}",
        f"  {check['diagnostic']}",
        f"  the model checked: {prior}",
    ]
    if selected is not None and check["median_model"] != list(selected):
        lines.append(
            f"  checked probability > 0.5: {', '.join(check['median_model']) or 'none'}; the trained gates (the "
            f"exported model) keep {', '.join(selected) or 'none'}"
        )
    return lines
