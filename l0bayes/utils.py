"""Input checks shared by the models and the trainer."""

import torch


def check_xy(x, y, num_features=None):
    """Validate a design matrix and targets: clear errors instead of silent NaN or broadcasting."""
    if not torch.is_tensor(x):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    if x.dim() != 2:
        raise ValueError(f"x must have shape (num_data, num_features), got {tuple(x.shape)}")
    if num_features is not None and x.shape[1] != num_features:
        raise ValueError(f"x has {x.shape[1]} features, the model expects {num_features}")
    if not torch.isfinite(x).all():
        raise ValueError("x contains NaN or infinite values")
    if y is not None:
        if not torch.is_tensor(y):
            raise TypeError(f"y must be a torch.Tensor, got {type(y).__name__}")
        if y.shape != x.shape[:1]:
            raise ValueError(f"y must have shape ({x.shape[0]},) to match x, got {tuple(y.shape)}")
        if y.is_floating_point() and not torch.isfinite(y).all():
            raise ValueError("y contains NaN or infinite values")
        y = y.to(x.dtype)
    return x, y
