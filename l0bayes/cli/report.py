"""What a run prints and records: the final table, ``summary.json``, ``history.json`` / ``history.csv``."""

import csv
import io


def _flat(value):
    if isinstance(value, (list, tuple)):
        return "-".join(_flat(v) for v in value)
    if isinstance(value, float):
        return repr(value)
    return str(value)


def history_csv(history):
    """The per-epoch records as CSV text, one column per key seen in any record."""
    keys = []
    for record in history:
        keys.extend(k for k in record if k not in keys)
    buffer = io.StringIO(newline="")
    writer = csv.writer(buffer)
    writer.writerow(keys)
    for record in history:
        writer.writerow([_flat(record[k]) if k in record else "" for k in keys])
    return buffer.getvalue()


def write_history(history, run):
    """``history.json`` and ``history.csv`` in the :class:`~l0bayes.cli.rundir.RunDirectory`, atomically."""
    run.write_json("history.json", history)
    run.write("history.csv", history_csv(history))


def lam_text(cfg):
    """What the code cost is, in words: the paper's lambda times N, or why there is none."""
    lam = cfg["lam"]
    if cfg["model"] in ("linear", "logistic"):
        if cfg["slab"] == "gaussian":
            return "none (Gaussian slab: its KL, Eq. 20, instead of a code cost)"
        if lam is None:
            return "0.5 log N per feature"
    if isinstance(lam, dict):
        return ", ".join(f"{k}: {v:g}/N" for k, v in lam.items())
    return f"{lam:g}/N"


def goal_text(cfg):
    """What the run was asked for: the target density of a constrained run, else the code cost."""
    if cfg["objective"] == "constrained":
        if cfg.get("target_flops") is not None:
            return f"target FLOPs {cfg['target_flops']:g}" + (" per layer" if cfg["per_layer"] else "")
        return f"target density {cfg['target_density']:g}" + (" per layer" if cfg["per_layer"] else "")
    return f"lambda {lam_text(cfg)}"


def objective_details(cfg, model, multipliers=None, last_record=None, input_shape=None):
    """Extra rows and warnings of the objective, as ``(rows, summary entries, warnings)``.

    The single place for the constrained objective's summary: target and test-time density, per layer, and
    the multipliers (:func:`~l0bayes.inference.constrained_summary`), with its one-line warnings (a target
    missed by more than 0.02, a layer left empty, a final phase that started far above the target, read
    from ``last_record``, the history's last entry). :func:`format_table` prints the rows and ``summary.json``
    records the entries.
    """
    if cfg["objective"] != "constrained":
        return [], {}, []
    from ..inference.objectives import constrained_rows, constrained_summary

    net = getattr(model, "net", model)
    started = (last_record or {}).get("density_at_final_phase")
    shape = input_shape if cfg["model"] in ("mlp", "lenet5") else None
    summary = constrained_summary(
        net,
        cfg["target_density"],
        bool(cfg["per_layer"]),
        multipliers,
        density_at_final_phase=started,
        target_flops=cfg.get("target_flops"),
        input_shape=shape,
    )
    return constrained_rows(summary), summary, summary["warnings"]


def _metric_text(result):
    error = "error" in result["metric"]
    text = f"{100 * result['test']:.2f}%" if error else f"{result['test']:.4f}"
    if "val" in result:
        text += f"  (validation {100 * result['val']:.2f}%)" if error else f"  (validation {result['val']:.4f})"
    return text


def _kept_text(result):
    kept = result["kept"]
    name = next(k for k in ("validation_error", "validation_rmse", "validation_loss") if kept.get(k) is not None)
    value = f"{100 * kept[name]:.2f}%" if name == "validation_error" else f"{kept[name]:.4f}"
    words = name.replace("_", " ").replace("rmse", "RMSE")
    return f"{result['kept_epoch']} of {len(result['history'])} (lowest {words}, {value})"


def _objective_rows(cfg, last):
    if not last:
        return []
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
    return [(f"{name}, nats", terms), ("expected L0 (Eq. 16)", f"{last['expected_l0']:,.1f}")]


def _header(cfg, data):
    text = (
        f"l0bayes fit: {cfg['model']} on {data.describe()}\n"
        f"objective {cfg['objective']}, {goal_text(cfg)}, {cfg['epochs']} epochs, "
        f"batch {cfg['batch_size']}, lr {cfg['lr']:g}, seed {cfg['seed']}"
    )
    if cfg.get("init"):
        text += f", {cfg['init']} init"
    if cfg.get("log_alpha_range"):
        low, high = cfg["log_alpha_range"]
        text += f", log_alpha in [{low:.4g}, {high:.4g}]"
    if cfg.get("ema") is not None:
        text += f", parameters averaged (EMA {cfg['ema']:g})"
    return text


def format_table(cfg, data, result, wall, device, extra_rows=()):
    """The final table as text; ``extra_rows`` from :func:`objective_details` go before the wall time."""
    rows = [(result["metric"], _metric_text(result))]
    architecture = f"{result['architecture']}  (dense {result['dense_architecture']})"
    rows.append(("architecture (Eq. 13 gates open)", architecture))
    pp, pd = result["params_pruned"], result["params_dense"]
    rows.append(("active parameters", f"{pp:,} of {pd:,} dense ({pd / max(pp, 1):.2f}x fewer)"))
    fp, fd = result["flops_pruned"], result["flops_dense"]
    rows.append(("FLOPs per example", f"{fp:,} of {fd:,} dense ({fd / max(fp, 1):.2f}x fewer)"))
    rows.append(("expected FLOPs under q(z != 0)", f"{result['expected_flops']:,.0f}"))
    if result.get("kept"):  # --keep-best: the epoch chosen on the validation split, and its objective
        rows.append(("epoch kept (--keep-best)", _kept_text(result)))
    rows += _objective_rows(cfg, result.get("kept") or result["last"])
    rows += list(extra_rows)
    epochs = len(result["history"])
    per_epoch = sum(r["wall_s"] for r in result["history"]) / max(epochs, 1)
    rows.append(("wall time", f"{wall:.1f} s ({epochs} epochs, {per_epoch:.2f} s/epoch)"))
    rows.append(("device", device))
    rows.append(("output", cfg["out"]))
    width = max(len(k) for k, _ in rows)
    line = "-" * (width + 2 + max(len(v) for _, v in rows))
    lines = [_header(cfg, data), line, *(f"{k.ljust(width)}  {v}" for k, v in rows), line]
    if result.get("features"):
        lines += _feature_table(result["features"], result.get("inclusion_check"), result.get("selected"))
    return "\n".join(lines)


def _feature_table(features, check=None, selected=None):
    """One row per feature: its inclusion probability and Eq. 13 coefficient; with the inclusion check of a Bayes
    run (:mod:`l0bayes.cli.inclusion`), the checked probability, the trained gate's and the status of each."""
    width = max(7, *(len(n) for n, _, _ in features))
    if check is None:
        lines = [f"{'feature'.rjust(width)}  q(z != 0)  coefficient (Eq. 13, standardised units)"]
        return lines + [f"{n.rjust(width)}  {pi:9.3f}  {c:+11.3f}" for n, pi, c in features]
    from .inclusion import check_lines

    lines = [f"{'feature'.rjust(width)}  checked  q(z != 0)  status     coefficient (Eq. 13, standardised units)"]
    rows = zip(features, check["variational"], check["status"], strict=True)
    lines += [f"{n.rjust(width)}  {pi:7.3f}  {q:9.3f}  {st:9}  {c:+11.3f}" for (n, pi, c), q, st in rows]
    return lines + check_lines(check, selected)


def summary_record(result, wall, device, extra=None):
    """``summary.json``: the final table's numbers (not the history), wall time, device, epochs.

    A regression's ``features`` are one object per feature, named: ``name``, ``inclusion_probability`` (the
    table's headline: the checked one of a Bayes run), ``coefficient`` (Eq. 13, standardised units), and for a
    Bayes run the trained gate's ``gate_inclusion_probability`` and the ``status``; the inclusion check's lists
    follow its ``feature_names``.
    """
    record = {k: v for k, v in result.items() if k != "history"}
    record.update(wall_s=wall, device=device, epochs=len(result["history"]), **(extra or {}))
    if result.get("features"):
        record["features"] = _feature_records(result["features"], result.get("inclusion_check"))
    return record


def _feature_records(features, check=None):
    rows = [{"name": n, "inclusion_probability": pi, "coefficient": c} for n, pi, c in features]
    if check is not None:
        for row, q, status in zip(rows, check["variational"], check["status"], strict=True):
            row.update(gate_inclusion_probability=q, status=status)
    return rows
