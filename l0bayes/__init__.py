"""l0bayes: sparse Bayesian models on Pyro with hard concrete gates (Louizos et al., 2018)."""

from .distributions import HardConcrete, StretchedConcrete, kl_hard_concrete

__version__ = "0.1.0"

__all__ = ["HardConcrete", "StretchedConcrete", "kl_hard_concrete", "select_variables", "__version__"]


def __getattr__(name):
    if name == "select_variables":  # imported on first use: it pulls in Pyro
        from .models.selection import select_variables

        return select_variables
    raise AttributeError(f"module 'l0bayes' has no attribute {name!r}")
