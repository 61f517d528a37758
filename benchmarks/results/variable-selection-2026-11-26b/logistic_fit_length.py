"""How long the logistic fit runs before the sampler: AUPRC and time of select_variables(family="bernoulli")
with the fit stopped by its own rule or after at most 800 or 600 steps (`max_steps`), back to back on the same
data. Run from the repository root: OMP_NUM_THREADS=1 python <this file> > logistic_fit_length.jsonl
(the records beside it were made when the default was the fit's own rule; pass max_steps=5000 for it now)."""

import json
import sys
import time
import warnings
from pathlib import Path

import torch
from sklearn.metrics import average_precision_score

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # benchmarks/
from bench_variable_selection import make_data  # noqa: E402

import l0bayes  # noqa: E402
from l0bayes.selection import api, bernoulli, mcmc  # noqa: E402

# (module that calls the stage, its name there, the record's key); the sampler is called from two modules
STAGES = [
    (bernoulli, "_logistic_fit", "_logistic_fit"),
    (bernoulli, "_logistic_check", "_logistic_check"),
    (api, "refine", "_refine"),
    (mcmc, "refine", "_refine"),
]


def timed(seconds):
    """Wrap the stages of select_variables so that their wall time adds up in ``seconds``."""
    for module, name, key in STAGES:
        original = getattr(module, name)

        def wrapper(*args, _original=original, _key=key, **kwargs):
            start = time.perf_counter()
            out = _original(*args, **kwargs)
            seconds[_key] = seconds.get(_key, 0.0) + time.perf_counter() - start
            return out

        setattr(module, name, wrapper)


def main():
    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    x, y, _ = make_data(200, 30, 0.5, 3, 0, "ar1", "bernoulli")
    l0bayes.select_variables(x, y, family="bernoulli")  # warm-up: imports are not timed
    seconds = {}
    timed(seconds)
    variants = [("default", {"max_steps": 5000}), ("steps800", {"max_steps": 800}), ("steps600", {"max_steps": 600})]
    for rho in (0.95, 0.99):
        for seed in range(5):
            x, y, truth = make_data(600, 500, rho, 10, seed, "ar1", "bernoulli")
            for name, options in variants:
                seconds.clear()
                start = time.perf_counter()
                result = l0bayes.select_variables(x, y, family="bernoulli", **options)
                total = time.perf_counter() - start
                pip = result.inclusion_probabilities
                high = pip > 0.9
                record = {
                    "rho": rho,
                    "seed": seed,
                    "name": name,
                    "seconds": round(total, 2),
                    **{k: round(v, 2) for k, v in seconds.items()},
                    "auprc": round(average_precision_score(truth, pip), 4),
                    "high": int(high.sum()),
                    "true_high": int((high & truth).sum()),
                    "capped": int(result.capped.size),
                    "khat": round(result.khat, 2),
                    "fit_steps": result.details.get("steps"),
                    "stopped": result.details.get("stopped"),
                }
                print(json.dumps(record), flush=True)


if __name__ == "__main__":
    main()
