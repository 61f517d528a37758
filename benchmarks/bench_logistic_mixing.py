"""Logistic variable selection on scikit-learn's breast-cancer data: does the sampler mix, and how does millipede do?

The data: n = 569 tumours, p = 30 strongly correlated features (radius, perimeter and area correlate above 0.99),
y = benign. Methods, each run once per seed, back to back in one process in an order that rotates with the seed:

* ``l0bayes``: ``select_variables(X, y, family="bernoulli", seed=s)`` with every default (the logistic fit, its
  importance check, then weighted tempered Gibbs sampling of the Pólya-Gamma augmented posterior: 4 chains x 1,250
  steps after 500 of warm-up, 5,000 weighted draws);
* ``l0bayes-mcmc``: ``select_variables(..., method="mcmc", time_budget=--mcmc-budget)``: the sampler until every
  probability of at least 0.01 has R-hat <= 1.01 and ESS >= 100 (checked every 1,000 steps);
* ``millipede``: millipede-regression 0.1.7's ``BernoulliLikelihoodVariableSelector`` (Pólya-Gamma tempered Gibbs
  with a Metropolis-Hastings correction of its Pólya-Gamma moves, one chain) on the same standardised X with the
  same model: S = prior_inclusion x p of l0bayes's result, tau = 1 / slab_scale^2, tau_intercept = 1 / 10^2 (the
  intercept sd of l0bayes), T = 5000 after 1000 burn-in steps (as many weighted draws as l0bayes's default).

Recorded per run: wall time, the inclusion probabilities, the largest R-hat and the smallest ESS over the
probabilities of at least 0.01 (l0bayes: its own; millipede: the same rank-normalised split R-hat and ESS of its
one chain's weighted Rao-Blackwellised draws, its two halves as two chains, computed as l0bayes computes
them from 256 block sums), whether the
chains mixed (R-hat <= 1.01 and ESS >= 100), l0bayes's steps and its estimate of the steps that would mix, and
the number of credible sets. The summary gives mean ± sd over seeds, the largest |PIP difference| between seeds
of each method, between the methods seed by seed, and against ``--reference`` (PIPs of a mixed run) when given.

Install millipede without its polyagamma pin (it works with the polyagamma 2 of l0bayes)::

    pip install --no-deps millipede-regression==0.1.7 && pip install pandas tqdm

Example::

    OMP_NUM_THREADS=1 python benchmarks/bench_logistic_mixing.py --seeds 0 1 2 --json records.jsonl
    OMP_NUM_THREADS=1 python benchmarks/bench_logistic_mixing.py --methods l0bayes-mcmc --mcmc-budget 1200 \
        --seeds 0 1 2 --json mcmc.jsonl
    python benchmarks/bench_logistic_mixing.py --load records.jsonl mcmc.jsonl   # the tables
"""

import argparse
import datetime
import itertools
import json
import platform
import statistics
import time
import warnings

import numpy as np
import torch

RELEVANT = 0.01


def data():
    from sklearn.datasets import load_breast_cancer

    bunch = load_breast_cancer()
    return bunch.data, bunch.target.astype(float), list(bunch.feature_names)


def standardised(x):
    return (x - x.mean(0)) / x.std(0, ddof=1)


def run_l0bayes(x, y, seed, method, budget):
    import l0bayes

    began = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        kwargs = {"method": "mcmc", "time_budget": budget} if method == "l0bayes-mcmc" else {}
        res = l0bayes.select_variables(x, y, family="bernoulli", seed=seed, **kwargs)
    wall = time.perf_counter() - began
    run = res.sampler
    out = {
        "wall": wall,
        "pip": res.inclusion_probabilities.tolist(),
        "khat": res.khat,
        "result_method": res.method,
        "prior_inclusion": res.prior_inclusion,
        "slab_scale": res.slab_scale,
        "credible_sets": [s.tolist() for s in res.credible_sets],
        "diagnostic": res.diagnostic,
    }
    if run is not None:
        matters = run.inclusion >= RELEVANT
        out.update(
            max_rhat=float(np.nanmax(run.rhat[matters])),
            min_ess=float(np.min(run.ess[matters])),
            mixed=bool(run.mixed),
            steps=run.num_steps,
            sampler_seconds=run.seconds,
            steps_to_mix=run.steps_to_mix(),
            omega_fraction=run.details["omega_fraction"],
            stopped=run.details["stopped"],
            rhat=np.nan_to_num(run.rhat, nan=-1.0).tolist(),
            ess=np.nan_to_num(run.ess, posinf=-1.0).tolist(),
        )
    return out


def block_sums(weights, values, blocks=256):
    """``(1, B)`` and ``(1, B, p)`` sums of ``weights`` and ``weights * values`` over consecutive blocks."""
    edges = np.linspace(0, len(weights), blocks + 1).astype(int)
    bw = np.add.reduceat(weights, edges[:-1])
    bh = np.add.reduceat(weights[:, None] * values, edges[:-1], axis=0)
    return bw[None], bh[None]


def run_millipede(x, y, seed, prior_inclusion, slab_scale, steps):
    import pandas as pd
    from millipede import BernoulliLikelihoodVariableSelector

    from l0bayes.selection.sampler.diagnostics import ESS_MIN, RHAT_MAX, block_diagnostics

    p = x.shape[1]
    frame = pd.DataFrame(standardised(x), columns=[f"x{j}" for j in range(p)])
    frame["y"] = y
    began = time.perf_counter()
    selector = BernoulliLikelihoodVariableSelector(
        frame, "y", S=prior_inclusion * p, tau=1.0 / slab_scale**2, tau_intercept=1.0 / 10.0**2, precision="double"
    )
    selector.run(T=steps, T_burnin=1000, verbosity=None, streaming=False, seed=seed)
    wall = time.perf_counter() - began
    samples = selector.container.samples
    weights, values = np.asarray(samples.weight, dtype=np.float64), np.asarray(samples.pip, dtype=np.float64)
    pip = selector.pip.to_numpy()
    bw, bh = block_sums(weights, values)
    # its one chain's two halves as two chains (R-hat needs two; each is split again, as l0bayes's four are)
    rhat, _, ess = block_diagnostics(bh.reshape(2, -1, p), bw.reshape(2, -1), pip, RELEVANT / 10)
    matters = pip >= RELEVANT
    return {
        "wall": wall,
        "pip": pip.tolist(),
        "max_rhat": float(np.nanmax(rhat[matters])),
        "min_ess": float(np.min(ess[matters])),
        "mixed": bool(((rhat[matters] <= RHAT_MAX) & (ess[matters] >= ESS_MIN)).all()),
        "steps": steps,
        "rhat": np.nan_to_num(rhat, nan=-1.0).tolist(),
        "ess": np.nan_to_num(ess, posinf=-1.0).tolist(),
        "block_weights": bw[0].tolist(),
        "block_pips": bh[0].tolist(),
        "stats": {k: str(v) for k, v in selector.stats.items()},
    }


def grid(args):
    x, y, _ = data()
    methods = args.methods
    records = []
    # a warm-up call of each (imports, first-call costs), not recorded
    if "millipede" in methods:
        run_millipede(x, y, 0, 0.2, 1.0, 200)
    for seed in args.seeds:
        shift = seed % len(methods)
        for method in methods[shift:] + methods[:shift]:
            if method == "millipede":
                prior = args.prior_inclusion
                if prior is None:  # l0bayes's empirical-Bayes prior (the same for every seed: a deterministic fit)
                    prior = next((r["prior_inclusion"] for r in records if r["method"].startswith("l0bayes")), None)
                    prior = prior if prior is not None else run_l0bayes(x, y, seed, "l0bayes", 1.0)["prior_inclusion"]
                out = run_millipede(x, y, seed, prior, 1.0, args.millipede_T)
            else:
                out = run_l0bayes(x, y, seed, method, args.mcmc_budget)
            record = {
                "method": method,
                "seed": seed,
                "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                "machine": platform.processor() or platform.machine(),
                "torch": torch.__version__,
                "threads": torch.get_num_threads(),
                **out,
            }
            records.append(record)
            rhat, ess = record.get("max_rhat", float("nan")), record.get("min_ess", float("nan"))
            print(
                f"{method:13s} seed {seed}: {record['wall']:.1f} s, max R-hat {rhat:.3f}, min ESS {ess:.0f}, "
                f"mixed {record.get('mixed')}",
                flush=True,
            )
            if args.json:
                with open(args.json, "a") as f:
                    f.write(json.dumps(record) + "\n")
    return records


def mean_sd(values, fmt="{:.2f}"):
    values = [float(v) for v in values if v is not None]
    if not values:
        return "-"
    sd = float(np.std(values, ddof=1)) if len(values) > 1 else 0.0
    return f"{fmt.format(float(np.mean(values)))} ± {fmt.format(sd)}"


def table(records, reference=None):
    by_method = {}
    for r in records:
        by_method.setdefault(r["method"], []).append(r)
    lines = [
        "| method | seeds | wall s | max R-hat | min ESS | mixed | steps per chain | steps to mix (estimate) "
        "| max abs PIP diff between seeds | vs reference |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for method, rs in by_method.items():
        pips = [np.asarray(r["pip"]) for r in rs]
        between = max((np.abs(a - b).max() for a, b in itertools.combinations(pips, 2)), default=float("nan"))
        ref = "-" if reference is None else mean_sd([float(np.abs(p - reference).max()) for p in pips], "{:.3f}")
        lines.append(
            f"| {method} | {len(rs)} | {mean_sd([r['wall'] for r in rs], '{:.1f}')} "
            f"| {mean_sd([r.get('max_rhat') for r in rs], '{:.3f}')} "
            f"| {mean_sd([r.get('min_ess') for r in rs], '{:.0f}')} "
            f"| {sum(bool(r.get('mixed')) for r in rs)}/{len(rs)} | {mean_sd([r.get('steps') for r in rs], '{:.0f}')} "
            f"| {mean_sd([r.get('steps_to_mix') for r in rs], '{:.0f}')} | {between:.3f} | {ref} |"
        )
    # the methods seed by seed
    methods = list(by_method)
    for a, b in itertools.combinations(methods, 2):
        gaps = []
        for ra in by_method[a]:
            for rb in by_method[b]:
                if ra["seed"] == rb["seed"]:
                    gaps.append(float(np.abs(np.asarray(ra["pip"]) - np.asarray(rb["pip"])).max()))
        if gaps:
            lines.append(
                f"\nmax abs PIP difference {a} vs {b}, same seed: {mean_sd(gaps, '{:.3f}')} ({len(gaps)} seeds)"
            )
        ta = [r["wall"] for r in by_method[a]]
        tb = [r["wall"] for r in by_method[b]]
        lines.append(f"wall-time ratio {b} / {a}: {statistics.mean(tb) / statistics.mean(ta):.2f}")
    if "millipede" in by_method and len(by_method["millipede"]) > 1:  # its seeds as chains of one run
        from l0bayes.selection.sampler.diagnostics import block_diagnostics

        rs = by_method["millipede"]
        bw = np.stack([np.asarray(r["block_weights"]) for r in rs])
        bh = np.stack([np.asarray(r["block_pips"]) for r in rs])
        pip = (bh.sum((0, 1)) / bw.sum()).clip(0, 1)
        rhat, _, ess = block_diagnostics(bh, bw, pip, RELEVANT / 10)
        matters = pip >= RELEVANT
        lines.append(
            f"millipede's {len(rs)} seeds as chains: max R-hat {np.nanmax(rhat[matters]):.3f}, "
            f"min ESS {np.min(ess[matters]):.0f}"
        )
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--methods", nargs="+", default=["l0bayes", "millipede"])
    parser.add_argument("--mcmc-budget", type=float, default=1200.0, help="time_budget of l0bayes-mcmc (seconds)")
    parser.add_argument("--millipede-T", type=int, default=5000)
    parser.add_argument("--prior-inclusion", type=float, default=None, help="millipede's S / p (default l0bayes's)")
    parser.add_argument("--json", help="append one JSON record per run to this file")
    parser.add_argument("--load", nargs="+", help="print the tables of these JSONL files instead of running")
    parser.add_argument("--reference", help="a JSON list of reference PIPs, or 'mcmc': the l0bayes-mcmc runs' mean")
    args = parser.parse_args()
    if args.load:
        records = [json.loads(line) for path in args.load for line in open(path) if line.strip()]
    else:
        records = grid(args)
    reference = None
    if args.reference == "mcmc":
        mixed = [np.asarray(r["pip"]) for r in records if r["method"] == "l0bayes-mcmc" and r.get("mixed")]
        reference = np.mean(mixed, axis=0) if mixed else None
    elif args.reference:
        reference = np.asarray(json.loads(open(args.reference).read()))
    print(table(records, reference))


if __name__ == "__main__":
    main()
