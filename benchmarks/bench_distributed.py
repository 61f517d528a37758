"""Data-parallel throughput: ``train(objective="penalized")`` on Fashion-MNIST with 1 and K processes.

The L0 MLP 784-300-100-10 (:class:`~l0bayes.nn.L0MLP` in :class:`~l0bayes.models.SparseClassifier`,
lam 0.1) is trained with Adam (lr 1e-3) for one epoch of the 60,000 training images (flattened,
scaled to [0, 1]) by :func:`l0bayes.inference.train`, launched by ``torchrun``; ``--batch-size`` is
the *global* minibatch, so K processes take ``batch_size / K`` images each per step (DDP, gloo on
CPU, nccl on GPUs). Every process first runs a short untimed warm-up (imports, allocator), then
all ranks meet at a barrier and the timed ``train()`` call starts. Throughput = images / wall time
of that call on rank 0 (it includes DDP set-up and the end-of-epoch record, about 0.1 s).

Driver mode (default) runs the worker under ``torchrun --standalone --nproc_per_node=K`` for every K
of ``--procs``, interleaved within each repeat (order rotated), and prints images/s, speed-up and
scaling efficiency ``throughput(K) / (K * throughput(1))`` (medians over repeats)::

    python benchmarks/bench_distributed.py --procs 1 2 --repeats 3 --threads 1 --markdown
    python benchmarks/bench_distributed.py --procs 1 2 --batch-size 400 --threads 1
    python benchmarks/bench_distributed.py --device cuda --procs 1 2 4   # one GPU per process

Worker mode (what the driver launches; can be run by hand)::

    torchrun --standalone --nproc_per_node=2 benchmarks/bench_distributed.py --worker --threads 1
"""

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

import torch
from tables import format_table

LR = 1e-3
LAM = 0.1
SEED = 0


def worker(args):
    from l0bayes.data import find_fashion_mnist, load_mnist_format
    from l0bayes.inference import train
    from l0bayes.inference.distributed import DataParallelContext
    from l0bayes.models import SparseClassifier
    from l0bayes.nn import L0MLP

    if args.threads:
        torch.set_num_threads(args.threads)
    directory = args.data_dir or find_fashion_mnist()
    if directory is None:
        sys.exit("Fashion-MNIST not found: apt-get install dataset-fashion-mnist, or pass --data-dir")
    images, labels = load_mnist_format(directory, "train")
    x = images.reshape(images.shape[0], -1).to(torch.float32).div_(255.0)[: args.subset]
    y = labels[: args.subset]

    def run(xs, ys, epochs):
        torch.manual_seed(SEED)
        model = SparseClassifier(L0MLP(784, (300, 100), 10), lam=LAM)
        return train(
            model, xs, ys, objective="penalized", epochs=epochs, batch_size=args.batch_size, lr=LR,
            device=args.device, seed=SEED, progress=False, threads=None,
        )  # fmt: skip

    warm = args.batch_size * args.warmup_steps
    run(x[:warm], y[:warm], 1)  # imports, DDP set-up paths, allocator; joins the process group
    ctx = DataParallelContext(None, args.device)
    if ctx.enabled:
        torch.distributed.barrier()
    if ctx.device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    result = run(x, y, args.epochs)
    if ctx.device.type == "cuda":
        torch.cuda.synchronize()
    elapsed = time.perf_counter() - start
    components = step_components(result.model, x, y, args.batch_size // ctx.world_size, ctx)
    if ctx.is_main:
        last = result.history[-1]
        out = {
            "procs": ctx.world_size,
            "device": str(ctx.device),
            "threads": torch.get_num_threads(),
            "images": int(x.shape[0]) * args.epochs,
            "batch_size": args.batch_size,
            "seconds": elapsed,
            "images_per_s": x.shape[0] * args.epochs / elapsed,
            "epoch_wall_s": last["wall_s"],
            "train_nll_per_image": last["nll"] / x.shape[0],
            "expected_l0": last["expected_l0"],
            **components,
        }
        print(json.dumps(out), flush=True)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(out, f)


def step_components(model, x, y, local_batch, ctx, reps=50):
    """Milliseconds of one local step without DDP (forward, backward, Adam) and of the gradient all-reduce.

    Measured after the timed run, with all ranks busy at the same time (so contention shows).
    """
    import torch.distributed as dist

    model.train()
    opt = torch.optim.Adam(model.parameters(), lr=LR)
    xb, yb = x[:local_batch].to(ctx.device), y[:local_batch].to(ctx.device)

    def local_step():
        opt.zero_grad(set_to_none=True)
        nll, cost = model.penalized_loss(xb, yb, x.shape[0])
        ((nll + cost) / x.shape[0]).backward()
        opt.step()

    grads = torch.zeros(sum(p.numel() for p in model.parameters()), device=ctx.device)

    def timed(fn):
        for _ in range(5):
            fn()
        if ctx.enabled:
            dist.barrier()
        if ctx.device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(reps):
            fn()
        if ctx.device.type == "cuda":
            torch.cuda.synchronize()
        return (time.perf_counter() - start) / reps * 1e3

    out = {"local_step_ms": timed(local_step)}
    if ctx.enabled:
        out["allreduce_ms"] = timed(lambda: dist.all_reduce(grads))
        out["allreduce_floats"] = grads.numel()
    return out


def launch(k, args, json_path):
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={k}",
        os.path.abspath(__file__), "--worker", "--json", json_path, "--batch-size", str(args.batch_size),
        "--epochs", str(args.epochs), "--subset", str(args.subset), "--threads", str(args.threads),
        "--device", args.device, "--warmup-steps", str(args.warmup_steps),
    ]  # fmt: skip
    if args.data_dir:
        cmd += ["--data-dir", args.data_dir]
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads or 1))
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"torchrun with {k} processes failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    with open(json_path) as f:
        return json.load(f)


def driver(args):
    try:
        load = os.getloadavg()
    except OSError:
        load = None
    print(
        f"# bench_distributed  {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC  "
        f"python {platform.python_version()}  torch {torch.__version__}  cpus={os.cpu_count()}  "
        f"load={'n/a' if load is None else '/'.join(f'{v:.1f}' for v in load)}"
    )
    print(
        f"# device={args.device} threads/process={args.threads} global batch={args.batch_size} "
        f"images/run={args.subset * args.epochs} procs={args.procs} repeats={args.repeats}",
        flush=True,
    )
    results = {k: [] for k in args.procs}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.repeats):
            rot = r % len(args.procs)
            for k in args.procs[rot:] + args.procs[:rot]:
                res = launch(k, args, os.path.join(tmp, f"k{k}_r{r}.json"))
                results[k].append(res)
                extra = f", gradient all-reduce {res['allreduce_ms']:.2f} ms" if "allreduce_ms" in res else ""
                print(f"  repeat {r + 1}: {k} proc(s): {res['images_per_s']:,.0f} images/s ({res['seconds']:.2f} s); "
                      f"local step without DDP {res['local_step_ms']:.2f} ms{extra}", flush=True)  # fmt: skip
    base = statistics.median(res["images_per_s"] for res in results[args.procs[0]])
    base_k = args.procs[0]
    header = ("processes", "local batch", "images/s (median)", "runs", "speed-up", "scaling efficiency")
    rows = []
    for k in args.procs:
        thr = statistics.median(res["images_per_s"] for res in results[k])
        speedup = thr / base
        eff = speedup * base_k / k
        runs = ", ".join(f"{res['images_per_s']:,.0f}" for res in results[k])
        rows.append((str(k), str(args.batch_size // k), f"{thr:,.0f}", runs, f"{speedup:.2f}x", f"{eff:.0%}"))
    print(format_table(header, rows, args.markdown, width=18))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--worker", action="store_true", help="run one training (under torchrun)")
    parser.add_argument("--procs", type=int, nargs="+", default=[1, 2], help="process counts to compare")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=100, help="global minibatch (split over the processes)")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--subset", type=int, default=60_000, help="training images used (default: all)")
    parser.add_argument("--warmup-steps", type=int, default=20)
    parser.add_argument("--threads", type=int, default=1, help="torch threads per process (0: torch's default)")
    parser.add_argument("--device", default="cpu", help="cpu (gloo) or cuda (nccl, one GPU per process)")
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--json", default=None, help="worker: write rank 0's result here")
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args(argv)
    if any(args.batch_size % k for k in args.procs):
        parser.error(f"--batch-size {args.batch_size} must be divisible by every process count {args.procs}")
    if args.worker:
        worker(args)
    else:
        driver(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
