"""The former home of pruning and its counts, now in :mod:`l0bayes.pruning`: these names still import from here."""

from ..pruning.counting import count_parameters, flops
from ..pruning.prune import prune
from ..pruning.report import PruneReport
from ..pruning.select import SelectFeatures
from ..pruning.size import expected_flops
from .density import architecture

__all__ = ["PruneReport", "SelectFeatures", "architecture", "count_parameters", "expected_flops", "flops", "prune"]
