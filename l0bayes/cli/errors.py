"""The command line's user errors and its process rank."""

import os


class CLIError(Exception):
    """A user error: printed as one line ``l0bayes: error: ...``, exit status ``code``."""

    def __init__(self, message, code=2):
        super().__init__(message)
        self.code = code


def is_main_process():
    """Rank 0 (or no ``torchrun``): the only process that prints and writes files."""
    return int(os.environ.get("RANK", "0")) == 0
