"""Training steps per second of the Fashion-MNIST MLP for several thread settings, idle and beside a busy process.

The workload is the step of ``l0bayes fit --data fashion-mnist`` (the default model there): the L0
MLP 784-300-100-10 in :class:`~l0bayes.models.SparseClassifier`, penalised objective (Eq. 22),
lambda = 0.1/N, minibatches of 100 drawn from 60,000 standardised inputs, fused Adam (lr 1e-3).
Random inputs of that shape stand in for the images: the cost of a step does not depend on the pixel
values, and every worker then starts in a second.

One worker process per OpenMP wait policy (a policy is read when the OpenMP runtime loads with
torch): the default (spinning), ``OMP_WAIT_POLICY=PASSIVE`` (waiting threads sleep) and
``GOMP_SPINCOUNT=10000`` (a short spin, then sleep). Inside a worker, blocks of ``--block`` steps
alternate between ``torch.set_num_threads(1)`` and ``(2)`` for ``--seconds``; the speed of two
threads against one is the median over adjacent block pairs, measured side by side in one process.
``l0bayes fit``'s default is torch's thread count (2 here) with ``OMP_WAIT_POLICY=PASSIVE``
(:mod:`l0bayes.cli.threads`).

Conditions: ``idle`` (whatever else the machine runs; the load average is printed) and ``busy``:
one pure-Python busy loop that this script starts before and stops after each worker. Conditions
and policies alternate in order from repeat to repeat. The table gives median steps/s, the
in-process speed relative to one thread, and each setting's slowdown against the best setting of
the same condition.

Example::

    python benchmarks/bench_threads.py --repeats 3 --seconds 12 --markdown --save threads.json
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

POLICIES = {
    "default wait policy": {},
    "OMP_WAIT_POLICY=PASSIVE": {"OMP_WAIT_POLICY": "PASSIVE"},
    "GOMP_SPINCOUNT=10000": {"GOMP_SPINCOUNT": "10000"},
}
THREADS = (1, 2)
CLI_DEFAULT = "OMP_WAIT_POLICY=PASSIVE"  # what `l0bayes fit` sets (l0bayes.cli.threads), with torch's count
NUM_DATA = 60000
BATCH_SIZE = 100


def worker(seconds, block, warmup):
    """Alternate blocks of ``block`` steps at 1 and 2 threads for ``seconds``; prints one JSON line.

    ``{"torch_threads": n, "rates": {"1": [steps/s per block], "2": [...]}}``, ``n`` being torch's own
    thread count (what ``l0bayes fit`` keeps on a non-bundled data set).
    """
    import torch

    from l0bayes.models import SparseClassifier
    from l0bayes.nn import L0MLP

    chosen = torch.get_num_threads()
    torch.manual_seed(0)
    x = torch.randn(NUM_DATA, 784)
    y = torch.randint(0, 10, (NUM_DATA,))
    model = SparseClassifier(L0MLP(784, (300, 100), 10), lam=0.1)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3, fused=True)
    order = torch.randperm(NUM_DATA)
    k = 0

    def steps(n):
        nonlocal k
        for _ in range(n):
            index = order[(k * BATCH_SIZE) % NUM_DATA :][:BATCH_SIZE]
            nll, code_cost = model.penalized_loss(x[index], y[index], NUM_DATA)
            loss = (nll + code_cost) / NUM_DATA
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            k += 1

    for n in THREADS:
        torch.set_num_threads(n)
        steps(warmup)
    rates = {str(n): [] for n in THREADS}
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        for n in THREADS:
            torch.set_num_threads(n)
            t = time.perf_counter()
            steps(block)
            rates[str(n)].append(block / (time.perf_counter() - t))
    print(json.dumps({"torch_threads": chosen, "rates": rates}), flush=True)


def run_worker(policy, seconds, block, warmup):
    command = [sys.executable, __file__, "--worker", "--seconds", str(seconds), "--block", str(block)]
    command += ["--warmup", str(warmup)]
    environ = {**os.environ, **POLICIES[policy]}
    environ.pop("OMP_NUM_THREADS", None)  # the worker sets its own counts
    proc = subprocess.run(command, capture_output=True, text=True, env=environ, check=True)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def busy_process():
    """One CPU-bound process (a pure-Python loop): the competing job of the ``busy`` condition."""
    return subprocess.Popen([sys.executable, "-c", "while True: pass"])


def measure(repeats, seconds, block, warmup):
    """``{(condition, policy): [worker results]}`` and the 1-minute load average before each condition."""
    results = {(c, p): [] for c in ("idle", "busy") for p in POLICIES}
    loads = []
    for r in range(repeats):
        for condition in ("idle", "busy") if r % 2 == 0 else ("busy", "idle"):
            loads.append(os.getloadavg()[0])
            for policy in list(POLICIES)[:: 1 if r % 2 == 0 else -1]:
                competitor = busy_process() if condition == "busy" else None
                try:
                    if competitor is not None:
                        time.sleep(0.5)  # let it reach the run queue
                    result = run_worker(policy, seconds, block, warmup)
                finally:
                    if competitor is not None:
                        competitor.terminate()
                        competitor.wait()
                results[condition, policy].append(result)
                rates = {n: statistics.median(v) for n, v in result["rates"].items()}
                print(
                    f"repeat {r + 1} {condition:4s} {policy:24s} 1 thread {rates['1']:6.1f}, 2 threads "
                    f"{rates['2']:6.1f} steps/s (torch's count {result['torch_threads']})",
                    flush=True,
                )
    return results, loads


def summarise(results, condition):
    """Rows ``(setting, steps/s, speed relative to 1 thread)``; ratios are medians of in-process block pairs."""
    rows = []
    for policy in POLICIES:
        runs = results[condition, policy]
        ratios = [b / a for run in runs for a, b in zip(run["rates"]["1"], run["rates"]["2"], strict=True)]
        one = statistics.median(r for run in runs for r in run["rates"]["1"])
        two = statistics.median(r for run in runs for r in run["rates"]["2"])
        if not rows:
            rows.append(("1 thread", one, 1.0))
        rows.append((f"2 threads, {policy}", two, statistics.median(ratios)))
    return rows


CLI_SETTINGS = {
    "default (torch's count, PASSIVE)": ([], {}),
    "--threads 1": (["--threads", "1"], {}),
}


def cli_epochs(repeats, data_dir=None):
    """Wall seconds of one epoch of ``l0bayes fit --data fashion-mnist`` per setting and condition.

    Each run is ``python -m l0bayes fit --data fashion-mnist --epochs 1`` into a fresh temporary
    directory; the epoch time is the ``wall_s`` of its history (training only, no data loading).
    """
    import tempfile

    times = {(c, s): [] for c in ("idle", "busy") for s in CLI_SETTINGS}
    for r in range(repeats):
        for condition in ("idle", "busy") if r % 2 == 0 else ("busy", "idle"):
            for name in list(CLI_SETTINGS)[:: 1 if r % 2 == 0 else -1]:
                extra, env = CLI_SETTINGS[name]
                with tempfile.TemporaryDirectory() as tmp:
                    out = os.path.join(tmp, "run")
                    command = [sys.executable, "-m", "l0bayes", "fit", "--data", "fashion-mnist", "--epochs", "1"]
                    command += ["--no-progress", "--out", out, *extra]
                    command += ["--data-dir", data_dir] if data_dir else []
                    environ = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "OMP_WAIT_POLICY")}
                    competitor = busy_process() if condition == "busy" else None
                    try:
                        subprocess.run(command, check=True, capture_output=True, env={**environ, **env})
                    finally:
                        if competitor is not None:
                            competitor.terminate()
                            competitor.wait()
                    with open(os.path.join(out, "history.json")) as f:
                        wall = json.load(f)[-1]["wall_s"]
                times[condition, name].append(wall)
                print(f"cli repeat {r + 1} {condition:4s} {name:34s} {wall:7.1f} s/epoch", flush=True)
    return times


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=12.0, help="timed wall seconds per worker")
    parser.add_argument("--block", type=int, default=15, help="steps per block at one thread count")
    parser.add_argument("--warmup", type=int, default=10, help="untimed steps per thread count and worker")
    parser.add_argument("--markdown", action="store_true")
    parser.add_argument("--save", default=None, help="write the per-block rates to this JSON file")
    parser.add_argument(
        "--cli", type=int, default=0, metavar="REPEATS", help="instead: time REPEATS epochs of l0bayes fit per setting"
    )
    args = parser.parse_args()
    if args.cli:
        print(f"{datetime.date.today()}, before: {subprocess.run(['uptime'], capture_output=True, text=True).stdout}")
        times = cli_epochs(args.cli)
        rows = []
        for condition in ("idle", "busy"):
            medians = {s: statistics.median(times[condition, s]) for s in CLI_SETTINGS}
            best = min(medians.values())
            rows += [[condition, s, f"{t:.1f}", f"{t / best:.2f}x"] for s, t in medians.items()]
        print(format_table(["condition", "setting", "s/epoch (median)", "slower than best"], rows, args.markdown))
        print(f"after: {subprocess.run(['uptime'], capture_output=True, text=True).stdout}")
        return
    if args.worker:
        worker(args.seconds, args.block, args.warmup)
        return
    uptime = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    print(f"{datetime.date.today()}, {os.cpu_count()} CPUs, before: {uptime}", flush=True)
    results, loads = measure(args.repeats, args.seconds, args.block, args.warmup)
    table = []
    for condition in ("idle", "busy"):
        rows = summarise(results, condition)
        best = max(relative for _, _, relative in rows)
        for setting, rate, relative in rows:
            table.append([condition, setting, f"{rate:.1f}", f"{relative:.2f}", f"{best / relative:.2f}x"])
        default = [r for r in rows if r[0] == f"2 threads, {CLI_DEFAULT}"][0]
        table.append(["**" + condition, f"l0bayes fit default: {default[0]}**", "", f"{default[2]:.2f}",
                      f"{best / default[2]:.2f}x"])  # fmt: skip
    if args.save:
        with open(args.save, "w") as f:
            json.dump({f"{c}|{p}": v for (c, p), v in results.items()}, f)
    header = ["condition", "setting", "steps/s (median)", "speed vs 1 thread (in-process)", "slower than best"]
    print(format_table(header, table, markdown=args.markdown))
    after = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    print(f"load average (1 min) at the start of each condition: {', '.join(f'{v:.2f}' for v in loads)}")
    print(f"after: {after}")


if __name__ == "__main__":
    main()
