"""Distributions: the hard concrete gate, its stretched-concrete building block and their KL."""

from .hard_concrete import HardConcrete
from .kl import kl_hard_concrete
from .stretched_concrete import StretchedConcrete

__all__ = ["HardConcrete", "StretchedConcrete", "kl_hard_concrete"]
