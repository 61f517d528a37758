"""Fixtures shared by several test modules."""

import pytest
import torch

#: Whether this machine has a CUDA device. Tests of numeric results run on it too when it does.
CUDA = torch.cuda.is_available()

#: The CUDA variant of a test: marked ``gpu`` (the default run, ``-m 'not slow and not gpu'``, deselects
#: it, so a CPU-only machine neither runs nor lists it) and skipped where CUDA is missing.
CUDA_PARAM = pytest.param("cuda", marks=(pytest.mark.gpu, pytest.mark.skipif(not CUDA, reason="needs CUDA")), id="cuda")
DEVICES = ("cpu", CUDA_PARAM)


def pytest_configure(config):
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
