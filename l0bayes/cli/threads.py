"""The default number of intra-op threads of ``l0bayes fit``: one per CPU that other processes leave free.

Measured in ``benchmarks/bench_threads.py`` (results in ``benchmarks/RESULTS.md``, section "Issue 16
(threads)"): on the MLP 784-300-100 with minibatches of 100, two intra-op threads are the fastest on an
idle two-core machine, but beside one busy process they are several times slower than one thread
(the OpenMP threads wait for the core the other process holds). A fixed count cannot be within 1.2x
of the best setting in both cases, so the count is chosen when the run starts: the CPUs this process
may use, less the processes already running on them, at least one and at most torch's default.

"Already running" is the number of runnable tasks of the kernel's scheduler (the fourth field of
``/proc/loadavg``) sampled a few times over a tenth of a second, not the load *average*, which
lags a newly started process by a minute. Where ``/proc/loadavg`` does not exist the 1-minute load
average (``os.getloadavg``) is used, and where neither exists torch's default.
"""

import os
import time

__all__ = ["available_cpus", "busy_cpus", "default_threads"]


def available_cpus():
    """CPUs this process may run on (its affinity mask where the platform has one)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def _runnable(path="/proc/loadavg"):
    """Runnable tasks now (the ``R/T`` field of ``/proc/loadavg``), this process's own thread included."""
    with open(path) as f:
        return int(f.read().split()[3].split("/")[0])


def busy_cpus(samples=5, interval=0.02, path="/proc/loadavg"):
    """How many CPUs other processes keep busy now: the median count of runnable tasks but this one.

    :param int samples: readings of ``path``, ``interval`` seconds apart.
    :returns: a non-negative ``float``; ``None`` when the platform exposes neither ``/proc/loadavg`` nor
        ``os.getloadavg``.
    """
    try:
        counts = []
        for k in range(samples):
            if k:
                time.sleep(interval)
            counts.append(_runnable(path) - 1)
        counts.sort()
        return float(max(counts[len(counts) // 2], 0))
    except (OSError, IndexError, ValueError):
        pass
    try:
        return float(os.getloadavg()[0])
    except (AttributeError, OSError):
        return None


def default_threads(torch_default, busy=None, cpus=None):
    """Intra-op threads for a run: the CPUs left free by other processes, in ``[1, torch_default]``.

    :param int torch_default: torch's own choice (``torch.get_num_threads()`` before any change).
    :param busy: CPUs busy with other processes (default: :func:`busy_cpus` now).
    :param cpus: CPUs available to this process (default: :func:`available_cpus`).
    """
    busy = busy_cpus() if busy is None else busy
    if busy is None:
        return int(torch_default)
    cpus = available_cpus() if cpus is None else cpus
    free = int(cpus - round(busy))
    return max(1, min(int(torch_default), free))
