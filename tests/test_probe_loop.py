"""Property-based probes of ``train()``'s data, losses and arguments: iterables, DataLoaders, own losses, settings.

Every property checks an outcome against a reference computed here, independently of the loop: the optimiser
steps and the examples each epoch trains on (every example of a pass exactly once), the weights that a valid loss
of one's own moves, or a ``TypeError`` / ``ValueError`` whose message names the argument (the batch, the loss).
Each property runs twice: a few examples in the default run, many more under ``-m slow``; the fixed cases below
them are the reported ones. The models are tiny and train for a few epochs at most.
"""

import itertools
import math
import re
import warnings

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn
from torch.utils.data import DataLoader, SubsetRandomSampler, TensorDataset

from l0bayes.inference import Bayes, Constrained, LogAlphaProjection, Penalized, train
from l0bayes.inference.callbacks import Callback, EarlyStopping
from l0bayes.models import PlainModel, SparseClassifier, SparseModel
from l0bayes.nn import L0MLP

#: Examples per property: the default run, and the ``slow`` profile.
FAST, SLOW = 12, 200
PROFILES = [pytest.param(FAST, id="fast"), pytest.param(SLOW, marks=pytest.mark.slow, id="slow")]
OBJECTIVES = ("bayes", "penalized", "constrained")
ITERATORS = ("generator", "iter")  # exhausted after one pass
KINDS = ("list", "unsized", *ITERATORS)
PENALIZED = {"objective": "penalized"}  # (the quickest step: the loop is the same for every objective)


def _profile(examples):
    return settings(max_examples=examples, deadline=None, derandomize=True, database=None)


def _net():
    torch.manual_seed(0)
    return L0MLP(4, (3,), 3)


def _classifier():
    return SparseClassifier(_net())


def _labelled(n, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 4, generator=g), torch.randint(0, 3, (n,), generator=g)


def _fit(model, x, y=None, **kwargs):
    return train(model, x, y, **{"epochs": 1, "batch_size": 4, "progress": False, "seed": 0, **kwargs})


class Tally(Callback):
    """Counts a run's optimiser steps, and (as ``loss``) the example ids each training step used, per epoch.

    The data's targets are the examples' ids; the loss ignores them, and counts only steps that take gradients
    (not the full record's evaluations).
    """

    def __init__(self):
        self.steps = 0
        self.ids = []
        self.epochs = []  # per epoch: (steps, sorted ids)
        self._epoch_steps = 0

    def loss(self, output, target):
        if torch.is_grad_enabled() and output.requires_grad:
            self.ids += [int(v) for v in target]
        return (output**2).mean()

    def on_step_end(self, run):
        self.steps += 1
        self._epoch_steps += 1

    def on_epoch_end(self, run, record):
        self.epochs.append((self._epoch_steps, sorted(self.ids)))
        self._epoch_steps, self.ids = 0, []


def _ided(n, seed=0):
    """``(x, ids)``: ``n`` examples whose targets are their row numbers."""
    x = torch.randn(n, 4, generator=torch.Generator().manual_seed(seed))
    return x, torch.arange(n, dtype=torch.float32)


def _batches(x, y, sizes):
    out, start = [], 0
    for size in sizes:
        out.append((x[start : start + size], y[start : start + size]))
        start += size
    return out


class Unsized:
    """An iterable of batches without a length that can be iterated once per epoch."""

    def __init__(self, batches):
        self.batches = batches

    def __iter__(self):
        yield from self.batches


def _as(kind, batches):
    return {
        "list": lambda: batches,
        "unsized": lambda: Unsized(batches),
        "generator": lambda: (b for b in batches),
        "iter": lambda: iter(batches),
    }[kind]()


def _endless(batches, limit=500):
    """``itertools.cycle(batches)`` that fails the test instead of hanging when pulled more than ``limit`` times."""
    for count, batch in enumerate(itertools.cycle(batches)):
        if count >= limit:
            raise AssertionError("train() kept pulling batches from an endless iterable")
        yield batch


# ------------------------------------------------------------------------------------------ DataLoaders
@pytest.mark.parametrize("examples", PROFILES)
def test_a_dataloader_trains_each_batch_once_per_epoch(examples):
    @_profile(examples)
    @given(
        n=st.integers(1, 20),
        batch_size=st.integers(1, 8),
        drop_last=st.booleans(),
        shuffle=st.booleans(),
        epochs=st.integers(0, 2),
    )
    def prop(n, batch_size, drop_last, shuffle, epochs):
        x, ids = _ided(n)
        loader = DataLoader(TensorDataset(x, ids), batch_size=batch_size, shuffle=shuffle, drop_last=drop_last)
        full, rest = divmod(n, batch_size)  # the reference: whole batches, and the last, partial one
        per_epoch = full + (1 if rest and not drop_last else 0)
        seen = list(range(n)) if not drop_last else None  # with drop_last: some batch_size * full of them
        tally = Tally()
        if per_epoch == 0:
            with pytest.raises(ValueError, match=r"^the training data is empty: x \(DataLoader\) yields no batches"):
                _fit(SparseModel(_net(), tally.loss), loader, epochs=epochs, callbacks=[tally], **PENALIZED)
            return
        result = _fit(SparseModel(_net(), tally.loss), loader, epochs=epochs, callbacks=[tally], **PENALIZED)
        assert len(result.history) == epochs
        assert tally.steps == epochs * per_epoch
        for steps, epoch_ids in tally.epochs:
            assert steps == per_epoch
            if seen is not None:
                assert epoch_ids == seen  # every example exactly once
            else:
                assert len(epoch_ids) == full * batch_size and len(set(epoch_ids)) == len(epoch_ids)

    prop()


# --------------------------------------------------------------------------------- iterables of batches
@pytest.mark.parametrize("examples", PROFILES)
def test_an_iterable_trains_each_batch_once_per_epoch_or_names_what_is_wrong(examples):
    @_profile(examples)
    @given(
        sizes=st.lists(st.integers(1, 6), min_size=1, max_size=5),
        kind=st.sampled_from(KINDS),
        epochs=st.integers(0, 3),
        num_data=st.sampled_from((None, "exact", "fewer", "more")),
    )
    def prop(sizes, kind, epochs, num_data):
        total = sum(sizes)
        x, ids = _ided(total)
        batches = _batches(x, ids, sizes)
        n = {None: None, "exact": total, "fewer": max(total - 1, 1), "more": total + 3}[num_data]
        tally = Tally()

        def run():
            model = SparseModel(_net(), tally.loss)
            return _fit(model, _as(kind, batches), num_data=n, epochs=epochs, callbacks=[tally], **PENALIZED)

        if kind in ITERATORS and epochs > 1:
            with pytest.raises(
                ValueError, match=rf"^x is an iterator \(\w+\), used up by one epoch, but epochs={epochs}"
            ):
                run()
            assert tally.steps == 0
            return
        if n is None:
            with pytest.raises(ValueError, match=r"^train\(\) with an iterable of batches needs num_data="):
                run()
            return
        if n < total and epochs > 0:  # an error as soon as the epoch's count passes num_data
            with pytest.raises(ValueError, match=rf"^x yielded more than num_data={n} examples in epoch 1 "):
                run()
            assert tally.steps < len(sizes)  # the batch that passes it is never trained on
            return
        result = run()  # an epoch of fewer than num_data examples: a dropped batch, a shard, a subsample
        assert len(result.history) == epochs
        assert tally.steps == epochs * len(sizes)
        assert tally.epochs == [(len(sizes), list(range(total)))] * epochs

    prop()


# ------------------------------------------------------------------------------ each batch checked as it streams
BAD_BATCHES = {
    # name: (spoil batch (x, y) -> batch, error, tensor named first, message after its name; None: a valid batch)
    "labels out of range": (lambda x, y: (x, y + 3), ValueError, "y", r": class labels must lie in \[0, 3\), got"),
    "NaN inputs": (lambda x, y: (x.clone().fill_(math.nan), y), ValueError, "x", " contains NaN or infinite values$"),
    "float64 inputs": (lambda x, y: (x.double(), y), TypeError, "x", r" has dtype torch.float64 but the model's"),
    "other features": (lambda x, y: (x[:, :3], y), ValueError, "x", r" has 3 features, but layer fc1 \(L0Linear\)"),
    "float labels": (lambda x, y: (x, y.float()), TypeError, "y", r" has dtype torch.float32, but SparseClassifier"),
    "fewer labels": (lambda x, y: (x, y[:-1]), ValueError, "x", r" has \d+ rows but the y of batch \d+"),
    "not a pair": (lambda x, y: (x, y, y), TypeError, None, r" must be a pair \(x, y\), got tuple$"),
    "int32 labels": (lambda x, y: (x, y.int()), None, None, None),  # valid: used as int64
}


@pytest.mark.parametrize("examples", PROFILES)
def test_every_batch_is_checked_before_its_step_and_named(examples):
    @_profile(examples)
    @given(
        case=st.sampled_from(sorted(BAD_BATCHES)),
        bad=st.integers(1, 7),
        batch_size=st.sampled_from((250, 400)),  # the full record keeps the first 4 or 3 batches
        kind=st.sampled_from(("list", "generator")),
    )
    def prop(case, bad, batch_size, kind):
        x, y = _labelled(7 * batch_size)
        batches = _batches(x, y, [batch_size] * 7)
        spoil, error, name, message = BAD_BATCHES[case]
        batches[bad - 1] = spoil(*batches[bad - 1])
        tally = Tally()
        run = lambda: _fit(  # noqa: E731
            _classifier(), _as(kind, batches), num_data=len(x), objective="penalized", callbacks=[tally]
        )
        if error is None:
            run()
            assert tally.steps == 7
            return
        # found as it streams (the full record keeps the first epoch's batches: no pass of its own before training)
        where = rf"batch {bad} of x in epoch 1"
        with pytest.raises(error, match=(rf"^the {name} of " if name else "^") + where + message):
            run()
        assert tally.steps == bad - 1  # the bad batch is never trained on

    prop()


# ------------------------------------------------------------------------------------------- own losses
def cross_entropy(output, target):
    return F.cross_entropy(output, target)


def mean_of_unreduced(output, target):
    return F.cross_entropy(output, target, reduction="none").mean()


def log_softmax_nll(output, target):
    return F.nll_loss(F.log_softmax(output, -1), target)


def detached(output, target):
    return F.cross_entropy(output, target).detach()


def rebuilt(output, target):
    return torch.tensor(F.cross_entropy(output, target).item())


def leaf(output, target):
    return torch.tensor(1.0, requires_grad=True)


def unreduced(output, target):
    return F.cross_entropy(output, target, reduction="none")


def one_element(output, target):
    return F.cross_entropy(output, target).reshape(1)


def python_float(output, target):
    return float(F.cross_entropy(output, target))


def nothing(output, target):
    return None


def error_count(output, target):
    return (output.argmax(1) != target).sum()


LOSSES = {
    # name: (loss_fn, error, message); None: a valid loss, which must move the weights
    "cross_entropy": (cross_entropy, None, None),
    "CrossEntropyLoss()": (nn.CrossEntropyLoss(), None, None),
    "mean_of_unreduced": (mean_of_unreduced, None, None),
    "log_softmax_nll": (log_softmax_nll, None, None),
    "detached": (detached, ValueError, r"returned a tensor detached from the network's output"),
    "rebuilt": (rebuilt, ValueError, r"returned a tensor detached from the network's output"),
    "leaf": (leaf, ValueError, r"returned a tensor detached from the network's output \(a leaf tensor, not computed"),
    "unreduced": (unreduced, ValueError, r"must return the mean loss over the minibatch, a scalar tensor, got shape"),
    "one_element": (one_element, ValueError, r"a scalar tensor, got shape \(1,\)"),
    "python_float": (python_float, TypeError, r"floating-point scalar tensor computed from the output, got float$"),
    "nothing": (nothing, TypeError, r"floating-point scalar tensor computed from the output, got NoneType$"),
    "error_count": (error_count, TypeError, r"got a torch.int64 tensor$"),
    "CrossEntropyLoss(reduction='none')": (nn.CrossEntropyLoss(reduction="none"), ValueError, r"got shape \(\d+,\)"),
}


def _weights(model):
    return {k: v.clone() for k, v in model.state_dict().items() if not k.endswith("log_alpha")}


@pytest.mark.filterwarnings("ignore:constrained. the gates are fixed")
@pytest.mark.filterwarnings("ignore:Converting a tensor with requires_grad=True to a scalar")
@pytest.mark.parametrize("examples", PROFILES)
def test_a_valid_loss_trains_the_weights_and_an_invalid_one_is_named(examples):
    @_profile(examples)
    @given(loss=st.sampled_from(sorted(LOSSES)), objective=st.sampled_from(OBJECTIVES), n=st.integers(2, 12))
    def prop(loss, objective, n):
        loss_fn, error, message = LOSSES[loss]
        model = SparseModel(_net(), loss_fn)
        x, y = _labelled(n)
        kwargs = {"objective": Constrained(target_density=0.5) if objective == "constrained" else objective}
        before = _weights(model)
        if error is not None:
            name = getattr(loss_fn, "__qualname__", None) or f"{type(loss_fn).__name__}()"
            with pytest.raises(error, match=rf"^loss_fn \({re.escape(name)}\) .*{message}"):
                _fit(model, x, y, **kwargs)
            return
        result = _fit(model, x, y, lr=0.05, **kwargs)
        assert math.isfinite(result.history[-1]["mean_loss"])
        after = _weights(model)
        assert any(not torch.equal(before[k], after[k]) for k in before if k.endswith("weight"))  # the weights moved

    prop()


# ------------------------------------------------------------------------------------------- arguments
CONSTRAINED_SETTINGS = {
    "target_density": 0.5,
    "target_flops": 0.5,
    "per_layer": True,
    "rank": "norm",
    "arrival": 0.02,
    "multiplier_lr": 0.1,
    "dual_restarts": False,
    "final_phase": 0.5,
    "target_warmup": 3,
}
OTHER_OBJECTIVES = {"bayes": Bayes, "penalized": Penalized}


@pytest.mark.filterwarnings("ignore:constrained. the gates are fixed")
@pytest.mark.parametrize("examples", PROFILES)
def test_constrained_settings_belong_to_the_constrained_objective(examples):
    """Each setting of the constrained objective trains when given to ``Constrained``; given to another objective,
    or to ``train()`` itself, it is refused with a ``TypeError`` (``train()``'s names it), never silently ignored."""

    @_profile(examples)
    @given(
        setting=st.sampled_from(sorted(CONSTRAINED_SETTINGS)),
        objective=st.sampled_from(OBJECTIVES),
    )
    def prop(setting, objective):
        x, y = _labelled(8)
        value = CONSTRAINED_SETTINGS[setting]
        kwargs = {setting: value}
        if objective == "constrained":
            if setting not in ("target_density", "target_flops"):
                kwargs["target_density"] = 0.5
            result = _fit(_classifier(), x, y, objective=Constrained(**kwargs))
            assert math.isfinite(result.history[-1]["mean_loss"])
            return
        with pytest.raises(TypeError, match=r"takes no arguments"):
            OTHER_OBJECTIVES[objective](**kwargs)
        with pytest.raises(TypeError, match=rf"^train\(\) got an unexpected keyword argument '{setting}'$"):
            _fit(_classifier(), x, y, objective=objective, **kwargs)

    prop()


TARGETS = (0.5, 1.0, 1, True, False, "0.5", math.nan, math.inf, 0.0, -0.5, 1.5, None, torch.tensor(0.5))


@pytest.mark.filterwarnings("ignore:constrained. the gates are fixed")
@pytest.mark.parametrize("examples", PROFILES)
def test_a_constrained_target_is_a_fraction_in_0_1(examples):
    @_profile(examples)
    @given(target=st.sampled_from(TARGETS), name=st.sampled_from(("target_density", "target_flops")))
    def prop(target, name):
        x, y = _labelled(8)
        if target is None:
            with pytest.raises(ValueError, match=r"^Constrained needs exactly one of target_density"):
                Constrained(**{name: target})
            with pytest.raises(ValueError, match=r"^objective='constrained' needs its target"):
                _fit(_classifier(), x, y, objective="constrained")
        elif isinstance(target, (bool, str)):
            with pytest.raises(TypeError, match=rf"^Constrained: {name} must be a number in \(0, 1\]"):
                Constrained(**{name: target})
        elif not 0 < float(target) <= 1:
            with pytest.raises(ValueError, match=rf"^Constrained: {name} must be a number in \(0, 1\].*, got"):
                Constrained(**{name: target})
        else:
            record = _fit(_classifier(), x, y, objective=Constrained(**{name: target})).history[-1]
            assert math.isfinite(record["mean_loss"])
            assert record.get("target_density", record.get("target_flops")) is not None

    prop()


ARRIVALS = ("each", "every", "EACH", "0.02", 0.0, 0.02, -0.01, math.inf, math.nan, True, None, torch.tensor(0.02))


@pytest.mark.filterwarnings("ignore:constrained. the gates are fixed")
@pytest.mark.parametrize("examples", PROFILES)
def test_arrival_is_a_margin_none_or_each(examples):
    """``arrival``: ``None``, a finite margin >= 0, or ``"each"``, which needs a target architecture (one constraint
    per block): with a target density it is refused, saying what to give; anything else is named."""

    @_profile(examples)
    @given(arrival=st.sampled_from(ARRIVALS))
    def prop(arrival):
        x, y = _labelled(8)
        settings = {"target_density": 0.5, "arrival": arrival, "final_phase": 0.5}
        message = r"^Constrained: arrival must be a number >= 0, None or 'each', got"
        if isinstance(arrival, str) and arrival == "each":
            match = r"^Constrained: arrival='each' fixes each constraint of a target_architecture"
            with pytest.raises(ValueError, match=match):
                Constrained(**settings)
        elif isinstance(arrival, bool):  # a switch is not a margin
            with pytest.raises(TypeError, match=message):
                Constrained(**settings)
        elif arrival is None or (
            not isinstance(arrival, str) and math.isfinite(float(arrival)) and float(arrival) >= 0
        ):
            assert math.isfinite(_fit(_classifier(), x, y, objective=Constrained(**settings)).history[-1]["mean_loss"])
        else:
            with pytest.raises(ValueError, match=message):
                Constrained(**settings)

    prop()


WARMUPS = (0, 3, 3.0, 2.5, -1, math.inf, math.nan, True, "3", None, torch.tensor(3))


@pytest.mark.filterwarnings("ignore:constrained. the gates are fixed")
@pytest.mark.parametrize("examples", PROFILES)
def test_target_warmup_is_a_whole_number_of_steps(examples):
    """``target_warmup``: a whole number of steps >= 0 (``3.0`` trains as ``3``); a non-number is a ``TypeError``,
    anything else a ``ValueError``, both naming it; given to another objective, it is refused as ignored."""

    @_profile(examples)
    @given(warmup=st.sampled_from(WARMUPS))
    def prop(warmup):
        x, y = _labelled(8)
        settings = {"target_density": 0.5, "final_phase": 0.5, "target_warmup": warmup}
        message = rf"^Constrained: target_warmup must be a whole number >= 0, got .*{re.escape(repr(warmup))}$"
        if isinstance(warmup, (bool, str)) or warmup is None:
            with pytest.raises(TypeError, match=message):
                Constrained(**settings)
            return
        value = float(warmup)
        if not (math.isfinite(value) and value == math.floor(value) and value >= 0):
            with pytest.raises(ValueError, match=message):
                Constrained(**settings)
            return
        result = _fit(_classifier(), x, y, objective=Constrained(**settings))
        reference = _fit(_classifier(), x, y, objective=Constrained(**{**settings, "target_warmup": int(value)}))
        assert [h["mean_loss"] for h in result.history] == [h["mean_loss"] for h in reference.history]
        assert result.history[-1].get("target_now") == reference.history[-1].get("target_now")
        if int(value):
            with pytest.raises(TypeError, match=r"^Penalized\(\) takes no arguments$"):
                Penalized(target_warmup=warmup)
            with pytest.raises(TypeError, match=r"unexpected keyword argument 'target_warmup'"):
                _fit(_classifier(), x, y, **PENALIZED, target_warmup=warmup)

    prop()


COUNTS = {"epochs": 0, "batch_size": 1, "record_every": 1}  # argument: the smallest value allowed
COUNT_VALUES = (0, 1, 2, 3, 2.0, 2.5, -1, -1.0, math.inf, -math.inf, math.nan, True, "2", None)


@pytest.mark.parametrize("examples", PROFILES)
def test_counts_are_whole_numbers(examples):
    @_profile(examples)
    @given(name=st.sampled_from(sorted(COUNTS)), value=st.sampled_from(COUNT_VALUES))
    def prop(name, value):
        x, y = _labelled(6)
        low = COUNTS[name]
        message = rf"^{name} must be a whole number >= {low}, got {re.escape(repr(value))}$"
        if isinstance(value, (bool, str)) or value is None:
            with pytest.raises(TypeError, match=message):
                _fit(_classifier(), x, y, **{name: value})
            return
        whole = math.isfinite(value) and value == math.floor(value)
        if not whole or value < low:
            with pytest.raises(ValueError, match=message):
                _fit(_classifier(), x, y, **{name: value})
            return
        model, reference_model = _classifier(), _classifier()
        result = _fit(model, x, y, **{name: value})
        reference = _fit(reference_model, x, y, **{name: int(value)})  # 2.0 means 2
        assert [h["mean_loss"] for h in result.history] == [h["mean_loss"] for h in reference.history]
        assert len(result.history) == (int(value) if name == "epochs" else 1)

    prop()


RANGES = (
    (-3.0, 3.0),
    (-2, 2),
    (math.log(0.01), math.log(100)),
    (3.0, -3.0),
    (1.0, 1.0),
    (math.nan, 1.0),
    (-1.0, math.inf),
    ("a", 1.0),
    (-1.0, "b"),
    (True, 2.0),
    (None, 1.0),
    None,
)


@pytest.mark.parametrize("examples", PROFILES)
def test_log_alpha_projection_is_a_range_low_high(examples):
    """``LogAlphaProjection(low, high)``: two finite numbers, ``low < high`` (a non-number is a ``TypeError``, a
    number out of place a ``ValueError``, both naming it); the gates' ``log_alpha`` then stay in the range.
    ``None``: no projection."""

    @_profile(examples)
    @given(value=st.sampled_from(RANGES))
    def prop(value):
        x, y = _labelled(6)
        if value is None:
            _fit(_classifier(), x, y, callbacks=None)
            return
        numbers = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value)
        if not numbers:
            name = "low" if not isinstance(value[0], (int, float)) or isinstance(value[0], bool) else "high"
            with pytest.raises(TypeError, match=rf"^LogAlphaProjection: {name} must be a finite real number"):
                LogAlphaProjection(*value)
            return
        if not all(math.isfinite(v) for v in value):
            name = "low" if not math.isfinite(value[0]) else "high"
            with pytest.raises(ValueError, match=rf"^LogAlphaProjection: {name} must be a finite real number"):
                LogAlphaProjection(*value)
            return
        if not value[0] < value[1]:
            with pytest.raises(ValueError, match=r"^LogAlphaProjection: low must be below high"):
                LogAlphaProjection(*value)
            return
        model = _classifier()
        _fit(model, x, y, callbacks=[LogAlphaProjection(*value)])
        log_alpha = model.net.fc1.gate.log_alpha
        assert bool(((log_alpha >= value[0]) & (log_alpha <= value[1])).all())  # projected

    prop()


@pytest.mark.parametrize("examples", PROFILES)
def test_num_data_with_tensors_is_their_row_count(examples):
    @_profile(examples)
    @given(n=st.integers(2, 12), value=st.sampled_from((None, "n", "n-1", "n+1", "n.0", 0, -1, 2.5, True, "5")))
    def prop(n, value):
        x, y = _labelled(n)
        num_data = {"n": n, "n-1": n - 1, "n+1": n + 1, "n.0": float(n)}.get(value, value)
        if isinstance(num_data, (bool, str)):
            with pytest.raises(TypeError, match=r"^num_data must be a whole number >= 1 \(or None\)"):
                _fit(_classifier(), x, y, num_data=num_data)
        elif num_data is not None and (num_data < 1 or num_data != int(num_data)):
            with pytest.raises(ValueError, match=r"^num_data must be a whole number >= 1 \(or None\)"):
                _fit(_classifier(), x, y, num_data=num_data)
        elif num_data is not None and num_data != n:
            with pytest.raises(ValueError, match=rf"^num_data={num_data} but x holds {n} rows: with tensors"):
                _fit(_classifier(), x, y, num_data=num_data)
        else:
            model, reference_model = _classifier(), _classifier()
            result = _fit(model, x, y, num_data=num_data)
            reference = _fit(reference_model, x, y)
            assert [h["mean_loss"] for h in result.history] == [h["mean_loss"] for h in reference.history]

    prop()


@pytest.mark.parametrize("examples", PROFILES)
def test_callbacks_none_is_no_callbacks_and_anything_else_is_named(examples):
    @_profile(examples)
    @given(value=st.sampled_from(("none", "empty", "list", "single", "number", "text", "list of numbers")))
    def prop(value):
        x, y = _labelled(6)
        callbacks = {
            "none": None,
            "empty": [],
            "list": [Tally()],
            "single": EarlyStopping("mean_loss"),
            "number": 5,
            "text": "abc",
            "list of numbers": [5],
        }[value]
        if value in ("none", "empty", "list"):
            model, reference_model = _classifier(), _classifier()
            result = _fit(model, x, y, callbacks=callbacks)
            reference = _fit(reference_model, x, y)
            assert [h["mean_loss"] for h in result.history] == [h["mean_loss"] for h in reference.history]
            return
        message = {
            "single": r"^callbacks must be a list of Callback objects \(or None\), got EarlyStopping: put it in a list",
            "number": r"^callbacks must be a list of Callback objects \(or None\), got int$",
            "text": r"^callbacks must be a list of Callback objects \(or None\), got str$",
            "list of numbers": r"^callbacks must be l0bayes.inference.Callback instances, got int$",
        }[value]
        with pytest.raises(TypeError, match=message):
            _fit(_classifier(), x, y, callbacks=callbacks)

    prop()


# ------------------------------------------------------------------------------------------- fixed cases
def test_a_generator_of_batches_trains_every_batch_of_its_one_epoch():
    x, ids = _ided(60)
    batches = _batches(x, ids, [10] * 6)
    tally = Tally()
    result = _fit(SparseModel(_net(), tally.loss), (b for b in batches), num_data=60, callbacks=[tally])
    assert tally.steps == 6 and tally.epochs == [(6, list(range(60)))]
    assert result.history[-1]["mean_loss"] > 0 and "free_energy" in result.history[-1]  # the full record too
    with pytest.raises(ValueError, match=r"^x is an iterator \(generator\), used up by one epoch, but epochs=2"):
        _fit(SparseModel(_net(), tally.loss), (b for b in batches), num_data=60, epochs=2)


def test_a_1200_example_generator_runs_all_its_steps():
    x, ids = _ided(1200)
    tally = Tally()
    _fit(SparseModel(_net(), tally.loss), (b for b in _batches(x, ids, [100] * 12)), num_data=1200, callbacks=[tally])
    assert tally.steps == 12 and tally.epochs[0][1] == list(range(1200))


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"target_density": 0.5}, "target_density"),
        ({"target_density": math.nan}, "target_density"),
        ({"target_flops": 0.5}, "target_flops"),
        ({"per_layer": True}, "per_layer"),
        ({"target_density": 0.5, "per_layer": True}, "target_density"),
    ],
)
@pytest.mark.parametrize("objective", ["bayes", "penalized"])
def test_a_target_without_the_constrained_objective_is_refused(kwargs, name, objective):
    """A target belongs to ``Constrained``: given to ``train()`` with another objective it is a ``TypeError`` naming
    it, and the other objectives take no settings at all."""
    x, y = _labelled(8)
    with pytest.raises(TypeError, match=rf"^train\(\) got an unexpected keyword argument '{name}'$"):
        _fit(_classifier(), x, y, objective=objective, **kwargs)
    with pytest.raises(TypeError, match=r"takes no arguments"):
        OTHER_OBJECTIVES[objective](**kwargs)


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        pytest.param(
            lambda: {"objective": Constrained(target_density=True)}, TypeError,
            r"^Constrained: target_density must be a number in", id="target_density=True",
        ),
        pytest.param(
            lambda: {"objective": Constrained(target_density="0.5")}, TypeError,
            r"^Constrained: target_density must be a number in", id="target_density='0.5'",
        ),
        pytest.param(
            lambda: {"num_data": 5}, ValueError, r"^num_data=5 but x holds 8 rows: with tensors the number of training",
            id="num_data",
        ),
        pytest.param(
            lambda: {"epochs": math.inf}, ValueError, r"^epochs must be a whole number >= 0, got inf$", id="epochs",
        ),
        pytest.param(
            lambda: {"callbacks": [LogAlphaProjection("-3", 3.0)]}, TypeError,
            r"^LogAlphaProjection: low must be a finite real number, got str '-3'$", id="LogAlphaProjection",
        ),
    ],
)  # fmt: skip
def test_arguments_of_the_wrong_kind_are_named(kwargs, error, message):
    x, y = _labelled(8)
    with pytest.raises(error, match=message):
        _fit(_classifier(), x, y, **kwargs())


def test_callbacks_none_trains():
    x, y = _labelled(8)
    assert len(_fit(_classifier(), x, y, epochs=2, callbacks=None).history) == 2


@pytest.mark.filterwarnings("ignore:Converting a tensor with requires_grad=True to a scalar")
@pytest.mark.parametrize("loss", ["detached", "unreduced", "nothing", "python_float"])
def test_an_own_loss_that_cannot_train_the_weights_is_named(loss):
    loss_fn, error, message = LOSSES[loss]
    x, y = _labelled(8)
    with pytest.raises(error, match=rf"^loss_fn \({loss}\) .*{message}"):
        _fit(SparseModel(_net(), loss_fn), x, y)


def test_a_bad_batch_after_the_first_1000_examples_is_named():
    x, y = _labelled(1200)
    y[1150] = 7  # in batch 12 of 100
    loader = DataLoader(TensorDataset(x, y), batch_size=100)
    tally = Tally()
    with pytest.raises(ValueError, match=r"^the y of batch 12 of x in epoch 1: class labels must lie in \[0, 3\), got"):
        _fit(_classifier(), loader, callbacks=[tally])
    assert tally.steps == 11


def test_an_endless_iterable_is_refused():
    x, y = _labelled(60)
    batches = _batches(x, y, [10] * 6)
    with pytest.raises(ValueError, match=r"^x yielded more than num_data=60 examples in epoch 1 \(70 by batch 7 of x"):
        _fit(_classifier(), _endless(batches), num_data=60)
    with pytest.raises(ValueError, match=r"^x is an iterator \(cycle\), used up by one epoch, but epochs=2"):
        _fit(_classifier(), itertools.cycle(batches), num_data=60, epochs=2)


def test_an_empty_dataloader_says_it_yields_no_batches():
    x, y = _labelled(6)
    with pytest.raises(ValueError, match=r"^the training data is empty: x \(DataLoader\) yields no batches"):
        _fit(_classifier(), DataLoader(TensorDataset(x[:0], y[:0]), batch_size=4))
    with pytest.raises(ValueError, match=r"^the training data is empty: x \(DataLoader\) yields no batches"):
        _fit(_classifier(), DataLoader(TensorDataset(x, y), batch_size=8, drop_last=True))
    with pytest.raises(ValueError, match=r"^the training data is empty: x yielded no batches in epoch 1$"):
        _fit(_classifier(), Unsized([]), num_data=6)


def test_an_iterable_that_yields_nothing_the_second_time_is_named():
    x, y = _labelled(8)
    once = iter([(x, y)])

    class SameIterator:  # an iterable whose __iter__ hands out one iterator: empty from the second epoch
        def __iter__(self):
            return once

    # (the first epoch uses it up: the full record keeps that epoch's batches, with no pass of its own)
    message = r"^the training data is empty: x yielded no batches in epoch 2 \(it yielded batches before: an iterable"
    tally = Tally()
    with pytest.raises(ValueError, match=message):
        _fit(_classifier(), SameIterator(), num_data=8, epochs=2, callbacks=[tally])
    assert tally.steps == 1


@pytest.mark.parametrize("num_data", [30, 59, 61, 120, 600, 6000])
@pytest.mark.parametrize("kind", ["list", "unsized", "generator"])
def test_an_iterable_streams_at_most_num_data_examples_each_epoch(kind, num_data):
    x, y = _labelled(60)
    batches = _batches(x, y, [10] * 6)  # 60 examples
    tally = Tally()
    if num_data < 60:  # an error as soon as the count passes num_data: that batch is never trained on
        message = (
            rf"^x yielded more than num_data={num_data} examples in epoch 1 \({(num_data // 10 + 1) * 10} by batch"
        )
        with pytest.raises(ValueError, match=message):
            _fit(_classifier(), _as(kind, batches), num_data=num_data, callbacks=[tally])
        assert tally.steps == num_data // 10
    else:  # a subsample of num_data examples: every batch trains, the data term scaled by num_data
        assert _training_run_num_data(_classifier(), _as(kind, batches), num_data=num_data) == num_data
    if kind != "generator":  # the second epoch is counted too
        assert len(_fit(_classifier(), _as(kind, batches), num_data=60, epochs=2).history) == 2


@pytest.mark.parametrize("num_data", [30, 59, 61, 120, 600])
def test_a_dataloader_over_a_sized_dataset_has_its_length_as_num_data_by_default(num_data):
    x, y = _labelled(60)
    loader = DataLoader(TensorDataset(x, y), batch_size=10)
    assert _training_run_num_data(_classifier(), loader) == 60
    if num_data < 60:
        with pytest.raises(ValueError, match=rf"^x yielded more than num_data={num_data} examples in epoch 1 "):
            _fit(_classifier(), loader, num_data=num_data)
    else:  # the loader's examples as a subsample of num_data
        assert _training_run_num_data(_classifier(), loader, num_data=num_data) == num_data


@pytest.mark.parametrize(
    "sampler",
    [SubsetRandomSampler(range(30)), list(range(30))],
    ids=["SubsetRandomSampler", "a list of indices"],
)
def test_a_sampler_of_its_own_gives_the_loaders_default_num_data(sampler):
    x, y = _labelled(60)
    loader = DataLoader(TensorDataset(x, y), batch_size=10, sampler=sampler)
    assert _training_run_num_data(_classifier(), loader) == 30  # N = 30, the sampler's indices
    batch_sampler = torch.utils.data.BatchSampler(sampler, batch_size=10, drop_last=False)
    assert _training_run_num_data(_classifier(), DataLoader(TensorDataset(x, y), batch_sampler=batch_sampler)) == 30
    with pytest.raises(ValueError, match=r"^x yielded more than num_data=20 examples in epoch 1 "):
        _fit(_classifier(), loader, num_data=20)


def _training_run_num_data(model, data, **kwargs):
    seen = []

    class Seen(Callback):
        def on_fit_start(self, run):
            seen.append(run.num_data)

    _fit(model, data, callbacks=[Seen()], **kwargs)
    return seen[0]


def test_num_data_of_a_dataloader_is_its_dataset_length_or_its_subset():
    x, y = _labelled(60)
    assert _training_run_num_data(_classifier(), DataLoader(TensorDataset(x, y), batch_size=10)) == 60
    assert _training_run_num_data(_classifier(), DataLoader(TensorDataset(x, y), batch_size=10, drop_last=True)) == 60
    subset = DataLoader(TensorDataset(x, y), batch_size=10, sampler=SubsetRandomSampler(range(30)))
    assert _training_run_num_data(_classifier(), subset) == 30


@pytest.mark.parametrize("objective", ["bayes", "penalized"])
@pytest.mark.parametrize("owner", ["SparseModel", "PlainModel"])
def test_a_leaf_loss_that_requires_grad_is_named(objective, owner):
    x, y = _labelled(8)
    loss_fn = lambda o, t: torch.tensor(1.0, requires_grad=True)  # noqa: E731
    model = SparseModel(_net(), loss_fn) if owner == "SparseModel" else PlainModel(nn.Linear(4, 3), loss_fn)
    message = r"^loss_fn \(.*<lambda>\) returned a tensor detached from the network's output \(a leaf tensor, not"
    with pytest.raises(ValueError, match=message):
        _fit(model, x, y, objective=objective)


def test_a_loss_that_is_the_output_itself_still_trains():
    class Scalar(nn.Module):  # the output is a leaf parameter, and the loss is that output
        def __init__(self):
            super().__init__()
            self.value = nn.Parameter(torch.tensor(2.0))

        def forward(self, x):
            return self.value

    model = PlainModel(Scalar(), lambda o, t: o)
    x, y = _labelled(8)
    _fit(model, x, y, objective="penalized", lr=0.1)
    assert float(model.net.value) < 2.0


@pytest.mark.parametrize("model", [5, "model", nn.Linear(4, 3), None])
def test_a_model_without_model_and_guide_is_named(model):
    x, y = _labelled(8)
    with pytest.raises(TypeError, match=r"^model must be a torch.nn.Module with model\(x, y, num_data\) and guide"):
        _fit(model, x, y)


@pytest.mark.parametrize(
    ("device", "error", "message"),
    [
        (
            "gpu",
            ValueError,
            r"^device must be 'auto', 'cpu', 'cuda', 'cuda:N' or a torch.device that can train, got 'gpu'$",
        ),
        (5, TypeError, r"^device must be 'auto', 'cpu', 'cuda', 'cuda:N' or a torch.device .*, got int 5$"),
        (1.5, TypeError, r"^device must be 'auto', 'cpu', 'cuda', 'cuda:N' or a torch.device .*, got float 1.5$"),
        ("meta", ValueError, r"^device must be .* got 'meta': a meta device holds no data$"),
        (torch.device("meta"), ValueError, r"^device must be .* a meta device holds no data$"),
        ("cuda:99", ValueError, r"^device 'cuda:99' was requested but (CUDA is not available|there are \d+ CUDA)"),
    ],
)
def test_a_device_that_cannot_train_is_named(device, error, message):
    x, y = _labelled(8)
    model = _classifier()
    before = _weights(model)
    with pytest.raises(error, match=message):
        _fit(model, x, y, device=device)
    assert all(torch.equal(before[k], v) for k, v in _weights(model).items())


@pytest.mark.parametrize("device", ["cpu", torch.device("cpu"), "auto", None])
def test_the_devices_that_train_are_accepted(device):
    x, y = _labelled(8)
    result = _fit(_classifier(), x, y, device=device)
    assert result.device.type in ("cpu", "cuda")


def test_a_check_without_values_reads_only_shapes_and_dtypes():
    """Batches already on an accelerator are checked by shape and dtype after each epoch's first (no host read)."""
    from l0bayes.inference.data_checks import DataCheck

    check = DataCheck(_classifier())
    x, y = _labelled(8)
    names = ("the x", "the y")
    spoilt_x, spoilt_y = x.clone().fill_(math.nan), (y + 3).int()
    _, labels = check(spoilt_x, spoilt_y, names, values=False)
    assert labels.dtype == torch.int64  # converted all the same
    with pytest.raises(ValueError, match=r"^the x contains NaN or infinite values$"):
        check(spoilt_x, y, names)
    with pytest.raises(ValueError, match=r"^the x has 3 features"):
        check(x[:, :3], y, names, values=False)


class _CountedReads:
    """An iterable of batches that counts its passes (``__iter__``) and the batches it hands out."""

    def __init__(self, batches):
        self.batches, self.passes, self.read = batches, 0, 0

    def __iter__(self):
        self.passes += 1
        for batch in self.batches:
            self.read += 1
            yield batch

    def __len__(self):
        return len(self.batches)


class _CountedDataset(TensorDataset):
    def __init__(self, *tensors):
        super().__init__(*tensors)
        self.read = 0

    def __getitem__(self, index):
        self.read += 1
        return super().__getitem__(index)


class _CountingTeacher(nn.Module):
    """A teacher that notes the example ids (the first feature) of every input it runs on."""

    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(4, 3)
        self.calls, self.ids = 0, []

    def forward(self, x):
        self.calls += 1
        self.ids += [int(v) for v in x[:, 0]]
        return self.linear(x)


@pytest.mark.parametrize("kind", ["iterable", "dataloader"])
@pytest.mark.parametrize("record_every", [1, 3])
def test_an_iterable_is_read_once_per_epoch_and_the_teacher_runs_on_trained_examples_only(kind, record_every):
    """Three epochs read the data three times (the full record keeps the first epoch's first batches as they stream,
    with no pass of its own): a teacher attached for distillation runs on each training batch and on the full
    record's examples, which are the first epoch's first examples, and on nothing else."""
    from l0bayes.models import Distillation

    n, batch, epochs = 1500, 300, 3
    x = torch.randn(n, 4, generator=torch.Generator().manual_seed(0))
    x[:, 0] = torch.arange(n, dtype=torch.float32)  # the example's id
    y = torch.randint(0, 3, (n,), generator=torch.Generator().manual_seed(1))
    if kind == "iterable":
        data = _CountedReads([(x[i : i + batch], y[i : i + batch]) for i in range(0, n, batch)])
    else:
        data = DataLoader(_CountedDataset(x, y), batch_size=batch, shuffle=True)
    teacher = _CountingTeacher()
    distillation = Distillation(teacher, alpha=0.5, causal=False)
    torch.manual_seed(0)
    student = L0MLP(4, (5,), 3)
    tally = Tally()
    with distillation.attach(student):
        result = train(
            SparseModel(student, distillation), data, epochs=epochs, record_every=record_every, progress=False,
            objective="penalized", num_data=n, callbacks=[tally],
        )  # fmt: skip
    steps = epochs * n // batch
    reads = data.read if kind == "iterable" else data.dataset.read
    assert reads == epochs * (n // batch if kind == "iterable" else n)
    if kind == "iterable":
        assert data.passes == epochs
    records = sum(r["full_record"] for r in result.history)
    assert records == epochs // record_every
    # each epoch: its n training examples, then, in a full record, the first 1200 (four batches of 300: at least
    # 1000) examples the first epoch trained on, one training batch per forward
    assert teacher.calls == steps + records * 4
    ids, first = teacher.ids, None
    for epoch in range(epochs):
        trained, ids = ids[:n], ids[n:]
        assert sorted(trained) == list(range(n))
        first = trained[:1200] if first is None else first
        if (epoch + 1) % record_every == 0:
            recorded, ids = ids[:1200], ids[1200:]
            assert recorded == first
    assert ids == []


class _TinyLM(nn.Module):
    """A causal language model of 11 tokens: an embedding and a gated output layer."""

    def __init__(self):
        super().__init__()
        from l0bayes.nn import L0Linear

        self.embed = nn.Embedding(11, 8)
        self.head = L0Linear(8, 11)

    def forward(self, ids):
        return self.head(self.embed(ids))


class _TokenLoss:
    """The causal LM loss (mean cross-entropy per predicted token), noting its value at every training step."""

    def __init__(self):
        self.values = []

    def __call__(self, logits, ids):
        loss = F.cross_entropy(logits[:, :-1].reshape(-1, 11), ids[:, 1:].reshape(-1))
        if torch.is_grad_enabled():
            self.values.append(float(loss.detach()))
        return loss


@pytest.mark.parametrize("objective", ["penalized", "bayes", "constrained"])
def test_train_loss_is_the_per_token_loss_of_a_language_model(objective):
    """The history's train_loss is the mean over the epoch's steps of loss_fn (per token), as the steps computed it;
    mean_loss stays the objective in nats on the N sequences (N times as large, plus the code cost and KL)."""
    n, length = 96, 7
    ids = torch.randint(0, 11, (n, length), generator=torch.Generator().manual_seed(0))
    torch.manual_seed(0)
    loss = _TokenLoss()
    if objective == "constrained":
        objective = Constrained(target_density=0.5)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # two epochs: the constrained objective's Lagrangian has not arrived
        result = train(
            SparseModel(_TinyLM(), loss, lam=0.01), ids, ids, objective=objective, epochs=2, batch_size=16,
            progress=False,
        )  # fmt: skip
    steps = n // 16
    assert len(loss.values) == 2 * steps
    for epoch, record in enumerate(result.history):
        expected = sum(loss.values[epoch * steps : (epoch + 1) * steps]) / steps
        assert record["train_loss"] == pytest.approx(expected, rel=1e-6)
        assert 1.0 < record["train_loss"] < 4.0  # a cross-entropy over 11 tokens, not n times one
        if isinstance(objective, Constrained):  # the objective's loss is the data term itself
            assert record["mean_loss"] == pytest.approx(n * record["train_loss"], rel=1e-6)
        else:
            assert record["mean_loss"] > n * record["train_loss"]


def test_train_loss_is_none_where_the_elbo_keeps_the_data_term_to_itself():
    from l0bayes.models import SparseLinearRegression

    x, y = torch.randn(32, 3), torch.randn(32)
    result = _fit(SparseLinearRegression(3), x, y, objective="bayes")
    assert result.history[-1]["train_loss"] is None
    result = _fit(SparseLinearRegression(3), x, y, objective="penalized")  # traced, term by term
    assert result.history[-1]["train_loss"] > 0


@pytest.mark.parametrize("examples", PROFILES)
def test_expected_flops_take_one_example_shape_and_record_the_pruned_count(examples):
    """``ExpectedFlops(input_shape)``: a whole number or a sequence of them, each ``>= 1`` (anything else refused,
    naming it); the records then hold the expected FLOPs of the network for that shape, in every full record only."""
    from l0bayes.inference import ExpectedFlops
    from l0bayes.pruning import expected_flops

    @_profile(examples)
    @given(
        shape=st.one_of(
            st.just((4,)), st.just(4), st.lists(st.integers(-1, 5), max_size=3).map(tuple), st.just(4.0),
            st.just((True,)), st.just("4"),
        ),
        epochs=st.integers(1, 3),
        every=st.integers(1, 3),
    )  # fmt: skip
    def prop(shape, epochs, every):
        values = (shape,) if isinstance(shape, int) and not isinstance(shape, bool) else shape
        valid = isinstance(values, tuple) and bool(values) and all(
            isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in values
        )  # fmt: skip
        if not valid:
            with pytest.raises((TypeError, ValueError), match=r"^ExpectedFlops: input_shape must be a tuple"):
                ExpectedFlops(shape)
            return
        if math.prod(values) != 4:  # a shape the network (which flattens its input) cannot take: refused first
            with pytest.raises(ValueError, match=r"^L0Linear\(in_features=4, out_features=3\) got an input of"):
                _fit(_classifier(), *_labelled(8), callbacks=[ExpectedFlops(shape)])
            return
        model = _classifier()
        run = _fit(model, *_labelled(8), epochs=epochs, record_every=every, callbacks=[ExpectedFlops(shape)])
        for record in run.history:
            assert ("expected_flops" in record) == record["full_record"]
        with torch.no_grad():
            assert run.history[-1]["expected_flops"] == pytest.approx(float(expected_flops(model.net, values)))

    prop()


@pytest.mark.parametrize("examples", PROFILES)
def test_stop_when_fixed_ends_the_run_after_the_epoch_that_fixed_the_gates(examples):
    """``StopWhenFixed``: with the constrained objective's final phase from epoch ``E - ceil(f E)``, the run ends after
    that epoch, whose record says ``stopped_early``; without a final phase it runs every epoch."""
    from l0bayes.inference import StopWhenFixed

    @_profile(examples)
    @given(epochs=st.integers(1, 5), final_phase=st.sampled_from((0.0, 0.2, 0.5, 0.9)))
    def prop(epochs, final_phase):
        objective = Constrained(target_density=0.9, final_phase=final_phase)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            run = _fit(_classifier(), *_labelled(8), objective=objective, epochs=epochs, callbacks=[StopWhenFixed()])
        if final_phase == 0.0:
            assert len(run.history) == epochs and not any(r.get("stopped_early") for r in run.history)
            return
        start = epochs - math.ceil(final_phase * epochs)
        assert len(run.history) == start + 1 and run.history[-1]["stopped_early"] is True

    prop()
