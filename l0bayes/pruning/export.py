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
import re

import torch
from torch import nn

from ..io import CheckpointError, load_checkpoint, save_checkpoint
from .select import SelectFeatures

__all__ = [
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
LAYER_TYPES = {
    "Linear": (nn.Linear, ("in_features", "out_features", "bias")),
    "Conv2d": (
        nn.Conv2d,
        ("in_channels", "out_channels", "kernel_size", "stride", "padding", "dilation", "bias", "padding_mode"),
    ),
    "SelectFeatures": (SelectFeatures, ("index", "num_inputs", "dim")),
    "BatchNorm1d": (nn.BatchNorm1d, ("num_features", "eps", "momentum", "affine", "track_running_stats")),
    "BatchNorm2d": (nn.BatchNorm2d, ("num_features", "eps", "momentum", "affine", "track_running_stats")),
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
    if kind == "Conv2d" and layer.groups != 1:
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


def _build_layer(spec, k):
    """``(name, layer)`` from one ``{"name", "type", "args"}`` of :data:`LAYER_TYPES` (``k``: its position)."""
    try:
        name, kind, args = spec["name"], spec["type"], dict(spec["args"])
    except (TypeError, KeyError) as err:
        raise ValueError(f"layer {k} of the description is malformed: {spec!r}") from err
    if kind not in LAYER_TYPES:
        raise ValueError(f"layer {name!r} has type {kind!r}, not one of the allowed {', '.join(LAYER_TYPES)}")
    cls, keys = LAYER_TYPES[kind]
    args = {**_OPTIONAL_ARGS.get(kind, {}), **args}
    if set(args) != set(keys):
        raise ValueError(f"layer {name!r} ({kind}) has arguments {sorted(args)}, expected {sorted(keys)}")
    if kind == "SelectFeatures":
        args["index"] = torch.zeros(int(args["index"]), dtype=torch.long)
    args = {key: tuple(v) if isinstance(v, list) else v for key, v in args.items()}
    try:
        if kind in ("Linear", "Conv2d"):
            return name, nn.utils.skip_init(cls, **args)  # the values come from the state dict
        return name, cls(**args)
    except (TypeError, ValueError, RuntimeError) as err:
        raise ValueError(f"layer {name!r} ({kind}) cannot be built from {spec['args']!r}: {err}") from err


def _load_state(module, state_dict):
    try:
        module.load_state_dict(state_dict, strict=True, assign=True)
    except (RuntimeError, TypeError) as err:
        raise ValueError(f"the state dict does not fit the described layers: {str(err).splitlines()[0]}") from err


def build_pruned(layers, state_dict):
    """An ``nn.Sequential`` (``eval()`` mode) from :func:`describe_pruned`'s list and a state dict.

    Tensors keep the dtype they were saved with. Raises ``ValueError`` for an unknown layer type or
    malformed arguments, and for a state dict that does not fit the layers.
    """
    from collections import OrderedDict

    module = nn.Sequential(OrderedDict(_build_layer(spec, k) for k, spec in enumerate(layers)))
    _load_state(module, state_dict)
    return module.eval()


def _fresh(model, model_class):
    """The instance ``model`` is, or builds (a class or a function without arguments)."""
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


def _set_module(root, name, layer):
    parent_name, _, child = name.rpartition(".")
    try:
        parent = root.get_submodule(parent_name) if parent_name else root
    except AttributeError as err:
        raise ValueError(f"the model has no module {parent_name!r}, which the file's {name!r} belongs to") from err
    setattr(parent, child, layer)


def build_into(model, modules, state_dict):
    """``model`` (a fresh instance of the saved class) with :func:`describe_modules`'s layers and the tensors.

    Every layer of :data:`LAYER_TYPES` in ``modules`` replaces the module of that name (so it takes the
    pruned size), an ``nn.Sequential`` the file holds where the model has another module (a linear layer
    that became ``SelectFeatures -> Linear``) is put in its place, and a module of another class must be
    in the model already, of the same class. Returns ``model`` in ``eval()`` mode.

    :raises ValueError: naming the module, when the model does not have the saved structure, and for a
        state dict that does not fit.
    """
    from collections import OrderedDict

    if not isinstance(modules, list):
        raise ValueError(f"the description of the modules is a {type(modules).__name__}, not a list")
    for k, spec in enumerate(modules):
        name, kind, args = _module_spec(spec, k)
        if kind == "module":
            try:
                existing = model.get_submodule(name)
            except AttributeError:
                existing = None
            if existing is None or type(existing).__qualname__ != args.get("class"):
                found = "nothing" if existing is None else f"a {type(existing).__qualname__}"
                raise ValueError(f"module {name!r} of the file is a {args.get('class')}, the model has {found} there")
        elif kind == "Sequential":
            children = args["children"]
            existing = model.get_submodule(name) if _has(model, name) else None
            if type(existing) is not nn.Sequential or [n for n, _ in existing.named_children()] != children:
                # placeholders: every child is described after its parent and replaces its placeholder
                _set_module(model, name, nn.Sequential(OrderedDict((c, nn.Identity()) for c in children)))
        else:
            _set_module(model, *_build_layer(spec, k))
    saved = {spec["name"] for spec in modules}
    extra = [n for n, _ in model.named_modules() if n and n not in saved]
    if extra:
        raise ValueError(f"the model has modules the pruned one did not: {extra[:5]}")
    _load_state(model, state_dict)
    return model.eval()


_NAME = re.compile(r"\w+(\.\w+)*")


def _module_spec(spec, k):
    """``(name, type, args)`` of entry ``k`` of :func:`describe_modules`'s list, checked.

    A name is dotted words (no attribute of the model beyond its sub-modules can be reached), a
    ``Sequential`` lists its children's names, a ``module`` its class name.
    """
    try:
        name, kind, args = spec["name"], spec["type"], spec["args"]
    except (TypeError, KeyError) as err:
        raise ValueError(f"module {k} of the description is malformed: {spec!r}") from err
    ok = isinstance(name, str) and _NAME.fullmatch(name) and "__" not in name and isinstance(args, dict)
    if ok and kind == "Sequential":
        children = args.get("children")
        ok = isinstance(children, list) and all(isinstance(c, str) and re.fullmatch(r"\w+", c) for c in children)
    elif ok and kind == "module":
        ok = isinstance(args.get("class"), str)
    if not ok:
        raise ValueError(f"module {k} of the description is malformed: {spec!r}")
    return name, kind, args


def _has(root, name):
    try:
        root.get_submodule(name)
    except AttributeError:
        return False
    return True


def save_pruned(module, path, metadata=None):
    """Write a pruned network and ``metadata`` to ``path`` (atomically; see the module docstring).

    :param module: the output of :func:`~l0bayes.pruning.prune.prune`: an ``nn.Sequential`` of allow-listed
        layers (or a subclass with ``nn.Sequential``'s ``forward``; it loads back as an ``nn.Sequential``),
        or a model of your own class (a pruned model of :func:`~l0bayes.pruning.sparsify`), whose
        resized layers must be allow-listed (``nn.Linear``, ``nn.Conv2d``, batch norms, ...); load the
        latter with ``load_pruned(path, model=YourClass)``.
    :param path: the file to write; its directory must exist.
    :param dict metadata: tensors and plain values (``dict``, ``list``, ``str``, numbers, ``None``) stored
        beside the network, e.g. the input shape and the scalers of the data.
    :raises TypeError: naming the layer, for a grouped convolution or (in an ``nn.Sequential``) a layer
        outside :data:`LAYER_TYPES`.
    """
    state = {"format": FORMAT}
    if isinstance(module, nn.Sequential) and type(module).forward is nn.Sequential.forward:
        state.update(version=VERSION, layers=describe_pruned(module))
    else:
        state.update(version=MODULES_VERSION, model_class=type(module).__qualname__, modules=describe_modules(module))
    state["state_dict"] = {k: v.detach().cpu() for k, v in module.state_dict().items()}
    state["metadata"] = dict(metadata or {})
    save_checkpoint(path, state)


def load_pruned(path, map_location="cpu", model=None):
    """Read a file of :func:`save_pruned` safely: returns ``(module, metadata)``, the module in ``eval()`` mode.

    Loads with ``torch.load(weights_only=True)``; nothing in the file names code to run.

    :param model: for a file holding a model of your own class: a fresh instance of that class (changed in
        place and returned), or the class or a function without arguments that builds one. Its layers
        are replaced by ones of the pruned sizes, then the tensors are loaded. ``None`` for an
        ``nn.Sequential``, which is rebuilt from the file alone.
    :raises FileNotFoundError: when ``path`` does not exist.
    :raises ValueError: naming the file when it is corrupt, holds anything but tensors and plain containers
        (a pickle that would run code), is not a pruned-model file, or describes a layer outside
        :data:`LAYER_TYPES`; when a model of your own class is not passed ``model=`` (or one of another
        class or structure).
    """
    state = load_checkpoint(path, map_location=map_location, required=("format", "state_dict"))
    version = state.get("version")
    if state["format"] != FORMAT or version not in (VERSION, MODULES_VERSION):
        raise CheckpointError(f"{path!r} is not an l0bayes pruned model (format {state['format']!r})")
    try:
        if version == VERSION:
            if model is not None:
                raise ValueError("the file holds an nn.Sequential, which loads without model=")
            module = build_pruned(state["layers"], state["state_dict"])
        else:
            instance = _fresh(model, state["model_class"])
            module = build_into(instance, state["modules"], state["state_dict"])
    except KeyError as err:
        raise CheckpointError(f"{path!r} lacks {err} and is not a complete pruned-model file") from None
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
