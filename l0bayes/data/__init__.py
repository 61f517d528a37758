"""Dataset readers (IDX files of MNIST / Fashion-MNIST)."""

from .idx import find_fashion_mnist, load_mnist_format, read_idx

__all__ = ["find_fashion_mnist", "load_mnist_format", "read_idx"]
