"""The intra-op thread count of the library's heavy calls: one thread unless you choose otherwise.

torch runs one intra-op OpenMP thread per core, and OpenMP's default wait policy makes a thread
that waits for the others *spin* on its core. As soon as another process wants a core, the
spinning thread holds it while the thread it waits for is descheduled, and a call runs many times
slower than on one thread: beside one other process with two threads, on two cores, one epoch of a
small MLP, the KL of 10^6 gate pairs and notebook 03 ran 13-19x slower (medians of 7 repeats, up to
53x; ``benchmarks/RESULTS.md``, "Threads", measured with ``benchmarks/bench_library_threads.py``).

The cure the command line uses, ``OMP_WAIT_POLICY=PASSIVE`` (:mod:`l0bayes.cli.threads`), only takes
effect when set before torch loads, which a library cannot arrange. ``torch.set_num_threads(1)``
can be set at any time, and one thread has nobody to wait for. So :func:`~l0bayes.inference.train`
and :func:`~l0bayes.selection.select_variables` (both with a ``threads=`` argument),
:func:`~l0bayes.distributions.kl_hard_concrete` (on batches large enough for torch to run in
parallel), :func:`~l0bayes.pruning.prune`, :meth:`~l0bayes.pruning.PruneReport.from_model` and
:func:`~l0bayes.analysis.to_inference_data` run under :func:`thread_policy`, which with the default
``threads="auto"`` chooses

* torch's count as it stands when your environment chose it: ``OMP_NUM_THREADS`` or
  ``MKL_NUM_THREADS`` set (torch reads them at start-up);
* the choice of an enclosing :func:`thread_policy` block, so that ``with thread_policy(4):`` around
  any code gives its library calls four threads, and ``with thread_policy(None):`` torch's count;
* one thread otherwise.

The caller's count is restored when the call returns or raises. One thread costs little on the
models this package ships (their matrix products are small). For several threads, e.g. a large
network on a machine of your own, export ``OMP_WAIT_POLICY=PASSIVE`` before Python starts (waiting
threads then sleep instead of spinning) and pass ``threads=`` a count, or ``None`` for torch's count
(or set ``OMP_NUM_THREADS``). Only where no other process competes for the cores is torch's default
spinning safe.
"""

import contextlib
import functools
import os
import threading

import torch

__all__ = ["AUTO", "choose_threads", "policy_for", "thread_policy", "under_thread_policy"]

AUTO = "auto"
#: Environment variables by which a user chose torch's intra-op count (torch reads both at start-up).
COUNT_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")
#: Below this many elements torch runs an operation on one thread anyway (ATen's ``GRAIN_SIZE``): a
#: call on a smaller batch needs no policy.
PARALLEL_MIN_ELEMENTS = 32768

_active = threading.local()  # depth of the thread_policy blocks open in this Python thread


def _environment_chose(environ):
    return any(k in environ for k in COUNT_VARIABLES)


def choose_threads(threads=AUTO, environ=None):
    """The intra-op thread count a call runs with: a positive int, or ``None`` to leave torch's count.

    :param threads: ``"auto"`` (see the module docstring), ``None`` (torch's count as it is) or a
        positive int.
    :param environ: the environment to read (default ``os.environ``).
    :raises ValueError: for anything else.
    """
    if threads is None:
        return None
    if isinstance(threads, str) and threads == AUTO:
        inside = getattr(_active, "depth", 0) > 0
        return None if inside or _environment_chose(os.environ if environ is None else environ) else 1
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise ValueError(f"threads must be 'auto', None or a positive int, got {threads!r}")
    return threads


@contextlib.contextmanager
def thread_policy(threads=AUTO):
    """Run the block with :func:`choose_threads`'s intra-op count; the caller's count is restored after.

    Yields the count in force inside the block. ``"auto"`` inside the block (the library's calls)
    keeps the count this block chose. Not meant for several Python threads changing torch's count at
    once (the count is one setting of the process)::

        from l0bayes.threads import thread_policy

        with thread_policy(4):  # four threads for train(), select_variables() and the KL inside
            result = train(model, x, y)

    :param threads: ``"auto"``, ``None`` or a positive int, as in :func:`choose_threads`.
    """
    count = choose_threads(threads)
    before = torch.get_num_threads()
    _active.depth = getattr(_active, "depth", 0) + 1
    try:
        if count is not None and count != before:
            torch.set_num_threads(count)
        yield torch.get_num_threads()
    finally:
        _active.depth -= 1
        if torch.get_num_threads() != before:
            torch.set_num_threads(before)


def policy_for(elements, threads=AUTO):
    """:func:`thread_policy` for operations on ``elements`` elements; a no-op below :data:`PARALLEL_MIN_ELEMENTS`.

    torch runs smaller operations on one thread whatever its count, so they cannot fall into the
    spinning trap, and a hot loop over small batches does not pay for changing the count.
    """
    return thread_policy(threads) if elements >= PARALLEL_MIN_ELEMENTS else contextlib.nullcontext()


def under_thread_policy(function):
    """Decorator: ``function`` runs under ``thread_policy("auto")`` (heavy calls that take no ``threads=``)."""

    @functools.wraps(function)
    def wrapper(*args, **kwargs):
        with thread_policy(AUTO):
            return function(*args, **kwargs)

    return wrapper
