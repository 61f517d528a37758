"""Saving and loading a pruned network without pickling code: a state dict plus a description of its layers.

:func:`~l0bayes.pruning.prune.prune` returns either a plain ``nn.Sequential`` (a network of L0 layers such as
:class:`~l0bayes.nn.L0MLP`) or, for a model of :func:`~l0bayes.pruning.sparsify`, the model's own class with
smaller layers (and a ``nn.Sequential(SelectFeatures, nn.Linear)`` where a linear layer's closed inputs
stay in use elsewhere). :func:`save_pruned` writes either as a ``dict`` holding only tensors and plain
containers:

* ``"layers"`` (an ``nn.Sequential``): one ``{"name", "type", "args"}`` per layer, ``type`` a name from
  :data:`~l0bayes.pruning.describe.LAYER_TYPES` and ``args`` its constructor arguments (numbers, booleans,
  strings, lists; see :mod:`~l0bayes.pruning.describe`);
* ``"modules"`` (a model of your own class, named in ``"model_class"``): the same for every sub-module
  by its dotted name, where ``type`` is a name from :data:`LAYER_TYPES`, ``"Sequential"`` (with its
  children's names) or ``"module"`` (a module of your own code, with its class name): the layers that
  pruning resizes are all in :data:`LAYER_TYPES`, your own modules keep their code; a pruned transformer
  adds ``"ZeroBranch"`` (a removed branch) and ``"Conv1D"`` (Hugging Face's) entries, the head counts and
  widths of its attention modules (a ``"module"``'s ``"attributes"``, names from
  :data:`~l0bayes.pruning.describe.PRUNED_ATTRIBUTES`) and the length of its lists of blocks (``"length"``);
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

import os
from collections import OrderedDict

import torch
from torch import nn

from ..io import CheckpointError, CheckpointTypeError, load_checkpoint, save_checkpoint
from .build import build_into, build_pruned
from .describe import describe_modules, describe_pruned
from .file_checks import INT_LIMIT, check_layers, check_modules, short_repr

__all__ = ["load_pruned", "save_pruned"]

FORMAT = "l0bayes.pruned"
VERSION = 1  # an nn.Sequential ("layers")
MODULES_VERSION = 2  # a model of the caller's class ("modules", "model_class")


def _fresh(model, model_class):
    """The instance ``model`` is, or builds (a class or a function without arguments)."""
    if not isinstance(model_class, str):
        raise TypeError(f"model_class must be a str (a class name), got {short_repr(model_class)}")
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
                            f"{where} has the key {short_repr(key)}: keys must be str, int, float, bool or None"
                        )
                    stack.append((item, f"{where}[{key!r}]", inner))
            else:
                stack.extend((item, f"{where}[{i}]", inner) for i, item in enumerate(value))
            continue
        kind = f"{type(value).__module__}.{type(value).__qualname__}"
        raise TypeError(
            f"{where} is a {kind} ({short_repr(value)}), which cannot be saved: metadata holds tensors and plain "
            "values (dict, list, tuple, str, int, float, complex, bool, None)"
        )
    return dict(metadata)


def _example_shape(metadata):
    """The shape of one example that ``metadata`` records (``"input_shape"``, without the batch dimension), or
    ``None``; a ``TypeError`` or ``ValueError`` for a value that is no shape."""
    shape = metadata.get("input_shape")
    if shape is None:
        return None
    sides = [shape] if type(shape) is int else shape
    wanted = f"the shape of one example (an int or a list of 1 to 63 ints in [1, {INT_LIMIT}]), got {short_repr(shape)}"
    if not isinstance(sides, (list, tuple)) or any(type(s) is not int for s in sides):
        raise TypeError(f"metadata['input_shape'] must be {wanted}")
    if not 1 <= len(sides) <= 63 or not all(1 <= s <= INT_LIMIT for s in sides):
        raise ValueError(f"metadata['input_shape'] must be {wanted}")
    return tuple(sides)


def _check_shapes(module, shape):
    """Run the layers of an ``nn.Sequential`` on the meta device (nothing is computed or allocated) on two examples
    of ``shape``, of the dtype of its first floating-point tensor: a ``ValueError`` names the first layer that cannot
    run on what it receives (a pooling window or a dilated kernel larger than its padded input, a linear layer's
    in_features, a dimension to flatten, another dtype)."""
    tensors = [t for t in [*module.parameters(), *module.buffers()] if t.is_floating_point()]
    x = torch.empty((2, *shape), device="meta", dtype=tensors[0].dtype if tensors else None)
    for name, layer in module.named_children():
        tensors = {key: t.to("meta") for key, t in [*layer.named_parameters(), *layer.named_buffers()]}
        try:
            with torch.no_grad():
                y = torch.func.functional_call(layer, tensors, (x,))
        except Exception as err:  # noqa: BLE001 - whatever torch raises for a layer that does not fit its input
            reason = next((line.strip() for line in str(err).splitlines() if line.strip()), type(err).__name__)
            raise ValueError(
                f"layer {name!r} ({type(layer).__name__}) cannot run on what it receives from an input of the shape "
                f"that the metadata records (input_shape {list(shape)}): {list(x.shape[1:])} per example, "
                f"{str(x.dtype).removeprefix('torch.')} ({reason})"
            ) from None
        x = y


def save_pruned(module, path, metadata=None):
    """Write a pruned network and ``metadata`` to ``path`` (atomically; see the module docstring).

    Everything is checked before anything is written: the layers against what :func:`load_pruned` accepts
    (so every file written loads back) and ``metadata``'s values. An existing file at ``path`` is replaced
    in one step; a failed save leaves it as it was and no partial file behind.

    :param module: the output of :func:`~l0bayes.pruning.prune.prune`: an ``nn.Sequential`` of allow-listed
        layers (or a subclass with ``nn.Sequential``'s ``forward``; it loads back as an ``nn.Sequential``),
        or a model of your own class (a pruned model of :func:`~l0bayes.pruning.sparsify`), whose
        resized layers must be allow-listed (``nn.Linear``, ``nn.Conv1d/2d/3d``, batch norms, ...); load the
        latter with ``load_pruned(path, model=YourClass)``. A pruned transformer of different sizes per block
        (of :func:`~l0bayes.pruning.sparsify_transformer`) is such a model: load it with ``model=`` a fresh
        model built from the original config.
    :param path: the file to write; its directory must exist.
    :param dict metadata: tensors and plain values (``dict``, ``list``, ``tuple``, ``str``, numbers,
        ``None``) stored beside the network, e.g. the input shape and the scalers of the data.
    :raises TypeError: when ``module`` is not an ``nn.Module``; naming the key, for an entry of ``metadata``
        of another type (a function, a NumPy value: convert it with ``float()``, ``.tolist()`` or
        ``torch.as_tensor``); naming the layer, for (in an ``nn.Sequential``) a layer outside
        :data:`LAYER_TYPES`.
    :raises ValueError: naming the layer, for one that :func:`load_pruned` would refuse (a name it does not
        allow, an argument outside its range, a layer of an ``nn.Sequential`` that cannot run on an input of the
        shape ``metadata["input_shape"]`` records); naming ``metadata['input_shape']`` (a ``TypeError`` for a value
        of the wrong type) when it is not the shape of one example.
    """
    if not isinstance(module, nn.Module):
        raise TypeError(f"module must be an nn.Module (the output of prune()), got {type(module).__name__}")
    metadata = _check_metadata(metadata)
    state = {"format": FORMAT}
    state_dict = {k: v.detach().cpu() for k, v in module.state_dict().items()}
    if isinstance(module, nn.Sequential) and type(module).forward is nn.Sequential.forward:
        state.update(version=VERSION, layers=describe_pruned(module))
        check_layers(state["layers"], state_dict)
        shape = _example_shape(metadata)
        if shape is not None:
            _check_shapes(module, shape)
    else:
        state.update(version=MODULES_VERSION, model_class=type(module).__qualname__, modules=describe_modules(module))
        check_modules(state["modules"], state_dict)
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
    index's); an integer that sizes no tensor is at most :data:`~l0bayes.pruning.file_checks.INT_LIMIT`, a
    convolution's padding at most the kernel's reach, an adaptive pooling's output no larger than the file's
    largest tensor; names are found among the modules only. In a pruned transformer, a head count or width
    (:data:`~l0bayes.pruning.describe.PRUNED_ATTRIBUTES`) is at most the fresh model's, and lowered by the same
    share as every resized dimension of the attention's layers; a ``ZeroBranch``'s width is at most the file's
    widest tensor dimension; a list of blocks is no longer than the model's. Where the metadata records the shape of
    one example (``"input_shape"``: an int or a list of ints, without the batch dimension), an ``nn.Sequential``'s
    layers are run on it on the meta device (nothing is computed): each must run on what it receives, e.g. a
    pooling window or a dilated kernel no larger than its padded input.

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
        raise CheckpointError(f"{path!r} is not an l0bayes pruned model (format {short_repr(state['format'])})")
    if type(version) is not int or version not in _KEYS:
        raise CheckpointError(f"{path!r} is a pruned model of version {short_repr(version)}, not one of {list(_KEYS)}")
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
            shape = _example_shape(metadata)
            if shape is not None:
                _check_shapes(module, shape)
        else:
            module = build_into(_fresh(model, state["model_class"]), state["modules"], state["state_dict"])
    except TypeError as err:
        raise CheckpointTypeError(f"{path!r}: {err}") from None
    except ValueError as err:
        raise CheckpointError(f"{path!r}: {err}") from None
    return module, metadata
