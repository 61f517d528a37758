"""Errors of training."""

__all__ = ["NonFiniteLossError"]


class NonFiniteLossError(FloatingPointError):
    """Raised when a training step produces a NaN or infinite objective (or a parameter becomes one)."""
