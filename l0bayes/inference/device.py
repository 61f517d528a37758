"""Which device a run uses (shared by :mod:`~l0bayes.inference.training` and :mod:`~l0bayes.inference.distributed`)."""

import torch

__all__ = ["resolve_device"]

#: Device types that hold no data (``meta``: shapes only) or cannot run a training step.
NOT_FOR_TRAINING = ("meta",)
ACCEPTED = "'auto', 'cpu', 'cuda', 'cuda:N' or a torch.device that can train"


def resolve_device(device="auto"):
    """``"auto"`` picks CUDA when available, else CPU; an unavailable ``"cuda"`` is a ``ValueError``.

    :raises TypeError: naming ``device`` when it is neither a string nor a :class:`torch.device` (e.g. ``5``).
    :raises ValueError: naming ``device`` for a string torch does not read as a device (``"gpu"``), a device that
        cannot train (``"meta"``), or a CUDA device that is not available.
    """
    if device is None or (isinstance(device, str) and device == "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if not isinstance(device, (str, torch.device)):
        raise TypeError(f"device must be {ACCEPTED}, got {type(device).__name__} {device!r}")
    try:
        resolved = torch.device(device)
    except (RuntimeError, ValueError) as err:
        raise ValueError(f"device must be {ACCEPTED}, got {device!r}") from err
    if resolved.type in NOT_FOR_TRAINING:
        raise ValueError(f"device must be {ACCEPTED}, got {device!r}: a {resolved.type} device holds no data")
    if resolved.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device {str(device)!r} was requested but CUDA is not available")
        if resolved.index is not None and resolved.index >= torch.cuda.device_count():
            raise ValueError(
                f"device {str(device)!r} was requested but there are {torch.cuda.device_count()} CUDA devices"
            )
    return resolved
