"""Constrained(multiplier_optimizer=...): the multipliers ascended by a torch.optim optimiser.

SGD at step eta gives today's projected ascent at multiplier_lr=eta number for number; Adam gives a hand computation
of Adam on the step's violations, projected and restarted; its state survives a checkpoint, so that a resume is the
run trained straight; bad factories are refused saying why; the multipliers keep their shape (1,) or (L,) and stay
one tensor changed in place.
"""

import functools
import math

import pytest
import torch

from l0bayes.inference import Callback, Constrained, parameter_groups, train
from l0bayes.models import SparseClassifier, SparseLinearRegression
from l0bayes.nn import L0MLP

pytestmark = pytest.mark.filterwarnings("ignore:constrained. the gates are fixed:UserWarning")

ETA = 0.05
COMMON = dict(batch_size=16, lr=0.05, seed=3, progress=False, threads=1)


def _data():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(48, 6, generator=g)
    return x, (x[:, 0] + x[:, 1] > 0).long()


def _model():
    torch.manual_seed(0)
    return SparseClassifier(L0MLP(6, (5, 4), 2), lam=0.1)


def sgd(lr=ETA):
    return lambda p: torch.optim.SGD(p, lr=lr, maximize=True)


def adam(lr=0.1, betas=(0.9, 0.95)):
    return lambda p: torch.optim.Adam(p, lr=lr, betas=betas, maximize=True)


class Trace(Callback):
    """Records every step's violation (what the objective's update receives) and the multipliers after it."""

    def __init__(self):
        self.violations, self.multipliers = [], []

    def setup(self, run):
        objective, update = run.objective, run.objective.update

        def recording(violation):
            self.violations.append(violation.detach().clone())
            update(violation)

        objective.update = recording
        self.pointer = objective.mu.data_ptr()

    def on_step_end(self, run):
        assert run.objective.mu.data_ptr() == self.pointer  # one tensor, changed in place
        self.multipliers.append(run.objective.mu.clone())


def _run(objective, epochs=3, model=None, **kw):
    trace = Trace()
    model = _model() if model is None else model
    result = train(model, *_data(), objective=objective, epochs=epochs, callbacks=[trace], **{**COMMON, **kw})
    return result, trace


# ---------------------------------------------------------------------------- the ascent


@pytest.mark.parametrize("per_layer", [False, True])
@pytest.mark.parametrize("dual_restarts", [True, False])
def test_sgd_at_eta_is_the_projected_ascent_at_multiplier_lr_eta(per_layer, dual_restarts):
    target = [0.4, 0.3, 0.5] if per_layer else 0.3
    common = dict(target_density=target, per_layer=per_layer, dual_restarts=dual_restarts, final_phase=0.3)
    today, today_trace = _run(Constrained(multiplier_lr=ETA, **common))
    ours, our_trace = _run(Constrained(multiplier_optimizer=sgd(), **common))
    assert len(our_trace.multipliers) == 9
    assert any(float(m.max()) > 0 for m in our_trace.multipliers)  # the multipliers did move
    for a, b in zip(today_trace.multipliers, our_trace.multipliers, strict=True):
        assert torch.equal(a, b)
    assert torch.equal(today.multipliers, ours.multipliers)
    assert [r["train_loss"] for r in today.history] == [r["train_loss"] for r in ours.history]
    for a, b in zip(today.model.parameters(), ours.model.parameters(), strict=True):
        assert torch.equal(a, b)


def _hand_adam(violations, lr, betas, eps=1e-8, dual_restarts=True):
    """Adam ascending mu with gradient `violation` (float64), then mu projected onto >= 0 and restarted."""
    b1, b2 = betas
    mu = torch.zeros_like(violations[0], dtype=torch.float64)
    m, v = torch.zeros_like(mu), torch.zeros_like(mu)
    out = []
    for t, g in enumerate(violations, start=1):
        g = g.double()
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g * g
        mu = mu + lr * (m / (1 - b1**t)) / ((v / (1 - b2**t)).sqrt() + eps)
        mu = mu.clamp(min=0.0)
        if dual_restarts:
            mu = torch.where(g <= 0, torch.zeros_like(mu), mu)
        out.append(mu)
    return out


@pytest.mark.parametrize("per_layer", [False, True])
@pytest.mark.parametrize("dual_restarts", [True, False])
def test_adam_follows_a_hand_computation_on_the_recorded_violations(per_layer, dual_restarts):
    lr, betas = 0.1, (0.9, 0.95)
    objective = Constrained(
        target_density=[0.4, 0.3, 0.5] if per_layer else 0.3,
        per_layer=per_layer,
        dual_restarts=dual_restarts,
        final_phase=0.0,  # the Lagrangian at every step
        multiplier_optimizer=adam(lr, betas),
    )
    _, trace = _run(objective, epochs=4)
    want = _hand_adam(trace.violations, lr, betas, dual_restarts=dual_restarts)
    assert len(want) == 12 and any(float(m.max()) > 0.1 for m in want)
    for got, hand in zip(trace.multipliers, want, strict=True):
        torch.testing.assert_close(got.double(), hand, rtol=1e-5, atol=1e-6)


def test_the_multipliers_are_one_tensor_of_shape_one_or_one_per_constraint():
    model = _model()
    one = Constrained(target_density=0.3, multiplier_optimizer=adam()).build(model, 48)
    per_layer = Constrained(target_density=0.3, per_layer=True, multiplier_optimizer=adam()).build(model, 48)
    for objective, shape in ((one, (1,)), (per_layer, (3,))):
        assert objective.mu.shape == shape  # (1,), never 0-d: FSDP2 refuses scalar parameters
        (held,) = objective.ascent.optimizer.param_groups[0]["params"]
        assert held is objective.mu and held.shape == shape
        assert objective.multiplier_lr is None  # the optimiser sets the step
    pointer = one.mu.data_ptr()
    one.update(torch.tensor([0.2]))
    one.update(torch.tensor([0.1]))
    assert one.mu.data_ptr() == pointer and float(one.mu) > 0  # in place: a captured step reads this tensor
    one.update(torch.tensor([-0.1]))  # the constraint holds: the dual restart
    assert float(one.mu) == 0.0


def test_the_default_is_still_three_gate_steps_and_the_gates_get_their_own_group():
    model = _model()
    optimizer = torch.optim.AdamW(parameter_groups(model, gates={"lr": 1.0, "betas": (0.9, 0.95)}), lr=1e-4)
    assert [g["lr"] for g in optimizer.param_groups] == [1e-4, 1.0]
    assert optimizer.param_groups[1]["betas"] == (0.9, 0.95) and optimizer.param_groups[0]["betas"] == (0.9, 0.999)
    assert Constrained(target_density=0.3).build(model, 48, gate_lr=1.0).multiplier_lr == 3.0
    run = train(
        model,
        *_data(),
        objective=Constrained(target_density=0.3, multiplier_optimizer=adam(1.0)),
        optimizer=lambda m: torch.optim.AdamW(parameter_groups(m, gates={"lr": 1.0, "weight_decay": 0.0}), lr=1e-3),
        epochs=3,
        **COMMON,
    )
    assert run.history[-1]["gates_fixed"] and run.history[-1]["test_time_density"] <= 0.3


# ---------------------------------------------------------------------------- state and resume


def test_the_state_dict_holds_the_optimiser_and_gives_it_back():
    model = _model()
    settings = Constrained(target_density=0.3, per_layer=True, multiplier_optimizer=adam())
    first = settings.build(model, 48)
    violations = [torch.tensor([0.3, 0.2, -0.1]), torch.tensor([0.2, 0.25, 0.1]), torch.tensor([0.1, -0.05, 0.2])]
    for v in violations:
        first.update(v)
    state = first.state_dict()
    assert state["multiplier_optimizer"]["description"]["type"] == "Adam"
    assert all(t.device.type == "cpu" for t in state["multiplier_optimizer"]["state"]["state"][0].values())
    second = settings.build(model, 48)
    second.load_state_dict(state)
    assert torch.equal(second.mu, first.mu)
    for key, value in first.ascent.optimizer.state[first.mu].items():
        assert torch.equal(second.ascent.optimizer.state[second.mu][key], value)
    for v in (torch.tensor([0.3, 0.1, 0.2]), torch.tensor([0.1, 0.1, -0.2])):
        first.update(v)
        second.update(v)
        assert torch.equal(first.mu, second.mu)
    first.update(torch.tensor([0.5, 0.5, 0.5]))  # the saved state is a copy: it did not move with the run
    assert state["mu"].tolist() != first.mu.tolist()
    assert Constrained(target_density=0.3).build(model, 48).state_dict()["multiplier_optimizer"] is None


@pytest.mark.parametrize(
    ("first", "then", "final_phase"),
    [(2, 4, 0.0), (2, 4, 0.3), (4, 6, 0.3)],
    ids=["no-final-phase", "resumed-from-before-the-final-phase", "across-the-final-phase"],
)
def test_a_resume_is_the_run_trained_straight_bit_for_bit(tmp_path, first, then, final_phase):
    objective = Constrained(target_density=0.3, final_phase=final_phase, multiplier_optimizer=adam())
    straight, straight_trace = _run(objective, epochs=then)
    path = str(tmp_path / "run.pt")
    _run(objective, epochs=first, checkpoint=path)
    torch.manual_seed(99)  # the resume restores the random state
    resumed, resumed_trace = _run(objective, epochs=then, checkpoint=path, resume=True)
    steps = len(resumed_trace.multipliers)  # from the checkpoint, or from its state before the final phase
    assert steps % 3 == 0 and 3 * (then - first) <= steps < 3 * then
    for a, b in zip(straight_trace.multipliers[-steps:], resumed_trace.multipliers, strict=True):
        assert torch.equal(a, b)
    assert torch.equal(straight.multipliers, resumed.multipliers)
    assert [r["train_loss"] for r in straight.history] == [r["train_loss"] for r in resumed.history]
    assert [r["multipliers"] for r in straight.history] == [r["multipliers"] for r in resumed.history]
    for a, b in zip(straight.model.state_dict().values(), resumed.model.state_dict().values(), strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize(
    ("saved", "asked", "words"),
    [
        (adam(), None, r"stepped by the optimiser .*Adam.*, this run's by projected gradient ascent"),
        (None, adam(), r"stepped by projected gradient ascent \(multiplier_optimizer=None\), this run's by"),
        (adam(0.1), adam(0.2), r"stepped by .*'lr': 0.1.*, this run's multiplier_optimizer is .*'lr': 0.2"),
        (adam(), sgd(), r"stepped by .*Adam.*, this run's multiplier_optimizer is .*SGD"),
    ],
)
def test_a_resume_with_another_multiplier_step_is_refused(tmp_path, saved, asked, words):
    path = str(tmp_path / "run.pt")
    _run(Constrained(target_density=0.3, final_phase=0.0, multiplier_optimizer=saved), epochs=2, checkpoint=path)
    with pytest.raises(ValueError, match=words):
        _run(Constrained(target_density=0.3, final_phase=0.0, multiplier_optimizer=asked), epochs=3, checkpoint=path,
             resume=True)  # fmt: skip


# ---------------------------------------------------------------------------- errors


@pytest.mark.parametrize(
    ("factory", "error", "words"),
    [
        (torch.optim.Adam, TypeError, "must be None or a factory params -> torch.optim.Optimizer .* the class Adam"),
        ("adam", TypeError, "multiplier_optimizer must be None or a factory"),
        (1.0, TypeError, "multiplier_optimizer must be None or a factory"),
    ],
)
def test_what_is_not_a_factory_is_refused_when_the_settings_are_made(factory, error, words):
    with pytest.raises(error, match=words):
        Constrained(target_density=0.3, multiplier_optimizer=factory)


def test_multiplier_lr_and_multiplier_optimizer_do_not_go_together():
    with pytest.raises(ValueError, match="multiplier_lr=0.1 is the step of the projected ascent that "):
        Constrained(target_density=0.3, multiplier_lr=0.1, multiplier_optimizer=adam())


@pytest.mark.parametrize(
    ("factory", "error", "words"),
    [
        (lambda p: torch.optim.Adam(p, lr=0.1), ValueError, r"must ascend the multipliers \(maximize=True\)"),
        (lambda p: torch.optim.SGD(p, lr=0.1), ValueError, "SGD was built with maximize=False"),
        (lambda p: p, TypeError, "must return a torch.optim.Optimizer, got list"),
        (lambda p: torch.optim.SGD([torch.zeros(1)], lr=0.1, maximize=True), ValueError, "hold exactly the tensor"),
        (
            lambda p: torch.optim.SGD([*p, torch.zeros(1)], lr=0.1, maximize=True),
            ValueError,
            r"it holds 2 tensor\(s\)",
        ),
    ],
)
def test_what_the_factory_returns_is_checked_when_the_objective_is_built(factory, error, words):
    settings = Constrained(target_density=0.3, multiplier_optimizer=factory)
    with pytest.raises(error, match=words):
        settings.build(_model(), 48)
    with pytest.raises(error, match=words):
        train(_model(), *_data(), objective=settings, epochs=1, **COMMON)


def test_a_partial_of_an_optimiser_class_is_a_factory_and_settings_compare_by_it():
    factory = functools.partial(torch.optim.Adam, lr=1.0, betas=(0.9, 0.95), maximize=True)
    a = Constrained(target_density=0.3, multiplier_optimizer=factory)
    assert a == Constrained(target_density=0.3, multiplier_optimizer=factory)
    assert a != Constrained(target_density=0.3)
    assert "multiplier_optimizer=functools.partial" in repr(a)
    assert a.build(_model(), 48).ascent.optimizer.defaults["lr"] == 1.0


def test_a_linear_regression_with_an_adam_ascent_meets_its_target():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(200, 10, generator=g)
    y = x[:, :3] @ torch.tensor([2.0, -1.5, 1.0]) + 0.5 * torch.randn(200, generator=g)
    torch.manual_seed(0)
    run = train(SparseLinearRegression(10), x, y, epochs=6, batch_size=50, lr=0.05, seed=3, progress=False,
                objective=Constrained(target_density=0.3, multiplier_optimizer=adam(0.1)))  # fmt: skip
    assert run.history[-1]["test_time_density"] <= 0.3 + 1e-9 and math.isfinite(run.history[-1]["train_loss"])


# ---------------------------------------------------------------------------- CUDA graphs


@pytest.mark.gpu
def test_with_cuda_graphs_the_captured_step_reads_the_stepped_multipliers_and_a_resume_is_exact(cuda_device, tmp_path):
    x, y = (t.to(cuda_device) for t in _data())
    run = dict(batch_size=16, lr=0.05, seed=3, progress=False, device=cuda_device, cuda_graph=True)

    def trained(objective, epochs, **kw):
        trace = Trace()
        result = train(_model(), x, y, objective=objective, epochs=epochs, callbacks=[trace], **run, **kw)
        return result, trace

    today, today_trace = trained(Constrained(target_density=0.3, multiplier_lr=ETA), 4)
    ours, our_trace = trained(Constrained(target_density=0.3, multiplier_optimizer=sgd()), 4)
    for a, b in zip(today_trace.multipliers, our_trace.multipliers, strict=True):
        torch.testing.assert_close(a, b)  # the graphed step reads the tensor the optimiser stepped
    objective = Constrained(target_density=0.3, multiplier_optimizer=adam())
    straight, _ = trained(objective, 4)
    path = str(tmp_path / "run.pt")
    trained(objective, 2, checkpoint=path)
    resumed, _ = trained(objective, 4, checkpoint=path, resume=True)
    assert torch.equal(straight.multipliers, resumed.multipliers)
    for a, b in zip(straight.model.state_dict().values(), resumed.model.state_dict().values(), strict=True):
        assert torch.equal(a, b)
