r"""Hard concrete gates on an existing network: :func:`sparsify`.

:func:`sparsify` takes any :class:`torch.nn.Module` (a ResNet, a model with batch norm and skip
connections) and attaches a :class:`~l0bayes.nn.HardConcreteGate` to chosen layers, with the
paper's group choice (Section 2.4, Eq. 12-17 of the docs' mathematics page):

* ``nn.Linear``: one gate per *input neuron*, :math:`y = (x \odot z) W^\top + b`, group size
  ``out_features`` (as :class:`~l0bayes.nn.L0Linear`);
* ``nn.Conv1d``, ``nn.Conv2d``, ``nn.Conv3d``: one gate per *output channel*. When the convolution's output
  goes straight into a batch norm (``nn.BatchNorm1d/2d/3d``), the gate multiplies the *batch norm's* output,
  :math:`y_{:, c} = z_c\,\mathrm{BN}(W \star x)_c`, so that a closed channel is exactly zero after the
  batch norm and can be removed together with the batch norm's channel and the next layer's input
  channel. (The paper's code gates the convolution's output before the batch norm; a closed channel
  then leaves the constant :math:`\beta_c - \gamma_c \mu_c/\sigma_c` and cannot be removed exactly.)
  Group size ``in_channels / groups`` times the kernel's taps (``k``, ``kh * kw`` or ``kd * kh * kw``), the
  convolution weights of one channel;
* user-named groups (:class:`Group`): one gate per unit along a dimension of the outputs of one or
  several named modules, all multiplied by the *same* draw (e.g. every producer of a residual stream).

**Mechanism.** The layers keep their class and their state-dict keys (a pretrained checkpoint still
loads); each chosen layer gets a ``gate`` child and, like :mod:`torch.nn.utils.parametrize`, a
subclass of its own class that adds the :class:`~l0bayes.nn.L0Layer` interface (``prob_nonzero``,
``expected_l0``, ``expected_l2``), so :func:`~l0bayes.nn.penalty`, :func:`~l0bayes.nn.gates_of`,
:func:`~l0bayes.nn.architecture`, the FLOP counters and the analysis functions see it as any L0 layer.
The gate is applied by a forward hook (a pre-hook scaling a linear layer's input, a hook scaling a
convolution's or its batch norm's output) rather than by a parametrization, because a parametrization
is evaluated on every access of the tensor it replaces: gating a batch norm's weight and bias (or a
convolution's weight and bias) would draw two independent gate samples per forward pass, while the
paper draws one per minibatch; a hook calls the gate exactly once per forward.
"""

import copy
import re
from dataclasses import dataclass

import torch
from torch import nn

from .._warnings import warn
from ..nn.gates import HardConcreteGate, check_gate_kwargs
from ..nn.layers import L0Layer
from .hooks import as_input_tuple, probe_forward, remove_hooks

__all__ = ["GATED_TYPES", "GatedLayer", "Group", "GroupGate", "is_sparsified", "sparsify", "strip_gates"]

_BATCH_NORMS = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d)
_CONVS = (nn.Conv1d, nn.Conv2d, nn.Conv3d)
#: The layer types :func:`sparsify` gates.
GATED_TYPES = (nn.Linear, *_CONVS)
#: Layers with parameters that need no gate of their own: one scale (and shift) per unit, pruned with the
#: gated unit they follow.
_PER_UNIT = (
    *_BATCH_NORMS,
    nn.LayerNorm,
    nn.GroupNorm,
    nn.InstanceNorm1d,
    nn.InstanceNorm2d,
    nn.InstanceNorm3d,
    getattr(nn, "RMSNorm", nn.LayerNorm),  # (torch >= 2.4)
    nn.PReLU,
)


class GatedLayer(L0Layer):
    """The :class:`~l0bayes.nn.L0Layer` interface :func:`sparsify` adds to an ``nn.Linear`` / ``nn.Conv1d/2d/3d``.

    Not instantiated directly: :func:`sparsify` sets a layer's class to a subclass of both this and
    the layer's own class. ``self.gate`` holds the gates; ``self.gated_batch_norm`` is the batch norm
    whose output the gates of a convolution multiply (``None``: the convolution's own output).
    """

    gated_batch_norm = None

    @property
    def gates_inputs(self):
        """``True`` for a linear layer (gates on input neurons), ``False`` for a convolution (output channels)."""
        return isinstance(self, nn.Linear)

    def _gate_inputs(self, module, args):  # the gates in the activations' dtype (a bfloat16 model stays bfloat16)
        gate = self.gate
        if gate.observer is not None:
            gate.observer(args[0], -1, self)
        return (args[0] * gate().to(args[0].dtype), *args[1:])

    def _gate_outputs(self, module, args, output):
        gate = self.gate
        if gate.observer is not None:
            gate.observer(output, 1, None)
        z = gate().to(output.dtype)
        return output * z.view(-1, *([1] * (output.dim() - 2)))

    def expected_l2(self):
        r"""Eq. 17: :math:`\sum_g q(z_g \ne 0) \|\tilde\theta_g\|^2` plus the ungated terms.

        Linear layer: group :math:`g` is the column :math:`W_{:, g}`, the ungated bias enters with
        :math:`q = 1` (as :meth:`L0Linear.expected_l2 <l0bayes.nn.L0Linear.expected_l2>`).
        Convolution: group :math:`c` is the filter of output channel :math:`c` with its bias (as
        :meth:`L0Conv2d.expected_l2 <l0bayes.nn.L0Conv2d.expected_l2>`); a batch norm's parameters are
        not part of it.
        """
        q = self.prob_nonzero()
        if self.gates_inputs:
            out = (q * self.weight.pow(2).sum(0)).sum()
            return out + self.bias.pow(2).sum() if self.bias is not None else out
        group_sq = self.weight.pow(2).flatten(1).sum(1)
        if self.bias is not None:
            group_sq = group_sq + self.bias.pow(2)
        return (q * group_sq).sum()


_GATED_CLASSES = {}


def _gated_class(cls):
    if cls not in _GATED_CLASSES:
        _GATED_CLASSES[cls] = type(f"Gated{cls.__name__}", (GatedLayer, cls), {"_base_class": cls})
    return _GATED_CLASSES[cls]


@dataclass
class Group:
    """A user-named group of units sharing gates: the :class:`Group` argument of :func:`sparsify`.

    One gate per unit along ``dim`` of the output of every module in ``modules`` (qualified names as
    in :meth:`torch.nn.Module.named_modules`); all of them are multiplied by the same draw, once per
    forward pass of the sparsified model. For example ``Group(["stem", "block1.conv2"])`` gates the
    channels of a residual stream that both modules write to.

    :param modules: names of the modules whose outputs are gated.
    :param num_gates: number of gates; default: ``out_channels`` / ``out_features`` / ``num_features``
        of the first module.
    :param group_size: :math:`|g|`, parameters per gate in Eq. 16; default: the parameters of the named
        modules whose first dimension has ``num_gates`` entries, divided by ``num_gates``.
    :param dim: the dimension of the outputs that holds the units (1: channels, features).
    """

    modules: list
    num_gates: int | None = None
    group_size: int | None = None
    dim: int = 1


class GroupGate(L0Layer):
    """The gates of one user-named :class:`Group`, held by the sparsified model in ``l0_groups[name]``."""

    def __init__(self, modules, num_gates, group_size, dim=1, **gate_kwargs):
        super().__init__()
        self.gate = HardConcreteGate(num_gates, group_size=group_size, **gate_kwargs)
        self.module_names = list(modules)
        self.dim = int(dim)
        self._modules_gated = []  # the gated modules (not registered: they live elsewhere in the model)
        self._z = None

    def extra_repr(self):
        return f"modules={self.module_names}, dim={self.dim}"

    def _draw(self, module, args):
        self._z = self.gate()

    def _clear(self, module, args, output):
        self._z = None

    def _gate_outputs(self, module, args, output):
        if self.gate.observer is not None:
            self.gate.observer(output, self.dim, None)
        z = self._z if self._z is not None else self.gate()
        shape = [1] * output.dim()
        shape[self.dim] = -1
        return output * z.to(output.dtype).view(shape)

    def expected_l2(self):
        r"""Eq. 17 over the named modules' parameters whose first dimension indexes the units."""
        q = self.prob_nonzero()
        total = q.new_zeros(())
        for module in self._modules_gated:
            for p in module.parameters(recurse=False):
                if p.dim() >= 1 and p.shape[0] == q.shape[0]:
                    total = total + (q * p.pow(2).reshape(q.shape[0], -1).sum(1)).sum()
        return total


def _followers(model, convs, example_inputs):
    """``{conv: batch norm}`` for every conv in ``convs`` whose output goes straight into a batch norm."""
    outputs, links, handles = {}, {}, []

    def after_conv(module, args, output):
        outputs[id(output)] = (module, output)  # keep the tensor alive so its id stays unique

    def before_bn(module, args):
        hit = outputs.get(id(args[0]))
        if hit is not None and hit[1] is args[0]:
            links.setdefault(hit[0], module)

    handles += [conv.register_forward_hook(after_conv) for conv in convs]
    handles += [m.register_forward_pre_hook(before_bn) for m in model.modules() if isinstance(m, _BATCH_NORMS)]
    running = []  # the modules whose forward has begun and not ended: the last one is where an error arose

    def ended(module, args, output):
        running.pop()

    for name, m in model.named_modules():
        handles.append(m.register_forward_pre_hook(lambda module, args, name=name: running.append(name)))
        handles.append(m.register_forward_hook(ended))
    try:
        probe_forward(model, example_inputs, handles)
    except (RuntimeError, TypeError, ValueError, IndexError) as err:
        given = _describe_inputs(example_inputs[0] if len(example_inputs) == 1 else example_inputs)
        inner = running[-1] if running else ""
        where = f" in {inner!r} ({type(model.get_submodule(inner)).__name__})" if inner else ""
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ValueError(
            f"sparsify: example_inputs do not fit the model: {given} fails{where} with: {first}; example_inputs "
            "must be what the model's forward takes (a batch of its inputs)"
        ) from err
    return links


def _checked_inputs(example_inputs):
    """``example_inputs`` as a tuple of tensors with a batch dimension (``TypeError`` / ``ValueError`` otherwise)."""
    inputs = as_input_tuple(example_inputs)
    if not inputs or not all(isinstance(t, torch.Tensor) for t in inputs):
        raise TypeError(
            "sparsify: example_inputs must be a tensor or a non-empty tuple of tensors (the model's positional "
            f"arguments), got {_describe_inputs(example_inputs)}"
        )
    if any(t.dim() == 0 or t.shape[0] == 0 for t in inputs):
        raise ValueError(
            "sparsify: example_inputs must have a batch dimension with at least one example, got "
            f"{_describe_inputs(example_inputs)}"
        )
    return inputs


def _describe_inputs(example_inputs):
    """How error messages name ``example_inputs``: the shapes of tensors, else the types."""
    if isinstance(example_inputs, torch.Tensor):
        return f"a tensor of shape {tuple(example_inputs.shape)}"
    if isinstance(example_inputs, tuple):
        return "a tuple (" + ", ".join(_describe_inputs(t) for t in example_inputs) + ")"
    return f"a {type(example_inputs).__name__}"


def _chosen(model, layers, include, exclude):
    """``(name, module)`` of the layers to gate: by type (default :data:`GATED_TYPES`), name list, patterns."""
    named = [(n, m) for n, m in model.named_modules() if n]
    if (
        layers is None
        or isinstance(layers, type)
        or (isinstance(layers, tuple) and all(isinstance(t, type) for t in layers))
    ):
        types = layers or GATED_TYPES
        picked = [(n, m) for n, m in named if isinstance(m, types)]
    else:
        by_name = dict(named)
        unknown = [n for n in layers if n not in by_name]
        if unknown:
            raise ValueError(f"no modules named {unknown} in the model")
        picked = [(n, by_name[n]) for n in layers]
    if include is not None:
        picked = [(n, m) for n, m in picked if re.search(include, n)]
    if exclude is not None:
        picked = [(n, m) for n, m in picked if not re.search(exclude, n)]
    for n, m in picked:
        if isinstance(m, GatedLayer):
            raise ValueError(f"{n} already has gates")
        if not isinstance(m, GATED_TYPES):
            raise TypeError(
                f"{n}: {type(m).__name__} cannot be gated; sparsify gates nn.Linear and nn.Conv1d, nn.Conv2d, nn.Conv3d"
            )
    return picked


def _warn_ungated(model, picked):
    """Warn, naming them, about the modules with parameters of their own that sparsify leaves without gates."""
    chosen = {id(m) for _, m in picked}
    ungated = [
        f"{name!r} ({type(m).__name__})" if name else f"the model itself ({type(m).__name__})"
        for name, m in model.named_modules()
        if id(m) not in chosen
        and not isinstance(m, GATED_TYPES + _PER_UNIT + (L0Layer, HardConcreteGate))
        and any(True for _ in m.parameters(recurse=False))
    ]
    if ungated:
        more = f" and {len(ungated) - 8} more" if len(ungated) > 8 else ""
        warn(
            f"sparsify gates nn.Linear and nn.Conv1d/2d/3d layers; these modules have parameters and stay ungated: "
            f"{', '.join(ungated[:8])}{more} (pass layers= a list of names to choose the layers yourself)"
        )


def _attach(layer, batch_norm, gate_kwargs):
    if batch_norm is not None and not batch_norm.affine:
        raise NotImplementedError("a gated convolution's batch norm must be affine (its output is gated)")
    if isinstance(layer, nn.Linear):
        num, size = layer.in_features, layer.out_features
    else:
        num = layer.out_channels
        size = layer.weight[0].numel()
    layer.__class__ = _gated_class(type(layer))
    layer.gate = HardConcreteGate(num, group_size=size, **gate_kwargs)
    if isinstance(layer, nn.Linear):
        layer.register_forward_pre_hook(layer._gate_inputs)
    else:
        # a plain attribute (not a child module): the batch norm stays where the model registered it
        object.__setattr__(layer, "gated_batch_norm", batch_norm)
        (batch_norm or layer).register_forward_hook(layer._gate_outputs)


def _attach_group(model, name, group, gate_kwargs):
    by_name = dict(model.named_modules())
    unknown = [n for n in group.modules if n not in by_name]
    if unknown or not group.modules:
        raise ValueError(f"group {name!r}: no modules named {unknown or group.modules}")
    modules = [by_name[n] for n in group.modules]
    num = group.num_gates
    if num is None:
        first = modules[0]
        num = next(
            (getattr(first, a) for a in ("out_channels", "out_features", "num_features") if hasattr(first, a)), None
        )
        if num is None:
            raise ValueError(f"group {name!r}: give num_gates ({type(first).__name__} has no output size)")
    size = group.group_size
    if size is None:
        shaped = [p for m in modules for p in m.parameters(recurse=False) if p.dim() >= 1 and p.shape[0] == num]
        size = max(1, sum(p.numel() for p in shaped) // num)
    holder = GroupGate(group.modules, num, size, group.dim, **gate_kwargs)
    holder._modules_gated = modules
    if not hasattr(model, "l0_groups"):
        model.l0_groups = nn.ModuleDict()
        model.register_forward_pre_hook(_draw_groups)
        model.register_forward_hook(_clear_groups)
    model.l0_groups[name] = holder
    for m in modules:
        m.register_forward_hook(holder._gate_outputs)


def _draw_groups(model, args):
    for holder in model.l0_groups.values():
        holder._draw(model, args)


def _clear_groups(model, args, output):
    for holder in model.l0_groups.values():
        holder._clear(model, args, output)


def sparsify(
    model, layers=None, *, include=None, exclude=None, example_inputs=None, groups=None, inplace=False, **gate_kwargs
):
    r"""Attach hard concrete gates to the layers of an existing model; returns the gated model.

    :param model: any :class:`torch.nn.Module`.
    :param layers: which layers to gate: a type or tuple of types (default :data:`GATED_TYPES`:
        ``nn.Linear``, ``nn.Conv1d``, ``nn.Conv2d``, ``nn.Conv3d``, every such layer), or a list of module names.
        Chosen by type, the model's other modules with parameters of their own that are not batch norms or
        other per-unit layers (``nn.LayerNorm``, ``nn.GroupNorm``, ``nn.PReLU``, ...) stay ungated, and a
        ``UserWarning`` names them (an ``nn.Embedding``, an ``nn.LSTM``, a transposed convolution, a module
        of your own with an ``nn.Parameter``).
    :param include, exclude: regular expressions (:func:`re.search` on the module name) that further
        keep / drop layers, e.g. ``include=r"conv1$"``.
    :param example_inputs: a tensor (or tuple of tensors) the model accepts, with a batch dimension; needed when
        a convolution is gated, to find the batch norm its output goes into (one forward pass in ``eval()`` mode,
        which checks them: inputs the model does not take are a ``ValueError`` naming ``example_inputs``, the
        module where the forward failed and torch's message). Kept on the model for :func:`~l0bayes.pruning.prune`.
    :param groups: ``{name: Group}``, user-named groups of units (:class:`Group`).
    :param inplace: modify ``model`` itself instead of a deep copy.
    :param gate_kwargs: ``init_drop_rate``, ``temperature``, ``lower``, ``upper``, ``init_std`` of
        every gate (:class:`~l0bayes.nn.HardConcreteGate`).
    :returns: the gated model, in the training mode ``model`` was in; its gates are listed by
        :func:`~l0bayes.nn.gates_of` as ``"<layer name>.gate"`` (``"l0_groups.<name>.gate"`` for groups).
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"sparsify: model must be a torch.nn.Module, got {type(model).__name__}")
    if not isinstance(inplace, bool):
        raise TypeError(f"sparsify: inplace must be True or False, got {inplace!r}")
    check_gate_kwargs("sparsify", gate_kwargs)
    if groups is not None:
        if not isinstance(groups, dict) or not all(isinstance(g, Group) for g in groups.values()):
            raise TypeError(f"sparsify: groups must be a dict {{name: Group(...)}}, got {groups!r}")
        for name, group in groups.items():
            if isinstance(group.dim, bool) or not isinstance(group.dim, int) or group.dim == 0:
                raise ValueError(
                    f"sparsify: group {name!r}: dim must be a nonzero int (the dimension of the outputs that holds "
                    f"the units; 0 is the batch), got {group.dim!r}"
                )
    if not inplace:
        model = copy.deepcopy(model)
    picked = _chosen(model, layers, include, exclude)
    if not picked and not groups:
        raise ValueError("no layer was chosen to gate")
    if layers is None or isinstance(layers, (type, tuple)):
        _warn_ungated(model, picked)
    convs = [m for _, m in picked if isinstance(m, _CONVS)]
    if convs and example_inputs is None:
        raise ValueError("gating a convolution needs example_inputs, to find the batch norm that follows it")
    links = _followers(model, convs, _checked_inputs(example_inputs)) if example_inputs is not None else {}
    for _, layer in picked:
        _attach(layer, links.get(layer), gate_kwargs)
    for name, group in (groups or {}).items():
        _attach_group(model, name, group, gate_kwargs)
    if example_inputs is not None:
        object.__setattr__(
            model, "_l0_example_inputs", tuple(t[:1].detach().clone() for t in as_input_tuple(example_inputs))
        )
    return model


def is_sparsified(module):
    """Whether ``module`` holds gates attached by :func:`sparsify` (gated layers or groups)."""
    return any(isinstance(m, (GatedLayer, GroupGate)) for m in module.modules())


@torch.no_grad()
def _fold_rows(module, z, what):
    """Scale the output units of ``module`` (weight rows and bias) by ``z`` in place."""
    if isinstance(module, _BATCH_NORMS + GATED_TYPES) and module.weight is not None:
        module.weight.mul_(z.view(-1, *([1] * (module.weight.dim() - 1))))
        if module.bias is not None:
            module.bias.mul_(z)
        return
    raise NotImplementedError(f"{what}: cannot fold gates into a {type(module).__name__}")


@torch.no_grad()
def strip_gates(model):
    r"""A plain copy of a sparsified ``model``: the Eq. 13 test-time gates folded into the weights.

    The copy has the original classes, no gates and no hooks, and computes what ``model`` computes in
    ``eval()`` mode (:math:`\theta^* = \tilde\theta \odot \hat z`): a linear layer's columns are scaled by
    its gates, a convolution's filters and bias (or its batch norm's weight and bias) by its channel
    gates. Closed units are kept, with zero weights; :func:`~l0bayes.pruning.prune` removes them.
    """
    plain = copy.deepcopy(model)
    if hasattr(plain, "_l0_example_inputs"):
        object.__delattr__(plain, "_l0_example_inputs")
    for name, layer in list(plain.named_modules()):
        if not isinstance(layer, GatedLayer):
            continue
        z = layer.gate.deterministic()
        if layer.gates_inputs:
            remove_hooks(layer, layer)
            layer.weight.mul_(z)
        else:
            target = layer.gated_batch_norm if layer.gated_batch_norm is not None else layer
            remove_hooks(target, layer)
            _fold_rows(target, z, name)
            if "gated_batch_norm" in layer.__dict__:
                object.__delattr__(layer, "gated_batch_norm")
        del layer.gate
        layer.__class__ = layer._base_class
    if hasattr(plain, "l0_groups"):
        for key, holder in plain.l0_groups.items():
            z = holder.gate.deterministic()
            for module in holder._modules_gated:
                remove_hooks(module, holder)
                if holder.dim != 1 and not isinstance(module, nn.Linear):
                    raise NotImplementedError(f"group {key!r}: folding gates along dim {holder.dim}")
                _fold_rows(module, z, f"group {key!r}")
        for hooks in (plain._forward_hooks, plain._forward_pre_hooks):
            for k in [k for k, h in hooks.items() if h in (_draw_groups, _clear_groups)]:
                del hooks[k]
        del plain.l0_groups
    return plain
