"""Our Lagrangian step against Cooper's (``cooper-optim``), on the digits MLP with a model-wise target.

Results: ``benchmarks/RESULTS.md``, "Constrained sparsity" (Cooper).

Both run phase 1 of the constrained objective, the same problem and the same updates: Adam on the model
for :math:`\\frac1N \\text{nll} + \\mu (d - \\epsilon)` and projected gradient ascent
:math:`\\mu \\leftarrow \\max(0, \\mu + \\eta (d - \\epsilon))` (Cooper: ``SimultaneousOptimizer``, a
``Lagrangian`` inequality constraint with a ``DenseMultiplier`` and ``torch.optim.SGD(maximize=True)``
as dual optimiser). Dual restarts are off, since Cooper's multipliers have none. Same seed, same minibatches,
same gate draws: the script reports the largest difference between the two multiplier trajectories and the
expected densities, and the seconds per step of each, interleaved in one process (medians).

    python benchmarks/bench_cooper.py --steps 300 --repeats 3
"""

import argparse
import statistics
import time

import cooper
import torch

from l0bayes.data import load_dataset
from l0bayes.models import SparseClassifier
from l0bayes.nn import L0MLP
from l0bayes.pruning import expected_density

TARGET, MULTIPLIER_LR, LR = 0.3, 0.03, 1e-2


def setup(data):
    torch.manual_seed(0)
    net = L0MLP(in_features=data.num_features, hidden=(100, 50), num_classes=data.num_classes)
    return SparseClassifier(net)


def batches(n, steps, batch_size=100):
    g = torch.Generator().manual_seed(1)
    order = torch.cat([torch.randperm(n, generator=g) for _ in range(steps * batch_size // n + 1)])
    return [order[i * batch_size : (i + 1) * batch_size] for i in range(steps)]


def ours(data, steps):
    model = setup(data)
    n = data.x_train.shape[0]
    optimizer = torch.optim.Adam(model.parameters(), lr=LR)
    mu = torch.zeros(1)
    trace = []
    torch.manual_seed(2)
    start = time.perf_counter()
    for idx in batches(n, steps):
        optimizer.zero_grad()
        nll, _ = model.penalized_loss(data.x_train[idx], data.y_train[idx], n)
        violation = expected_density(model.net) - TARGET
        (nll / n + (mu * violation).sum()).backward()
        optimizer.step()
        with torch.no_grad():
            mu = (mu + MULTIPLIER_LR * violation.detach()).clamp_(min=0.0)
        trace.append((float(mu[0]), float(violation.detach()[0]) + TARGET))
    return (time.perf_counter() - start) / steps, trace


class DensityProblem(cooper.ConstrainedMinimizationProblem):
    def __init__(self, model, num_data):
        super().__init__()
        self.model, self.num_data = model, num_data
        multiplier = cooper.multipliers.DenseMultiplier(num_constraints=1)
        self.density = cooper.Constraint(
            constraint_type=cooper.ConstraintType.INEQUALITY,
            formulation_type=cooper.formulations.Lagrangian,
            multiplier=multiplier,
        )

    def compute_cmp_state(self, x, y):
        nll, _ = self.model.penalized_loss(x, y, self.num_data)
        violation = expected_density(self.model.net) - TARGET
        state = cooper.ConstraintState(violation=violation)
        return cooper.CMPState(loss=nll / self.num_data, observed_constraints={self.density: state})


def with_cooper(data, steps):
    model = setup(data)
    n = data.x_train.shape[0]
    problem = DensityProblem(model, n)
    primal = torch.optim.Adam(model.parameters(), lr=LR)
    dual = torch.optim.SGD(problem.dual_parameters(), lr=MULTIPLIER_LR, maximize=True)
    optimizer = cooper.optim.SimultaneousOptimizer(cmp=problem, primal_optimizers=primal, dual_optimizers=dual)
    trace = []
    torch.manual_seed(2)
    start = time.perf_counter()
    for idx in batches(n, steps):
        rollout = optimizer.roll(compute_cmp_state_kwargs={"x": data.x_train[idx], "y": data.y_train[idx]})
        violation = rollout.cmp_state.observed_constraints[problem.density].violation
        trace.append((float(problem.density.multiplier.weight.detach()[0]), float(violation.detach()[0]) + TARGET))
    return (time.perf_counter() - start) / steps, trace


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    data = load_dataset("digits", seed=0)
    times = {"ours": [], "cooper": []}
    for _ in range(args.repeats):
        t_ours, trace_ours = ours(data, args.steps)
        t_cooper, trace_cooper = with_cooper(data, args.steps)
        times["ours"].append(t_ours)
        times["cooper"].append(t_cooper)
    mu_diff = max(abs(a[0] - b[0]) for a, b in zip(trace_ours, trace_cooper, strict=True))
    d_diff = max(abs(a[1] - b[1]) for a, b in zip(trace_ours, trace_cooper, strict=True))
    ours_s, cooper_s = statistics.median(times["ours"]), statistics.median(times["cooper"])
    print(f"steps {args.steps}, final mu ours {trace_ours[-1][0]:.5f} cooper {trace_cooper[-1][0]:.5f}")
    print(f"max |mu ours - mu cooper| {mu_diff:.3g}, max |density ours - density cooper| {d_diff:.3g}")
    print(
        f"s/step ours {1e3 * ours_s:.3f} ms, cooper {1e3 * cooper_s:.3f} ms, ratio cooper/ours {cooper_s / ours_s:.3f}"
    )


if __name__ == "__main__":
    main()
