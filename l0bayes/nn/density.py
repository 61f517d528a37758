r"""Gate-level density of a gated network: the fraction of its gated groups' parameters whose gates are open.

Each gate counts alone, whatever the other layers do (see "Constrained sparsity" in ``docs/mathematics.md``):

* the **expected gate density** :math:`\sum_g |g|\, q(z_g \ne 0) / \sum_g |g|` (Eq. 12, 16), the
  expected :math:`L_0` norm of Eq. 16 as a fraction;
* the **test-time gate density** :math:`\sum_g |g|\, \mathbb 1[\hat z_g > 0] / \sum_g |g|` with the
  deterministic gate :math:`\hat z` of Eq. 13.

These are *not* the fraction of parameters the pruned model keeps: an open input column of layer
:math:`k` whose output units layer :math:`k+1` closed is counted here but removed by
:func:`~l0bayes.pruning.prune`. The density a target promises, counted as the pruned model keeps it,
is :func:`l0bayes.pruning.expected_density` / :func:`l0bayes.pruning.test_time_density`.
:func:`architecture` gives the open gates themselves, layer by layer, as Table 1 writes them.
"""

import torch

from .gates import gates_of
from .penalty import l0_layers

__all__ = ["architecture", "density_names", "expected_gate_density", "test_time_gate_density"]


def density_names(module):
    """The names under which the per-layer densities are reported: the gated layers' names (``"fc1"``).

    The names are those of the gated network: for a model that holds it as ``net`` (e.g.
    :class:`~l0bayes.models.SparseClassifier`) without that prefix, as in :mod:`l0bayes.analysis`.
    """
    return _layer_names(module, _gates(module))


def _layer_name(gate_name):
    return gate_name[: -len(".gate")] if gate_name.endswith(".gate") else (gate_name or "gate")


def _layer_names(module, gates):
    names = [_layer_name(name) for name, _ in gates]
    if isinstance(getattr(module, "net", None), torch.nn.Module) and all(n.startswith("net.") for n in names):
        names = [n[len("net.") :] for n in names]  # the wrapped network's own names
    return names


def _gates(module):
    gates = gates_of(module)
    if not gates:
        raise ValueError("the module has no HardConcreteGate")
    return gates


def expected_gate_density(module, per_layer=False):
    r"""Expected fraction of gated parameters whose gate is open, :math:`\sum_g |g|\, q(z_g \ne 0) / \sum_g |g|`.

    Eq. 12 and 16.

    Differentiable in every ``log_alpha``.

    :param per_layer: ``False``: a tensor of shape ``(1,)`` for the whole network; ``True``: one entry
        per gated layer (shape ``(L,)``, in registration order), each over that layer's gated parameters.
    """
    gates = _gates(module)
    if per_layer:
        return torch.stack([g.expected_l0() / (g.num_gates * g.group_size) for _, g in gates])
    total = sum(g.num_gates * g.group_size for _, g in gates)
    return (sum(g.expected_l0() for _, g in gates) / total).reshape(1)


@torch.no_grad()
def test_time_gate_density(module, per_layer=False):
    r"""Fraction of gated parameters whose Eq. 13 gate is open, :math:`\sum_g |g|\,\mathbb 1[\hat z_g > 0] / \sum_g|g|`.

    :math:`\hat z_g` is the deterministic gate of Eq. 13 (``gate.active()``). Each gate counts alone:
    this is an upper bound on, not the value of, the fraction of gated weights that
    :func:`~l0bayes.pruning.prune` keeps (:func:`l0bayes.pruning.test_time_density` is that value).

    :param per_layer: ``False``: a float for the whole network; ``True``: ``{layer name: density}``
        in registration order (names from :func:`density_names`).
    """
    gates = _gates(module)
    kept = [int(g.active().sum()) * g.group_size for _, g in gates]
    sizes = [g.num_gates * g.group_size for _, g in gates]
    if per_layer:
        return {name: k / n for name, k, n in zip(_layer_names(module, gates), kept, sizes, strict=True)}
    return sum(kept) / sum(sizes)


def architecture(module):
    """Number of open gates (Eq. 13 gate > 0) per L0 layer, in registration order, joined by ``-``.

    E.g. ``'219-214-100'`` for :class:`~l0bayes.nn.networks.L0MLP` (input neurons of fc1-fc3) and
    ``'20-25-45-462'`` for :class:`~l0bayes.nn.networks.L0LeNet5` (output maps of conv1, conv2,
    then input neurons of fc1, fc2), the format of Table 1.
    """
    with torch.no_grad():
        return "-".join(str(int(layer.active_mask().sum())) for _, layer in l0_layers(module))
