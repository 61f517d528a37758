"""What ``select_variables``'s default costs where its importance check passes, side by side in one process.

Where Pareto k-hat passes, ``method="auto"`` adds a short run of the exact sampler to the fit (the test of
the passed check, ``details["verified"]``). This script times, on the designs of
``bench_variable_selection.py``, back to back in one process and in an order that alternates with the
repeat:

* ``auto``: ``select_variables(X, y)``, every default;
* ``fit``: ``select_variables(X, y, method="variational")``, the fit and its check alone;
* ``baseline`` (with ``--baseline DIR``): ``select_variables(X, y)`` of another l0bayes source tree ``DIR``
  (a checkout of an earlier version, e.g. ``git worktree add /tmp/before <commit>``), copied to a temporary
  directory and imported as ``l0bayes_baseline``, so both versions run in this process.

Each call is timed ``--repeats`` times after one untimed call; the median is reported, with the ratios
of ``auto`` to ``fit`` and to ``baseline`` over the data sets whose check passed and was confirmed by
the short run (the only ones where the default's answer is the fit's).

Example::

    OMP_NUM_THREADS=1 python benchmarks/bench_selection_overhead.py --design ar1 --rho 0.9 0.95 --seeds 5
    OMP_NUM_THREADS=1 python benchmarks/bench_selection_overhead.py --baseline /tmp/before --json over.jsonl
"""

import argparse
import atexit
import importlib
import json
import shutil
import statistics
import sys
import tempfile
import time
import warnings
from functools import partial
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_variable_selection import load_records, machine_line, make_data  # noqa: E402
from tables import format_table  # noqa: E402


def import_baseline(tree, name="l0bayes_baseline"):
    """``select_variables`` of the l0bayes package in source tree ``tree``, imported as package ``name``."""
    source = Path(tree) / "l0bayes"
    if not (source / "__init__.py").exists():
        raise SystemExit(f"{tree} holds no l0bayes package (expected {source}/__init__.py)")
    if name in sys.modules:
        raise SystemExit(f"a package {name!r} is already imported in this process; give another name")
    home = Path(tempfile.mkdtemp(prefix="l0bayes-baseline-"))
    atexit.register(shutil.rmtree, home, True)
    shutil.copytree(source, home / name)  # its imports are relative: it runs under any name
    sys.path.insert(0, str(home))
    try:
        try:
            module = importlib.import_module(f"{name}.selection.api")
        except ModuleNotFoundError:  # a tree from before l0bayes.selection: select_variables was in models
            module = importlib.import_module(f"{name}.models.selection")
    finally:  # its later imports go through the package's own path
        sys.path.remove(str(home))
    return module.select_variables


def time_calls(calls, repeats):
    """Median seconds of each call, after one untimed call each; the order alternates with the repeat."""
    for call in calls.values():
        call()
    seconds = {name: [] for name in calls}
    for r in range(repeats):
        for name in list(calls)[:: 1 if r % 2 == 0 else -1]:
            began = time.perf_counter()
            calls[name]()
            seconds[name].append(time.perf_counter() - began)
    return {name: statistics.median(s) for name, s in seconds.items()}


def run(args):
    import l0bayes

    baseline = import_baseline(args.baseline, args.baseline_name) if args.baseline else None
    records = []
    for rho in args.rho:
        for seed in range(args.seeds):
            n = args.wide_n if args.design == "wide" else args.n
            x, y, _ = make_data(n, args.p, rho, args.effects, 1000 * seed + 7, design=args.design)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)
                result = l0bayes.select_variables(x, y)
                calls = {"auto": partial(l0bayes.select_variables, x, y)}
                calls["fit"] = partial(l0bayes.select_variables, x, y, method="variational")
                if baseline is not None:
                    calls["baseline"] = partial(baseline, x, y)
                seconds = time_calls(calls, args.repeats)
            confirmed = "verified" in result.details
            record = {"design": args.design, "n": n, "p": args.p, "rho": rho, "seed": seed, "khat": result.khat}
            record.update(method=result.method, confirmed=confirmed, seconds=seconds)
            records.append(record)
            print(json.dumps(record), flush=True)
    return records


def table(records, markdown):
    header = ["design", "n x p", "rho", "seed", "k-hat", "answer", "auto s", "fit s", "baseline s", "auto / fit"]
    header.append("auto / baseline")
    rows = []
    for r in records:
        s = r["seconds"]
        base = s.get("baseline")
        rows.append(
            [r["design"], f"{r['n']} x {r['p']}", str(r["rho"]), str(r["seed"]), f"{r['khat']:.2f}"]
            + ["reweighted, confirmed" if r["confirmed"] else r["method"], f"{s['auto']:.2f}", f"{s['fit']:.2f}"]
            + ["-" if base is None else f"{base:.2f}", f"{s['auto'] / s['fit']:.2f}"]
            + ["-" if base is None else f"{s['auto'] / base:.2f}"]
        )
    out = format_table(header, rows, markdown)
    passed = [r["seconds"] for r in records if r["confirmed"]]
    if passed:
        for other in ("fit", "baseline"):
            if all(other in s for s in passed):
                ratio = np.array([s["auto"] / s[other] for s in passed])
                extra = np.array([s["auto"] - s[other] for s in passed])
                out += (
                    f"\ncheck passed and confirmed, {len(passed)} data sets: auto / {other} "
                    f"{ratio.mean():.2f} ± {ratio.std(ddof=1) if ratio.size > 1 else 0:.2f} "
                    f"(range {ratio.min():.2f}-{ratio.max():.2f}), {extra.mean():+.2f} s on average"
                )
    return out


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--design", choices=("ar1", "block", "wide"), default="ar1")
    parser.add_argument("--n", type=int, default=1000)
    parser.add_argument("--wide-n", type=int, default=200)
    parser.add_argument("--p", type=int, default=1000)
    parser.add_argument("--rho", type=float, nargs="+", default=[0.9])
    parser.add_argument("--effects", type=int, default=10)
    parser.add_argument("--seeds", type=int, default=3, help="data seeds 0 .. SEEDS - 1 (data seed 1000 s + 7)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--baseline", type=Path, help="an l0bayes source tree to time beside this one")
    parser.add_argument("--baseline-name", default="l0bayes_baseline", help="the package name it is imported as")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", type=Path, help="write the records here as JSON lines (must not exist)")
    parser.add_argument("--load", type=Path, nargs="*", default=[], help="tabulate these --json files too")
    parser.add_argument("--no-run", action="store_true", help="only tabulate --load")
    parser.add_argument("--markdown", action="store_true")
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    if args.json is not None and args.json.exists():
        raise SystemExit(f"{args.json} exists; not overwriting it")
    torch.set_num_threads(args.threads)
    print(machine_line(args.threads), flush=True)
    records = load_records(args.load)
    if not args.no_run:
        fresh = run(args)
        if args.json is not None:
            args.json.write_text("".join(json.dumps(r) + "\n" for r in fresh))
        records += fresh
    if records:
        print(table(records, args.markdown))
    return records


if __name__ == "__main__":
    main()
