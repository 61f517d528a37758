"""Input checks shared by the models and the trainer."""

import torch


def all_finite(t):
    """Whether every entry of ``t`` is finite: one reduction pass (``aminmax`` propagates NaN), no tensor of its size.

    ``torch.isfinite(t).all()`` allocates a boolean tensor as large as ``t`` (47 MB for Fashion-MNIST's
    training set, 0.7 s on a loaded CPU, against 0.04 s for this).
    """
    if not t.is_floating_point() or t.numel() == 0:
        return True
    low, high = torch.aminmax(t)
    return bool(torch.isfinite(low) & torch.isfinite(high))


def check_xy(x, y, num_features=None):
    """Validate a design matrix and targets: clear errors instead of silent NaN or broadcasting."""
    if not torch.is_tensor(x):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    if x.dim() != 2:
        raise ValueError(f"x must have shape (num_data, num_features), got {tuple(x.shape)}")
    if num_features is not None and x.shape[1] != num_features:
        raise ValueError(f"x has {x.shape[1]} features, the model expects {num_features}")
    if not all_finite(x):
        raise ValueError("x contains NaN or infinite values")
    if y is not None:
        if not torch.is_tensor(y):
            raise TypeError(f"y must be a torch.Tensor, got {type(y).__name__}")
        if y.shape != x.shape[:1]:
            raise ValueError(f"y must have shape ({x.shape[0]},) to match x, got {tuple(y.shape)}")
        if not all_finite(y):
            raise ValueError("y contains NaN or infinite values")
        y = y.to(x.dtype)
    return x, y
