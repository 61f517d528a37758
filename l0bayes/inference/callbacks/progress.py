"""Progress of a run: a bar over the steps (tqdm) on a terminal or in a notebook, a line per epoch elsewhere."""

import sys
import time

from .base import Callback

__all__ = ["ProgressBar"]

#: The record entries shown beside the bar (and on each line).
SHOWN = ("free_energy", "test_error", "test_rmse")


def _is_terminal(stream):
    """Whether ``stream`` is an interactive terminal (a closed or detached stream is not)."""
    isatty = getattr(stream, "isatty", None)
    try:
        return bool(isatty()) if callable(isatty) else False
    except (ValueError, OSError):
        return False


def _in_notebook():
    """Whether this runs in a Jupyter kernel (where ``tqdm.auto`` draws its bar as a widget)."""
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None and hasattr(ipython, "get_ipython") else None
    return shell is not None and "IPKernelApp" in getattr(shell, "config", {})


class ProgressBar(Callback):
    """One ``tqdm`` bar over every step still to train; the free energy and test error after each epoch.

    The bar redraws itself in place, which only a terminal (or a notebook) shows as a bar: written to
    a file or a pipe (a log, a CI job, ``l0bayes fit > log.txt``) every redraw would pile up on one
    line. There the progress is instead one line per epoch, written when the epoch ends, e.g.
    ``penalized: epoch 3/10, free_energy 1234, test_error 0.0251 (4.2 s)``.

    :param str description: the bar's label (``train()`` uses the objective's name).
    :param file: where to write (default ``sys.stderr`` as it is when training starts). A bar when it
        is a terminal (``file.isatty()``), or by default in a Jupyter kernel; else a line per epoch.
    """

    def __init__(self, description="train", file=None):
        self.description = description
        self.file = file
        self.bar = None
        self.lines = None  # the stream that gets a line per epoch, when it is not a terminal
        self.started = None

    def on_fit_start(self, run):
        if not run.is_main:
            return
        stream = sys.stderr if self.file is None else self.file
        self.started = time.perf_counter()
        if _is_terminal(stream) or (self.file is None and _in_notebook()):
            from tqdm.auto import tqdm

            total = (run.epochs - run.epoch) * run.steps_per_epoch if run.steps_per_epoch else None
            where = {} if self.file is None else {"file": self.file}
            self.bar = tqdm(total=total, desc=self.description, unit="step", leave=False, **where)
        else:
            self.lines = stream

    def on_step_end(self, run):
        if self.bar is not None:
            self.bar.update(1)

    def on_epoch_end(self, run, record):
        shown = {k: v for k, v in record.items() if k in SHOWN and v is not None}
        if self.bar is not None:
            self.bar.set_postfix({k: f"{v:.4g}" for k, v in shown.items()})
        elif self.lines is not None:
            figures = "".join(f", {k} {v:.4g}" for k, v in shown.items())
            seconds = time.perf_counter() - self.started
            self.lines.write(f"{self.description}: epoch {run.epoch + 1}/{run.epochs}{figures} ({seconds:.1f} s)\n")
            self.lines.flush()

    def on_exception(self, run, error):
        self.on_fit_end(run)

    def on_fit_end(self, run):
        if self.bar is not None:
            self.bar.close()
            self.bar = None
        self.lines = None
