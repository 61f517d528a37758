"""Saving and loading a pruned network without pickling code: a state dict plus an architecture description.

:func:`~l0bayes.nn.prune.prune` returns a plain ``nn.Sequential`` of ``nn.Linear``, ``nn.Conv2d``,
:class:`~l0bayes.nn.prune.SelectFeatures`, ``nn.Flatten`` and channel-wise layers. :func:`save_pruned`
writes it as a ``dict`` holding only tensors and plain containers:

* ``"layers"``: one ``{"name", "type", "args"}`` per layer, ``type`` a name from :data:`LAYER_TYPES`
  and ``args`` its constructor arguments (numbers, booleans, strings, lists);
* ``"state_dict"``: the tensors (weights, biases, the index buffers of ``SelectFeatures``), with their
  dtype;
* ``"metadata"``: what the caller adds (input shape, scalers, class count, ...), plain values and tensors.

:func:`load_pruned` reads it with ``torch.load(weights_only=True)`` (PyTorch's restricted unpickler,
through :func:`~l0bayes.inference.checkpoint.load_checkpoint`), rebuilds the layers from the
allow-list :data:`LAYER_TYPES` by name, and loads the tensors. No class is looked up from the file, so
a crafted file cannot run code; a layer type outside the list is refused.

Why not ``torch.save(module)``: unpickling a whole module imports and calls whatever the file names
(``weights_only=False``). Why not ``torch.export``'s ``.pt2``: its program format follows the torch
version that wrote it, while a state dict and a list of standard layers load in any torch this
package supports and give back an ordinary, editable ``nn.Sequential``.
"""

import copy

import torch
from torch import nn

from .prune import SelectFeatures

__all__ = [
    "LAYER_TYPES",
    "describe_pruned",
    "build_pruned",
    "fold_batch_norm",
    "for_inference",
    "load_pruned",
    "save_pruned",
]

FORMAT = "l0bayes.pruned"
VERSION = 1

# type name -> (class, constructor arguments read back from the layer's attributes of the same name)
LAYER_TYPES = {
    "Linear": (nn.Linear, ("in_features", "out_features", "bias")),
    "Conv2d": (
        nn.Conv2d,
        ("in_channels", "out_channels", "kernel_size", "stride", "padding", "dilation", "bias", "padding_mode"),
    ),
    "SelectFeatures": (SelectFeatures, ("index", "num_inputs")),
    "Flatten": (nn.Flatten, ("start_dim", "end_dim")),
    "ReLU": (nn.ReLU, ()),
    "ReLU6": (nn.ReLU6, ()),
    "LeakyReLU": (nn.LeakyReLU, ("negative_slope",)),
    "ELU": (nn.ELU, ("alpha",)),
    "GELU": (nn.GELU, ("approximate",)),
    "SiLU": (nn.SiLU, ()),
    "Tanh": (nn.Tanh, ()),
    "Hardtanh": (nn.Hardtanh, ("min_val", "max_val")),
    "Sigmoid": (nn.Sigmoid, ()),
    "Softplus": (nn.Softplus, ("beta", "threshold")),
    "Identity": (nn.Identity, ()),
    "Dropout": (nn.Dropout, ("p",)),
    "Dropout2d": (nn.Dropout2d, ("p",)),
    "MaxPool2d": (nn.MaxPool2d, ("kernel_size", "stride", "padding", "dilation", "ceil_mode")),
    "AvgPool2d": (nn.AvgPool2d, ("kernel_size", "stride", "padding", "ceil_mode", "count_include_pad")),
    "AdaptiveAvgPool2d": (nn.AdaptiveAvgPool2d, ("output_size",)),
    "AdaptiveMaxPool2d": (nn.AdaptiveMaxPool2d, ("output_size",)),
}
_BY_CLASS = {cls: name for name, (cls, _) in LAYER_TYPES.items()}


def _plain(value):
    """Tuples to lists (``weights_only`` keeps both, lists read back the same in every torch version)."""
    return [_plain(v) for v in value] if isinstance(value, (tuple, list)) else value


def _args(name, layer):
    args = {}
    for key in LAYER_TYPES[name][1]:
        if key == "bias":
            args[key] = layer.bias is not None
        elif key == "index":
            args[key] = int(layer.index.numel())  # the values come with the state dict
        else:
            args[key] = _plain(getattr(layer, key))
    return args


def describe_pruned(module):
    """The list of ``{"name", "type", "args"}`` of an ``nn.Sequential`` of allow-listed layers.

    :raises TypeError: naming the first layer whose exact type is not in :data:`LAYER_TYPES` (a subclass
        may change ``forward``, so it is not taken for its base class).
    """
    if not isinstance(module, nn.Sequential):
        raise TypeError(f"module must be an nn.Sequential (the output of prune()), got {type(module).__name__}")
    layers = []
    for name, layer in module.named_children():
        kind = _BY_CLASS.get(type(layer))
        if kind is None or (kind == "Conv2d" and layer.groups != 1):
            raise TypeError(
                f"layer {name!r} ({type(layer).__name__}) cannot be exported; allowed: {', '.join(LAYER_TYPES)}"
            )
        layers.append({"name": name, "type": kind, "args": _args(kind, layer)})
    return layers


def build_pruned(layers, state_dict):
    """An ``nn.Sequential`` (``eval()`` mode) from :func:`describe_pruned`'s list and a state dict.

    Tensors keep the dtype they were saved with. Raises ``ValueError`` for an unknown layer type or
    malformed arguments, and for a state dict that does not fit the layers.
    """
    from collections import OrderedDict

    out = OrderedDict()
    for k, spec in enumerate(layers):
        try:
            name, kind, args = spec["name"], spec["type"], dict(spec["args"])
        except (TypeError, KeyError) as err:
            raise ValueError(f"layer {k} of the description is malformed: {spec!r}") from err
        if kind not in LAYER_TYPES:
            raise ValueError(f"layer {name!r} has type {kind!r}, not one of the allowed {', '.join(LAYER_TYPES)}")
        cls, keys = LAYER_TYPES[kind]
        if set(args) != set(keys):
            raise ValueError(f"layer {name!r} ({kind}) has arguments {sorted(args)}, expected {sorted(keys)}")
        if kind == "SelectFeatures":
            args["index"] = torch.zeros(int(args["index"]), dtype=torch.long)
        args = {key: tuple(v) if isinstance(v, list) else v for key, v in args.items()}
        try:
            if kind in ("Linear", "Conv2d"):
                layer = nn.utils.skip_init(cls, **args)  # the values come from the state dict
            else:
                layer = cls(**args)
        except (TypeError, ValueError, RuntimeError) as err:
            raise ValueError(f"layer {name!r} ({kind}) cannot be built from {spec['args']!r}: {err}") from err
        out[name] = layer
    module = nn.Sequential(out)
    try:
        module.load_state_dict(state_dict, strict=True, assign=True)
    except (RuntimeError, TypeError) as err:
        raise ValueError(f"the state dict does not fit the described layers: {str(err).splitlines()[0]}") from err
    return module.eval()


def save_pruned(module, path, metadata=None):
    """Write a pruned ``nn.Sequential`` and ``metadata`` to ``path`` (atomically; see the module docstring).

    :param module: the output of :func:`~l0bayes.nn.prune.prune` (allow-listed layers only).
    :param path: the file to write; its directory must exist.
    :param dict metadata: tensors and plain values (``dict``, ``list``, ``str``, numbers, ``None``) stored
        beside the network, e.g. the input shape and the scalers of the data.
    """
    from ..inference.checkpoint import save_checkpoint

    state = {
        "format": FORMAT,
        "version": VERSION,
        "layers": describe_pruned(module),
        "state_dict": {k: v.detach().cpu() for k, v in module.state_dict().items()},
        "metadata": dict(metadata or {}),
    }
    save_checkpoint(path, state)


def load_pruned(path, map_location="cpu"):
    """Read a file of :func:`save_pruned` safely: returns ``(module, metadata)``, the module in ``eval()`` mode.

    Loads with ``torch.load(weights_only=True)``; nothing in the file names code to run.

    :raises FileNotFoundError: when ``path`` does not exist.
    :raises ValueError: naming the file when it is corrupt, holds anything but tensors and plain containers
        (a pickle that would run code), is not a pruned-model file, or describes a layer outside
        :data:`LAYER_TYPES`.
    """
    from ..inference.checkpoint import CheckpointError, load_checkpoint

    state = load_checkpoint(path, map_location=map_location, required=("format", "layers", "state_dict"))
    if state["format"] != FORMAT or state.get("version") != VERSION:
        raise CheckpointError(f"{path!r} is not an l0bayes pruned model (format {state['format']!r})")
    try:
        module = build_pruned(state["layers"], state["state_dict"])
    except ValueError as err:
        raise CheckpointError(f"{path!r}: {err}") from None
    return module, state.get("metadata", {})


def _folded(conv, bn):
    r"""A copy of ``conv`` computing ``bn(conv(x))`` of an eval-mode batch norm.

    :math:`\mathrm{BN}(W \star x + b) = (s \odot W) \star x + s \odot (b - \mu) + \beta` with
    :math:`s = \gamma / \sqrt{\sigma^2 + \epsilon}`, per output channel (computed in float64).
    """
    folded = copy.deepcopy(conv)
    with torch.no_grad():
        scale = (bn.running_var.double() + bn.eps).rsqrt()
        if bn.weight is not None:
            scale = scale * bn.weight.double()
        shift = -bn.running_mean.double() * scale
        if bn.bias is not None:
            shift = shift + bn.bias.double()
        if conv.bias is not None:
            shift = shift + conv.bias.double() * scale
        shape = (-1,) + (1,) * (conv.weight.dim() - 1)
        folded.weight = nn.Parameter((conv.weight.double() * scale.view(shape)).to(conv.weight.dtype))
        folded.bias = nn.Parameter(shift.to(conv.weight.dtype))
    return folded


def fold_batch_norm(module):
    r"""An ``eval()``-mode copy of ``module`` with every batch norm that only follows a convolution folded into it.

    Traces ``module`` with ``torch.fx``; where the output of an ``nn.Conv1d/2d/3d`` (called once) goes
    only to a batch norm with running statistics, the pair becomes one convolution with weights
    :math:`s \odot W` and bias :math:`s \odot (b - \mu) + \beta`, :math:`s = \gamma / \sqrt{\sigma^2 +
    \epsilon}`: the same function in ``eval()`` mode, one pass over the activations fewer. In the Wide
    ResNet that is every block's ``bn2`` (after ``conv1``); the pre-activation ``bn1`` follows a residual
    addition and stays. ``module`` is not changed.

    :returns: a ``torch.fx.GraphModule`` in ``eval()`` mode.
    """
    graph_module = torch.fx.symbolic_trace(copy.deepcopy(module).eval())
    modules = dict(graph_module.named_modules())
    calls = {}
    for node in graph_module.graph.nodes:
        if node.op == "call_module":
            calls[node.target] = calls.get(node.target, 0) + 1
    for node in list(graph_module.graph.nodes):
        bn = modules.get(node.target) if node.op == "call_module" else None
        if not isinstance(bn, nn.modules.batchnorm._BatchNorm) or bn.running_mean is None or len(node.args) != 1:
            continue
        source = node.args[0]
        conv = modules.get(source.target) if isinstance(source, torch.fx.Node) and source.op == "call_module" else None
        if (
            not isinstance(conv, (nn.Conv1d, nn.Conv2d, nn.Conv3d))
            or len(source.users) != 1
            or calls[source.target] != 1
        ):
            continue
        graph_module.set_submodule(source.target, _folded(conv, bn))
        node.replace_all_uses_with(source)
        graph_module.graph.erase_node(node)
    graph_module.graph.lint()
    graph_module.delete_all_unused_submodules()
    graph_module.recompile()
    return graph_module.eval()


def for_inference(module, channels_last=True, fold=True):
    """A copy of ``module`` prepared for CPU inference: batch norms folded, tensors in ``channels_last`` order.

    Apply it to a dense network and to its pruned version alike when comparing their speed. Feed
    the result ``x.contiguous(memory_format=torch.channels_last)`` (or any layout; PyTorch converts).

    :param channels_last: store 4-d weights (and so the activations) as NHWC, where oneDNN's
        convolutions are faster than in NCHW, above all for convolutions with few channels, such as a
        pruned network's.
    :param fold: fold batch norms into the convolutions before them (:func:`fold_batch_norm`).
    """
    out = fold_batch_norm(module) if fold else copy.deepcopy(module).eval()
    return out.to(memory_format=torch.channels_last) if channels_last else out
