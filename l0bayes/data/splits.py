"""Seeded train / validation / test splits, standardised on the training statistics only."""

from dataclasses import dataclass

import torch

from .._checks import check_seed

SCALINGS = ("feature", "unit", "none")


@dataclass
class Standardizer:
    """``(x - mean) / scale`` with ``mean`` and ``scale`` estimated on the training split.

    A feature that is constant on the training split gets ``scale = 1`` (it is only centred), so
    standardisation never divides by zero.
    """

    mean: torch.Tensor
    scale: torch.Tensor

    @classmethod
    def fit(cls, x, how="feature", max_value=255.0):
        """Statistics from the training inputs ``x`` (``N x ...``).

        :param how: ``"feature"``: per-feature mean and (population) standard deviation;
            ``"unit"``: divide by ``max_value`` (pixels to ``[0, 1]``, no centring); ``"none"``.
        """
        if how not in SCALINGS:
            raise ValueError(f"scaling must be one of {SCALINGS}, got {how!r}")
        if x.shape[0] == 0:
            raise ValueError("cannot standardise on an empty training split")
        x = x.to(torch.float64)
        shape = x.shape[1:]
        if how == "feature":
            mean = x.mean(0)
            scale = x.std(0, unbiased=False)
            scale = torch.where(scale > 0, scale, torch.ones_like(scale))
        elif how == "unit":
            mean, scale = torch.zeros(shape, dtype=x.dtype), torch.full(shape, float(max_value), dtype=x.dtype)
        else:
            mean, scale = torch.zeros(shape, dtype=x.dtype), torch.ones(shape, dtype=x.dtype)
        return cls(mean, scale)

    def __call__(self, x, dtype=torch.float32):
        return ((x.to(torch.float64) - self.mean) / self.scale).to(dtype)

    def inverse(self, x):
        return x.to(torch.float64) * self.scale + self.mean


def split_indices(num_data, val_fraction=0.1, test_fraction=0.2, seed=0):
    """A seeded random partition of ``range(num_data)`` into disjoint train / validation / test indices.

    Sizes are ``round(fraction * num_data)`` for validation and test, the rest is training data.
    The same ``seed`` gives the same partition on every machine (``torch.Generator`` on the CPU).

    :returns: three sorted ``int64`` tensors ``(train, val, test)``.
    """
    num_data = int(num_data)
    seed = check_seed(seed)
    for name, frac in (("val_fraction", val_fraction), ("test_fraction", test_fraction)):
        if not 0.0 <= float(frac) < 1.0:
            raise ValueError(f"{name} must be in [0, 1), got {frac}")
    n_val, n_test = round(val_fraction * num_data), round(test_fraction * num_data)
    if num_data - n_val - n_test < 1:
        raise ValueError(
            f"no training data left: {num_data} examples, {n_val} for validation and {n_test} for test "
            f"(val_fraction={val_fraction}, test_fraction={test_fraction})"
        )
    order = torch.randperm(num_data, generator=torch.Generator().manual_seed(seed))
    test, val, train = order[:n_test], order[n_test : n_test + n_val], order[n_test + n_val :]
    return train.sort().values, val.sort().values, test.sort().values
