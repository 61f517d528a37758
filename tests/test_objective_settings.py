"""The objectives as objects: settings checked once where they are defined, ``train()``'s short signature, and runs
saved before objectives were objects resuming with today's API."""

import inspect
import json
import math
import pathlib
import shutil

import numpy as np
import pytest
import torch

import l0bayes.inference as inference
from l0bayes.inference import Bayes, Constrained, LogAlphaProjection, ParameterAveraging, Penalized, train
from l0bayes.inference.objectives import MULTIPLIER_LR, as_objective
from l0bayes.models import SparseClassifier
from l0bayes.nn import L0MLP
from l0bayes.pruning import TargetArchitecture

OLD = pathlib.Path(__file__).parent / "data" / "checkpoints_v0"


def _data():  # as tests/data/checkpoints_v0/write.py made them
    g = torch.Generator().manual_seed(0)
    x = torch.randn(48, 6, generator=g)
    return x, (x[:, 0] + x[:, 1] > 0).long()


def _model():
    torch.manual_seed(0)
    return SparseClassifier(L0MLP(6, (5,), 2), lam=0.1)


pytestmark = pytest.mark.filterwarnings("ignore:constrained. the gates are fixed:UserWarning")

COMMON = dict(batch_size=16, lr=0.05, seed=3, progress=False, threads=1)
RANGE = (math.log(0.01), math.log(100))


@pytest.mark.parametrize(
    ("settings", "error", "words"),
    [
        ({}, ValueError, "exactly one of target_density"),
        ({"target_density": 0.3, "target_flops": 0.3}, ValueError, "exactly one of"),
        ({"target_density": 1.5}, ValueError, "target_density must be a number in (0, 1]"),
        ({"target_density": 0.0}, ValueError, "target_density must be"),
        ({"target_density": float("nan")}, ValueError, "target_density must be"),
        ({"target_density": "half"}, TypeError, "target_density"),
        ({"target_density": True}, TypeError, "target_density"),
        ({"target_density": [0.3, 1.2], "per_layer": True}, ValueError, "target_density must be"),
        ({"target_density": [0.3, 0.4]}, ValueError, "needs per_layer=True"),
        ({"target_density": [0.3, "a"], "per_layer": True}, TypeError, "list of numbers"),
        ({"target_flops": 2}, ValueError, "target_flops must be"),
        ({"target_density": 0.3, "per_layer": 1}, TypeError, "per_layer must be True or False"),
        ({"target_density": 0.3, "rank": "size"}, ValueError, "rank must be one of ('log_alpha', 'norm')"),
        ({"target_density": 0.3, "arrival": "each"}, ValueError, "arrival='each' fixes each constraint"),
        ({"target_density": 0.3, "arrival": "soon"}, ValueError, "arrival must be a number >= 0"),
        ({"target_density": 0.3, "arrival": -0.1}, ValueError, "arrival must be"),
        ({"target_density": 0.3, "multiplier_lr": -1.0}, ValueError, "multiplier_lr must be a finite number >= 0"),
        ({"target_density": 0.3, "multiplier_lr": math.inf}, ValueError, "multiplier_lr must be"),
        ({"target_density": 0.3, "dual_restarts": "no"}, TypeError, "dual_restarts must be True or False"),
        ({"target_density": 0.3, "final_phase": 1.0}, ValueError, "final_phase must be a number in [0, 1)"),
        ({"target_density": 0.3, "target_warmup": 2.5}, ValueError, "target_warmup must be a whole number >= 0"),
        ({"target_density": 0.3, "target_warmup": -1}, ValueError, "target_warmup must be"),
        ({"target_density": 0.3, "input_shape": (0, 3)}, ValueError, "input_shape must be a tuple"),
        ({"target_architecture": {"intermediate_size": 8}, "per_layer": True}, ValueError, "already constrains"),
        ({"target_architecture": 0.5}, TypeError, "target_architecture must be a dict"),
    ],
)
def test_every_setting_is_checked_when_the_objective_is_built(settings, error, words):
    with pytest.raises(error, match=None) as caught:
        Constrained(**settings)
    assert words in str(caught.value)


def test_settings_keep_their_values_and_compare_by_value():
    c = Constrained(target_density=0.3, target_warmup=150.0, arrival=0)
    assert (c.target_warmup, c.arrival, c.multiplier_lr, c.final_phase) == (150, 0.0, None, 0.3)
    assert isinstance(c.target_warmup, int)
    assert c == Constrained(target_density=0.3, target_warmup=150, arrival=0.0)
    assert c != Constrained(target_density=0.4, target_warmup=150, arrival=0.0)
    assert Constrained(target_density=[0.3, 0.5], per_layer=True) == Constrained(
        target_density=torch.tensor([0.3, 0.5], dtype=torch.float64), per_layer=True
    )
    assert repr(c).startswith("Constrained(target_density=0.3, target_flops=None")
    assert Constrained(target_architecture=TargetArchitecture(intermediate_size=8)).target_architecture is not None
    assert Bayes() == as_objective("bayes") and Penalized() == as_objective(Penalized)
    assert Bayes() != Penalized()


@pytest.mark.parametrize(("value", "error"), [("constrained", ValueError), ("l0", ValueError), (None, TypeError)])
def test_a_name_without_defaults_or_an_unknown_one_is_refused(value, error):
    with pytest.raises(error, match="objective"):
        train(_model(), *_data(), objective=value, epochs=1, progress=False)


def test_one_objective_object_serves_several_runs_and_is_not_changed_by_them():
    objective = Constrained(target_density=0.5, target_warmup=4, final_phase=0.5)
    before = repr(objective)
    first = train(_model(), *_data(), objective=objective, epochs=2, **COMMON)
    second = train(_model(), *_data(), objective=objective, epochs=2, **COMMON)
    assert repr(objective) == before
    assert [r["train_loss"] for r in first.history] == [r["train_loss"] for r in second.history]


def test_the_multiplier_step_defaults_to_three_gate_steps():
    model = _model()
    built = Constrained(target_density=0.5).build(model, 48, gate_lr=0.02)
    assert built.multiplier_lr == pytest.approx(0.06)
    assert Constrained(target_density=0.5).build(model, 48).multiplier_lr == MULTIPLIER_LR
    assert Constrained(target_density=0.5, multiplier_lr=0.5).build(model, 48, gate_lr=0.02).multiplier_lr == 0.5


def test_target_flops_with_batches_needs_the_shape_and_takes_it_from_the_objective():
    x, y = _data()
    batches = [(x[i : i + 16], y[i : i + 16]) for i in range(0, 48, 16)]
    with pytest.raises(ValueError, match=r"Constrained\(input_shape=...\)"):
        train(_model(), batches, objective=Constrained(target_flops=0.5), epochs=1, num_data=48, progress=False)
    run = train(
        _model(),
        batches,
        objective=Constrained(target_flops=0.5, input_shape=(6,)),
        epochs=1,
        num_data=48,
        progress=False,
    )
    assert 0 < run.history[-1]["test_time_flops"] <= 1 and run.history[-1]["expected_flops"] > 0


def test_train_takes_the_loop_settings_only():
    parameters = inspect.signature(train).parameters
    assert len(parameters) <= 23
    gone = {"target_density", "target_flops", "target_architecture", "rank", "arrival", "per_layer", "multiplier_lr",
            "dual_restarts", "final_phase", "target_warmup", "input_shape", "ema_decay", "log_alpha_range"}  # fmt: skip
    assert not gone & set(parameters)
    with pytest.raises(TypeError, match="target_density"):
        train(_model(), *_data(), objective="penalized", target_density=0.5)


def test_no_public_function_takes_more_than_about_twenty_arguments():
    import importlib
    import pkgutil

    import l0bayes

    crowded = []
    for info in pkgutil.walk_packages(l0bayes.__path__, "l0bayes."):
        if ".cli" in info.name or info.name.endswith("__main__"):
            continue
        module = importlib.import_module(info.name)
        for name, value in vars(module).items():
            if name.startswith("_") or getattr(value, "__module__", None) != module.__name__:
                continue
            functions = [value] if inspect.isfunction(value) else []
            if inspect.isclass(value):
                functions = [f for n, f in vars(value).items() if inspect.isfunction(f) and not n.startswith("_")]
                functions.append(value.__init__)
            for f in functions:
                try:
                    count = len([p for p in inspect.signature(f).parameters if p not in ("self", "cls")])
                except (TypeError, ValueError):
                    continue
                if count > 23:
                    crowded.append(f"{module.__name__}.{f.__qualname__}: {count}")
    assert not crowded


@pytest.mark.parametrize("callbacks_first", [False, True])
def test_averaging_and_projection_as_callbacks_are_the_runs_of_ema_decay_and_log_alpha_range(callbacks_first):
    # The numbers of train(..., ema_decay=0.9, log_alpha_range=RANGE) before these were callbacks.
    expected = json.loads((OLD / "expected.json").read_text())["bayes_ema"]
    callbacks = [ParameterAveraging(0.9), LogAlphaProjection(*RANGE)]
    run = train(_model(), *_data(), objective=Bayes(), epochs=4, callbacks=callbacks[:: -1 if callbacks_first else 1],
                **COMMON)  # fmt: skip
    assert [r["train_loss"] for r in run.history] == pytest.approx(expected, rel=1e-5)


@pytest.mark.parametrize(
    ("name", "objective", "callbacks"),
    [
        ("constrained", Constrained(target_density=0.5, target_warmup=4), []),
        ("bayes_ema", "bayes", [ParameterAveraging(0.9), LogAlphaProjection(*RANGE)]),
    ],
)
def test_a_run_saved_before_objectives_were_objects_resumes(tmp_path, name, objective, callbacks):
    path = tmp_path / "run.pt"
    shutil.copyfile(OLD / f"{name}.pt", path)
    resumed = train(_model(), *_data(), objective=objective, epochs=4, checkpoint=str(path), resume=True,
                    callbacks=callbacks, **COMMON)  # fmt: skip
    whole = train(_model(), *_data(), objective=objective, epochs=4, callbacks=callbacks, **COMMON)
    losses = [r["train_loss"] for r in resumed.history]
    assert losses == [r["train_loss"] for r in whole.history]  # bit for bit, here
    assert losses == pytest.approx(json.loads((OLD / "expected.json").read_text())[name], rel=1e-5)
    for a, b in zip(resumed.model.parameters(), whole.model.parameters(), strict=True):
        assert torch.equal(a, b)


def test_resuming_with_other_settings_is_refused_naming_them(tmp_path):
    path = tmp_path / "run.pt"
    shutil.copyfile(OLD / "constrained.pt", path)
    with pytest.raises(ValueError, match="target_warmup=4, this run asks target_warmup=2"):
        train(_model(), *_data(), objective=Constrained(target_density=0.5, target_warmup=2), epochs=4,
              checkpoint=str(path), resume=True, **COMMON)  # fmt: skip
    with pytest.raises(ValueError, match="objective"):
        train(_model(), *_data(), objective="penalized", epochs=4, checkpoint=str(path), resume=True, **COMMON)
    with pytest.raises(ValueError, match="ParameterAveraging"):
        shutil.copyfile(OLD / "constrained.pt", path)
        train(_model(), *_data(), objective=Constrained(target_density=0.5, target_warmup=4), epochs=4,
              checkpoint=str(path), resume=True, callbacks=[ParameterAveraging(0.9)], **COMMON)  # fmt: skip


@pytest.mark.parametrize(("make", "error"), [
    (lambda: ParameterAveraging(1.0), ValueError), (lambda: ParameterAveraging("0.9"), TypeError),
    (lambda: LogAlphaProjection(2.0, 1.0), ValueError), (lambda: LogAlphaProjection(float("nan"), 1.0), ValueError),
])  # fmt: skip
def test_the_parameter_callbacks_check_their_settings(make, error):
    with pytest.raises(error):
        make()


def test_the_package_exports_the_objectives():
    for name in ("Bayes", "Penalized", "Constrained", "ParameterAveraging", "LogAlphaProjection"):
        assert name in inference.__all__
    assert np  # (numpy arrays are targets too)
    Constrained(target_density=np.array([0.5]))


def test_expected_flops_are_recorded_by_their_callback_with_the_recorded_parameters():
    from l0bayes.inference import ExpectedFlops
    from l0bayes.pruning import expected_flops

    plain = train(_model(), *_data(), objective="penalized", epochs=2, **COMMON)
    assert all("expected_flops" not in r for r in plain.history)  # only where asked
    run = train(_model(), *_data(), objective="penalized", epochs=2, callbacks=[ExpectedFlops((6,))], **COMMON)
    assert [r["train_loss"] for r in run.history] == [r["train_loss"] for r in plain.history]  # it changes nothing
    assert run.history[-1]["expected_flops"] == pytest.approx(float(expected_flops(run.model.net, (6,))))
    # With an average kept, the record (and the returned model) hold the averaged parameters: so do the FLOPs.
    averaged = train(_model(), *_data(), objective="penalized", epochs=2, record_every=2,
                     callbacks=[ExpectedFlops(6), ParameterAveraging(0.5)], **COMMON)  # fmt: skip
    assert "expected_flops" not in averaged.history[0] and averaged.history[0]["full_record"] is False
    assert averaged.history[-1]["expected_flops"] == pytest.approx(float(expected_flops(averaged.model.net, (6,))))


def test_expected_flops_refuses_a_shape_or_a_network_it_cannot_count():
    from l0bayes.inference import ExpectedFlops
    from l0bayes.models import SparseLinearRegression

    with pytest.raises(ValueError, match="input_shape must be a tuple"):
        ExpectedFlops((0, 2))
    x = torch.randn(30, 3)
    with pytest.raises(ValueError, match="FLOPs"):
        train(SparseLinearRegression(3), x, x[:, 0], objective="penalized", epochs=1, progress=False,
              callbacks=[ExpectedFlops((3,))])  # fmt: skip


def test_the_settings_are_a_copy_of_the_targets_given():
    targets = [0.3, 0.5]
    tensor = torch.tensor([0.3, 0.5])
    by_list = Constrained(target_density=targets, per_layer=True)
    by_tensor = Constrained(target_density=tensor, per_layer=True)
    targets[0], tensor[0] = 0.9, 0.9
    assert by_list.target_density == (0.3, 0.5)
    assert by_tensor.target_density.tolist() == pytest.approx([0.3, 0.5])


BAD_SHAPES = [((0, 3), ValueError), ((), ValueError), ((2, True), ValueError), ((2.0, 3), ValueError),
              (3.5, TypeError), (object(), TypeError)]  # fmt: skip


@pytest.mark.parametrize(("shape", "error"), BAD_SHAPES)
def test_one_rule_checks_an_input_shape_wherever_it_is_given(shape, error):
    from l0bayes.inference import ExpectedFlops

    for make, owner in (
        (lambda s: Constrained(target_flops=0.5, input_shape=s), "Constrained"),
        (ExpectedFlops, "ExpectedFlops"),
    ):
        with pytest.raises(error, match=f"{owner}: input_shape must be a tuple of whole numbers >= 1"):
            make(shape)
    assert Constrained(target_flops=0.5, input_shape=np.int64(6)).input_shape == (6,)
    assert ExpectedFlops([1, np.int64(8), 8]).input_shape == (1, 8, 8)
