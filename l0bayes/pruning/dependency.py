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
  dropped by a :class:`~l0bayes.pruning.SelectFeatures` in front of the smaller linear layer;
* a grouped convolution (``groups > 1``, other than a depthwise one) must keep as many input (and output)
  channels in each of its groups: of the closed channels it reads (or its own closed output channels), as
  many are removed from every group as the group with the fewest has, at most all but one; the others stay,
  with zero weights. A convolution with one output channel per group (``groups == out_channels``, as a
  depthwise one) ties each of its groups of input channels to an output channel, so a closed channel it
  reads is kept (the convolution's bias makes that output channel nonzero).

The network's own output channels stay (the output keeps its shape), closed ones with zero weights; the sizes of
:mod:`~l0bayes.pruning.size` count them as kept, and their gates as no cost.

Padding keeps a closed channel zero in every ``padding_mode`` of a convolution (``"zeros"``, ``"reflect"``,
``"replicate"``, ``"circular"``: each pads a channel with values of that channel only), so the graph is traced
with zero padding, which couples the same channels.

Every removal is checked: the model before and after must agree on random inputs in float64
(to :math:`10^{-9}` relative), or the removal is undone.
"""

import contextlib
import copy
import functools
import re
from collections import Counter
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
    "ReflectionPad1D",  # reflect / replicate padding of a zero channel is zero (F.pad in a model's forward)
    "ReflectionPad2D",
    "ReflectionPad3D",
    "ReplicationPad1D",
    "ReplicationPad2D",
    "ReplicationPad3D",
}
_SUMS = {"Add", "Sub"}
_CONVS = (nn.Conv1d, nn.Conv2d, nn.Conv3d)
#: How many times finding the units coupled to one unit may pass one dependency of the graph: far more than any
#: network needs (a dependency is passed again only with other indices), and reached only by a graph that loops.
_MAX_PASSES = 200


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
        if out and not target.outputs:
            return False  # channels of the network's output: its shape stays
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


@contextlib.contextmanager
def _zero_padded(model):
    """The convolutions of ``model`` with another ``padding_mode`` traced as zero-padded ones, then restored.

    Reflect, replicate and circular padding pad each channel with its own values (a zero channel stays zero),
    so they couple the same channels as zero padding. Traced as they are, they add copies of slices along the
    length to the graph: torch-pruning takes the slices of a 3-d tensor's last dimension for slices of features
    (as in a ``(batch, tokens, features)`` tensor), and the indices of a circular padding's copies go round a loop.
    """
    padded = [(m, m.padding_mode) for m in model.modules() if isinstance(m, _CONVS) and m.padding_mode != "zeros"]
    for m, _ in padded:
        m.padding_mode = "zeros"
    try:
        yield
    finally:
        for m, mode in padded:
            m.padding_mode = mode


class _LoopingGraph(ValueError):
    """The units coupled to a unit are not found: the traced graph passes a dependency without end."""


def _count_passes(graph):
    """Make every dependency of ``graph`` count its passes in ``graph.l0_passes`` (a :class:`~collections.Counter`)
    and raise :class:`_LoopingGraph` beyond :data:`_MAX_PASSES`: torch-pruning finds a group by following the
    dependencies until their indices repeat, which never happens on a loop that moves them."""

    def check(dep, triggered_by, fn):
        graph.l0_passes[id(dep)] += 1
        if graph.l0_passes[id(dep)] > _MAX_PASSES:
            raise _LoopingGraph(f"{dep.source.name} -> {dep.target.name}")
        return triggered_by(fn)

    graph.l0_passes = Counter()
    for node in graph.module2node.values():
        for dep in node.dependencies:
            dep.is_triggered_by = functools.partial(check, dep, dep.is_triggered_by)
    return graph


def _graph(model, example_inputs):
    tp = _tp()
    with torch.enable_grad(), _zero_padded(model):  # the graph is traced through autograd
        return _count_passes(tp.DependencyGraph().build_dependency(model, example_inputs=list(example_inputs)))


def _group(graph, module, unit, idxs):
    pruner = graph.get_pruner_of_module(module)
    fn = pruner.prune_in_channels if unit.kind == "in" else pruner.prune_out_channels
    graph.l0_passes.clear()
    try:
        return graph.get_pruning_group(module, fn, idxs)
    except _LoopingGraph as err:
        raise _LoopingGraph(
            f"the units coupled to the gates of {unit.name!r} cannot be found (to prune or count them): the "
            "dependency graph that torch-pruning traced of the model goes round a loop that moves the channels' "
            f"indices ({err}; an in-place copy into slices of a tensor along a dimension other than its channels, in "
            f"the model's forward, makes one); leave {unit.name!r} ungated (sparsify's exclude=) or write that step "
            "otherwise"
        ) from None


def _grouped(module):
    """Whether ``module`` is a grouped convolution that torch-pruning does not treat as a depthwise one."""
    return (
        isinstance(module, (*_CONVS, nn.ConvTranspose1d, nn.ConvTranspose2d, nn.ConvTranspose3d))
        and module.groups > 1
        and not (module.groups == module.out_channels and module.out_channels > 1)
    )


def _consistent(graph, group, idxs):
    """The root indices of ``idxs`` whose removal leaves each grouped convolution of ``group`` with as many
    channels in every one of its groups (see the module docstring): the first ones of every group."""
    drop = set()
    for item in group:
        conv = item.dep.target.module
        if not _grouped(conv):
            continue
        out = graph.is_out_channel_pruning_fn(item.dep.handler)
        per = (conv.out_channels if out else conv.in_channels) // conv.groups
        by_group = [[] for _ in range(conv.groups)]
        for idx, root in sorted(zip(item.idxs, item.root_idxs, strict=True)):
            by_group[idx // per].append(root)
        keep = min(min(len(b) for b in by_group), per - 1)
        drop.update(root for b in by_group for root in b[keep:])
    return [i for i in idxs if i not in drop]


@torch.no_grad()
def _drop_grouped_inputs(conv, idxs):
    """Remove the input channels ``idxs`` of a grouped convolution, as many from every group (torch-pruning keeps
    the same positions in every group)."""
    per = conv.in_channels // conv.groups
    removed = set(idxs)
    kept = [[j for j in range(per) if g * per + j not in removed] for g in range(conv.groups)]
    if conv.transposed:  # weight (in, out / groups, ...): the input channels are its rows
        rows = [g * per + j for g in range(conv.groups) for j in kept[g]]
        weight = conv.weight[torch.as_tensor(rows, device=conv.weight.device)]
    else:  # weight (out, in / groups, ...): each output channel reads the kept positions of its group
        out_per = conv.out_channels // conv.groups
        index = torch.as_tensor([kept[o // out_per] for o in range(conv.out_channels)], device=conv.weight.device)
        index = index.view(*index.shape, *([1] * (conv.weight.dim() - 2))).expand(-1, -1, *conv.weight.shape[2:])
        weight = conv.weight.gather(1, index)
    conv.weight = nn.Parameter(weight, requires_grad=conv.weight.requires_grad)
    conv.in_channels -= len(removed)


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
        except _LoopingGraph as err:
            raise ValueError(str(err)) from None
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
    while (kept := _consistent(graph, group, idxs)) != idxs:  # (shrinks every time)
        if not kept:
            return None, []
        idxs = kept
        group = _group(graph, modules[unit.root], unit, idxs)
    if not _allowed(graph, group, unit, names):
        return None, []
    shrunk = [
        (names[id(i.dep.target.module)], list(i.idxs))
        for i in group
        if isinstance(i.dep.target.module, nn.Linear) and not graph.is_out_channel_pruning_fn(i.dep.handler)
    ]

    def grouped_input(item):
        return _grouped(item.dep.target.module) and not graph.is_out_channel_pruning_fn(item.dep.handler)

    own = [(item.dep.target.module, list(item.idxs)) for item in group if grouped_input(item)]
    group.items[:] = [item for item in group.items if not grouped_input(item)]
    group.prune()
    for conv, conv_idxs in own:
        _drop_grouped_inputs(conv, conv_idxs)
    return work, shrunk


@torch.no_grad()
def prune_graph(model, example_inputs):
    """The residual-aware :func:`~l0bayes.pruning.prune` of a sparsified ``model`` (see the module docstring)."""
    plain = strip_gates(model).eval()
    example_inputs = on_device_of(plain, example_inputs)
    probe = _probe(example_inputs)
    try:
        reference = _output64(plain, probe)
    except (RuntimeError, TypeError, ValueError, IndexError) as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        shapes = ", ".join(str(tuple(t.shape)) for t in example_inputs)
        raise ValueError(
            f"prune: example_inputs of shape {shapes} do not fit the model ({first}): give a batch of what its "
            "forward takes, or leave example_inputs out to use those given to sparsify"
        ) from err
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
        except _LoopingGraph as err:
            raise ValueError(str(err)) from None
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
