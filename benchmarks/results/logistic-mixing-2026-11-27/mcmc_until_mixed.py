import sys
import time
import warnings

import numpy as np
from sklearn.datasets import load_breast_cancer

import l0bayes

warnings.simplefilter("ignore")
X, y = load_breast_cancer(return_X_y=True)
seed = int(sys.argv[1])
t = time.perf_counter()
r = l0bayes.select_variables(X, y, family="bernoulli", method="mcmc", time_budget=float(sys.argv[2]), seed=seed)
rel = r.inclusion_probabilities >= 0.01
print(
    seed,
    f"wall {time.perf_counter() - t:.1f}",
    r.sampler.num_steps,
    r.details["stopped"],
    f"rhat {np.nanmax(r.rhat):.4f} minESS {r.ess[rel].min():.0f}",
    r.mixed,
)
np.save(f"/tmp/h3/long_pip{seed}.npy", r.inclusion_probabilities)
