r"""Figures of the paper and of a trained model's gates, with matplotlib (imported lazily).

Every function takes an optional ``ax`` and returns ``(fig, ax)``; none calls ``plt.show()``.

* :func:`plot_hard_concrete`: the binary concrete and hard concrete laws with the atoms at 0 and 1 (Fig. 2a).
* :func:`plot_expected_gate`: :math:`E[z]` against :math:`\log\alpha` with and without noise (Fig. 2b).
* :func:`plot_inclusion_forest`: a forest plot of :math:`q(z \ne 0)` with the HDI of each gate.
* :func:`plot_gate_heatmap`: one layer's gates as an image (e.g. the 28x28 map of kept pixels).
* :func:`plot_expected_flops`: expected FLOPs over training from ``train()`` histories (Fig. 3).
* :func:`plot_head_map`: the attention heads of a transformer, layers by heads, open or closed.
"""

import math

import numpy as np
import torch

from .._checks import COUNT, NON_NEGATIVE_COUNT, check_args, check_seed
from .._optional import figure_axes, import_arviz
from ..distributions import HardConcrete
from .inference_data import gate_layers, gate_var
from .summary import _layer_of, _select, gate_quantity

# The tables of argument checks: plot_hard_concrete draws no samples for num_samples=0, while
# plot_expected_gate averages over them (0 drew NaN curves, -1 failed in torch's expand).
HARD_CONCRETE_CHECKS = {"num_samples": NON_NEGATIVE_COUNT}
EXPECTED_GATE_CHECKS = {"num_samples": COUNT}


def plot_hard_concrete(
    log_alpha=0.0, temperature=0.5, lower=-0.1, upper=1.1, num_samples=0, seed=0, show_concrete=True, ax=None
):
    r"""Fig. 2a: the binary concrete density and the hard concrete law with its atoms.

    The defaults are the paper's (:math:`\log\alpha = 0`, :math:`\beta = 0.5`,
    :math:`(\gamma, \zeta) = (-0.1, 1.1)`). The continuous part of the hard concrete is drawn as
    a density on ``(0, 1)`` (Eq. 26); the atoms :math:`P(z = 0)` and :math:`P(z = 1)` as stems
    whose height is their probability (labelled). ``num_samples > 0`` overlays a histogram of
    Eq. 10-11 samples in ``(0, 1)``, normalised like the density.
    """
    check_args("plot_hard_concrete", HARD_CONCRETE_CHECKS, num_samples=num_samples)
    seed = check_seed(seed, "plot_hard_concrete: seed")
    fig, ax = figure_axes(ax)
    hc = HardConcrete(torch.tensor(float(log_alpha), dtype=torch.float64), temperature, lower, upper)
    grid = torch.linspace(1e-3, 1 - 1e-3, 400, dtype=torch.float64)
    if show_concrete:
        concrete = torch.distributions.RelaxedBernoulli(
            torch.tensor(float(temperature), dtype=torch.float64), logits=hc.log_alpha
        )
        ax.plot(grid, concrete.log_prob(grid).exp(), color="0.55", ls="--", label="binary concrete")
    density = hc.log_prob(grid).exp()
    ax.plot(grid, density, color="C0", label="hard concrete (0 < z < 1)")
    for where, mass in ((0.0, float(hc.prob_zero)), (1.0, float(hc.prob_one))):
        ax.vlines(where, 0, mass, color="C3", lw=3)
        ax.plot([where], [mass], "o", color="C3")
        ax.annotate(
            f"P(z={where:g}) = {mass:.3f}",
            (where, mass),
            textcoords="offset points",
            xytext=(4, 4),
            ha="left" if where == 0 else "right",
            fontsize=8,
        )
    if num_samples:
        gen = torch.random.fork_rng()
        with gen:
            torch.manual_seed(seed)
            z = hc.rsample((int(num_samples),))
        inside = z[(z > 0) & (z < 1)].numpy()
        weights = np.full(inside.shape, 1.0 / int(num_samples))
        bins = np.linspace(0, 1, 41)
        ax.hist(inside, bins=bins, weights=weights / np.diff(bins)[0], alpha=0.3, color="C0", label="samples")
    top = max(float(density.max()), float(hc.prob_zero), float(hc.prob_one))
    ax.set_ylim(0, 2.5 * top)  # the binary concrete diverges at 0 and 1 for beta < 1
    ax.set_xlabel("z")
    ax.set_ylabel("density / atom mass")
    ax.set_title(rf"log $\alpha$ = {float(log_alpha):g}, $\beta$ = {temperature:g}")
    ax.legend(fontsize=8, loc="upper center")
    return fig, ax


def plot_expected_gate(log_alpha=None, temperature=0.5, lower=-0.1, upper=1.1, num_samples=10000, seed=0, ax=None):
    r"""Fig. 2b: the expected concrete and hard concrete gates against :math:`\log\alpha`.

    With noise: :math:`E[s]` of the binary concrete and :math:`E[z]` of the hard concrete, both
    averaged over ``num_samples >= 1`` draws as in the paper, and :math:`E[z]` exactly (quadrature) as
    a line. Without noise (:math:`u = 1/2`): :math:`\sigma(\log\alpha/\beta)` and its hard
    sigmoid; dotted, the test-time gate of Eq. 13, :math:`\min(1, \max(0,
    \sigma(\log\alpha)(\zeta - \gamma) + \gamma))`.
    """
    check_args("plot_expected_gate", EXPECTED_GATE_CHECKS, num_samples=num_samples)
    seed = check_seed(seed, "plot_expected_gate: seed")
    fig, ax = figure_axes(ax)
    if log_alpha is None:
        log_alpha = torch.linspace(-6, 6, 121, dtype=torch.float64)
    log_alpha = torch.as_tensor(log_alpha, dtype=torch.float64)
    hc = HardConcrete(log_alpha, temperature, lower, upper)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        s = torch.distributions.RelaxedBernoulli(
            torch.tensor(float(temperature), dtype=torch.float64), logits=log_alpha
        ).sample((int(num_samples),))
        z = hc.rsample((int(num_samples),))
    x = log_alpha.numpy()
    ax.plot(x, s.mean(0), color="0.55", label="concrete, with noise")
    ax.plot(x, z.mean(0), "o", ms=2.5, color="C0", label=f"hard concrete, {int(num_samples)} samples")
    ax.plot(x, hc.mean, color="C0", label="hard concrete, exact E[z]")
    no_noise = torch.sigmoid(log_alpha / temperature)
    ax.plot(x, no_noise, color="0.55", ls="--", label="concrete, no noise")
    ax.plot(x, (no_noise * (upper - lower) + lower).clamp(0, 1), color="C1", ls="--", label="hard concrete, no noise")
    ax.plot(x, hc.deterministic_gate, color="C2", ls=":", label="Eq. 13 test-time gate")
    ax.set_xlabel(r"log $\alpha$")
    ax.set_ylabel("gate value")
    ax.legend(fontsize=7)
    return fig, ax


def plot_inclusion_forest(idata, var_names=None, hdi_prob=0.94, threshold=0.5, max_gates=100, ax=None):
    r"""Forest plot: per gate, :math:`q(z \ne 0)` (dot), :math:`E[z]` (cross) and the HDI of :math:`z` (bar).

    Rows are labelled ``"<layer>: <coordinate>"`` (just the coordinate for a regression); a
    vertical line marks ``threshold`` (the median-probability model). At most ``max_gates``
    rows (pick layers with ``var_names``).
    """
    az = import_arviz()
    names = _select(idata, var_names)
    labels, q, mean, lo, hi = [], [], [], [], []
    for var in names:
        da = idata.posterior[var]
        interval = az.hdi(da.values.reshape(-1, da.shape[-1])[None], hdi_prob=hdi_prob)  # (gates, 2)
        layer = _layer_of(idata, var)
        prefix = "" if var == "z" else f"{layer}: "
        labels += [f"{prefix}{c}" for c in da[da.dims[-1]].values]
        q.append(gate_quantity(idata, var, "prob_nonzero"))
        mean.append(da.values.reshape(-1, da.shape[-1]).mean(0))
        lo.append(interval[:, 0])
        hi.append(interval[:, 1])
    if len(labels) > max_gates:
        raise ValueError(f"{len(labels)} gates is more than max_gates={max_gates}; choose layers with var_names")
    q, mean, lo, hi = (np.concatenate(a) for a in (q, mean, lo, hi))
    fig, ax = figure_axes(ax, figsize=(5.0, 0.9 + 0.22 * len(labels)))
    y = np.arange(len(labels))[::-1]
    ax.hlines(y, lo, hi, color="C0", lw=2, alpha=0.6, label=f"{hdi_prob:.0%} HDI of z")
    ax.plot(mean, y, "x", color="C0", label="E[z]")
    ax.plot(q, y, "o", color="C3", label="q(z != 0)")
    ax.axvline(threshold, color="0.5", ls=":", lw=1)
    ax.set_yticks(y, labels, fontsize=8)
    ax.set_xlim(-0.03, 1.03)
    ax.set_xlabel("inclusion probability / gate value")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return fig, ax


def _square(n):
    side = math.isqrt(n)
    if side * side != n:
        raise ValueError(f"{n} gates are not a square image; give image_shape")
    return side, side


def plot_gate_heatmap(source, layer=None, quantity="prob_nonzero", image_shape=None, ax=None, cmap="viridis"):
    r"""One layer's gates as an image: for an MLP's input layer the map of kept pixels.

    :param source: an :class:`arviz.InferenceData` from :func:`~l0bayes.analysis.to_inference_data`,
        or a model with gates (see :func:`~l0bayes.analysis.gate_layers`).
    :param layer: the layer name (``"fc1"``) or variable (``"z_fc1"``); default the first layer.
    :param quantity: ``"prob_nonzero"`` (:math:`q(z \ne 0)`), ``"test_gate"`` (Eq. 13),
        ``"active"`` (Eq. 13 gate > 0: the kept pixels), or any of
        :data:`~l0bayes.analysis.summary.QUANTITIES`.
    :param image_shape: ``(H, W)`` with ``H * W`` = number of gates; default square
        (28x28 for Fashion-MNIST, 8x8 for scikit-learn's digits).
    """
    if hasattr(source, "groups"):
        names = _select(source, None)
        var = names[0] if layer is None else (layer if layer in names else gate_var(layer))
        what = "test_gate" if quantity == "active" else quantity
        values = gate_quantity(source, var, what)
        title_layer = _layer_of(source, var)
    else:
        layers = {gl.name: gl for gl in gate_layers(source)}
        gl = next(iter(layers.values())) if layer is None else layers.get(layer)
        if gl is None:
            raise ValueError(f"unknown layer {layer!r}; gated layers are {list(layers)}")
        g = gl.gate
        q = HardConcrete(g.log_alpha.detach().double(), g.temperature, g.lower, g.upper)
        table = {
            "log_alpha": q.log_alpha,
            "prob_nonzero": q.prob_nonzero,
            "prob_zero": q.prob_zero,
            "prob_one": q.prob_one,
            "test_gate": q.deterministic_gate,
            "active": q.deterministic_gate,
        }
        if quantity == "mean":
            table["mean"] = q.mean
        if quantity not in table:
            raise ValueError(f"unknown quantity {quantity!r}; choose from {sorted(table)}")
        values = table[quantity].detach().double().cpu().numpy()
        title_layer = gl.name
    if quantity == "active":
        values = (values > 0).astype(float)
    shape = _square(values.shape[0]) if image_shape is None else tuple(image_shape)
    if math.prod(shape) != values.shape[0]:
        raise ValueError(f"image_shape {shape} does not hold {values.shape[0]} gates")
    fig, ax = figure_axes(ax, figsize=(4.0, 3.5))
    vmin, vmax = (0.0, 1.0) if quantity != "log_alpha" else (None, None)
    im = ax.imshow(values.reshape(shape), cmap=cmap, vmin=vmin, vmax=vmax)
    fig.colorbar(im, ax=ax, shrink=0.85)
    kept = f", {int(values.sum())} of {values.shape[0]} kept" if quantity == "active" else ""
    ax.set_title(f"{title_layer}: {quantity}{kept}", fontsize=9)
    ax.set_xticks([])
    ax.set_yticks([])
    return fig, ax


def plot_expected_flops(histories, dense_flops=None, ax=None, key="expected_flops"):
    r"""Fig. 3: the expected FLOPs under :math:`q(z \ne 0)` over training.

    :param histories: a ``train()`` history (list of per-epoch dicts with ``"epoch"`` and
        ``key``), or ``{label: history}`` for several runs.
    :param dense_flops: optional FLOPs of the dense network (``{label: flops}`` or a number),
        drawn as horizontal lines (the paper's "original" / "dropout" references).
    """
    if isinstance(histories, dict):
        runs = histories
    elif isinstance(histories, list | tuple):
        runs = {"L0": histories}
    else:
        raise TypeError("histories must be a list of per-epoch dicts or a {label: history} dict")
    fig, ax = figure_axes(ax)
    for label, history in runs.items():
        if not history or any(key not in r for r in history):
            raise ValueError(
                f"history {label!r} has epochs without {key!r}: the full records (train(record_every=1)) of a network "
                "that prune() can count hold it"
            )
        epochs = [r.get("epoch", k + 1) for k, r in enumerate(history)]
        ax.plot(epochs, [r[key] for r in history], marker="o", ms=3, label=label)
    if dense_flops is not None:
        refs = dense_flops if isinstance(dense_flops, dict) else {"dense": dense_flops}
        for k, (label, value) in enumerate(refs.items()):
            ax.axhline(float(value), color=f"C{k + len(runs)}", ls="--", lw=1, label=label)
    ax.set_xlabel("epoch")
    ax.set_ylabel("expected FLOPs")
    ax.legend(fontsize=8)
    return fig, ax


def head_map(model, quantity="test_gate"):
    r"""``(values, names)``: the head gates of a model of :func:`~l0bayes.pruning.sparsify_transformer`, one row
    per gated block (its name in ``names``), one column per head (``NaN`` past a block's last head).

    :param quantity: ``"test_gate"`` (the Eq. 13 gate :math:`\hat z_h`, times the attention branch's gate
        where there is one: a head of a removed branch is closed), ``"active"`` (that gate > 0: the heads
        :func:`~l0bayes.pruning.prune` keeps) or ``"prob_nonzero"`` (:math:`q(z_h \ne 0)` times the branch's).
    """
    from ..pruning.transformer import is_transformer_gated

    net = getattr(model, "net", model)
    net = net if is_transformer_gated(net) else model
    if not is_transformer_gated(net):
        raise ValueError("plot_head_map needs a model of sparsify_transformer() (or one holding it as .net)")
    if quantity not in ("test_gate", "active", "prob_nonzero"):
        raise ValueError(f"unknown quantity {quantity!r}; choose from ['active', 'prob_nonzero', 'test_gate']")

    def value(gate):
        g = gate.gate
        return (g.prob_nonzero() if quantity == "prob_nonzero" else g.deterministic()).detach().double().cpu()

    rows, names = [], []
    for r in net._l0_transformer:
        block = net.get_submodule(r.name)
        heads = getattr(block, "l0_heads", None)
        z = value(heads) if heads is not None else torch.ones(r.num_heads, dtype=torch.float64)
        branch = getattr(block, "l0_attention", None)
        if branch is not None:
            z = z * value(branch)
        if quantity == "active":
            z = (z > 0).double()
        rows.append(z.numpy())
        names.append(r.name or "(model)")
    width = max(len(r) for r in rows)
    values = np.full((len(rows), width), np.nan)
    for i, row in enumerate(rows):
        values[i, : len(row)] = row
    return values, names


def plot_head_map(model, ax=None, quantity="test_gate", cmap="viridis", annotate=True):
    r"""The attention heads of a gated transformer as an image: one row per block, one column per head.

    :param model: a model of :func:`~l0bayes.pruning.sparsify_transformer` (or a
        :class:`~l0bayes.models.SparseModel` holding it), with head gates, branch gates or both.
    :param quantity: ``"test_gate"`` (default: the Eq. 13 gate, 0 for a closed head, a closed branch closing
        all its heads), ``"active"`` (open or closed) or ``"prob_nonzero"`` (:math:`q(z \ne 0)`, Eq. 12).
        See :func:`head_map`.
    :param annotate: write each cell's value in it.
    :returns: ``(fig, ax)``; the title counts the open heads (for ``"prob_nonzero"``, their expected number).
    """
    values, names = head_map(model, quantity)
    fig, ax = figure_axes(ax, figsize=(1.2 + 0.6 * values.shape[1], 1.0 + 0.45 * values.shape[0]))
    im = ax.imshow(np.ma.masked_invalid(values), cmap=cmap, vmin=0.0, vmax=1.0, aspect="auto")
    fig.colorbar(im, ax=ax, shrink=0.85)
    ax.set_xticks(range(values.shape[1]), [str(h) for h in range(values.shape[1])])
    ax.set_yticks(range(values.shape[0]), names)
    ax.set_xlabel("head")
    if annotate:
        for (i, j), v in np.ndenumerate(values):
            if not np.isnan(v):
                text = f"{v:.0f}" if quantity == "active" else f"{v:.2f}"
                ax.text(j, i, text, ha="center", va="center", fontsize=7, color="white" if v < 0.5 else "black")
    total = int(np.sum(~np.isnan(values)))
    if quantity == "prob_nonzero":  # q(z != 0) is never exactly 0: its sum, the expected number of open heads
        ax.set_title(f"heads: {quantity}, {np.nansum(values):.1f} of {total} open in expectation", fontsize=9)
    else:
        ax.set_title(f"heads: {quantity}, {int(np.nansum(values > 0))} of {total} open", fontsize=9)
    return fig, ax
