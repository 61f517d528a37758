"""A small pre-activation residual CNN with batch norm, as a user would write it (shared by the pruning tests)."""

import torch.nn.functional as F
from torch import nn


class Block(nn.Module):
    """Pre-activation residual block, as a user would write it."""

    def __init__(self, c_in, c_out, stride=1):
        super().__init__()
        self.bn1 = nn.BatchNorm2d(c_in)
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(c_out)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, 1, 1, bias=False)
        self.shortcut = nn.Conv2d(c_in, c_out, 1, stride, bias=False) if stride != 1 or c_in != c_out else None

    def forward(self, x):
        o = F.relu(self.bn1(x))
        y = self.conv2(F.relu(self.bn2(self.conv1(o))))
        return y + (x if self.shortcut is None else self.shortcut(o))


class ResNet(nn.Module):
    def __init__(self, width=6, hidden=12, classes=3):
        super().__init__()
        self.stem = nn.Conv2d(1, width, 3, padding=1)
        self.block1 = Block(width, width)
        self.block2 = Block(width, 2 * width, stride=2)
        self.bn = nn.BatchNorm2d(2 * width)
        self.fc1 = nn.Linear(2 * width * 4, hidden)
        self.fc2 = nn.Linear(hidden, classes)

    def forward(self, x):
        x = self.block2(self.block1(self.stem(x)))
        x = F.adaptive_avg_pool2d(F.relu(self.bn(x)), 2).flatten(1)
        return self.fc2(F.relu(self.fc1(x)))
