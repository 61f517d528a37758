"""Training-step benchmark on full Fashion-MNIST: gated MLP (penalised, SVI) against a dense MLP.

Times one epoch (60,000 images, minibatches of 100, flattened to 784 and scaled to [0, 1]) of the
MLP 784-300-100-10 trained with Adam (lr 1e-3) in these ways:

* ``dense``: a plain ``torch.nn`` MLP of the same size with cross-entropy (the reference);
* ``penalized``: :class:`~l0bayes.nn.L0MLP` in :class:`~l0bayes.models.SparseClassifier`, loss =
  ``nll + code cost`` from ``penalized_loss`` (Eq. 22), as ``train(objective="penalized")``;
* ``penalized_protocol``: the same plus the paper code's projection of ``log_alpha`` onto
  ``[log 0.01, log 100]`` and the parameter average (decay 0.999) after every step, as
  ``train(objective="penalized", callbacks=[LogAlphaProjection(...), ParameterAveraging(0.999)])``;
* ``bayes``: SVI on Eq. 21 with the analytic gate KL as ``train(objective="bayes")`` runs it:
  ``SparseClassifier.bayes_loss`` (all gates in one fused pass, the KL with its closed-form gradient);
* ``penalized_autograd``: ``penalized`` with the layers' products written the plain way, for a
  side-by-side measure of the hand-written ones: ``F.linear(x * z, W, b)`` and ``F.conv2d(x, W, b) * z``
  differentiated by autograd
  (no hand-written backward, no open-gate count, no conditional computation);
* ``bayes_pyro``: the same free energy through Pyro, ``TraceMeanField_ELBO().differentiable_loss(
  model.model, model.guide, ...)`` (the registered KL, the code cost as a factor), for reference.

Every method uses the optimiser of ``train()``, ``torch.optim.Adam(fused=True)``. ``--model lenet5``
times LeNet-5-Caffe (:class:`~l0bayes.nn.LeNet5` against :class:`~l0bayes.nn.L0LeNet5`, 1 x 28 x 28 images)
instead of the MLP.

The step loops are minimal copies of the loop in :func:`l0bayes.inference.train` (zero_grad,
loss / N, finiteness check, backward, Adam step; on a GPU the finiteness flag is read every
``ACCELERATOR_CHECK_EVERY`` steps, as ``train()`` reads it), so the timing
isolates the cost of a step. Within every repeat the methods run back to back on the same
minibatch order (the order of the methods rotates from repeat to repeat), so that load from other
processes hits all of them alike; ratios are medians of the per-repeat ratios. With ``--steps K``
only ``K`` minibatches are timed per method and repeat and the time is extrapolated to an epoch
(600 steps). Finally ``train(..., objective="penalized", progress=False)`` runs a few epochs and its
per-epoch wall time is set beside full epochs of the bare penalised loop (:func:`train_against_loop`): the
cost of the entry point's loop, callbacks and records.

Three more measurements, each its own run (``benchmarks/RESULTS.md``, "Training speed"):

* ``--curve F1 F2 ...``: the penalised step with a fraction ``F`` of fc1's input gates closed
  (their ``log_alpha`` set to -30, a random subset), conditional computation on (``"auto"``) and
  off, against the dense step of the full architecture, interleaved as above; ``--figure PATH``
  plots it;
* ``--memory``: the peak resident set of ``--steps`` training steps of each method, each in a
  fresh process (``resource.getrusage``, ``ru_maxrss``), the data loaded before the baseline;
* ``--compile``: the dense, penalised and Bayes steps as ``train(compile=True)`` takes them (the objective's
  step under :class:`~l0bayes.inference.CompiledStep`: forward, loss and backward compiled, Adam eager)
  against eager, with the first-call (compile) time and the graphs compiled;

On a GPU, ``--cuda-graph`` (CUDA only; ``benchmarks/RESULTS.md``, "GPU"): the dense, penalised (with and
without the paper code's projection and averaging) and Bayes steps each captured whole in a
``torch.cuda.CUDAGraph`` (minibatch gather from the GPU-resident data, forward, loss, backward, fused
Adam with ``capturable=True``) and replayed, against the eager steps, interleaved as above;
``--graph-compile`` adds the dense and penalised graphs with the loss under ``torch.compile`` (fewer,
fused kernels per step). At batch 100 a step is a few dozen tiny kernels, so the launch cost, which a
replay pays once, is the limit of the eager step.

Example::

    python benchmarks/bench_training.py --repeats 3 --markdown
    python benchmarks/bench_training.py --steps 200 --profile 50
    python benchmarks/bench_training.py --threads 1 --clock cpu --steps 200   # on a shared machine
    python benchmarks/bench_training.py --device cuda --cuda-graph --graph-compile --steps 300   # on a GPU
"""

import argparse
import contextlib
import cProfile
import datetime
import io
import itertools
import math
import os
import platform
import pstats
import statistics
import sys
import time

import torch
import torch.nn.functional as F
from pyro.infer import TraceMeanField_ELBO
from tables import format_table

from l0bayes.data import find_fashion_mnist, load_mnist_format
from l0bayes.inference import CompiledStep, ParameterAverage, train
from l0bayes.inference.loop import ACCELERATOR_CHECK_EVERY, FiniteCheck
from l0bayes.inference.objectives import as_objective
from l0bayes.models import SparseClassifier
from l0bayes.nn import L0MLP, MLP, L0LeNet5, LeNet5, gate_set, gates_of, layers

PAPER_BATCH_SIZE = 100
BATCH_SIZE = PAPER_BATCH_SIZE  # --batch-size
LR = 1e-3
LAM = 0.1
SEED = 0
TARGETS = {"penalized": 1.10, "bayes": 1.25}  # max ratio to dense (CPU), RESULTS.md "CPU step cost"
GPU_TARGETS = {"penalized": 1.2, "bayes": 1.4}  # max ratio to dense on a GPU, RESULTS.md "GPU"
GRAPH_TARGET_IMAGES_PER_S = 1_000_000  # the MLP's penalised step at batch 100 with CUDA graphs
METHODS = ("dense", "penalized", "penalized_autograd", "penalized_protocol", "bayes", "bayes_pyro")


# ---------------------------------------------------------------------------- data and models
#: ``--model``: the paper's MLP 784-300-100 (flattened images) or LeNet-5-Caffe (1 x 28 x 28 images).
MODELS = {
    "mlp": (lambda: MLP(784, (300, 100), 10), lambda: L0MLP(784, (300, 100), 10), (784,)),
    "lenet5": (LeNet5, L0LeNet5, (1, 28, 28)),
}
MODEL = "mlp"


def load_data(data_dir):
    directory = data_dir or find_fashion_mnist()
    if directory is None:
        sys.exit("Fashion-MNIST not found: apt-get install dataset-fashion-mnist, or pass --data-dir")
    images, labels = load_mnist_format(directory, "train")
    x = images.reshape(images.shape[0], *MODELS[MODEL][2]).to(torch.float32).div_(255.0)
    return directory, x, labels


def make_model(method, device):
    torch.manual_seed(SEED)
    dense, gated, _ = MODELS[MODEL]
    model = dense() if method == "dense" else SparseClassifier(gated(), lam=LAM)
    return model.to(device).train()


@contextlib.contextmanager
def autograd_hot_path():
    """Within the context the gated layers run the plain way: ``F.linear(x * z, W, b)`` and the convolution's
    output scaled by the gates, ``F.conv2d(x, W, b) * z``, differentiated by autograd, no open-gate count."""
    saved = (layers.gated_linear, layers.gated_conv2d, gate_set._Group.open_counts)
    layers.gated_linear = lambda x, z, weight, bias, mode, num_open: F.linear(x * z, weight, bias)
    layers.gated_conv2d = lambda x, z, weight, bias, stride, padding, dilation, mode, num_open: (
        F.conv2d(x, weight, bias, stride, padding, dilation) * z[:, None, None]
    )
    gate_set._Group.open_counts = lambda group, z: [None] * len(group.gates)
    try:
        yield
    finally:
        layers.gated_linear, layers.gated_conv2d, gate_set._Group.open_counts = saved


def finisher(model, optimizer):
    """``finish(loss, value)``: backward, the optimiser's step and ``train()``'s finiteness check (every step
    on the CPU; on an accelerator a flag on the device, read every ``ACCELERATOR_CHECK_EVERY`` steps)."""
    device = next(model.parameters()).device
    finite = FiniteCheck(1 if device.type == "cpu" else ACCELERATOR_CHECK_EVERY)
    count = itertools.count(1)

    def finish(loss, value):
        finite.observe(value)
        value.backward()
        optimizer.step()
        if finite.due(next(count)):
            finite.check()
        return loss.detach()

    return finish


def make_step(method, model, num_data):
    """A closure doing one optimisation step on ``(xb, yb)``, mirroring the loop of ``train()``."""
    # The optimiser train() uses (fused Adam) for every method, the dense reference included.
    optimizer = torch.optim.Adam(model.parameters(), lr=LR, fused=True)
    elbo = TraceMeanField_ELBO()
    backward_and_step = finisher(model, optimizer)

    def finish(loss):
        return backward_and_step(loss, loss / num_data)

    if method == "dense":

        def step(xb, yb):
            optimizer.zero_grad(set_to_none=True)
            loss = F.cross_entropy(model(xb), yb) * num_data
            return finish(loss)

    elif method == "penalized":

        def step(xb, yb):
            optimizer.zero_grad(set_to_none=True)
            nll, cost = model.penalized_loss(xb, yb, num_data)
            return finish(nll + cost)

    elif method == "penalized_autograd":

        def step(xb, yb):
            optimizer.zero_grad(set_to_none=True)
            with autograd_hot_path():
                nll, cost = model.penalized_loss(xb, yb, num_data)
                return finish(nll + cost)

    elif method == "penalized_protocol":
        # callbacks=[LogAlphaProjection(log 0.01, log 100), ParameterAveraging(0.999)]: the paper code's protocol
        log_alphas = [g.log_alpha for _, g in gates_of(model)]
        average = ParameterAverage(model, 0.999)
        low, high = math.log(0.01), math.log(100.0)

        def step(xb, yb):
            optimizer.zero_grad(set_to_none=True)
            nll, cost = model.penalized_loss(xb, yb, num_data)
            value = finish(nll + cost)
            with torch.no_grad():
                torch._foreach_clamp_min_(log_alphas, low)
                torch._foreach_clamp_max_(log_alphas, high)
            average.update()
            return value

    elif method == "bayes":

        def step(xb, yb):
            optimizer.zero_grad(set_to_none=True)
            return finish(sum(model.bayes_loss(xb, yb, num_data)))

    elif method == "bayes_pyro":

        def step(xb, yb):
            optimizer.zero_grad(set_to_none=True)
            loss = elbo.differentiable_loss(model.model, model.guide, xb, yb, num_data)
            return finish(loss)

    else:
        raise ValueError(method)
    return step


def load_line():
    """``uptime``'s load averages (the machine is shared)."""
    return "load average " + " ".join(f"{v:.2f}" for v in os.getloadavg())


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}
CLOCK, CLOCK_NAME = CLOCKS["wall"], "wall"


def run_steps(step, x, y, order, start, count, device):
    """Run ``count`` steps from minibatch ``start`` of ``order``; returns the time in seconds (``--clock``)."""
    num_batches = math.ceil(x.shape[0] / BATCH_SIZE)
    _sync(device)
    t0 = CLOCK()
    for k in range(start, start + count):
        idx = order[(k % num_batches) * BATCH_SIZE : (k % num_batches + 1) * BATCH_SIZE]
        step(x[idx].to(device, non_blocking=True), y[idx].to(device, non_blocking=True))
    _sync(device)
    return CLOCK() - t0


# ---------------------------------------------------------------------------- profiling
def profile_bayes(x, y, device, steps, top):
    """cProfile and torch.profiler of ``steps`` SVI steps (after a warm-up); returns the report text."""
    num_data = x.shape[0]
    model = make_model("bayes", device)
    step = make_step("bayes", model, num_data)
    order = torch.randperm(num_data, generator=torch.Generator().manual_seed(SEED + 1))
    run_steps(step, x, y, order, 0, 10, device)
    out = io.StringIO()
    prof = cProfile.Profile()
    prof.enable()
    run_steps(step, x, y, order, 10, steps, device)
    prof.disable()
    stats = pstats.Stats(prof, stream=out)
    out.write(f"== cProfile of {steps} SVI steps, sorted by tottime ==\n")
    stats.sort_stats("tottime").print_stats(top)
    out.write(f"== cProfile of {steps} SVI steps, sorted by cumulative time ==\n")
    stats.sort_stats("cumulative").print_stats(top)
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as tprof:
        run_steps(step, x, y, order, 10 + steps, steps, device)
    out.write(f"== torch.profiler of {steps} SVI steps (self CPU time) ==\n")
    out.write(tprof.key_averages().table(sort_by="self_cpu_time_total", row_limit=top))
    return out.getvalue()


# ---------------------------------------------------------------------------- sparsity curve
def close_fc1(model, fraction, seed=SEED):
    """Close a random ``fraction`` of fc1's input gates (``log_alpha = -30``: ``z = 0`` in every draw)."""
    fc1 = model.net.fc1
    closed = torch.randperm(fc1.num_gates, generator=torch.Generator().manual_seed(seed + 7))
    with torch.no_grad():
        fc1.gate.log_alpha[closed[: round(fraction * fc1.num_gates)]] = -30.0


def closed_fraction(model, draws=200):
    """Mean fraction of fc1's gates drawn exactly 0 (Eq. 10-11)."""
    gate = model.net.fc1.gate
    with torch.no_grad():
        return statistics.fmean(float((gate() == 0).double().mean()) for _ in range(draws))


def sparsity_curve(x, y, fractions, steps, repeats, warmup, device):
    """Per fraction: ms/step of dense and the penalised step with conditional computation auto, on and off."""
    num_data = x.shape[0]
    rows = []
    for fraction in fractions:
        variants = {"dense": make_model("dense", device)}
        for name, mode in (("auto", "auto"), ("on", True), ("off", False)):
            model = make_model("penalized", device)
            close_fc1(model, fraction)
            for layer in (model.net.fc1, model.net.fc2, model.net.fc3):
                layer.set_conditional(mode)
            variants[name] = model
        names = list(variants)
        step_fns = {m: make_step("dense" if m == "dense" else "penalized", variants[m], num_data) for m in names}
        shuffle = torch.Generator().manual_seed(SEED)
        warm = torch.randperm(num_data, generator=shuffle)
        for m in names:
            run_steps(step_fns[m], x, y, warm, 0, warmup, device)

        def order(r, shuffle=shuffle):  # a new permutation per repeat
            return torch.randperm(num_data, generator=shuffle)

        times = interleaved(step_fns, x, y, order, repeats, steps, device)
        ratio = {m: statistics.median([a / b for a, b in zip(times[m], times["dense"], strict=True)]) for m in names}
        realised = closed_fraction(variants["auto"].train())
        rows.append((fraction, realised, {m: statistics.median(times[m]) for m in names}, ratio))
        print(
            f"  closed fc1 fraction {fraction:.2f} (drawn zero {realised:.3f}): "
            + "  ".join(f"{m} {statistics.median(times[m]) * 1e3:.2f} ms ({ratio[m]:.2f}x)" for m in names),
            flush=True,
        )
    return rows


def plot_curve(rows, path, title):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if os.path.exists(path):
        sys.exit(f"{path} exists; not overwriting it")
    fig, ax = plt.subplots(figsize=(5.5, 3.6))
    realised = [r[1] for r in rows]
    for m, label in (
        ("auto", "penalised, conditional computation (auto)"),
        ("on", "penalised, conditional computation (always)"),
        ("off", "penalised, full products"),
    ):
        ax.plot(realised, [r[3][m] for r in rows], marker="o", label=label)
    ax.axhline(1.0, color="k", lw=0.8, ls="--", label="dense (full architecture)")
    ax.axhline(0.9, color="grey", lw=0.8, ls=":", label="target 0.9x at >= 40% closed")
    ax.set_xlabel("fraction of fc1's input gates drawn 0")
    ax.set_ylabel("step time / dense step time")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


# ---------------------------------------------------------------------------- peak memory
def _peak_rss_worker(method, steps, threads, data_dir, queue):
    import resource

    torch.set_num_threads(threads)
    _, x, y = load_data(data_dir)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    device = torch.device("cpu")
    model = make_model(method, device)
    step = make_step(method, model, x.shape[0])
    order = torch.randperm(x.shape[0], generator=torch.Generator().manual_seed(SEED))
    run_steps(step, x, y, order, 0, steps, device)
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    queue.put((before / 1024.0, after / 1024.0))


def peak_rss(methods, steps, threads, data_dir):
    """``{method: (MB after loading the data, MB peak after the steps)}``, each method in a fresh process."""
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    out = {}
    for method in methods:
        queue = ctx.Queue()
        proc = ctx.Process(target=_peak_rss_worker, args=(method, steps, threads, data_dir, queue))
        proc.start()
        out[method] = queue.get()
        proc.join()
    return out


# ---------------------------------------------------------------------------- torch.compile
def compiled_step(method, model, num_data):
    """A step as ``train(compile=True)`` takes it: the objective's step under :class:`CompiledStep`, backward, Adam."""
    optimizer = torch.optim.Adam(model.parameters(), lr=LR, fused=True)
    if method == "dense":
        compiled = torch.compile(lambda xb, yb: F.cross_entropy(model(xb), yb) * num_data, dynamic=False)

        def loss_and_value(xb, yb):
            loss = compiled(xb, yb)
            return loss, loss / num_data

    else:
        objective = CompiledStep(as_objective(method).build(model, num_data))

        def loss_and_value(xb, yb):
            return objective(xb, yb)[:2]

    finish = finisher(model, optimizer)

    def step(xb, yb):
        optimizer.zero_grad(set_to_none=True)
        return finish(*loss_and_value(xb, yb))

    return step


COMPILE_EVAL_METHODS = ("dense", "penalized", "bayes")


def compile_eval(x, y, steps, repeats, device):
    """Eager against ``train(compile=True)``'s step (forward, loss and backward compiled; Adam eager), per method."""
    import torch._dynamo

    num_data = x.shape[0]
    rows = {}
    order = torch.randperm(num_data, generator=torch.Generator().manual_seed(SEED))
    fns = {}
    for method in COMPILE_EVAL_METHODS:
        for compiled in (False, True):
            model = make_model(method, device)
            step = compiled_step(method, model, num_data) if compiled else make_step(method, model, num_data)
            key = (method, "compiled" if compiled else "eager")
            counters_before = dict(torch._dynamo.utils.counters["stats"])
            t0 = time.perf_counter()
            run_steps(step, x, y, order, 0, 1, device)
            first = time.perf_counter() - t0
            run_steps(step, x, y, order, 1, 20, device)  # a new draw every step: no recompile may follow
            frames = torch._dynamo.utils.counters["stats"].get("unique_graphs", 0) - counters_before.get(
                "unique_graphs", 0
            )
            fns[key] = step
            rows[key] = {"first_call_s": first, "graphs": frames, "times": []}
    for key, times in interleaved(fns, x, y, order, repeats, steps, device).items():
        rows[key]["times"] = times
    dense_eager = rows[("dense", "eager")]["times"]
    for row in rows.values():
        row["ms"] = statistics.median(row["times"]) * 1e3
        row["ratio"] = statistics.median([a / b for a, b in zip(row["times"], dense_eager, strict=True)])
    return rows


def interleaved(steps_by_name, x, y, order, repeats, count, device, start=lambda r: 0):
    """``{name: [seconds per step, one per repeat]}``: each repeat runs every step function on the same
    ``count`` minibatches (from ``start(r)`` of ``order``, a permutation or a function ``r -> permutation``
    called once per repeat), in an order rotated from repeat to repeat."""
    names = list(steps_by_name)
    times = {name: [] for name in names}
    for r in range(repeats):
        permutation = order(r) if callable(order) else order
        rot = r % len(names)
        for name in names[rot:] + names[:rot]:
            times[name].append(run_steps(steps_by_name[name], x, y, permutation, start(r), count, device) / count)
    return times


# ---------------------------------------------------------------------------- CUDA graphs
GRAPH_METHODS = ("dense", "penalized", "penalized_protocol", "bayes")
COMPILE_METHODS = ("dense", "penalized")  # --graph-compile: the MLP's graph target and its reference


def graph_loss(method, model, num_data):
    """The loss of one step of ``method`` (nats) as a function of the minibatch, reading nothing back to the host.

    The loss of :func:`make_step` without its finiteness check, whose host read waits for the device, which
    a CUDA graph cannot contain (:class:`GraphStep` checks finiteness after the replays).
    The models' CUDA paths count no open gates and choose no compact product (l0bayes.nn.gate_set,
    l0bayes.nn.gated_ops), so the penalised and Bayes losses synchronise nothing either
    (tests/test_bench_graph.py runs these functions on the ``meta`` device, where any read raises).
    """
    if method == "dense":
        return lambda xb, yb: F.cross_entropy(model(xb), yb) * num_data
    if method in ("penalized", "penalized_protocol"):
        return lambda xb, yb: sum(model.penalized_loss(xb, yb, num_data))
    if method == "bayes":
        return lambda xb, yb: sum(model.bayes_loss(xb, yb, num_data))
    raise ValueError(f"no graph step for {method!r}; one of {GRAPH_METHODS}")


def graph_body(method, model, x, y, index, optimizer, total, num_data, compiled=False):
    """What the graph holds: gather ``x[index]``, ``y[index]``, loss, backward, Adam step, ``total += loss``.

    For ``penalized_protocol`` also the projection of ``log_alpha`` and the parameter average, as
    ``train(callbacks=[LogAlphaProjection(log 0.01, log 100), ParameterAveraging(0.999)])``.
    """
    loss_fn = graph_loss(method, model, num_data)
    if compiled:
        loss_fn = torch.compile(loss_fn)
    after = None
    if method == "penalized_protocol":
        log_alphas = [g.log_alpha for _, g in gates_of(model)]
        average = ParameterAverage(model, 0.999)
        low, high = math.log(0.01), math.log(100.0)

        def after():
            with torch.no_grad():
                torch._foreach_clamp_min_(log_alphas, low)
                torch._foreach_clamp_max_(log_alphas, high)
            average.update()

    def body():
        loss = loss_fn(x.index_select(0, index), y.index_select(0, index))
        (loss / num_data).backward()
        optimizer.step()
        if after is not None:
            after()
        total.add_(loss.detach())

    return body


class GraphStep:
    """One training step of ``method`` captured in a ``torch.cuda.CUDAGraph``; calling it replays the graph.

    ``x`` and ``y`` stay on the GPU; a step copies the minibatch's indices into a static buffer and
    replays (index_select, forward, loss, backward, fused Adam with ``capturable=True``, whose step
    count lives on the device). Gate noise comes from the default CUDA generator, which the capture
    registers: every replay draws new gates. The losses are summed on the device in :attr:`total`.
    """

    def __init__(self, method, model, x, y, batch_size, compiled=False, warmup=3):
        if not torch.cuda.is_available() or x.device.type != "cuda":
            raise RuntimeError("a CUDA graph step needs CUDA and the data on the GPU (--device cuda)")
        num_data = x.shape[0]
        self.model = model
        self.index = torch.zeros(batch_size, dtype=torch.long, device=x.device)
        self.total = torch.zeros((), dtype=torch.float64, device=x.device)
        self.optimizer = torch.optim.Adam(model.parameters(), lr=LR, fused=True, capturable=True)
        body = graph_body(method, model, x, y, self.index, self.optimizer, self.total, num_data, compiled)
        # Warm-up on a side stream: cuBLAS handles, compilation, the gates' and the KL's cached constants.
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for k in range(warmup):
                self.index.copy_(torch.arange(k * batch_size, (k + 1) * batch_size, device=x.device) % num_data)
                self.optimizer.zero_grad(set_to_none=True)
                body()
        torch.cuda.current_stream().wait_stream(side)
        self.optimizer.zero_grad(set_to_none=True)  # the graph's backward allocates the gradients it then reuses
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            body()
        torch.cuda.synchronize()
        self.total.zero_()

    def __call__(self, idx):
        self.index.copy_(idx)
        self.graph.replay()

    def check_finite(self):
        """Raise if the summed loss or a parameter is not finite (one read, after the timed replays)."""
        finite = (
            torch.isfinite(self.total) & torch.stack([torch.isfinite(p).all() for p in self.model.parameters()]).all()
        )
        if not bool(finite):
            raise FloatingPointError("non-finite loss or parameter in the graph replays")


def run_graph_steps(step, order, count, device):
    """``count`` replays over the minibatches of ``order`` (on the device); returns seconds."""
    num_batches = order.numel() // BATCH_SIZE  # whole minibatches: the graph's shapes are fixed
    _sync(device)
    t0 = CLOCK()
    for k in range(count):
        b = k % num_batches
        step(order[b * BATCH_SIZE : (b + 1) * BATCH_SIZE])
    _sync(device)
    return CLOCK() - t0


def graph_eval(x, y, steps, repeats, warmup, device, compile_too):
    """Per method: ms/step eager (``make_step``), as a CUDA graph, and (``compile_too``) a graph of the compiled loss.

    A variant that fails (capture, compilation) is reported with its error instead of stopping the run.
    Returns ``{(method, variant): {"times": [...], "error": str or None}}``.
    """
    num_data = x.shape[0]
    variants = ["eager", "graph"] + (["graph+compile"] if compile_too else [])
    fns, rows = {}, {}
    shuffle = torch.Generator().manual_seed(SEED)
    warm = torch.randperm(num_data, generator=shuffle).to(device)
    for method in GRAPH_METHODS:
        for variant in variants:
            if variant == "graph+compile" and method not in COMPILE_METHODS:
                continue
            key = (method, variant)
            rows[key] = {"times": [], "error": None}
            try:
                model = make_model(method, device)
                if variant == "eager":
                    step = make_step(method, model, num_data)
                    run_steps(step, x, y, warm, 0, warmup, device)
                    fns[key] = lambda order, count, step=step: run_steps(step, x, y, order, 0, count, device)
                else:
                    step = GraphStep(method, model, x, y, BATCH_SIZE, compiled=variant == "graph+compile")
                    run_graph_steps(step, warm, warmup, device)
                    fns[key] = lambda order, count, step=step: run_graph_steps(step, order, count, device)
                    rows[key]["step"] = step
            except Exception as err:  # reported in the table; the other variants go on
                rows[key]["error"] = f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"[:200]
                print(f"  {method} {variant}: FAILED {rows[key]['error']}", flush=True)
    keys = list(fns)
    for r in range(repeats):
        order = torch.randperm(num_data, generator=shuffle).to(device)
        rot = r % len(keys) if keys else 0
        for key in keys[rot:] + keys[:rot]:
            rows[key]["times"].append(fns[key](order, steps) / steps)
    for row in rows.values():
        if "step" in row:
            try:
                row.pop("step").check_finite()
            except FloatingPointError as err:
                row["error"] = str(err)
    return rows


def graph_table(rows, markdown):
    """The ``--cuda-graph`` table: ms/step, images/s, ratio to the eager dense step and to the dense graph."""
    base = {v: rows.get(("dense", v), {}).get("times") for v in ("eager", "graph", "graph+compile")}
    table = []
    for (method, variant), row in rows.items():
        if row["error"] or not row["times"]:
            table.append((method, variant, "-", "-", "-", "-", row["error"] or "not timed"))
            continue
        med = statistics.median(row["times"])

        def ratio(ref, times=row["times"]):
            return "-" if not ref else f"{statistics.median([a / b for a, b in zip(times, ref, strict=True)]):.2f}x"

        note = ""
        if method == "penalized" and variant != "eager" and MODEL == "mlp" and BATCH_SIZE == PAPER_BATCH_SIZE:
            ok = BATCH_SIZE / med >= GRAPH_TARGET_IMAGES_PER_S
            note = f"{'PASS' if ok else 'FAIL'} (>= {GRAPH_TARGET_IMAGES_PER_S:,} images/s)"
        table.append(
            (
                method,
                variant,
                f"{med * 1e3:.3f}",
                f"{BATCH_SIZE / med:,.0f}",
                ratio(base["eager"]),
                ratio(base[variant]),
                note,
            )
        )
    header = ("method", "step", "ms/step", "images/s", "/ dense eager", "/ dense same step", "note")
    return format_table(header, table, markdown)


# ---------------------------------------------------------------------------- main
TRAIN_EPOCHS = 4


def train_against_loop(x, y, loop_step, device, shuffle):
    """``train(objective="penalized")`` for ``TRAIN_EPOCHS`` epochs on the data as the loops hold it (on the GPU
    there), against full epochs of the bare penalised loop right after; one line saying both.

    Epochs 2 to ``TRAIN_EPOCHS - 1`` are compared: the first pays the warm-up (fused Adam's state, the
    allocator), the last the full record (``record_every=TRAIN_EPOCHS``: the others record the mean loss
    and wall time only). The history's ``wall_s`` runs from an epoch's start to its record.
    """
    num_data = x.shape[0]
    steps_per_epoch = math.ceil(num_data / BATCH_SIZE)
    result = train(
        make_model("penalized", device), x, y, objective="penalized", epochs=TRAIN_EPOCHS, batch_size=BATCH_SIZE,
        lr=LR, device=device, seed=SEED, progress=False, threads=None, record_every=TRAIN_EPOCHS,
    )  # fmt: skip
    walls = [r["wall_s"] for r in result.history[1:-1]]
    loops = []
    for _ in walls:
        order = torch.randperm(num_data, generator=shuffle).to(x.device)
        loops.append(run_steps(loop_step, x, y, order, 0, steps_per_epoch, device))
    wall, loop = statistics.median(walls), statistics.median(loops)
    return (
        f"train(objective='penalized', epochs={TRAIN_EPOCHS}, record_every={TRAIN_EPOCHS}, progress=False), "
        f"data on {x.device}: {wall:.3f} s/epoch (median of epochs 2-{TRAIN_EPOCHS - 1}, {CLOCK_NAME} clock) vs "
        f"{loop:.3f} s for a full epoch of the bare penalised loop just after: {wall / loop:.3f}x "
        "(train()'s target on a GPU: <= 1.05x)"
    )


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    parser.add_argument("--model", choices=sorted(MODELS), default="mlp", help="MLP 784-300-100 or LeNet-5-Caffe")
    parser.add_argument("--batch-size", type=int, default=PAPER_BATCH_SIZE, help="minibatch size (the paper's: 100)")
    parser.add_argument(
        "--steps", type=int, default=0, help="minibatches timed per method and repeat (0: a full epoch, 600)"
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=20, help="untimed steps per method before timing")
    parser.add_argument("--data-dir", default=None, help="directory with the IDX files (default: Debian package)")
    parser.add_argument("--no-train", action="store_true", help="skip timing the train() entry point")
    parser.add_argument("--profile", type=int, default=0, help="also profile this many SVI steps")
    parser.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (0: leave the default)")
    parser.add_argument("--markdown", action="store_true", help="print the table as markdown")
    parser.add_argument(
        "--curve", type=float, nargs="+", default=None, help="fractions of fc1's gates to close (only this)"
    )
    parser.add_argument("--figure", default=None, help="with --curve: write the plot here (never overwritten)")
    parser.add_argument("--memory", action="store_true", help="peak RSS per method, fresh processes")
    parser.add_argument("--compile", action="store_true", help="torch.compile against eager")
    parser.add_argument(
        "--cuda-graph", action="store_true", help="whole steps as CUDA graphs against eager (CUDA only)"
    )
    parser.add_argument(
        "--graph-compile", action="store_true", help="with --cuda-graph: also graphs of the torch.compile'd loss"
    )
    parser.add_argument(
        "--clock",
        choices=sorted(CLOCKS),
        default="wall",
        help="wall: elapsed time; cpu: CPU time of this process (robust when other processes share the cores; "
        "CPU only, meaningful with --threads 1)",
    )
    args = parser.parse_args(argv)
    global CLOCK, CLOCK_NAME, MODEL, BATCH_SIZE
    CLOCK, CLOCK_NAME = CLOCKS[args.clock], args.clock
    MODEL, BATCH_SIZE = args.model, args.batch_size
    if BATCH_SIZE < 1:
        parser.error(f"--batch-size must be positive, got {BATCH_SIZE}")
    if args.model != "mlp" and args.curve:
        parser.error("--curve times the MLP (fc1's gates); leave --model at mlp")
    if args.clock == "cpu" and args.device != "cpu":
        parser.error("--clock cpu measures CPU time and is meaningless for --device cuda")
    if (args.cuda_graph or args.graph_compile) and not (args.device.startswith("cuda") and torch.cuda.is_available()):
        parser.error("--cuda-graph captures CUDA graphs: it needs --device cuda on a machine with CUDA")
    if args.graph_compile and not args.cuda_graph:
        parser.error("--graph-compile goes with --cuda-graph")

    device = torch.device(args.device)
    if args.threads:
        torch.set_num_threads(args.threads)
    directory, x, y = load_data(args.data_dir)
    if device.type == "cuda":
        x, y = x.to(device), y.to(device)
    num_data = x.shape[0]
    steps_per_epoch = math.ceil(num_data / BATCH_SIZE)
    steps = args.steps if args.steps > 0 else steps_per_epoch

    print(f"# bench_training  {datetime.date.today()}  python {platform.python_version()}  torch {torch.__version__}")
    print(
        f"# model={args.model}  clock={args.clock}  device={device}  threads={torch.get_num_threads()}  "
        f"cpus={os.cpu_count()}  "
        f"data={directory} "
        f"N={num_data}  batch={BATCH_SIZE}  timed steps/method/repeat={steps} "
        f"({'full epoch' if steps == steps_per_epoch else f'extrapolated to {steps_per_epoch} steps'})"
    )

    print(f"# {load_line()}")
    if args.curve:
        rows = sparsity_curve(x, y, args.curve, steps, args.repeats, args.warmup, device)
        header = (
            "fc1 closed (set)",
            "drawn 0",
            "dense ms",
            "auto ms",
            "on ms",
            "off ms",
            "auto / dense",
            "on / dense",
            "off / dense",
        )
        table = [
            (f"{f:.2f}", f"{d:.3f}", *(f"{t[m] * 1e3:.2f}" for m in ("dense", "auto", "on", "off")),
             *(f"{r[m]:.2f}x" for m in ("auto", "on", "off")))
            for f, d, t, r in rows
        ]  # fmt: skip
        print(format_table(header, table, args.markdown, width=14))
        if args.figure:
            plot_curve(rows, args.figure, f"MLP 784-300-100, batch {BATCH_SIZE}, {CLOCK_NAME} clock, 1 thread")
        print(f"# {load_line()}")
        return 0
    if args.memory:
        threads = torch.get_num_threads()
        peaks = peak_rss(("dense", "penalized", "bayes"), steps, threads, args.data_dir)
        base = peaks["dense"][1]
        table = [(m, f"{b:.1f}", f"{a:.1f}", f"{a - b:.1f}", f"{a / base:.3f}x") for m, (b, a) in peaks.items()]
        print(format_table(("method", "MB after data", "peak MB", "increase MB", "peak / dense"), table, args.markdown))
        print(f"# {load_line()}")
        return 0
    if args.cuda_graph:
        rows = graph_eval(x, y, steps, args.repeats, args.warmup, device, args.graph_compile)
        print(graph_table(rows, args.markdown))
        print(f"# {load_line()}")
        return 0
    if args.compile:
        rows = compile_eval(x, y, steps, args.repeats, device)
        table = [
            (f"{m} {k}", f"{r['first_call_s']:.1f}", str(r["graphs"]), f"{r['ms']:.2f}", f"{r['ratio']:.2f}x")
            for (m, k), r in rows.items()
        ]
        header = ("step", "first call s", "graphs compiled", "ms/step", "ratio to dense eager")
        print(format_table(header, table, args.markdown, width=14))
        print(f"# {load_line()}")
        return 0

    models = {m: make_model(m, device) for m in METHODS}
    step_fns = {m: make_step(m, models[m], num_data) for m in METHODS}
    shuffle = torch.Generator().manual_seed(SEED)
    warm_order = torch.randperm(num_data, generator=shuffle)
    for m in METHODS:
        run_steps(step_fns[m], x, y, warm_order, 0, args.warmup, device)

    per_step = {m: [] for m in METHODS}
    for r in range(args.repeats):
        order = torch.randperm(num_data, generator=shuffle)
        if device.type == "cuda":
            order = order.to(device)
        rot = r % len(METHODS)
        for m in METHODS[rot:] + METHODS[:rot]:
            elapsed = run_steps(step_fns[m], x, y, order, 0, steps, device)
            per_step[m].append(elapsed / steps)
        print(
            f"  repeat {r + 1}: " + "  ".join(f"{m} {per_step[m][-1] * steps_per_epoch:.2f} s/epoch" for m in METHODS),
            flush=True,
        )

    ratios = {m: [a / b for a, b in zip(per_step[m], per_step["dense"], strict=True)] for m in METHODS}
    rows = []
    for m in METHODS:
        med = statistics.median(per_step[m])
        ratio = statistics.median(ratios[m])
        target = (TARGETS if device.type == "cpu" else GPU_TARGETS).get(m)
        verdict = "-" if target is None else ("PASS" if ratio <= target else "FAIL")
        rows.append(
            (
                m,
                f"{med * 1e3:.2f}",
                f"{med * steps_per_epoch:.2f}",
                f"{BATCH_SIZE / med:,.0f}",
                f"{ratio:.2f}x",
                "-" if target is None else f"<= {target}x",
                verdict,
            )
        )

    train_line = None if args.no_train else train_against_loop(x, y, step_fns["penalized"], device, shuffle)
    header = ("method", "ms/step", "s/epoch", "images/s", "ratio to dense", "target", "result")
    print(format_table(header, rows, args.markdown, width=14))
    if train_line is not None:
        print(train_line)
    failed = [r[0] for r in rows if r[-1] == "FAIL"]
    print("OVERALL:", "PASS" if not failed else f"FAIL ({', '.join(failed)})")

    if args.profile:
        print(profile_bayes(x, y, device, args.profile, top=25))
    return 0 if not failed else 1


if __name__ == "__main__":
    sys.exit(main())
