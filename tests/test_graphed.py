"""train(cuda_graph=True) and GraphedStep: the graphed step gives the eager step's numbers, or a clear error.

On the CPU the capture is replaced by the module itself (what the graphs replay is that module's forward and
backward), which tests everything around the capture: the random state and buffers left as they were, the
shape and evaluation-mode fallbacks, the outputs, the error when a capture fails, the argument checks.
The ``gpu``-marked tests capture real CUDA graphs and compare them with the eager step, number for number.
"""

import copy

import pytest
import torch
from residual_cnn import ResNet
from test_fused import _classifier as fused_classifier

from l0bayes.inference import Bayes, Constrained, ExpectedFlops, GraphedStep, Penalized, train
from l0bayes.inference import graphed as graphed_module
from l0bayes.models import SparseClassifier, SparseLinearRegression
from l0bayes.nn import L0MLP, L0LeNet5
from l0bayes.pruning import sparsify

NUM_DATA = 1000
OBJECTIVES = {"penalized": Penalized(), "bayes": Bayes(), "constrained": Constrained(target_density=0.5)}


def _classifier(device="cpu"):
    return fused_classifier(dtype=torch.float32, device=device)


def _batch(n=32, device="cpu", seed=2):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 20, generator=g).to(device), torch.randint(0, 3, (n,), generator=g).to(device)


def _one_step(step, model, x, y):
    model.zero_grad(set_to_none=True)
    loss, value, statistics, *data = step(x, y)
    value.backward()
    grads = [p.grad.clone() for p in model.parameters()]
    data = data[0].detach().clone() if data else None
    return loss.detach().clone(), value.detach().clone(), statistics, grads, data


@pytest.fixture
def module_capture(monkeypatch):
    """The capture replaced by the module itself; records its calls."""
    calls = []

    def capture(module, sample_args, warmup):
        calls.append([tuple(a.shape) for a in sample_args])
        return module

    monkeypatch.setattr(graphed_module, "capture", capture)
    return calls


@pytest.mark.parametrize("objective", list(OBJECTIVES))
def test_graphed_step_gives_the_eager_step_and_leaves_the_random_stream(objective, module_capture):
    eager_model = _classifier()
    graphed_model = copy.deepcopy(eager_model)
    eager = OBJECTIVES[objective].build(eager_model, NUM_DATA)
    graphed = OBJECTIVES[objective].build(graphed_model, NUM_DATA)
    step = GraphedStep(graphed)
    x, y = _batch()
    for seed in (5, 6):  # the first call captures (its warm-up leaves the random stream as it was), then replays
        torch.manual_seed(seed)
        want = _one_step(eager.step_with_data, eager_model, x, y)
        torch.manual_seed(seed)
        got = _one_step(step, graphed_model, x, y)
        torch.testing.assert_close(got[0], want[0], rtol=0, atol=0)
        torch.testing.assert_close(got[1], want[1], rtol=0, atol=0)
        assert (got[2] is None) == (want[2] is None)
        if want[2] is not None:  # the constrained objective's violation
            torch.testing.assert_close(got[2], want[2].detach(), rtol=0, atol=0)
        for a, b in zip(got[3], want[3], strict=True):
            torch.testing.assert_close(a, b, rtol=0, atol=0)
        torch.testing.assert_close(got[4], want[4], rtol=0, atol=0)  # the data term (the history's train_loss)
    assert step.graphed is True and module_capture == [[(32, 20), (32,)]]


def test_graphed_step_runs_other_shapes_and_evaluation_eagerly(module_capture):
    model = _classifier()
    objective = Penalized().build(model, NUM_DATA)
    calls = []

    def eager(x, y):
        calls.append(x.shape[0])
        return objective.step(x, y)

    step = GraphedStep(objective, eager)
    step(*_batch(32))
    captured = len(calls)  # the capture's own eager step
    step(*_batch(7))  # an epoch's smaller last minibatch
    assert calls[captured:] == [7]
    model.eval()
    step(*_batch(32))
    assert calls[captured:] == [7, 32]
    model.train()
    step(*_batch(32))  # the captured shape, in training mode: the graph (here the module) runs
    assert calls[captured:] == [7, 32, 32] and len(module_capture) == 1


def test_a_capture_that_fails_says_why(monkeypatch):
    def refuse(module, sample_args, warmup):
        raise RuntimeError("operation not permitted when stream is capturing\nmore detail")

    monkeypatch.setattr(graphed_module, "capture", refuse)
    model = _classifier()
    objective = Bayes().build(model, NUM_DATA)
    step = GraphedStep(objective)
    x, y = _batch()
    torch.manual_seed(0)
    with pytest.raises(RuntimeError, match="could not be captured as a CUDA graph .*not permitted.*without cuda_graph"):
        step(x, y)
    assert step.graphed is False
    assert torch.equal(torch.random.get_rng_state(), torch.manual_seed(0).get_state())  # the stream is untouched


def test_the_capture_keeps_no_autograd_graph_alive(monkeypatch):
    # The step run before the capture must not leave the parameters' gradient accumulators alive (on CUDA they
    # would tie the capture's backward to another stream): it runs without gradients.
    seen = []

    def capture(module, sample_args, warmup):
        seen.append(torch.is_grad_enabled())
        return module

    monkeypatch.setattr(graphed_module, "capture", capture)
    model = _classifier()
    objective = Penalized().build(model, NUM_DATA)
    grad_modes = []

    def eager(x, y):
        grad_modes.append(torch.is_grad_enabled())
        return objective.step(x, y)

    GraphedStep(objective, eager)(*_batch())
    assert grad_modes[0] is False and seen == [True]


#: Backward formulas that ask the device for a value (a zero check, a count of nonzeros): a CUDA graph's
#: capture fails on them, and the failure leaves CUDA's generator unusable for the process.
HOST_READING_BACKWARD = {
    "ProdBackward0",
    "ProdBackward1",
    "CumprodBackward0",
    "MaskedSelectBackward0",
    "NonzeroBackward0",
    "RepeatInterleaveBackward0",
}


def _backward_nodes(tensor):
    seen, stack = set(), [tensor.grad_fn]
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        stack.extend(f for f, _ in node.next_functions)
    return {type(node).__name__ for node in seen}


@pytest.mark.parametrize("network", ["mlp", "lenet5", "sparsified-resnet"])
@pytest.mark.parametrize(
    "objective, options",
    [
        ("penalized", {}),
        ("bayes", {}),
        ("constrained", {"target_density": 0.5}),
        ("constrained", {"target_density": 0.5, "per_layer": True}),
        ("constrained", {"target_flops": 0.5}),
    ],
)
def test_the_step_backward_reads_nothing_back_to_the_host(network, objective, options):
    """What the capture of the backward needs, checked on the CPU: no backward formula that reads a value back."""
    torch.manual_seed(0)
    if network == "mlp":
        net, x = L0MLP(20, (16, 8), 3), torch.randn(8, 20)
    elif network == "lenet5":
        net, x = L0LeNet5(1, 10, 28), torch.rand(4, 1, 28, 28)
    else:  # a user's residual CNN with batch norm, gated by sparsify() (its sizes follow torch-pruning's graph)
        x = torch.randn(5, 1, 8, 8)
        net = sparsify(ResNet(), example_inputs=x)
    if "target_flops" in options:
        options = {**options, "input_shape": tuple(x.shape[1:])}
    model = SparseClassifier(net, lam=0.1)
    settings = Constrained(**options) if objective == "constrained" else OBJECTIVES[objective]
    _, value, _ = settings.build(model, NUM_DATA).step(x, torch.randint(0, 3, (x.shape[0],)))
    nodes = _backward_nodes(value)
    assert "AccumulateGrad" in nodes and not nodes & HOST_READING_BACKWARD, sorted(nodes & HOST_READING_BACKWARD)


def test_the_capture_restores_buffers(module_capture):
    model = _classifier()
    model.register_buffer("steps_seen", torch.zeros(()))
    objective = Penalized().build(model, NUM_DATA)

    def counting(x, y):
        model.steps_seen.add_(1)
        return objective.step(x, y)

    GraphedStep(objective, counting)(*_batch())
    assert float(model.steps_seen) == 1.0  # the capture's eager step was undone; the call itself counted


def test_graphed_step_needs_cuda_without_the_fake_capture():
    objective = Penalized().build(_classifier(), NUM_DATA)
    with pytest.raises(RuntimeError, match="needs the minibatch on a CUDA device"):
        GraphedStep(objective)(*_batch())


def test_constrained_multipliers_move_in_place():
    model = _classifier()
    objective = Constrained(target_density=0.3).build(model, NUM_DATA)
    mu = objective.mu
    before = mu.clone()
    violation = torch.tensor([0.25])
    objective.update(violation)
    assert objective.mu is mu and torch.equal(mu, (before + objective.multiplier_lr * 0.25).clamp(min=0))
    objective.update(torch.tensor([-0.1]))  # the constraint holds: a dual restart sets it to zero
    assert objective.mu is mu and float(mu) == 0.0
    out = objective.multipliers()
    out += 1  # a copy: the caller cannot move the multipliers
    assert float(mu) == 0.0
    objective.set_multipliers(torch.tensor([0.5]))
    assert objective.mu is mu and float(mu) == 0.5
    with pytest.raises(ValueError, match="2 multipliers, this run 1"):
        objective.set_multipliers(torch.tensor([0.5, 0.5]))


def test_train_refuses_cuda_graph_where_it_cannot_apply():
    x, y = _batch(64)
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="needs a CUDA device and one process, not on cpu"):
            train(_classifier(), x, y, epochs=1, cuda_graph=True, device="auto", progress=False)
    with pytest.raises(ValueError, match="needs a CUDA device and one process, not on cpu"):
        train(_classifier(), x, y, epochs=1, cuda_graph=True, device="cpu", progress=False)
    with pytest.raises(ValueError, match="cuda_graph must be True or False"):
        train(_classifier(), x, y, epochs=1, cuda_graph="yes", progress=False)
    xr, yr = torch.randn(20, 3), torch.randn(20)
    with pytest.raises(ValueError, match="fused loss bayes_loss .* Pyro's traces"):
        train(SparseLinearRegression(3), xr, yr, epochs=1, cuda_graph=True, progress=False)


def test_cli_refuses_cuda_graph_before_writing(tmp_path, capsys):
    from l0bayes.cli import main

    out = tmp_path / "run"
    assert main(["fit", "--model", "mlp", "--epochs", "1", "--cuda-graph", "--device", "cpu", "--out", str(out)]) != 0
    assert "--cuda-graph captures CUDA graphs" in capsys.readouterr().err
    assert not out.exists()
    assert main(["fit", "--model", "linear", "--cuda-graph", "--out", str(out)]) != 0
    assert "--cuda-graph only applies to the networks" in capsys.readouterr().err
    assert not out.exists()


# ---------------------------------------------------------------------------- real CUDA graphs


@pytest.mark.gpu
@pytest.mark.parametrize("objective", list(OBJECTIVES))
@pytest.mark.parametrize("network", ["mlp", "lenet5"])
def test_cuda_graphs_give_the_eager_steps(objective, network, cuda_device):
    torch.manual_seed(1)
    if network == "mlp":
        eager_model = _classifier(cuda_device)
        batches = [_batch(32, cuda_device, seed) for seed in range(4)]
    else:
        eager_model = SparseClassifier(L0LeNet5(1, 10, 28), lam=0.1).to(cuda_device)
        g = torch.Generator().manual_seed(3)
        batches = [
            (torch.rand(16, 1, 28, 28, generator=g).to(cuda_device), torch.randint(0, 10, (16,), generator=g).cuda())
            for _ in range(4)
        ]
    graphed_model = copy.deepcopy(eager_model)
    eager = OBJECTIVES[objective].build(eager_model, NUM_DATA)
    graphed = OBJECTIVES[objective].build(graphed_model, NUM_DATA)
    step = GraphedStep(graphed)
    for k, (x, y) in enumerate(batches):  # the graph's gate draws follow the generator as the eager ones do
        torch.manual_seed(10 + k)
        want = _one_step(eager.step, eager_model, x, y)
        torch.manual_seed(10 + k)
        got = _one_step(step, graphed_model, x, y)
        assert step.graphed is True
        torch.testing.assert_close(got[1], want[1], rtol=1e-5, atol=1e-6)
        for a, b in zip(got[3], want[3], strict=True):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
        if want[2] is not None:
            eager.update(want[2].detach())
            graphed.update(got[2])
            torch.testing.assert_close(graphed.mu, eager.mu)


@pytest.mark.gpu
@pytest.mark.parametrize("objective", list(OBJECTIVES))
def test_train_with_cuda_graphs_trains_and_resumes_bit_identically(objective, cuda_device, tmp_path):
    pytest.importorskip("sklearn")
    from sklearn.datasets import load_digits

    data = load_digits()
    x = torch.tensor(data.data[:600], dtype=torch.float32) / 16.0
    y = torch.tensor(data.target[:600], dtype=torch.long)
    run = dict(
        objective=Constrained(target_density=0.8) if objective == "constrained" else objective,
        batch_size=64,  # 600 = 9 x 64 + 24: the smaller last minibatch runs eagerly
        lr=2e-2,
        device=cuda_device,
        seed=4,
        progress=False,
        cuda_graph=True,
        callbacks=[ExpectedFlops((64,))],
        test_data=(x, y),
    )

    def model():
        torch.manual_seed(0)
        return SparseClassifier(L0MLP(64, (32, 16), 10), lam=0.1)

    straight = model()
    result = train(straight, x, y, epochs=6, **run)
    # it trains (chance is 0.9); six epochs leave 0.28-0.46 over seeds on the CPU, 0.38 for Bayes on an H200
    assert result.history[-1]["test_error"] < 0.6
    first = model()
    ckpt = tmp_path / "ckpt.pt"
    train(first, x, y, epochs=3, checkpoint=str(ckpt), **run)
    torch.manual_seed(999)
    resumed = model()
    train(resumed, x, y, epochs=6, checkpoint=str(ckpt), resume=True, **run)
    for a, b in zip(straight.state_dict().values(), resumed.state_dict().values(), strict=True):
        assert torch.equal(a, b)
