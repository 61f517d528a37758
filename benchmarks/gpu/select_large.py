"""``select_variables`` at large ``p`` on CUDA, with the CPU beside it.

The AR(1) design of ``benchmarks/bench_variable_selection.py`` (``make_data``, scored by its ``score``:
AUPRC, true / false selections), ``n`` rows, ``p`` columns, ``--effects`` true effects; for each seed
the same data go through ``l0bayes.select_variables(X, y, device=...)`` on every ``--devices`` entry in
turn (a tiny warm-up run on each device first). Prints one JSON line per run and a markdown table::

    python benchmarks/gpu/select_large.py --p 100000 --devices cuda cpu --seeds 1
"""

import argparse
import json
import pathlib
import statistics
import sys
import time
import warnings

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
from bench_variable_selection import make_data, score  # noqa: E402
from tables import format_table  # noqa: E402


def run(x, y, device):
    import l0bayes

    if device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        result = l0bayes.select_variables(x, y, device=device)
    if device.type == "cuda":
        torch.cuda.synchronize()
    return result, time.perf_counter() - start


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=1000)
    parser.add_argument("--p", type=int, default=100_000)
    parser.add_argument("--rho", type=float, default=0.5)
    parser.add_argument("--effects", type=int, default=20)
    parser.add_argument("--seeds", type=int, default=1)
    parser.add_argument("--devices", nargs="+", default=["cuda", "cpu"])
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    devices = [torch.device(d) for d in args.devices]
    if any(d.type == "cuda" for d in devices) and not torch.cuda.is_available():
        parser.error("CUDA is not available")
    x0, y0, _ = make_data(60, 30, args.rho, 3, 0)
    for device in devices:
        run(x0, y0, device)
    records = []
    for seed in range(args.seeds):
        x, y, truth = make_data(args.n, args.p, args.rho, args.effects, 1000 * seed + 7)
        for device in devices:
            result, seconds = run(x, y, device)
            rec = {"p": args.p, "n": args.n, "rho": args.rho, "seed": seed, "device": str(device), "seconds": seconds}
            rec.update(score(truth, result.inclusion_probabilities, False), khat=result.khat, reliable=result.reliable)
            records.append(rec)
            print("SELECT " + json.dumps(rec), flush=True)
    rows = []
    for device in devices:
        rs = [r for r in records if r["device"] == str(device)]
        secs = [r["seconds"] for r in rs]
        rows.append(
            (
                str(device),
                str(len(rs)),
                f"{statistics.median(secs):.1f}",
                f"{statistics.mean(r['auprc'] for r in rs):.3f}",
                f"{statistics.mean(r['sel_true'] for r in rs):.1f} / {statistics.mean(r['sel_false'] for r in rs):.1f}",
                f"{statistics.mean(r['khat'] for r in rs):.2f}",
            )
        )
    header = ("device", "runs", "seconds (median)", "AUPRC", "selected true / false", "k-hat")
    print(
        f"select_variables, n={args.n}, p={args.p}, rho={args.rho}, {args.effects} effects, torch {torch.__version__}"
    )
    print(format_table(header, rows, markdown=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
