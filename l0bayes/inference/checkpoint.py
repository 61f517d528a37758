"""Checkpoints that load without running code: :mod:`l0bayes.io` under its former name, for existing imports."""

from ..io import CheckpointError, load_checkpoint, numpy_rng_state, save_checkpoint, set_numpy_rng_state

__all__ = ["CheckpointError", "load_checkpoint", "numpy_rng_state", "save_checkpoint", "set_numpy_rng_state"]
