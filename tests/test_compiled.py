"""train(compile=True): the compiled step gives the eager step's numbers, in one graph, and resumes exactly.

The reference of every comparison is the eager step, which tests/test_fused.py checks against Pyro's
traces and the per-gate computations.
"""

import copy

import pytest
import torch
import torch._dynamo

from l0bayes.inference import CompiledStep, train
from l0bayes.inference.objectives import make_objective
from l0bayes.models import SparseClassifier, SparseLinearRegression
from l0bayes.nn import L0MLP, HardConcreteGate

NUM_DATA = 1000
OBJECTIVES = {"penalized": {}, "bayes": {}, "constrained": {"target_density": 0.5}}


def _classifier(dtype=torch.float32):
    torch.manual_seed(1)
    net = L0MLP(20, (16, 8), 3).to(dtype)
    with torch.no_grad():  # open, closed and undecided gates, so some draws are exactly 0 or 1
        for gate in (m for m in net.modules() if isinstance(m, HardConcreteGate)):
            gate.log_alpha.copy_(torch.linspace(-4.0, 5.0, gate.num_gates, dtype=dtype))
    return SparseClassifier(net, lam=0.1, prior_inclusion=0.3)


def _batches(count, dtype=torch.float32, n=32):
    g = torch.Generator().manual_seed(2)
    shapes = [(torch.Size([n, 20]), torch.Size([n]))] * count
    return [(torch.randn(sx, generator=g, dtype=dtype), torch.randint(0, 3, sy, generator=g)) for sx, sy in shapes]


def _steps(step, model, batches):
    """Loss, objective value and every parameter gradient of each batch (gradients zeroed in between)."""
    out = []
    for x, y in batches:
        model.zero_grad(set_to_none=True)
        loss, value, _ = step(x, y)
        value.backward()
        out.append((loss.detach(), value.detach(), [p.grad.clone() for p in model.parameters()]))
    return out


@pytest.mark.parametrize("objective", list(OBJECTIVES))
def test_compiled_step_equals_eager_step_in_one_graph(objective):
    eager_model = _classifier()
    compiled_model = copy.deepcopy(eager_model)
    batches = _batches(4)
    torch.manual_seed(5)
    eager = _steps(make_objective(objective, eager_model, NUM_DATA, **OBJECTIVES[objective]).step, eager_model, batches)
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    step = CompiledStep(make_objective(objective, compiled_model, NUM_DATA, **OBJECTIVES[objective]))
    torch.manual_seed(5)  # the eager warm-up of the caches leaves the random stream where it was
    compiled = _steps(step, compiled_model, batches)
    # A new draw every step and no recompile: the gate count and the prior's floats stay out of the graph.
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == 1
    assert not torch._dynamo.utils.counters["graph_break"]
    for (loss_e, value_e, grads_e), (loss_c, value_c, grads_c) in zip(eager, compiled, strict=True):
        torch.testing.assert_close(loss_c, loss_e, rtol=1e-5, atol=1e-4)
        torch.testing.assert_close(value_c, value_e, rtol=1e-5, atol=1e-7)
        for g_e, g_c in zip(grads_e, grads_c, strict=True):
            torch.testing.assert_close(g_c, g_e, rtol=1e-4, atol=1e-6)


def test_compiled_training_follows_the_eager_run():
    """Same draws, same history up to rounding; the last minibatch (1000 = 9 x 110 + 10) compiles a second graph."""
    g = torch.Generator().manual_seed(3)
    x, y = torch.randn(NUM_DATA, 20, generator=g), torch.randint(0, 3, (NUM_DATA,), generator=g)
    runs = {}
    for compiled in (False, True):
        torch._dynamo.reset()
        model = _classifier()
        result = train(model, x, y, objective="penalized", epochs=2, batch_size=110, lr=1e-2, progress=False,
                       compile=compiled)  # fmt: skip
        runs[compiled] = (result.history, model)
    for eager, compiled in zip(runs[False][0], runs[True][0], strict=True):
        assert compiled["mean_loss"] == pytest.approx(eager["mean_loss"], rel=1e-5)
        assert compiled["free_energy"] == pytest.approx(eager["free_energy"], rel=1e-4)
    for a, b in zip(runs[False][1].parameters(), runs[True][1].parameters(), strict=True):
        torch.testing.assert_close(b, a, rtol=1e-3, atol=1e-4)


@pytest.mark.parametrize("objective", ["penalized", "bayes"])
def test_a_second_model_with_other_settings_gets_its_own_values(objective):
    """Compiled graphs are shared between models; every setting must reach the graph as an input or a guard."""
    batches = _batches(1)
    first = _classifier()
    CompiledStep(make_objective(objective, first, NUM_DATA))(*batches[0])
    second = _classifier()
    second.lam, second.prior_inclusion = 5.0, 0.05  # other code cost and prior
    with torch.no_grad():
        second.net.fc1.weight.mul_(2.0)
    eager_copy = copy.deepcopy(second)
    torch.manual_seed(7)
    compiled = _steps(CompiledStep(make_objective(objective, second, 2 * NUM_DATA)), second, batches)
    torch.manual_seed(7)
    eager = _steps(make_objective(objective, eager_copy, 2 * NUM_DATA).step, eager_copy, batches)
    torch.testing.assert_close(compiled[0][0], eager[0][0], rtol=1e-5, atol=1e-4)
    for g_c, g_e in zip(compiled[0][2], eager[0][2], strict=True):
        torch.testing.assert_close(g_c, g_e, rtol=1e-4, atol=1e-6)


def test_compile_refuses_a_model_without_fused_losses():
    x, y = torch.randn(40, 5), torch.randn(40)
    with pytest.raises(ValueError, match="fused losses"):
        train(SparseLinearRegression(5), x, y, epochs=1, progress=False, compile=True)
    with pytest.raises(ValueError, match="fused losses"):
        CompiledStep(make_objective("bayes", SparseLinearRegression(5), 40))


def test_compile_must_be_a_bool():
    x, y = _batches(1)[0]
    with pytest.raises(ValueError, match="compile must be True or False"):
        train(_classifier(), x, y, epochs=1, progress=False, compile="yes")


@pytest.mark.slow
def test_compiled_step_equals_eager_step_in_float64():
    eager_model = _classifier(torch.float64)
    compiled_model = copy.deepcopy(eager_model)
    batches = _batches(2, torch.float64)
    torch.manual_seed(6)
    eager = _steps(make_objective("bayes", eager_model, NUM_DATA).step, eager_model, batches)
    torch._dynamo.reset()
    torch.manual_seed(6)
    compiled = _steps(CompiledStep(make_objective("bayes", compiled_model, NUM_DATA)), compiled_model, batches)
    for (loss_e, _, grads_e), (loss_c, _, grads_c) in zip(eager, compiled, strict=True):
        torch.testing.assert_close(loss_c, loss_e, rtol=1e-12, atol=1e-10)
        for g_e, g_c in zip(grads_e, grads_c, strict=True):
            torch.testing.assert_close(g_c, g_e, rtol=1e-10, atol=1e-12)


@pytest.mark.slow
def test_compiled_resume_gives_bit_identical_next_steps(tmp_path):
    g = torch.Generator().manual_seed(4)
    x, y = torch.randn(250, 20, generator=g), torch.randint(0, 3, (250,), generator=g)
    run = {"objective": "bayes", "batch_size": 60, "lr": 1e-2, "seed": 3, "progress": False, "compile": True}
    ckpt = tmp_path / "ckpt.pt"
    straight = _classifier()
    train(straight, x, y, epochs=3, **run)
    first = _classifier()
    train(first, x, y, epochs=1, checkpoint=str(ckpt), **run)
    torch._dynamo.reset()  # a new process would compile afresh
    torch.manual_seed(1234)
    resumed = _classifier()
    train(resumed, x, y, epochs=3, checkpoint=str(ckpt), resume=True, **run)
    for a, b in zip(straight.state_dict().values(), resumed.state_dict().values(), strict=True):
        assert torch.equal(a, b)
