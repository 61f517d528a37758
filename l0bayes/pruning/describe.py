"""A pruned network as plain data: the allow-list :data:`LAYER_TYPES` and the descriptions of its layers.

:func:`describe_pruned` lists the layers of an ``nn.Sequential``, :func:`describe_modules` every sub-module
of a model of your own class, each as ``{"name", "type", "args"}``: ``type`` a name from :data:`LAYER_TYPES`
and ``args`` its constructor arguments (numbers, booleans, strings, lists), read back from the layer's
attributes. :func:`~l0bayes.pruning.export.save_pruned` writes these lists beside the tensors;
:mod:`~l0bayes.pruning.file_checks` checks them and :mod:`~l0bayes.pruning.build` builds the layers again.
"""

from torch import nn

from .select import SelectFeatures
from .transformer.attention import PrunedMultiheadAttention, PrunedTransformerEncoderLayer, ZeroBranch
from .transformer.projections import is_conv1d

__all__ = ["LAYER_TYPES", "PRUNED_ATTRIBUTES", "TRANSFORMER_TYPES", "describe_modules", "describe_pruned"]

_CONV_ARGS = (
    "in_channels", "out_channels", "kernel_size", "stride", "padding", "dilation", "groups", "bias", "padding_mode",
)  # fmt: skip
_BATCH_NORM_ARGS = ("num_features", "eps", "momentum", "affine", "track_running_stats")
_MAX_POOL_ARGS = ("kernel_size", "stride", "padding", "dilation", "ceil_mode")
_AVG_POOL_ARGS = ("kernel_size", "stride", "padding", "ceil_mode", "count_include_pad")
LAYER_TYPES = {
    "Linear": (nn.Linear, ("in_features", "out_features", "bias")),
    "Conv1d": (nn.Conv1d, _CONV_ARGS),
    "Conv2d": (nn.Conv2d, _CONV_ARGS),
    "Conv3d": (nn.Conv3d, _CONV_ARGS),
    "SelectFeatures": (SelectFeatures, ("index", "num_inputs", "dim")),
    "BatchNorm1d": (nn.BatchNorm1d, _BATCH_NORM_ARGS),
    "BatchNorm2d": (nn.BatchNorm2d, _BATCH_NORM_ARGS),
    "BatchNorm3d": (nn.BatchNorm3d, _BATCH_NORM_ARGS),
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
    "Dropout1d": (nn.Dropout1d, ("p",)),
    "Dropout2d": (nn.Dropout2d, ("p",)),
    "Dropout3d": (nn.Dropout3d, ("p",)),
    "MaxPool1d": (nn.MaxPool1d, _MAX_POOL_ARGS),
    "MaxPool2d": (nn.MaxPool2d, _MAX_POOL_ARGS),
    "MaxPool3d": (nn.MaxPool3d, _MAX_POOL_ARGS),
    "AvgPool1d": (nn.AvgPool1d, _AVG_POOL_ARGS),
    "AvgPool2d": (nn.AvgPool2d, _AVG_POOL_ARGS),
    "AvgPool3d": (nn.AvgPool3d, _AVG_POOL_ARGS),
    "AdaptiveAvgPool1d": (nn.AdaptiveAvgPool1d, ("output_size",)),
    "AdaptiveAvgPool2d": (nn.AdaptiveAvgPool2d, ("output_size",)),
    "AdaptiveAvgPool3d": (nn.AdaptiveAvgPool3d, ("output_size",)),
    "AdaptiveMaxPool1d": (nn.AdaptiveMaxPool1d, ("output_size",)),
    "AdaptiveMaxPool2d": (nn.AdaptiveMaxPool2d, ("output_size",)),
    "AdaptiveMaxPool3d": (nn.AdaptiveMaxPool3d, ("output_size",)),
}
"""The layers a pruned-model file may hold: type name -> ``(class, constructor arguments)``, the arguments read
back from the layer's attributes of the same name. Only these exact classes are described (a subclass may
change ``forward``), and a file naming another type is refused."""
_BY_CLASS = {cls: name for name, (cls, _) in LAYER_TYPES.items()}

PRUNED_ATTRIBUTES = (
    "num_heads", "n_head", "n_heads", "num_attention_heads", "heads", "num_key_value_heads", "all_head_size",
    "split_size", "inner_dim",
)  # fmt: skip
"""The int attributes of a module that pruning a transformer lowers with its heads: the head count, under the names
attention modules give it, the key-value heads, and the widths some attentions split or reshape by. A module of your
own class that has any of them has them described (``args["attributes"]``), and loading sets them."""
TRANSFORMER_TYPES = {
    "ZeroBranch": ("pair", "batch_first", "features"),
    "Conv1D": ("nf", "nx"),
    "PrunedMultiheadAttention": (
        "embed_dim",
        "num_heads",
        "head_dim",
        "kdim",
        "vdim",
        "bias",
        "batch_first",
        "dropout",
    ),
    "PrunedTransformerEncoderLayer": ("feed_forward",),
}
"""The entries that only a pruned transformer holds (in a model of your own class), type name -> arguments: a removed
branch (:class:`~l0bayes.pruning.transformer.ZeroBranch`), Hugging Face's ``Conv1D`` (GPT-2's linear layer, of
the class the fresh model has), its outputs ``nf`` and inputs ``nx``, and what an ``nn.MultiheadAttention`` and an
``nn.TransformerEncoderLayer`` become (:class:`~l0bayes.pruning.transformer.PrunedMultiheadAttention`, its sizes;
:class:`~l0bayes.pruning.transformer.PrunedTransformerEncoderLayer`, whether it keeps its MLP branch), whose layers
are described after them."""


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
        kind = _layer_type(name, layer)
        if kind is None:
            raise TypeError(
                f"layer {name!r} ({type(layer).__name__}) cannot be exported; allowed: {', '.join(LAYER_TYPES)}"
            )
        layers.append({"name": name, "type": kind, "args": _args(kind, layer)})
    return layers


def _layer_type(name, layer):
    """The :data:`LAYER_TYPES` name of ``layer`` (its exact class), or ``None``."""
    return _BY_CLASS.get(type(layer))


def describe_modules(module):
    """The list of ``{"name", "type", "args"}`` of every sub-module of a model of your own class (dotted names).

    ``type`` is a name from :data:`LAYER_TYPES` (with the constructor arguments), ``"Sequential"`` (``args``:
    the names of its children) or ``"module"`` for any other class (``args``: its class name; its code is
    yours, and a fresh instance of your model supplies it when loading). A ``"module"`` with int attributes of
    :data:`PRUNED_ATTRIBUTES` lists them (``args["attributes"]``), an ``nn.ModuleList`` its length
    (``args["length"]``: a pruned transformer may have lost blocks). What pruning a transformer makes has types of
    its own (:data:`TRANSFORMER_TYPES`): ``"ZeroBranch"`` for a removed branch and ``"Conv1D"`` for Hugging
    Face's ``Conv1D``, with their sizes.
    """
    out = []
    for name, layer in module.named_modules():
        if not name:
            continue
        kind = _layer_type(name, layer)
        if kind is not None:
            out.append({"name": name, "type": kind, "args": _args(kind, layer)})
        elif type(layer) is nn.Sequential:
            out.append(
                {"name": name, "type": "Sequential", "args": {"children": [n for n, _ in layer.named_children()]}}
            )
        elif type(layer) is ZeroBranch:
            out.append(
                {
                    "name": name,
                    "type": "ZeroBranch",
                    "args": {k: getattr(layer, k) for k in ("pair", "batch_first", "features")},
                }
            )
        elif type(layer) is PrunedMultiheadAttention:
            args = {k: getattr(layer, k) for k in ("embed_dim", "num_heads", "head_dim", "batch_first", "dropout")}
            args.update(
                kdim=layer.k_proj.in_features, vdim=layer.v_proj.in_features, bias=layer.q_proj.bias is not None
            )
            out.append({"name": name, "type": "PrunedMultiheadAttention", "args": args})
        elif type(layer) is PrunedTransformerEncoderLayer:
            out.append(
                {"name": name, "type": "PrunedTransformerEncoderLayer", "args": {"feed_forward": layer.feed_forward}}
            )
        elif is_conv1d(layer):
            out.append(
                {
                    "name": name,
                    "type": "Conv1D",
                    "args": {"nf": int(layer.weight.shape[1]), "nx": int(layer.weight.shape[0])},
                }
            )
        else:
            args = {"class": type(layer).__qualname__}
            attributes = {key: value for key in PRUNED_ATTRIBUTES if type(value := layer.__dict__.get(key)) is int}
            if attributes:
                args["attributes"] = attributes
            if type(layer) is nn.ModuleList:
                args["length"] = len(layer)
            out.append({"name": name, "type": "module", "args": args})
    return out
