"""Variable selection on correlated designs: ``l0bayes.select_variables`` against SuSiE, millipede and the Lasso.

The designs (``benchmarks/RESULTS.md``, "Variable selection"; ``--design``), ``n`` rows and ``p``
columns of unit variance, ``effects`` true coefficients at random positions with ``|b|`` uniform in
[0.3, 1] and random signs:

* ``ar1``: columns follow an AR(1) process across columns (correlation ``rho`` between neighbours);
* ``block``: blocks of 10 columns sharing a factor (correlation ``rho`` within a block), and in
  every block two near-duplicate pairs (a column plus 0.1 sd of noise: correlation about 0.995);
* ``wide``: the AR(1) design with ``n`` replaced by ``--wide-n`` (default ``p / 5``: ``n < p``).

``--family gaussian``: ``y = X b + N(0, 1)``; ``--family bernoulli``: ``y ~ Bernoulli(sigmoid(X b))``.
Every method sees the same data; within a setting the methods run back to back, in an order that
rotates with the seed. Reported per setting, as mean ± sd over seeds:

* AUPRC of the true support (scikit-learn's average precision; inclusion probabilities for the
  Bayesian methods, ``|coef|`` for the Lasso);
* selected true / false (PIP > 0.5; non-zero coefficient for the Lasso);
* the fraction true among PIP > 0.9;
* wall time (seconds, one thread);
* ``l0bayes-fit``: ``select_variables(method="variational")``, the fit and its
  importance check without the sampler, to time what the sampler's test of a passed check adds;
* for l0bayes, Pareto k-hat of its importance check, which method produced the answer
  (``reweighted``, ``mcmc`` or ``variational``) and how many probabilities were capped at 0.9.

Then a calibration table per family (PIP bins against the fraction truly included, pooled over all
settings) and, with ``--diabetes``, the diabetes data against ``exact_inclusion_probabilities``
(prior inclusion 0.5, slab sd 1, noise sd the OLS residual sd, standardised data), including the
k-hat of the plain mean-field fit of notebook 02.

Peers (``pip install -e ".[bench]"``; millipede pins polyagamma 1.3.5, which has no wheel for
recent Pythons: install it with ``pip install --no-deps millipede-regression polyagamma pandas tqdm``):

* ``susie``: ``pysusie.susie(X, y, L=effects)`` (Gaussian only; its defaults otherwise);
* ``millipede``: ``NormalLikelihoodVariableSelector`` / ``BernoulliLikelihoodVariableSelector`` of
  millipede-regression (tempered Gibbs sampling on the collapsed posterior), its defaults (S = 5,
  intercept), ``T = --millipede-T`` (5000) after 1000 burn-in steps;
* ``lassocv``: ``sklearn.linear_model.LassoCV`` (5-fold, 100 alphas), or for the Bernoulli family
  ``LogisticRegressionCV`` with an L1 penalty (liblinear, 5-fold, 20 values of C).

Example::

    python benchmarks/bench_variable_selection.py --p 1000 --rho 0 0.9 --seeds 3 --markdown
    python benchmarks/bench_variable_selection.py --design block --n 400 --p 500 --effects 10 --seeds 5
    python benchmarks/bench_variable_selection.py --family bernoulli --n 500 --p 500 --rho 0.9 --effects 10
    python benchmarks/bench_variable_selection.py --diabetes --no-grid
"""

import argparse
import datetime
import json
import os
import platform
import statistics
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from tables import format_table  # noqa: E402

METHODS = ("l0bayes", "l0bayes-fit", "susie", "millipede", "lassocv")
BINS = (0.0, 0.1, 0.5, 0.9, 1.0 + 1e-12)


def make_data(n, p, rho, effects, seed, design="ar1", family="gaussian"):
    """The design, a sparse coefficient vector and the response (see the module docstring)."""
    rng = np.random.default_rng(seed)
    noise = rng.standard_normal((n, p))
    if design == "block":
        factors = rng.standard_normal((n, (p + 9) // 10))
        x = np.sqrt(rho) * factors[:, np.arange(p) // 10] + np.sqrt(1.0 - rho) * noise
        for j in range(p):
            if j % 5 == 4:  # a near-duplicate of its neighbour
                x[:, j] = (x[:, j - 1] + 0.1 * noise[:, j]) / np.sqrt(1.01)
    else:
        x = np.empty((n, p))
        x[:, 0] = noise[:, 0]
        scale = np.sqrt(1.0 - rho**2)
        for j in range(1, p):
            x[:, j] = rho * x[:, j - 1] + scale * noise[:, j]
    beta = np.zeros(p)
    support = rng.choice(p, size=effects, replace=False)
    beta[support] = rng.uniform(0.3, 1.0, effects) * rng.choice([-1.0, 1.0], effects)
    if family == "bernoulli":
        y = (rng.random(n) < 1.0 / (1.0 + np.exp(-(x @ beta)))).astype(float)
    else:
        y = x @ beta + rng.standard_normal(n)
    return x, y, beta != 0


def run_l0bayes(x, y, effects, family, time_budget=None, method="auto"):
    import l0bayes

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        result = l0bayes.select_variables(x, y, family=family, time_budget=time_budget, method=method)
    extra = {"khat": result.khat, "reliable": result.reliable, "used": result.method, "capped": int(result.capped.size)}
    return result.inclusion_probabilities, extra


def run_susie(x, y, effects, family):
    import pysusie

    return np.asarray(pysusie.susie(x, y, L=effects).pip), {}


def run_millipede(x, y, effects, family, num_samples=5000):
    import pandas as pd
    from millipede import BernoulliLikelihoodVariableSelector, NormalLikelihoodVariableSelector

    names = [f"x{j}" for j in range(x.shape[1])]
    frame = pd.DataFrame(x, columns=names)
    frame["y"] = y
    selector = (BernoulliLikelihoodVariableSelector if family == "bernoulli" else NormalLikelihoodVariableSelector)(
        frame, "y", S=5
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        selector.run(T=num_samples, T_burnin=1000, verbosity=None, seed=0)
    return np.asarray(selector.summary["PIP"].loc[names].values, dtype=np.float64), {}


def run_lassocv(x, y, effects, family):
    if family == "bernoulli":
        from sklearn.linear_model import LogisticRegressionCV

        fit = LogisticRegressionCV(Cs=20, cv=5, penalty="l1", solver="liblinear", random_state=0).fit(x, y)
        return np.abs(fit.coef_[0]), {"lasso": True}
    from sklearn.linear_model import LassoCV

    fit = LassoCV(cv=5, alphas=100, random_state=0, n_jobs=1).fit(x, y)
    return np.abs(fit.coef_), {"lasso": True}


def run_l0bayes_fit(x, y, effects, family):
    """``select_variables(method="variational")``: the fit and its check, no sampler (the time before it)."""
    return run_l0bayes(x, y, effects, family, method="variational")


RUNNERS = {
    "l0bayes": run_l0bayes,
    "l0bayes-fit": run_l0bayes_fit,
    "susie": run_susie,
    "millipede": run_millipede,
    "lassocv": run_lassocv,
}


def score(truth, score_, lasso):
    from sklearn.metrics import average_precision_score

    selected = score_ > 0 if lasso else score_ > 0.5
    high = score_ > 0.9
    return {
        "auprc": float(average_precision_score(truth, score_)),
        "sel_true": int((selected & truth).sum()),
        "sel_false": int((selected & ~truth).sum()),
        "true_among_high": float(truth[high].mean()) if high.any() and not lasso else float("nan"),
        "num_high": int(high.sum()) if not lasso else 0,
    }


def warm_up(methods, family):
    """One tiny run of every method first, so that imports and first-call costs are not timed."""
    x, y, _ = make_data(60, 30, 0.5, 3, 0, family=family)
    for method in methods:
        if method == "millipede":
            run_millipede(x, y, 3, family, num_samples=50)
        else:
            RUNNERS[method](x, y, 3, family)


def run_grid(args):
    methods = [m for m in args.methods if not (m == "susie" and args.family == "bernoulli")]
    warm_up(methods, args.family)
    records = []
    for p in args.p:
        n = args.n if args.design != "wide" else (args.wide_n or p // 5)
        for rho in args.rho:
            for seed in range(args.first_seed, args.seeds):
                data_seed = 1000 * seed + 7
                x, y, truth = make_data(n, p, rho, args.effects, data_seed, args.design, args.family)
                order = list(methods)
                k = seed % len(order)
                for method in order[k:] + order[:k]:
                    if method == "lassocv" and seed >= args.lasso_seeds.get(p, args.seeds):
                        continue
                    start = time.perf_counter()
                    if method == "millipede":
                        pip, extra = run_millipede(x, y, args.effects, args.family, args.millipede_T)
                    elif method == "l0bayes":
                        pip, extra = run_l0bayes(x, y, args.effects, args.family, args.time_budget)
                    else:
                        pip, extra = RUNNERS[method](x, y, args.effects, args.family)
                    seconds = time.perf_counter() - start
                    rec = {
                        "family": args.family,
                        "design": args.design,
                        "n": n,
                        "p": p,
                        "rho": rho,
                        "seed": seed,
                        "method": method,
                        "seconds": seconds,
                        **extra,
                    }
                    rec.update(score(truth, pip, method == "lassocv"))
                    if method != "lassocv":
                        rec["bins"] = calibration_counts(pip, truth)
                    records.append(rec)
                    print(json.dumps({k: v for k, v in rec.items() if k != "bins"}), flush=True)
                    if args.json is not None:
                        with args.json.open("a") as f:
                            f.write(json.dumps(rec) + "\n")
    return records


def calibration_counts(pip, truth):
    """Per PIP bin: number of features and number truly included."""
    idx = np.digitize(pip, BINS) - 1
    return [[int((idx == b).sum()), int(truth[idx == b].sum())] for b in range(len(BINS) - 1)]


def _ms(values, digits=3):
    values = [v for v in values if v == v]
    if not values:
        return "-"
    if len(values) == 1:
        return f"{values[0]:.{digits}f}"
    return f"{statistics.mean(values):.{digits}f} ± {statistics.stdev(values):.{digits}f}"


def _setting(r):
    """The setting of a record (records of older runs lack family, design and n)."""
    return (r.get("family", "gaussian"), r.get("design", "ar1"), r.get("n", 0), r["p"], r["rho"])


def summary_tables(records, markdown):
    rows = []
    keys = sorted({(*_setting(r), r["method"]) for r in records}, key=lambda k: (*k[:5], METHODS.index(k[5])))
    for *setting, method in keys:
        family, design, n, p, rho = setting
        rs = [r for r in records if (*_setting(r), r["method"]) == (*setting, method)]
        khat = used = ""
        if method.startswith("l0bayes"):
            khat = f"{_ms([r['khat'] for r in rs], 2)} ({sum(r['khat'] <= 0.7 for r in rs)}/{len(rs)} pass)"
            counts = {}
            for r in rs:
                counts[r.get("used", "")] = counts.get(r.get("used", ""), 0) + 1
            used = ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))
            capped = sum(r.get("capped", 0) for r in rs)
            if capped:
                used += f"; {capped} capped"
        rows.append(
            [
                family,
                design,
                str(n),
                str(p),
                f"{rho:g}",
                method,
                str(len(rs)),
                _ms([r["auprc"] for r in rs]),
                f"{_ms([r['sel_true'] for r in rs], 1)} / {_ms([r['sel_false'] for r in rs], 1)}",
                _ms([r["true_among_high"] for r in rs]),
                _ms([r["seconds"] for r in rs], 1),
                khat,
                used,
            ]
        )
    header = ["family", "design", "n", "p", "rho", "method", "seeds", "AUPRC", "selected true / false"]
    header += ["true among PIP>0.9", "seconds", "k-hat", "method used"]
    out = [format_table(header, rows, markdown)]
    cal_rows = []
    for family in sorted({_setting(r)[0] for r in records}):
        for method in ("l0bayes", "susie", "millipede"):
            rs = [r for r in records if r["method"] == method and _setting(r)[0] == family]
            if not rs:
                continue
            counts = np.sum([r["bins"] for r in rs], axis=0)
            for b in range(len(BINS) - 1):
                num, true = counts[b]
                hi = "1.0]" if b == len(BINS) - 2 else f"{BINS[b + 1]:g})"
                frac = f"{true / num:.3f}" if num else "-"
                cal_rows.append([family, method, f"[{BINS[b]:g}, {hi}", str(num), str(true), frac])
    header = ["family", "method", "PIP bin", "features", "truly included", "fraction"]
    out.append(format_table(header, cal_rows, markdown))
    targets = target_table(records, markdown)
    if targets:
        out.append(targets)
    return "\n\n".join(out)


def target_table(records, markdown):
    """Per setting, paired by seed: l0bayes's AUPRC minus millipede's and SuSiE's, and the time ratio to millipede.

    The time ratio is over the runs where l0bayes's importance check failed (its answer then comes
    from the sampler, or the fit with ``method="variational"``).
    """
    rows = []
    for setting in sorted({_setting(r) for r in records}):
        by = {}
        for r in records:
            if _setting(r) == setting:
                by.setdefault(r["method"], {})[r["seed"]] = r
        ours = by.get("l0bayes", {})
        if not ours or "millipede" not in by:
            continue
        seeds = sorted(set(ours) & set(by["millipede"]))
        diff = [ours[s]["auprc"] - by["millipede"][s]["auprc"] for s in seeds]
        susie = by.get("susie", {})
        diff_susie = [ours[s]["auprc"] - susie[s]["auprc"] for s in seeds if s in susie]
        failed = [s for s in seeds if not ours[s]["khat"] <= 0.7]
        ratio = [ours[s]["seconds"] / by["millipede"][s]["seconds"] for s in failed]
        alone = by.get("l0bayes-fit", {})
        passed = [s for s in seeds if ours[s]["khat"] <= 0.7 and ours[s].get("used") == "reweighted" and s in alone]
        ratio_fit = [ours[s]["seconds"] / alone[s]["seconds"] for s in passed]
        family, design, n, p, rho = setting
        rows.append(
            [
                family,
                design,
                f"{n} x {p}",
                f"{rho:g}",
                str(len(seeds)),
                _ms(diff),
                f"{min(diff):+.3f}",
                _ms(diff_susie) if diff_susie else "-",
                f"{len(failed)}",
                _ms(ratio, 2) if ratio else "-",
                _ms(ratio_fit, 2) if ratio_fit else "-",
            ]
        )
    if not rows:
        return ""
    header = ["family", "design", "n x p", "rho", "seeds", "AUPRC - millipede", "worst seed", "AUPRC - SuSiE"]
    header += ["check failed", "seconds / millipede (check failed)", "seconds / fit alone (check passed, confirmed)"]
    return format_table(header, rows, markdown)


def diabetes(markdown):
    """select_variables and the plain mean-field fit against exact enumeration on the diabetes data."""
    from sklearn.datasets import load_diabetes

    import l0bayes
    from l0bayes.inference import train
    from l0bayes.models import SparseLinearRegression
    from l0bayes.selection import exact_inclusion_probabilities, gate_importance_check, ols_noise_scale

    data = load_diabetes()
    x = torch.tensor(data.data, dtype=torch.float32)
    x = (x - x.mean(0)) / x.std(0)
    y = torch.tensor(data.target, dtype=torch.float32)
    y = (y - y.mean()) / y.std()
    xn, yn = x.double().numpy(), y.double().numpy()
    sigma = ols_noise_scale(xn, yn)
    exact = exact_inclusion_probabilities(xn, yn, 0.5, 1.0, sigma).inclusion
    rows, errors = [], []
    for seed in range(3):
        start = time.perf_counter()
        res = l0bayes.select_variables(xn, yn, prior_inclusion=0.5, slab_scale=1.0, noise_scale=sigma, seed=seed)
        seconds = time.perf_counter() - start
        err = float(np.abs(res.inclusion_probabilities - exact).max())
        errors.append(err)
        rows.append([f"select_variables seed {seed}", f"{err:.3f}", f"{res.khat:.2f}", res.method, f"{seconds:.2f}"])
    for seed in range(3):  # the exact sampler on its own
        start = time.perf_counter()
        mc = l0bayes.select_variables(
            xn, yn, prior_inclusion=0.5, slab_scale=1.0, noise_scale=sigma, seed=seed, method="mcmc"
        )
        seconds = time.perf_counter() - start
        err = float(np.abs(mc.inclusion_probabilities - exact).max())
        where = f"{mc.method}, {'mixed' if mc.mixed else 'NOT mixed'}, max MCSE {mc.mcse.max():.3f}"
        rows.append(
            [f"select_variables(method='mcmc') seed {seed}", f"{err:.3f}", f"{mc.khat:.2f}", where, f"{seconds:.2f}"]
        )
    torch.manual_seed(0)
    model = SparseLinearRegression(10, noise_scale=sigma, prior_inclusion=0.5, slab="gaussian", prior_scale=1.0)
    train(model, x, y, objective="bayes", epochs=300, batch_size=x.shape[0], lr=0.05, seed=0, progress=False)
    mf = model.inclusion_probabilities().double().numpy()
    for seed in range(3):
        check = gate_importance_check(model, xn, yn, seed=seed)
        rows.append(
            [
                f"mean-field fit (notebook 02), check seed {seed}",
                f"{np.abs(mf - exact).max():.3f}",
                f"{check.khat:.2f}",
                "flagged" if not check.reliable else "passed",
                "-",
            ]
        )
    header = ["diabetes (p = 10)", "max abs error vs exact", "k-hat", "result", "seconds"]
    table = format_table(header, rows, markdown)
    names = list(data.feature_names)
    probs = format_table(
        ["", *names],
        [
            ["exact", *(f"{v:.3f}" for v in exact)],
            ["select_variables", *(f"{v:.3f}" for v in res.inclusion_probabilities)],
            ["select_variables, mcmc", *(f"{v:.3f}" for v in mc.inclusion_probabilities)],
            ["mean-field", *(f"{v:.3f}" for v in mf)],
        ],
        markdown,
    )
    return table + "\n\n" + probs


def machine_line(threads):
    """The run's first line: date, machine, torch, threads and command."""
    return (
        f"# {datetime.date.today()} {platform.node()} {platform.processor() or platform.machine()}, "
        f"torch {torch.__version__}, {threads} thread(s), cmd: {' '.join(sys.argv)}"
    )


def load_records(paths):
    """The records of earlier ``--json`` files (JSON lines), in order."""
    return [json.loads(line) for path in paths for line in Path(path).read_text().splitlines() if line.strip()]


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=1000)
    parser.add_argument("--p", type=int, nargs="+", default=[1000, 10000])
    parser.add_argument("--rho", type=float, nargs="+", default=[0.0, 0.5, 0.9, 0.95])
    parser.add_argument("--effects", type=int, default=20)
    parser.add_argument("--seeds", type=int, default=3, help="seeds 0 .. SEEDS - 1")
    parser.add_argument("--first-seed", type=int, default=0, help="start at this seed (to extend an earlier run)")
    parser.add_argument("--methods", nargs="+", choices=METHODS, default=list(METHODS))
    parser.add_argument("--design", choices=("ar1", "block", "wide"), default="ar1")
    parser.add_argument("--family", choices=("gaussian", "bernoulli"), default="gaussian")
    parser.add_argument("--wide-n", type=int, default=None, help="rows of the wide design (default p / 5)")
    parser.add_argument("--millipede-T", type=int, default=5000, help="millipede's samples after burn-in")
    parser.add_argument("--time-budget", type=float, default=None, help="select_variables' time_budget (default 15 s)")
    parser.add_argument(
        "--lasso-seeds", nargs="*", default=[], metavar="P=K", help="run LassoCV on only K seeds at p = P"
    )
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--diabetes", action="store_true")
    parser.add_argument("--no-grid", action="store_true")
    parser.add_argument("--json", type=Path, help="append the raw records here as JSON lines (must not exist)")
    parser.add_argument("--load", type=Path, nargs="*", default=[], help="also tabulate earlier --json files")
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args(argv)
    args.lasso_seeds = {int(k): int(v) for k, v in (s.split("=") for s in args.lasso_seeds)}
    return args


def main(argv=None):
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    if args.json is not None and args.json.exists():
        raise SystemExit(f"{args.json} exists; not overwriting it")
    print(machine_line(args.threads), flush=True)
    records = load_records(args.load)
    if not args.no_grid:
        records += run_grid(args)
    if records:
        print(summary_tables(records, args.markdown))
    if args.diabetes:
        print()
        print(diabetes(args.markdown))
    return records


if __name__ == "__main__":
    main()
