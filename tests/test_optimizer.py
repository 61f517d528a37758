"""train(optimizer=..., scheduler=...): factories, parameter groups, schedules, checkpoints and resume."""

import copy
import math

import pytest
import torch

from l0bayes.inference import Constrained, clipped, parameter_groups, train
from l0bayes.io import load_checkpoint
from l0bayes.models import SparseClassifier
from l0bayes.nn import L0MLP, gates_of


def _data(n=96, features=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, features, generator=g)
    y = (x[:, 0] + 0.5 * x[:, 1] > 0).long()
    return x, y


def _model(seed=0):
    torch.manual_seed(seed)
    return SparseClassifier(L0MLP(5, (8,), 2), lam=0.01)


def _sgd(lr=0.1, momentum=0.9, weight_decay=1e-3, gate_lr=0.05):
    def build(model):
        groups = parameter_groups(model, gates={"lr": gate_lr, "weight_decay": 0.0})
        return torch.optim.SGD(groups, lr=lr, momentum=momentum, weight_decay=weight_decay)

    return build


def _steps(milestones=(2, 3), gamma=0.5):
    return lambda opt: torch.optim.lr_scheduler.MultiStepLR(opt, milestones=list(milestones), gamma=gamma)


def _train(model, epochs, **kwargs):
    x, y = _data()
    kwargs = {"objective": "penalized", "batch_size": 32, "seed": 3, "progress": False, **kwargs}
    return train(model, x, y, epochs=epochs, **kwargs)


def test_parameter_groups_split_gates_from_weights():
    model = _model()
    weights, gates = parameter_groups(model, gates={"lr": 0.5}, weights={"weight_decay": 1e-4})
    log_alphas = {id(g.log_alpha) for _, g in gates_of(model)}
    assert {id(p) for p in gates["params"]} == log_alphas and gates["lr"] == 0.5
    assert {id(p) for p in weights["params"]} == {id(p) for p in model.parameters()} - log_alphas
    assert weights["weight_decay"] == 1e-4 and "lr" not in weights
    assert len(gates["params"]) + len(weights["params"]) == len(list(model.parameters()))
    # a network without gates: one group of every parameter
    (only,) = parameter_groups(torch.nn.Linear(3, 2))
    assert len(only["params"]) == 2


def test_multistep_schedule_gives_the_hand_computed_step_sizes():
    result = _train(_model(), 5, optimizer=_sgd(), scheduler=_steps((2, 3), 0.5))
    # MultiStepLR: lr_k = lr_0 * gamma ** (number of milestones <= k), k = epochs completed before epoch k + 1
    for k, record in enumerate(result.history):
        drops = sum(m <= k for m in (2, 3))
        assert record["lr"] == pytest.approx([0.1 * 0.5**drops, 0.05 * 0.5**drops], rel=1e-12)


def test_cosine_schedule_follows_its_formula():
    sched = lambda opt: torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=4, eta_min=0.01)  # noqa: E731
    result = _train(_model(), 4, optimizer=_sgd(lr=0.2, gate_lr=0.2), scheduler=sched)
    for k, record in enumerate(result.history):
        expected = 0.01 + (0.2 - 0.01) * (1 + math.cos(math.pi * k / 4)) / 2
        assert record["lr"] == pytest.approx([expected, expected], rel=1e-9)


def test_sgd_steps_match_a_hand_computed_update():
    """Two full-batch steps of SGD with momentum and weight decay, against the update rule written out."""
    lr, mu, wd, gate_lr = 0.1, 0.9, 1e-2, 0.3
    model = _model()
    reference = copy.deepcopy(model)
    x, y = _data()
    train(model, x, y, objective="penalized", epochs=2, batch_size=x.shape[0], seed=5, progress=False, device="cpu",
          optimizer=_sgd(lr, mu, wd, gate_lr))  # fmt: skip
    # the same gate draws (train() seeds torch with seed, then each step draws the gates once)
    torch.manual_seed(5)
    shuffle = torch.Generator().manual_seed(5)
    gate_ids = {id(g.log_alpha) for _, g in gates_of(reference)}
    buffers = {}
    for _ in range(2):
        order = torch.randperm(x.shape[0], generator=shuffle)
        nll, cost = reference.penalized_loss(x[order], y[order], x.shape[0])
        grads = torch.autograd.grad((nll + cost) / x.shape[0], list(reference.parameters()))
        with torch.no_grad():
            for p, g in zip(reference.parameters(), grads, strict=True):
                gate = id(p) in gate_ids
                d = g if gate else g + wd * p  # no weight decay on the gates' group
                buffers[id(p)] = d if id(p) not in buffers else mu * buffers[id(p)] + d
                p -= (gate_lr if gate else lr) * buffers[id(p)]
    for (name, a), b in zip(model.named_parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=name)


def test_resume_with_optimizer_and_schedule_is_bit_identical(tmp_path):
    ckpt = tmp_path / "ckpt.pt"
    straight = _model()
    full = _train(straight, 5, optimizer=_sgd(), scheduler=_steps())
    _train(_model(), 2, optimizer=_sgd(), scheduler=_steps(), checkpoint=str(ckpt))
    state = load_checkpoint(ckpt)  # weights_only=True
    assert state["scheduler"]["last_epoch"] == 2 and "momentum_buffer" in str(state["optimizer"]["state"])
    resumed = _model(seed=11)  # other initial values: everything must come from the checkpoint
    result = _train(resumed, 5, optimizer=_sgd(), scheduler=_steps(), checkpoint=str(ckpt), resume=True)
    for (name, a), b in zip(straight.named_parameters(), resumed.parameters(), strict=True):
        assert torch.equal(a, b), name
    assert [r["lr"] for r in result.history] == [r["lr"] for r in full.history]


@pytest.mark.parametrize(
    "change, message",
    [
        ({"optimizer": None, "scheduler": None}, "optimizer SGD -> Adam"),
        ({"optimizer": _sgd(momentum=0.5)}, r"optimizer.groups\[0\].momentum 0.9 -> 0.5"),
        ({"optimizer": _sgd(gate_lr=0.01)}, r"optimizer.groups\[1\].lr 0.05 -> 0.01"),
        ({"scheduler": _steps((2, 4))}, "scheduler.settings.milestones"),
        ({"scheduler": None}, "scheduler MultiStepLR -> None"),
    ],
)
def test_resume_with_another_optimizer_or_schedule_is_refused(tmp_path, change, message):
    ckpt = tmp_path / "ckpt.pt"
    _train(_model(), 1, optimizer=_sgd(), scheduler=_steps(), checkpoint=str(ckpt))
    kwargs = {"optimizer": _sgd(), "scheduler": _steps(), **change}
    with pytest.raises(ValueError, match="cannot resume") as err:
        _train(_model(), 3, checkpoint=str(ckpt), resume=True, **kwargs)
    assert err.match(message)


def test_reduce_on_plateau_is_stepped_with_the_mean_loss():
    # threshold 10 (relative, mode "min"): no loss ever counts as an improvement, so with patience 0
    # every epoch's step multiplies the step sizes by the factor
    sched = lambda opt: torch.optim.lr_scheduler.ReduceLROnPlateau(opt, factor=0.5, patience=0, threshold=10.0)  # noqa: E731
    result = _train(_model(), 3, optimizer=_sgd(lr=0.1, gate_lr=0.1), scheduler=sched)
    assert [r["lr"][0] for r in result.history] == pytest.approx([0.1, 0.05, 0.025])


def test_constrained_multiplier_step_is_three_times_the_gates_lr(monkeypatch):
    seen = {}
    original = Constrained.build

    def spy(self, *args, **kwargs):
        objective = original(self, *args, **kwargs)
        seen["multiplier_lr"] = objective.multiplier_lr
        return objective

    monkeypatch.setattr(Constrained, "build", spy)
    objective = Constrained(target_density=0.5)
    _train(_model(), 1, optimizer=_sgd(lr=0.1, gate_lr=0.02), scheduler=_steps((1,), 0.1), objective=objective)
    assert seen["multiplier_lr"] == pytest.approx(3 * 0.02)
    _train(_model(), 1, lr=0.004, objective=objective)  # the default Adam: 3 * lr
    assert seen["multiplier_lr"] == pytest.approx(3 * 0.004)
    _train(_model(), 1, optimizer=_sgd(), objective=Constrained(target_density=0.5, multiplier_lr=0.7))
    assert seen["multiplier_lr"] == 0.7


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        ({"optimizer": "sgd"}, ValueError, "optimizer must be a factory"),
        ({"scheduler": 0.5}, ValueError, "scheduler must be a factory"),
        ({"optimizer": lambda m: list(m.parameters())}, TypeError, "must return a torch.optim.Optimizer"),
        ({"scheduler": lambda o: 3}, TypeError, "must return a learning-rate scheduler"),
    ],
)
def test_bad_factories_are_refused(kwargs, error, message):
    with pytest.raises(error, match=message):
        _train(_model(), 1, **kwargs)


# -- gradient clipping -------------------------------------------------------------------------------------------


def _hand_gradients(model, scale=100.0, seed=4):
    """Large gradients on every parameter (a total norm far above the clipping's)."""
    g = torch.Generator().manual_seed(seed)
    return {name: scale * torch.randn(p.shape, generator=g) for name, p in model.named_parameters()}


@pytest.mark.parametrize("gates", [False, True])
@pytest.mark.parametrize("norm_type", [2.0, 1.0, math.inf])
def test_a_clipped_step_is_clip_grad_norm_then_the_optimisers_step(gates, norm_type):
    """The step of clipped(SGD, max_norm) equals torch.nn.utils.clip_grad_norm_ of the weights (and the gates, with
    gates=True) followed by a plain SGD step, done by hand; the gates' gradients are left as they are by default."""
    model, lr, max_norm = _model(), 0.1, 0.5
    grads = _hand_gradients(model)
    gate_names = {f"{name}.log_alpha" for name, _ in gates_of(model)}
    assert gate_names and gate_names < set(grads)
    # by hand: clip the chosen gradients together, then p - lr * grad
    clipped_names = [n for n in grads if gates or n not in gate_names]
    reference = {n: g.clone() for n, g in grads.items()}
    total = torch.nn.utils.clip_grad_norm_([_Leaf(reference[n]) for n in clipped_names], max_norm, norm_type)
    assert float(total) > 10 * max_norm
    expected = {n: p.detach() - lr * reference[n] for n, p in model.named_parameters()}
    # the clipped optimiser
    optimizer = clipped(lambda m: torch.optim.SGD(m.parameters(), lr=lr), max_norm, norm_type=norm_type, gates=gates)(
        model
    )
    for name, p in model.named_parameters():
        p.grad = grads[name].clone()
    optimizer.step()
    for name, p in model.named_parameters():
        assert torch.allclose(p.detach(), expected[name], rtol=0, atol=1e-6), name
    moved = [p.grad for n, p in model.named_parameters() if n in clipped_names]
    assert float(torch.nn.utils.get_total_norm(moved, norm_type)) == pytest.approx(max_norm, rel=1e-5)


class _Leaf:
    """A stand-in parameter for clip_grad_norm_: it reads and scales ``.grad`` only."""

    def __init__(self, grad):
        self.grad = grad


class _NormsSeen(torch.optim.SGD):
    """SGD that notes the weights' gradient norm each step sees (after any clipping, which runs before step())."""

    norms: list

    def step(self, closure=None):
        self.norms.append(float(torch.nn.utils.get_total_norm([p.grad for p in self.param_groups[0]["params"]])))
        return super().step(closure)


def test_train_with_a_clipped_optimiser_steps_on_clipped_gradients():
    def factory(model):
        optimizer = _NormsSeen(parameter_groups(model), lr=0.05)
        optimizer.norms = []
        factory.built = optimizer
        return optimizer

    _train(_model(), 2, optimizer=factory)
    unclipped = factory.built.norms
    _train(_model(), 2, optimizer=clipped(factory, 0.1))
    seen = factory.built.norms
    assert min(unclipped) > 0.2 and len(seen) == len(unclipped) == 6
    assert max(seen) == pytest.approx(0.1, rel=1e-5) and min(seen) == pytest.approx(0.1, rel=1e-5)


def test_a_resume_with_other_clipping_is_refused(tmp_path):
    ckpt = tmp_path / "ckpt.pt"
    _train(_model(), 1, optimizer=clipped(_sgd(), 1.0), checkpoint=str(ckpt))
    state = load_checkpoint(ckpt)
    assert state["run"]["optimizer"]["clip_grad_norm"] == {"max_norm": 1.0, "norm_type": 2.0, "gates": False}
    with pytest.raises(ValueError, match=r"optimizer.clip_grad_norm.max_norm 1.0 -> 2.0"):
        _train(_model(), 2, optimizer=clipped(_sgd(), 2.0), checkpoint=str(ckpt), resume=True)
    with pytest.raises(ValueError, match=r"optimizer.clip_grad_norm .* -> None"):
        _train(_model(), 2, optimizer=_sgd(), checkpoint=str(ckpt), resume=True)
    _train(_model(), 2, optimizer=clipped(_sgd(), 1.0), checkpoint=str(ckpt), resume=True)


def test_an_optimiser_class_instead_of_a_factory_is_named():
    """``optimizer=torch.optim.SGD`` (or ``clipped(torch.optim.SGD, 1.0)``) called the class on the model: torch's
    "'SparseClassifier' object is not iterable". Now a TypeError saying to pass a factory, before anything runs."""
    x, y = _data()
    with pytest.raises(TypeError, match=r"not the class SGD: e\.g\. optimizer=lambda m: torch\.optim\.SGD"):
        train(_model(), x, y, objective="penalized", epochs=1, optimizer=torch.optim.SGD, progress=False)
    with pytest.raises(TypeError, match=r"clipped: optimizer must be a factory"):
        clipped(torch.optim.SGD, 1.0)
