"""Where the penalised MLP step's overhead over the dense step comes from: a floor, a C++ prototype, torch.compile.

The target is a penalised step of the MLP 784-300-100 at batch 100 within 1.10x of the dense step
(``benchmarks/RESULTS.md``, "Where the floor is").
This benchmark times, interleaved in one process on the same minibatches (as ``bench_training.py``):

* ``dense``: the dense MLP's step (the reference);
* ``floor``: the dense step plus the work no gated step can avoid: the uniform noise of the 1,184 gates,
  the first layer's input scaled by its gates, and one pass over the first layer's weight gradient and
  weights for its gates' gradient, :math:`\\sum_o \\bar W_{oi} W_{oi}` (plain ATen calls, no autograd for
  the gates, no gates on the hidden layers);
* ``penalized``: the library's eager step (Eq. 22), as ``train(objective="penalized")`` takes it;
* ``penalized_cpp``: the same step with the gate draw (Eq. 10-11), Eq. 12, the first layer's gate gradient
  and the hidden layers' backward as hand-written C++ loops (``prototypes/fused_gates.cpp``, compiled on
  first use with ``torch.utils.cpp_extension``: a measurement prototype, not part of the package);
* ``penalized_compiled``: the step as ``train(objective="penalized", compile=True)`` takes it.

Before timing, the prototype's loss and gradients are checked against the eager step for the same draws.

Example::

    python benchmarks/bench_step_floor.py --threads 1 --repeats 12 --steps 150
"""

import argparse
import contextlib
import datetime
import os
import platform
import statistics
import time

import bench_training as bt
import torch
import torch.nn.functional as F

from l0bayes.nn import gate_set, gated_ops, layers

HERE = os.path.dirname(os.path.abspath(__file__))


def load_prototype():
    from torch.utils.cpp_extension import load

    return load(
        "l0bayes_fused_gates",
        [os.path.join(HERE, "prototypes", "fused_gates.cpp")],
        extra_cflags=["-O3", "-march=native"],
    )


def prototype_patches(ext):
    """Context manager factory: the library's draw, Eq. 12 and linear products replaced by the C++ prototype."""

    class Draw(torch.autograd.Function):
        @staticmethod
        def forward(ctx, log_alpha, temperature, lower, upper, offsets):
            z, s, counts = ext.gate_forward(log_alpha, torch.rand_like(log_alpha), temperature, lower, upper, offsets)
            ctx.save_for_backward(s, z)
            ctx.constants = (temperature, lower, upper)
            ctx.mark_non_differentiable(counts)
            return z, counts

        @staticmethod
        @torch.autograd.function.once_differentiable
        def backward(ctx, grad_z, _):
            s, z = ctx.saved_tensors
            return ext.gate_backward(grad_z.contiguous(), s, z, *ctx.constants), None, None, None, None

    class WeightedL0(torch.autograd.Function):
        @staticmethod
        def forward(ctx, log_alpha, weights, shift):
            ctx.save_for_backward(log_alpha, weights)
            ctx.shift = shift
            return ext.l0_forward(log_alpha, weights, shift)

        @staticmethod
        @torch.autograd.function.once_differentiable
        def backward(ctx, grad):
            log_alpha, weights = ctx.saved_tensors
            return ext.l0_backward(grad, log_alpha, weights, ctx.shift), None, None

    class FirstLayer(gated_ops._GatedInput):  # the library's forward; the gate gradient without a temporary
        @staticmethod
        @torch.autograd.function.once_differentiable
        def backward(ctx, grad_y):
            xz, z, weight = ctx.saved_tensors
            grad_w = grad_y.t().mm(xz)
            return None, ext.column_dot_div(grad_w, weight, z), grad_w, grad_y.sum(0)

    class HiddenLayer(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, z, weight, bias):
            xz = x * z
            ctx.save_for_backward(x, xz, z, weight)
            return F.linear(xz, weight, bias)

        @staticmethod
        @torch.autograd.function.once_differentiable
        def backward(ctx, grad_y):
            x, xz, z, weight = ctx.saved_tensors
            grad_x, grad_z = ext.hidden_backward(grad_y.mm(weight), x, z)
            return grad_x, grad_z, grad_y.t().mm(xz), grad_y.sum(0)

    def gated_linear(x, z, weight, bias=None, mode="auto", num_open=None):
        return (HiddenLayer if x.requires_grad else FirstLayer).apply(x, z, weight, bias)

    @contextlib.contextmanager
    def sampled(self):
        log_alphas = [group.log_alpha() for group in self.groups]
        try:
            for group, log_alpha in zip(self.groups, log_alphas, strict=True):
                offsets = group._cache.setdefault("prototype_offsets", torch.tensor(group.sizes).cumsum(0))
                z, counts = Draw.apply(log_alpha, group.temperature, group.lower, group.upper, offsets)
                for gate, value, count in zip(group.gates, z.split(group.sizes), counts.tolist(), strict=True):
                    gate._value, gate._num_open = value, count
            yield log_alphas
        finally:
            for group in self.groups:
                for gate in group.gates:
                    gate._value = gate._num_open = None

    def weighted_l0(self, log_alphas, weights):
        total = None
        for group, log_alpha in zip(self.groups, log_alphas, strict=True):
            values = [weights.get(n, 0.0) * g.group_size for n, g in zip(group.names, group.gates, strict=True)]
            term = WeightedL0.apply(
                log_alpha, group.per_gate(("l0", tuple(values)), values, log_alpha), group.log_shift
            )
            total = term if total is None else total + term
        return total

    @contextlib.contextmanager
    def patched():
        saved = (gate_set.GateSet.sampled, gate_set.GateSet.weighted_l0, layers.gated_linear)
        gate_set.GateSet.sampled, gate_set.GateSet.weighted_l0, layers.gated_linear = sampled, weighted_l0, gated_linear
        try:
            yield
        finally:
            gate_set.GateSet.sampled, gate_set.GateSet.weighted_l0, layers.gated_linear = saved

    return patched


def floor_step(num_data):
    """The dense step plus the gated step's unavoidable extra work (see the module docstring)."""
    model = bt.make_model("dense", torch.device("cpu"))
    optimizer = torch.optim.Adam(model.parameters(), lr=bt.LR, fused=True)
    fc1, rest = model.fc1, list(model.children())[2:]
    z = torch.rand(fc1.in_features, generator=torch.Generator().manual_seed(0)) + 0.5
    num_gates = sum(m.in_features for m in model.modules() if isinstance(m, torch.nn.Linear))

    def step(xb, yb):
        optimizer.zero_grad(set_to_none=True)
        torch.rand(num_gates)
        h = F.linear(xb.flatten(1) * z, fc1.weight, fc1.bias)
        for module in rest:
            h = module(h)
        loss = F.cross_entropy(h, yb) * num_data
        value = loss / num_data
        if not torch.isfinite(value):
            raise FloatingPointError("non-finite objective")
        value.backward()
        (fc1.weight.grad * fc1.weight.detach()).sum(0)
        optimizer.step()
        return float(loss.detach())

    return step


def wrapped(step, context):
    def run(xb, yb):
        with context():
            return step(xb, yb)

    return run


def check_prototype(patched, x, y, num_data):
    """The prototype's loss and gradients against the eager step for the same draws (largest relative difference)."""
    models = [bt.make_model("penalized", torch.device("cpu")) for _ in range(2)]
    results = []
    for model, context in zip(models, (contextlib.nullcontext, patched), strict=True):
        torch.manual_seed(11)
        with context():
            loss = sum(model.penalized_loss(x[:100], y[:100], num_data))
            loss.backward()
        results.append((float(loss.detach()), [p.grad for p in model.parameters()]))
    (loss_a, grads_a), (loss_b, grads_b) = results
    worst = max(float((a - b).abs().max() / a.abs().max()) for a, b in zip(grads_a, grads_b, strict=True))
    return abs(loss_a - loss_b) / abs(loss_a), worst


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=12)
    parser.add_argument("--steps", type=int, default=150, help="timed steps per method and repeat")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--subset", type=int, default=12000, help="training images the minibatches come from")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    bt.CLOCK = time.process_time
    _, x, y = bt.load_data(args.data_dir)
    x, y, num_data = x[: args.subset], y[: args.subset], x.shape[0]
    order = torch.randperm(x.shape[0], generator=torch.Generator().manual_seed(bt.SEED))
    device = torch.device("cpu")
    print(f"# bench_step_floor  {datetime.date.today()}  python {platform.python_version()}  torch {torch.__version__}")
    print(f"# MLP 784-300-100, batch {bt.BATCH_SIZE}, threads {torch.get_num_threads()}, CPU clock, {bt.load_line()}")
    t0 = time.perf_counter()
    patched = prototype_patches(load_prototype())
    print(f"# prototype compiled/loaded in {time.perf_counter() - t0:.1f} s")
    loss_diff, grad_diff = check_prototype(patched, x, y, num_data)
    print(f"# prototype against eager, same draws: loss rel. diff {loss_diff:.1e}, gradients {grad_diff:.1e}")
    steps = {
        "dense": bt.make_step("dense", bt.make_model("dense", device), num_data),
        "floor": floor_step(num_data),
        "penalized": bt.make_step("penalized", bt.make_model("penalized", device), num_data),
        "penalized_cpp": wrapped(bt.make_step("penalized", bt.make_model("penalized", device), num_data), patched),
        "penalized_compiled": bt.compiled_step("penalized", bt.make_model("penalized", device), num_data),
    }
    for step in steps.values():
        bt.run_steps(step, x, y, order, 0, 30, device)
    times = bt.interleaved(steps, x, y, order, args.repeats, args.steps, device, start=lambda r: r * args.steps)
    names = list(steps)
    print("| step | ms/step (cpu) | ratio to dense |")
    print("|---|---|---|")
    for name in names:
        ratio = statistics.median(a / b for a, b in zip(times[name], times["dense"], strict=True))
        print(f"| {name} | {statistics.median(times[name]) * 1e3:.2f} | {ratio:.2f}x |")
    print(f"# {bt.load_line()}")


if __name__ == "__main__":
    main()
