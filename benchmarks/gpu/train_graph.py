"""``train(cuda_graph=True)`` on a GPU: seconds per epoch against eager ``train()`` and a whole-step graph.

For each model (MLP 784-300-100, LeNet-5-Caffe) and objective (penalised Eq. 22, Bayes Eq. 21) at batch
100 on Fashion-MNIST's 60,000 training images (resident on the GPU), in one process:

* ``train(..., cuda_graph=True)``: the objective's forward and backward replayed as CUDA graphs
  (``l0bayes.inference.graphed``), optimiser, checks and callbacks as usual;
* ``train(...)`` eager;
* the whole-step graphs of ``benchmarks/bench_training.py`` (``GraphStep``: gather, loss, backward, fused
  capturable Adam in one graph), for the objective and for the dense network: the floor of a graphed step
  and the dense reference of the ratio.

``train()`` runs ``--epochs`` epochs with ``record_every=--epochs`` (the full record only at the last);
reported is the median wall time of epochs 2 to ``epochs - 1`` (the first pays the capture). The whole-step
graphs run the same number of full epochs after a warm-up. With ``--protocol`` the ``train()`` runs add
the paper's ``log_alpha`` projection and parameter average (``callbacks=[LogAlphaProjection(log 0.01, log 100),
ParameterAveraging(0.999)]``, what the paper's 200-epoch runs use)::

    python benchmarks/gpu/train_graph.py --epochs 4 --models mlp lenet5 --objectives penalized bayes
"""

import argparse
import json
import math
import pathlib
import statistics
import sys
import time

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
import bench_training as bt  # noqa: E402
from tables import format_table  # noqa: E402

from l0bayes.inference import LogAlphaProjection, ParameterAveraging, train  # noqa: E402


def train_epochs(method, x, y, epochs, device, protocol, **flags):
    """Median s/epoch of epochs 2..epochs-1 of ``train`` (and whether the graphs were captured)."""
    model = bt.make_model(method, device)
    callbacks = [LogAlphaProjection(math.log(0.01), math.log(100.0)), ParameterAveraging(0.999)] if protocol else []
    try:
        result = train(
            model, x, y, objective=method, epochs=epochs, batch_size=bt.BATCH_SIZE, lr=bt.LR, device=device,
            seed=bt.SEED, progress=False, threads=None, record_every=epochs, callbacks=callbacks, **flags,
        )  # fmt: skip
    except RuntimeError as err:  # a capture that failed: reported in the table
        return float("nan"), str(err).splitlines()[0][:200]
    walls = [r["wall_s"] for r in result.history[1:-1]] or [result.history[-1]["wall_s"]]
    return statistics.median(walls), None


def graph_epochs(method, x, y, epochs, device):
    """Median s/epoch of full epochs of the whole-step graph of ``bench_training``."""
    model = bt.make_model(method, device)
    step = bt.GraphStep(method, model, x, y, bt.BATCH_SIZE)
    n = x.shape[0]
    g = torch.Generator().manual_seed(bt.SEED)
    steps = n // bt.BATCH_SIZE
    bt.run_graph_steps(step, torch.randperm(n, generator=g).to(device), 50, device)
    times = [
        bt.run_graph_steps(step, torch.randperm(n, generator=g).to(device), steps, device) for _ in range(epochs - 2)
    ]
    step.check_finite()
    return statistics.median(times)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=["mlp", "lenet5"], choices=sorted(bt.MODELS))
    parser.add_argument("--objectives", nargs="+", default=["penalized", "bayes"], choices=("penalized", "bayes"))
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--protocol", action="store_true", help="train() with the paper's projection and averaging")
    parser.add_argument("--compile", action="store_true", help="also train(cuda_graph=True, compile=True)")
    parser.add_argument("--eager", action="store_true", help="also eager train() (slow: ~1.5-3 s per epoch)")
    parser.add_argument("--data-dir", default=None)
    args = parser.parse_args(argv)
    device = torch.device("cuda")
    rows = []
    for model_name in args.models:
        bt.MODEL = model_name
        _, x, y = bt.load_data(args.data_dir)
        x, y = x.to(device), y.to(device)
        n = x.shape[0]
        dense = graph_epochs("dense", x, y, args.epochs, device)
        for method in args.objectives:
            row = {"model": model_name, "objective": method, "dense_graph_s": dense}
            start = time.perf_counter()
            row["train_graph_s"], row["capture_failed"] = train_epochs(
                method, x, y, args.epochs, device, args.protocol, cuda_graph=True
            )
            row["train_graph_total_s"] = time.perf_counter() - start
            row["step_graph_s"] = graph_epochs(method, x, y, args.epochs, device)
            if args.compile:
                row["train_graph_compile_s"], _ = train_epochs(
                    method, x, y, args.epochs, device, args.protocol, cuda_graph=True, compile=True
                )
            if args.eager:
                row["train_eager_s"], _ = train_epochs(method, x, y, args.epochs, device, args.protocol)
            print(json.dumps(row), flush=True)
            rows.append(row)
    table = []
    for r in rows:
        images = n / r["train_graph_s"]
        table.append(
            (
                f"{r['model']} {r['objective']}",
                f"{r['train_graph_s']:.3f} ({r['train_graph_s'] / r['dense_graph_s']:.2f}x)",
                f"{images:,.0f}",
                f"{r['step_graph_s']:.3f} ({r['step_graph_s'] / r['dense_graph_s']:.2f}x)",
                f"{r['dense_graph_s']:.3f}",
                f"{r['train_graph_compile_s']:.3f}" if "train_graph_compile_s" in r else "-",
                f"{r['train_eager_s']:.3f} ({r['train_eager_s'] / r['train_graph_s']:.1f}x graph)"
                if "train_eager_s" in r
                else "-",
                r["capture_failed"] or "captured",
            )
        )
    head = (
        "model objective",
        "train(cuda_graph) s/epoch (x dense graph)",
        "images/s",
        "whole-step graph s/epoch",
        "dense graph s/epoch",
        "+compile s/epoch",
        "eager train s/epoch",
        "capture",
    )
    print(format_table(head, table, markdown=True))
    print(f"protocol={args.protocol}, epochs={args.epochs}, batch {bt.BATCH_SIZE}, {torch.cuda.get_device_name()}")


if __name__ == "__main__":
    main()
