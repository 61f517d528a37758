r"""Which units of a sparsified model can be removed together: pruning any graph, residual connections included.

:func:`~l0bayes.pruning.prune` and :func:`~l0bayes.pruning.expected_flops` handle a model of
:func:`~l0bayes.pruning.sparsify` here. The coupling of channels across layers (a convolution's output
channel is also its batch norm's channel and an input channel of every layer that reads it, through
activations, pooling, flattening, concatenation and residual additions) comes from the dependency
graph of `torch-pruning <https://github.com/VainF/Torch-Pruning>`_ (Fang et al., CVPR 2023), built
by tracing one forward pass of the example inputs.

A gated unit is removed only where that leaves the function unchanged:

* a closed output channel (Eq. 13 gate 0) is exactly zero after the gate; it is removed with
  everything coupled to it when that coupling only reaches the gated modules, zero-preserving
  element-wise operations and the input channels of the layers that read it. Inside a residual
  block this removes the first convolution's channel, its batch norm's channel and the next
  convolution's input channel. A channel that enters a residual addition is not removed (the
  addition's other operand is not zero there); its weights are zero;
* a closed input neuron of a linear layer is removed together with the producing units that feed
  nothing else; where the producer is used elsewhere (or is the network input), the column is
  dropped by a :class:`~l0bayes.pruning.SelectFeatures` in front of the smaller linear layer.

Every removal is checked: the model before and after must agree on random inputs in float64
(to :math:`10^{-9}` relative), or the removal is undone.
"""

import copy
import re
from dataclasses import dataclass, field

import torch
from torch import nn

from .hooks import on_device_of
from .select import SelectFeatures
from .sparsify import GatedLayer, GroupGate, strip_gates

_ZERO_PRESERVING = {
    "Relu",
    "LeakyRelu",
    "Hardtanh",
    "Gelu",
    "Silu",
    "Tanh",
    "Elu",
    "Clone",
    "Mul",
    "Div",
    "Mean",
    "Sum",
    "MaxPool2DWithIndices",  # (a 1-d pooling is the 2-d one between an unsqueeze and a squeeze)
    "MaxPool3DWithIndices",
    "AvgPool2D",
    "AvgPool3D",
    "AdaptiveAvgPool2D",
    "AdaptiveAvgPool3D",
    "AdaptiveMaxPool2D",
    "AdaptiveMaxPool3D",
    "Squeeze",
    "Unsqueeze",
    "T",  # the transpose of a linear layer's weight, reading the zero channel after a flatten
    "NativeDropout",
}
_SUMS = {"Add", "Sub"}


def _tp():
    try:
        import torch_pruning
    except ImportError as err:  # pragma: no cover - a core dependency
        raise ImportError("pruning a sparsified model needs torch-pruning: pip install torch-pruning") from err
    return torch_pruning


@dataclass
class Unit:
    """One set of gates of a sparsified model, seen by the pruner.

    ``kind`` is ``"out"`` (output units, exactly zero when closed: convolution channels, groups) or
    ``"in"`` (input neurons of a linear layer); ``root`` names the module whose units the gates index,
    ``zeroed`` the modules whose closed units are zero or feed only zeroed modules.
    """

    name: str
    layer: nn.Module
    kind: str
    root: str
    zeroed: set = field(default_factory=set)

    def closed(self):
        """Indices of the gates whose Eq. 13 value is 0."""
        with torch.no_grad():
            return (self.layer.gate.deterministic() == 0).nonzero().flatten().tolist()


def units(model):
    """The :class:`Unit` s of a sparsified ``model``: output-channel gates first, then linear inputs."""
    names = {id(m): n for n, m in model.named_modules()}
    out, inputs = [], []
    for name, m in model.named_modules():
        if isinstance(m, GatedLayer) and m.gates_inputs:
            inputs.append(Unit(name, m, "in", name, {name}))
        elif isinstance(m, GatedLayer):
            zeroed = {name} | ({names[id(m.gated_batch_norm)]} if m.gated_batch_norm is not None else set())
            out.append(Unit(name, m, "out", name, zeroed))
        elif isinstance(m, GroupGate):
            out.append(Unit(name, m, "out", m.module_names[0], set(m.module_names)))
    return out + inputs


def _grad_fn_name(node):
    name = type(node.grad_fn).__name__ if node.grad_fn is not None else ""
    return re.sub(r"Backward\d*$", "", name)


def _allowed(graph, group, unit, names):
    """Whether removing ``group`` for ``unit`` only touches what the rules of the module docstring allow."""
    tp = _tp()
    kinds = tp.ops.OPTYPE
    for item in group:
        target = item.dep.target
        name = names.get(id(target.module))
        out = graph.is_out_channel_pruning_fn(item.dep.handler)
        if name in unit.zeroed and (out or unit.kind == "in"):
            continue
        if target.type in (kinds.RESHAPE, kinds.CONCAT, kinds.SPLIT, kinds.SLICE):
            continue
        if target.type == kinds.ELEMENTWISE:
            op = _grad_fn_name(target)
            if unit.kind == "in" or op in _ZERO_PRESERVING or (op in _SUMS and len(unit.zeroed) > 1):
                continue
            return False
        weight_layer = target.type in (kinds.CONV, kinds.LINEAR, kinds.DEPTHWISE_CONV)
        if unit.kind == "out" and weight_layer and not out:
            continue  # a layer reading the zero channel
        if unit.kind == "in" and (weight_layer or target.type == kinds.BN) and out:
            continue  # a producer of units nobody else reads
        return False
    return True


def _graph(model, example_inputs):
    tp = _tp()
    with torch.enable_grad():  # the graph is traced through autograd
        return tp.DependencyGraph().build_dependency(model, example_inputs=list(example_inputs))


def _group(graph, module, unit, idxs):
    pruner = graph.get_pruner_of_module(module)
    fn = pruner.prune_in_channels if unit.kind == "in" else pruner.prune_out_channels
    return graph.get_pruning_group(module, fn, idxs)


@torch.no_grad()
def _probe(example_inputs, seed=0):
    generator = torch.Generator().manual_seed(seed)
    out = []
    for t in example_inputs:
        if t.is_floating_point():
            shape = (4, *t.shape[1:])
            out.append(torch.randn(shape, generator=generator, dtype=torch.float64).to(t.device))
        else:
            out.append(t.repeat(4, *([1] * (t.dim() - 1))))
    return tuple(out)


@torch.no_grad()
def _output64(model, probe):
    model64 = copy.deepcopy(model).double().eval()
    out = model64(*probe)
    return out if torch.is_tensor(out) else torch.cat([o.flatten() for o in out])


def _same(model, reference, probe):
    try:
        out = _output64(model, probe)
    except RuntimeError:  # shapes no longer match: the removal was not valid
        return False
    scale = float(reference.abs().max()) + 1.0
    return out.shape == reference.shape and float((out - reference).abs().max()) <= 1e-9 * scale


def structure(model, example_inputs):
    """``[(unit, group or None)]``: each unit with the torch-pruning group of *all* its units when allowed.

    Computed on a gate-free copy (:func:`~l0bayes.pruning.strip_gates`); the groups' modules are named as in
    ``model``. ``None`` where the rules of the module docstring forbid removing the units.
    """
    plain = strip_gates(model).eval()
    graph = _graph(plain, on_device_of(plain, example_inputs))
    modules = dict(plain.named_modules())
    names = {id(m): n for n, m in modules.items()}
    out = []
    for unit in units(model):
        root = modules[unit.root]
        if unit.kind == "in":
            num = root.in_features
        else:
            num = unit.layer.num_gates
        try:
            group = _group(graph, root, unit, list(range(num)))
        except (ValueError, KeyError, NotImplementedError):
            out.append((unit, None))
            continue
        items = [(names.get(id(i.dep.target.module)), i) for i in group]
        out.append((unit, items if _allowed(graph, group, unit, names) else None))
    return out


class _InputTracker:
    """Original input-column indices still present in each linear layer, as removals shrink them."""

    def __init__(self, model):
        self.kept = {n: torch.arange(m.in_features) for n, m in model.named_modules() if isinstance(m, nn.Linear)}

    def positions(self, name, original):
        kept = self.kept[name]
        mask = torch.isin(kept, torch.as_tensor(original, dtype=torch.long))
        return mask.nonzero().flatten().tolist()

    def remove(self, name, positions):
        if name not in self.kept:  # a linear layer already replaced by SelectFeatures -> Linear
            return
        keep = torch.ones(self.kept[name].numel(), dtype=torch.bool)
        keep[torch.as_tensor(positions, dtype=torch.long)] = False
        self.kept[name] = self.kept[name][keep]


def _select_columns(plain, name, positions):
    """Replace linear ``name`` by ``SelectFeatures(kept) -> smaller Linear`` (the dropped columns are zero)."""
    parent_name, _, child = name.rpartition(".")
    parent = plain.get_submodule(parent_name) if parent_name else plain
    linear = getattr(parent, child)
    keep = torch.ones(linear.in_features, dtype=torch.bool)
    keep[torch.as_tensor(positions, dtype=torch.long)] = False
    index = keep.nonzero().flatten()
    new = nn.Linear(index.numel(), linear.out_features, bias=linear.bias is not None)
    new = new.to(device=linear.weight.device, dtype=linear.weight.dtype)
    with torch.no_grad():
        new.weight.copy_(linear.weight[:, index])
        if linear.bias is not None:
            new.bias.copy_(linear.bias)
    setattr(
        parent, child, nn.Sequential(SelectFeatures(index.to(linear.weight.device), linear.in_features, dim=-1), new)
    )


def _removal(plain, unit, idxs, example_inputs):
    """A copy of ``plain`` with ``idxs`` of ``unit`` removed, or ``None`` when the rules forbid it."""
    work = copy.deepcopy(plain)
    graph = _graph(work, example_inputs)
    modules = dict(work.named_modules())
    names = {id(m): n for n, m in modules.items()}
    group = _group(graph, modules[unit.root], unit, idxs)
    if not _allowed(graph, group, unit, names):
        return None, []
    shrunk = [
        (names[id(i.dep.target.module)], list(i.idxs))
        for i in group
        if isinstance(i.dep.target.module, nn.Linear) and not graph.is_out_channel_pruning_fn(i.dep.handler)
    ]
    group.prune()
    return work, shrunk


@torch.no_grad()
def prune_graph(model, example_inputs):
    """The residual-aware :func:`~l0bayes.pruning.prune` of a sparsified ``model`` (see the module docstring)."""
    plain = strip_gates(model).eval()
    example_inputs = on_device_of(plain, example_inputs)
    probe = _probe(example_inputs)
    reference = _output64(plain, probe)
    tracker = _InputTracker(plain)
    for unit in units(model):
        closed = unit.closed()
        if unit.kind == "out" and len(closed) == unit.layer.num_gates:
            closed = closed[1:]  # keep one channel: zero-width layers do not run
        if unit.kind == "in":
            closed = tracker.positions(unit.root, closed)
        if not closed:
            continue
        try:
            work, shrunk = _removal(plain, unit, closed, example_inputs)
        except (ValueError, KeyError, IndexError, RuntimeError, NotImplementedError):
            work, shrunk = None, []
        if work is not None and _same(work, reference, probe):
            plain = work
            for name, positions in shrunk:
                tracker.remove(name, positions)
        elif unit.kind == "in":
            _select_columns(plain, unit.root, closed)
            tracker.remove(unit.root, closed)
    if not _same(plain, reference, probe):  # pragma: no cover - every step was checked
        raise RuntimeError("the pruned model differs from the gated one; please report this as a bug")
    return plain.eval()
