"""Training steps per second of the Fashion-MNIST MLP for several thread settings, idle and beside a busy process.

The workload is the step of ``l0bayes fit --data fashion-mnist`` (the default model there): the L0
MLP 784-300-100-10 in :class:`~l0bayes.models.SparseClassifier`, penalised objective (Eq. 22),
lambda = 0.1/N, minibatches of 100 drawn from 60,000 standardised inputs, fused Adam (lr 1e-3).
Random inputs of that shape stand in for the images: the cost of a step does not depend on the pixel
values, and every worker then starts in a second.

Settings (each in a fresh worker process, since an OpenMP wait policy is read when the OpenMP runtime
loads):

* ``threads=1``, ``threads=2``: ``torch.set_num_threads``;
* ``threads=2, OMP_WAIT_POLICY=PASSIVE``: waiting OpenMP threads sleep instead of spinning;
* ``default``: what ``l0bayes fit`` chooses now (:func:`l0bayes.cli.threads.default_threads`,
  evaluated in the worker when it starts).

Conditions: ``idle`` (whatever else the machine runs; the load is printed) and ``busy``: one
pure-Python busy loop that this script starts before and stops after each worker. Settings and
conditions are interleaved: every repeat runs each condition, and within it every setting in a
rotated order. A worker warms up for ``--warmup`` steps, then counts steps for ``--seconds`` of
wall time. The table gives the median steps/s over repeats and each setting's slowdown against the
best setting of the same condition.

Example::

    python benchmarks/bench_threads.py --repeats 3 --seconds 4 --markdown
"""

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import time

from tables import format_table

SETTINGS = {
    "threads=1": ({"threads": 1}, {}),
    "threads=2": ({"threads": 2}, {}),
    "threads=2, OMP_WAIT_POLICY=PASSIVE": ({"threads": 2}, {"OMP_WAIT_POLICY": "PASSIVE"}),
    "default (l0bayes fit)": ({"threads": "default"}, {}),
}
NUM_DATA = 60000
BATCH_SIZE = 100


def worker(threads, seconds, warmup):
    """Time steps of the penalised L0 MLP; prints one JSON line ``{"threads": n, "steps_per_s": ...}``."""
    import torch

    from l0bayes.cli.threads import default_threads
    from l0bayes.models import SparseClassifier
    from l0bayes.nn import L0MLP

    n = default_threads(torch.get_num_threads()) if threads == "default" else int(threads)
    torch.set_num_threads(n)
    torch.manual_seed(0)
    x = torch.randn(NUM_DATA, 784)
    y = torch.randint(0, 10, (NUM_DATA,))
    model = SparseClassifier(L0MLP(784, (300, 100), 10), lam=0.1)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3, fused=True)
    order = torch.randperm(NUM_DATA)

    def step(k):
        index = order[(k * BATCH_SIZE) % NUM_DATA :][:BATCH_SIZE]
        nll, code_cost = model.penalized_loss(x[index], y[index], NUM_DATA)
        loss = (nll + code_cost) / NUM_DATA
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    for k in range(warmup):
        step(k)
    k, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        step(k)
        k += 1
    rate = k / (time.perf_counter() - start)
    print(json.dumps({"threads": n, "steps_per_s": rate}), flush=True)


def run_worker(name, seconds, warmup):
    options, env = SETTINGS[name]
    command = [sys.executable, __file__, "--worker", str(options["threads"]), "--seconds", str(seconds)]
    command += ["--warmup", str(warmup)]
    environ = {**os.environ, **env}
    environ.pop("OMP_NUM_THREADS", None)  # the worker sets its own count
    proc = subprocess.run(command, capture_output=True, text=True, env=environ, check=True)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def busy_process():
    """One CPU-bound process (a pure-Python loop): the competing job of the ``busy`` condition."""
    return subprocess.Popen([sys.executable, "-c", "while True: pass"])


def measure(repeats, seconds, warmup, settings):
    rates = {(c, s): [] for c in ("idle", "busy") for s in settings}
    chosen = {c: [] for c in ("idle", "busy")}
    loads = []
    for r in range(repeats):
        order = settings[r % len(settings) :] + settings[: r % len(settings)]
        for condition in ("idle", "busy") if r % 2 == 0 else ("busy", "idle"):
            loads.append(os.getloadavg()[0])
            for name in order:
                competitor = busy_process() if condition == "busy" else None
                try:
                    if competitor is not None:
                        time.sleep(0.5)  # let it reach the run queue
                    result = run_worker(name, seconds, warmup)
                finally:
                    if competitor is not None:
                        competitor.terminate()
                        competitor.wait()
                rates[condition, name].append(result["steps_per_s"])
                if name.startswith("default"):
                    chosen[condition].append(result["threads"])
                print(f"repeat {r + 1} {condition:4s} {name:36s} {result['steps_per_s']:7.1f} steps/s", flush=True)
    return rates, chosen, loads


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=4.0, help="timed wall seconds per worker")
    parser.add_argument("--warmup", type=int, default=20, help="untimed steps per worker")
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args()
    if args.worker is not None:
        worker(args.worker, args.seconds, args.warmup)
        return
    settings = list(SETTINGS)
    uptime = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    print(f"{datetime.date.today()}, {os.cpu_count()} CPUs, before: {uptime}", flush=True)
    rates, chosen, loads = measure(args.repeats, args.seconds, args.warmup, settings)
    rows = []
    for condition in ("idle", "busy"):
        medians = {s: statistics.median(rates[condition, s]) for s in settings}
        best = max(medians.values())
        for s in settings:
            threads = f" ({'/'.join(map(str, chosen[condition]))} threads)" if s.startswith("default") else ""
            per_epoch = NUM_DATA / BATCH_SIZE / medians[s]
            rows.append([condition, s + threads, f"{medians[s]:.1f}", f"{per_epoch:.2f}", f"{best / medians[s]:.2f}x"])
    header = ["condition", "setting", "steps/s (median)", "s per 600 steps", "slower than best"]
    print(format_table(header, rows, markdown=args.markdown))
    after = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    print(f"load average (1 min) at the start of each condition: {', '.join(f'{v:.2f}' for v in loads)}")
    print(f"after: {after}")


if __name__ == "__main__":
    main()
