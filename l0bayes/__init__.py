"""l0bayes: sparse Bayesian models on Pyro with hard concrete gates (Louizos et al., 2018).

The names below are imported on first use (PEP 562), so that ``import l0bayes.cli`` does not load torch:
the ``l0bayes`` command sets how OpenMP threads wait before torch loads (:mod:`l0bayes.cli.threads`).
"""

from typing import TYPE_CHECKING

__version__ = "0.1.0"

__all__ = ["HardConcrete", "StretchedConcrete", "kl_hard_concrete", "select_variables", "thread_policy", "__version__"]

if TYPE_CHECKING:  # pragma: no cover - for static analysis and documentation tools
    from .distributions import HardConcrete, StretchedConcrete, kl_hard_concrete
    from .models.selection import select_variables
    from .threads import thread_policy


def __getattr__(name):
    if name in ("HardConcrete", "StretchedConcrete", "kl_hard_concrete"):
        from . import distributions

        return getattr(distributions, name)
    if name == "select_variables":  # imported on first use: it pulls in Pyro
        from .models.selection import select_variables

        return select_variables
    if name == "thread_policy":
        from .threads import thread_policy

        return thread_policy
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(__all__))
