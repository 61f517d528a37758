"""Every bad argument of the models, networks and readers fails early, naming the argument."""

import math

import numpy as np
import pytest
import torch
from idx_fixtures import write as _write

from l0bayes.data import read_idx
from l0bayes.models import SparseClassifier, SparseLinearRegression, SparseLogisticRegression
from l0bayes.nn import L0MLP, architecture

NAN, INF = math.nan, math.inf


def _classifier(**kwargs):
    return SparseClassifier(L0MLP(4, (3,), 2), **kwargs)


@pytest.mark.parametrize(
    "kwargs, name",
    [
        ({"lam": -1.0}, "lam"),  # used to train with a negative code cost
        ({"lam": NAN}, "lam"),
        ({"lam": INF}, "lam"),
        ({"lam": {"fc1": 0.1, "fc2": -0.5}}, "lam\\['fc2'\\]"),
        ({"weight_decay": -1e-4}, "weight_decay"),
        ({"weight_decay": NAN}, "weight_decay"),
        ({"prior_inclusion": 1.0}, "prior_inclusion"),
        ({"prior_inclusion": NAN}, "prior_inclusion"),
    ],
)
def test_classifier_bad_values(kwargs, name):
    with pytest.raises(ValueError, match=f"SparseClassifier: {name} must be"):
        _classifier(**kwargs)


def test_classifier_bad_types():
    with pytest.raises(TypeError, match="lam"):
        _classifier(lam="0.1")
    with pytest.raises(TypeError, match="weight_decay"):
        _classifier(weight_decay=True)
    _classifier(lam=0.0, weight_decay=0.0)  # the boundary is allowed
    _classifier(lam=np.float32(0.2), weight_decay=torch.tensor(1e-4))


@pytest.mark.parametrize("cls", [SparseLinearRegression, SparseLogisticRegression])
@pytest.mark.parametrize(
    "kwargs, name",
    [
        ({"prior_scale": NAN}, "prior_scale"),  # used to fail late with a Pyro message
        ({"prior_scale": INF}, "prior_scale"),
        ({"prior_scale": 0.0}, "prior_scale"),
        ({"code_cost": NAN}, "code_cost"),
        ({"code_cost": -1.0}, "code_cost"),
        ({"prior_inclusion": 0.0}, "prior_inclusion"),
        ({"init_drop_rate": 1.0}, "init_drop_rate"),
        ({"temperature": INF}, "temperature"),
        ({"lower": -INF}, "lower"),
        ({"upper": NAN}, "upper"),
    ],
)
def test_regression_bad_values(cls, kwargs, name):
    with pytest.raises(ValueError, match=f"{cls.__name__}: {name} must be"):
        cls(3, **kwargs)


def test_regression_noise_scale_and_features():
    for bad in (NAN, INF, 0.0, -1.0):
        with pytest.raises(ValueError, match="SparseLinearRegression: noise_scale must be"):
            SparseLinearRegression(3, noise_scale=bad)
    with pytest.raises(ValueError, match="num_features"):
        SparseLinearRegression(2.5)
    with pytest.raises(TypeError, match="prior_scale"):
        SparseLinearRegression(3, prior_scale="1")
    model = SparseLinearRegression(3, noise_scale=None, code_cost=None)  # None: learn it / the BIC default
    assert model.fixed_noise_scale is None


@pytest.mark.parametrize("hidden", [(20,), (), (30, 20, 10)])
def test_l0mlp_default_drop_rates_fit_any_depth(hidden):
    # L0MLP(64, (20,), 10) used to fail on its own default (three rates for two gated layers)
    torch.manual_seed(0)
    net = L0MLP(64, hidden, 10)
    rates = [1.0 - torch.sigmoid(layer.gate.log_alpha.mean()).item() for layer in net if hasattr(layer, "gate")]
    # Section 4: 0.2 on the inputs, 0.5 on the hidden layers (log_alpha starts at logit(1 - rate))
    assert rates == pytest.approx([0.2] + [0.5] * len(hidden), abs=0.01)
    assert net(torch.randn(5, 64)).shape == (5, 10)
    assert architecture(net).count("-") == len(hidden)


def test_read_idx_huge_header_is_a_clear_error(tmp_path):
    # three dimensions of 2^32 - 1: the product overflowed int64 and could pass the size check
    payload = b"\x00\x00\x08\x03" + b"\xff\xff\xff\xff" * 3 + b"\x00" * 8
    with pytest.raises(ValueError, match="truncated IDX file"):
        read_idx(_write(tmp_path / "huge", payload))
    # dims whose int64 product wraps around to a small number exactly
    wrap = b"\x00\x00\x08\x02" + (2**32 - 1).to_bytes(4, "big") + (2**32 - 1).to_bytes(4, "big")
    with pytest.raises(ValueError, match="truncated IDX file"):
        read_idx(_write(tmp_path / "wrap", wrap + b"\x00"))


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32, torch.float64])
@pytest.mark.parametrize("bad", [None, math.nan, math.inf, -math.inf])
def test_all_finite_agrees_with_numpy(dtype, bad):
    from l0bayes.utils import all_finite

    x = torch.randn(50, 7).to(dtype)
    if bad is not None:
        x[31, 4] = bad
    assert all_finite(x) == bool(np.isfinite(x.double().numpy()).all())
    assert all_finite(torch.empty(0, 3, dtype=dtype)) and all_finite(torch.arange(5))


@pytest.mark.parametrize("bad", [math.nan, math.inf])
def test_train_refuses_non_finite_inputs(bad):
    from l0bayes.inference import train
    from l0bayes.nn import L0LeNet5

    images = torch.rand(8, 1, 28, 28)
    images[5, 0, 3, 3] = bad
    with pytest.raises(ValueError, match="NaN or infinite"):
        train(SparseClassifier(L0LeNet5()), images, torch.zeros(8, dtype=torch.long), epochs=1, progress=False)
    features = torch.rand(8, 6)
    features[2, 1] = bad
    with pytest.raises(ValueError, match="NaN or infinite"):
        train(SparseClassifier(L0MLP(6, (4,), 2)), features, torch.zeros(8, dtype=torch.long), epochs=1, progress=False)


def test_too_few_features_name_the_first_layer_and_both_sizes():
    # With most gates closed the layer gathers the open columns: 6 features for fc1's 8 failed with
    # "INDICES element is out of DATA bounds".
    from l0bayes.inference import train

    torch.manual_seed(0)
    model = SparseClassifier(L0MLP(8, (5,), 3, init_drop_rates=0.9))
    labels = torch.randint(0, 3, (20,))
    with pytest.raises(ValueError, match=r"^x has 6 features, but layer fc1 \(L0Linear\) takes in_features=8$"):
        train(model, torch.randn(20, 6), labels, epochs=1, progress=False)
    with pytest.raises(ValueError, match=r"^test_data\[0\] has 9 features, but layer fc1 .* in_features=8$"):
        train(model, torch.randn(20, 8), labels, epochs=1, progress=False, test_data=(torch.randn(4, 9), labels[:4]))
    with pytest.raises(ValueError, match=r"L0Linear\(in_features=8, out_features=5\) got an input of 6 features"):
        model.net.train()(torch.randn(20, 6))  # the layer itself, outside train()
    images = SparseClassifier(L0MLP(64, (5,), 3))
    with pytest.raises(ValueError, match=r"49 values per example \(shape \(4, 1, 7, 7\)\).*in_features=64"):
        train(images, torch.randn(4, 1, 7, 7), labels[:4], epochs=1, progress=False)


def test_lenet_input_channels_are_checked_up_front():
    from l0bayes.inference import train
    from l0bayes.nn import L0LeNet5

    with pytest.raises(ValueError, match=r"x must have shape \(num_data, 1, height, width\) for layer conv1"):
        train(SparseClassifier(L0LeNet5()), torch.rand(4, 3, 28, 28), torch.zeros(4, dtype=torch.long), epochs=1,
              progress=False)  # fmt: skip


@pytest.mark.parametrize(
    "make",
    [lambda: SparseClassifier(L0MLP(4, (3,), 2)), lambda: SparseLinearRegression(4)],
    ids=["classifier", "linear"],
)
def test_data_of_another_dtype_than_the_model_is_a_type_error(make):
    # A float64 model given float32 data failed mid-step with "mat1 and mat2 must have the same dtype".
    from l0bayes.inference import train

    model = make().double()
    y = torch.randint(0, 2, (10,)) if isinstance(model, SparseClassifier) else torch.randn(10, dtype=torch.float64)
    with pytest.raises(TypeError, match=r"x has dtype torch.float32 but the model's parameters are torch.float64"):
        train(model, torch.randn(10, 4), y, epochs=1, progress=False)
    with pytest.raises(TypeError, match=r"x has dtype torch.int64 .*\(x\.to\(torch\.float64\)\)"):
        train(model, torch.ones(10, 4, dtype=torch.long), y, epochs=1, progress=False)


def test_integer_targets_of_a_regression_are_real_numbers():
    # Negative int64 targets of a linear model were refused with "training labels must lie in [0, None)".
    from l0bayes.inference import train

    x = torch.randn(30, 4)
    y = torch.randint(-5, 5, (30,))
    runs = []
    for targets in (y, y.float()):
        torch.manual_seed(0)
        model = SparseLinearRegression(4)
        result = train(model, x, targets, epochs=2, batch_size=10, progress=False, test_data=(x, targets))
        runs.append((model.weight.detach().clone(), [h["mean_loss"] for h in result.history], result.history))
    assert torch.equal(runs[0][0], runs[1][0]) and runs[0][1] == runs[1][1]
    assert runs[0][2][-1]["test_rmse"] == runs[1][2][-1]["test_rmse"]  # an RMSE, not a classification error
    with pytest.raises(TypeError, match=r"y has dtype torch.bool, but SparseLinearRegression needs real"):
        train(SparseLinearRegression(4), x, y > 0, epochs=1, progress=False)


def test_class_labels_name_the_range_and_the_dtype():
    from l0bayes.inference import train

    model = SparseClassifier(L0MLP(4, (3,), 3))
    x = torch.randn(10, 4)
    with pytest.raises(ValueError, match=r"^y: class labels must lie in \[0, 3\), got range \[-2, 2\]$"):
        train(model, x, torch.arange(10) % 5 - 2, epochs=1, progress=False)
    with pytest.raises(TypeError, match=r"y has dtype torch.float32, but SparseClassifier needs integer class labels"):
        train(model, x, torch.zeros(10), epochs=1, progress=False)
    with pytest.raises(ValueError, match=r"y: SparseLogisticRegression needs binary labels, 0 or 1, got values in"):
        train(SparseLogisticRegression(4), x, torch.arange(10) % 3, epochs=1, progress=False)


@pytest.mark.parametrize("seed, error", [(2**70, ValueError), (-1, ValueError), (2**64, ValueError), (1.5, TypeError),
                                         ("3", TypeError), (True, TypeError)])  # fmt: skip
def test_train_seed_out_of_range_names_the_seed(seed, error):
    # 2**70 failed in torch.manual_seed with "Overflow when unpacking long long".
    from l0bayes.data import split_indices
    from l0bayes.inference import train

    with pytest.raises(error, match=r"^seed must be a whole number in \[0, 2\*\*64\)"):
        train(SparseLinearRegression(3), torch.randn(10, 3), torch.randn(10), epochs=1, seed=seed, progress=False)
    with pytest.raises(error, match=r"^seed must be a whole number in \[0, 2\*\*64\)"):
        split_indices(10, seed=seed)


def test_train_accepts_the_largest_seed():
    from l0bayes.inference import train

    for seed in (0, 2**64 - 1, np.uint64(2**64 - 1)):
        result = train(SparseLinearRegression(3), torch.randn(10, 3), torch.randn(10), epochs=1, seed=seed,
                       progress=False)  # fmt: skip
        assert math.isfinite(result.history[-1]["mean_loss"])
