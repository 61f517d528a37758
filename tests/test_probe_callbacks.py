"""Property-based probes of the callbacks: early stopping, TensorBoard, the record's values, validation data.

Every property checks an outcome: a ``TypeError`` / ``ValueError`` / ``FileExistsError`` whose message names
the argument or the entry, or a right answer against a reference computed here (early stopping from the
sequence of values, TensorBoard's events read back from the files, the validation metric evaluated on the
final parameters, a record's values converted one by one). Each runs twice: a few examples in the default run,
many more under ``-m slow``. Early stopping and TensorBoard are driven through their hooks with a stand-in
run (no training); the record and the validation data through :func:`~l0bayes.inference.train` on tiny models.
"""

import io
import math
import os
import re
import types
import uuid

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from l0bayes.inference import train
from l0bayes.inference.callbacks import Callback, CallbackList, EarlyStopping, TensorBoard
from l0bayes.inference.callbacks.tensorboard import RUN_ID_FILE
from l0bayes.io import load_checkpoint
from l0bayes.models import SparseClassifier, SparseLinearRegression, SparseModel
from l0bayes.nn import L0MLP

#: Examples per property: the default run, and the ``slow`` profile.
FAST, SLOW = 12, 200
PROFILES = [pytest.param(FAST, id="fast"), pytest.param(SLOW, marks=pytest.mark.slow, id="slow")]


def _profile(examples):
    return settings(max_examples=examples, deadline=None, derandomize=True, database=None)


# ------------------------------------------------------------------------------------------- a stand-in run
class _Run(types.SimpleNamespace):
    """What the hooks of EarlyStopping and TensorBoard read: the epoch, the model, ``stop``, the callbacks."""


def _stand_in(callbacks=()):
    model = nn.Linear(1, 1, bias=False)  # its weight is set to the epoch: the restored state names its epoch
    run = _Run(epoch=0, is_main=True, stop=False, model=model, history=[])
    run.callbacks = CallbackList(callbacks)
    return run


def _epoch(run, record):
    """One epoch's end through the callback list (which also makes the record's values plain)."""
    with torch.no_grad():
        run.model.weight.fill_(run.epoch + 1)
    record = {"epoch": run.epoch + 1, **record}
    run.callbacks.on_epoch_end(run, record)
    run.history.append(record)
    run.epoch += 1
    return record


def _reference(values, mode, patience, min_delta):
    """Early stopping's outcome from the sequence of values alone: ``[(best, best_epoch)]`` per epoch seen, and
    the 1-based epoch that stops the run (``None``: none). ``patience`` and ``min_delta``: one per epoch."""
    sign = 1.0 if mode == "min" else -1.0
    best, best_epoch, last_improved, out = math.inf * sign, None, 0, []
    for epoch, value in enumerate(values, start=1):
        # "below the best by more than min_delta" (or above, for max), as the docstring words it
        better = value < best - min_delta[epoch - 1] if mode == "min" else value > best + min_delta[epoch - 1]
        if better:
            best, best_epoch, last_improved = value, epoch, epoch
        out.append((best, best_epoch))
        if epoch - last_improved >= patience[epoch - 1]:
            return out, epoch
    return out, None


VALUES = st.lists(
    st.one_of(st.integers(-3, 3).map(float), st.floats(-10, 10, allow_nan=False), st.sampled_from((math.inf,))),
    min_size=1,
    max_size=12,
)
METRICS = ("validation_error", "free_energy")  # two numbers of each record: the stand-in's validation metric first


def _records(values):
    """The records of a sequence: ``validation_error`` is the value, ``free_energy`` something else."""
    return [{"validation_error": v, "free_energy": -2.0 * v + 1.0, "full_record": True} for v in values]


# ---------------------------------------------------------------------------------------------- early stopping
@pytest.mark.parametrize("examples", PROFILES)
def test_early_stopping_matches_the_reference_of_the_sequence(examples):
    @_profile(examples)
    @given(
        values=VALUES,
        monitor=st.sampled_from((None, *METRICS)),
        mode=st.sampled_from(("min", "max")),
        patience=st.integers(1, 4),
        min_delta=st.sampled_from((0.0, 0.5, 1, 2.5)),
        restore_best=st.booleans(),
    )
    def prop(values, monitor, mode, patience, min_delta, restore_best):
        stop = EarlyStopping(monitor, patience=patience, mode=mode, min_delta=min_delta, restore_best=restore_best)
        run = _stand_in([stop])
        records = _records(values)
        seen = []
        for record in records:
            if not run.stop:
                seen.append(_epoch(run, record)["best"])
        monitored = [r[monitor or "validation_error"] for r in records]
        expected, stopped = _reference(monitored, mode, [patience] * len(values), [min_delta] * len(values))
        assert seen == [b for b, _ in expected] and [h["best_epoch"] for h in run.history] == [e for _, e in expected]
        assert len(run.history) == (stopped or len(values)) and run.stop == (stopped is not None)
        assert [h.get("stopped_early", False) for h in run.history] == [i + 1 == stopped for i in range(len(seen))]
        stop.on_fit_end(run)
        best_epoch = expected[-1][1]
        kept = best_epoch if restore_best and best_epoch is not None else len(run.history)
        assert run.model.weight.item() == kept  # the best epoch's parameters, or the last ones

    prop()


@pytest.mark.parametrize("examples", PROFILES)
def test_a_resumed_early_stopping_continues_or_names_what_changed(examples):
    settings_ = st.tuples(
        st.sampled_from((None, *METRICS)),
        st.sampled_from(("min", "max")),
        st.integers(1, 4),
        st.sampled_from((0.0, 0.5, 2.0)),
        st.booleans(),
    )

    @_profile(examples)
    @given(values=VALUES, at=st.integers(1, 12), before=settings_, after=settings_)
    def prop(values, at, before, after):
        at = min(at, len(values))
        first = EarlyStopping(
            before[0], patience=before[2], mode=before[1], min_delta=before[3], restore_best=before[4]
        )
        run = _stand_in([first])
        records = _records(values)
        for record in records[:at]:
            if not run.stop:
                _epoch(run, record)
        state = _through_checkpoint(first.state_dict())  # a weights_only load, as in train
        second = EarlyStopping(after[0], patience=after[2], mode=after[1], min_delta=after[3], restore_best=after[4])
        saved_monitor = before[0] or "validation_error"
        changed = []
        if (after[0] or "validation_error") != saved_monitor:
            changed.append("monitor")
        if after[1] != before[1]:
            changed.append("mode")
        if after[4] and not before[4] and first.best_epoch is not None:
            changed.append("restore_best")
        if changed:
            with pytest.raises(ValueError, match=rf"^cannot resume EarlyStopping: .*{changed[0]} "):
                second.load_state_dict(state)
            return
        second.load_state_dict(state)
        if run.stop:  # the straight run ended before the checkpoint: nothing to continue
            return
        run.callbacks = CallbackList([second])
        for record in records[at:]:
            if not run.stop:
                _epoch(run, record)
        monitored = [r[saved_monitor] for r in records]
        n = len(values)
        patience = [before[2]] * at + [after[2]] * (n - at)
        min_delta = [before[3]] * at + [after[3]] * (n - at)
        expected, stopped = _reference(monitored, before[1], patience, min_delta)
        assert [(h["best"], h["best_epoch"]) for h in run.history] == expected[: len(run.history)]
        assert len(run.history) == (stopped or n)

    prop()


def _through_checkpoint(state):
    """``state`` saved as a checkpoint is (torch.save) and read back with a weights_only load, in memory."""
    with io.BytesIO() as f:
        torch.save({"state": state}, f)
        f.seek(0)
        return torch.load(f, weights_only=True)["state"]


#: A user's record entry: (value, None when it is one number, else what the error says it is)
ENTRIES = {
    "int": (3, None),
    "float": (0.25, None),
    "numpy float32": (np.float32(0.5), None),
    "numpy int64": (np.int64(2), None),
    "0-d tensor": (torch.tensor(0.75), None),
    "1-element tensor": (torch.tensor([1.5]), None),
    "bool": (True, r"is True \(a bool\), not one number"),
    "numpy bool": (np.bool_(False), r"is False \(a bool\), not one number"),
    "bool tensor": (torch.tensor(True), r"is tensor\(True\) \(a Tensor\), not one number"),
    "list": ([0.1, 0.2], r"is \[0.1, 0.2\] \(a list\), not one number"),
    "tensor of 2": (torch.tensor([1.0, 2.0]), r"is tensor\(\[1., 2.\]\) \(a Tensor\), not one number"),
    "string": ("low", r"is 'low' \(a str\), not one number"),
    "dict": ({"a": 1.0}, r"is \{'a': 1.0\} \(a dict\), not one number"),
    "None": (None, "KeyError"),
}


@pytest.mark.parametrize("kind", sorted(ENTRIES))
def test_early_stopping_reads_one_number_and_names_anything_else(kind):
    value, refused = ENTRIES[kind]
    stop = EarlyStopping("mine", patience=5)
    run = _stand_in([Put(value), stop])
    if refused == "KeyError":
        with pytest.raises(KeyError, match=r"the epoch's record has no 'mine'"):
            _epoch(run, {})
    elif refused is not None:
        with pytest.raises(ValueError, match=rf"^EarlyStopping\(monitor='mine'\): the record's 'mine' {refused}"):
            _epoch(run, {})
    else:
        for _ in range(3):
            record = _epoch(run, {})
        assert record["best"] == float(torch.as_tensor(value).reshape(())) and record["best_epoch"] == 1
        assert record["epoch"] == 3 and not run.stop


@pytest.mark.parametrize(
    "monitor, error, message",
    [
        ("full_record", ValueError, r"^monitor='full_record': the record's 'full_record' is a flag \(True or False\)"),
        ("lr", ValueError, r"^monitor='lr': the record's 'lr' is a list \(the step size of each parameter group\)"),
        ("stopped_early", ValueError, r"^monitor='stopped_early': the record's 'stopped_early' is a flag"),
        (5, TypeError, r"^monitor must be the name of a record entry \(a str\) or None, got 5$"),
    ],
)
def test_early_stopping_refuses_a_monitor_that_is_never_one_number(monitor, error, message):
    with pytest.raises(error, match=message):
        EarlyStopping(monitor)


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        ({"patience": 0}, ValueError, r"^patience must be an integer >= 1, got 0$"),
        ({"patience": 2.0}, ValueError, r"^patience must be an integer >= 1, got 2.0$"),
        ({"mode": "lowest"}, ValueError, r"^mode must be 'min' or 'max', got 'lowest'$"),
        ({"min_delta": -1}, ValueError, r"^min_delta must be a finite number >= 0, got -1$"),
        ({"min_delta": math.nan}, ValueError, r"^min_delta must be a finite number >= 0, got nan$"),
        ({"min_delta": True}, ValueError, r"^min_delta must be a finite number >= 0, got True$"),
        ({"restore_best": "yes"}, TypeError, r"^restore_best must be True or False, got 'yes'$"),
    ],
)
def test_early_stopping_settings_are_checked(kwargs, error, message):
    with pytest.raises(error, match=message):
        EarlyStopping("free_energy", **kwargs)


def test_a_test_set_metric_warns_and_the_default_needs_validation_data():
    with pytest.warns(UserWarning, match=r"EarlyStopping\(monitor='test_error'\) chooses the best epoch on the test"):
        EarlyStopping("test_error")
    x, y = _data("classifier", 12)
    with pytest.raises(ValueError, match=r"^EarlyStopping\(\) monitors the validation metric by default, but train"):
        _fit(_model("classifier"), x, y, callbacks=[EarlyStopping()])


# ------------------------------------------------------------------------------------------------ TensorBoard
def _events(log_dir):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(log_dir))
    events.Reload()
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


def _earlier(log_dir):
    """Rename the event files as if written a second earlier: a file opened later sorts after them (TensorBoard
    reads the files of a directory in the order of their names, which begin with the second they were opened)."""
    for name in os.listdir(log_dir):
        match = re.match(r"^(events\.out\.tfevents\.)(\d+)(\..*)$", name)
        if match:
            stamp = f"{int(match.group(2)) - 1:0{len(match.group(2))}d}"
            os.replace(os.path.join(log_dir, name), os.path.join(log_dir, match.group(1) + stamp + match.group(3)))


def _log(tb, run, values, start):
    """Epochs ``start + 1 ...`` of ``values`` through the TensorBoard callback."""
    run.epoch = start
    tb.on_fit_start(run)
    for value in values:
        tb.on_epoch_end(run, {"epoch": run.epoch + 1, "score": value})
        run.epoch += 1
    tb.on_fit_end(run)


@pytest.mark.parametrize("examples", PROFILES)
def test_tensorboard_resume_continues_its_own_curve_and_never_touches_another_runs(examples, tmp_path_factory):
    pytest.importorskip("tensorboard")

    @_profile(examples)
    @given(
        logged=st.integers(1, 4),
        checkpointed=st.integers(1, 4),
        more=st.integers(0, 3),
        identity=st.sampled_from(("same", "other", "none")),
        fresh_directory=st.booleans(),
    )
    def prop(logged, checkpointed, more, identity, fresh_directory):
        checkpointed = min(checkpointed, logged)  # the checkpoint is at or before the last logged epoch
        root = tmp_path_factory.mktemp("tb")
        run = _stand_in()
        run.model = SparseClassifier(L0MLP(3, (2,), 2))
        first = TensorBoard(root / "a")
        _log(first, run, [float(10 + e) for e in range(logged)], 0)
        state = _through_checkpoint(first.state_dict())
        assert (root / "a" / RUN_ID_FILE).read_text() == state["run_id"]
        _earlier(root / "a")
        before = _events(root / "a")
        target = root / ("b" if fresh_directory else "a")
        second = TensorBoard(target)
        if identity == "same":
            second.load_state_dict(state)
        elif identity == "other":
            second.load_state_dict({"run_id": uuid.uuid4().hex})
        new = [float(100 + e) for e in range(more)]
        if not fresh_directory and identity != "same":
            with pytest.raises(
                FileExistsError, match=rf"holds event files of another run .*steps after {checkpointed}"
            ):
                _log(second, run, new, checkpointed)
            assert _events(root / "a") == before
            return
        _log(second, run, new, checkpointed)
        expected = [] if fresh_directory else [(e, 10.0 + e - 1) for e in range(1, checkpointed + 1)]
        expected += [(checkpointed + 1 + i, v) for i, v in enumerate(new)]
        assert _events(target).get("score", []) == expected
        if fresh_directory:
            assert _events(root / "a") == before
            written = (target / RUN_ID_FILE).read_text()
            assert written == state["run_id"] if identity == "same" else written != state["run_id"]
        # a new run never writes into a directory with events
        with pytest.raises(FileExistsError, match="already holds event files of another run"):
            _log(TensorBoard(target), run, [1.0], 0)

    prop()


def test_tensorboard_refuses_a_directory_whose_id_file_is_missing_or_tampered(tmp_path):
    pytest.importorskip("tensorboard")
    run = _stand_in()
    run.model = SparseClassifier(L0MLP(3, (2,), 2))
    tb = TensorBoard(tmp_path)
    _log(tb, run, [1.0, 2.0], 0)
    state = tb.state_dict()
    for content in (None, "x" * 32, state["run_id"].upper(), "\x00" * 10):
        if content is None:
            os.remove(tmp_path / RUN_ID_FILE)
        else:
            (tmp_path / RUN_ID_FILE).write_text(content)
        resumed = TensorBoard(tmp_path)
        resumed.load_state_dict(state)
        with pytest.raises(FileExistsError, match=rf"no {RUN_ID_FILE} file there names the run that wrote them"):
            _log(resumed, run, [3.0], 1)
    (tmp_path / RUN_ID_FILE).write_text(state["run_id"])
    resumed = TensorBoard(tmp_path)
    resumed.load_state_dict({"run_id": "not an id"})  # a tampered checkpoint: no id, so not this directory's run
    with pytest.raises(FileExistsError, match="this run's checkpoint holds no TensorBoard run id"):
        _log(resumed, run, [3.0], 1)


@pytest.mark.slow
def test_the_command_line_resume_refuses_another_runs_tensorboard_directory(tmp_path, capsys):
    pytest.importorskip("tensorboard")
    from l0bayes.cli import main

    tiny = ["--hidden", "8", "--epochs", "2", "--no-progress", "--threads", "1"]
    assert main([*tiny, "--out", str(tmp_path / "a"), "--tensorboard", str(tmp_path / "tb_a")]) == 0
    before = _events(tmp_path / "tb_a")
    assert [s for s, _ in before["validation_error"]] == [1, 2]
    assert main([*tiny, "--epochs", "1", "--out", str(tmp_path / "b")]) == 0
    capsys.readouterr()
    argv = ["--resume", "--out", str(tmp_path / "b"), "--epochs", "3", "--tensorboard", str(tmp_path / "tb_a")]
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err and "holds event files of another run" in err.strip().splitlines()[-1]
    assert _events(tmp_path / "tb_a") == before


# ----------------------------------------------------------------------------------- the record's value types
class _Bad:
    """An object of a class of the user's: a weights_only load cannot rebuild it."""

    def __repr__(self):
        return "_Bad()"


SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**40), 2**40),
    st.floats(allow_nan=False, width=32),
    st.text(max_size=5),
    st.floats(-1e3, 1e3, allow_nan=False).map(np.float32),
    st.floats(allow_nan=False).map(np.float64),
    st.integers(-100, 100).map(np.int16),
    st.integers(0, 2**31).map(np.int64),
    st.booleans().map(np.bool_),
    st.floats(-5, 5, allow_nan=False).map(lambda v: torch.tensor(v)),
)
BAD = st.sampled_from((np.zeros(2), _Bad(), slice(1, 2), np.datetime64("2020-01-01")))


def _plain_reference(value):
    """The value a record holds after the callback: NumPy scalars as Python numbers, the rest as given."""
    if isinstance(value, np.bool_):
        return bool(value)
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, np.floating):
        return float(value)
    if isinstance(value, list):
        return [_plain_reference(v) for v in value]
    if isinstance(value, tuple):
        return tuple(_plain_reference(v) for v in value)
    if isinstance(value, dict):
        return {k: _plain_reference(v) for k, v in value.items()}
    return value


def _same(a, b):
    """Equal values of the same types, tensors compared elementwise."""
    if torch.is_tensor(a) or torch.is_tensor(b):
        return torch.is_tensor(a) and torch.is_tensor(b) and torch.equal(a, b)
    if type(a) is not type(b):
        return False
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return a == b


def _holds_bad(value):
    if isinstance(value, (list, tuple)):
        return any(_holds_bad(v) for v in value)
    if isinstance(value, dict):
        return any(_holds_bad(v) for v in value.values())
    return isinstance(value, (_Bad, np.ndarray, slice, np.datetime64))


class Put(Callback):
    def __init__(self, value):
        self.value = value

    def on_epoch_end(self, run, record):
        record["mine"] = self.value


@pytest.mark.parametrize("examples", PROFILES)
def test_the_record_holds_plain_values_or_names_the_callback(examples):
    values = st.recursive(
        st.one_of(SCALARS, BAD),
        lambda children: st.one_of(
            st.lists(children, max_size=3),
            st.lists(children, max_size=3).map(tuple),
            st.dictionaries(st.text(max_size=3), children, max_size=3),
        ),
        max_leaves=6,
    )

    @_profile(examples)
    @given(value=values)
    def prop(value):
        run = _stand_in([Put(value)])
        if _holds_bad(value):
            with pytest.raises(TypeError, match=r"^Put put record\['mine'\] = .*, a [\w.]+, which a checkpoint cannot"):
                _epoch(run, {})
            return
        held = _epoch(run, {})["mine"]
        expected = _plain_reference(value)
        assert _same(held, expected)
        assert _same(_through_checkpoint(run.history)[-1]["mine"], expected)  # (a weights_only load)

    prop()


# ------------------------------------------------------------------------------------------- validation data
def _model(kind, features=4):
    torch.manual_seed(0)
    if kind == "classifier":
        return SparseClassifier(L0MLP(features, (3,), 3))
    if kind == "linear":
        return SparseLinearRegression(features)
    net = L0MLP(features, (3,), 2)  # a model with its own loss: two real outputs, a squared error
    return SparseModel(net, lambda out, target: 0.5 * F.mse_loss(out, target))


def _data(kind, n, features=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, features, generator=g)
    if kind == "classifier":
        return x, torch.randint(0, 3, (n,), generator=g)
    if kind == "linear":
        return x, torch.randn(n, generator=g)
    return x, torch.randn(n, 2, generator=g)


def _fit(model, x, y, **kwargs):
    return train(model, x, y, **{"epochs": 1, "batch_size": 4, "progress": False, "seed": 0, **kwargs})


def _independent(kind, model, x, y):
    """The validation metric of the final parameters on all of ``(x, y)`` at once (Eq. 13 gates)."""
    model.eval()
    with torch.no_grad():
        if kind == "classifier":
            return "validation_error", float((model(x).argmax(-1) != y).double().mean())
        if kind == "linear":
            prediction = x.double() @ model.coefficients().double() + model.bias.double()
            return "validation_rmse", float(((prediction - y.double()) ** 2).mean().sqrt())
        return "validation_loss", float(0.5 * ((model(x).double() - y.double()) ** 2).mean())


def _as(form, x, y, batch):
    if form == "tensors":
        return (x, y)
    if form == "list":
        return [(x[i : i + batch], y[i : i + batch]) for i in range(0, len(x), batch)]
    return DataLoader(TensorDataset(x, y), batch_size=batch)


@pytest.mark.parametrize("examples", PROFILES)
def test_validation_data_in_any_form_is_the_independent_evaluation_and_changes_no_draw(examples):
    @_profile(examples)
    @given(
        kind=st.sampled_from(("classifier", "linear", "own loss")),
        form=st.sampled_from(("tensors", "list", "loader")),
        n=st.integers(1, 23),
        batch=st.integers(1, 9),
        seed=st.integers(0, 50),
        with_test=st.booleans(),
    )
    def prop(kind, form, n, batch, seed, with_test):
        x, y = _data(kind, 8, seed=seed)
        xv, yv = _data(kind, n, seed=seed + 1000)
        reference_model, model = _model(kind), _model(kind)
        reference = _fit(reference_model, x, y)
        extra = {"test_data": _as(form, *_data(kind, 5, seed=7), batch)} if with_test else {}
        result = _fit(model, x, y, validation_data=_as(form, xv, yv, batch), **extra)
        for a, b in zip(reference_model.state_dict().values(), model.state_dict().values(), strict=True):
            assert torch.equal(a, b)  # recording the held-out data changes no training draw
        name, expected = _independent(kind, model, xv, yv)
        last = result.history[-1]
        assert last[name] == pytest.approx(expected, rel=1e-5, abs=1e-6)
        assert all(k not in last for k in ("test_error", "test_rmse", "test_loss")) or with_test
        assert [r["mean_loss"] for r in result.history] == [r["mean_loss"] for r in reference.history]

    prop()


@pytest.mark.parametrize("examples", PROFILES)
def test_validation_data_that_cannot_be_evaluated_is_refused_by_name(examples):
    x, y = _data("classifier", 8)
    xv, yv = _data("classifier", 6, seed=1)
    forms = {
        "a tensor": (xv, TypeError, r"^validation_data must be a pair \(x, y\) of tensors or an iterable of \(x, y\)"),
        "three tensors": ((xv, yv, yv), TypeError, r"^validation_data must be a pair \(x, y\) of tensors, got tuple"),
        "a number": (3, TypeError, r"^validation_data must be a pair .* got int$"),
        "a generator": (((a, b) for a, b in [(xv, yv)]), TypeError, r"^validation_data is an iterator \(generator\)"),
        "an empty list": ([], ValueError, r"^validation_data holds no batches$"),
        "float64": ((xv.double(), yv), TypeError, r"^validation_data\[0\] has dtype torch.float64 but the model"),
        "other features": ((xv[:, :3], yv), ValueError, r"^validation_data\[0\] has 3 features, but layer fc1"),
        "labels out of range": ((xv, yv + 3), ValueError, r"^validation_data\[1\]: class labels must lie in \[0, 3\)"),
        "fewer labels": ((xv, yv[:4]), ValueError, r"^validation_data\[0\] has 6 rows but validation_data\[1\] has 4"),
        "NaN": ((xv * math.nan, yv), ValueError, r"^validation_data\[0\] contains NaN or infinite values$"),
        "numpy arrays": (
            (xv.numpy(), yv.numpy()),
            TypeError,
            r"^validation_data must be a pair \(x, y\) of torch tensors \(as x and y\), got \(ndarray, ndarray\)",
        ),
        "a string": ("val", TypeError, r"^validation_data must be a pair .* got str$"),
        "a dict": ({"x": xv, "y": yv}, TypeError, r"^validation_data must be a pair .* got dict$"),
        "a bad third batch": (
            [(xv[:2], yv[:2]), (xv[2:4], yv[2:4]), (xv[4:, :3], yv[4:])],
            ValueError,
            r"^the x of batch 3 of validation_data has 3 features, but layer fc1 \(L0Linear\) takes in_features=4$",
        ),
        "numpy batches": (
            [(xv.numpy(), yv.numpy())],
            TypeError,
            r"^the x of batch 1 of validation_data and the y of batch 1 of validation_data must be torch tensors",
        ),
        "labels out of range in a batch": (
            [(xv[:3], yv[:3]), (xv[3:], yv[3:] + 3)],
            ValueError,
            r"^the y of batch 2 of validation_data: class labels must lie in \[0, 3\)",
        ),
        "a batch that is no pair": ([(xv, yv, yv)], TypeError, r"^batch 1 of validation_data must be a pair \(x, y\)"),
    }

    @_profile(examples)
    @given(form=st.sampled_from(sorted(forms)), also_test=st.booleans())
    def prop(form, also_test):
        data, error, message = forms[form]
        if form == "a generator":  # (a fresh one each time: the first check would not use it up, but be safe)
            data = ((a, b) for a, b in [(xv, yv)])
        extra = {"test_data": (xv, yv)} if also_test else {}
        with pytest.raises(error, match=message):
            _fit(_model("classifier"), x, y, validation_data=data, **extra)

    prop()


@pytest.mark.parametrize("name", ["test_data", "validation_data"])
def test_a_bad_held_out_batch_is_checked_like_a_training_batch_and_named(name):
    x, y = _data("classifier", 8)
    xv, yv = _data("classifier", 6, seed=1)
    bad = [(xv[:2], yv[:2]), (xv[2:4], yv[2:4]), (xv[4:].double(), yv[4:])]
    with pytest.raises(TypeError, match=rf"^the x of batch 3 of {name} has dtype torch.float64 but the model's"):
        _fit(_model("classifier"), x, y, **{name: bad})
    with pytest.raises(TypeError, match=rf"^{name} must be a pair \(x, y\) of torch tensors .*got \(ndarray, ndarray"):
        _fit(_model("classifier"), x, y, **{name: (xv.numpy(), yv.numpy())})
    with pytest.raises(TypeError, match=rf"^{name} must be a pair \(x, y\) of tensors or an iterable .* got str$"):
        _fit(_model("classifier"), x, y, **{name: "val"})
    # a good DataLoader: int32 labels are used as int64, as for training batches
    loader = DataLoader(TensorDataset(xv, yv.int()), batch_size=4)
    record = _fit(_model("classifier"), x, y, **{name: loader}).history[-1]
    assert record[name.replace("_data", "_error")] is not None


@pytest.mark.parametrize(
    ("log_dir", "error", "message"),
    [
        (None, TypeError, r"^TensorBoard: log_dir must be a path \(a str or os.PathLike\), got NoneType$"),
        (5, TypeError, r"^TensorBoard: log_dir must be a path \(a str or os.PathLike\), got int$"),
        (b"runs", TypeError, r"^TensorBoard: log_dir must be a path \(a str or os.PathLike\), got bytes$"),
        ("", ValueError, r"^TensorBoard: log_dir must name a directory, got the empty path ''$"),
    ],
)
def test_tensorboard_log_dir_must_be_a_path(log_dir, error, message):
    with pytest.raises(error, match=message):
        TensorBoard(log_dir)


def test_early_stopping_on_validation_data_restores_the_best_validated_parameters():
    x, y = _data("classifier", 40)
    xv, yv = _data("classifier", 30, seed=1)

    class Snapshots(Callback):
        def __init__(self):
            self.states = {}

        def on_epoch_end(self, run, record):
            self.states[run.epoch + 1] = {k: v.clone() for k, v in run.model.state_dict().items()}

    snapshots, stop = Snapshots(), EarlyStopping(patience=2)
    model = _model("classifier")
    result = _fit(model, x, y, epochs=12, lr=0.3, validation_data=(xv, yv), callbacks=[stop, snapshots])
    errors = [r["validation_error"] for r in result.history]
    expected, stopped = _reference(errors, "min", [2] * len(errors), [0.0] * len(errors))
    assert stop.best_epoch == expected[-1][1] and len(result.history) == (stopped or 12)
    for k, v in model.state_dict().items():
        assert torch.equal(v, snapshots.states[stop.best_epoch][k])
    name, value = _independent("classifier", model, xv, yv)
    assert value == pytest.approx(stop.best, abs=1e-12)


def test_a_numpy_scalar_put_in_the_record_reaches_the_checkpoint_as_a_number(tmp_path):
    x, y = _data("classifier", 8)
    path = tmp_path / "c.pt"
    result = _fit(_model("classifier"), x, y, epochs=2, checkpoint=str(path), callbacks=[Put(np.float32(0.5))])
    assert [type(r["mine"]) for r in result.history] == [float, float]
    assert [r["mine"] for r in load_checkpoint(path)["history"]] == [0.5, 0.5]
    with pytest.raises(TypeError, match=r"^Put put record\['mine'\] = _Bad\(\), a test_probe_callbacks._Bad, which"):
        _fit(_model("classifier"), x, y, checkpoint=str(tmp_path / "d.pt"), callbacks=[Put([_Bad()])])
    assert not (tmp_path / "d.pt").exists()


def test_tensorboard_log_dir_that_is_a_file_is_named(tmp_path):
    x, y = _data("classifier", 8)
    path = tmp_path / "a-file"
    path.write_text("x")
    with pytest.raises(FileExistsError, match=r"^TensorBoard: log_dir '.*a-file' is a file, not a directory$"):
        _fit(_model("classifier"), x, y, callbacks=[TensorBoard(str(path))])
    assert path.read_text() == "x"


@pytest.mark.parametrize("spelling", ["same", "trailing slash", "dot segment"])
def test_two_tensorboards_on_one_directory_are_told_to_use_distinct_log_dirs(tmp_path, spelling):
    x, y = _data("classifier", 8)
    first = str(tmp_path / "tb")
    second = {"same": first, "trailing slash": first + os.sep, "dot segment": str(tmp_path / "." / "tb")}[spelling]
    with pytest.raises(ValueError, match=r"write to the same log_dir .*give each its own log_dir$"):
        _fit(_model("classifier"), x, y, callbacks=[TensorBoard(first), TensorBoard(second)])
    assert not os.path.exists(first)  # refused before anything was written
    # Distinct directories clash only in the checkpoint entry, which is then what the message names.
    with pytest.raises(ValueError, match="distinct state_key"):
        _fit(_model("classifier"), x, y, callbacks=[TensorBoard(first), TensorBoard(str(tmp_path / "other"))])
