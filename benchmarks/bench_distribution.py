"""Benchmark of the hard concrete distribution against torch's RelaxedBernoulli.

Times :class:`l0bayes.HardConcrete` ``rsample``, ``log_prob``, ``prob_nonzero`` and the registered
``kl_divergence(q, p)`` (``p`` a scalar prior expanded to the batch) on ``n`` independent gates,
each paired with a :class:`torch.distributions.RelaxedBernoulli` reference measured in the same
run. Every repeat times the HardConcrete op and its reference back to back (alternating which
goes first), so that noise from other processes on the machine hits both alike; the reported
ratio is the median of the per-repeat ratios, the reported seconds are medians.

Peak memory of each op is measured in a fresh ``spawn``-ed process: the increase of the peak
resident set (``VmHWM``, reset through ``/proc/self/clear_refs``) over the resident set just
before the call, on CPU; the increase of ``torch.cuda.max_memory_allocated`` on CUDA.

Example::

    python benchmarks/bench_distribution.py --sizes 1e6 1e7 --markdown
"""

import argparse
import datetime
import gc
import multiprocessing
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from contextlib import contextmanager

import torch
from tables import format_table as render_table
from torch.distributions import RelaxedBernoulli, kl_divergence

import l0bayes
from l0bayes import HardConcrete

TEMPERATURE = 2.0 / 3.0
PRIOR_LOG_ALPHA = 0.0
SEED = 0

# Targets checked at the end of the run.
RSAMPLE_RATIO_TARGET = 1.5  # HardConcrete.rsample <= 1.5x RelaxedBernoulli.rsample
KL_TARGET_N = 10**6
KL_TARGET_SECONDS = 1.0  # KL of 10^6 gate pairs

# Each benchmarked pair: (name, HardConcrete op, reference op, reference label, needs grad).
PAIRS = (
    ("rsample", "hc_rsample", "rb_rsample", "RB rsample", False),
    ("log_prob", "hc_log_prob", "rb_log_prob", "RB log_prob", False),
    ("prob_nonzero", "hc_prob_nonzero", "rb_rsample", "RB rsample", False),
    ("kl", "hc_kl", "rb_rsample", "RB rsample", False),
    ("kl fwd+bwd", "hc_kl_grad", "rb_rsample_grad", "RB rsample fwd+bwd", True),
)
GRAD_SIZES = (10**6,)  # sizes at which the gradient variant is run

# Memory measurement: a fixed mmap threshold makes glibc return freed tensors to the OS at once,
# so the resident set follows the live tensors instead of whatever the allocator keeps cached.
MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": "65536"}


# ---------------------------------------------------------------------------- the operations
def make_ops(n, dtype, device, seed=SEED):
    """Inputs and zero-argument callables for every benchmarked operation, keyed by name."""
    gen = torch.Generator(device="cpu").manual_seed(seed)
    log_alpha = torch.randn(n, generator=gen, dtype=dtype).to(device)
    temperature = torch.tensor(TEMPERATURE, dtype=dtype, device=device)

    q = HardConcrete(log_alpha, TEMPERATURE, validate_args=False)
    p = HardConcrete(torch.tensor(PRIOR_LOG_ALPHA, dtype=dtype, device=device), TEMPERATURE, validate_args=False)
    p = p.expand((n,))
    rb = RelaxedBernoulli(temperature, logits=log_alpha, validate_args=False)
    with torch.no_grad():
        z = q.rsample()  # exact zeros and ones, and interior values
        x = rb.rsample()
        _ = rb.probs  # lazily cached by torch on first use; compute it here, outside the timings

    def hc_kl_grad():
        a = log_alpha.detach().requires_grad_()
        with torch.enable_grad():
            kl = kl_divergence(HardConcrete(a, TEMPERATURE, validate_args=False), p)
            kl.sum().backward()
        return a.grad

    def rb_rsample_grad():
        a = log_alpha.detach().requires_grad_()
        with torch.enable_grad():
            s = RelaxedBernoulli(temperature, logits=a, validate_args=False).rsample()
            s.sum().backward()
        return a.grad

    ops = {
        "hc_rsample": q.rsample,
        "hc_log_prob": lambda: q.log_prob(z),
        "hc_prob_nonzero": lambda: q.prob_nonzero,
        "hc_kl": lambda: kl_divergence(q, p),
        "hc_kl_grad": hc_kl_grad,
        "rb_rsample": rb.rsample,
        "rb_log_prob": lambda: rb.log_prob(x),
        "rb_rsample_grad": rb_rsample_grad,
    }
    fractions = {
        "zero": float((z == 0).to(dtype).mean()),
        "one": float((z == 1).to(dtype).mean()),
    }
    return ops, fractions


def synchronizer(device):
    if torch.device(device).type == "cuda":
        return torch.cuda.synchronize
    return lambda: None


def time_once(fn, sync):
    """Seconds taken by one call of ``fn`` (device synchronised before each clock read)."""
    sync()
    start = time.perf_counter()
    out = fn()
    sync()
    elapsed = time.perf_counter() - start
    del out
    return elapsed


def time_pair(fn, ref, repeats, sync):
    """Interleaved timings of ``fn`` and ``ref``.

    Returns (median ``fn`` seconds, median ``ref`` seconds, median of the per-repeat ratios,
    (smallest, largest) per-repeat ratio).
    """
    time_once(fn, sync)  # warm-up
    time_once(ref, sync)
    t_fn, t_ref = [], []
    for r in range(repeats):
        if r % 2 == 0:
            t_fn.append(time_once(fn, sync))
            t_ref.append(time_once(ref, sync))
        else:
            t_ref.append(time_once(ref, sync))
            t_fn.append(time_once(fn, sync))
    ratios = [a / b for a, b in zip(t_fn, t_ref, strict=True)]
    return statistics.median(t_fn), statistics.median(t_ref), statistics.median(ratios), (min(ratios), max(ratios))


# ---------------------------------------------------------------------------- peak memory
def _read_status_kb(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise KeyError(field)


def _reset_peak_rss():
    """Reset VmHWM to the current resident set; False where the kernel does not allow it."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _memory_worker(op_name, n, dtype_name, device, no_grad, threads):
    """Run in a fresh process: peak memory increase (MB) of one call of ``op_name``."""
    torch.set_num_threads(threads)
    dtype = getattr(torch, dtype_name)
    ops, _ = make_ops(n, dtype, device)
    fn = ops[op_name]
    cuda = torch.device(device).type == "cuda"
    context = torch.no_grad() if no_grad else torch.enable_grad()
    with context:
        fn()  # warm-up: one-time allocations (caches, thread pools) are not the op's
        gc.collect()
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            before = torch.cuda.memory_allocated()
            fn()
            torch.cuda.synchronize()
            return (torch.cuda.max_memory_allocated() - before) / 2**20
        if _reset_peak_rss():
            before = _read_status_kb("VmRSS")
            fn()
            return (_read_status_kb("VmHWM") - before) / 1024
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # cannot be reset: a lower bound
        fn()
        return max(0, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024


@contextmanager
def _environment(extra):
    saved = {k: os.environ.get(k) for k in extra}
    os.environ.update(extra)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def peak_memory_mb(op_name, n, dtype, device, no_grad):
    """Peak memory increase of one call of ``op_name``, measured in a fresh spawned process."""
    ctx = multiprocessing.get_context("spawn")
    with _environment(MALLOC_ENV), ctx.Pool(1) as pool:
        return pool.apply(
            _memory_worker, (op_name, n, str(dtype).removeprefix("torch."), device, no_grad, torch.get_num_threads())
        )


# ---------------------------------------------------------------------------- reporting
def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def library_revision():
    """Git commit of the checkout that ``l0bayes`` is imported from, flagged when its sources are modified."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(l0bayes.__file__)))
    try:
        commit = subprocess.run(
            ["git", "-C", root, "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", root, "status", "--porcelain", "--", "l0bayes"], capture_output=True, text=True, check=True
        ).stdout.split("\n")
    except (OSError, subprocess.CalledProcessError):
        return "unknown (not a git checkout)"
    modified = [line[3:] for line in dirty if line.strip()]
    return commit + (f" with uncommitted changes to {', '.join(modified)}" if modified else "")


def load_average():
    return " ".join(f"{x:.2f}" for x in os.getloadavg()) if hasattr(os, "getloadavg") else "unknown"


def machine_info(device):
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    lines = [
        f"date: {datetime.datetime.now().astimezone().isoformat(timespec='seconds')}",
        f"cpu: {cpu_model()}, {cores} cores available ({os.cpu_count()} online)",
        f"python {platform.python_version()}, torch {torch.__version__}, threads {torch.get_num_threads()}",
        f"l0bayes {l0bayes.__file__}, revision {library_revision()}",
        f"device: {device}",
    ]
    if torch.device(device).type == "cuda":
        lines.append(f"gpu: {torch.cuda.get_device_name()}")
    elif torch.cuda.is_available():
        lines.append(f"gpu: {torch.cuda.get_device_name()} (unused)")
    else:
        lines.append("gpu: none")
    lines.append(f"load average at start: {load_average()}")
    return lines


def fmt_n(n):
    """``10**k`` as ``1ek``, anything else as is."""
    k = len(str(n)) - 1
    return f"1e{k}" if k > 0 and n == 10**k else str(n)


def fmt_mb(value):
    return "-" if value is None else f"{value:.1f}"


def format_table(rows, markdown):
    header = ["n", "op", "HardConcrete s", "reference", "reference s", "ratio", "HC peak MB", "ref peak MB"]
    body = [
        [
            fmt_n(r["n"]),
            r["op"],
            f"{r['t_hc']:.4f}",
            r["ref"],
            f"{r['t_ref']:.4f}",
            f"{r['ratio']:.2f}",
            fmt_mb(r["mem_hc"]),
            fmt_mb(r["mem_ref"]),
        ]
        for r in rows
    ]
    return render_table(header, body, markdown)


def check_targets(rows):
    """(description, measured, passed) for each target that this run measured."""
    checks = []
    for r in rows:
        if r["op"] == "rsample":
            description = f"rsample <= {RSAMPLE_RATIO_TARGET}x RelaxedBernoulli rsample (n={fmt_n(r['n'])})"
            checks.append((description, f"{r['ratio']:.2f}x", r["ratio"] <= RSAMPLE_RATIO_TARGET))
        if r["op"] == "kl" and r["n"] == KL_TARGET_N:
            description = f"KL of {fmt_n(KL_TARGET_N)} gate pairs < {KL_TARGET_SECONDS} s"
            checks.append((description, f"{r['t_hc']:.3f} s", r["t_hc"] < KL_TARGET_SECONDS))
    return checks


# ---------------------------------------------------------------------------- main
def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=float, nargs="+", default=[1e6, 1e7], help="numbers of gates")
    parser.add_argument(
        "--repeats", type=int, default=None, help="timed repeats per op (default: 7 up to 10^6 gates, 3 above)"
    )
    parser.add_argument("--dtype", choices=["float32", "float64"], default="float32")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's default)")
    parser.add_argument("--no-memory", action="store_true", help="skip the peak-memory subprocesses")
    parser.add_argument("--markdown", action="store_true", help="print the table as markdown")
    args = parser.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda asked for, but CUDA is not available")
    args.sizes = [int(s) for s in args.sizes]
    return args


def main(argv=None):
    args = parse_args(argv)
    dtype = getattr(torch, args.dtype)
    if args.threads:
        torch.set_num_threads(args.threads)
    sync = synchronizer(args.device)
    print("command: python " + " ".join([sys.argv[0], *(argv if argv is not None else sys.argv[1:])]))
    for line in machine_info(args.device):
        print(line)
    print(f"dtype {args.dtype}, temperature {TEMPERATURE:.4f}, log_alpha ~ N(0, 1), prior log_alpha {PRIOR_LOG_ALPHA}")
    print()

    rows = []
    for n in args.sizes:
        repeats = args.repeats or (7 if n <= 10**6 else 3)
        torch.manual_seed(SEED)
        ops, fractions = make_ops(n, dtype, args.device)
        print(
            f"n = {fmt_n(n)}: {repeats} repeats; log_prob input z has {fractions['zero']:.1%} exact zeros, "
            f"{fractions['one']:.1%} exact ones; load average {load_average()}",
            flush=True,
        )
        for name, hc_op, ref_op, ref_label, grad in PAIRS:
            if grad and n not in GRAD_SIZES:
                continue
            context = torch.enable_grad() if grad else torch.no_grad()
            with context:
                t_hc, t_ref, ratio, (lo, hi) = time_pair(ops[hc_op], ops[ref_op], repeats, sync)
            mem_hc = mem_ref = None
            if not args.no_memory:
                mem_hc = peak_memory_mb(hc_op, n, dtype, args.device, not grad)
                mem_ref = peak_memory_mb(ref_op, n, dtype, args.device, not grad)
            row = dict(n=n, op=name, t_hc=t_hc, ref=ref_label, t_ref=t_ref, ratio=ratio, mem_hc=mem_hc, mem_ref=mem_ref)
            rows.append(row)
            print(
                f"  {name:>12}: {t_hc:.4f} s vs {ref_label} {t_ref:.4f} s, ratio {ratio:.2f} ({lo:.2f}-{hi:.2f}), "
                f"peak MB {fmt_mb(mem_hc)} vs {fmt_mb(mem_ref)}",
                flush=True,
            )
        del ops
        gc.collect()

    print()
    print(f"load average at end: {load_average()}")
    print(format_table(rows, args.markdown))
    print()
    checks = check_targets(rows)
    if args.device != "cpu" or args.dtype != "float32":
        print("(targets are stated for float32 on CPU; shown for information)")
    for description, measured, passed in checks:
        print(f"{'PASS' if passed else 'FAIL'}: {description}: {measured}")
    return 0 if all(passed for _, _, passed in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
