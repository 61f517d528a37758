"""Warnings that name the user's line: the first frame outside l0bayes and the libraries it calls through.

A fixed ``stacklevel`` counts the frames between ``warnings.warn`` and the user's call, which changes with
every refactoring and with the route taken (``train()`` or a direct call, a ``torch.no_grad`` wrapper or
not). :func:`warn` walks the stack instead, past l0bayes, torch and Pyro, to the first frame of the
caller's code.
"""

import os
import sys
import warnings

__all__ = ["warn"]

_PACKAGE = os.path.dirname(os.path.abspath(__file__)) + os.sep
# Libraries whose frames sit between l0bayes' code and the user's (torch.no_grad wrappers, Module.__call__,
# Pyro's messengers): the user wrote none of their lines.
_THROUGH = ("torch", "pyro")


def _internal():
    prefixes = [_PACKAGE]
    for name in _THROUGH:
        path = getattr(sys.modules.get(name), "__file__", None)
        if path:
            prefixes.append(os.path.dirname(os.path.abspath(path)) + os.sep)
    return tuple(prefixes)


def _import_machinery(filename):
    """The frames that :func:`warnings.warn` itself skips when it counts ``stacklevel``."""
    return "importlib" in filename and "_bootstrap" in filename


def warn(message, category=UserWarning):
    """:func:`warnings.warn` with the warning attributed to the first caller outside l0bayes (and torch, Pyro)."""
    internal = _internal()
    frame = sys._getframe(1)  # the function of l0bayes that warns
    level = 2  # warnings.warn(stacklevel=2) names that function's line; each frame further out adds one
    while frame.f_back is not None and frame.f_code.co_filename.startswith(internal):
        frame = frame.f_back
        if not _import_machinery(frame.f_code.co_filename):
            level += 1
    warnings.warn(message, category, stacklevel=level)
