"""Seconds per epoch of ``train()`` against a bare training loop doing the same steps (RESULTS.md, "train() overhead").

The bare loop: shuffle, index the minibatch, ``zero_grad``, the model's ``penalized_loss``, ``backward``,
fused Adam ``step``: nothing else. ``train()`` adds its objective object, the finiteness check, the
progress bookkeeping and the end-of-epoch record (free energy on up to 1000 training examples, test error,
expected FLOPs) every ``record_every`` epochs. The runs are interleaved in one process (bare, train with
``record_every=1``, train with ``record_every=10``, the order rotating from repeat to repeat) and each ratio
is the median of the per-repeat ratios. ``--clock cpu`` times this process's CPU time (robust when other
processes share the cores; 1 thread).

    python benchmarks/bench_train_overhead.py --repeats 5 --clock cpu
"""

import argparse
import functools
import os
import statistics
import time

import torch

from l0bayes.data import load_dataset
from l0bayes.inference import ExpectedFlops, train
from l0bayes.models import SparseClassifier
from l0bayes.nn import L0MLP


def workloads():
    digits = load_dataset("digits", seed=0)
    yield "digits MLP 64-100-50 (CLI default), 1258 train / 359 test", digits, (100, 50), 1e-2, 20
    try:
        fashion = load_dataset("fashion-mnist", seed=0)
    except FileNotFoundError as err:  # the Debian package dataset-fashion-mnist is not installed
        print(f"# skipped Fashion-MNIST: {err}")
        return
    g = torch.Generator().manual_seed(0)
    train_idx = torch.randperm(fashion.x_train.shape[0], generator=g)[:6000]
    test_idx = torch.randperm(fashion.x_test.shape[0], generator=g)[:1000]
    fashion.x_train, fashion.y_train = fashion.x_train[train_idx], fashion.y_train[train_idx]
    fashion.x_test, fashion.y_test = fashion.x_test[test_idx], fashion.y_test[test_idx]
    yield "Fashion-MNIST MLP 784-300-100, 6000 train / 1000 test (the full set's 6:1)", fashion, (300, 100), 1e-3, 10


def model_for(data, hidden):
    torch.manual_seed(0)
    return SparseClassifier(L0MLP(in_features=data.num_features, hidden=hidden, num_classes=data.num_classes))


CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}
clock = CLOCKS["wall"]


def bare_loop(model, x, y, epochs, lr, batch_size=100, seed=0):
    torch.manual_seed(seed)
    optimizer = torch.optim.Adam(model.parameters(), lr=lr, fused=True)
    shuffle = torch.Generator().manual_seed(seed)
    n = x.shape[0]
    model.train()
    start = clock()
    for _ in range(epochs):
        order = torch.randperm(n, generator=shuffle)
        for i in range(0, n, batch_size):
            idx = order[i : i + batch_size]
            optimizer.zero_grad(set_to_none=True)
            nll, cost = model.penalized_loss(x[idx], y[idx], n)
            loss = nll + cost
            (loss / n).backward()
            optimizer.step()
            float(loss.detach())
    return (clock() - start) / epochs


def train_epoch(model, data, epochs, lr, record_every):
    start = clock()
    train(
        model,
        data.x_train,
        data.y_train,
        objective="penalized",
        epochs=epochs,
        lr=lr,
        device="cpu",
        test_data=(data.x_test, data.y_test),
        callbacks=[ExpectedFlops(data.input_shape)],
        progress=False,
        record_every=record_every,
        threads=None,  # the count of --threads
    )
    return (clock() - start) / epochs


def bare_run(data, hidden, epochs, lr):
    return bare_loop(model_for(data, hidden), data.x_train, data.y_train, epochs, lr)


def train_run(data, hidden, epochs, lr, record_every):
    return train_epoch(model_for(data, hidden), data, epochs, lr, record_every)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--clock", choices=sorted(CLOCKS), default="wall")
    args = parser.parse_args(argv)
    global clock
    clock = CLOCKS[args.clock]
    torch.set_num_threads(args.threads)
    print(f"# clock={args.clock} threads={args.threads} load average " + " ".join(f"{v:.2f}" for v in os.getloadavg()))
    print("| workload | bare loop s/epoch | train() every epoch | ratio | train(record_every=10) | ratio |")
    print("|---|---|---|---|---|---|")
    for name, data, hidden, lr, epochs in workloads():
        runs = {
            "bare": functools.partial(bare_run, data, hidden, epochs, lr),
            "every": functools.partial(train_run, data, hidden, epochs, lr, 1),
            "ten": functools.partial(train_run, data, hidden, epochs, lr, 10),
        }
        names = list(runs)
        times = {k: [] for k in names}
        for r in range(args.repeats):
            for k in names[r % 3 :] + names[: r % 3]:
                times[k].append(runs[k]())
        ratio = {k: statistics.median(a / b for a, b in zip(times[k], times["bare"], strict=True)) for k in names}
        bare, every, ten = (statistics.median(times[k]) for k in names)
        print(
            f"| {name}, {epochs} epochs | {bare:.3f} | {every:.3f} | {ratio['every']:.3f} | {ten:.3f} | "
            f"{ratio['ten']:.3f} |",
            flush=True,
        )
    print("# load average " + " ".join(f"{v:.2f}" for v in os.getloadavg()))


if __name__ == "__main__":
    main()
