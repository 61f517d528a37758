"""ProgressBar: a bar on a terminal or in a notebook, one line per epoch written to a file or a pipe."""

import io
import re
import sys
import types

import torch

from l0bayes.inference import train
from l0bayes.inference.batches import TensorBatches
from l0bayes.inference.callbacks import CallbackList, History, ProgressBar
from l0bayes.inference.distributed import DataParallelContext
from l0bayes.inference.loop import Run, fit
from l0bayes.inference.objectives import Penalized
from l0bayes.models import SparseClassifier, SparseLinearRegression
from l0bayes.nn import L0MLP


class Terminal(io.StringIO):
    def isatty(self):
        return True


def _run(epochs):
    """A small gated classifier, 3 steps per epoch (as in test_callback_units)."""
    torch.manual_seed(0)
    model = SparseClassifier(L0MLP(6, (5,), 3), lam=0.1)
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(60, 6, generator=g), torch.randint(0, 3, (60,), generator=g)
    batches = TensorBatches(x, y, 20, 0, DataParallelContext(False))
    objective = Penalized().build(model, 60)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.05)
    run = Run(model, optimizer, objective, batches, objective.step, epochs, 60, torch.device("cpu"))
    run.steps_per_epoch = batches.steps_per_epoch
    return run


def _fit(run, callbacks):
    run.callbacks = CallbackList(callbacks)
    run.callbacks.setup(run)
    return fit(run)


LINE = re.compile(r"^penalized: epoch (\d+)/4, free_energy [0-9.e+-]+ \(\d+\.\d s\)$")


def test_a_file_gets_one_line_per_epoch():
    out = io.StringIO()  # not a terminal, as a log file or a pipe
    run = _run(epochs=4)
    _fit(run, [History(run.batches.record_subset()), ProgressBar("penalized", file=out)])
    text = out.getvalue()
    assert "\r" not in text and text.endswith("\n")
    lines = text.splitlines()
    assert [int(LINE.match(line).group(1)) for line in lines] == [1, 2, 3, 4], text


def test_after_a_resume_the_lines_count_the_epochs_of_the_whole_run():
    out = io.StringIO()
    run = _run(epochs=4)
    run.epoch = 2  # as after a resume
    _fit(run, [History(run.batches.record_subset()), ProgressBar("penalized", file=out)])
    assert [LINE.match(line).group(1) for line in out.getvalue().splitlines()] == ["3", "4"]


def test_a_terminal_gets_the_bar():
    out = Terminal()
    run = _run(epochs=2)
    _fit(run, [History(run.batches.record_subset()), ProgressBar("penalized", file=out)])
    text = out.getvalue()
    assert "\r" in text and "step" in text and "epoch 1/2" not in text  # tqdm redraws in place


def test_train_with_stderr_redirected_writes_lines(capsys):
    """``l0bayes fit > log 2>&1`` in small: stderr is not a terminal, so one short line per epoch."""
    torch.manual_seed(0)
    x = torch.randn(40, 3)
    y = x[:, 0] + 0.1 * torch.randn(40)
    model = SparseLinearRegression(num_features=3)
    train(model, x, y, objective="bayes", epochs=5, batch_size=10, lr=0.05, progress=True)
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("bayes: epoch")]
    assert len(lines) == 5 and "\r" not in err
    assert all(len(line) < 120 for line in lines), lines


def test_in_a_notebook_the_default_stream_gets_the_bar(monkeypatch):
    bars = []

    class FakeBar:
        def __init__(self, total, **kw):
            self.kw = kw
            bars.append(self)

        def update(self, n):
            pass

        def set_postfix(self, postfix):
            pass

        def close(self):
            pass

    import tqdm.auto

    monkeypatch.setattr(tqdm.auto, "tqdm", FakeBar)
    kernel = types.SimpleNamespace(config={"IPKernelApp": {}})
    monkeypatch.setitem(sys.modules, "IPython", types.SimpleNamespace(get_ipython=lambda: kernel))
    run = _run(epochs=1)
    _fit(run, [ProgressBar()])  # the kernel's stderr is not a terminal, but tqdm draws a widget there
    assert len(bars) == 1 and "file" not in bars[0].kw
    out = io.StringIO()  # a file given explicitly still gets lines
    run = _run(epochs=1)
    _fit(run, [History(run.batches.record_subset()), ProgressBar(file=out)])
    assert len(bars) == 1 and out.getvalue().startswith("train: epoch 1/1")
