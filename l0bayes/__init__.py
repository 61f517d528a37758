"""l0bayes: sparse Bayesian models on Pyro with hard concrete gates (Louizos et al., 2018).

The names below are imported on first use (PEP 562), so that ``import l0bayes.cli`` does not load torch:
the ``l0bayes`` command sets how OpenMP threads wait before torch loads (:mod:`l0bayes.cli.threads`).

The package is built in floors, lowest first; a module imports from its own floor and those below, never
from above (imports inside functions included), and no imports form a cycle:

1. ``l0bayes.io``, ``l0bayes.threads``, ``l0bayes.utils``: checkpoint files that load without running
   code, the thread policy, argument checks (and the private helpers beside them, e.g. optional imports);
2. ``l0bayes.distributions``: the hard concrete distribution, its KL divergence, quadrature;
3. ``l0bayes.data``: data sets and seeded splits;
4. ``l0bayes.nn``: gates, gated layers, the paper's networks, penalties, density;
5. ``l0bayes.pruning``: gates on any model, pruning, FLOP counts, safe export of the pruned network;
6. ``l0bayes.inference``: the objectives, the training loop and its callbacks;
7. ``l0bayes.analysis``: posterior analysis of trained gates;
8. ``l0bayes.models``: Pyro models, gated classifiers;
9. ``l0bayes.selection``: variable selection you can check (the fit, the importance check, the exact sampler);
10. ``l0bayes.cli``: the command line.

Every name has one home, the module that defines it, and is exposed by the package that holds that
module; ``l0bayes`` itself exposes the few entry points of its ``__all__``.
"""

from typing import TYPE_CHECKING

__version__ = "0.1.0"

__all__ = ["HardConcrete", "StretchedConcrete", "kl_hard_concrete", "select_variables", "thread_policy", "__version__"]

if TYPE_CHECKING:  # pragma: no cover - for static analysis and documentation tools
    from .distributions import HardConcrete, StretchedConcrete, kl_hard_concrete
    from .selection.api import select_variables
    from .threads import thread_policy


def __getattr__(name):
    if name in ("HardConcrete", "StretchedConcrete", "kl_hard_concrete"):
        from . import distributions

        return getattr(distributions, name)
    if name == "select_variables":  # imported on first use: it pulls in Pyro
        from .selection.api import select_variables

        return select_variables
    if name == "thread_policy":
        from .threads import thread_policy

        return thread_policy
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(__all__))
