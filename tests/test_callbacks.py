"""The training loop's callbacks: order of events, resume, TensorBoard, early stopping, own data and losses."""

import itertools
import time

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from l0bayes.inference import Constrained, train
from l0bayes.inference.callbacks import Callback, EarlyStopping, TensorBoard
from l0bayes.models import SparseClassifier, SparseModel
from l0bayes.nn import L0MLP
from l0bayes.pruning import sparsify


def _digits_like(n=120, features=8, classes=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, features, generator=g)
    y = (x[:, :classes] + 0.3 * torch.randn(n, classes, generator=g)).argmax(1)
    return x, y


def _classifier(seed=0):
    torch.manual_seed(seed)
    return SparseClassifier(L0MLP(8, (10,), 3), lam=0.1)


class Recorder(Callback):
    """Records every event, and counts steps in a state that must survive a resume."""

    state_key = "recorder"

    def __init__(self):
        self.events, self.steps = [], 0

    def on_fit_start(self, run):
        self.events.append(("fit_start", run.epoch))

    def on_epoch_start(self, run):
        self.events.append(("epoch_start", run.epoch))

    def on_step_end(self, run):
        self.steps += 1
        self.events.append(("step", run.epoch))

    def on_epoch_end(self, run, record):
        self.events.append(("epoch_end", run.epoch, "mean_loss" in record))
        record["steps_seen"] = self.steps

    def on_fit_end(self, run):
        self.events.append(("fit_end", run.epoch))

    def state_dict(self):
        return {"steps": self.steps}

    def load_state_dict(self, state):
        self.steps = state["steps"]


def test_a_user_callback_sees_every_event_in_order():
    x, y = _digits_like()
    cb = Recorder()
    result = train(_classifier(), x, y, objective="penalized", epochs=2, batch_size=40, progress=False, callbacks=[cb])
    per_epoch = [("epoch_start", 0)] + [("step", 0)] * 3 + [("epoch_end", 0, True)]
    per_epoch += [("epoch_start", 1)] + [("step", 1)] * 3 + [("epoch_end", 1, True)]
    assert cb.events == [("fit_start", 0)] + per_epoch + [("fit_end", 2)]
    assert [r["steps_seen"] for r in result.history] == [3, 6]  # user entries land in the history


def test_an_error_reaches_on_exception_not_on_fit_end():
    class Boom(Callback):
        def __init__(self):
            self.seen = []

        def on_step_end(self, run):
            raise RuntimeError("boom")

        def on_exception(self, run, error):
            self.seen.append(type(error).__name__)

        def on_fit_end(self, run):
            self.seen.append("fit_end")

    x, y = _digits_like()
    cb = Boom()
    with pytest.raises(RuntimeError, match="boom"):
        train(_classifier(), x, y, objective="penalized", epochs=1, progress=False, callbacks=[cb])
    assert cb.seen == ["RuntimeError"]


def test_callbacks_must_be_callbacks_and_their_state_keys_distinct():
    x, y = _digits_like()
    with pytest.raises(TypeError, match="Callback instances"):
        train(_classifier(), x, y, epochs=1, progress=False, callbacks=[lambda run: None])
    with pytest.raises(ValueError, match="distinct state_key"):
        train(_classifier(), x, y, epochs=1, progress=False, callbacks=[Recorder(), Recorder()])


@pytest.mark.parametrize("objective", ["bayes", "penalized", "constrained"])
def test_resume_with_callbacks_is_bit_identical(objective, tmp_path, interrupt_at_epoch):
    x, y = _digits_like()
    test, validation = _digits_like(60, seed=1), _digits_like(40, seed=2)
    kw = dict(objective=objective, epochs=4, batch_size=40, lr=0.02, seed=5, progress=False, test_data=test)
    kw["validation_data"] = validation
    if objective == "constrained":
        kw["objective"] = Constrained(target_density=0.5, final_phase=0.5)

    def callbacks(log_dir):
        return [Recorder(), EarlyStopping(patience=10), TensorBoard(log_dir)]  # monitors validation_error

    straight_model = _classifier()
    straight = train(straight_model, x, y, callbacks=callbacks(tmp_path / "tb_straight"), **kw)

    ckpt = tmp_path / "ckpt.pt"
    with interrupt_at_epoch(2):
        train(_classifier(), x, y, checkpoint=str(ckpt), callbacks=callbacks(tmp_path / "tb"), **kw)
    torch.manual_seed(123)  # the resume restores every random state
    resumed_model = _classifier(seed=7)
    resumed = train(resumed_model, x, y, checkpoint=str(ckpt), resume=True, callbacks=callbacks(tmp_path / "tb"), **kw)
    for a, b in zip(straight_model.state_dict().values(), resumed_model.state_dict().values(), strict=True):
        assert torch.equal(a, b)
    keys = ("mean_loss", "steps_seen", "best", "best_epoch", "validation_error", "test_error", "free_energy")
    assert [[h[k] for k in keys] for h in straight.history] == [[h[k] for k in keys] for h in resumed.history]
    assert [h["best"] for h in straight.history] == list(itertools.accumulate(
        (h["validation_error"] for h in straight.history), min))  # fmt: skip


def _scalars(log_dir):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(log_dir))
    events.Reload()
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


def test_tensorboard_event_file_holds_the_record(tmp_path):
    pytest.importorskip("tensorboard")
    x, y = _digits_like()
    log_dir = tmp_path / "tb"
    result = train(
        _classifier(), x, y, epochs=3, batch_size=40, progress=False, test_data=_digits_like(60, seed=1),
        callbacks=[TensorBoard(log_dir)],
    )  # fmt: skip
    scalars = _scalars(log_dir)
    for name in ("free_energy", "test_error", "expected_l0", "mean_loss", "lr/0"):
        expected = [(r["epoch"], r[name] if name != "lr/0" else r["lr"][0]) for r in result.history]
        assert [(s, pytest.approx(v, rel=1e-6)) for s, v in scalars[name]] == expected, name
    # the open gates per layer, named as the user named the layers
    layers = sorted(k for k in scalars if k.startswith("open_gates/"))
    assert layers == ["open_gates/fc1", "open_gates/fc2"]
    counts = [int(v) for _, v in scalars["open_gates/fc1"]]
    assert counts == [r["active_gates"][0] for r in result.history]
    # a new run refuses a directory with another run's events
    with pytest.raises(FileExistsError, match="another run"):
        train(_classifier(), x, y, epochs=1, progress=False, callbacks=[TensorBoard(log_dir)])


def test_tensorboard_resume_purges_what_came_after_the_checkpoint(tmp_path, interrupt_at_epoch):
    pytest.importorskip("tensorboard")
    x, y = _digits_like()
    kw = dict(epochs=3, batch_size=40, progress=False, objective="penalized")
    ckpt, log_dir = tmp_path / "ckpt.pt", tmp_path / "tb"
    with interrupt_at_epoch(2, saved=False):  # epoch 2 is logged but never saved: a crash after its events
        train(_classifier(), x, y, checkpoint=str(ckpt), callbacks=[TensorBoard(log_dir)], **kw)
    # TensorBoard reads event files in the order of their names, which start with the second they were opened
    time.sleep(1.1)
    resumed = train(_classifier(), x, y, checkpoint=str(ckpt), resume=True, callbacks=[TensorBoard(log_dir)], **kw)
    steps = [s for s, _ in _scalars(log_dir)["mean_loss"]]
    assert steps == [1, 2, 3]  # epoch 2 once: the interrupted run's epoch-2 event was purged
    values = [v for _, v in _scalars(log_dir)["mean_loss"]]
    assert values[1:] == pytest.approx([r["mean_loss"] for r in resumed.history[1:]], rel=1e-6)


def test_early_stopping_stops_and_restores_the_best_state():
    x, y = _digits_like(200)
    validation = _digits_like(100, seed=1)

    class Spy(Callback):
        def __init__(self):
            self.states = {}

        def on_epoch_end(self, run, record):
            self.states[run.epoch + 1] = {k: v.clone() for k, v in run.model.state_dict().items()}

    spy = Spy()
    model = _classifier()
    # lr so large that the validation error gets worse after a few epochs
    stop = EarlyStopping(patience=2)  # monitors validation_error
    result = train(
        model, x, y, objective="penalized", epochs=30, batch_size=50, lr=0.5, progress=False,
        validation_data=validation, callbacks=[stop, spy],
    )  # fmt: skip
    errors = [r["validation_error"] for r in result.history]
    best = min(range(len(errors)), key=lambda i: (errors[i], i))
    assert len(result.history) < 30 and result.history[-1]["stopped_early"]
    assert len(result.history) == best + 1 + 2  # stopped after `patience` epochs without improvement
    assert stop.best_epoch == best + 1 and stop.best == errors[best]
    for k, v in model.state_dict().items():
        assert torch.equal(v, spy.states[best + 1][k].to(v.device)), k  # train() may have run on a GPU
    with pytest.raises(ValueError, match="patience"):
        EarlyStopping(patience=0)
    with pytest.raises(KeyError, match="no 'validation_accuracy'"):
        train(_classifier(), x, y, epochs=1, progress=False, callbacks=[EarlyStopping("validation_accuracy")])


class ResidualNet(nn.Module):
    """A small residual CNN of a user's own, not an nn.Sequential."""

    def __init__(self, outputs):
        super().__init__()
        self.stem = nn.Conv2d(1, 6, 3, padding=1)
        self.block = nn.Sequential(nn.Conv2d(6, 6, 3, padding=1), nn.BatchNorm2d(6), nn.ReLU())
        self.head = nn.Linear(6, outputs)

    def forward(self, x):
        h = torch.relu(self.stem(x))
        h = h + self.block(h)
        return self.head(h.mean((2, 3)))


def _images(n=64, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 1, 8, 8, generator=g)
    return x, g


LOSSES = {
    # regression: a Gaussian likelihood with unit noise, 0.5 (y - f)^2 per example
    "regression": (
        1,
        lambda x, g: x.mean((1, 2, 3), keepdim=False).unsqueeze(1) * 3.0,
        lambda o, t: 0.5 * F.mse_loss(o, t),
    ),
    # multi-label: independent Bernoulli labels
    "multilabel": (
        3,
        lambda x, g: (x[:, 0, :3, 0] > 0).float(),
        lambda o, t: F.binary_cross_entropy_with_logits(o, t),
    ),
}


@pytest.mark.parametrize("objective", ["bayes", "penalized", "constrained"])
@pytest.mark.parametrize("task", sorted(LOSSES))
def test_a_sparsified_model_with_its_own_loss_trains_from_a_dataloader(task, objective):
    outputs, target, loss_fn = LOSSES[task]
    x, g = _images()
    y = target(x, g)
    torch.manual_seed(0)
    net = sparsify(ResidualNet(outputs), example_inputs=x[:2])
    model = SparseModel(net, loss_fn, lam=0.05)
    loader = DataLoader(TensorDataset(x, y), batch_size=16, shuffle=True)
    # only the head's inputs can go: the stem's and the block's channels enter the residual addition
    with torch.no_grad():
        before = float(loss_fn(model.eval()(x), y))
    chosen = Constrained(target_density=0.99) if objective == "constrained" else objective
    result = train(model, loader, objective=chosen, epochs=8, lr=0.02, progress=False, test_data=loader)
    assert len(result.history) == 8
    record = result.history[-1]
    assert record["test_loss"] < before  # it learned
    assert record["nll"] == pytest.approx(len(x) * record["test_loss"], rel=1.0)  # N * mean loss, same scale
    if objective == "bayes":
        assert record["gate_kl"] > 0
    if objective == "constrained":
        assert record["test_time_density"] <= 0.99 + 1e-9


def test_dataloader_resume_is_bit_identical(tmp_path, interrupt_at_epoch):
    x, y = _digits_like()
    loader = DataLoader(TensorDataset(x, y), batch_size=32, shuffle=True)  # order from torch's global RNG
    kw = dict(objective="penalized", epochs=3, lr=0.05, progress=False)
    straight_model = _classifier()
    train(straight_model, loader, **kw)
    with interrupt_at_epoch(1):
        train(_classifier(), loader, checkpoint=str(tmp_path / "c.pt"), **kw)
    torch.manual_seed(99)
    resumed_model = _classifier()
    train(resumed_model, loader, checkpoint=str(tmp_path / "c.pt"), resume=True, **kw)
    for a, b in zip(straight_model.state_dict().values(), resumed_model.state_dict().values(), strict=True):
        assert torch.equal(a, b)


def test_an_iterable_without_a_length_needs_num_data():
    x, y = _digits_like()
    batches = [(x[i : i + 40], y[i : i + 40]) for i in range(0, 120, 40)]
    with pytest.raises(ValueError, match="num_data"):
        train(_classifier(), iter(batches), epochs=1, progress=False)
    result = train(_classifier(), batches, num_data=120, epochs=2, progress=False, objective="penalized")
    assert len(result.history) == 2
    with pytest.raises(TypeError, match="with y=None"):
        train(_classifier(), batches, y, num_data=120, epochs=1, progress=False)


def test_the_first_batches_of_an_iterable_are_checked_and_a_list_of_two_batches_is_batches():
    x, y = _digits_like()
    loader = DataLoader(TensorDataset(x.double(), y), batch_size=40)  # float64 data, float32 model
    with pytest.raises(TypeError, match=r"^the x of batch 1 of x in epoch 1 has dtype torch.float64"):
        train(_classifier(), loader, epochs=1, progress=False)
    bad = DataLoader(TensorDataset(x, y + 5), batch_size=40)  # labels beyond the 3 classes
    with pytest.raises(ValueError, match="class labels must lie in"):
        train(_classifier(), bad, epochs=1, progress=False)
    two_batches = [(x[:60], y[:60]), (x[60:], y[60:])]  # test data as a list of two batches, not a pair
    result = train(_classifier(), x, y, epochs=1, progress=False, test_data=two_batches)
    assert 0 <= result.history[-1]["test_error"] <= 1


# -------------------------------------------------------------------------- another run's data, resumed settings
def test_a_resumed_run_refuses_another_runs_tensorboard_directory_and_leaves_its_events(tmp_path):
    pytest.importorskip("tensorboard")
    x, y = _digits_like()
    kw = dict(epochs=4, batch_size=40, progress=False, objective="penalized")
    run_a = tmp_path / "a"
    train(_classifier(), x, y, callbacks=[TensorBoard(run_a)], **kw)
    before = _scalars(run_a)
    assert [s for s, _ in before["mean_loss"]] == [1, 2, 3, 4]
    ckpt_b = tmp_path / "b.pt"
    for logged in (None, tmp_path / "b_logs"):  # run B without TensorBoard, and with its own directory
        callbacks = [] if logged is None else [TensorBoard(logged)]
        train(_classifier(), x, y, checkpoint=str(ckpt_b), lr=0.01, callbacks=callbacks, **{**kw, "epochs": 2})
        time.sleep(1.1)  # (a new event file would sort after A's)
        with pytest.raises(FileExistsError, match=r"holds event files of another run .*steps after 2"):
            train(_classifier(), x, y, checkpoint=str(ckpt_b), resume=True, lr=0.01,
                  callbacks=[TensorBoard(run_a)], **kw)  # fmt: skip
        assert _scalars(run_a) == before  # A's step 3 and 4 as they were
    # B resumed into its own directory continues its curve after its checkpoint
    resumed = train(_classifier(), x, y, checkpoint=str(ckpt_b), resume=True, lr=0.01,
                    callbacks=[TensorBoard(tmp_path / "b_logs")], **kw)  # fmt: skip
    logged = _scalars(tmp_path / "b_logs")["mean_loss"]
    assert logged == [(r["epoch"], pytest.approx(r["mean_loss"], rel=1e-6)) for r in resumed.history]


def test_early_stopping_resumed_with_another_monitor_or_mode_is_refused(tmp_path):
    x, y = _digits_like()
    kw = dict(epochs=4, batch_size=40, progress=False, objective="penalized", checkpoint=str(tmp_path / "c.pt"))
    train(_classifier(), x, y, callbacks=[EarlyStopping("free_energy", patience=9)], **{**kw, "epochs": 2})
    for other, message in [
        (EarlyStopping("mean_loss", patience=9), "monitor 'free_energy' -> 'mean_loss'"),
        (EarlyStopping("free_energy", mode="max", patience=9), "mode 'min' -> 'max'"),
    ]:
        with pytest.raises(ValueError, match=rf"cannot resume EarlyStopping: .*{message}"):
            train(_classifier(), x, y, resume=True, callbacks=[other], **kw)
    # patience may change: the best value and the epochs waited carry over
    stop = EarlyStopping("free_energy", patience=20)
    result = train(_classifier(), x, y, resume=True, callbacks=[stop], **kw)
    energies = [r["free_energy"] for r in result.history]
    assert [r["best"] for r in result.history] == list(itertools.accumulate(energies, min))


def test_early_stopping_refuses_a_flag_or_a_list():
    for name, held in [("full_record", "a flag"), ("lr", "a list"), ("active_gates", "a list")]:
        with pytest.raises(ValueError, match=rf"monitor='{name}': the record's '{name}' is {held}"):
            EarlyStopping(name)
    with pytest.raises(TypeError, match="monitor must be the name of a record entry"):
        EarlyStopping(3)

    class PerClass(Callback):  # a user's entry that is a list, found at the first record
        def on_epoch_end(self, run, record):
            record["per_class"] = [0.1, 0.2]

    x, y = _digits_like()
    with pytest.raises(ValueError, match=r"monitor='per_class'\): the record's 'per_class' is \[0.1, 0.2\] \(a list\)"):
        train(_classifier(), x, y, epochs=1, progress=False, callbacks=[PerClass(), EarlyStopping("per_class")])


def test_numpy_scalars_in_the_record_become_numbers_and_other_objects_are_refused(tmp_path):
    np = pytest.importorskip("numpy")

    class Entries(Callback):
        def __init__(self, value):
            self.value = value

        def on_epoch_end(self, run, record):
            record["mine"] = self.value

    x, y = _digits_like()
    kw = dict(epochs=1, progress=False, checkpoint=str(tmp_path / "c.pt"))
    result = train(_classifier(), x, y, callbacks=[Entries({"a": np.float32(0.5), "b": [np.int64(3)]})], **kw)
    entry = result.history[-1]["mine"]
    assert entry == {"a": 0.5, "b": [3]} and type(entry["a"]) is float and type(entry["b"][0]) is int
    from l0bayes.io import load_checkpoint

    assert load_checkpoint(tmp_path / "c.pt")["history"][-1]["mine"] == {"a": 0.5, "b": [3]}  # weights_only
    with pytest.raises(TypeError, match=r"^Entries put record\['mine'\] = array\(\[1\., 2\.\]\), a numpy.ndarray"):
        train(_classifier(), x, y, callbacks=[Entries(np.array([1.0, 2.0]))], **kw)


def test_validation_data_is_recorded_as_an_independent_evaluation_and_monitored_by_default():
    x, y = _digits_like()
    xv, yv = _digits_like(50, seed=3)
    kw = dict(epochs=3, batch_size=40, progress=False, objective="penalized", lr=0.05)
    plain_model, model = _classifier(), _classifier()
    plain = train(plain_model, x, y, **kw)
    stop = EarlyStopping(patience=5)
    result = train(model, x, y, validation_data=(xv, yv), callbacks=[stop], **kw)
    # the evaluation does not change the training draws
    for a, b in zip(plain_model.state_dict().values(), model.state_dict().values(), strict=True):
        assert torch.equal(a, b)
    assert [r["mean_loss"] for r in plain.history] == [r["mean_loss"] for r in result.history]
    with torch.no_grad():
        expected = float((model.eval()(xv).argmax(-1) != yv).double().mean())  # the last epoch's parameters
    assert result.history[-1]["validation_error"] == pytest.approx(expected, abs=1e-12)
    assert stop.best == min(r["validation_error"] for r in result.history) and "test_error" not in result.history[0]
    with pytest.raises(ValueError, match=r"monitors the validation metric by default, but train\(\) was given no"):
        train(_classifier(), x, y, callbacks=[EarlyStopping()], **kw)
    with pytest.warns(UserWarning, match="chooses the best epoch on the test data"):
        EarlyStopping("test_error")
    with pytest.raises(TypeError, match="validation_data is an iterator"):
        train(_classifier(), x, y, validation_data=(b for b in [(xv, yv)]), **kw)
    with pytest.raises(TypeError, match=r"validation_data\[0\] has dtype torch.float64"):
        train(_classifier(), x, y, validation_data=(xv.double(), yv), **kw)


def test_a_resume_with_other_validation_data_is_refused(tmp_path):
    x, y = _digits_like()
    kw = dict(epochs=2, batch_size=40, progress=False, objective="penalized", checkpoint=str(tmp_path / "c.pt"))
    train(_classifier(), x, y, validation_data=_digits_like(40, seed=2), **{**kw, "epochs": 1})
    with pytest.raises(ValueError, match=r"the run changed: validation_data \(tensors -> tensors"):
        train(_classifier(), x, y, resume=True, validation_data=_digits_like(40, seed=4), **kw)
    with pytest.raises(ValueError, match=r"the run changed: validation_data \(tensors -> none"):
        train(_classifier(), x, y, resume=True, **kw)


def test_held_out_data_in_a_dataloader_changes_no_training_draw():
    x, y = _digits_like()
    held_out = DataLoader(TensorDataset(*_digits_like(30, seed=5)), batch_size=10)  # draws its seed from torch
    kw = dict(epochs=3, batch_size=40, progress=False, objective="bayes", lr=0.05)
    alone, with_test = _classifier(), _classifier()
    train(alone, x, y, **kw)
    result = train(with_test, x, y, test_data=held_out, **kw)
    for a, b in zip(alone.state_dict().values(), with_test.state_dict().values(), strict=True):
        assert torch.equal(a, b)
    assert all(0 <= r["test_error"] <= 1 for r in result.history)
