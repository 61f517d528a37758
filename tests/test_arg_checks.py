"""Issue 16: every bad argument of the models, networks and readers fails early, naming the argument."""

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
