"""``l0bayes fit``: load the data, build the model, train it in the run directory, evaluate, write, print."""

import sys
import time

from .arguments import PROG
from .errors import CLIError, is_main_process
from .rundir import RunDirectory


def fit(cfg, resume=False, overwrite=False):
    """Run ``l0bayes fit`` with resolved settings; returns the exit status.

    :param resume: continue the run in ``cfg["out"]`` from its checkpoint.
    :param overwrite: replace the outputs of an earlier run in ``cfg["out"]``.
    """
    from ..threads import thread_policy

    # --threads, or torch's own count (see l0bayes.cli.threads), for the whole run: the library's calls
    # inside (train, pruning) keep it instead of choosing their own.
    with thread_policy(cfg["threads"] or None) as threads:
        return _fit(cfg, resume, overwrite, threads)


def _fit(cfg, resume, overwrite, threads):
    from .config import run_device
    from .models import build_model, train_targets

    main_process = is_main_process()
    run = RunDirectory(cfg["out"])
    if main_process:
        run.check(resume=resume, overwrite=overwrite)  # before the data loads; again under the lock
    device = run_device(cfg)
    data = _load_data(cfg)
    if cfg.get("keep_best") and data.x_val is None:
        raise CLIError(f"--keep-best chooses the epoch on the validation split, and {cfg['data']} has none here")
    model = build_model(cfg, data)
    targets = train_targets(cfg, data)
    if resume:
        _check_resumable(run, model)
    if not main_process:
        return _train(cfg, run, model, data, targets, resume, main_process)
    with run.open(resume=resume, overwrite=overwrite):
        if run.removed:
            print(f"--overwrite: removed the earlier run's {', '.join(run.removed)} from {run.path}", flush=True)
        run.write_json("config.json", {k: v for k, v in cfg.items() if not k.startswith("_")})
        print(
            f"{data.describe()}; model {cfg['model']}, objective {cfg['objective']}, device {device}"
            + (f" ({threads} threads)" if device.type == "cpu" else "")
            + f"; writing to {run.path}",
            flush=True,
        )
        return _train(cfg, run, model, data, targets, resume, main_process)


def _load_data(cfg):
    from ..data import load_dataset

    try:
        return load_dataset(cfg["data"], data_dir=cfg["data_dir"], val_fraction=cfg["val_fraction"], seed=cfg["seed"])
    except (ValueError, FileNotFoundError, ModuleNotFoundError, OSError) as err:
        if isinstance(err, ValueError) and cfg["val_fraction"] and "val_fraction" in str(err):
            # a split that leaves no training data: the option's value, not the data, is wrong
            raise CLIError(f"--val-fraction {cfg['val_fraction']:g} on {cfg['data']}: {err}") from None
        raise CLIError(f"cannot load data set {cfg['data']}: {err}", code=1) from None


def _check_resumable(run, model):
    """The checkpoint exists, loads safely and holds the parameters of the model the settings build."""
    from ..io import load_checkpoint

    path = run.file("checkpoint.pt")
    try:
        state = load_checkpoint(path, required=("model", "epoch"))
    except FileNotFoundError:
        raise CLIError(
            f"cannot resume: {path} does not exist (was the run interrupted before its first epoch ended?)", code=1
        ) from None
    except ValueError as err:  # CheckpointError: empty, truncated, corrupt, unsafe, foreign
        raise CLIError(f"cannot resume: {err}", code=1) from None
    saved, expected = state["model"], model.state_dict()
    if not isinstance(saved, dict):
        raise CLIError(f"cannot resume: checkpoint {path!r} holds no model parameters", code=1)
    mismatch = sorted(set(saved) ^ set(expected)) or [
        k for k in expected if getattr(saved[k], "shape", None) != expected[k].shape
    ]
    if mismatch:
        raise CLIError(
            f"cannot resume: checkpoint {path!r} does not hold the model of {run.file('config.json')} "
            f"(differs in {', '.join(mismatch[:3])}{', ...' if len(mismatch) > 3 else ''})",
            code=1,
        )


def _train(cfg, run, model, data, targets, resume, main_process):
    from .. import inference

    y_train, y_test = targets
    # The per-epoch held-out metric is the validation split's; the test split is evaluated once, at the end
    # (the final table). Without a validation split (--val-fraction 0) nothing is chosen on held-out data and
    # the history records the test metric, the curve the paper plots.
    if data.x_val is not None:
        held_out = {"validation_data": (data.x_val, data.y_val.to(y_train.dtype)), "test_data": None}
    else:
        held_out = {"test_data": (data.x_test, y_test)}
    start = time.perf_counter()
    try:
        result = inference.train(
            model,
            data.x_train,
            y_train,
            objective=_objective(cfg),
            epochs=cfg["epochs"],
            batch_size=cfg["batch_size"],
            lr=cfg["lr"],
            device=cfg["device"],
            seed=cfg["seed"],
            **held_out,
            checkpoint=run.file("checkpoint.pt"),
            resume=resume,
            progress=bool(cfg["progress"]) and main_process,
            compile=cfg.get("compile", False),
            cuda_graph=cfg.get("cuda_graph", False),
            threads=None,  # the count of fit()'s thread_policy
            callbacks=_parameter_callbacks(cfg, data) + _callbacks(cfg, main_process),
        )
    except KeyboardInterrupt:
        if main_process:
            _report_interrupt(run, resume)
        return 130
    except inference.NonFiniteLossError as err:
        raise CLIError(f"training diverged: {err} (--lr {cfg['lr']:g})", code=1) from None
    except ValueError as err:  # data checks of train(), e.g. labels out of range
        raise CLIError(str(err), code=1) from None
    except FileExistsError as err:  # --tensorboard DIR holding another run's events
        raise CLIError(str(err), code=1) from None
    wall = time.perf_counter() - start
    if not main_process:
        return 0
    _finish(cfg, run, data, result, wall)
    return 0


def _objective(cfg):
    """The run's objective: its name, or with ``--objective constrained`` the
    :class:`~l0bayes.inference.Constrained` of ``--target-density`` / ``--target-flops`` and ``--per-layer``."""
    from ..inference import Constrained

    if cfg["objective"] != "constrained":
        return cfg["objective"]
    return Constrained(
        target_density=cfg["target_density"], target_flops=cfg.get("target_flops"), per_layer=bool(cfg["per_layer"])
    )


def _parameter_callbacks(cfg, data):
    """``--log-alpha-range``: :class:`~l0bayes.inference.LogAlphaProjection`; ``--ema``:
    :class:`~l0bayes.inference.ParameterAveraging`; the expected FLOPs of the networks in every record."""
    from ..inference import ExpectedFlops, LogAlphaProjection, ParameterAveraging

    callbacks = [ExpectedFlops(data.input_shape)] if cfg["model"] in ("mlp", "lenet5") else []
    if cfg.get("log_alpha_range"):
        callbacks.append(LogAlphaProjection(*cfg["log_alpha_range"]))
    if cfg.get("ema") is not None:
        callbacks.append(ParameterAveraging(cfg["ema"]))
    return callbacks


def _callbacks(cfg, main_process):
    """``--keep-best``: :class:`~l0bayes.cli.best.KeepBest`; ``--tensorboard DIR``: the TensorBoard callback (its
    package checked before any training)."""
    callbacks = []
    if cfg.get("keep_best"):
        from .best import KeepBest

        callbacks.append(KeepBest())
    if not cfg.get("tensorboard") or not main_process:
        return callbacks
    try:
        import tensorboard  # noqa: F401 - torch.utils.tensorboard needs it
    except ImportError:
        raise CLIError("--tensorboard needs the tensorboard package: pip install tensorboard", code=1) from None
    from ..inference.callbacks import TensorBoard

    return [*callbacks, TensorBoard(cfg["tensorboard"])]


def _report_interrupt(run, resume):
    """The Ctrl-C message: the checkpoint this run wrote (or resumed from), never an earlier run's."""
    path = run.file("checkpoint.pt")
    epoch = run.checkpoint_epoch()
    if run.checkpoint_written_by_this_run() and epoch is not None:
        where = f"checkpoint of epoch {epoch} in {path}"
    elif resume and epoch is not None:
        where = f"no epoch finished since the resume; the checkpoint of epoch {epoch} in {path} is unchanged"
    else:
        where = "no epoch finished, no checkpoint"
    hint = f"resume with --resume: {PROG} fit --out {run.path} --resume" if epoch is not None else "nothing to resume"
    print(f"\ninterrupted ({where}); {hint}", file=sys.stderr, flush=True)


def _finish(cfg, run, data, result, wall):
    """Evaluate, write history, pruned model, plots and summary (all atomically), print the table."""
    import torch

    from ..pruning.export import save_pruned
    from .evaluation import evaluate
    from .plots import write_plots
    from .report import format_table, goal_text, objective_details, summary_record, write_history

    history = result.history
    device = result.device  # where it trained
    summary = evaluate(cfg, result.model, data)
    module, metadata = summary.pop("pruned")
    summary["history"] = history
    summary["last"] = history[-1] if history else None
    summary["kept_epoch"] = _kept_epoch(cfg, history)
    if cfg.get("keep_best"):  # the record of the epoch whose parameters the run kept
        summary["kept"] = next((r for r in history if r["epoch"] == summary["kept_epoch"]), None)
    extra_rows, extra_summary, warnings = objective_details(
        cfg, result.model, result.multipliers, history[-1] if history else None, data.input_shape
    )
    dev = f"{device}" + (
        f" (threads={torch.get_num_threads()})" if device.type == "cpu" else f" ({torch.cuda.get_device_name(device)})"
    )
    table = format_table(cfg, data, summary, wall, dev, extra_rows)
    write_history(history, run)
    save_pruned(module, run.file("pruned.pt"), metadata)
    regression = cfg["model"] in ("linear", "logistic")
    code = "Gaussian slab" if regression and cfg["slab"] == "gaussian" else goal_text(cfg)
    title = f"{cfg['model']} on {cfg['data']}, {cfg['objective']}, {code}"
    plots = write_plots(
        history,
        result.model,
        run,
        title,
        feature_names=metadata.get("feature_names") if regression else None,
        final_metric=(summary["metric"], summary["test"]),
        dense_flops=summary.get("flops_dense"),
        kept_epoch=summary["kept_epoch"] if cfg.get("keep_best") else None,
        inclusion_check=summary.get("inclusion_check"),
    )
    run.write_json("summary.json", summary_record(summary, wall, dev, extra_summary))
    print(table, flush=True)
    for line in warnings:
        print(f"warning: {line}", flush=True)
    if plots is None:
        print("plots skipped: matplotlib is not installed (pip install matplotlib)", flush=True)


def _kept_epoch(cfg, history):
    """The epoch whose parameters the run kept: the best by validation with ``--keep-best``, else the last."""
    if not history:
        return None
    if cfg.get("keep_best") and history[-1].get("best_epoch") is not None:
        return int(history[-1]["best_epoch"])
    return int(history[-1]["epoch"])
