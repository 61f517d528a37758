"""l0bayes: sparse Bayesian models on Pyro with hard concrete gates (Louizos et al., 2018)."""

from .distributions import HardConcrete, StretchedConcrete, kl_hard_concrete

__version__ = "0.1.0"

__all__ = ["HardConcrete", "StretchedConcrete", "kl_hard_concrete", "__version__"]
