"""Clear errors before the first step for data a model cannot train on (:func:`~l0bayes.inference.train`).

The checks run on tensors in memory before the first step, and on every batch of an iterable (a
``DataLoader``) as it streams, before the step that uses it (:class:`DataCheck`).
"""

import re

import torch
from torch import nn

from ..nn.layers import L0Conv2d, L0Linear
from ..utils import all_finite

__all__ = ["DataCheck", "check_data"]


def check_data(model, x, y, names):
    """Clear errors, before the first step, for data the model cannot train on; returns ``(x, y)`` to train on.

    Integer labels of a classifier become ``int64`` and integer responses of a regression the model's dtype
    (the data are otherwise used as given: ``x`` must have the dtype of the model's parameters, or be integer
    token ids for a model with an ``nn.Embedding``).

    :param names: the arguments' names for the messages, ``("x", "y")`` or ``("test_data[0]", "test_data[1]")``.
    """
    return DataCheck(model)(x, y, names)


class DataCheck:
    """:func:`check_data` with what it reads of the model (its dtype, first layer, targets) read once.

    ``DataCheck(model)(x, y, names)`` checks one pair of tensors, e.g. every batch of an iterable as it
    streams: a few reductions over the batch (its minimum and maximum), no copy of it. With ``values=False``
    only what the tensors' shapes and dtypes say is checked: nothing is read back from the device (for batches
    already on an accelerator, where a read every step would stall it).
    """

    def __init__(self, model):
        self.owner = type(model).__name__
        self.dtype = next((p.dtype for p in model.parameters() if p.is_floating_point()), None)
        self.reads_tokens = _reads_tokens(model)
        self.num_features = getattr(model, "num_features", None)
        self.first = _first_layer(getattr(model, "net", model)) if self.num_features is None else None
        self.target_type = getattr(model, "target_type", None)
        self.num_classes = getattr(model, "num_classes", None)

    def __call__(self, x, y, names, values=True):
        xn, yn = names
        if not torch.is_tensor(x) or not torch.is_tensor(y):
            kinds = ", ".join(type(v).__name__ for v in (x, y))
            raise TypeError(f"{xn} and {yn} must be torch tensors, got {kinds}")
        if x.dim() < 2:
            raise ValueError(f"{xn} must have one row per example, shape (num_data, ...), got shape {tuple(x.shape)}")
        if x.shape[0] == 0:
            raise ValueError(f"{xn} has no rows: the data are empty")
        if y.dim() == 0 or y.shape[0] != x.shape[0]:
            rows = y.shape[0] if y.dim() else "none (a scalar)"
            raise ValueError(f"{xn} has {x.shape[0]} rows but {yn} has {rows}")
        dtype = self.dtype
        tokens = not x.is_floating_point() and not x.is_complex() and self.reads_tokens
        if dtype is not None and x.dtype != dtype and not tokens:
            raise TypeError(
                f"{xn} has dtype {x.dtype} but the model's parameters are {dtype}: {_conversion(xn, x, dtype)}"
            )
        self._check_features(x, xn)
        if values and not all_finite(x):
            raise ValueError(f"{xn} contains NaN or infinite values")
        return x, self._check_targets(x, y, names, values)

    def _check_features(self, x, xn):
        """``x`` fits the model's first layer: a regression's ``num_features``, a sequential network's first layer."""
        num_features = self.num_features
        if num_features is not None:
            if x.dim() != 2 or x.shape[1] != num_features:
                raise ValueError(
                    f"{xn} must have shape (num_data, {num_features}) for {self.owner}(num_features="
                    f"{num_features}), got {tuple(x.shape)}"
                )
            return
        if self.first is None:
            return
        name, layer, flattens = self.first
        kind = f"layer {name} ({type(layer).__name__})"
        if hasattr(layer, "in_features"):
            size = x[0].numel() if flattens else x.shape[-1]
            if size != layer.in_features:
                what = f"{size} features" if x.dim() == 2 else f"{size} values per example (shape {tuple(x.shape)})"
                raise ValueError(f"{xn} has {what}, but {kind} takes in_features={layer.in_features}")
        elif x.dim() != 4 or x.shape[1] != layer.in_channels:
            raise ValueError(
                f"{xn} must have shape (num_data, {layer.in_channels}, height, width) for {kind} with in_channels="
                f"{layer.in_channels}, got {tuple(x.shape)}"
            )

    def _check_targets(self, x, y, names, values=True):
        """The targets the model's ``target_type`` asks for (the data are on the model's terms after this).

        ``"classes"``: integer labels in ``[0, num_classes)`` (as ``int64``); ``"binary"``: 0 or 1; ``"real"``:
        real or integer responses (as the model's dtype). A model without ``target_type``: labels in
        ``[0, num_classes)`` when it has ``num_classes`` and they are integers, else no check.
        """
        xn, yn = names
        kind, owner, num_classes = self.target_type, self.owner, self.num_classes
        if kind is not None and y.shape != x.shape[:1]:
            raise ValueError(f"{yn} must have shape ({x.shape[0]},), one target per row of {xn}, got {tuple(y.shape)}")
        if values and y.is_floating_point() and not all_finite(y):
            raise ValueError(f"{yn} contains NaN or infinite values")
        integer = not (y.is_floating_point() or y.is_complex() or y.dtype == torch.bool)
        if kind == "classes" and not integer:
            limit = f"[0, {num_classes})" if num_classes is not None else ">= 0"
            raise TypeError(f"{yn} has dtype {y.dtype}, but {owner} needs integer class labels in {limit}")
        if (kind == "classes" or (kind is None and integer and num_classes is not None)) and not values:
            return y.long() if kind == "classes" else y
        if kind == "classes" or (kind is None and integer and num_classes is not None):
            low, high = (int(v) for v in torch.aminmax(y))
            if low < 0 or (num_classes is not None and high >= num_classes):
                limit = f"[0, {num_classes})" if num_classes is not None else "[0, ...)"
                raise ValueError(f"{yn}: class labels must lie in {limit}, got range [{low}, {high}]")
            return y.long() if kind == "classes" else y
        if kind == "binary" and values:
            if not bool(((y == 0) | (y == 1)).all()):
                low, high = (float(v) for v in torch.aminmax(y.double()))
                raise ValueError(f"{yn}: {owner} needs binary labels, 0 or 1, got values in [{low:g}, {high:g}]")
        if kind == "real":
            if y.dtype == torch.bool or y.is_complex():
                raise TypeError(f"{yn} has dtype {y.dtype}, but {owner} needs real-valued responses")
            if not y.is_floating_point() and self.dtype is not None:
                return y.to(self.dtype)  # integer responses, as real numbers
        return y


def _conversion(xn, x, dtype):
    """How to make ``x`` (named ``xn``) and a model of ``dtype`` agree, as code when ``xn`` is an expression."""
    target = f"{xn}.to({dtype})" if re.fullmatch(r"[\w.\[\]]+", xn) else f".to({dtype}) on each batch"
    if x.is_floating_point():
        return f"convert one to the other ({target} or model.to({x.dtype}))"
    return f"convert it ({target})"


def _reads_tokens(model):
    """Whether the model holds an ``nn.Embedding``: it may read integer token ids."""
    return any(isinstance(m, nn.Embedding) for m in model.modules())


def _first_layer(net):
    """``(name, layer, flattens)``: the first linear or 2-d convolution of a sequential network (``None`` otherwise).

    ``flattens``: an ``nn.Flatten`` comes first. Other structures (residual blocks, custom modules) are left
    to the layers' own checks.
    """
    path, flattens = [], False
    while isinstance(net, nn.Sequential):
        children = list(net.named_children())
        while children and isinstance(children[0][1], nn.Flatten):
            if (children[0][1].start_dim, children[0][1].end_dim) != (1, -1):
                return None
            flattens = True
            children = children[1:]
        if not children:
            return None
        path.append(children[0][0])
        net = children[0][1]
    if isinstance(net, (nn.Linear, L0Linear)):
        return ".".join(path), net, flattens
    if isinstance(net, (nn.Conv2d, L0Conv2d)) and not flattens:
        return ".".join(path), net, flattens
    return None
