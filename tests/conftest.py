"""Fixtures shared by several test modules."""

import os

import pytest
import torch

#: Whether this machine has a CUDA device. Tests of numeric results run on it too when it does.
CUDA = torch.cuda.is_available()

#: The CUDA variant of a test: marked ``gpu`` (the default run, ``-m 'not slow and not gpu'``, deselects
#: it, so a CPU-only machine neither runs nor lists it) and skipped where CUDA is missing.
CUDA_PARAM = pytest.param("cuda", marks=(pytest.mark.gpu, pytest.mark.skipif(not CUDA, reason="needs CUDA")), id="cuda")
DEVICES = ("cpu", CUDA_PARAM)


def pytest_configure(config):
    # One intra-op thread for the whole run, unless the environment chose a count (the library's heavy calls take
    # one anyway, l0bayes.threads): the tests' own tensors are small, and a second thread only adds CPU time (it
    # spins while it waits) and, beside another job on a shared machine, holds a core the other thread waits for.
    # tests/test_threads.py sets the counts it checks.
    if not any(key in os.environ for key in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")):
        torch.set_num_threads(1)
    if CUDA:
        # The tests check float32 against float64 references at float32's precision; TensorFloat-32
        # products (cuDNN's default for convolutions) keep 10 mantissa bits. Training code is untouched.
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False


@pytest.fixture(params=DEVICES)
def device(request):
    """``torch.device("cpu")``, and ``torch.device("cuda")`` for the ``gpu``-marked variant.

    Run the CUDA variants on a GPU machine with ``python -m pytest -m gpu`` (or ``-m ''`` for all).
    """
    return torch.device(request.param)


@pytest.fixture
def cuda_device():
    """``torch.device("cuda")`` for tests that compare the two devices; mark such tests ``gpu``."""
    if not CUDA:
        pytest.skip("needs CUDA")
    return torch.device("cuda")


@pytest.fixture
def one_thread():
    """Tiny models: one intra-op thread avoids contention on a shared CPU."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def interrupt_at_epoch():
    """``with interrupt_at_epoch(k): train(...)``: Ctrl-C right after the checkpoint of epoch ``k`` is written.

    ``saved=False`` interrupts instead of writing it: a crash after the epoch's other side effects.
    """
    import contextlib

    from l0bayes.inference.callbacks import checkpointing

    @contextlib.contextmanager
    def interrupt(epoch, saved=True):
        save = checkpointing.save_checkpoint

        def save_then_interrupt(path, state):
            if saved or state["epoch"] != epoch:
                save(path, state)
            if state["epoch"] == epoch:
                raise KeyboardInterrupt

        checkpointing.save_checkpoint = save_then_interrupt
        try:
            with pytest.raises(KeyboardInterrupt):
                yield
        finally:
            checkpointing.save_checkpoint = save

    return interrupt


#: The README's main job as docs/cli.md shows its table: ``l0bayes fit`` with every option at its default (seed
#: 0, on the CPU) but the output directory and the progress bar.
README_JOB = "l0bayes fit --out /tmp/cli_run --no-progress"


@pytest.fixture(scope="session")
def l0bayes_command(tmp_path_factory):
    """``run(command)``: an ``l0bayes`` command line, run once per session as ``python -m l0bayes`` on the CPU.

    Each ``/tmp/...`` path of the command is moved into a directory of the run's own, which is also where it
    runs. Returns a namespace: ``returncode``, ``stdout`` (with the moved paths named as in the command),
    ``stderr``, and ``paths``, each ``/tmp/...`` path of the command to where it was moved. The README's main
    job (:data:`README_JOB`, about 10 s of CPU) serves tests/test_docs.py (the table of docs/cli.md) and
    tests/test_cli.py (the entry point, its files, the README's figure) from one run.
    """
    import os
    import shlex
    import subprocess
    import sys
    import types
    from pathlib import Path

    runs = {}

    def run(command):
        if command not in runs:
            words = shlex.split(command)
            assert words[0] == "l0bayes", f"only l0bayes commands are run: {command}"
            directory = tmp_path_factory.mktemp("l0bayes_command")
            paths = {word: str(directory / Path(word).name) for word in words if word.startswith("/tmp/")}
            # on the CPU (the command takes a GPU when it sees one), one thread per process
            env = {**os.environ, "MPLBACKEND": "Agg", "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1"}
            proc = subprocess.run(
                [sys.executable, "-m", "l0bayes", *(paths.get(word, word) for word in words[1:])],
                cwd=directory,
                capture_output=True,
                text=True,
                timeout=900,
                env=env,
            )
            stdout = proc.stdout
            for named, moved in paths.items():
                stdout = stdout.replace(moved, named)
            paths = {named: Path(moved) for named, moved in paths.items()}
            done = types.SimpleNamespace(returncode=proc.returncode, stdout=stdout, stderr=proc.stderr, paths=paths)
            runs[command] = done
        return runs[command]

    return run


@pytest.fixture(scope="session")
def readme_job(l0bayes_command):
    """The README's main job, run once per session (see :func:`l0bayes_command`)."""
    return l0bayes_command(README_JOB)


@pytest.fixture(scope="session")
def diabetes_mean_field():
    """The mean-field fit of the spike-and-slab model to scikit-learn's diabetes data, trained once per session.

    Standardised features and target (float64 arrays ``x``, ``y``), prior inclusion 0.5, a N(0, 1) slab, the noise
    ``sigma`` fixed at the least-squares residual scale, 300 full-batch epochs of SVI (seed 0), as ``l0bayes fit
    --model linear --objective bayes --slab gaussian`` trains it. A namespace: ``model``, ``x``, ``y``, ``sigma``.
    tests/test_analysis.py checks it against the exact posterior on the clear-cut features, tests/test_selection.py
    that the importance check flags it where it departs. Tests only read it.
    """
    import types

    pytest.importorskip("sklearn")
    from sklearn.datasets import load_diabetes

    from l0bayes.inference import train
    from l0bayes.models import SparseLinearRegression
    from l0bayes.selection import ols_noise_scale

    data = load_diabetes()
    x = (data.data - data.data.mean(0)) / data.data.std(0, ddof=1)
    y = (data.target - data.target.mean()) / data.target.std(ddof=1)
    sigma = ols_noise_scale(x, y)
    xt, yt = torch.tensor(x, dtype=torch.float32), torch.tensor(y, dtype=torch.float32)
    torch.manual_seed(0)
    model = SparseLinearRegression(10, noise_scale=sigma, prior_inclusion=0.5, slab="gaussian", prior_scale=1.0)
    train(model, xt, yt, objective="bayes", epochs=300, batch_size=len(y), lr=0.05, seed=0, progress=False)
    return types.SimpleNamespace(model=model, x=x, y=y, sigma=sigma)
