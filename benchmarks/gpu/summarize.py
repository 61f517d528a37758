"""Tables, per-epoch CSV and figure of the GPU paper runs (``paper_runs.py``), for benchmarks/RESULTS.md.

Reads one or more run roots (``runs/gpu-paper`` on the GPU machine, or the same folders unpacked from
the calls' ``paper-runs.tar.gz``; a later root's job replaces an earlier one's of the same name if it
has more epochs). A finished job has ``history.json`` / ``summary.json``; an L0 run stopped by the
deadline has its history in ``checkpoint.pt`` (copied here to ``partial_history.json``, so that the
checkpoint need not travel); a stopped dense baseline has its per-epoch log lines. Writes into ``--out``:

* ``paper_summary.md``: per job (epochs done, last and best test error, architecture, parameters,
  expected FLOPs, density, median s/epoch and the mean number of jobs sharing the GPU), then per run
  the mean ± sd over the seeds that finished all epochs, with the CPU's s/epoch of RESULTS.md beside;
* ``per_epoch.csv``: run, seed, epoch, test error, expected FLOPs, open gates, density, wall s;
* ``paper_per_epoch.png``: test error and expected FLOPs per epoch, mean over seeds, each run.

    python benchmarks/gpu/summarize.py runs/gpu-paper --out /tmp/summary
"""

import argparse
import csv
import json
import os
import re
import statistics
import sys

# s/epoch of the same runs on the shared 2-core CPU, one thread each, two runs at a time (benchmarks/RESULTS.md,
# "The paper's experiments": "MLP 784-300-100, 200 epochs" and "MLP with per-layer lambdas (200 epochs) and
# LeNet-5 (40 epochs)", 2026-11-22).
CPU_S_PER_EPOCH = {
    "mlp": 3.0,
    "mlp-bayes": 3.1,
    "mlp-dense": 2.8,
    "mlp-sep": 3.8,
    "lenet5": 25.1,
    "lenet5-sep": 24.6,
    "lenet5-bayes": 25.4,
    "lenet5-dense": 24.1,
}
JOB = re.compile(r"^(?P<run>.+)-s(?P<seed>\d+)$")
DENSE_LINE = re.compile(r"epoch (\d+): test error ([0-9.]+)%, ([0-9.]+) s")


def _json(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def run_dir(root, job, run):
    """Where the run's own files are: the job folder (constrained) or paper.py's ``<job>/<run>``."""
    if run.endswith("-constrained"):
        return os.path.join(root, job)
    return os.path.join(root, job, "lenet5" if run == "lenet5-noema" else run)


def history_of(root, job, run):
    """``(history, summary, source)`` of one job; ``history`` is a list of per-epoch records."""
    path = run_dir(root, job, run)
    summary, history = _json(os.path.join(path, "summary.json")), _json(os.path.join(path, "history.json"))
    if history is not None:
        return history, summary, "history.json"
    partial = os.path.join(path, "partial_history.json")
    ckpt = os.path.join(path, "checkpoint.pt")
    if os.path.isfile(ckpt):
        try:
            import torch

            history = torch.load(ckpt, map_location="cpu", weights_only=True)["history"]
            with open(partial, "w") as f:
                json.dump(history, f)
            return history, None, "checkpoint"
        except Exception as err:  # a checkpoint cut short by the deadline
            print(f"warning: {ckpt}: {err}", file=sys.stderr)
    if os.path.isfile(partial):
        return _json(partial), None, "partial_history.json"
    try:
        with open(os.path.join(root, job + ".log")) as f:
            lines = DENSE_LINE.findall(f.read())
        return [{"epoch": int(e), "test_error": float(t) / 100, "wall_s": float(w)} for e, t, w in lines], None, "log"
    except OSError:
        return [], None, "none"


def collect(roots):
    jobs = {}
    for root in roots:
        status = _json(os.path.join(root, "status.json")) or {}
        names = set(status) | {d for d in os.listdir(root) if JOB.match(d) and os.path.isdir(os.path.join(root, d))}
        for job in sorted(names):
            m = JOB.match(job)
            if not m:
                continue
            run, seed = m["run"], int(m["seed"])
            history, summary, source = history_of(root, job, run)
            record = {"job": job, "run": run, "seed": seed, "history": history or [], "summary": summary}
            record.update(source=source, status=status.get(job, {}))
            if job not in jobs or len(record["history"]) >= len(jobs[job]["history"]):
                jobs[job] = record
    return jobs


def _fmt_ms(values, scale=100, digits=2):
    if not values:
        return "-"
    if len(values) == 1:
        return f"{scale * values[0]:.{digits}f}"
    return f"{scale * statistics.mean(values):.{digits}f} ± {scale * statistics.stdev(values):.{digits}f}"


def job_row(rec):
    hist, summary = rec["history"], rec["summary"] or {}
    tested = [(r["test_error"], r["epoch"]) for r in hist if r.get("test_error") is not None]
    last = tested[-1][0] if tested else None
    final = summary.get("test", last)
    best = min(tested) if tested else None
    gates = next((r["active_gates"] for r in reversed(hist) if r.get("active_gates")), None)
    arch = summary.get("architecture") or ("-".join(map(str, gates)) if gates else "-")
    walls = [r["wall_s"] for r in hist if "wall_s" in r]
    flops = next((r["expected_flops"] for r in reversed(hist) if r.get("expected_flops") is not None), None)
    density = summary.get(
        "test_time_density", next((r["test_time_density"] for r in reversed(hist) if "test_time_density" in r), None)
    )
    params = f"{summary['params_pruned']:,} / {summary['params_dense']:,}" if "params_pruned" in summary else "-"
    return {
        "epochs": len(hist),
        "final": final,
        "best": best,
        "arch": arch,
        "params": params,
        "flops": flops,
        "density": density,
        "s_per_epoch": statistics.median(walls) if walls else None,
        "concurrency": rec["status"].get("mean_concurrent_jobs"),
        "state": rec["status"].get("state", "?"),
    }


def _pct(value):
    return "-" if value is None else f"{100 * value:.2f}%"


def _num(value, spec):
    return "-" if value is None else format(value, spec)


def job_table(rows):
    head = (
        "job", "state", "epochs", "test error (last)", "best (epoch)", "architecture", "params pruned / dense",
        "expected FLOPs", "test-time density", "s/epoch (median)", "jobs sharing the GPU (mean)",
    )  # fmt: skip
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for job, r in rows.items():
        best = f"{_pct(r['best'][0])} ({r['best'][1]})" if r["best"] else "-"
        cells = (
            job, r["state"], str(r["epochs"]), _pct(r["final"]), best, r["arch"], r["params"], _num(r["flops"], ",.0f"),
            _num(r["density"], ".3f"), _num(r["s_per_epoch"], ".2f"), _num(r["concurrency"], ".1f"),
        )  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def run_table(jobs, rows, epochs):
    """Per run: mean ± sd over the seeds that finished ``epochs`` epochs."""
    head = (
        "run", "seeds done", "test error (%)", "best (%)", "architectures", "expected FLOPs",
        "s/epoch GPU (median)", "s/epoch CPU (RESULTS.md)",
    )  # fmt: skip
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for run in dict.fromkeys(rec["run"] for rec in jobs.values()):
        done = [job for job, rec in jobs.items() if rec["run"] == run and rows[job]["epochs"] >= epochs]
        all_jobs = [job for job, rec in jobs.items() if rec["run"] == run]
        finals = [rows[j]["final"] for j in done if rows[j]["final"] is not None]
        bests = [rows[j]["best"][0] for j in done if rows[j]["best"]]
        flops = [rows[j]["flops"] for j in done if rows[j]["flops"] is not None]
        walls = [rows[j]["s_per_epoch"] for j in all_jobs if rows[j]["s_per_epoch"] is not None]
        cells = (
            run, f"{len(done)} of {len(all_jobs)}", _fmt_ms(finals), _fmt_ms(bests),
            ", ".join(rows[j]["arch"] for j in done) or "-", _fmt_ms(flops, scale=1, digits=0),
            _num(statistics.median(walls) if walls else None, ".2f"), _num(CPU_S_PER_EPOCH.get(run), ".1f"),
        )  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def write_csv(jobs, path):
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(
            ["run", "seed", "epoch", "test_error", "expected_flops", "active_gates", "test_time_density", "wall_s"]
        )
        for rec in jobs.values():
            for r in rec["history"]:
                gates = "-".join(map(str, r["active_gates"])) if r.get("active_gates") else ""
                w.writerow([rec["run"], rec["seed"], r.get("epoch"), r.get("test_error"), r.get("expected_flops"),
                            gates, r.get("test_time_density"), r.get("wall_s")])  # fmt: skip


def figure(jobs, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(13, 4.5))
    for k, run in enumerate(dict.fromkeys(rec["run"] for rec in jobs.values())):
        per_epoch = {}
        for rec in (r for r in jobs.values() if r["run"] == run):
            for r in rec["history"]:
                per_epoch.setdefault(r["epoch"], []).append(r)
        epochs = sorted(per_epoch)
        style = {"color": plt.cm.tab20(k % 20), "linestyle": "--" if "dense" in run else "-", "label": run}
        err = [statistics.mean(r["test_error"] for r in per_epoch[e] if r.get("test_error") is not None) for e in epochs
               if any(r.get("test_error") is not None for r in per_epoch[e])]  # fmt: skip
        axes[0].plot(epochs[: len(err)], [100 * v for v in err], **style)
        fl = [(e, statistics.mean(r["expected_flops"] for r in per_epoch[e] if r.get("expected_flops") is not None))
              for e in epochs if any(r.get("expected_flops") is not None for r in per_epoch[e])]  # fmt: skip
        if fl:
            axes[1].plot([e for e, _ in fl], [v for _, v in fl], **style)
    axes[0].set_ylabel("test error (%), mean over seeds")
    axes[0].set_ylim(7, 14)
    axes[1].set_ylabel("expected FLOPs per example (Fig. 3), mean over seeds")
    axes[1].set_yscale("log")
    for ax in axes:
        ax.set_xlabel("epoch")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("roots", nargs="+", help="run roots of paper_runs.py, later ones take precedence")
    parser.add_argument("--epochs", type=int, default=200, help="epochs of a finished run")
    parser.add_argument("--out", required=True, help="folder for paper_summary.md, per_epoch.csv, the figure")
    parser.add_argument("--no-figure", action="store_true")
    args = parser.parse_args(argv)
    jobs = collect(args.roots)
    rows = {job: job_row(rec) for job, rec in jobs.items()}
    os.makedirs(args.out, exist_ok=True)
    text = ["## Per run (mean ± sd over the seeds that finished all epochs)", "", *run_table(jobs, rows, args.epochs)]
    text += ["", "## Per job", "", *job_table(rows)]
    with open(os.path.join(args.out, "paper_summary.md"), "w") as f:
        f.write("\n".join(text) + "\n")
    write_csv(jobs, os.path.join(args.out, "per_epoch.csv"))
    if not args.no_figure and jobs:
        try:
            figure(jobs, os.path.join(args.out, "paper_per_epoch.png"))
        except Exception as err:  # the tables matter more than the figure
            print(f"figure skipped: {err}", file=sys.stderr)
    print("\n".join(text))
    return 0


if __name__ == "__main__":
    sys.exit(main())
