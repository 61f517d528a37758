"""Checking a pruned-model file's description of its layers against its tensors, before anything is built.

A file of :func:`~l0bayes.pruning.export.save_pruned` is data that anyone may have written. Every entry of
its description (see :mod:`~l0bayes.pruning.describe`) is checked here: its structure, every argument's
type and range, and every size against the shape of the tensor it describes, so that building the layers
allocates nothing beyond the file's own tensors. Each check raises a ``TypeError`` or ``ValueError`` that
names the layer and the argument.
"""

import math
import re

import torch
from torch import nn

from .describe import LAYER_TYPES, PRUNED_ATTRIBUTES, TRANSFORMER_TYPES

__all__ = [
    "INT_LIMIT",
    "check_child_name",
    "check_entry_count",
    "check_layers",
    "check_modules",
    "description_entry",
    "largest_numel",
    "layer_arguments",
    "layer_kwargs",
    "module_extras",
    "short_repr",
    "tensors_by_owner",
    "transformer_kwargs",
]

# Arguments that files of earlier versions lack, with the value they meant.
_OPTIONAL_ARGS = {"SelectFeatures": {"dim": 1}} | {f"Conv{n}d": {"groups": 1} for n in (1, 2, 3)}

#: The largest value of an integer argument that no tensor of the file sizes (a stride, a dilation, a pooling
#: window, the width that ``SelectFeatures`` selects from): what torch's kernels take as a 32-bit int.
INT_LIMIT = 2**31 - 1
#: The dimensions that ``Flatten`` and ``SelectFeatures`` may name.
_DIMS = (-64, 63)
_PADDING_MODES = ("zeros", "reflect", "replicate", "circular")
_FLOAT_KEYS = ("weight", "bias", "running_mean", "running_var")


def short_repr(value, limit=60):
    """``repr(value)`` for an error message, cut to ``limit`` characters (a crafted file may hold a huge list).

    A list, tuple, dict, str or bytes longer than ``limit`` is named by its type and length instead.
    """
    if isinstance(value, (list, tuple, dict, str, bytes)) and len(value) > limit:
        return f"a {type(value).__name__} of {len(value)} items"
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _int(where, key, value, low, high=None):
    if type(value) is not int:
        raise TypeError(f"{where}: {key} must be an int, got {short_repr(value)}")
    if value < low or (high is not None and value > high):
        bound = f"at least {low}" if high is None else f"in [{low}, {high}]"
        raise ValueError(f"{where}: {key} = {short_repr(value)} must be {bound}")
    return value


def _ints(where, key, value, low, high=None, n=2):
    """An int or a list (tuple) of ``n`` ints, as a tuple of ``n`` ints."""
    if isinstance(value, (list, tuple)):
        if len(value) != n:
            raise ValueError(f"{where}: {key} must be an int or {n} ints, got {short_repr(value)}")
        return tuple(_int(where, f"{key}[{i}]", v, low, high) for i, v in enumerate(value))
    return (_int(where, key, value, low, high),) * n


def _float(where, key, value, low=None, high=None, low_open=False):
    if type(value) not in (int, float):
        raise TypeError(f"{where}: {key} must be a number, got {short_repr(value)}")
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
        raise TypeError(f"{where}: {key} must be True or False, got {short_repr(value)}")
    return value


def _choice(where, key, value, choices):
    if not isinstance(value, str):
        raise TypeError(f"{where}: {key} must be a str, one of {list(choices)}, got {short_repr(value)}")
    if value not in choices:
        raise ValueError(f"{where}: {key} must be one of {list(choices)}, got {short_repr(value)}")
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
    groups = _int(where, "groups", args["groups"], 1)
    if in_channels % groups or out_channels % groups:
        raise ValueError(
            f"{where}: groups = {groups} must divide in_channels = {in_channels} and out_channels = {out_channels}"
        )
    bias = _bool(where, "bias", args["bias"])
    expected = {"weight": (out_channels, in_channels // groups, *kernel)} | ({"bias": (out_channels,)} if bias else {})
    _match_tensors(where, tensors, expected)
    padding_mode = _choice(where, "padding_mode", args["padding_mode"], _PADDING_MODES)
    return {
        "in_channels": in_channels,
        "out_channels": out_channels,
        "kernel_size": kernel,
        "stride": stride,
        "padding": padding,
        "dilation": dilation,
        "groups": groups,
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
        raise ValueError(f"{where}: output_size must be an int or {n} ints (or None), got {short_repr(size)}")
    sides = [None if s is None else _int(where, "output_size", s, 1, INT_LIMIT) for s in sides]
    given = [s for s in sides if s is not None]
    area = given[0] ** n if len(sides) == 1 else math.prod(given)
    if area > max(largest, 1):  # the pooled maps hold no more values than the file's largest tensor
        raise ValueError(
            f"{where}: output_size {short_repr(size)} makes maps of {area} values, more than the file's largest "
            f"tensor ({largest} values)"
        )
    return {"output_size": sides[0] if len(sides) == 1 else tuple(sides)}


def layer_kwargs(where, kind, args, tensors, largest):
    """The constructor arguments of a layer of :data:`~l0bayes.pruning.describe.LAYER_TYPES`, every value checked.

    :param str where: how error messages name the layer, e.g. ``"layer '0' (Linear)"``.
    :param str kind: its type, a key of ``LAYER_TYPES``.
    :param dict args: its arguments, with the keys that :func:`layer_arguments` checked.
    :param dict tensors: the layer's tensors in the file, by attribute (``{"weight": ..., "bias": ...}``):
        every size in ``args`` must equal the shape of the tensor it describes, and the layer must have
        exactly these tensors.
    :param int largest: the number of values of the file's largest tensor (:func:`largest_numel`), which
        bounds an adaptive pooling's output.
    :raises TypeError: naming ``where`` and the argument, for a value of the wrong type.
    :raises ValueError: naming ``where`` and the argument, for a value out of its range or a size that
        disagrees with the tensors.
    """
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


def transformer_kwargs(where, kind, args, owners, name, state_dict):
    """The checked arguments of an entry of :data:`~l0bayes.pruning.describe.TRANSFORMER_TYPES`.

    ``"ZeroBranch"``: ``pair`` and ``batch_first`` booleans, ``features`` ``None`` or an int no larger than the
    largest dimension of the file's tensors (the zeros it returns are as wide), and no tensors. ``"Conv1D"``:
    ``nf`` outputs and ``nx`` inputs, the shapes of its ``weight`` ``(nx, nf)`` and ``bias`` ``(nf,)``.
    ``"PrunedMultiheadAttention"``: positive sizes that agree with the tensors of its projections, ``bias`` and
    ``batch_first`` booleans, ``dropout`` in [0, 1], no tensors of its own. ``"PrunedTransformerEncoderLayer"``:
    ``feed_forward`` a boolean, no tensors of its own.

    :param owners: :func:`tensors_by_owner` of the state dict; ``name``: the entry's module name.

    :raises TypeError: naming ``where`` and the argument, for a value of the wrong type.
    :raises ValueError: naming ``where``, for other arguments, a value out of its range or a size that
        disagrees with the tensors.
    """
    keys = TRANSFORMER_TYPES[kind]
    if set(args) != set(keys):
        raise ValueError(f"{where} has the arguments {sorted(map(repr, args))}, expected {sorted(keys)}")
    tensors = owners.get(name, {})
    if kind == "Conv1D":
        nf, nx = _int(where, "nf", args["nf"], 0), _int(where, "nx", args["nx"], 0)
        _match_tensors(where, tensors, {"weight": (nx, nf), "bias": (nf,)})
        return {"nf": nf, "nx": nx}
    _match_tensors(where, tensors, {})
    if kind == "PrunedTransformerEncoderLayer":
        return {"feed_forward": _bool(where, "feed_forward", args["feed_forward"])}
    if kind == "PrunedMultiheadAttention":
        return _attention_kwargs(where, args, {c: owners.get(f"{name}.{c}", {}) for c in _PROJECTIONS})
    widest = max((max(t.shape, default=1) for t in state_dict.values()), default=1)
    features = args["features"]
    if features is not None:
        _int(where, "features", features, 1, widest)
    pair, batch_first = _bool(where, "pair", args["pair"]), _bool(where, "batch_first", args["batch_first"])
    return {"pair": pair, "batch_first": batch_first, "features": features}


_PROJECTIONS = ("q_proj", "k_proj", "v_proj", "out_proj")


def _attention_kwargs(where, args, children):
    """:func:`transformer_kwargs` of a ``PrunedMultiheadAttention``: every size against its projections' tensors."""
    sizes = {key: _int(where, key, args[key], 1) for key in ("embed_dim", "num_heads", "head_dim", "kdim", "vdim")}
    bias = _bool(where, "bias", args["bias"])
    width = sizes["num_heads"] * sizes["head_dim"]
    inputs = {"q_proj": sizes["embed_dim"], "k_proj": sizes["kdim"], "v_proj": sizes["vdim"], "out_proj": width}
    for child, fan_in in inputs.items():
        fan_out = sizes["embed_dim"] if child == "out_proj" else width
        expected = {"weight": (fan_out, fan_in), **({"bias": (fan_out,)} if bias else {})}
        _match_tensors(f"{where}.{child}", children.get(child, {}), expected)
    return {
        **sizes,
        "bias": bias,
        "batch_first": _bool(where, "batch_first", args["batch_first"]),
        "dropout": _float(where, "dropout", args["dropout"], 0.0, 1.0),
    }


def module_extras(where, args):
    """``(attributes, length)`` of a ``"module"`` entry (``{}`` and ``None`` where absent), their keys and types
    checked: ``attributes`` maps names of :data:`~l0bayes.pruning.describe.PRUNED_ATTRIBUTES` to positive ints,
    ``length`` (an ``nn.ModuleList``'s) is an int of at least 0; the bounds of a fresh model are checked when
    loading. A ``TypeError`` or ``ValueError`` names ``where`` and the entry."""
    if not set(args) <= {"class", "attributes", "length"} or not isinstance(args.get("class"), str):
        raise ValueError(f"{where} (module): its args must be {{'class': its class name}}, got {short_repr(args)}")
    attributes = args.get("attributes", {})
    if not isinstance(attributes, dict):
        raise TypeError(f"{where}: its attributes must be a dict of ints, got {short_repr(attributes)}")
    for key, value in attributes.items():
        if key not in PRUNED_ATTRIBUTES:
            raise ValueError(
                f"{where}: the attribute {short_repr(key)} may not be set; allowed: {', '.join(PRUNED_ATTRIBUTES)}"
            )
        _int(where, key, value, 1)
    length = args.get("length")
    if length is not None:
        _int(where, "length", length, 0)
    return attributes, length


def description_entry(spec, k, what):
    """``(name, type, args)`` of entry ``k`` of a description, its structure checked (not yet its values).

    :param spec: the entry, which must be a dict of exactly ``"name"`` (a str), ``"type"`` (a str) and
        ``"args"`` (a dict).
    :param str what: what an error message calls the entry (``"layer"``, ``"module"``).
    """
    if not isinstance(spec, dict):
        raise TypeError(
            f"{what} {k} of the description must be a dict of 'name', 'type' and 'args', got {short_repr(spec)}"
        )
    if set(spec) != {"name", "type", "args"}:
        keys = sorted(map(repr, spec))
        raise ValueError(f"{what} {k} of the description has the entries {keys}, expected 'name', 'type' and 'args'")
    name, kind, args = spec["name"], spec["type"], spec["args"]
    if not isinstance(name, str):
        raise TypeError(f"{what} {k} of the description: its name must be a str, got {short_repr(name)}")
    if not isinstance(kind, str):
        raise TypeError(f"{what} {name!r}: its type must be a str, got {short_repr(kind)}")
    if not isinstance(args, dict):
        raise TypeError(f"{what} {name!r} ({kind}): its args must be a dict, got {short_repr(args)}")
    return name, kind, args


def layer_arguments(where, kind, args):
    """``args`` of an entry of type ``kind``, with the defaults of older files, its keys checked (not its values).

    :raises ValueError: naming ``where``, when ``kind`` is not in :data:`~l0bayes.pruning.describe.LAYER_TYPES`
        or ``args`` has other keys than that type's constructor arguments.
    """
    if kind not in LAYER_TYPES:
        raise ValueError(f"{where} has type {short_repr(kind)}, not one of the allowed {', '.join(LAYER_TYPES)}")
    keys = LAYER_TYPES[kind][1]
    args = {**_OPTIONAL_ARGS.get(kind, {}), **args}
    if set(args) != set(keys):
        raise ValueError(f"{where} ({kind}) has the arguments {sorted(map(repr, args))}, expected {sorted(keys)}")
    return args


#: A layer's name in an ``nn.Sequential`` of the file, and a child's name in a ``Sequential`` the file describes.
_CHILD = re.compile(r"[^\W_]\w*")
_SEQUENTIAL_ATTRIBUTES = frozenset(dir(nn.Sequential()))


def check_child_name(where, name):
    """Refuse a name for a new module unless it is word characters, not starting with ``_``, and no attribute of
    an ``nn.Sequential`` (``ValueError`` naming ``where``): such a name cannot reach a module's internals."""
    if not _CHILD.fullmatch(name) or name in _SEQUENTIAL_ATTRIBUTES:
        raise ValueError(
            f"{where}: the name {short_repr(name)} is not allowed: a name is letters, digits and '_', does not start "
            "with '_' and is no attribute of an nn.Sequential (such as 'training' or 'forward')"
        )


def _max_entries(state_dict):
    """The most modules a description may hold: each is a Python object (about 2 kB) that no tensor accounts for."""
    return 256 + 8 * len(state_dict)


def check_entry_count(what, entries, state_dict):
    """Refuse a description of more entries than ``state_dict`` may account for: 256 plus 8 per tensor
    (``ValueError`` naming ``what``)."""
    if len(entries) > _max_entries(state_dict):
        raise ValueError(
            f"{what} holds {len(entries)} entries, more than the {_max_entries(state_dict)} that a file of "
            f"{len(state_dict)} tensors may describe (256 + 8 per tensor)"
        )


def tensors_by_owner(state_dict):
    """``{module name: {attribute: tensor}}`` of a state dict; keys and values checked.

    :raises TypeError: when ``state_dict`` is not a dict, for a key that is not a str, and for a value that
        is not a dense tensor.
    :raises ValueError: for a tensor without data (on the meta device).
    """
    if not isinstance(state_dict, dict):
        raise TypeError(f"state_dict must be a dict of tensors, got {type(state_dict).__name__}")
    out = {}
    for key, tensor in state_dict.items():
        if not isinstance(key, str):
            raise TypeError(f"state_dict: the key {short_repr(key)} is not a str")
        if not isinstance(tensor, torch.Tensor) or tensor.layout != torch.strided or tensor.is_quantized:
            raise TypeError(f"state_dict[{key!r}] must be a dense tensor, got {short_repr(tensor)}")
        if tensor.is_meta:
            raise ValueError(f"state_dict[{key!r}] is a tensor without data (on the meta device)")
        owner, _, attribute = key.rpartition(".")
        out.setdefault(owner, {})[attribute] = tensor
    return out


def largest_numel(state_dict):
    """The number of values of the largest tensor of ``state_dict`` (0 for an empty one)."""
    return max((t.numel() for t in state_dict.values()), default=0)


def check_layers(layers, state_dict):
    """``[(name, kind, kwargs)]`` of :func:`~l0bayes.pruning.describe.describe_pruned`'s list, every entry
    checked against the tensors of ``state_dict``.

    Every layer has an allowed name (:func:`check_child_name`), given once; every tensor of ``state_dict``
    belongs to a layer of the list; ``kwargs`` are the checked constructor arguments (:func:`layer_kwargs`).

    :raises TypeError: when ``layers`` is not a list, or for an entry or argument of the wrong type.
    :raises ValueError: naming the layer, for an unknown layer type, a name that is not allowed, an argument
        out of its range or a size that disagrees with the tensors.
    """
    if not isinstance(layers, list):
        raise TypeError(f"layers is a {type(layers).__name__}, not a list of {{'name', 'type', 'args'}} dicts")
    tensors = tensors_by_owner(state_dict)
    check_entry_count("layers", layers, state_dict)
    largest = largest_numel(state_dict)
    out, names = [], set()
    for k, spec in enumerate(layers):
        name, kind, args = description_entry(spec, k, "layer")
        where = f"layer {name!r}"
        check_child_name(where, name)
        if name in names:
            raise ValueError(f"{where} is described twice")
        names.add(name)
        args = layer_arguments(where, kind, args)
        out.append((name, kind, layer_kwargs(f"{where} ({kind})", kind, args, tensors.get(name, {}), largest)))
    stray = [f"{owner}.{key}" for owner in tensors if owner not in names for key in tensors[owner]]
    if stray:
        raise ValueError(f"the state dict holds {', '.join(map(repr, stray[:5]))}, which no layer of the file has")
    return out


def check_modules(modules, state_dict):
    """Check the layers of :func:`~l0bayes.pruning.describe.describe_modules`' list against ``state_dict``.

    Its entry count, and every entry of :data:`~l0bayes.pruning.describe.LAYER_TYPES` as
    :func:`~l0bayes.pruning.build.build_into` checks it: the list comes from a model, not from a file, so
    its structure (dicts of ``name``, ``type``, ``args``) is taken as it is; what the model does not hold
    (its own modules, which loading finds in a fresh instance) is not checked here.

    :raises TypeError: naming the module, for an argument of the wrong type.
    :raises ValueError: naming the module, for an argument out of its range or a size that disagrees with
        the tensors, and for more entries than the file may hold.
    """
    tensors, largest = tensors_by_owner(state_dict), largest_numel(state_dict)
    check_entry_count("modules", modules, state_dict)
    for spec in modules:
        where = f"module {spec['name']!r} ({spec['type']})"
        if spec["type"] in LAYER_TYPES:
            layer_kwargs(where, spec["type"], spec["args"], tensors.get(spec["name"], {}), largest)
        elif spec["type"] in TRANSFORMER_TYPES:
            transformer_kwargs(where, spec["type"], spec["args"], tensors, spec["name"], state_dict)
