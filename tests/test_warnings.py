"""Warnings of l0bayes name the user's line, whichever route led to them."""

import inspect
import warnings

import pytest
import torch
from torch import nn

from l0bayes._warnings import warn
from l0bayes.inference import Constrained, train
from l0bayes.models import SparseClassifier
from l0bayes.nn import L0MLP
from l0bayes.pruning import sparsify


def _line():
    """The line number of the caller's line."""
    return inspect.currentframe().f_back.f_lineno


def test_the_constrained_warning_names_the_call_of_train():
    torch.manual_seed(0)
    model = SparseClassifier(L0MLP(in_features=4, hidden=(3,), num_classes=2), lam=0.0)
    x, y = torch.randn(16, 4), torch.randint(0, 2, (16,))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        line = _line() + 1
        train(model, x, y, objective=Constrained(target_density=0.05), epochs=1, batch_size=16, progress=False)
    found = [w for w in caught if "before the Lagrangian arrived" in str(w.message)]
    assert len(found) == 1, [str(w.message) for w in caught]
    assert (found[0].filename, found[0].lineno) == (__file__, line)


def test_a_warning_through_torch_no_grad_names_the_direct_call():
    """``keep_masks`` runs under ``torch.no_grad``, whose wrapper is torch's frame, not the user's."""

    class Residual(nn.Module):
        def __init__(self):
            super().__init__()
            self.stem = nn.Conv2d(1, 6, 3, padding=1)
            self.block = nn.Sequential(nn.Conv2d(6, 6, 3, padding=1), nn.BatchNorm2d(6), nn.ReLU())
            self.head = nn.Linear(6, 3)

        def forward(self, x):
            h = torch.relu(self.stem(x))
            return self.head((h + self.block(h)).mean((2, 3)))

    objective = Constrained(target_density=0.6).build(sparsify(Residual(), example_inputs=torch.randn(2, 1, 8, 8)), 10)
    with pytest.warns(UserWarning, match="cannot be met") as caught:
        line = _line() + 1
        objective.keep_masks()
    assert (caught[0].filename, caught[0].lineno) == (__file__, line)


def test_warn_called_from_outside_the_package_names_its_caller():
    with pytest.warns(RuntimeWarning, match="here") as caught:
        line = _line() + 1
        warn("here", RuntimeWarning)
    assert (caught[0].filename, caught[0].lineno, caught[0].category) == (__file__, line, RuntimeWarning)
