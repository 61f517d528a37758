"""The random states a checkpoint carries so that a resumed run draws what the straight run would."""

import random

import torch

from ..io import numpy_rng_state, set_numpy_rng_state

__all__ = ["rng_state", "set_rng_state"]


def rng_state():
    """torch's (CPU and CUDA), NumPy's and Python's random states, as tensors and plain containers."""
    return {
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
        "numpy": numpy_rng_state(),
        "python": random.getstate(),
    }


def set_rng_state(state):
    """Restore :func:`rng_state`."""
    torch.set_rng_state(state["torch"])
    if state.get("cuda") is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    set_numpy_rng_state(state["numpy"])
    random.setstate(state["python"])
