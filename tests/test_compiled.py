"""train(compile=True): the compiled step gives the eager step's numbers, in one graph, and resumes exactly.

The reference of every comparison is the eager step, which tests/test_fused.py checks against Pyro's
traces and the per-gate computations.
"""

import copy
import functools
import shutil

import pytest
import torch
import torch._dynamo
from test_fused import _classifier as fused_classifier
from torch import nn

from l0bayes.inference import (
    Bayes,
    CompiledStep,
    Constrained,
    LogAlphaProjection,
    ParameterAveraging,
    Penalized,
    train,
)
from l0bayes.models import SparseClassifier, SparseLinearRegression
from l0bayes.pruning import sparsify

# torch.compile's CPU kernels are C++ built at run time (.ci/run installs g++).
pytestmark = pytest.mark.skipif(
    not any(shutil.which(c) for c in ("g++", "c++", "clang++")), reason="torch.compile needs a C++ compiler on the CPU"
)
# The test_fused network (gates spread over open, closed and undecided), in float32 unless told.
_classifier = functools.partial(fused_classifier, dtype=torch.float32)
NUM_DATA = 1000
OBJECTIVES = {"penalized": Penalized(), "bayes": Bayes(), "constrained": Constrained(target_density=0.5)}


def _batches(count, dtype=torch.float32, n=32):
    g = torch.Generator().manual_seed(2)
    shapes = [(torch.Size([n, 20]), torch.Size([n]))] * count
    return [(torch.randn(sx, generator=g, dtype=dtype), torch.randint(0, 3, sy, generator=g)) for sx, sy in shapes]


def _steps(step, objective, model, batches):
    """Loss, objective value and every parameter gradient of each batch (gradients zeroed in between).

    After each batch the objective's update runs, so the constrained objective's multipliers move.
    """
    out = []
    for x, y in batches:
        model.zero_grad(set_to_none=True)
        loss, value, statistics, *_ = step(x, y)  # (the compiled step also gives the data term)
        value.backward()
        out.append((loss.detach(), value.detach(), [p.grad.clone() for p in model.parameters()]))
        objective.update(statistics.detach() if statistics is not None else None)
    return out


def _eager_and_compiled(objective, eager_model, compiled_model, batches, seed, num_data=NUM_DATA):
    eager = OBJECTIVES[objective].build(eager_model, num_data)
    torch.manual_seed(seed)
    eager_out = _steps(eager.step, eager, eager_model, batches)
    compiled = OBJECTIVES[objective].build(compiled_model, num_data)
    torch.manual_seed(seed)  # the eager warm-up of the caches leaves the random stream where it was
    return eager_out, _steps(CompiledStep(compiled), compiled, compiled_model, batches), compiled


@pytest.mark.parametrize("objective", list(OBJECTIVES))
def test_compiled_step_equals_eager_step_in_one_graph(objective):
    eager_model = _classifier()
    compiled_model = copy.deepcopy(eager_model)
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    eager, compiled, estimator = _eager_and_compiled(objective, eager_model, compiled_model, _batches(4), seed=5)
    # A new draw every step and no recompile: the gate count and the prior's floats stay out of the graph.
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == 1
    assert not torch._dynamo.utils.counters["graph_break"]
    if objective == "constrained":
        assert bool((estimator.mu > 0).all())  # the later steps ran with nonzero multipliers
    for (loss_e, value_e, grads_e), (loss_c, value_c, grads_c) in zip(eager, compiled, strict=True):
        torch.testing.assert_close(loss_c, loss_e, rtol=1e-5, atol=1e-4)
        torch.testing.assert_close(value_c, value_e, rtol=1e-5, atol=1e-7)
        for g_e, g_c in zip(grads_e, grads_c, strict=True):
            torch.testing.assert_close(g_c, g_e, rtol=1e-4, atol=1e-6)


def test_the_warm_up_leaves_batch_norm_statistics_alone():
    """The discarded eager call must not move running statistics: a compiled run keeps the eager run's."""
    torch.manual_seed(3)
    net = nn.Sequential(nn.Linear(20, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 3))
    net.num_classes = 3
    eager_model = SparseClassifier(sparsify(net), lam=0.1)
    compiled_model = copy.deepcopy(eager_model)
    _eager_and_compiled("penalized", eager_model, compiled_model, _batches(2), seed=8)
    for (name, a), b in zip(eager_model.named_buffers(), compiled_model.buffers(), strict=True):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6, msg=name)
    assert int(compiled_model.net[1].num_batches_tracked) == 2


def test_compiled_training_follows_the_eager_run():
    """Same draws, same history up to rounding; the last minibatch (1000 = 9 x 110 + 10) compiles a second graph."""
    g = torch.Generator().manual_seed(3)
    x, y = torch.randn(NUM_DATA, 20, generator=g), torch.randint(0, 3, (NUM_DATA,), generator=g)
    runs = {}
    for compiled in (False, True):
        torch._dynamo.reset()
        torch._dynamo.utils.counters.clear()
        model = _classifier()
        result = train(model, x, y, objective="penalized", epochs=2, batch_size=110, lr=1e-2, progress=False,
                       compile=compiled)  # fmt: skip
        runs[compiled] = (result.history, model)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == 2
    for eager, compiled in zip(runs[False][0], runs[True][0], strict=True):
        assert compiled["mean_loss"] == pytest.approx(eager["mean_loss"], rel=1e-5)
        assert compiled["free_energy"] == pytest.approx(eager["free_energy"], rel=1e-4)
    for a, b in zip(runs[False][1].parameters(), runs[True][1].parameters(), strict=True):
        torch.testing.assert_close(b, a, rtol=1e-3, atol=1e-4)


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:constrained. the gates are fixed")
def test_compiled_constrained_run_with_the_paper_protocol_follows_the_eager_run():
    """The final phase's fixed gates, the log_alpha projection and the parameter average around compiled steps."""
    g = torch.Generator().manual_seed(5)
    x, y = torch.randn(400, 20, generator=g), torch.randint(0, 3, (400,), generator=g)
    settings = {"objective": Constrained(target_density=0.5, final_phase=0.34), "epochs": 3, "batch_size": 100,
                "lr": 1e-2, "progress": False}  # fmt: skip
    runs = {}
    for compiled in (False, True):
        model = _classifier()
        protocol = [LogAlphaProjection(-4.6, 4.6), ParameterAveraging(0.9)]  # each run its own
        runs[compiled] = train(model, x, y, compile=compiled, callbacks=protocol, **settings).history
    for eager, compiled in zip(runs[False], runs[True], strict=True):
        for key in ("mean_loss", "free_energy", "constraint", "test_time_density"):
            assert compiled[key] == pytest.approx(eager[key], rel=1e-4), key


@pytest.mark.parametrize("objective", ["penalized", "bayes"])
def test_a_second_model_with_other_settings_gets_its_own_values(objective):
    """Compiled graphs are shared between models; every setting must reach the graph as an input or a guard."""
    batches = _batches(1)
    first = _classifier()
    CompiledStep(OBJECTIVES[objective].build(first, NUM_DATA))(*batches[0])
    second = _classifier()
    second.lam, second.prior_inclusion = 5.0, 0.05  # other code cost and prior
    with torch.no_grad():
        second.net.fc1.weight.mul_(2.0)
    eager, compiled, _ = _eager_and_compiled(objective, copy.deepcopy(second), second, batches, 7, 2 * NUM_DATA)
    torch.testing.assert_close(compiled[0][0], eager[0][0], rtol=1e-5, atol=1e-4)
    for g_c, g_e in zip(compiled[0][2], eager[0][2], strict=True):
        torch.testing.assert_close(g_c, g_e, rtol=1e-4, atol=1e-6)


def test_compile_refuses_a_model_without_fused_losses():
    x, y = torch.randn(40, 5), torch.randn(40)
    model = SparseLinearRegression(5)
    state = copy.deepcopy(model.state_dict())
    rng = torch.get_rng_state()
    with pytest.raises(ValueError, match="fused loss bayes_loss"):
        train(model, x, y, epochs=1, progress=False, compile=True)
    assert torch.equal(torch.get_rng_state(), rng)  # refused before anything was touched
    assert all(torch.equal(a, b) for a, b in zip(state.values(), model.state_dict().values(), strict=True))
    with pytest.raises(ValueError, match="fused loss penalized_loss"):
        CompiledStep(Penalized().build(SparseLinearRegression(5), 40))


def test_compile_must_be_a_bool():
    x, y = _batches(1)[0]
    with pytest.raises(ValueError, match="compile must be True or False"):
        train(_classifier(), x, y, epochs=1, progress=False, compile="yes")


@pytest.mark.slow
def test_compiled_step_equals_eager_step_in_float64():
    eager_model = _classifier(dtype=torch.float64)
    compiled_model = copy.deepcopy(eager_model)
    batches = _batches(2, torch.float64)
    torch._dynamo.reset()
    eager, compiled, _ = _eager_and_compiled("bayes", eager_model, compiled_model, batches, seed=6)
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
