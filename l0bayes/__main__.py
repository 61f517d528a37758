"""``python -m l0bayes``: the ``l0bayes`` command line (:mod:`l0bayes.cli`).

With no arguments it is ``l0bayes fit``: the L0 MLP on scikit-learn's bundled digits with the
penalised objective (Eq. 22), then the final table. Bayesian variable selection on the diabetes
data (SVI on Eq. 21, Gaussian slab) is ``python -m l0bayes fit --model linear --objective bayes
--slab gaussian``.
"""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
