"""The CUDA-graph steps of ``benchmarks/bench_training.py --cuda-graph``, checked without a GPU.

A CUDA graph cannot contain a host synchronisation: ``.item()``, ``float()``, ``int()``, ``bool()`` or
``.tolist()`` of a device tensor. The graph body runs here on the ``meta`` device, whose tensors have
shapes but no values, so any such read raises; the models take the same branches there as on CUDA
(no open-gate count, no compact product: both are CPU-only). PyTorch's fused Adam with
``capturable=True`` is left out (it has no meta kernels; it is made for graphs). On the CPU the body
takes the same training step as the benchmark's eager step.
"""

import importlib.util
import pathlib
import sys
import types

import pytest
import torch

ROOT = pathlib.Path(__file__).resolve().parents[1]
N = 300  # training examples of the toy data set


@pytest.fixture(scope="module")
def bench():
    sys.path.insert(0, str(ROOT / "benchmarks"))  # bench_training imports its neighbour `tables`
    try:
        spec = importlib.util.spec_from_file_location(
            "bench_training_under_test", ROOT / "benchmarks" / "bench_training.py"
        )
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    return module


def _setup(bench, model_name, method, device):
    bench.MODEL = model_name
    shape = bench.MODELS[model_name][2]
    torch.manual_seed(0)
    model = bench.make_model(method, "cpu").to(device)
    x = torch.rand(N, *shape).to(device)
    y = torch.randint(0, 10, (N,)).to(device)
    return model, x, y


def _warm_prior_cache(model):
    """What the warm-up steps leave behind on CUDA: the gate prior's scalars, read once (a meta tensor has none)."""
    from l0bayes.nn import gate_prior

    for group in model._gate_set.groups:
        like = group.gates[0].log_alpha
        key = (group.temperature, group.lower, group.upper, like.dtype, like.device)
        model._priors[key] = gate_prior(
            model.prior_inclusion, temperature=group.temperature, lower=group.lower, upper=group.upper
        )


def _meta_body(bench, model_name, method, batch=20):
    model, x, y = _setup(bench, model_name, method, "meta")
    if method == "bayes":
        _warm_prior_cache(model)
    index = torch.empty(batch, dtype=torch.long, device="meta")
    total = torch.zeros((), dtype=torch.float64, device="meta")
    no_optimizer = types.SimpleNamespace(step=lambda: None)
    body = bench.graph_body(method, model, x, y, index, no_optimizer, total, N)
    return model, body


@pytest.mark.parametrize("model_name", ["mlp", "lenet5"])
@pytest.mark.parametrize("method", ["dense", "penalized", "penalized_protocol", "bayes"])
def test_graph_body_reads_nothing_back_to_the_host(bench, model_name, method):
    assert method in bench.GRAPH_METHODS
    model, body = _meta_body(bench, model_name, method)
    for _ in range(2):  # the capture follows warm-up steps: the second call must be clean too
        body()
    assert all(p.grad is not None and p.grad.device.type == "meta" for p in model.parameters())


def test_the_meta_check_catches_a_host_read(bench, monkeypatch):
    """Power of the test above: the CPU-only open-gate count (``.tolist()``) on the CUDA path would be caught."""
    from l0bayes.nn import gate_set

    counts = gate_set._Group.open_counts

    def count_everywhere(group, z):
        return (
            [int(torch.count_nonzero(v)) for v in z.split(group.sizes)] if z.device.type == "meta" else counts(group, z)
        )

    monkeypatch.setattr(gate_set._Group, "open_counts", count_everywhere)
    _, body = _meta_body(bench, "mlp", "penalized")
    with pytest.raises((RuntimeError, NotImplementedError)):
        body()


@pytest.mark.parametrize("method", ["dense", "penalized", "bayes"])
def test_graph_body_takes_the_eager_step(bench, method):
    """On the CPU, one graph body = one step of the benchmark's eager loop (same gates, same Adam update)."""
    idx = torch.arange(40, 60)
    results = []
    for kind in ("eager", "graph"):
        model, x, y = _setup(bench, "mlp", method, "cpu")
        torch.manual_seed(5)
        if kind == "eager":
            loss = float(bench.make_step(method, model, N)(x[idx], y[idx]))
        else:
            total = torch.zeros((), dtype=torch.float64)
            optimizer = torch.optim.Adam(model.parameters(), lr=bench.LR, fused=True)
            bench.graph_body(method, model, x, y, idx.clone(), optimizer, total, N)()
            loss = float(total)
        results.append((loss, [p.detach().clone() for p in model.parameters()]))
    (loss_eager, params_eager), (loss_graph, params_graph) = results
    assert loss_graph == pytest.approx(loss_eager, rel=1e-6)
    for a, b in zip(params_graph, params_eager, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)


def test_graph_step_needs_cuda(bench):
    model, x, y = _setup(bench, "mlp", "dense", "cpu")
    with pytest.raises(RuntimeError, match="CUDA"):
        bench.GraphStep("dense", model, x, y, 20)
