"""Constrained sparsity: densities, the final phase, targets met at test time, summaries, resume."""

import itertools
import json
import math
import re

import pytest
import torch

from l0bayes import pruning
from l0bayes.inference import Constrained, Penalized, constrained_summary, train
from l0bayes.inference.callbacks import Callback
from l0bayes.inference.objectives.final_phase import HARDLY_MOVING, epochs_advice, epochs_needed
from l0bayes.io import load_checkpoint, save_checkpoint
from l0bayes.models import SparseClassifier, SparseLinearRegression
from l0bayes.nn import L0MLP, density
from l0bayes.pruning import count_parameters, prune

# Eq. 13 closes a gate exactly when log_alpha <= log(-lower / upper) (docs/mathematics.md), lower=-0.1, upper=1.1.
THRESHOLD = math.log(0.1 / 1.1)


def _net(in_features=4, hidden=(3, 2), num_classes=2):
    torch.manual_seed(0)
    return L0MLP(in_features=in_features, hidden=hidden, num_classes=num_classes)


def _set_log_alpha(net, values):
    with torch.no_grad():
        for layer, v in zip((net.fc1, net.fc2, net.fc3), values, strict=True):
            layer.gate.log_alpha.copy_(torch.tensor(v, dtype=torch.float32))


def _kept(net):
    """The reference: the pruned model's parameters over the dense model's."""
    return count_parameters(prune(net)) / count_parameters(net)


def test_test_time_density_is_what_prune_keeps():
    net = _net()  # fc1 4 -> 3, fc2 3 -> 2, fc3 2 -> 2 with biases: 15 + 8 + 6 = 29 parameters
    open_, shut = THRESHOLD + 0.01, THRESHOLD - 0.01
    _set_log_alpha(net, [[open_, shut, open_, shut], [shut, shut, open_], [open_, open_]])
    # fc1 keeps 2 input columns and the 1 row fc2 reads (+1 bias); fc2 1 column x 2 rows (+2); fc3 2 x 2 (+2)
    assert pruning.test_time_density(net) == pytest.approx(13 / 29) == _kept(net)
    assert pruning.test_time_density(net, per_layer=True) == pytest.approx({"fc1": 3 / 15, "fc2": 4 / 8, "fc3": 6 / 6})
    # the gate-level measure counts fc1's open columns whole (2 x 3), though fc2 closed 2 of their 3 rows
    assert density.test_time_gate_density(net) == pytest.approx((2 * 3 + 1 * 2 + 2 * 2) / (12 + 6 + 4))
    assert density.test_time_gate_density(net, per_layer=True) == pytest.approx({"fc1": 0.5, "fc2": 1 / 3, "fc3": 1.0})
    assert density.density_names(net) == ["fc1", "fc2", "fc3"]


def test_test_time_density_where_the_gate_level_measure_is_off_by_more_than_5x():
    # fc1 keeps 32 of 64 input columns, but fc2 keeps 4 of fc1's 100 outputs: the gate-level measure counts
    # 32 x 100 weights of fc1, the pruned model has 32 x 4.
    net = _net(64, (100, 50), 10)
    open_, shut = THRESHOLD + 1, THRESHOLD - 1
    fc1 = [open_] * 32 + [shut] * 32
    fc2 = [open_] * 4 + [shut] * 96
    fc3 = [open_] * 5 + [shut] * 45
    _set_log_alpha(net, [fc1, fc2, fc3])
    kept = (32 * 4 + 4) + (4 * 5 + 5) + (5 * 10 + 10)
    assert count_parameters(prune(net)) == kept
    assert pruning.test_time_density(net) == pytest.approx(kept / 12060) == _kept(net)
    gate_level = (32 * 100 + 4 * 50 + 5 * 10) / (64 * 100 + 100 * 50 + 50 * 10)
    assert gate_level > 5 * pruning.test_time_density(net)


def test_expected_density_is_the_expectation_of_the_pruned_count():
    net = _net()
    values = [[-3.0, 0.0, 1.0, 2.0], [-1.0, 0.5, 4.0], [0.2, -0.2]]
    _set_log_alpha(net, values)
    shift = (2 / 3) * math.log(0.1 / 1.1)  # beta log(-gamma/zeta)

    def q(v):
        return 1 / (1 + math.exp(-(v - shift)))

    s1, s2, s3 = (sum(map(q, vs)) for vs in values)
    # E[kept] = sum_l E[n_in] E[n_out] + E[n_out] (biases): independent gates, E[z_in z_out] = q_in q_out
    fc1, fc2, fc3 = s1 * s2 + s2, s2 * s3 + s3, s3 * 2 + 2
    assert pruning.expected_density(net, per_layer=True).tolist() == pytest.approx(
        [fc1 / 15, fc2 / 8, fc3 / 6], rel=1e-6
    )
    assert float(pruning.expected_density(net).detach()) == pytest.approx((fc1 + fc2 + fc3) / 29, rel=1e-6)
    # ... and by enumeration of every gate pattern, weighted by q: the same number
    gates = [net.fc1.gate, net.fc2.gate, net.fc3.gate]
    probs = [q(v) for vs in values for v in vs]
    total = 0.0
    for pattern in itertools.product([0, 1], repeat=len(probs)):
        weight = math.prod(p if z else 1 - p for p, z in zip(probs, pattern, strict=True))
        it = iter(pattern)
        with torch.no_grad():
            for gate in gates:
                gate.log_alpha.copy_(torch.tensor([30.0 if next(it) else -30.0 for _ in range(gate.num_gates)]))
        # prune() keeps one unit of an emptied tensor; the expectation counts it as empty
        total += weight * _count_without_floor(net)
    _set_log_alpha(net, values)
    assert total / 29 == pytest.approx(float(pruning.expected_density(net).detach()), rel=1e-6)


def _count_without_floor(net):
    a = [int(layer.gate.active().sum()) for layer in (net.fc1, net.fc2, net.fc3)]
    return a[0] * a[1] + a[1] + a[1] * a[2] + a[2] + a[2] * 2 + 2


def test_expected_density_gradients():
    net = _net().double()
    gates = [net.fc1.gate.log_alpha, net.fc2.gate.log_alpha, net.fc3.gate.log_alpha]

    def f(*log_alphas):
        with torch.no_grad():
            for p, v in zip(gates, log_alphas, strict=True):
                p.copy_(v)
        return pruning.expected_density(net)

    # the derivative through the product of layers, against finite differences of the same function
    start = [torch.randn(g.shape, dtype=torch.float64) for g in gates]
    f(*start).sum().backward()
    analytic = [g.grad.clone() for g in gates]
    eps = 1e-6
    for k, g in enumerate(gates):
        for i in range(g.numel()):
            up = [s.clone() for s in start]
            down = [s.clone() for s in start]
            up[k][i] += eps
            down[k][i] -= eps
            numeric = (float(f(*up).detach()) - float(f(*down).detach())) / (2 * eps)
            assert analytic[k][i].item() == pytest.approx(numeric, rel=1e-5, abs=1e-9)


def test_final_phase_keeps_top_gates_that_fit_in_the_pruned_model():
    net = _net()
    log_alpha = [[3.0, -1.0, 2.0, 0.0], [1.5, -2.0, 0.5], [-5.0, -4.0]]
    _set_log_alpha(net, log_alpha)
    target = 13 / 29
    objective = Constrained(target_density=target).build(net, 10)
    keep = objective.keep_masks()
    # checked by prune() on every set: the kept set fits, holds each layer's best gate, and no further gate fits
    flat = [k for mask in keep for k in mask.tolist()]

    def kept_with(pattern):
        it = iter(pattern)
        with torch.no_grad():
            for layer in (net.fc1, net.fc2, net.fc3):
                layer.gate.log_alpha.copy_(torch.tensor([30.0 if next(it) else -30.0 for _ in range(layer.num_gates)]))
        return _kept(net)

    assert kept_with(flat) <= target + 1e-12
    for i, k in enumerate(flat):
        if not k:
            assert kept_with([True if j == i else v for j, v in enumerate(flat)]) > target
    assert [int(torch.tensor(v).argmax()) for v in log_alpha] == [int(m.float().argmax()) for m in keep]
    # greedy by log_alpha: the kept set is the top-ranked prefix up to the first group that no longer fits
    _set_log_alpha(net, log_alpha)
    objective.start_epoch(9, 10)  # the last of ten epochs: the gates are fixed
    assert pruning.test_time_density(net) == pytest.approx(kept_with(flat)) and pruning.test_time_density(net) <= target
    per = Constrained(target_density=[0.5, 0.5, 0.7], per_layer=True).build(_net(), 10)
    _set_log_alpha(per.model, log_alpha)
    with pytest.warns(UserWarning, match="before the Lagrangian arrived"):
        per.start_epoch(0, 1)
    assert all(
        v <= t + 1e-12 for v, t in zip(pruning.test_time_density(per.model, per_layer=True).values(), [0.5, 0.5, 0.7])
    )


@pytest.mark.parametrize(
    "trajectory, epochs, advice",
    [
        ([(0, [0.9]), (2, [0.88])], 10, "train about 46 more epochs (at its recent pace), or raise multiplier_lr"),
        ([(0, [0.9]), (2, [0.88])], 4, "more than 10 times this run's 4 epochs): raise multiplier_lr"),
        ([(0, [0.788]), (2, [0.7879])], 3, "the Lagrangian has hardly moved over the last epochs"),  # was 38781
        ([(0, [0.7]), (2, [0.8])], 3, "train more epochs, or raise multiplier_lr"),  # moving away: no pace
    ],
)
def test_the_advice_of_a_late_final_phase_is_a_sensible_number_of_epochs(trajectory, epochs, advice):
    """A pace of almost nothing gave "train about 19379 more epochs" after a 3-epoch run: beyond ten times the run's
    epochs the warning says the Lagrangian hardly moved and that the step sizes are what to change."""
    more = epochs_needed(trajectory, [0.4], 0.02)
    text = epochs_advice(more, epochs)
    assert advice in text
    numbers = [int(n) for n in re.findall(r"about (\d+) more epochs", text)]
    assert all(n <= HARDLY_MOVING * epochs for n in numbers)


def test_summary_keys_and_warnings():
    net = _net()
    open_, shut = THRESHOLD + 1, THRESHOLD - 1
    _set_log_alpha(net, [[open_, open_, shut, shut], [shut, shut, shut], [open_, open_]])
    summary = constrained_summary(net, 0.5)
    assert set(summary) == {"target_density", "test_time_density", "test_time_density_per_layer", "warnings"}
    assert summary["test_time_density"] == pytest.approx(_kept(net))
    assert len(summary["warnings"]) == 2  # more than 0.02 off target, and fc2 empty
    assert "more than 0.02 off" in summary["warnings"][0] and "fc2 ended empty" in summary["warnings"][1]
    per = constrained_summary(net, 0.5, per_layer=True)
    assert per["target_density"] == {"fc1": 0.5, "fc2": 0.5, "fc3": 0.5}
    assert [w.split(":")[0] for w in per["warnings"]] == ["layer fc1", "layer fc3", "layer fc2 ended empty"]
    assert constrained_summary(net, _kept(net) + 0.019)["warnings"] == [
        "layer fc2 ended empty: no gate is open at test time"
    ]
    with_flops = constrained_summary(net, target_flops=0.5, input_shape=(4,))
    assert "target_flops" in with_flops and 0 < with_flops["test_time_flops"] < 1


def _digits():
    pytest.importorskip("sklearn")
    from l0bayes.data import load_dataset

    return load_dataset("digits", seed=0)


def _digits_run(data, objective, **kwargs):
    torch.manual_seed(0)
    net = L0MLP(in_features=64, hidden=(100, 50), num_classes=10)
    model = SparseClassifier(net, lam=kwargs.pop("lam", 0.1))
    result = train(
        model,
        data.x_train,
        data.y_train,
        objective=objective,
        epochs=100,
        lr=1e-2,
        test_data=(data.x_test, data.y_test),
        progress=False,
        record_every=100,
        **kwargs,
    )
    return net, result.history[-1]


def test_digits_target_is_met_at_test_time_with_penalised_error(readme_job):
    data = _digits()
    net, last = _digits_run(data, Constrained(target_density=0.3))
    assert 0.28 <= pruning.test_time_density(net) <= 0.32
    assert last["test_time_density"] == pruning.test_time_density(net)
    # a penalised run of higher density: the README's main job (the same MLP, split, epochs and learning rate,
    # lambda 0.1; one run per session, see tests/conftest.py)
    assert readme_job.returncode == 0, readme_job.stderr
    penalised = json.loads((readme_job.paths["/tmp/cli_run"] / "summary.json").read_text())
    assert penalised["params_pruned"] / penalised["params_dense"] >= 0.3
    assert last["test_error"] <= penalised["test"] + 0.02


def test_digits_per_layer_targets_hold_per_layer():
    data = _digits()
    net, last = _digits_run(data, Constrained(target_density=0.4, per_layer=True))
    for name, achieved in pruning.test_time_density(net, per_layer=True).items():
        # at most the target; fc2 can reach only 0.38: its count is (its inputs + 1) x the 19 inputs fc3 keeps
        assert 0.4 - 0.025 <= achieved <= 0.4, (name, achieved)
    assert len(last["multipliers"]) == 3
    assert last["test_error"] < 0.1


def _sparse_regression(n=200, p=10, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, p, generator=g)
    y = x[:, :3] @ torch.tensor([2.0, -1.5, 1.0]) + 0.5 * torch.randn(n, generator=g)
    return x, y


@pytest.mark.parametrize("objective", ["bayes", "penalized", "constrained"])
def test_resume_is_bit_exact_for_every_objective(objective, tmp_path, interrupt_at_epoch):
    # A 4-epoch run interrupted (Ctrl-C) right after its checkpoint of epoch 2, then resumed. With
    # final_phase=0.5 the constrained run fixes its gates in epoch 3 or 4: the resume crosses into the final phase.
    x, y = _sparse_regression()
    kw = dict(objective=objective, epochs=4, batch_size=50, lr=0.05, seed=3, progress=False)
    if objective == "constrained":
        kw["objective"] = Constrained(target_density=0.3, final_phase=0.5)
    ckpt = tmp_path / "ckpt.pt"
    torch.manual_seed(0)
    straight_model = SparseLinearRegression(10)
    straight = train(straight_model, x, y, **kw)
    torch.manual_seed(0)
    with interrupt_at_epoch(2):
        train(SparseLinearRegression(10), x, y, checkpoint=str(ckpt), **kw)
    torch.manual_seed(99)  # disturb the global RNG: resume must restore it
    resumed_model = SparseLinearRegression(10)
    resumed = train(resumed_model, x, y, checkpoint=str(ckpt), resume=True, **kw)
    for a, b in zip(straight_model.state_dict().values(), resumed_model.state_dict().values(), strict=True):
        assert torch.equal(a, b)
    assert torch.equal(straight.multipliers, resumed.multipliers)
    assert [h["mean_loss"] for h in straight.history] == [h["mean_loss"] for h in resumed.history]
    if objective == "constrained":  # fixed in epoch 3 or 4 (once the Lagrangian arrives), after the resume
        fixed = [h["gates_fixed"] for h in resumed.history]
        assert fixed == [h["gates_fixed"] for h in straight.history] and fixed[:2] == [False, False] and fixed[-1]


def _same_run(a_model, a, b_model, b):
    for p, q in zip(a_model.state_dict().values(), b_model.state_dict().values(), strict=True):
        assert torch.equal(p, q)
    assert torch.equal(a.multipliers, b.multipliers)
    assert [h["mean_loss"] for h in a.history] == [h["mean_loss"] for h in b.history]
    assert [h["gates_fixed"] for h in a.history] == [h["gates_fixed"] for h in b.history]


@pytest.mark.filterwarnings("ignore:constrained. the gates are fixed")
@pytest.mark.parametrize("first, then", [(2, 4), (2, 3), (10, 11)])
@pytest.mark.parametrize("arrival", [None, 0.02])
def test_resume_to_more_epochs_is_the_longer_run(first, then, arrival, tmp_path):
    # The final phase (the last 30% of the epochs, rounded up) of a run of `first` epochs begins earlier than that
    # of `then` epochs for (2, 4) and (2, 3): the resume goes back to the state its checkpoint keeps from before the
    # final phase. For (10, 11) both begin at epoch 8 and the resume continues from the checkpoint itself.
    x, y = _sparse_regression()
    # with arrival=0.02 the gates wait for the Lagrangian: fixed later, or forced at the last epoch
    kw = dict(
        objective=Constrained(target_density=0.3, arrival=arrival), batch_size=50, lr=0.05, seed=3, progress=False
    )
    torch.manual_seed(0)
    straight_model = SparseLinearRegression(10)
    straight = train(straight_model, x, y, epochs=then, **kw)
    ckpt = str(tmp_path / "ckpt.pt")
    torch.manual_seed(0)
    short = train(SparseLinearRegression(10), x, y, epochs=first, checkpoint=ckpt, **kw)
    assert short.history[-1]["gates_fixed"]  # the shorter run ended in its final phase
    torch.manual_seed(99)
    resumed_model = SparseLinearRegression(10)
    resumed = train(resumed_model, x, y, epochs=then, checkpoint=ckpt, resume=True, **kw)
    _same_run(straight_model, straight, resumed_model, resumed)
    assert [h["epoch"] for h in resumed.history] == list(range(1, then + 1))
    # ... and the checkpoint it leaves extends exactly again
    torch.manual_seed(0)
    longer_model = SparseLinearRegression(10)
    longer = train(longer_model, x, y, epochs=then + 3, **kw)
    again_model = SparseLinearRegression(10)
    again = train(again_model, x, y, epochs=then + 3, checkpoint=ckpt, resume=True, **kw)
    _same_run(longer_model, longer, again_model, again)


@pytest.mark.filterwarnings("ignore:constrained. the gates are fixed")
def test_a_resume_that_cannot_be_exact_is_refused_saying_why(tmp_path):
    x, y = _sparse_regression()
    ckpt = str(tmp_path / "ckpt.pt")
    kw = dict(batch_size=50, lr=0.05, seed=3, progress=False)

    def at(final_phase):
        return Constrained(target_density=0.3, final_phase=final_phase)

    # Without a final phase 4 epochs leave the gates free; a run of 5 epochs with final_phase=0.5 fixes them from
    # epoch 3: the checkpoint is past that point.
    train(SparseLinearRegression(10), x, y, epochs=4, objective=at(0.0), checkpoint=ckpt, **kw)
    with pytest.raises(ValueError, match=r"ckpt.pt.*epochs=5.*final phase begins at epoch 3.*epochs >= 8"):
        train(SparseLinearRegression(10), x, y, epochs=5, objective=at(0.5), checkpoint=ckpt, resume=True, **kw)
    # The final phase of 4 epochs at 0.5 begins at epoch 3; one of 5 epochs at 0.9 at epoch 1, earlier.
    train(SparseLinearRegression(10), x, y, epochs=4, objective=at(0.5), checkpoint=ckpt, **kw)
    with pytest.raises(ValueError, match=r"fixed its gates at epoch 3, later.*epochs >= 20"):
        train(SparseLinearRegression(10), x, y, epochs=5, objective=at(0.9), checkpoint=ckpt, resume=True, **kw)
    # A checkpoint of an earlier version, without the state from before its final phase.
    state = load_checkpoint(ckpt)
    del state["before_final_phase"], state["objective_state"]["fixed_at"]
    save_checkpoint(ckpt, state)
    with pytest.raises(
        ValueError, match=r"fixed its gates at epoch 3 .*earlier version.*epochs from 4 to 5, or train anew"
    ):
        train(SparseLinearRegression(10), x, y, epochs=6, objective=at(0.5), checkpoint=ckpt, resume=True, **kw)
    train(SparseLinearRegression(10), x, y, epochs=4, objective=at(0.5), checkpoint=ckpt, resume=True, **kw)  # done


@pytest.mark.filterwarnings("ignore:constrained. the gates are fixed")
def test_cli_resume_to_more_epochs_is_the_longer_run(tmp_path, capsys):
    import json

    pytest.importorskip("sklearn")
    from l0bayes.cli import main

    argv = ["fit", "--objective", "constrained", "--target-density", "0.5", "--hidden", "16,8", "--no-progress"]
    assert main([*argv, "--epochs", "4", "--out", str(tmp_path / "straight")]) == 0
    assert main([*argv, "--epochs", "2", "--out", str(tmp_path / "run")]) == 0
    assert main(["fit", "--out", str(tmp_path / "run"), "--resume", "--epochs", "4", "--no-progress"]) == 0

    def numbers(name):
        history = json.loads((tmp_path / name / "history.json").read_text())
        return [{k: v for k, v in r.items() if k != "wall_s"} for r in history]

    assert numbers("run") == numbers("straight")
    # the last 30% of 4 epochs, rounded up: epochs 3 and 4 (a run of 2 fixed its gates in epoch 2)
    assert [r["gates_fixed"] for r in numbers("run")] == [False, False, True, True]


def test_resume_with_a_changed_run_is_refused(tmp_path):
    x, y = _sparse_regression()
    ckpt = str(tmp_path / "ckpt.pt")
    kw = dict(batch_size=50, seed=3, progress=False, checkpoint=ckpt)
    train(SparseLinearRegression(10), x, y, epochs=1, lr=0.05, objective=Constrained(target_density=0.3), **kw)
    with pytest.raises(ValueError, match="lr 0.05 -> 0.01"):
        train(SparseLinearRegression(10), x, y, epochs=2, lr=0.01, objective=Constrained(target_density=0.3),
              resume=True, **kw)  # fmt: skip
    with pytest.raises(ValueError, match="objective"):
        train(SparseLinearRegression(10), x, y, epochs=2, lr=0.05, objective="penalized", resume=True, **kw)
    with pytest.raises(ValueError, match="data"):
        train(SparseLinearRegression(10), x + 1, y, epochs=2, lr=0.05, objective=Constrained(target_density=0.3),
              resume=True, **kw)  # fmt: skip
    with pytest.raises(ValueError, match="target density"):
        train(SparseLinearRegression(10), x, y, epochs=2, lr=0.05, objective=Constrained(target_density=0.2),
              resume=True, **kw)  # fmt: skip
    with pytest.raises(RuntimeError, match="size mismatch"):  # another model
        train(SparseLinearRegression(9), x[:, :9], y, epochs=2, lr=0.05, objective=Constrained(target_density=0.3),
              resume=True, **kw)  # fmt: skip


def test_argument_and_data_errors_are_clear():
    x, y = _sparse_regression(n=50, p=5)
    model = SparseLinearRegression(5)
    for lr in (float("inf"), float("nan"), 0.0, -1.0):
        with pytest.raises(ValueError, match="lr must be a finite number"):
            train(model, x, y, lr=lr, progress=False)
    with pytest.raises(ValueError, match="empty"):
        train(model, x[:0], y[:0], progress=False)
    with pytest.raises(ValueError, match="y is None"):
        train(model, x, None, progress=False)
    with pytest.raises(ValueError, match="record_every"):
        train(model, x, y, record_every=0, progress=False)
    # the constrained objective's settings are checked where they are defined, when the objective is built
    with pytest.raises(ValueError, match=r"Constrained: final_phase must be a number in \[0, 1\), got 1.0"):
        Constrained(target_density=0.5, final_phase=1.0)
    with pytest.raises(ValueError, match="Constrained: multiplier_lr must be a finite number >= 0"):
        Constrained(target_density=0.5, multiplier_lr=float("inf"))
    with pytest.raises(ValueError, match=r"Constrained: target_density must be a number in \(0, 1\].*got 1.5"):
        Constrained(target_density=1.5)
    with pytest.raises(ValueError, match="objective='constrained' needs its target"):
        train(model, x, y, objective="constrained", progress=False)


def test_divergence_on_the_pyro_path_is_a_non_finite_loss_error():
    from l0bayes.inference import NonFiniteLossError

    x, y = _sparse_regression(n=100, p=5)
    with pytest.raises(NonFiniteLossError):
        train(SparseLinearRegression(5), x, y, epochs=3, lr=1e30, progress=False)


def test_record_every_marks_the_full_records():
    x, y = _sparse_regression(n=100, p=5)
    history = train(SparseLinearRegression(5), x, y, epochs=5, record_every=2, progress=False).history
    assert [h["full_record"] for h in history] == [False, True, False, True, True]
    assert all(("free_energy" in h) == h["full_record"] for h in history)
    assert all("mean_loss" in h and "wall_s" in h for h in history)


def test_final_phase_survives_parameter_averaging():
    # An average of the parameters mixes the gates from before and after they were fixed; the fixed gates win.
    from l0bayes.inference import ParameterAverage

    net = _net()
    _set_log_alpha(net, [[3.0, 2.0, 2.5, 1.0], [1.5, 2.0, 0.5], [1.0, 2.0]])  # every gate open
    average = ParameterAverage(net, 0.99)
    for _ in range(50):
        average.update()
    objective = Constrained(target_density=0.45).build(net, 10)
    with pytest.warns(UserWarning, match="before the Lagrangian arrived"):
        objective.start_epoch(9, 10)  # fixes the gates
    fixed = pruning.test_time_density(net)
    assert fixed <= 0.45
    average.update()
    with average.swapped():
        assert pruning.test_time_density(net) == 1.0  # the averaged gates are still mostly the old, open ones
        objective.finalize_parameters()
        assert pruning.test_time_density(net) == fixed


def test_cli_summary_names_target_test_time_density_and_multipliers(tmp_path, capsys):
    import json

    pytest.importorskip("sklearn")
    from l0bayes.cli import main

    out = tmp_path / "run"
    argv = ["fit", "--objective", "constrained", "--target-density", "0.3", "--per-layer", "--epochs", "2"]
    assert main([*argv, "--out", str(out), "--no-progress"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["target_density"] == {"fc1": 0.3, "fc2": 0.3, "fc3": 0.3}
    assert set(summary["test_time_density_per_layer"]) == {"fc1", "fc2", "fc3"}
    assert all(abs(v - 0.3) <= 0.02 for v in summary["test_time_density_per_layer"].values())
    assert len(summary["multipliers"]) == 3
    # Two epochs leave the Lagrangian far above the target when the final phase fixes the gates: said once.
    assert len(summary["warnings"]) == 1 and "final phase started at expected density" in summary["warnings"][0]
    table = capsys.readouterr().out
    assert "target density 0.3 per layer" in table and "pruned model's parameters" in table


def test_an_infinite_log_alpha_is_not_returned_silently():
    # log_alpha = +inf gives finite gates (z = 1) and a finite loss, so only the parameter check catches it.
    from l0bayes.inference import NonFiniteLossError

    x, y = _sparse_regression(n=100, p=5)
    model = SparseLinearRegression(5)
    with torch.no_grad():
        model.gate.log_alpha[0] = float("inf")
    with pytest.raises(NonFiniteLossError, match="log_alpha"):
        train(model, x, y, objective=Constrained(target_density=0.4, final_phase=0), epochs=1, progress=False)


def test_a_final_phase_far_above_the_target_is_warned_and_recorded():
    # Two epochs at a tiny step: the Lagrangian cannot move the expected density (about 0.9 at the initial
    # drop rate) to the target 0.3, so the final phase starts far above it; train() warns, the history
    # records where it started, and the summary carries a one-line warning.
    torch.manual_seed(0)
    x, y = torch.randn(60, 4), torch.randint(0, 2, (60,))
    model = SparseClassifier(_net())
    with pytest.warns(UserWarning, match="final phase"):
        result = train(
            model, x, y, objective=Constrained(target_density=0.3, final_phase=0.5), epochs=2, lr=1e-4,
            progress=False,
        )  # fmt: skip
    started = result.history[-1]["density_at_final_phase"]
    assert result.history[0]["density_at_final_phase"] is None  # not yet fixed after epoch 1
    assert started > 0.3 + 0.1
    summary = constrained_summary(model.net, 0.3, density_at_final_phase=started)
    assert any("final phase started" in w for w in summary["warnings"])
    near = constrained_summary(model.net, 0.3, density_at_final_phase=0.315)
    assert not any("final phase" in w for w in near["warnings"])


def test_the_summary_reads_where_the_final_phase_started_from_the_run():
    # The run of the test above: given the TrainResult (or the history), the summary finds the density at
    # which the gates were fixed itself, and names the layers as the network does (fc1, not net.fc1).
    torch.manual_seed(0)
    x, y = torch.randn(60, 4), torch.randint(0, 2, (60,))
    model = SparseClassifier(_net())
    with pytest.warns(UserWarning, match="final phase"):
        result = train(
            model, x, y, objective=Constrained(target_density=0.3, final_phase=0.5), epochs=2, lr=1e-4,
            progress=False,
        )  # fmt: skip
    from_result = constrained_summary(result, 0.3)
    from_history = constrained_summary(model.net, 0.3, history=result.history)
    for summary in (from_result, from_history):
        assert sum("final phase started" in w for w in summary["warnings"]) == 1
        assert list(summary["test_time_density_per_layer"]) == ["fc1", "fc2", "fc3"]
    assert from_result["multipliers"] == result.multipliers.tolist()
    assert list(result.history[-1]["test_time_density_per_layer"]) == ["fc1", "fc2", "fc3"]
    assert not any("final phase" in w for w in constrained_summary(model.net, 0.3)["warnings"])  # nothing to read


def test_per_layer_densities_are_named_as_in_the_network():
    model = SparseClassifier(_net())
    assert density.density_names(model) == density.density_names(model.net) == ["fc1", "fc2", "fc3"]
    assert list(pruning.test_time_density(model, per_layer=True)) == ["fc1", "fc2", "fc3"]
    summary = constrained_summary(model, [0.5, 0.5, 0.5], per_layer=True)
    assert list(summary["target_density"]) == ["fc1", "fc2", "fc3"]


def test_final_phase_warning_per_layer():
    net = _net()
    summary = constrained_summary(net, [0.5, 0.5, 0.5], per_layer=True, density_at_final_phase=[0.55, 0.9, 0.5])
    line = "final phase started at expected density 0.900 against the target 0.500"
    assert sum(line in w for w in summary["warnings"]) == 1


def test_a_target_no_cut_can_meet_is_said_in_one_line():
    # Only the head's inputs can be removed: the stem's and the block's channels enter a residual addition.
    from torch import nn

    from l0bayes.pruning import sparsify

    class Residual(nn.Module):
        def __init__(self):
            super().__init__()
            self.stem = nn.Conv2d(1, 6, 3, padding=1)
            self.block = nn.Sequential(nn.Conv2d(6, 6, 3, padding=1), nn.BatchNorm2d(6), nn.ReLU())
            self.head = nn.Linear(6, 3)

        def forward(self, x):
            h = torch.relu(self.stem(x))
            return self.head((h + self.block(h)).mean((2, 3)))

    net = sparsify(Residual(), example_inputs=torch.randn(2, 1, 8, 8))
    objective = Constrained(target_density=0.6).build(net, 10)
    with pytest.warns(UserWarning, match=r"target density 0.600 cannot be met.*keeps 0.96"):
        objective.keep_masks()


@pytest.mark.parametrize("target", [["--target-density", "0.3"], ["--model", "lenet5", "--target-flops", "0.4"]])
def test_cli_table_and_summary_give_the_pruned_models_fractions_and_they_agree(target, tmp_path, capsys):
    import json

    pytest.importorskip("sklearn")
    from l0bayes.cli import main

    out = tmp_path / "run"
    argv = ["fit", "--objective", "constrained", *target, "--epochs", "3", "--out", str(out), "--no-progress"]
    assert main(argv) == 0
    summary = json.loads((out / "summary.json").read_text())
    # the constraint's fractions are the pruned model's (the evaluation counts prune()'s model independently)
    assert summary["test_time_density"] == summary["params_pruned"] / summary["params_dense"]
    assert summary["test_time_flops"] == pytest.approx(summary["flops_pruned"] / summary["flops_dense"], rel=1e-12)
    key, value = target[-2].lstrip("-").replace("-", "_"), float(target[-1])
    achieved = summary["test_time_density"] if key == "target_density" else summary["test_time_flops"]
    assert summary[key] == value and value - 0.02 <= achieved <= value
    table = capsys.readouterr().out
    assert (
        f"{summary['test_time_density']:.4f} of dense" in table
        and f"{summary['test_time_flops']:.4f} of dense" in table
    )


class _Targets(Callback):
    """The constrained objective's targets after every step (those of the next step) and its records."""

    def __init__(self):
        self.after = []

    def on_step_end(self, run):
        self.after.append(run.objective.targets.tolist())


def test_target_warmup_moves_the_target_linearly_then_holds_it():
    # Sheared-LLaMA's and CoFi's warm-up: the target of step s is 1 - (1 - 0.3) min(1, (s + 1) / 6), so the
    # constraint starts near the dense model and meets the final target at step 5 (the sixth).
    x, y = _sparse_regression()
    watch = _Targets()
    result = train(SparseLinearRegression(10), x, y,
                   objective=Constrained(target_density=0.3, target_warmup=6, final_phase=0.0), epochs=3,
                   batch_size=50, lr=0.05, seed=3, progress=False, callbacks=[watch])  # fmt: skip
    steps = 3 * 4
    used = [1 - 0.7 / 6] + [t[0] for t in watch.after[:-1]]  # the first step's, then each one set for the next
    assert used == pytest.approx([1 - 0.7 * min(1.0, (s + 1) / 6) for s in range(steps)], abs=1e-6)
    assert used[5:] == [pytest.approx(0.3, abs=1e-7)] * (steps - 5)
    # the records (one per epoch of 4 steps) give the targets of the next step; the final target is unchanged
    assert [h["target_now"] for h in result.history] == pytest.approx([1 - 0.7 * 5 / 6, 0.3, 0.3], abs=1e-6)
    assert all(h["target_density"] == 0.3 for h in result.history)


def test_target_warmup_keeps_the_lagrangian_from_overshooting_the_target():
    # The same run (100 steps, a fast multiplier) with the target at once and warmed up over 40 steps: at once the
    # gates close past the target (Adam's momentum and the multiplier built up on the way: the expected density
    # falls to about 0.13 against 0.3) and reopen slowly; warmed up, they follow the target down and stay on it.
    x, y = _sparse_regression()

    def expected(warmup):
        torch.manual_seed(0)
        objective = Constrained(target_density=0.3, target_warmup=warmup, multiplier_lr=1.0, final_phase=0.0)
        history = train(SparseLinearRegression(10), x, y, objective=objective, epochs=25, batch_size=50, lr=0.1,
                        seed=3, progress=False).history  # fmt: skip
        return [h["constraint"][0] for h in history]

    at_once, warmed = expected(0), expected(40)
    assert min(at_once) < 0.2 and at_once[-1] < 0.25
    assert min(warmed) > 0.29 and warmed[-1] == pytest.approx(0.3, abs=0.01)
    assert warmed[1] > at_once[1] + 0.05  # (and the gates close later)


@pytest.mark.filterwarnings("ignore:constrained. the gates are fixed")
@pytest.mark.parametrize("warmup", [0, 10])
def test_a_run_with_target_warmup_resumes_bit_exactly(warmup, tmp_path, interrupt_at_epoch):
    # Interrupted after epoch 2 (step 8): with a 10-step warm-up the resume continues the schedule where it was.
    x, y = _sparse_regression()
    kw = dict(objective=Constrained(target_density=0.3, target_warmup=warmup, final_phase=0.25), epochs=4,
              batch_size=50, lr=0.05, seed=3, progress=False)  # fmt: skip
    torch.manual_seed(0)
    straight_model = SparseLinearRegression(10)
    straight = train(straight_model, x, y, **kw)
    ckpt = str(tmp_path / "ckpt.pt")
    torch.manual_seed(0)
    with interrupt_at_epoch(2):
        train(SparseLinearRegression(10), x, y, checkpoint=ckpt, **kw)
    torch.manual_seed(99)
    resumed_model = SparseLinearRegression(10)
    resumed = train(resumed_model, x, y, checkpoint=ckpt, resume=True, **kw)
    _same_run(straight_model, straight, resumed_model, resumed)
    assert [h.get("target_now") for h in straight.history] == [h.get("target_now") for h in resumed.history]
    other = Constrained(target_density=0.3, target_warmup=5, final_phase=0.25)
    with pytest.raises(ValueError, match=f"trained with target_warmup={warmup}, this run asks target_warmup=5"):
        train(SparseLinearRegression(10), x, y, checkpoint=ckpt, resume=True, **{**kw, "objective": other})


def test_target_warmup_arguments():
    x, y = _sparse_regression(n=50, p=5)
    model = SparseLinearRegression(5)
    for bad in (-1, 1.5, float("inf")):
        with pytest.raises(ValueError, match="Constrained: target_warmup must be a whole number >= 0"):
            Constrained(target_density=0.5, target_warmup=bad)
    with pytest.raises(TypeError, match="Constrained: target_warmup must be a whole number >= 0, got the bool True"):
        Constrained(target_density=0.5, target_warmup=True)
    # the warm-up is the constrained objective's setting: neither train() nor another objective takes it
    with pytest.raises(TypeError, match="target_warmup"):
        train(model, x, y, objective="penalized", target_warmup=10, progress=False)
    with pytest.raises(TypeError, match=r"Penalized\(\) takes no arguments"):
        Penalized(target_warmup=10)
    # a whole number given as a float is that number of steps, in the objective the run builds
    warmup = Constrained(target_density=0.5, target_warmup=2.0)
    assert warmup.target_warmup == 2 and type(warmup.target_warmup) is int
    assert warmup.build(model, 50).target_warmup == 2
