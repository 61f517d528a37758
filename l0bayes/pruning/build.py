"""Building the layers a pruned-model file describes: an ``nn.Sequential``, or the layers of your own model.

:func:`build_pruned` makes an ``nn.Sequential`` from :func:`~l0bayes.pruning.describe.describe_pruned`'s
list; :func:`build_into` puts the layers of :func:`~l0bayes.pruning.describe.describe_modules`' list into
a fresh instance of your class. Both check the whole description first
(:mod:`~l0bayes.pruning.file_checks`), build every layer on the meta device and give it the file's
tensors, so that nothing is allocated beyond them; a model passed in is changed only once all of the
file fits it.
"""

import copy
import re
import warnings
from collections import OrderedDict

import torch
from torch import nn

from .describe import LAYER_TYPES, TRANSFORMER_TYPES
from .file_checks import (
    check_child_name,
    check_entry_count,
    check_layers,
    description_entry,
    largest_numel,
    layer_arguments,
    layer_kwargs,
    module_extras,
    short_repr,
    tensors_by_owner,
    transformer_kwargs,
)
from .transformer.attention import PrunedMultiheadAttention, PrunedTransformerEncoderLayer, ZeroBranch
from .transformer.projections import is_conv1d

__all__ = ["build_into", "build_pruned"]


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


def build_pruned(layers, state_dict):
    """An ``nn.Sequential`` (``eval()`` mode) from :func:`~l0bayes.pruning.describe.describe_pruned`'s list and a
    state dict.

    Every argument is checked, every size against the tensors (see :func:`~l0bayes.pruning.export.load_pruned`);
    the layers are built without allocating and take the tensors as they are, with their dtype.

    :raises TypeError: when ``layers`` is not a list of ``{"name", "type", "args"}`` dicts, ``state_dict``
        not a dict of tensors, or an entry or argument has the wrong type.
    :raises ValueError: naming the layer, for an unknown layer type, a name that is not allowed, an argument
        out of its range or a size that disagrees with the tensors, and for a state dict that does not fit.
    """
    layers = check_layers(layers, state_dict)
    module = nn.Sequential(
        OrderedDict((name, _construct(f"layer {name!r} ({kind})", kind, kw)) for name, kind, kw in layers)
    )
    _load_state(module, state_dict)
    return module.eval()


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


def _place(model, twin, modules, state_dict):
    """Put the file's layers into ``twin``, the twin of ``model`` (see :func:`build_into`); checks every entry
    first."""
    tensors, largest = tensors_by_owner(state_dict), largest_numel(state_dict)
    placeholders, names, resized = set(), set(), []
    for k, spec in enumerate(modules):
        name, kind, args = description_entry(spec, k, "module")
        where = f"module {name!r}"
        if not all(re.fullmatch(r"\w+", part) for part in name.split(".")):
            raise ValueError(f"{where}: the name {short_repr(name)} is not a dotted name of modules")
        if name in names:
            raise ValueError(f"{where} is described twice")
        names.add(name)
        parent, child, existing = _locate(twin, name)
        placeholder = id(existing) in placeholders
        if kind == "module":
            attributes, length = module_extras(where, args)
            if placeholder or type(existing).__qualname__ != args["class"]:
                found = "nothing" if placeholder else f"a {type(existing).__qualname__}"
                raise ValueError(f"module {name!r} of the file is a {args['class']}, the model has {found} there")
            changed = _set_attributes(where, existing, attributes)
            if changed:
                resized.append((name, where, changed))
            if length is not None:
                _shorten(where, existing, length)
        elif kind in TRANSFORMER_TYPES:
            kwargs = transformer_kwargs(f"{where} ({kind})", kind, args, tensors, name, state_dict)
            if kind == "ZeroBranch":  # a removed branch: it takes the place of whatever module was there
                placeholders.discard(id(existing))
                parent._modules[child] = ZeroBranch(**kwargs)
            elif kind == "Conv1D":
                _resize_conv1d(where, existing, placeholder, kwargs, tensors[name])
            else:
                parent._modules[child] = _pruned_torch_layer(where, kind, existing, placeholder, kwargs)
                if kind == "PrunedMultiheadAttention":  # its projections are described next
                    placeholders.update(id(m) for m in parent._modules[child].children())
        elif kind == "Sequential":
            children = args.get("children") if set(args) == {"children"} else None
            if not isinstance(children, list) or not all(isinstance(c, str) for c in children):
                raise ValueError(
                    f"{where} (Sequential): its args must be {{'children': [names]}}, got {short_repr(args)}"
                )
            if type(existing) is nn.Sequential and list(existing._modules) == children:
                continue  # the model's own Sequential: its children are described next
            if not (placeholder or type(existing) in (nn.Sequential, nn.Linear)):
                raise ValueError(f"{where}: the file has a Sequential where the model has a {type(existing).__name__}")
            if len(set(children)) != len(children):
                raise ValueError(f"{where} (Sequential): its children {short_repr(children)} repeat a name")
            for c in children:
                check_child_name(f"{where} (Sequential)", c)
            if len(children) > len(modules) - k - 1:  # every child is described after its parent
                raise ValueError(f"{where} (Sequential): it has {len(children)} children, the file describes fewer")
            new = nn.Sequential(OrderedDict((c, nn.Identity()) for c in children))  # every child is described next
            placeholders.update(id(m) for m in new)
            parent._modules[child] = new
        else:
            args = layer_arguments(where, kind, args)
            if not (placeholder or type(existing) is LAYER_TYPES[kind][0]):
                raise ValueError(f"{where}: the file has a {kind} where the model has a {type(existing).__name__}")
            kwargs = layer_kwargs(f"{where} ({kind})", kind, args, tensors.get(name, {}), largest)
            layer = _construct(f"{where} ({kind})", kind, kwargs)
            placeholders.discard(id(existing))
            parent._modules[child] = layer
    missing = [n for n, m in twin.named_modules() if n and (n not in names or id(m) in placeholders)]
    if missing:
        raise ValueError(f"the model has modules the file does not describe: {missing[:5]}")
    for name, where, changed in resized:
        _check_share(where, changed, name, _locate(model, name)[2], tensors)


#: What torch's transformer layers become when pruned: the file's type -> the model's layer it replaces.
_PRUNED_TORCH = {
    "PrunedMultiheadAttention": nn.MultiheadAttention,
    "PrunedTransformerEncoderLayer": nn.TransformerEncoderLayer,
}


def _pruned_torch_layer(where, kind, existing, placeholder, kwargs):
    """The pruned form of a torch transformer layer of the model's twin: a
    :class:`~l0bayes.pruning.transformer.PrunedMultiheadAttention` of the file's sizes (its projections on the meta
    device, which the file's ``Linear`` entries replace), or a
    :class:`~l0bayes.pruning.transformer.PrunedTransformerEncoderLayer` around the model's layer (its norms, dropouts
    and activation; its attention and MLP layers are described next)."""
    replaced = _PRUNED_TORCH[kind]
    if placeholder or type(existing) is not replaced:
        found = _found(existing, placeholder)
        raise ValueError(f"{where}: the file has a {kind} (a pruned {replaced.__name__}) where the model has {found}")
    if kind == "PrunedTransformerEncoderLayer":
        return PrunedTransformerEncoderLayer(existing, existing.self_attn, kwargs["feed_forward"])
    with torch.device("meta"):
        return PrunedMultiheadAttention(**kwargs)


def _found(module, placeholder):
    """What an error says the model has where the file describes a layer: ``"nothing"`` for a placeholder (a
    child the file's own entries were to fill), else ``"a <class>"``."""
    return "nothing" if placeholder else f"a {type(module).__name__}"


def _set_attributes(where, module, attributes):
    """Set the ``attributes`` of a module of the model's twin (each an int attribute of it, at most its value in the
    fresh model: pruning only lowers them); returns ``{attribute: (file's value, model's value)}`` of those that
    change."""
    changed = {}
    for key, value in attributes.items():
        fresh = module.__dict__.get(key)
        if type(fresh) is not int:
            raise ValueError(f"{where}: the model's {type(module).__name__} has no int attribute {key!r} to set")
        if value > fresh:
            raise ValueError(f"{where}: {key} = {value} is more than the model's {fresh} (pruning only lowers it)")
        if value != fresh:
            changed[key] = (value, fresh)
            module.__dict__[key] = value
    return changed


def _shorten(where, module, length):
    """Keep the first ``length`` blocks of an ``nn.ModuleList`` of the model's twin (a pruned transformer's kept
    blocks, which move up their list)."""
    if type(module) is not nn.ModuleList:
        raise ValueError(f"{where}: a length is given, but the model's {type(module).__name__} is no nn.ModuleList")
    if length > len(module):
        raise ValueError(f"{where}: length = {length} is more than the model's {len(module)} blocks")
    for key in list(module._modules)[length:]:
        del module._modules[key]


def _resize_conv1d(where, module, placeholder, kwargs, tensors):
    """Give Hugging Face's ``Conv1D`` of the model's twin the file's sizes: ``nf`` (and ``nx``), and parameters
    on the meta device that the file's tensors replace."""
    if placeholder or not is_conv1d(module):
        found = _found(module, placeholder)
        raise ValueError(f"{where}: the file has a Conv1D where the model has {found}")
    nf, nx = kwargs["nf"], kwargs["nx"]
    for key, shape in (("weight", (nx, nf)), ("bias", (nf,))):
        module._parameters[key] = nn.Parameter(torch.empty(shape, device="meta", dtype=tensors[key].dtype))
    module.__dict__["nf"] = nf
    if type(module.__dict__.get("nx")) is int:
        module.__dict__["nx"] = nx


def _check_share(where, changed, name, fresh, tensors):
    """A module whose head count (and widths) the file lowers: every attribute keeps the same share of the fresh
    model's value, and so does every dimension of its layers' tensors that the file resizes."""
    (first, (v0, f0)), *others = changed.items()
    for key, (v, f) in others:
        if v * f0 != v0 * f:
            raise ValueError(
                f"{where}: {key} = {v} of the model's {f} and {first} = {v0} of {f0} do not keep the same share"
            )
    count = 0
    for child, layer in fresh.named_children():
        for attribute, parameter in layer.named_parameters(recurse=False):
            tensor = tensors.get(f"{name}.{child}", {}).get(attribute)
            if tensor is None or tensor.dim() != parameter.dim():
                continue
            for new, old in zip(tensor.shape, parameter.shape, strict=True):
                if new != old:
                    count += 1
                    if new * f0 != old * v0:
                        raise ValueError(
                            f"{where}: {first} = {v0} of the model's {f0} does not fit the file's tensors: "
                            f"{name}.{child}.{attribute} keeps {new} of {old}"
                        )
    if not count:
        raise ValueError(f"{where}: {first} = {v0} of the model's {f0}, but the file resizes none of its layers")


def build_into(model, modules, state_dict):
    """``model`` (a fresh instance of the saved class) with the layers of
    :func:`~l0bayes.pruning.describe.describe_modules`' list and the tensors.

    Every layer of :data:`~l0bayes.pruning.describe.LAYER_TYPES` in ``modules`` replaces the module of that name
    and type (so it takes the pruned size), an ``nn.Sequential`` the file holds where the model has a linear
    layer (one that became ``SelectFeatures -> Linear``) is put in its place, and a module of another class
    must be in the model already, of the same class. Names are found among the model's modules only (never its
    other attributes). Nothing of ``model`` changes unless all of it fits: the layers are put into a copy of its
    tree of modules that shares its tensors, the tensors are loaded there, and only then is ``model`` given the
    result. Returns ``model`` in ``eval()`` mode.

    :raises TypeError: for entries or arguments of the wrong type.
    :raises ValueError: naming the module, when the model does not have the saved structure, for a size that
        disagrees with the tensors, and for a state dict that does not fit.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
    if not isinstance(modules, list):
        raise TypeError(f"modules is a {type(modules).__name__}, not a list of {{'name', 'type', 'args'}} dicts")
    tensors_by_owner(state_dict)  # checks its keys and tensors first
    check_entry_count("modules", modules, state_dict)
    twin, pairs = _twin_tree(model)
    _place(model, twin, modules, state_dict)
    _load_state(twin, state_dict)
    twin.eval()
    _commit(pairs)
    return model
