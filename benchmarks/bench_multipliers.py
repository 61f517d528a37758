"""The constrained objective's multiplier step: projected ascent against Adam ascent, with and without a gate group.

Results: ``benchmarks/RESULTS.md``, "Constrained sparsity" (the multiplier step).

The digits MLP 64-100-50 of ``experiments/constrained.py`` (1,258 training / 359 test images, 100 epochs, Adam
1e-2 on the weights, batch 100, the default ``final_phase=0.3``) trained to ``Constrained(target_density=0.1)``
with each multiplier step:

* ``projected``: ``multiplier_optimizer=None``, projected gradient ascent at ``multiplier_lr`` = 3 x the gates'
  step size (the default);
* ``adam <lr>``: ``multiplier_optimizer=lambda p: torch.optim.Adam(p, lr=lr, betas=(0.9, 0.95), maximize=True)``;

and each optimiser of the model: train()'s default (the gates at the weights' step size), or the gates' ``log_alpha``
in a group of their own at ``--gate-factors`` times the weights' step size with betas (0.9, 0.95)
(:func:`~l0bayes.inference.parameter_groups`, Sheared-LLaMA's mask optimiser). Per run: the pruned network's test
error (the last record's, with the Eq. 13 gates), its density, the first step at which the expected density is
within ``--within`` of the target (before the final phase fixes the gates; ``None`` when it never is), the
smallest expected density before the gates are fixed (how far the Lagrangian overshoots) and the largest
multiplier. One thread per run; each finished run is appended to ``--out`` (a JSON-lines file), and a run already
there is skipped, so the script continues where it stopped. ``--summarize-only`` prints the table (mean ± sd over
the seeds).

    python benchmarks/bench_multipliers.py --seeds 0 1 2 --out runs/multipliers.jsonl
    python benchmarks/bench_multipliers.py --out runs/multipliers.jsonl --summarize-only
"""

import argparse
import json
import os
import statistics
import time

import torch

from l0bayes.data import load_dataset
from l0bayes.inference import Callback, Constrained, parameter_groups, train
from l0bayes.models import SparseClassifier
from l0bayes.nn import L0MLP

TARGET, LR, EPOCHS, BATCH = 0.1, 1e-2, 100, 100
GATE_BETAS = (0.9, 0.95)


class Arrival(Callback):
    """The first step at which the expected density is at most ``target + within`` while the gates are not fixed,
    the smallest expected density and the largest multiplier until then."""

    def __init__(self, target, within):
        self.target, self.within = target, within
        self.step, self.lowest, self.largest_mu = None, float("inf"), 0.0

    def on_step_end(self, run):
        objective = run.objective
        if objective.fixed is not None:
            return
        with torch.no_grad():
            density = float(objective.expected().max())
        self.lowest = min(self.lowest, density)
        self.largest_mu = max(self.largest_mu, float(objective.mu.max()))
        if self.step is None and density <= self.target + self.within:
            self.step = run.global_step


def multiplier_factory(name):
    """``None`` for ``"projected"``; for ``"adam <lr>"`` the factory of Adam ascent at that step size."""
    if name == "projected":
        return None
    lr = float(name.split()[1])
    return lambda p: torch.optim.Adam(p, lr=lr, betas=GATE_BETAS, maximize=True)


def model_optimizer(gate_factor):
    """``None`` (train()'s default) for factor 1; else Adam with the gates in their own group."""
    if gate_factor == 1:
        return None
    gates = {"lr": gate_factor * LR, "betas": GATE_BETAS}
    return lambda m: torch.optim.Adam(parameter_groups(m, gates=gates), lr=LR)


def run_one(data, seed, multiplier, gate_factor, within):
    torch.manual_seed(seed)
    net = L0MLP(in_features=data.num_features, hidden=(100, 50), num_classes=data.num_classes)
    arrival = Arrival(TARGET, within)
    start = time.perf_counter()
    result = train(
        SparseClassifier(net, lam=0.1),
        data.x_train,
        data.y_train,
        objective=Constrained(target_density=TARGET, multiplier_optimizer=multiplier_factory(multiplier)),
        optimizer=model_optimizer(gate_factor),
        epochs=EPOCHS,
        batch_size=BATCH,
        lr=LR,
        seed=seed,
        test_data=(data.x_test, data.y_test),
        record_every=EPOCHS,
        callbacks=[arrival],
        progress=False,
        threads=1,
    )
    last = result.history[-1]
    return {
        "seed": seed,
        "multiplier": multiplier,
        "gate_factor": gate_factor,
        "test_error": last["test_error"],
        "test_time_density": last["test_time_density"],
        "arrival_step": arrival.step,
        "lowest_expected_density": arrival.lowest,
        "largest_multiplier": arrival.largest_mu,
        "density_at_final_phase": last["density_at_final_phase"],
        "steps": EPOCHS * -(-len(data.x_train) // BATCH),
        "wall_s": time.perf_counter() - start,
        "torch": torch.__version__,
    }


def _mean_sd(values, fmt):
    if not values:
        return "-"
    if len(values) == 1:
        return fmt.format(values[0])
    return f"{fmt.format(statistics.mean(values))} ± {fmt.format(statistics.stdev(values))}"


def summarize(rows, multipliers, gate_factors):
    print(
        "| multiplier step | gates' step | test error % | params (Eq. 13) | steps to within 0.02 | arrived | "
        "lowest expected density | largest multiplier |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for factor in gate_factors:
        for multiplier in multipliers:
            runs = [r for r in rows if r["multiplier"] == multiplier and r["gate_factor"] == factor]
            if not runs:
                continue
            arrived = [r["arrival_step"] for r in runs if r["arrival_step"] is not None]
            gates = "weights' (1e-2)" if factor == 1 else f"{factor:g}x ({factor * LR:g})"
            name = "projected, 3x gates' lr" if multiplier == "projected" else f"Adam {multiplier.split()[1]}"
            print(
                f"| {name} | {gates} | {_mean_sd([100 * r['test_error'] for r in runs], '{:.2f}')} | "
                f"{_mean_sd([r['test_time_density'] for r in runs], '{:.3f}')} | {_mean_sd(arrived, '{:.0f}')} | "
                f"{len(arrived)}/{len(runs)} | {_mean_sd([r['lowest_expected_density'] for r in runs], '{:.3f}')} | "
                f"{_mean_sd([r['largest_multiplier'] for r in runs], '{:.3g}')} |"
            )


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--multipliers", nargs="+", default=["projected", "adam 0.01", "adam 0.1", "adam 1.0"])
    parser.add_argument("--gate-factors", type=float, nargs="+", default=[1, 10, 100])
    parser.add_argument("--within", type=float, default=0.02)
    parser.add_argument("--out", default="runs/multipliers.jsonl")
    parser.add_argument("--summarize-only", action="store_true")
    args = parser.parse_args(argv)
    rows = []
    if os.path.exists(args.out):
        with open(args.out) as f:
            rows = [json.loads(line) for line in f if line.strip()]
    if not args.summarize_only:
        torch.set_num_threads(1)
        data = load_dataset("digits", seed=0)
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        done = {(r["seed"], r["multiplier"], r["gate_factor"]) for r in rows}
        for factor in args.gate_factors:
            for multiplier in args.multipliers:
                for seed in args.seeds:
                    if (seed, multiplier, factor) in done:
                        continue
                    row = run_one(data, seed, multiplier, factor, args.within)
                    rows.append(row)
                    with open(args.out, "a") as f:
                        f.write(json.dumps(row) + "\n")
                    print(
                        f"{multiplier}, gates x{factor:g}, seed {seed}: error {100 * row['test_error']:.2f}%, "
                        f"density {row['test_time_density']:.3f}, arrived at step {row['arrival_step']}, "
                        f"lowest {row['lowest_expected_density']:.3f}, {row['wall_s']:.0f} s",
                        flush=True,
                    )
    summarize(rows, args.multipliers, args.gate_factors)


if __name__ == "__main__":
    main()
