"""Constrained sparsity against its targets, measured on the pruned network: size, FLOPs and error per run.

Trains the gated MLP, LeNet-5 or a small residual CNN with batch norm (``--model resnet``, gated by
:func:`l0bayes.pruning.sparsify`) with ``objective=Constrained(...)`` for each parameter-density target
(``--targets``, model-wise, or one per layer with ``--per-layer``: ``Constrained(target_density=...)``) and
each FLOP target (``--target-flops``, a fraction of the dense network's FLOPs per example:
``Constrained(target_flops=...)``), and, for comparison, with the penalised objective for each ``--lam``.
``--variant`` sets more of :class:`~l0bayes.inference.Constrained`'s settings (and of ``train()``'s). Every
run writes ``OUT/<name>.json``: its settings, the per-epoch history, and the final numbers measured on the
pruned network (:func:`l0bayes.pruning.prune`) independently of what the objective optimised:

* ``params_fraction`` = ``count_parameters(prune(net)) / count_parameters(net)``;
* ``flops_fraction`` = ``flops(prune(net), input_shape) / flops(net, input_shape)``;
* the test error of the pruned network (checked equal to the gated network's in ``eval()`` mode), the
  open gates per gated layer (``architecture``), the pruned layers' sizes, the gated layers left with no
  open gate (``emptied``) and the wall time;

and ``OUT/weights/<name>.pt``, the gated network's state dict (:func:`load_net` rebuilds it). A run whose
file exists is skipped (so the script continues where it stopped); ``--summarize-only`` prints the markdown
tables of everything in ``OUT`` (mean and sd over seeds; the constrained runs against the penalised error
interpolated at the same pruned fraction) and ``--figure`` draws density and error per epoch.

Examples::

    python experiments/constrained.py --data digits --targets 0.5 0.3 --lam 0.1 0.5 --seeds 0 1 2 --out runs/c-digits
    python experiments/constrained.py --data digits --targets 0.3 --per-layer --out runs/c-digits
    python experiments/constrained.py --data fashion-mnist --targets 0.5 0.33 0.1 --train-subset 10000 --out runs/c-fm
    python experiments/constrained.py --data fashion-mnist --model lenet5 --target-flops 0.25 0.5 --out runs/c-flops
    python experiments/constrained.py --data digits --model resnet --targets 0.5 --lam 0.1 1 --out runs/c-resnet
    python experiments/constrained.py --variant final_phase=0 --data digits --targets 0.3 --out runs/c-ablation
    python experiments/constrained.py --out runs/c-digits --summarize-only
"""

import argparse
import inspect
import json
import math
import os
import statistics
import subprocess
import time
from collections import Counter, defaultdict

import torch
import torch.nn.functional as F
from _common import machine
from torch import nn

from l0bayes._atomic import atomic_write
from l0bayes.data import load_dataset
from l0bayes.inference import Constrained, ExpectedFlops, constrained_summary, train
from l0bayes.models import SparseClassifier
from l0bayes.nn import L0MLP, L0LeNet5, architecture, gates_of
from l0bayes.nn.density import test_time_gate_density
from l0bayes.pruning import count_parameters, flops, prune, sparsify

MODELS = ("mlp", "lenet5", "resnet")
#: The settings of :class:`~l0bayes.inference.Constrained` a ``--variant`` may set (the target is the run's).
CONSTRAINED_SETTINGS = frozenset(inspect.signature(Constrained).parameters) - {
    "target_density",
    "target_flops",
    "target_architecture",
}


# ------------------------------------------------------------------------------------------- networks


class Block(nn.Module):
    """Residual block (He et al. 2016): ``relu(bn2(conv2(relu(bn1(conv1(x))))) + shortcut(x))``.

    The shortcut is the identity, or a strided 1x1 convolution with batch norm where the shape changes.
    """

    def __init__(self, c_in, c_out, stride=1):
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(c_out)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(c_out)
        self.shortcut = None
        if stride != 1 or c_in != c_out:
            self.shortcut = nn.Sequential(nn.Conv2d(c_in, c_out, 1, stride, bias=False), nn.BatchNorm2d(c_out))

    def forward(self, x):
        y = self.bn2(self.conv2(F.relu(self.bn1(self.conv1(x)))))
        return F.relu(y + (x if self.shortcut is None else self.shortcut(x)))


class ResNet(nn.Module):
    """A small residual CNN: conv-bn-relu stem, three blocks (widths ``w, 2w, 4w``, the last two strided),
    global average pooling, a linear head. ``w = 16``: 78k parameters; on 28x28 inputs 18 MFLOPs per example.
    """

    def __init__(self, in_channels=1, num_classes=10, width=16):
        super().__init__()
        self.stem = nn.Conv2d(in_channels, width, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(width)
        self.block1 = Block(width, width)
        self.block2 = Block(width, 2 * width, stride=2)
        self.block3 = Block(2 * width, 4 * width, stride=2)
        self.fc = nn.Linear(4 * width, num_classes)

    def forward(self, x):
        x = F.relu(self.bn(self.stem(x)))
        x = self.block3(self.block2(self.block1(x)))
        return self.fc(F.adaptive_avg_pool2d(x, 1).flatten(1))


def build(settings):
    """The gated network of a run from its settings (``model``, ``input_shape``, ``num_classes``, ``seed``, ...)."""
    torch.manual_seed(settings["seed"])
    input_shape, num_classes = tuple(settings["input_shape"]), settings["num_classes"]
    if settings["model"] == "mlp":
        num_features = math.prod(input_shape)
        hidden = (300, 100) if num_features == 784 else (100, 50)
        return L0MLP(in_features=num_features, hidden=hidden, num_classes=num_classes)
    if len(input_shape) != 3:
        raise ValueError(f"--model {settings['model']} needs image data (C, H, W), not inputs of shape {input_shape}")
    channels, height, width = input_shape
    if settings["model"] == "lenet5":
        return L0LeNet5(
            in_channels=channels,
            num_classes=num_classes,
            input_size=(height, width),
            padding=0 if min(height, width) >= 28 else 2,
        )
    net = ResNet(channels, num_classes, settings["width"])
    return sparsify(net, include=settings["gate_include"], example_inputs=example_inputs(input_shape))


def example_inputs(input_shape):
    """What :func:`sparsify` and :func:`prune` trace the residual network with (only its shape matters)."""
    return torch.zeros((1, *input_shape))


def load_net(out, name):
    """The trained gated network of run ``name`` in ``OUT``, in ``eval()`` mode, with the run's JSON record."""
    with open(os.path.join(out, f"{name}.json")) as f:
        run = json.load(f)
    net = build(run["settings"])
    net.load_state_dict(torch.load(os.path.join(out, "weights", f"{name}.pt"), weights_only=True))
    return net.eval(), run


# ------------------------------------------------------------------------------------------- measurements


def predictions(net, x):
    net.eval()
    with torch.no_grad():
        return torch.cat([net(x[i : i + 1000]).argmax(-1) for i in range(0, len(x), 1000)])


def measure(net, settings, x_test, y_test):
    """What the trained ``net`` is at test time, measured on ``prune(net)``, independently of the objective."""
    net.eval()
    input_shape = tuple(settings["input_shape"])
    pruned = prune(net, example_inputs(input_shape))
    gated_pred, pruned_pred = predictions(net, x_test), predictions(pruned, x_test)
    gated_wrong, pruned_wrong = int((gated_pred != y_test).sum()), int((pruned_pred != y_test).sum())
    if gated_wrong != pruned_wrong:
        raise AssertionError(
            f"the pruned network makes {pruned_wrong} test errors, the gated network in eval() mode {gated_wrong} "
            f"({int((gated_pred != pruned_pred).sum())} of {len(y_test)} predictions differ)"
        )
    with torch.no_grad():
        open_gates = {name: int((gate.deterministic() > 0).sum()) for name, gate in gates_of(net)}
    sizes = {
        name: [m.in_features, m.out_features] if isinstance(m, nn.Linear) else [m.in_channels, m.out_channels]
        for name, m in pruned.named_modules()
        if isinstance(m, (nn.Linear, nn.Conv2d))
    }
    return {
        "params_dense": count_parameters(net),
        "params_pruned": count_parameters(pruned),
        "params_fraction": count_parameters(pruned) / count_parameters(net),
        "flops_dense": flops(net, input_shape),
        "flops_pruned": flops(pruned, input_shape),
        "flops_fraction": flops(pruned, input_shape) / flops(net, input_shape),
        "test_error": pruned_wrong / len(y_test),
        "test_error_gated": gated_wrong / len(y_test),
        "architecture": architecture(net),
        "pruned_sizes": sizes,
        "open_gates": open_gates,
        "emptied": [name for name, n in open_gates.items() if n == 0],
        "gate_density": test_time_gate_density(net),
        "gate_density_per_layer": test_time_gate_density(net, per_layer=True),
    }


def _commit():
    try:
        here = os.path.dirname(os.path.abspath(__file__))
        out = subprocess.run(["git", "-C", here, "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10)
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def run_one(args, data, name, seed, objective, target=None, target_kind=None, lam=0.1, variant=None):
    path = os.path.join(args.out, f"{name}.json")
    if os.path.exists(path):
        print(f"{name}: exists, skipped", flush=True)
        return
    settings = {
        "data": args.data,
        "model": args.model,
        "objective": objective,
        "target_kind": target_kind,  # "density" (Constrained's target_density), "flops" (target_flops) or None
        "target": target,
        "per_layer": args.per_layer if target_kind == "density" else False,
        "lam": lam,
        "seed": seed,
        "epochs": args.epochs,
        "lr": args.lr,
        "batch_size": args.batch_size,
        "record_every": args.record_every,
        "variant": variant or {},
        "train_subset": args.train_subset,
        "n_train": len(data.x_train),
        "n_test": len(data.x_test),
        "input_shape": list(data.input_shape),
        "num_classes": data.num_classes,
        "width": args.width if args.model == "resnet" else None,
        "gate_include": args.gate_include if args.model == "resnet" else None,
        "threads": args.threads,
        "commit": _commit(),
        "torch": torch.__version__,
        "machine": machine(),
        "device": args.device,
        "load_average_at_start": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
    }
    net = build(settings)
    model = SparseClassifier(net, lam=lam)
    objective, options = objective_of(objective, target, target_kind, args.per_layer, variant)
    start = time.perf_counter()
    result = train(
        model,
        data.x_train,
        data.y_train,
        objective=objective,
        epochs=args.epochs,
        batch_size=args.batch_size,
        lr=args.lr,
        seed=seed,
        test_data=(data.x_test, data.y_test),
        callbacks=[ExpectedFlops(data.input_shape)],
        record_every=args.record_every,
        progress=False,
        device=args.device,
        threads=None,  # the count of --threads
        **options,
    )
    wall = time.perf_counter() - start
    final = measure(net.cpu(), settings, data.x_test, data.y_test)
    final["wall_s"] = wall  # training, with the test error every --record-every epochs
    final["s_per_epoch"] = wall / args.epochs
    final["measure_s"] = time.perf_counter() - start - wall
    final["load_average_at_end"] = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    if target_kind == "density":  # the objective's own view: test-time density against its target, warnings
        final["constrained_summary"] = constrained_summary(result, target, per_layer=args.per_layer)
    os.makedirs(os.path.join(args.out, "weights"), exist_ok=True)
    atomic_write(os.path.join(args.out, "weights", f"{name}.pt"), lambda f: torch.save(net.state_dict(), f))
    atomic_write(path, json.dumps({"settings": settings, "final": final, "history": result.history}, indent=1))
    print(
        f"{name}: error {100 * final['test_error']:.2f}%, params {final['params_fraction']:.3f}, "
        f"FLOPs {final['flops_fraction']:.3f}, {final['architecture']}"
        f"{', emptied ' + ' '.join(final['emptied']) if final['emptied'] else ''}, {wall:.0f} s",
        flush=True,
    )


def objective_of(objective, target=None, target_kind=None, per_layer=False, variant=None):
    """``(objective, options)``: what ``train`` takes as ``objective`` for a run (``"penalized"``, or
    ``Constrained`` with the run's target and the settings of ``variant`` it has), and the rest of ``variant``,
    ``train()``'s own options."""
    options = dict(variant or {})
    if objective != "constrained":
        return objective, options
    own = {k: options.pop(k) for k in list(options) if k in CONSTRAINED_SETTINGS}
    if target_kind == "flops":
        own.update(target_flops=target)
    else:
        own.update(target_density=target, per_layer=per_layer)
    return Constrained(**own), options


def parse_variant(text):
    out = {}
    for item in text.split(","):
        key, value = item.split("=")
        if value.lower() == "none":
            out[key] = None
            continue
        out[key] = {"true": True, "false": False}.get(value.lower(), None)
        if out[key] is None:
            try:
                out[key] = float(value)
            except ValueError:
                out[key] = value  # a name, e.g. rank=norm
    return out


# ------------------------------------------------------------------------------------------- summary


def load_runs(out):
    runs = []
    for file in sorted(os.listdir(out)):
        if file.endswith(".json"):
            with open(os.path.join(out, file)) as f:
                run = json.load(f)
            run["name"] = file[: -len(".json")]
            runs.append(run)
    return runs


def kind_of(settings):
    """``"penalised"``, ``"density"``, ``"density per layer"`` or ``"flops"``."""
    if settings["objective"] != "constrained":
        return "penalised"
    kind = settings.get("target_kind") or "density"
    return f"{kind} per layer" if settings.get("per_layer") else kind


def _group_name(name, seed):
    suffix = f"-s{seed}"
    return name[: -len(suffix)] if name.endswith(suffix) else name


def _setup(settings):
    """What must agree for runs to be compared: data, network, training length and step size."""
    keys = ("data", "model", "train_subset", "epochs", "lr", "batch_size", "width", "gate_include")
    return tuple(str(settings.get(k)) for k in keys)


def _mean_sd(values):
    mean = statistics.fmean(values)
    return mean, statistics.stdev(values) if len(values) > 1 else 0.0


def groups(runs):
    """``{group name: [runs]}``: the runs of one setting over seeds (the run name without ``-s<seed>``)."""
    out = defaultdict(list)
    for run in runs:
        out[_group_name(run["name"], run["settings"]["seed"])].append(run)
    return dict(out)


def interpolate(points, at):
    r"""The penalised error at fraction ``at`` from ``points`` = ``[(fraction, error, label), ...]`` (group means).

    Linear in :math:`\log` fraction between the two neighbouring points (in order of fraction) that bracket
    ``at``. Returns ``(error, lower point, upper point)``, or ``None`` when ``at`` is outside the fractions.
    """
    points = sorted(points, key=lambda p: p[0])
    for lo, hi in zip(points, points[1:], strict=False):
        if lo[0] <= at <= hi[0]:
            if hi[0] == lo[0]:
                return (lo[1] + hi[1]) / 2, lo, hi
            t = (math.log(at) - math.log(lo[0])) / (math.log(hi[0]) - math.log(lo[0]))
            return lo[1] + t * (hi[1] - lo[1]), lo, hi
    return None


def _fmt(mean_sd, scale=1.0, digits=3):
    mean, sd = mean_sd
    return f"{scale * mean:.{digits}f} ± {scale * sd:.{digits}f}"


def summary_rows(runs):
    """One dict per group of seeds: the numbers of the main table."""
    rows = []
    for group, members in sorted(groups(runs).items()):
        s = members[0]["settings"]
        kind = kind_of(s)
        finals = [m["final"] for m in members]
        row = {
            "group": group,
            "kind": kind,
            "setup": _setup(s),
            "seeds": sorted(m["settings"]["seed"] for m in members),
            "mixed": len({(_setup(m["settings"]), json.dumps(m["settings"]["variant"])) for m in members}) > 1,
            "target": s["lam"] if kind == "penalised" else s["target"],
            "params": _mean_sd([f["params_fraction"] for f in finals]),
            "flops": _mean_sd([f["flops_fraction"] for f in finals]),
            "error": _mean_sd([f["test_error"] for f in finals]),
            "gate_density": _mean_sd([f["gate_density"] for f in finals]),
            "architectures": Counter(f["architecture"] for f in finals),
            "emptied": [(m["settings"]["seed"], m["final"]["emptied"]) for m in members if m["final"]["emptied"]],
            "by_seed": {m["settings"]["seed"]: m["final"] for m in members},
        }
        if kind != "penalised":
            measure = "flops_fraction" if kind.startswith("flops") else "params_fraction"
            row["off"] = max(abs(f[measure] - s["target"]) for f in finals)
        rows.append(row)
    return rows


def _architectures(counter):
    return ", ".join(f"{a} (x{n})" if n > 1 else a for a, n in counter.most_common())


def comparison(rows, kind, measure):
    """Markdown lines: each constrained group of ``kind`` against the penalised error at its mean ``measure``.

    The penalised groups used are those of the same setup; their means are taken over the constrained
    group's seeds only.
    """
    lines = []
    for row in rows:
        if not row["kind"].startswith(kind) or row["kind"] == "penalised":
            continue
        at = row[measure][0]
        points = []
        for pen in rows:
            if pen["kind"] != "penalised" or pen["setup"] != row["setup"]:
                continue
            finals = [pen["by_seed"][s] for s in row["seeds"] if s in pen["by_seed"]]
            if not finals:
                continue
            key = {"params": "params_fraction", "flops": "flops_fraction"}[measure]
            err = _mean_sd([f["test_error"] for f in finals])
            frac = statistics.fmean(f[key] for f in finals)
            label = f"lam {pen['target']:g}: {100 * err[0]:.2f} ± {100 * err[1]:.2f}% at {frac:.3f}"
            if len(finals) != len(row["seeds"]):
                label += f" ({len(finals)} seeds)"
            emptied = sum(bool(f["emptied"]) for f in finals)
            if emptied:
                label += f" (emptied layers in {emptied} of {len(finals)})"
            points.append((frac, err[0], label))
        hit = interpolate(points, at) if points else None
        if not points:
            penalised, bracket, diff = "no penalised runs", "-", "-"
        elif hit is None:
            span = f"{min(p[0] for p in points):.3f}-{max(p[0] for p in points):.3f}"
            penalised, bracket, diff = f"outside the grid ({span})", "-", "-"
        else:
            err, lo, hi = hit
            penalised = f"{100 * err:.2f}"
            bracket = f"{lo[2]}; {hi[2]}"
            diff = f"{100 * (row['error'][0] - err):+.2f}"
        lines.append(
            f"| {row['group']} | {row['target']:g} | {len(row['seeds'])} | {_fmt(row[measure])} "
            f"| {_fmt(row['error'], 100, 2)} | {penalised} | {diff} | {bracket} |"
        )
    if not lines:
        return []
    what = {"params": "params fraction", "flops": "FLOP fraction"}[measure]
    head = [
        f"| constrained run | target | seeds | {what} | test error % | penalised error % at that {what} "
        "(interpolated) | constrained - penalised "
        "| bracketing penalised runs (error mean ± sd at their mean fraction) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    return head + lines


def summarize(out):
    rows = summary_rows(load_runs(out))
    lines = [
        "| run | kind | target | seeds | params fraction | FLOP fraction | test error % | gate density "
        "| max abs(fraction - target) | architectures | emptied layers |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        target = f"lam {r['target']:g}" if r["kind"] == "penalised" else f"{r['target']:g}"
        off = f"{r['off']:.3f}" if "off" in r else "-"
        emptied = "; ".join(f"s{seed}: {' '.join(names)}" for seed, names in r["emptied"]) or "none"
        lines.append(
            f"| {r['group']}{' (mixed settings!)' if r['mixed'] else ''} | {r['kind']} | {target} | {len(r['seeds'])} "
            f"| {_fmt(r['params'])} | {_fmt(r['flops'])} | {_fmt(r['error'], 100, 2)} | {_fmt(r['gate_density'])} "
            f"| {off} | {_architectures(r['architectures'])} | {emptied} |"
        )
    print("\n".join(lines))
    for kind, measure, title in (
        (
            "density",
            "params",
            "Constrained (parameter density) against the penalised objective at the same params fraction",
        ),
        ("flops", "flops", "Constrained (FLOPs) against the penalised objective at the same FLOP fraction"),
    ):
        table = comparison(rows, kind, measure)
        if table:
            print(f"\n{title}:\n")
            print("\n".join(table))


# ------------------------------------------------------------------------------------------- figure


def figure(out, path, names):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_d, ax_e) = plt.subplots(1, 2, figsize=(11, 4))
    for i, name in enumerate(names):
        with open(os.path.join(out, f"{name}.json")) as f:
            run = json.load(f)
        hist, s = run["history"], run["settings"]
        epochs = [h["epoch"] for h in hist]
        color = f"C{i}"
        label = name if s["objective"] == "constrained" else f"{name} (penalised)"
        if all("test_time_density" in h for h in hist):
            ax_d.plot(epochs, [h["test_time_density"] for h in hist], color=color, label=f"{label}: test-time")
        if s["objective"] == "constrained" and all("constraint" in h for h in hist):
            ax_d.plot(epochs, [h["constraint"][0] for h in hist], color=color, ls=":", label=f"{label}: expected")
        if s["objective"] == "constrained":
            for t in [s["target"]] if not isinstance(s["target"], list) else s["target"]:
                ax_d.axhline(t, color=color, lw=0.6, ls="--")
        ax_d.plot([epochs[-1]], [run["final"]["params_fraction"]], "o", color=color, ms=4)
        full = [h for h in hist if "test_error" in h]
        ax_e.plot([h["epoch"] for h in full], [100 * h["test_error"] for h in full], color=color, label=label)
    ax_d.set(
        xlabel="epoch",
        ylabel="density",
        title="pruned model's params fraction (solid: Eq. 13 gates, dotted: expected under q; dashed: target)",
    )
    ax_e.set(xlabel="epoch", ylabel="test error (%)", title="test error (Eq. 13 gates)", yscale="log")
    ax_d.legend(fontsize=7)
    ax_e.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"wrote {path}")


# ------------------------------------------------------------------------------------------- main


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default="digits")
    parser.add_argument("--model", choices=MODELS, default="mlp")
    parser.add_argument("--targets", type=float, nargs="*", default=[], help="parameter-density targets")
    parser.add_argument("--target-flops", type=float, nargs="*", default=[], help="FLOP targets (fraction of dense)")
    parser.add_argument("--per-layer", action="store_true", help="one density constraint per gated layer")
    parser.add_argument("--lam", type=float, nargs="*", default=[], help="penalised runs to compare (lambda * N)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--epochs", type=int, default=None)
    parser.add_argument("--lr", type=float, default=None)
    parser.add_argument("--batch-size", type=int, default=100)
    parser.add_argument(
        "--record-every", type=int, default=1, help="test error and expected FLOPs every N epochs (and the last)"
    )
    parser.add_argument("--train-subset", type=int, default=None, help="train on the first N training examples")
    parser.add_argument("--width", type=int, default=16, help="--model resnet: channels of the stem (w, 2w, 4w)")
    parser.add_argument(
        "--gate-include",
        default=None,
        help="--model resnet: regex of the layers sparsify() gates (default: every Conv2d and Linear)",
    )
    parser.add_argument(
        "--variant",
        type=parse_variant,
        default=None,
        help="settings of Constrained (or options of train()), e.g. final_phase=0 or rank=norm,target_warmup=50",
    )
    parser.add_argument("--tag", default="")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default="auto", help="train() device: auto, cpu or cuda (measured on the CPU)")
    parser.add_argument("--out", required=True)
    parser.add_argument("--summarize-only", action="store_true")
    parser.add_argument("--figure", nargs="*", default=None, help="run names to draw (into OUT/figure.png)")
    args = parser.parse_args(argv)
    if args.summarize_only or args.figure:
        if args.figure:
            figure(args.out, os.path.join(args.out, "figure.png"), args.figure)
        summarize(args.out)
        return
    if args.target_flops and "target_flops" not in inspect.signature(Constrained).parameters:
        parser.error(
            "--target-flops: l0bayes.inference.Constrained here has no target_flops argument (the FLOP-constrained "
            "objective); run with a version of l0bayes that has it"
        )
    for t in [*args.targets, *args.target_flops]:
        if not 0 < t <= 1:
            parser.error(f"targets are fractions in (0, 1], got {t}")
    if args.train_subset is not None and args.train_subset < 1:
        parser.error(f"--train-subset must be a positive number of examples, got {args.train_subset}")
    torch.set_num_threads(args.threads)
    bundled = args.data in ("digits",)
    args.epochs = args.epochs or (100 if bundled else 10)
    args.lr = args.lr or (1e-2 if bundled else 1e-3)
    os.makedirs(args.out, exist_ok=True)
    data = load_dataset(args.data, seed=0)
    tag = args.tag
    if args.train_subset is not None:
        if args.train_subset > len(data.x_train):
            parser.error(f"--train-subset {args.train_subset}: {args.data} has {len(data.x_train)} training examples")
        data.x_train, data.y_train = data.x_train[: args.train_subset], data.y_train[: args.train_subset]
        tag = f"-n{args.train_subset}{tag}"
    kind = "layer" if args.per_layer else "model"
    for seed in args.seeds:
        for target in args.targets:
            name = f"{args.model}-c{kind}{target:g}{tag}-s{seed}"
            run_one(args, data, name, seed, "constrained", target, "density", variant=args.variant)
        for target in args.target_flops:
            name = f"{args.model}-cflops{target:g}{tag}-s{seed}"
            run_one(args, data, name, seed, "constrained", target, "flops", variant=args.variant)
        for lam in args.lam:
            run_one(args, data, f"{args.model}-lam{lam:g}{tag}-s{seed}", seed, "penalized", lam=lam)


if __name__ == "__main__":
    main()
