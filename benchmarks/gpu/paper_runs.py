"""The paper's 200-epoch runs as parallel processes on one GPU, within a deadline.

Each job is one run of one seed, as ``experiments/paper.py`` runs it (``--runs NAME --seed S --device
cuda --threads 1``, the paper code's protocol: He initialisation, log_alpha projection, parameter
average 0.999), or, for the constrained targets, the same ``l0bayes fit`` command with ``--objective
constrained --target-density T``; ``lenet5-noema`` is LeNet-5 with the paper script's own settings
(``--ema 0``: no parameter averaging). Every job writes into ``ROOT/<job>/`` and logs to
``ROOT/<job>.log``; an L0 run's checkpoint holds its per-epoch history from the first epoch on, a dense
baseline prints one line per epoch, so whatever stops the call leaves the epochs done so far.

Scheduling: up to ``--jobs`` processes at once, in the priority order given (run names major, seeds
minor). Every ``--poll`` seconds the epochs done are read; once rates are known, if some running job
would not finish by the deadline at the recent rates of all, the lowest-priority running job is paused
(SIGSTOP of its process group: it holds its GPU memory but takes no GPU time, so the others speed up),
and a paused job is continued when another finishes. At the deadline every job is interrupted (SIGINT:
the L0 runs keep their last checkpoint; running the same command again continues them with
``--resume``, which ``paper.py`` and this script add by themselves) and ``ROOT/status.json`` records
each job's state, epochs and times.

    python benchmarks/gpu/paper_runs.py --runs mlp mlp-bayes mlp-sep mlp-dense --deadline 480 --root runs/gpu-paper
"""

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PAPER_RUNS = ("mlp", "mlp-sep", "mlp-bayes", "mlp-dense", "lenet5", "lenet5-sep", "lenet5-bayes", "lenet5-dense")
# Constrained targets (model-wise expected density): the slides' MLP (0.33) and LeNet-5 (0.1) examples.
CONSTRAINED = {"mlp-constrained": ("mlp", 0.33), "lenet5-constrained": ("lenet5", 0.1)}
EXTRA = ("lenet5-noema",)
ALL_RUNS = PAPER_RUNS + tuple(CONSTRAINED) + EXTRA
DENSE_EPOCH = re.compile(r"epoch (\d+): test error")


class Job:
    def __init__(self, run, seed, args):
        self.run, self.seed = run, seed
        self.name = f"{run}-s{seed}"
        self.out = os.path.join(args.root, self.name)
        self.log = os.path.join(args.root, self.name + ".log")
        self.epochs = args.epochs
        self.command = command(run, seed, args, self.out)
        self.proc = None
        self.state = "pending"
        self.active_s = self.paused_s = 0.0
        self.samples = []  # (active seconds, epochs done)
        self.concurrency = []  # running jobs seen at each poll
        self.returncode = None

    def l0_dir(self):
        return os.path.join(self.out, "lenet5" if self.run == "lenet5-noema" else self.run)

    def checkpoint(self):
        return os.path.join(self.out if self.run in CONSTRAINED else self.l0_dir(), "checkpoint.pt")

    def epochs_done(self):
        if self.run.endswith("-dense"):
            try:
                with open(self.log) as f:
                    found = DENSE_EPOCH.findall(f.read())
                return int(found[-1]) if found else 0
            except OSError:
                return 0
        import torch

        try:
            return int(torch.load(self.checkpoint(), map_location="cpu", weights_only=True, mmap=True)["epoch"])
        except Exception:  # absent, or being replaced this instant
            return self.samples[-1][1] if self.samples else 0

    def start(self):
        os.makedirs(os.path.dirname(self.log), exist_ok=True)
        log = open(self.log, "a")
        log.write("$ " + " ".join(self.command) + "\n")
        log.flush()
        self.proc = subprocess.Popen(
            self.command, stdout=log, stderr=subprocess.STDOUT, cwd=REPO, start_new_session=True
        )
        self.state = "running"

    def signal(self, sig):
        try:
            os.killpg(self.proc.pid, sig)
        except ProcessLookupError:
            pass

    def recent_rate(self, window=90.0):
        """Epochs per active second over the last ``window`` active seconds (None until measurable)."""
        if len(self.samples) < 2:
            return None
        t1, e1 = self.samples[-1]
        old = [(t, e) for t, e in self.samples if t <= t1 - window] or self.samples[:1]
        t0, e0 = old[-1]
        if e1 - e0 < 1 or t1 - t0 <= 0:
            return None
        return (e1 - e0) / (t1 - t0)


def command(run, seed, args, out):
    py = sys.executable
    common = ["--device", args.device, "--threads", "1", "--seed", str(seed), "--epochs", str(args.epochs)]
    data = ["--data-dir", args.data_dir] if args.data_dir else []
    if run in PAPER_RUNS or run == "lenet5-noema":
        name = "lenet5" if run == "lenet5-noema" else run
        extra = ["--ema", "0"] if run == "lenet5-noema" else []
        graph = ["--cuda-graph"] if args.cuda_graph else []
        return [py, "experiments/paper.py", "--runs", name, *common, *data, *extra, *graph, "--out", out]
    model, target = CONSTRAINED[run]
    cmd = [py, "-m", "l0bayes", "fit", "--model", model, "--objective", "constrained", "--target-density", str(target)]
    cmd += ["--data", "fashion-mnist", *data, "--batch-size", "100", "--lr", "1e-3", *common]
    cmd += ["--ema", "0.999", "--init", "he", "--log-alpha-range", "paper", "--out", out, "--no-progress"]
    if args.cuda_graph:
        cmd.append("--cuda-graph")
    if os.path.isfile(os.path.join(out, "checkpoint.pt")):
        cmd.append("--resume")
    elif os.path.isdir(out) and os.listdir(out):
        cmd.append("--overwrite")
    return cmd


def would_miss(jobs, remaining):
    """Running jobs that would not finish in ``remaining`` seconds at their recent rates (None: not known yet)."""
    late = []
    for job in jobs:
        rate = job.recent_rate()
        if rate is None:
            return None
        if (job.epochs - job.samples[-1][1]) / rate > remaining:
            late.append(job)
    return late


def schedule(jobs, args):
    start = time.monotonic()
    deadline = start + args.deadline
    last_pause = -1e9
    last = time.monotonic()
    while True:
        now = time.monotonic()
        dt, last = now - last, now
        running = [j for j in jobs if j.state == "running"]
        finished = 0
        for job in jobs:
            if job.state == "running":
                job.active_s += dt
                job.concurrency.append(len(running))
                job.samples.append((job.active_s, job.epochs_done()))
                if job.proc.poll() is not None:
                    job.returncode = job.proc.returncode
                    job.state = "done" if job.returncode == 0 else "failed"
                    finished += 1
            elif job.state == "paused":
                job.paused_s += dt
        if now >= deadline or all(j.state in ("done", "failed") for j in jobs):
            break
        running = [j for j in jobs if j.state == "running"]
        paused = [j for j in jobs if j.state == "paused"]
        if paused:  # the GPU was found saturated: a finished job makes room for a paused one, no new one
            for job in paused[: max(finished, 1 if not running else 0)]:
                job.signal(signal.SIGCONT)
                job.state = "running"
                running.append(job)
        else:
            for job in [j for j in jobs if j.state == "pending"][: max(0, args.jobs - len(running))]:
                job.start()
                running.append(job)
        late = would_miss(running, deadline - now)
        if late and len(running) > 1 and now - last_pause >= 3 * args.poll:
            victim = max(running, key=jobs.index)  # the lowest priority running job
            victim.signal(signal.SIGSTOP)
            victim.state = "paused"
            last_pause = now
            print(f"[{now - start:5.0f} s] paused {victim.name}: {len(late)} running job(s) would miss the deadline")
        shown = [j for j in jobs if j.state != "pending"]
        progress = " ".join(f"{j.name}:{j.samples[-1][1] if j.samples else 0}{j.state[0]}" for j in shown)
        print(f"[{now - start:5.0f} s] {progress}", flush=True)
        time.sleep(args.poll)
    stop(jobs)
    return time.monotonic() - start


def stop(jobs):
    """SIGINT every unfinished job (continued first if paused), SIGKILL what is left after 20 s."""
    live = [j for j in jobs if j.state in ("running", "paused")]
    for job in live:
        if job.state == "paused":
            job.signal(signal.SIGCONT)
        job.signal(signal.SIGINT)
    end = time.monotonic() + 20
    for job in live:
        try:
            job.proc.wait(timeout=max(0.1, end - time.monotonic()))
        except subprocess.TimeoutExpired:
            job.signal(signal.SIGKILL)
            job.proc.wait()
        job.returncode = job.proc.returncode
        job.samples.append((job.active_s, job.epochs_done()))
        job.state = "stopped at deadline" if job.samples[-1][1] < job.epochs else "done"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", nargs="+", required=True, choices=ALL_RUNS, help="in priority order")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--epochs", type=int, default=200)
    parser.add_argument("--deadline", type=float, required=True, help="seconds from now")
    parser.add_argument("--jobs", type=int, default=16, help="processes at once (the GPU machine has 16 cores)")
    parser.add_argument("--poll", type=float, default=15.0)
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--device", default="cuda", help="cuda; cpu only to try the script")
    parser.add_argument("--root", default="runs/gpu-paper")
    parser.add_argument("--cuda-graph", action="store_true", help="every job replays its steps as CUDA graphs")
    args = parser.parse_args(argv)
    args.root = os.path.abspath(args.root)
    if args.data_dir:
        args.data_dir = os.path.abspath(args.data_dir)
    os.makedirs(args.root, exist_ok=True)
    path = os.path.join(args.root, "status.json")
    status = {}
    if os.path.isfile(path):  # jobs of earlier calls into the same root are kept, finished ones not rerun
        with open(path) as f:
            status = json.load(f)
    jobs = [Job(run, seed, args) for run in args.runs for seed in args.seeds]
    jobs = [j for j in jobs if status.get(j.name, {}).get("state") != "done"]
    elapsed = schedule(jobs, args)
    for job in jobs:
        if job.state == "pending":
            status.setdefault(job.name, {"run": job.run, "seed": job.seed, "state": "not started"})
            continue
        concurrency = sum(job.concurrency) / len(job.concurrency) if job.concurrency else 0
        status[job.name] = {
            "run": job.run,
            "seed": job.seed,
            "state": job.state,
            "epochs_done": job.samples[-1][1] if job.samples else 0,
            "epochs": job.epochs,
            "active_s": round(job.active_s, 1),
            "paused_s": round(job.paused_s, 1),
            "mean_concurrent_jobs": round(concurrency, 1),
            "returncode": job.returncode,
            "command": " ".join(job.command),
        }
    with open(path + ".tmp", "w") as f:
        json.dump(status, f, indent=1)
    os.replace(path + ".tmp", path)
    print(f"scheduler done after {elapsed:.0f} s; status in {path}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
