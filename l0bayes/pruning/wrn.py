r"""The Wide ResNet of the paper's Section 4.2 with its L0 gates: :func:`~l0bayes.pruning.sparsify` on it."""

import torch

from ..nn.wrn import WideResNet
from .sparsify import sparsify

__all__ = ["l0_wide_resnet"]


def l0_wide_resnet(depth=28, widen_factor=10, num_classes=10, in_channels=3, input_size=32, dropout=0.0, **gate_kwargs):
    r"""A :class:`~l0bayes.nn.WideResNet` with the paper's L0 gates on every block's first convolution.

    One gate per output channel: ``sparsify(WideResNet(...), wrn.first_convolutions(), example_inputs=...)``;
    the gates are ``"group<g>.<b>.conv1.gate"``, applied after each block's second batch norm so that
    :func:`~l0bayes.pruning.prune` removes closed channels exactly. ``gate_kwargs`` go to every gate:
    the paper's WRN starts them at ``init_drop_rate=0.3``, the dropout rate of the dense network (Section 4.2).
    """
    gate_kwargs.setdefault("init_drop_rate", 0.3)
    net = WideResNet(depth, widen_factor, num_classes, in_channels, dropout)
    example = torch.zeros(1, in_channels, input_size, input_size)
    return sparsify(net, net.first_convolutions(), example_inputs=example, inplace=True, **gate_kwargs)
