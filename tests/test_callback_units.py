"""Each built-in callback on its own, driven through the loop (``fit``) with a small run."""

import io
import math
import types

import pytest
import torch

from l0bayes.inference import NonFiniteLossError
from l0bayes.inference.batches import TensorBatches
from l0bayes.inference.callbacks import (
    Callback,
    CallbackList,
    Checkpointing,
    FiniteParameters,
    History,
    LogAlphaProjection,
    LRSchedule,
    ParameterAveraging,
    ProgressBar,
)
from l0bayes.inference.distributed import DataParallelContext
from l0bayes.inference.loop import Run, fit
from l0bayes.inference.objectives import as_objective
from l0bayes.io import load_checkpoint
from l0bayes.models import SparseClassifier
from l0bayes.nn import L0MLP, gates_of


def _run(epochs=2, lr=0.05, objective="penalized", seed=0):
    torch.manual_seed(seed)
    model = SparseClassifier(L0MLP(6, (5,), 3), lam=0.1)
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(60, 6, generator=g)
    y = torch.randint(0, 3, (60,), generator=g)
    ddp = DataParallelContext(False)
    batches = TensorBatches(x, y, 20, seed, ddp)
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    estimator = as_objective(objective).build(model, 60)
    run = Run(model, optimizer, estimator, batches, estimator.step, epochs, 60, torch.device("cpu"))
    run.steps_per_epoch = batches.steps_per_epoch
    return run, ddp


def _fit(run, callbacks):
    run.callbacks = CallbackList(callbacks)
    run.callbacks.setup(run)
    return fit(run)


def test_loop_alone_trains_and_counts():
    run, _ = _run()
    before = [p.detach().clone() for p in run.model.parameters()]
    _fit(run, [])
    assert run.epoch == 2 and run.global_step == 6 and run.epoch_steps == 3
    assert any(not torch.equal(a, b) for a, b in zip(before, run.model.parameters(), strict=True))
    assert math.isfinite(run.mean_loss()) and run.history == []


def test_history_records_every_epoch_and_the_full_record_every_k():
    run, _ = _run(epochs=3)
    _fit(run, [History(run.batches.record_subset(), record_every=2)])
    assert [r["epoch"] for r in run.history] == [1, 2, 3]
    assert [r["full_record"] for r in run.history] == [False, True, True]  # every 2nd and the last
    assert "free_energy" in run.history[1] and "free_energy" not in run.history[0]
    assert all(r["mean_loss"] > 0 and r["wall_s"] >= 0 and r["lr"] == [0.05] for r in run.history)


def test_log_alpha_projection_keeps_every_gate_in_range():
    run, _ = _run(lr=1.0)  # big steps push log_alpha far
    seen = []

    class Watch(Callback):
        def on_step_end(self, run):
            seen.append(torch.cat([g.log_alpha.detach() for _, g in gates_of(run.model)]))

    _fit(run, [LogAlphaProjection(-0.5, 0.5), Watch()])
    values = torch.stack(seen)
    assert values.min() >= -0.5 and values.max() <= 0.5 and (values.abs() == 0.5).any()
    with pytest.raises(ValueError, match="LogAlphaProjection: low must be below high, got low=1.0, high=1.0"):
        LogAlphaProjection(1.0, 1.0)


def test_lr_schedule_records_the_epochs_step_size_then_steps():
    run, _ = _run(epochs=3)
    schedule = torch.optim.lr_scheduler.StepLR(run.optimizer, step_size=1, gamma=0.5)
    _fit(run, [History(run.batches.record_subset()), LRSchedule(schedule)])
    assert [r["lr"] for r in run.history] == [[0.05], [0.025], [0.0125]]
    assert run.optimizer.param_groups[0]["lr"] == pytest.approx(0.00625)
    plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(run.optimizer)
    assert LRSchedule(plateau).state_dict()["mode"] == "min"
    with pytest.raises(TypeError, match="learning-rate scheduler"):
        LRSchedule(object())


def test_parameter_averaging_evaluates_and_returns_the_average():
    run, _ = _run()
    raw_seen, averaged_seen = [], []

    class Watch(Callback):
        def on_epoch_end(self, run, record):
            raw_seen.append([p.detach().clone() for p in run.model.parameters()])
            with run.callbacks.evaluation(run):
                averaged_seen.append([p.detach().clone() for p in run.model.parameters()])

    averaging = ParameterAveraging(0.5)
    _fit(run, [averaging, Watch()])
    # inside evaluation the model holds the average, outside the raw iterate
    assert any(not torch.equal(a, b) for a, b in zip(raw_seen[-1], averaged_seen[-1], strict=True))
    for p, expected in zip(run.model.parameters(), averaging.average.averaged(), strict=True):
        assert torch.equal(p.detach(), expected)  # the model ends with the average
    assert averaging.state_dict()["steps"] == 6


def test_progress_bar_counts_the_steps_left(monkeypatch):
    bars = []

    class FakeBar:
        def __init__(self, total, **kw):
            self.total, self.n, self.postfix, self.closed = total, 0, None, False
            bars.append(self)

        def update(self, n):
            self.n += n

        def set_postfix(self, postfix):
            self.postfix = postfix

        def close(self):
            self.closed = True

    import tqdm.auto

    monkeypatch.setattr(tqdm.auto, "tqdm", FakeBar)
    run, _ = _run(epochs=3)
    run.epoch = 1  # as after a resume
    terminal = type("Terminal", (io.StringIO,), {"isatty": lambda self: True})()  # a file gets lines instead
    _fit(run, [History(run.batches.record_subset()), ProgressBar(file=terminal)])
    (bar,) = bars
    assert bar.total == bar.n == 6 and bar.closed and "free_energy" in bar.postfix


def test_finite_parameters_names_the_broken_parameter():
    run, _ = _run()

    class Break(Callback):
        def on_step_end(self, run):
            with torch.no_grad():
                run.model.net.fc1.gate.log_alpha[0] = float("nan")

    with pytest.raises(NonFiniteLossError, match=r"net\.fc1\.gate\.log_alpha.*epoch 1"):
        _fit(run, [Break(), FiniteParameters()])


def test_checkpointing_writes_what_restore_reads(tmp_path):
    path = tmp_path / "c.pt"
    run, ddp = _run()
    averaging = ParameterAveraging(0.9)
    _fit(run, [averaging, History(run.batches.record_subset()), Checkpointing(path, ddp, {"objective": "x"})])
    state = load_checkpoint(path)
    assert state["epoch"] == 2 and state["run"] == {"objective": "x"} and state["ema"]["steps"] == 6
    other, _ = _run(seed=1)
    other_averaging = ParameterAveraging(0.9)
    other.callbacks = CallbackList([other_averaging, Checkpointing(path, ddp, {})])
    other.callbacks.setup(other)
    other.callbacks.callbacks[-1].restore(other, state, seed=0)
    assert other.epoch == 2 and len(other.history) == 2
    for name, value in other.model.state_dict().items():  # the raw iterate (the model itself ends averaged)
        assert torch.equal(value, state["model"][name]), name
    assert other_averaging.average.steps == 6
    assert torch.equal(other.batches.shuffle.get_state(), run.batches.shuffle.get_state())
    # an averaging run needs the average in the checkpoint
    del state["ema"]
    third, _ = _run()
    third.callbacks = CallbackList([ParameterAveraging(0.9), Checkpointing(path, ddp, {})])
    third.callbacks.setup(third)
    with pytest.raises(ValueError, match="no parameter average"):
        third.callbacks.callbacks[-1].restore(third, state, seed=0)


def test_finite_check_reads_the_device_flag_only_when_due():
    from l0bayes.inference.loop import FiniteCheck

    immediate = FiniteCheck()
    immediate.observe(torch.tensor(1.0))
    with pytest.raises(NonFiniteLossError, match="nan"):
        immediate.observe(torch.tensor(float("nan")))
    delayed = FiniteCheck(4)
    for v in [1.0, 2.0, float("inf"), 3.0, float("nan")]:
        delayed.observe(torch.tensor(v))  # no error: nothing read yet
    assert [delayed.due(k) for k in (3, 4, 8)] == [False, True, True] and not immediate.due(1)
    with pytest.raises(NonFiniteLossError) as err:
        delayed.check()
    assert err.value.steps_ago == 3  # the inf, three steps before the read
    delayed.check()  # cleared by the read
    for bad in (0, 1.5, True):
        with pytest.raises(ValueError):
            FiniteCheck(bad)


@pytest.mark.parametrize("every", [1, 4])
@pytest.mark.parametrize("then", ["nan", "refused"])
def test_loop_names_the_first_non_finite_step_and_stops_before_the_epoch_record(every, then):
    from l0bayes.inference.loop import FiniteCheck

    run, _ = _run(epochs=3)
    run.steps_per_epoch = None
    run.finite = FiniteCheck(every)
    inner, seen = run.step, []

    def step(x, y):  # the objective goes NaN at the 5th step (epoch 2, step 2), then stays so or is refused
        if then == "refused" and run.global_step >= 5:  # as a distribution refuses NaN parameters
            raise ValueError("invalid parameters")
        loss, value, statistics, *data = inner(x, y)
        if run.global_step >= 4:
            value = value * float("nan")
        run.finite.observe(value)
        return loss, value, statistics, *data

    run.step = step

    class Records(Callback):
        def on_epoch_end(self, run, record):
            seen.append(record["epoch"])

    expected = r"epoch 2, step 2" + ("; lower" if every == 1 else r" \(found [01] step\(s\) later")
    with pytest.raises(NonFiniteLossError, match=expected):
        _fit(run, [Records()])
    assert seen == [1]  # the epoch that went non-finite was never recorded
    # every=4: read at the end of epoch 2 (3 steps), or when the next step raised
    assert run.global_step == (4 if every == 1 else 5 if then == "refused" else 6)


def test_tensor_batches_keep_the_data_on_the_run_device_in_the_same_order(device):
    x, y = torch.randn(50, 3), torch.arange(50)
    on_cpu = TensorBatches(x, y, 20, 7, DataParallelContext(False, "cpu"))
    on_device = TensorBatches(x, y, 20, 7, DataParallelContext(False, device))
    assert on_device.x.device.type == device.type and on_device.y.device.type == device.type
    run = types.SimpleNamespace(device=device)
    for (xa, ya), (xb, yb) in zip(on_cpu(run), on_device(run), strict=True):
        assert xb.device.type == device.type and torch.equal(ya.to(device), yb) and torch.equal(xa.to(device), xb)


def test_plain_keeps_what_a_safe_load_rebuilds_and_converts_numpy_scalars():
    import collections
    import fractions

    import numpy as np

    from l0bayes.inference.callbacks.base import plain

    kept = {"a": None, "b": True, "c": 3, "d": 0.5, "e": "s", "f": torch.ones(2), "g": torch.Size([2]),
            "h": collections.OrderedDict(x=1), "i": (1, [2.0, {"j": 1j}])}  # fmt: skip
    assert plain(kept, "here") == kept and type(plain(kept, "here")["h"]) is collections.OrderedDict
    converted = plain([np.float32(0.25), np.int8(-3), np.bool_(True), np.str_("t"), fractions.Fraction(1, 4)], "here")
    assert converted == [0.25, -3, True, "t", 0.25]
    assert [type(v) for v in converted] == [float, int, bool, str, float]
    point = collections.namedtuple("Point", "x y")(np.float64(1.0), 2)
    assert plain(point, "here") == (1.0, 2) and type(plain(point, "here")) is tuple  # its class cannot load
    with io.BytesIO() as f:  # what comes out of plain() loads with weights_only=True
        torch.save(plain({"k": point, "n": converted, "kept": kept}, "here"), f)
        f.seek(0)
        assert torch.load(f, weights_only=True)["k"] == (1.0, 2)
    for bad, kind in [(np.zeros(2), "numpy.ndarray"), (object(), "builtins.object"), (slice(1), "builtins.slice")]:
        with pytest.raises(TypeError, match=rf"^Mine put record\['k'\] = .*, a {kind}, which a checkpoint cannot hold"):
            plain({"x": [bad]}, "Mine put record['k'] =")
