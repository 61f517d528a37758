"""Library calls beside one busy two-thread process: the thread policy of train(), the KL and a notebook.

Without the command line's ``OMP_WAIT_POLICY=PASSIVE`` (which only works when set before torch loads),
torch's default of one spinning OpenMP thread per core runs many times slower than one thread as soon
as another process wants a core. :mod:`l0bayes.threads` gives the library's heavy calls one thread
(``threads="auto"``). This script measures three calls as a user writes them:

* ``train``: :func:`~l0bayes.inference.train` of the L0 MLP 784-300-100-10 (penalised, lambda = 0.1/N),
  one epoch of 2,000 random inputs in minibatches of 100;
* ``kl``: :func:`~l0bayes.distributions.kl_hard_concrete` of :math:`10^6` gate pairs;
* ``notebook 03``: every code cell of ``notebooks/03_sparse_mlp.ipynb`` in its small setting
  (``L0BAYES_FAST=1``: digits, 8 epochs, then pruning, plots, ArviZ), executed in this process;

each in three settings, interleaved within every repeat in an order shuffled per repeat:
``library default`` (the call as written), ``torch's count`` (inside ``thread_policy(None)``: what the
library did before it had a policy) and ``one thread`` (inside ``thread_policy(1)``). The ratio of a
setting to one thread is taken per repeat, side by side, and the table gives its median and range.

Each wait policy runs in its own worker process (the policy is read when torch loads): OpenMP's
default, and ``OMP_WAIT_POLICY=PASSIVE`` (``"auto"`` then keeps torch's count). Before each worker the
script starts the competitor, one process running torch matrix products and element-wise
operations on two threads, and stops it after.

Example::

    python benchmarks/bench_library_threads.py --repeats 5 --markdown
"""

import argparse
import contextlib
import datetime
import io
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

from tables import format_table

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = ROOT / "notebooks" / "03_sparse_mlp.ipynb"
POLICIES = {"default wait policy": {}, "OMP_WAIT_POLICY=PASSIVE": {"OMP_WAIT_POLICY": "PASSIVE"}}
SETTINGS = ("library default", "torch's count", "one thread")
WORKLOADS = ("train", "kl", "notebook 03")
BOUND = 1.5  # a library call must not be more than this much slower than on one thread
# The competing process: two intra-op threads, matrix products and element-wise operations (OpenMP regions).
COMPETITOR = (
    "import torch\n"
    "torch.set_num_threads(2)\n"
    "a, b = torch.randn(400, 400), torch.randn(200000)\n"
    "while True:\n"
    "    a @ a\n"
    "    (b.exp() * 2 + 1).sum()\n"
)
_CHOICE = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "KMP_BLOCKTIME")


def _workloads():
    """``{name: function}`` of the three calls (set up once, untimed)."""
    import torch

    from l0bayes import HardConcrete, kl_hard_concrete
    from l0bayes.inference import train
    from l0bayes.models import SparseClassifier
    from l0bayes.nn import L0MLP

    gen = torch.Generator().manual_seed(0)
    x, y = torch.randn(2000, 784, generator=gen), torch.randint(0, 10, (2000,), generator=gen)
    q = HardConcrete(torch.randn(10**6, generator=gen), 2 / 3)
    prior = HardConcrete(torch.zeros(()), 2 / 3)

    def train_mlp():
        torch.manual_seed(0)
        model = SparseClassifier(L0MLP(784, (300, 100), 10), lam=0.1)
        train(model, x, y, objective="penalized", epochs=1, batch_size=100, progress=False)

    def kl():
        kl_hard_concrete(q, prior).sum()

    import nbformat

    cells = [c.source for c in nbformat.read(NOTEBOOK, as_version=4).cells if c.cell_type == "code"]
    code = "\n".join(line for cell in cells for line in cell.splitlines() if not line.startswith("%"))
    program = compile(code, str(NOTEBOOK), "exec")

    def notebook():
        with contextlib.redirect_stdout(io.StringIO()):
            exec(program, {"display": lambda *a: None, "__name__": "__notebook__"})

    return {"train": train_mlp, "kl": kl, "notebook 03": notebook}


def worker(repeats, seed):
    """Times every workload in every setting, ``repeats`` times; prints one JSON line."""
    os.environ["L0BAYES_FAST"], os.environ["MPLBACKEND"] = "1", "Agg"
    import torch

    from l0bayes.threads import thread_policy

    torch_count = torch.get_num_threads()
    contexts = {
        "library default": contextlib.nullcontext,
        "torch's count": lambda: thread_policy(None),
        "one thread": lambda: thread_policy(1),
    }
    work = _workloads()
    for name in WORKLOADS:  # warm-up: imports, allocator, the notebook's first matplotlib figure
        with contexts["one thread"]():
            work[name]()
    rng = random.Random(seed)
    seconds = {f"{w}|{s}": [] for w in WORKLOADS for s in SETTINGS}
    for r in range(repeats):
        for w in WORKLOADS:
            order = list(SETTINGS)
            rng.shuffle(order)
            for s in order:
                with contexts[s]():
                    start = time.perf_counter()
                    work[w]()
                    seconds[f"{w}|{s}"].append(time.perf_counter() - start)
            print(f"# repeat {r + 1} {w}: " + ", ".join(f"{s} {seconds[f'{w}|{s}'][-1]:.2f} s" for s in SETTINGS),
                  file=sys.stderr, flush=True)  # fmt: skip
    print(json.dumps({"torch_threads": torch_count, "seconds": seconds}), flush=True)


def run_worker(policy, repeats, seed):
    environ = {k: v for k, v in os.environ.items() if k not in _CHOICE}
    environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), environ.get("PYTHONPATH")]))
    competitor = subprocess.Popen([sys.executable, "-c", COMPETITOR], env=environ)  # the same for every policy
    try:
        time.sleep(1.0)  # let it start its threads
        command = [sys.executable, __file__, "--worker", "--repeats", str(repeats), "--seed", str(seed)]
        env = {**environ, **POLICIES[policy]}
        proc = subprocess.run(command, stdout=subprocess.PIPE, text=True, env=env, check=True)
    finally:
        competitor.terminate()
        competitor.wait()
    return json.loads(proc.stdout.strip().splitlines()[-1])


def table(results):
    """Rows: policy, workload, setting, median seconds, ratio to one thread (median, min-max), within the bound."""
    rows = []
    for policy, result in results.items():
        seconds = result["seconds"]
        for w in WORKLOADS:
            one = seconds[f"{w}|one thread"]
            for s in SETTINGS:
                times = seconds[f"{w}|{s}"]
                ratios = [t / o for t, o in zip(times, one, strict=True)]
                setting = s if s != "torch's count" else f"torch's count ({result['torch_threads']})"
                ok = "" if s == "one thread" else ("yes" if statistics.median(ratios) <= BOUND else "**no**")
                rows.append(
                    [
                        policy,
                        w,
                        setting,
                        f"{statistics.median(times):.2f}",
                        f"{statistics.median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f})",
                        ok,
                    ]
                )
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0, help="seed of the order of the settings within a repeat")
    parser.add_argument("--policies", nargs="+", choices=list(POLICIES), default=list(POLICIES))
    parser.add_argument("--markdown", action="store_true")
    parser.add_argument("--save", default=None, help="write the seconds of every run to this JSON file (new file)")
    args = parser.parse_args()
    if args.worker:
        worker(args.repeats, args.seed)
        return
    if args.save and os.path.exists(args.save):
        raise SystemExit(f"{args.save} exists; not overwriting it")
    import torch

    started = datetime.datetime.now(datetime.timezone.utc)
    print(f"# {started:%Y-%m-%d %H:%M} UTC, {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
          f"python {platform.python_version()}, torch {torch.__version__}, load average {os.getloadavg()[0]:.2f}",
          flush=True)  # fmt: skip
    results = {policy: run_worker(policy, args.repeats, args.seed) for policy in args.policies}
    header = ["wait policy", "call", "setting", "s (median)", "time / one thread (median, range)", f"<= {BOUND}x"]
    print(format_table(header, table(results), markdown=args.markdown))
    print(f"# {args.repeats} repeats; load average at the end {os.getloadavg()[0]:.2f}")
    if args.save:
        with open(args.save, "x") as f:
            json.dump(results, f)


if __name__ == "__main__":
    main()
