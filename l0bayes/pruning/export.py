"""Saving and loading a pruned network without pickling code: a state dict plus a description of its layers.

:func:`~l0bayes.pruning.prune.prune` returns either a plain ``nn.Sequential`` (a network of L0 layers such as
:class:`~l0bayes.nn.L0MLP`) or, for a model of :func:`~l0bayes.pruning.sparsify`, the model's own class with
smaller layers (and a ``nn.Sequential(SelectFeatures, nn.Linear)`` where a linear layer's closed inputs
stay in use elsewhere). :func:`save_pruned` writes either as a ``dict`` holding only tensors and plain
containers:

* ``"layers"`` (an ``nn.Sequential``): one ``{"name", "type", "args"}`` per layer, ``type`` a name from
  :data:`LAYER_TYPES` and ``args`` its constructor arguments (numbers, booleans, strings, lists);
* ``"modules"`` (a model of your own class, named in ``"model_class"``): the same for every sub-module
  by its dotted name, where ``type`` is a name from :data:`LAYER_TYPES`, ``"Sequential"`` (with its
  children's names) or ``"module"`` (a module of your own code, with its class name): the layers that
  pruning resizes are all in :data:`LAYER_TYPES`, your own modules keep their code;
* ``"state_dict"``: the tensors (weights, biases, batch-norm statistics, the index buffers of
  ``SelectFeatures``), with their dtype;
* ``"metadata"``: what the caller adds (input shape, scalers, class count, ...), plain values and tensors.

:func:`load_pruned` reads it with ``torch.load(weights_only=True)`` (PyTorch's restricted unpickler,
through :func:`~l0bayes.io.load_checkpoint`) and rebuilds the layers from the
allow-list :data:`LAYER_TYPES` by name: an ``nn.Sequential`` by itself, a model of your own class inside
a fresh instance that you pass (``model=``), whose layers are replaced by ones of the saved sizes before
the tensors are loaded. No class is looked up from the file, so a crafted file cannot run code; a layer
type outside the list is refused.

Why not ``torch.save(module)``: unpickling a whole module imports and calls whatever the file names
(``weights_only=False``). Why not only ``torch.export``'s ``.pt2`` (which also works on a pruned model):
its program format follows the torch version that wrote it and gives back a graph, while a state dict
and a list of standard layers load in any torch this package supports and give back an ordinary,
editable module of your class.
"""

import copy
import math
import os
import re
import warnings
from collections import OrderedDict

import torch
from torch import nn

from ..io import CheckpointError, CheckpointTypeError, load_checkpoint, save_checkpoint
from .select import SelectFeatures

__all__ = [
    "INT_LIMIT",
    "LAYER_TYPES",
    "build_into",
    "build_pruned",
    "describe_modules",
    "describe_pruned",
    "fold_batch_norm",
    "for_inference",
    "load_pruned",
    "save_pruned",
]

FORMAT = "l0bayes.pruned"
VERSION = 1  # an nn.Sequential ("layers")
MODULES_VERSION = 2  # a model of the caller's class ("modules", "model_class")

# type name -> (class, constructor arguments read back from the layer's attributes of the same name)
_CONV_ARGS = ("in_channels", "out_channels", "kernel_size", "stride", "padding", "dilation", "bias", "padding_mode")
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
_BY_CLASS = {cls: name for name, (cls, _) in LAYER_TYPES.items()}
# Arguments that files of earlier versions lack, with the value they meant.
_OPTIONAL_ARGS = {"SelectFeatures": {"dim": 1}}


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
    """The :data:`LAYER_TYPES` name of ``layer`` (its exact class), or ``None``; a grouped convolution is refused."""
    kind = _BY_CLASS.get(type(layer))
    if kind is not None and kind.startswith("Conv") and layer.groups != 1:
        raise TypeError(f"layer {name!r} is a grouped convolution (groups={layer.groups}), which cannot be exported")
    return kind


def describe_modules(module):
    """The list of ``{"name", "type", "args"}`` of every sub-module of a model of your own class (dotted names).

    ``type`` is a name from :data:`LAYER_TYPES` (with the constructor arguments), ``"Sequential"`` (``args``:
    the names of its children) or ``"module"`` for any other class (``args``: its class name; its code is
    yours, and a fresh instance of your model supplies it when loading).
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
        else:
            out.append({"name": name, "type": "module", "args": {"class": type(layer).__qualname__}})
    return out


#: The largest value of an integer argument that no tensor of the file sizes (a stride, a dilation, a pooling
#: window, the width that ``SelectFeatures`` selects from): what torch's kernels take as a 32-bit int.
INT_LIMIT = 2**31 - 1
#: The dimensions that ``Flatten`` and ``SelectFeatures`` may name.
_DIMS = (-64, 63)
_PADDING_MODES = ("zeros", "reflect", "replicate", "circular")
_FLOAT_KEYS = ("weight", "bias", "running_mean", "running_var")


def _short(value, limit=60):
    """``repr(value)``, cut to ``limit`` characters (a crafted file may hold a huge list)."""
    if isinstance(value, (list, tuple, dict, str, bytes)) and len(value) > limit:
        return f"a {type(value).__name__} of {len(value)} items"
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _int(where, key, value, low, high=None):
    if type(value) is not int:
        raise TypeError(f"{where}: {key} must be an int, got {_short(value)}")
    if value < low or (high is not None and value > high):
        bound = f"at least {low}" if high is None else f"in [{low}, {high}]"
        raise ValueError(f"{where}: {key} = {_short(value)} must be {bound}")
    return value


def _ints(where, key, value, low, high=None, n=2):
    """An int or a list (tuple) of ``n`` ints, as a tuple of ``n`` ints."""
    if isinstance(value, (list, tuple)):
        if len(value) != n:
            raise ValueError(f"{where}: {key} must be an int or {n} ints, got {_short(value)}")
        return tuple(_int(where, f"{key}[{i}]", v, low, high) for i, v in enumerate(value))
    return (_int(where, key, value, low, high),) * n


def _float(where, key, value, low=None, high=None, low_open=False):
    if type(value) not in (int, float):
        raise TypeError(f"{where}: {key} must be a number, got {_short(value)}")
    below = low is not None and (value <= low if low_open else value < low)
    if not math.isfinite(value) or below or (high is not None and value > high):
        if high is not None:
            bound = f" in [{low}, {high}]"
        else:
            bound = "" if low is None else f" {'>' if low_open else '>='} {low}"
        raise ValueError(f"{where}: {key} = {value} must be a finite number{bound}")
    return value


def _bool(where, key, value):
    if type(value) is not bool:
        raise TypeError(f"{where}: {key} must be True or False, got {_short(value)}")
    return value


def _choice(where, key, value, choices):
    if not isinstance(value, str):
        raise TypeError(f"{where}: {key} must be a str, one of {list(choices)}, got {_short(value)}")
    if value not in choices:
        raise ValueError(f"{where}: {key} must be one of {list(choices)}, got {_short(value)}")
    return value


def _match_tensors(where, tensors, expected):
    """Check ``tensors`` (a layer's, by attribute) against ``expected`` (attribute -> shape); sizes are bounded by
    the tensors: a size read from the arguments must equal the shape of the tensor it describes."""
    missing = [key for key in expected if key not in tensors]
    if missing:
        raise ValueError(f"{where}: the state dict lacks its {', '.join(missing)}")
    extra = [key for key in tensors if key not in expected]
    if extra:
        raise ValueError(f"{where}: the state dict holds {', '.join(map(repr, extra))}, which it does not have")
    for key, shape in expected.items():
        tensor = tensors[key]
        if tuple(tensor.shape) != shape:
            raise ValueError(
                f"the state dict does not fit {where}: its {key} has shape {list(tensor.shape)}, but the arguments "
                f"ask for {list(shape)} (every size must agree with the file's tensors)"
            )
        if key in _FLOAT_KEYS and not tensor.is_floating_point():
            raise TypeError(f"{where}: its {key} has dtype {tensor.dtype}, not a floating-point dtype")
        if key not in _FLOAT_KEYS and tensor.dtype != torch.long:
            raise TypeError(f"{where}: its {key} has dtype {tensor.dtype}, not torch.int64")
    dtypes = {str(tensors[key].dtype) for key in expected if key in _FLOAT_KEYS}
    if len(dtypes) > 1:
        raise TypeError(f"{where}: its tensors have different dtypes ({', '.join(sorted(dtypes))})")


def _spatial(kind):
    """The spatial dimensions of a convolution, pooling or batch norm type: 1 for ``Conv1d``, 3 for ``MaxPool3d``."""
    return int(kind[-2])


def _conv_kwargs(where, kind, args, tensors):
    n = _spatial(kind)
    in_channels = _int(where, "in_channels", args["in_channels"], 1)
    out_channels = _int(where, "out_channels", args["out_channels"], 1)
    kernel = _ints(where, "kernel_size", args["kernel_size"], 1, n=n)
    stride = _ints(where, "stride", args["stride"], 1, INT_LIMIT, n=n)
    dilation = _ints(where, "dilation", args["dilation"], 1, INT_LIMIT, n=n)
    padding = args["padding"]
    if isinstance(padding, str):
        _choice(where, "padding", padding, ("same", "valid"))
    else:
        padding = _ints(where, "padding", padding, 0, n=n)
        for p, k, d in zip(padding, kernel, dilation, strict=True):
            if p > d * (k - 1):  # beyond the kernel's reach an output position sees only padding
                raise ValueError(
                    f"{where}: padding {list(padding)} must be at most dilation * (kernel_size - 1) = {d * (k - 1)}"
                )
    bias = _bool(where, "bias", args["bias"])
    expected = {"weight": (out_channels, in_channels, *kernel)} | ({"bias": (out_channels,)} if bias else {})
    _match_tensors(where, tensors, expected)
    padding_mode = _choice(where, "padding_mode", args["padding_mode"], _PADDING_MODES)
    return {
        "in_channels": in_channels,
        "out_channels": out_channels,
        "kernel_size": kernel,
        "stride": stride,
        "padding": padding,
        "dilation": dilation,
        "bias": bias,
        "padding_mode": padding_mode,
    }


def _pool_kwargs(where, kind, args):
    n = _spatial(kind)
    kernel = _ints(where, "kernel_size", args["kernel_size"], 1, INT_LIMIT, n=n)
    _ints(where, "stride", args["stride"], 1, INT_LIMIT, n=n)
    _bool(where, "ceil_mode", args["ceil_mode"])
    if kind.startswith("MaxPool"):
        dilation = _ints(where, "dilation", args["dilation"], 1, INT_LIMIT, n=n)
        reach = [(k - 1) * d + 1 for k, d in zip(kernel, dilation, strict=True)]
    else:
        _bool(where, "count_include_pad", args["count_include_pad"])
        reach = list(kernel)
    padding = _ints(where, "padding", args["padding"], 0, INT_LIMIT, n=n)
    if any(2 * p > r for p, r in zip(padding, reach, strict=True)):
        raise ValueError(f"{where}: padding {list(padding)} must be at most half the window {reach}")
    return {key: _given(args[key]) for key in LAYER_TYPES[kind][1]}


def _given(value):
    """An int as it is, a list as a tuple (as the layer was built)."""
    return tuple(value) if isinstance(value, list) else value


def _adaptive_kwargs(where, kind, args, largest):
    n = _spatial(kind)
    size = args["output_size"]
    sides = list(size) if isinstance(size, (list, tuple)) else [size]
    if len(sides) not in (1, n) or (len(sides) == 1 and sides[0] is None):
        raise ValueError(f"{where}: output_size must be an int or {n} ints (or None), got {_short(size)}")
    sides = [None if s is None else _int(where, "output_size", s, 1, INT_LIMIT) for s in sides]
    given = [s for s in sides if s is not None]
    area = given[0] ** n if len(sides) == 1 else math.prod(given)
    if area > max(largest, 1):  # the pooled maps hold no more values than the file's largest tensor
        raise ValueError(
            f"{where}: output_size {_short(size)} makes maps of {area} values, more than the file's largest "
            f"tensor ({largest} values)"
        )
    return {"output_size": sides[0] if len(sides) == 1 else tuple(sides)}


def _layer_kwargs(where, kind, args, tensors, largest):
    """The constructor arguments of a layer of :data:`LAYER_TYPES`, every value checked, every size against the
    layer's ``tensors`` (attribute -> tensor of the file): ``ValueError`` / ``TypeError`` naming ``where``."""
    if kind == "Linear":
        n_in = _int(where, "in_features", args["in_features"], 0)
        n_out = _int(where, "out_features", args["out_features"], 0)
        bias = _bool(where, "bias", args["bias"])
        _match_tensors(where, tensors, {"weight": (n_out, n_in)} | ({"bias": (n_out,)} if bias else {}))
        return {"in_features": n_in, "out_features": n_out, "bias": bias}
    if kind.startswith("Conv"):
        return _conv_kwargs(where, kind, args, tensors)
    if kind == "SelectFeatures":
        count = _int(where, "index", args["index"], 0)
        num_inputs = _int(where, "num_inputs", args["num_inputs"], 1, INT_LIMIT)
        dim = _int(where, "dim", args["dim"], *_DIMS)
        _match_tensors(where, tensors, {"index": (count,)})
        index = tensors["index"]
        if count and (int(index.min()) < 0 or int(index.max()) >= num_inputs):
            raise ValueError(f"{where}: its index must lie in [0, num_inputs) = [0, {num_inputs})")
        return {"index": count, "num_inputs": num_inputs, "dim": dim}  # the values come with the state dict
    if kind.startswith("BatchNorm"):
        affine = _bool(where, "affine", args["affine"])
        track = _bool(where, "track_running_stats", args["track_running_stats"])
        n = _int(where, "num_features", args["num_features"], 1, None if affine or track else INT_LIMIT)
        momentum = args["momentum"]
        if momentum is not None:
            _float(where, "momentum", momentum, 0, 1)
        expected = ({"weight": (n,), "bias": (n,)} if affine else {}) | (
            {"running_mean": (n,), "running_var": (n,), "num_batches_tracked": ()} if track else {}
        )
        _match_tensors(where, tensors, expected)
        eps = _float(where, "eps", args["eps"], 0, None, low_open=True)
        return {"num_features": n, "eps": eps, "momentum": momentum, "affine": affine, "track_running_stats": track}
    _match_tensors(where, tensors, {})  # the other layers hold no tensors
    if kind.startswith(("MaxPool", "AvgPool")):
        return _pool_kwargs(where, kind, args)
    if kind.startswith("Adaptive"):
        return _adaptive_kwargs(where, kind, args, largest)
    if kind == "Flatten":
        return {key: _int(where, key, args[key], *_DIMS) for key in ("start_dim", "end_dim")}
    if kind == "GELU":
        return {"approximate": _choice(where, "approximate", args["approximate"], ("none", "tanh"))}
    if kind == "Hardtanh":
        low = _float(where, "min_val", args["min_val"])
        high = _float(where, "max_val", args["max_val"])
        if not low < high:
            raise ValueError(f"{where}: min_val = {low} must be below max_val = {high}")
        return {"min_val": low, "max_val": high}
    if kind == "Softplus":
        beta = _float(where, "beta", args["beta"], 0, None, low_open=True)
        return {"beta": beta, "threshold": _float(where, "threshold", args["threshold"])}
    if kind.startswith("Dropout"):
        return {"p": _float(where, "p", args["p"], 0, 1)}
    return {key: _float(where, key, args[key]) for key in LAYER_TYPES[kind][1]}  # LeakyReLU, ELU; the rest: {}


def _entry(spec, k, what):
    """``(name, type, args)`` of entry ``k`` of a description, its structure checked (not yet its values)."""
    if not isinstance(spec, dict):
        raise TypeError(
            f"{what} {k} of the description must be a dict of 'name', 'type' and 'args', got {_short(spec)}"
        )
    if set(spec) != {"name", "type", "args"}:
        keys = sorted(map(repr, spec))
        raise ValueError(f"{what} {k} of the description has the entries {keys}, expected 'name', 'type' and 'args'")
    name, kind, args = spec["name"], spec["type"], spec["args"]
    if not isinstance(name, str):
        raise TypeError(f"{what} {k} of the description: its name must be a str, got {_short(name)}")
    if not isinstance(kind, str):
        raise TypeError(f"{what} {name!r}: its type must be a str, got {_short(kind)}")
    if not isinstance(args, dict):
        raise TypeError(f"{what} {name!r} ({kind}): its args must be a dict, got {_short(args)}")
    return name, kind, args


def _layer_args(where, kind, args):
    """``args`` of a :data:`LAYER_TYPES` entry with the defaults of older files, its keys checked."""
    if kind not in LAYER_TYPES:
        raise ValueError(f"{where} has type {_short(kind)}, not one of the allowed {', '.join(LAYER_TYPES)}")
    keys = LAYER_TYPES[kind][1]
    args = {**_OPTIONAL_ARGS.get(kind, {}), **args}
    if set(args) != set(keys):
        raise ValueError(f"{where} ({kind}) has the arguments {sorted(map(repr, args))}, expected {sorted(keys)}")
    return args


#: A layer's name in an ``nn.Sequential`` of the file, and a child's name in a ``Sequential`` the file describes.
_CHILD = re.compile(r"[^\W_]\w*")
_SEQUENTIAL_ATTRIBUTES = frozenset(dir(nn.Sequential()))


def _check_child_name(where, name):
    """A name for a new module: word characters, not starting with ``_``, no attribute of an ``nn.Sequential``."""
    if not _CHILD.fullmatch(name) or name in _SEQUENTIAL_ATTRIBUTES:
        raise ValueError(
            f"{where}: the name {_short(name)} is not allowed: a name is letters, digits and '_', does not start "
            "with '_' and is no attribute of an nn.Sequential (such as 'training' or 'forward')"
        )


def _max_entries(state_dict):
    """The most modules a description may hold: each is a Python object (about 2 kB) that no tensor accounts for."""
    return 256 + 8 * len(state_dict)


def _check_count(what, entries, state_dict):
    if len(entries) > _max_entries(state_dict):
        raise ValueError(
            f"{what} holds {len(entries)} entries, more than the {_max_entries(state_dict)} that a file of "
            f"{len(state_dict)} tensors may describe (256 + 8 per tensor)"
        )


def _tensors_by_owner(state_dict):
    """``{module name: {attribute: tensor}}`` of a state dict; keys and values checked."""
    if not isinstance(state_dict, dict):
        raise TypeError(f"state_dict must be a dict of tensors, got {type(state_dict).__name__}")
    out = {}
    for key, tensor in state_dict.items():
        if not isinstance(key, str):
            raise TypeError(f"state_dict: the key {_short(key)} is not a str")
        if not isinstance(tensor, torch.Tensor) or tensor.layout != torch.strided or tensor.is_quantized:
            raise TypeError(f"state_dict[{key!r}] must be a dense tensor, got {_short(tensor)}")
        if tensor.is_meta:
            raise ValueError(f"state_dict[{key!r}] is a tensor without data (on the meta device)")
        owner, _, attribute = key.rpartition(".")
        out.setdefault(owner, {})[attribute] = tensor
    return out


def _largest(state_dict):
    return max((t.numel() for t in state_dict.values()), default=0)


def _construct(where, kind, kwargs):
    """The layer, built on the meta device: nothing is allocated before the file's tensors are assigned."""
    try:
        with torch.device("meta"), warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # "Initializing zero-element tensors"
            if kind == "SelectFeatures":
                kwargs = {**kwargs, "index": torch.empty(kwargs["index"], dtype=torch.long)}
            return LAYER_TYPES[kind][0](**kwargs)
    except (TypeError, ValueError, RuntimeError, AssertionError) as err:
        raise ValueError(f"{where} cannot be built from its arguments: {err}") from err


def _load_state(module, state_dict):
    """Assign the tensors (checked against the layers' shapes); every tensor of ``module`` must come from them."""
    try:
        module.load_state_dict(state_dict, strict=True, assign=True)
    except (RuntimeError, TypeError, ValueError) as err:
        lines = [line.strip() for line in str(err).splitlines()[1:] if line.strip()] or [str(err)]
        raise ValueError(f"the state dict does not fit the described layers: {'; '.join(lines[:3])}") from err
    empty = [n for n, t in [*module.named_parameters(), *module.named_buffers()] if t.is_meta]
    if empty:  # pragma: no cover - strict loading names every missing tensor
        raise ValueError(f"the state dict lacks {empty[:5]}")


def _sequential_layers(layers, state_dict):
    """``[(name, kind, kwargs)]`` of :func:`describe_pruned`'s list, every entry checked against the tensors."""
    if not isinstance(layers, list):
        raise TypeError(f"layers is a {type(layers).__name__}, not a list of {{'name', 'type', 'args'}} dicts")
    tensors = _tensors_by_owner(state_dict)
    _check_count("layers", layers, state_dict)
    largest = _largest(state_dict)
    out, names = [], set()
    for k, spec in enumerate(layers):
        name, kind, args = _entry(spec, k, "layer")
        where = f"layer {name!r}"
        _check_child_name(where, name)
        if name in names:
            raise ValueError(f"{where} is described twice")
        names.add(name)
        args = _layer_args(where, kind, args)
        out.append((name, kind, _layer_kwargs(f"{where} ({kind})", kind, args, tensors.get(name, {}), largest)))
    stray = [f"{owner}.{key}" for owner in tensors if owner not in names for key in tensors[owner]]
    if stray:
        raise ValueError(f"the state dict holds {', '.join(map(repr, stray[:5]))}, which no layer of the file has")
    return out


def build_pruned(layers, state_dict):
    """An ``nn.Sequential`` (``eval()`` mode) from :func:`describe_pruned`'s list and a state dict.

    Every argument is checked, every size against the tensors (see :func:`load_pruned`); the layers are
    built without allocating and take the tensors as they are, with their dtype.

    :raises TypeError: when ``layers`` is not a list of ``{"name", "type", "args"}`` dicts, ``state_dict``
        not a dict of tensors, or an entry or argument has the wrong type.
    :raises ValueError: naming the layer, for an unknown layer type, a name that is not allowed, an argument
        out of its range or a size that disagrees with the tensors, and for a state dict that does not fit.
    """
    layers = _sequential_layers(layers, state_dict)
    module = nn.Sequential(
        OrderedDict((name, _construct(f"layer {name!r} ({kind})", kind, kw)) for name, kind, kw in layers)
    )
    _load_state(module, state_dict)
    return module.eval()


def _fresh(model, model_class):
    """The instance ``model`` is, or builds (a class or a function without arguments)."""
    if not isinstance(model_class, str):
        raise TypeError(f"model_class must be a str (a class name), got {_short(model_class)}")
    if model is None:
        raise ValueError(
            f"the file holds a pruned {model_class}, a model of your own class: pass model= a fresh {model_class} "
            f"(or a function that builds one), e.g. load_pruned(path, model={model_class})"
        )
    instance = model if isinstance(model, nn.Module) else model() if callable(model) else None
    if not isinstance(instance, nn.Module):
        raise TypeError(f"model must be an nn.Module or a function returning one, got {type(instance).__name__}")
    if type(instance).__qualname__ != model_class:
        raise ValueError(f"the file holds a pruned {model_class}, but model= is a {type(instance).__qualname__}")
    return instance


def _twin_tree(model):
    """A copy of ``model``'s tree of modules sharing its tensors and attributes, but not its containers (the
    dicts of modules, parameters and buffers, and any other list, dict or set, such as an RNN's list of its
    weights): changed and loaded, it leaves ``model`` as it was. Returns ``(twin, pairs)``."""
    pairs = {}

    def twin_of(module):
        if id(module) not in pairs:
            twin = copy.copy(module)
            pairs[id(module)] = (module, twin)
            for key, value in module.__dict__.items():
                if isinstance(value, (list, dict, set)):
                    twin.__dict__[key] = copy.copy(value)
            twin.__dict__["_parameters"] = dict(module._parameters)
            twin.__dict__["_buffers"] = dict(module._buffers)
            twin.__dict__["_modules"] = {k: None if m is None else twin_of(m) for k, m in module._modules.items()}
        return pairs[id(module)][1]

    return twin_of(model), list(pairs.values())


def _commit(pairs):
    """Give every module of the original tree the state of its twin (see :func:`_twin_tree`)."""
    originals = {id(twin): module for module, twin in pairs}
    for module, twin in pairs:
        state = dict(twin.__dict__)
        state["_modules"] = {k: originals.get(id(m), m) for k, m in twin._modules.items()}
        module.__dict__.update(state)


def _locate(root, name):
    """``(parent, child name, module)`` of a dotted name, found through the ``_modules`` of each module only."""
    *path, child = name.split(".")
    parent = root
    for i, part in enumerate(path):
        parent = parent._modules.get(part)
        if parent is None:
            raise ValueError(f"module {name!r} of the file: the model has no module {'.'.join(path[: i + 1])!r}")
    if child not in parent._modules or parent._modules[child] is None:
        raise ValueError(f"module {name!r} of the file is not a module of the model")
    return parent, child, parent._modules[child]


def _place(twin, modules, tensors, largest):
    """Put the file's layers into ``twin`` (see :func:`build_into`); checks every entry first."""
    placeholders, names = set(), set()
    for k, spec in enumerate(modules):
        name, kind, args = _entry(spec, k, "module")
        where = f"module {name!r}"
        if not all(re.fullmatch(r"\w+", part) for part in name.split(".")):
            raise ValueError(f"{where}: the name {_short(name)} is not a dotted name of modules")
        if name in names:
            raise ValueError(f"{where} is described twice")
        names.add(name)
        parent, child, existing = _locate(twin, name)
        placeholder = id(existing) in placeholders
        if kind == "module":
            if set(args) != {"class"} or not isinstance(args["class"], str):
                raise ValueError(f"{where} (module): its args must be {{'class': its class name}}, got {_short(args)}")
            if placeholder or type(existing).__qualname__ != args["class"]:
                found = "nothing" if placeholder else f"a {type(existing).__qualname__}"
                raise ValueError(f"module {name!r} of the file is a {args['class']}, the model has {found} there")
        elif kind == "Sequential":
            children = args.get("children") if set(args) == {"children"} else None
            if not isinstance(children, list) or not all(isinstance(c, str) for c in children):
                raise ValueError(f"{where} (Sequential): its args must be {{'children': [names]}}, got {_short(args)}")
            if type(existing) is nn.Sequential and list(existing._modules) == children:
                continue  # the model's own Sequential: its children are described next
            if not (placeholder or type(existing) in (nn.Sequential, nn.Linear)):
                raise ValueError(f"{where}: the file has a Sequential where the model has a {type(existing).__name__}")
            if len(set(children)) != len(children):
                raise ValueError(f"{where} (Sequential): its children {_short(children)} repeat a name")
            for c in children:
                _check_child_name(f"{where} (Sequential)", c)
            if len(children) > len(modules) - k - 1:  # every child is described after its parent
                raise ValueError(f"{where} (Sequential): it has {len(children)} children, the file describes fewer")
            new = nn.Sequential(OrderedDict((c, nn.Identity()) for c in children))  # every child is described next
            placeholders.update(id(m) for m in new)
            parent._modules[child] = new
        else:
            args = _layer_args(where, kind, args)
            if not (placeholder or type(existing) is LAYER_TYPES[kind][0]):
                raise ValueError(f"{where}: the file has a {kind} where the model has a {type(existing).__name__}")
            kwargs = _layer_kwargs(f"{where} ({kind})", kind, args, tensors.get(name, {}), largest)
            layer = _construct(f"{where} ({kind})", kind, kwargs)
            placeholders.discard(id(existing))
            parent._modules[child] = layer
    missing = [n for n, m in twin.named_modules() if n and (n not in names or id(m) in placeholders)]
    if missing:
        raise ValueError(f"the model has modules the file does not describe: {missing[:5]}")


def build_into(model, modules, state_dict):
    """``model`` (a fresh instance of the saved class) with :func:`describe_modules`'s layers and the tensors.

    Every layer of :data:`LAYER_TYPES` in ``modules`` replaces the module of that name and type (so it takes
    the pruned size), an ``nn.Sequential`` the file holds where the model has a linear layer (one that became
    ``SelectFeatures -> Linear``) is put in its place, and a module of another class must be in the model
    already, of the same class. Names are found among the model's modules only (never its other attributes).
    Nothing of ``model`` changes unless all of it fits: the layers are put into a copy of its tree of modules
    that shares its tensors, the tensors are loaded there, and only then is ``model`` given the result.
    Returns ``model`` in ``eval()`` mode.

    :raises TypeError: for entries or arguments of the wrong type.
    :raises ValueError: naming the module, when the model does not have the saved structure, for a size that
        disagrees with the tensors, and for a state dict that does not fit.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
    if not isinstance(modules, list):
        raise TypeError(f"modules is a {type(modules).__name__}, not a list of {{'name', 'type', 'args'}} dicts")
    tensors = _tensors_by_owner(state_dict)
    _check_count("modules", modules, state_dict)
    twin, pairs = _twin_tree(model)
    _place(twin, modules, tensors, _largest(state_dict))
    _load_state(twin, state_dict)
    twin.eval()
    _commit(pairs)
    return model


def _check_metadata(metadata):
    """``metadata`` as a dict of tensors and plain values, or a ``TypeError`` naming the first other entry."""
    if metadata is None:
        return {}
    if not isinstance(metadata, dict):
        raise TypeError(f"metadata must be a dict (or None), got {type(metadata).__name__}")
    plain = (type(None), bool, int, float, complex, str)
    stack = [(metadata, "metadata", frozenset())]
    while stack:
        value, where, within = stack.pop()
        if type(value) in plain or type(value) in (torch.Tensor, nn.Parameter, torch.Size):
            continue
        if type(value) in (dict, OrderedDict, list, tuple):
            if id(value) in within:
                raise TypeError(f"{where} contains itself, which cannot be saved")
            inner = within | {id(value)}
            if isinstance(value, dict):
                for key, item in value.items():
                    if type(key) not in plain:
                        raise TypeError(
                            f"{where} has the key {_short(key)}: keys must be str, int, float, bool or None"
                        )
                    stack.append((item, f"{where}[{key!r}]", inner))
            else:
                stack.extend((item, f"{where}[{i}]", inner) for i, item in enumerate(value))
            continue
        kind = f"{type(value).__module__}.{type(value).__qualname__}"
        raise TypeError(
            f"{where} is a {kind} ({_short(value)}), which cannot be saved: metadata holds tensors and plain values "
            "(dict, list, tuple, str, int, float, complex, bool, None)"
        )
    return dict(metadata)


def save_pruned(module, path, metadata=None):
    """Write a pruned network and ``metadata`` to ``path`` (atomically; see the module docstring).

    Everything is checked before anything is written: the layers against what :func:`load_pruned` accepts
    (so every file written loads back) and ``metadata``'s values. An existing file at ``path`` is replaced
    in one step; a failed save leaves it as it was and no partial file behind.

    :param module: the output of :func:`~l0bayes.pruning.prune.prune`: an ``nn.Sequential`` of allow-listed
        layers (or a subclass with ``nn.Sequential``'s ``forward``; it loads back as an ``nn.Sequential``),
        or a model of your own class (a pruned model of :func:`~l0bayes.pruning.sparsify`), whose
        resized layers must be allow-listed (``nn.Linear``, ``nn.Conv1d/2d/3d``, batch norms, ...); load the
        latter with ``load_pruned(path, model=YourClass)``.
    :param path: the file to write; its directory must exist.
    :param dict metadata: tensors and plain values (``dict``, ``list``, ``tuple``, ``str``, numbers,
        ``None``) stored beside the network, e.g. the input shape and the scalers of the data.
    :raises TypeError: when ``module`` is not an ``nn.Module``; naming the key, for an entry of ``metadata``
        of another type (a function, a NumPy value: convert it with ``float()``, ``.tolist()`` or
        ``torch.as_tensor``); naming the layer, for a grouped convolution or (in an ``nn.Sequential``) a
        layer outside :data:`LAYER_TYPES`.
    :raises ValueError: naming the layer, for one that :func:`load_pruned` would refuse (a name it does not
        allow, an argument outside its range).
    """
    if not isinstance(module, nn.Module):
        raise TypeError(f"module must be an nn.Module (the output of prune()), got {type(module).__name__}")
    metadata = _check_metadata(metadata)
    state = {"format": FORMAT}
    state_dict = {k: v.detach().cpu() for k, v in module.state_dict().items()}
    if isinstance(module, nn.Sequential) and type(module).forward is nn.Sequential.forward:
        state.update(version=VERSION, layers=describe_pruned(module))
        _sequential_layers(state["layers"], state_dict)
    else:
        state.update(version=MODULES_VERSION, model_class=type(module).__qualname__, modules=describe_modules(module))
        tensors, largest = _tensors_by_owner(state_dict), _largest(state_dict)
        _check_count("modules", state["modules"], state_dict)
        for spec in state["modules"]:
            if spec["type"] in LAYER_TYPES:
                where = f"module {spec['name']!r} ({spec['type']})"
                _layer_kwargs(where, spec["type"], spec["args"], tensors.get(spec["name"], {}), largest)
    state["state_dict"] = state_dict
    state["metadata"] = metadata
    save_checkpoint(path, state)


_KEYS = {VERSION: ("layers",), MODULES_VERSION: ("model_class", "modules")}


def load_pruned(path, map_location="cpu", model=None):
    """Read a file of :func:`save_pruned` safely: returns ``(module, metadata)``, the module in ``eval()`` mode.

    Loads with ``torch.load(weights_only=True)``; nothing in the file names code to run, and nothing is
    allocated beyond the file's own tensors: every layer is built on the meta device and takes the
    file's tensors, and every value of the description is checked first. A size must equal the shape of the
    tensor it describes (a linear layer's ``in_features`` its weight's, a ``SelectFeatures``' length its
    index's); an integer that sizes no tensor is at most :data:`INT_LIMIT`, a convolution's padding at most
    the kernel's reach, an adaptive pooling's output no larger than the file's largest tensor; names are
    found among the modules only.

    :param model: for a file holding a model of your own class: a fresh instance of that class (changed in
        place and returned, once the whole file fits it), or the class or a function without arguments that
        builds one. Its layers are replaced by ones of the pruned sizes, then the tensors are loaded.
        ``None`` for an ``nn.Sequential``, which is rebuilt from the file alone.
    :raises FileNotFoundError: when ``path`` does not exist.
    :raises ValueError: naming the file (and the entry) when it is corrupt, holds anything but tensors and plain
        containers (a pickle that would run code), is not a pruned-model file, describes a layer outside
        :data:`LAYER_TYPES`, or a value out of its range; when a model of your own class is not passed
        ``model=`` (or one of another class or structure).
    :raises TypeError: naming the file and the entry, for a value of the wrong type in the file.
    """
    state = load_checkpoint(path, map_location=map_location, required=("format", "state_dict"))
    path = os.fspath(path)
    version = state.get("version")
    if not isinstance(state["format"], str) or state["format"] != FORMAT:
        raise CheckpointError(f"{path!r} is not an l0bayes pruned model (format {_short(state['format'])})")
    if type(version) is not int or version not in _KEYS:
        raise CheckpointError(f"{path!r} is a pruned model of version {_short(version)}, not one of {list(_KEYS)}")
    missing = [key for key in _KEYS[version] if key not in state]
    if missing:
        raise CheckpointError(f"{path!r} lacks {', '.join(map(repr, missing))} and is not a complete pruned-model file")
    extra = set(state) - {"format", "version", "state_dict", "metadata", *_KEYS[version]}
    if extra:
        raise CheckpointError(f"{path!r} holds the unknown entries {sorted(map(repr, extra))}")
    metadata = state.get("metadata", {})
    if not isinstance(metadata, dict):
        raise CheckpointTypeError(f"{path!r}: its metadata must be a dict, got {type(metadata).__name__}")
    try:
        if version == VERSION:
            if model is not None:
                raise ValueError("the file holds an nn.Sequential, which loads without model=")
            module = build_pruned(state["layers"], state["state_dict"])
        else:
            module = build_into(_fresh(model, state["model_class"]), state["modules"], state["state_dict"])
    except TypeError as err:
        raise CheckpointTypeError(f"{path!r}: {err}") from None
    except ValueError as err:
        raise CheckpointError(f"{path!r}: {err}") from None
    return module, metadata


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
