"""Threads of ``l0bayes fit``: torch's intra-op thread count, with OpenMP threads that sleep when they wait.

Measured in ``benchmarks/bench_threads.py`` (results in ``benchmarks/RESULTS.md``, section "Threads")
on the step of the Fashion-MNIST MLP 784-300-100 (minibatches of 100): with OpenMP's
default wait policy, waiting threads spin, and two intra-op threads run several times *slower* than
one as soon as another process wants a core (the spinning thread holds a core while the thread it
waits for is descheduled). With ``OMP_WAIT_POLICY=PASSIVE`` waiting threads sleep instead; two
threads are then never far behind one thread, and ahead of it on a loaded machine. A shorter spin
(``GOMP_SPINCOUNT=10000``) did not help. So the command line keeps torch's thread count (one per
core) and sets the passive policy, unless the user chose a policy.

The policy is read once, when the OpenMP runtime loads with torch, so :func:`configure_openmp` must
run before ``import torch``; the ``l0bayes`` command calls it first thing (importing
:mod:`l0bayes.cli` does not import torch). Where torch is already imported (the command line called
from Python) it changes nothing.
"""

import os
import sys

__all__ = ["WAIT_POLICY", "configure_openmp"]

WAIT_POLICY = "PASSIVE"
# Variables by which a user has already chosen how OpenMP threads wait.
_USER_CHOICE = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "KMP_BLOCKTIME")


def configure_openmp(environ=None):
    """Set ``OMP_WAIT_POLICY=PASSIVE`` unless the user chose a wait policy or torch is already loaded.

    :param environ: the environment to change (default ``os.environ``).
    :returns: ``True`` when the policy was set.
    """
    environ = os.environ if environ is None else environ
    if "torch" in sys.modules or any(k in environ for k in _USER_CHOICE):
        return False
    environ["OMP_WAIT_POLICY"] = WAIT_POLICY
    return True
