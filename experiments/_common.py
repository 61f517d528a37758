"""What the experiment scripts share: the description of the machine a run was measured on.

The scripts run as ``python experiments/<name>.py``, which puts this folder on ``sys.path``.
"""

import platform


def machine():
    """The CPU model and its number of logical cores (from ``/proc/cpuinfo``), or the architecture elsewhere."""
    try:
        with open("/proc/cpuinfo") as f:
            names = [line.split(":", 1)[1].strip() for line in f if line.startswith("model name")]
        return f"{names[0]}, {len(names)} cores" if names else platform.machine()
    except OSError:
        return platform.machine()
