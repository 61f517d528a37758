r"""The Wide ResNet WRN-d-k of the paper's Section 4.2, dense, with the paper's gate placement named.

Zagoruyko and Komodakis' pre-activation WRN: a 3x3 stem convolution with 16 channels, then three
groups of :math:`n = (d - 4) / 6` residual blocks of widths :math:`16k, 32k, 64k` (the second and
third start with stride 2), batch norm, ReLU, global average pooling and a linear classifier. A block is

.. math::
    o = \mathrm{ReLU}(\mathrm{BN}_1(x)),\quad
    y = W_2 \star \mathrm{dropout}(\mathrm{ReLU}(\mathrm{BN}_2(W_1 \star o))),\quad
    \text{out} = y + (x \text{ or } W_s \star o),

with a 1x1 shortcut convolution :math:`W_s` where the width or stride changes. The paper puts the
L0 gates on the first convolution :math:`W_1` of every block (one gate per output channel);
:func:`~l0bayes.pruning.l0_wide_resnet` does that through :func:`~l0bayes.pruning.sparsify`, with the gates
applied after :math:`\mathrm{BN}_2` so that closed channels are removed exactly by :func:`~l0bayes.pruning.prune`.
"""

import torch.nn.functional as F
from torch import nn


class WideResNetBlock(nn.Module):
    """One pre-activation residual block: ``bn1, conv1 (3x3, stride), bn2, dropout, conv2 (3x3)``, shortcut."""

    def __init__(self, in_channels, out_channels, stride=1, dropout=0.0):
        super().__init__()
        self.bn1 = nn.BatchNorm2d(in_channels)
        self.conv1 = nn.Conv2d(in_channels, out_channels, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(out_channels)
        self.dropout = nn.Dropout(dropout)
        self.conv2 = nn.Conv2d(out_channels, out_channels, 3, padding=1, bias=False)
        self.shortcut = None
        if in_channels != out_channels or stride != 1:
            self.shortcut = nn.Conv2d(in_channels, out_channels, 1, stride=stride, bias=False)

    def forward(self, x):
        o = F.relu(self.bn1(x))
        y = self.conv2(self.dropout(F.relu(self.bn2(self.conv1(o)))))
        return y + (x if self.shortcut is None else self.shortcut(o))


class WideResNet(nn.Module):
    """WRN-``depth``-``widen_factor`` (dense), e.g. ``WideResNet(28, 10)`` or ``WideResNet(16, 4)``.

    Modules: ``stem``, ``group1`` - ``group3`` (``nn.Sequential`` of :class:`WideResNetBlock`),
    ``bn``, ``fc``. Convolutions have He-normal weights (fan out), batch norms weight 1 and bias 0.

    :param depth: :math:`d`, with :math:`(d - 4)` divisible by 6.
    :param dropout: the dropout rate inside the blocks (the paper's dense baseline uses 0.3).
    """

    def __init__(self, depth=28, widen_factor=10, num_classes=10, in_channels=3, dropout=0.0):
        super().__init__()
        if depth < 10 or (depth - 4) % 6:
            raise ValueError(f"depth must be 6n + 4 with n >= 1, got {depth}")
        if widen_factor < 1:
            raise ValueError(f"widen_factor must be positive, got {widen_factor}")
        n = (depth - 4) // 6
        widths = (16, 16 * widen_factor, 32 * widen_factor, 64 * widen_factor)
        self.depth, self.widen_factor, self.num_classes = int(depth), int(widen_factor), int(num_classes)
        self.stem = nn.Conv2d(in_channels, widths[0], 3, padding=1, bias=False)
        for g in range(3):
            blocks = [
                WideResNetBlock(
                    widths[g] if b == 0 else widths[g + 1], widths[g + 1], (1, 2, 2)[g] if b == 0 else 1, dropout
                )
                for b in range(n)
            ]
            self.add_module(f"group{g + 1}", nn.Sequential(*blocks))
        self.bn = nn.BatchNorm2d(widths[3])
        self.fc = nn.Linear(widths[3], num_classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)
        nn.init.zeros_(self.fc.bias)

    def forward(self, x):
        x = self.group3(self.group2(self.group1(self.stem(x))))
        x = F.adaptive_avg_pool2d(F.relu(self.bn(x)), 1)
        return self.fc(x.flatten(1))

    def first_convolutions(self):
        """Names of the first convolution of every residual block: where the paper puts the gates."""
        return [
            name for name, m in self.named_modules() if isinstance(m, WideResNetBlock) for name in [f"{name}.conv1"]
        ]
