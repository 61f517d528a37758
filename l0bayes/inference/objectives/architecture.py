"""The constraints of a target architecture on a transformer's gates: its blocks' heads and units, their number."""

import torch

from ...nn.density import density_names

__all__ = ["ArchitectureConstraints"]


class ArchitectureConstraints:
    """The constraints of a target architecture on the gates of a model of ``sparsify_transformer``.

    One constraint per :class:`~l0bayes.pruning.transformer.target.Choice` with a count (a block's key-value groups,
    a block's MLP units, all the blocks): the expected fraction of its gates kept, at most ``k / n``. The gates of
    the other choices (sizes the target does not name, residual branches) are held open, at ``open_log_alpha``.
    """

    def __init__(self, model, target, layers, open_log_alpha):
        from ...pruning.transformer import TargetArchitecture, is_transformer_gated

        net = getattr(model, "net", model)
        if not is_transformer_gated(net):
            raise ValueError(
                "target_architecture needs a model of sparsify_transformer() (or a SparseModel holding one)"
            )
        self.target = TargetArchitecture.of(target)
        try:
            self.choices = self.target.choices(net)
        except ValueError as err:
            raise ValueError(f"target_architecture: {err}") from None
        covered = {id(h) for c in self.choices for h in c.holders}
        outside = [i for i, layer in enumerate(layers) if id(layer) not in covered]
        if outside:
            names = [density_names(model)[i] for i in outside]
            raise ValueError(f"target_architecture: gated layers {names} are outside the transformer's blocks")
        self.constrained = [c for c in self.choices if c.k is not None]
        self.targets = [c.k / c.num_gates for c in self.constrained]
        self.index = {id(layer): i for i, layer in enumerate(layers)}
        self.open_log_alpha = open_log_alpha
        self.hold_open()

    def expected(self):
        return torch.stack([c.expected() for c in self.constrained])

    def keep_masks(self, scores):
        masks = [None] * len(self.index)
        for c in self.choices:
            picks = c.masks([scores[self.index[id(h)]] for h in c.holders])
            for holder, keep in zip(c.holders, picks, strict=True):
                masks[self.index[id(holder)]] = keep.cpu()
        return masks

    @torch.no_grad()
    def hold_open(self):
        for c in self.choices:
            if c.k is None:
                for holder in c.holders:
                    holder.gate.log_alpha.fill_(self.open_log_alpha)
