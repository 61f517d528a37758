r"""A target architecture: the same sizes in every block, reached exactly (Sheared-LLaMA's targeted pruning).

:class:`TargetArchitecture` names the sizes a pruned transformer should have, in the words of a Hugging Face
config: query heads and key-value heads per block, MLP units per block, and blocks. It is what
:func:`~l0bayes.pruning.transformer.fix_architecture` fixes after the fact, and what
``train(..., objective=Constrained(target_architecture=...))`` trains towards: one constraint per block and size
(the expected number of kept key-value groups, and of kept MLP units, under :math:`q`, at most the target) and one
on the expected number of kept blocks; then a final phase that keeps exactly the top-ranked groups, units and
blocks, so that :func:`~l0bayes.pruning.prune` returns a model of the target's sizes in every block.
"""

from dataclasses import dataclass, fields

import torch

#: What a target may name: the config entries of a Llama-family model (and their meaning for any transformer).
KEYS = ("num_attention_heads", "num_key_value_heads", "intermediate_size", "num_hidden_layers")


@dataclass(frozen=True)
class TargetArchitecture:
    """The sizes of a pruned transformer, the same in every kept block; ``None`` keeps the model's own.

    :param num_attention_heads: query heads per block: a multiple of the query heads per key-value group (with
        grouped-query attention the key-value groups are what is pruned).
    :param num_key_value_heads: key-value heads per block (it must agree with ``num_attention_heads`` when both
        are given).
    :param intermediate_size: MLP units per block.
    :param num_hidden_layers: blocks kept (the others are removed whole): needs the block gates of
        ``sparsify_transformer(..., depth=True)``.

    A ``dict`` with these keys is accepted wherever a ``TargetArchitecture`` is.
    """

    num_attention_heads: int | None = None
    num_key_value_heads: int | None = None
    intermediate_size: int | None = None
    num_hidden_layers: int | None = None

    def __post_init__(self):
        for f in fields(self):
            value = getattr(self, f.name)
            if value is None:
                continue
            if not isinstance(value, int) or isinstance(value, bool):
                raise TypeError(f"{f.name} must be a positive int or None, got {value!r}")
            if value <= 0:
                raise ValueError(f"{f.name} must be a positive int or None, got {value!r}")

    @classmethod
    def of(cls, value, name="target_architecture"):
        """``value`` (a ``TargetArchitecture`` or a ``dict`` of :data:`KEYS`) as a ``TargetArchitecture`` naming at
        least one size."""
        if isinstance(value, cls):
            if not value.as_dict():
                raise ValueError(f"{name} names no size: give at least one of {list(KEYS)}")
            return value
        if not isinstance(value, dict):
            raise TypeError(
                f"{name} must be a dict of {list(KEYS)} (or a TargetArchitecture), got {type(value).__name__}"
            )
        unknown = [k for k in value if k not in KEYS]
        if "hidden_size" in unknown:
            raise ValueError(
                f"{name}: hidden_size cannot be pruned (the hidden dimension runs through every block, the embeddings "
                f"and the norms, which have no gates); name {list(KEYS)}"
            )
        if unknown:
            raise ValueError(f"{name}: unknown entries {unknown}; a target architecture names {list(KEYS)}")
        if not value:
            raise ValueError(f"{name} is empty: name at least one of {list(KEYS)}")
        try:
            return cls(**value)
        except (TypeError, ValueError) as err:
            raise type(err)(f"{name}: {err}") from None

    @classmethod
    def share_of_blocks(cls, net, share, num_key_value_heads=None):
        """The target that keeps ``share`` of the blocks' parameters, every block alike, by the MLP width: the
        ``intermediate_size`` whose pruned model (with ``num_key_value_heads`` key-value groups per block, ``None``:
        all of them, and every branch) keeps the number of block parameters nearest ``share`` of the dense blocks'
        (ties: the narrower). Counted as :func:`~l0bayes.pruning.prune` removes them
        (:class:`~l0bayes.pruning.transformer.TransformerSize`), so it holds for any family that
        :func:`~l0bayes.pruning.sparsify_transformer` gates, e.g. half of every block of a Llama::

            gated = sparsify_transformer(model, example_inputs=ids[:1])
            goal = TargetArchitecture.share_of_blocks(gated, 0.5)
            train(SparseModel(gated, loss), ids, ids, objective=Constrained(target_architecture=goal, arrival="each"))

        :param net: a model of :func:`~l0bayes.pruning.sparsify_transformer` with MLP unit gates.
        :param share: the fraction of the blocks' parameters to keep, in ``(0, 1]``.
        :raises ValueError: when no width can keep that share (the attention alone is more) or the blocks have no unit
            gates.
        """
        from ...nn.gates import gate_owners
        from ..counting import count_parameters
        from .size import TransformerSize

        if isinstance(share, bool) or not isinstance(share, (int, float)) or not 0 < share <= 1:
            raise ValueError(f"share must be a number in (0, 1], got {share!r}")
        records = getattr(net, "_l0_transformer", None)
        if records is None:
            raise ValueError("share_of_blocks needs a model of sparsify_transformer")
        blocks = [net.get_submodule(r.name) for r in records]
        units = [getattr(b, "l0_units", None) for b in blocks]
        if any(u is None for u in units):
            raise ValueError("share_of_blocks sets the MLP width: the blocks need MLP unit gates (units=True)")
        widths = {u.gate.num_gates for u in units}
        if len(widths) != 1:
            raise ValueError(f"share_of_blocks: the blocks have different MLP widths {sorted(widths)}")
        size = TransformerSize(net)
        total = count_parameters(net)
        in_blocks = sum(count_parameters(b) for b in blocks)
        heads = {id(getattr(b, "l0_heads", None)) for b in blocks}
        unit_holders = {id(u) for u in units}

        def kept(width):  # the block parameters the pruned model keeps at this MLP width
            values = {}
            for layer, gate in gate_owners(net):
                keep = torch.ones(gate.num_gates, dtype=torch.float64)
                if id(layer) in unit_holders:
                    keep[width:] = 0.0
                elif id(layer) in heads and num_key_value_heads is not None:
                    keep[num_key_value_heads:] = 0.0
                values[id(layer)] = keep
            return size.fraction_at(values, "parameters")[0] * total - (total - in_blocks)

        goal = share * in_blocks
        low, high = 1, widths.pop()
        if kept(low) > goal:
            raise ValueError(
                f"share_of_blocks: one MLP unit per block already keeps {kept(low) / in_blocks:.3f} of the blocks' "
                f"parameters, more than {share}: keep fewer key-value heads (num_key_value_heads)"
            )
        while high - low > 1:  # the widest width that keeps at most the goal, then the nearer of it and the next
            mid = (low + high) // 2
            low, high = (mid, high) if kept(mid) <= goal else (low, mid)
        below, above = kept(low), kept(high)
        width = high if above <= goal or above - goal < goal - below else low
        return cls(num_key_value_heads=num_key_value_heads, intermediate_size=width)

    def as_dict(self):
        """The sizes named, as a ``dict``."""
        return {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) is not None}

    def choices(self, net):
        """What the target asks of the gates of ``net`` (a model of ``sparsify_transformer``): a list of
        :class:`Choice`, one per block and size named (and one over all blocks for ``num_hidden_layers``), and one
        per other gate, which the target leaves open (``k=None``). ``ValueError`` s name the entry a block cannot
        have."""
        out = []
        blocks = []
        for r in net._l0_transformer:
            block = net.get_submodule(r.name)
            groups = self._groups(r)
            out.append(self._choice(block, r.heads_key, groups, "heads", "num_key_value_heads"))
            if r.cross is not None:
                out.append(self._choice(block, r.cross.heads_key, None, "heads", None))
            units = self.intermediate_size
            holder = getattr(block, "l0_units", None)
            if units is not None and holder is not None and units > holder.gate.num_gates:
                raise ValueError(f"intermediate_size={units}: block {r.name} has {holder.gate.num_gates} MLP units")
            out.append(self._choice(block, "l0_units", units, "units", "intermediate_size"))
            for key in [r.branch_key, *([r.cross.branch_key] if r.cross is not None else []), "l0_mlp"]:
                out.append(self._choice(block, key, None, "branch", None))
            blocks.append(getattr(block, "l0_block", None))
        out = [c for c in out if c is not None]
        if self.num_hidden_layers is not None:
            if any(b is None for b in blocks):
                raise ValueError(
                    f"num_hidden_layers={self.num_hidden_layers}: the blocks have no block gates; gate them with "
                    "sparsify_transformer(..., depth=True)"
                )
            if self.num_hidden_layers > len(blocks):
                raise ValueError(
                    f"num_hidden_layers={self.num_hidden_layers}: the model has {len(blocks)} gated blocks"
                )
            out.append(Choice(blocks, self.num_hidden_layers, "blocks"))
        else:
            out += [Choice([b], None, "blocks") for b in blocks if b is not None]
        return out

    def _groups(self, r):
        """The key-value groups block ``r`` keeps (``None``: not named)."""
        per_group = r.num_heads // r.groups
        groups = self.num_key_value_heads
        if self.num_attention_heads is not None:
            heads = self.num_attention_heads
            if heads % per_group or heads > r.num_heads:
                raise ValueError(
                    f"num_attention_heads={heads}: block {r.name} has {r.num_heads} query heads in groups of "
                    f"{per_group} (one per key-value head); give a multiple of {per_group} up to {r.num_heads}"
                )
            if groups is not None and groups * per_group != heads:
                raise ValueError(
                    f"num_attention_heads={heads} and num_key_value_heads={groups} disagree: block {r.name} keeps "
                    f"{per_group} query heads per key-value head"
                )
            groups = heads // per_group
        if groups is not None and groups > r.groups:
            raise ValueError(f"num_key_value_heads={groups}: block {r.name} has {r.groups} key-value heads")
        return groups

    @staticmethod
    def _choice(block, key, k, kind, what):
        holder = getattr(block, key, None)
        if holder is None:
            if k is not None:
                gated = "heads=False" if kind == "heads" else "units=False"
                raise ValueError(f"{what}: the blocks have no {key} gates (gated with {gated})")
            return None
        return Choice([holder], k, kind)


@dataclass
class Choice:
    """Keep exactly ``k`` of the gates of ``holders`` (together), or all of them (``k=None``)."""

    holders: list
    k: int | None
    kind: str  # "heads", "units", "branch", "blocks"

    @property
    def num_gates(self):
        return sum(h.gate.num_gates for h in self.holders)

    def expected(self):
        r"""The expected fraction of the gates kept, :math:`\frac1n \sum_g q(z_g \ne 0)` (differentiable)."""
        return torch.cat([h.gate.prob_nonzero().reshape(-1) for h in self.holders]).sum() / self.num_gates

    def masks(self, scores):
        """``[bool mask per holder]``: the ``k`` best ``scores`` (one tensor per holder), or all."""
        flat = torch.cat([s.reshape(-1) for s in scores])
        keep = torch.ones_like(flat, dtype=torch.bool)
        if self.k is not None:
            keep = torch.zeros_like(flat, dtype=torch.bool)
            keep[torch.topk(flat, self.k).indices] = True
        return list(keep.split([s.numel() for s in scores]))
