"""Resuming a run from its checkpoint: which state to continue from, and whether the run is the same one.

A checkpoint (written by :class:`~l0bayes.inference.callbacks.Checkpointing`) holds the model, optimiser,
objective, callbacks, batch order and random states after an epoch, and the *signature* of the run: the
objective, step size, batch size, a fingerprint of the data, and the optimiser's and schedule's settings.
A resume with another signature is refused, naming what differs. A resume may change ``epochs``: with
more epochs it gives the run trained for that many from the start (:func:`resume_point`).
"""

import math

import torch

__all__ = ["BEFORE_FINAL_PHASE", "check_signature", "held_out_signature", "resume_point", "run_signature"]

#: The checkpoint entry holding the run's state when its final phase began (a constrained run's fixed gates).
BEFORE_FINAL_PHASE = "before_final_phase"


def resume_point(state, checkpoint, estimator, epochs):
    """The checkpoint state a run of ``epochs`` epochs resumes from: ``state`` itself or the one it keeps.

    A constrained run fixes its gates for the last ``final_phase`` of its epochs
    (:meth:`~l0bayes.inference.objectives.ConstrainedObjective.final_phase_start`), so where that phase
    begins depends on the number of epochs. A checkpoint written during it keeps the state of the run when
    it began (:data:`BEFORE_FINAL_PHASE`); a resume with more epochs, whose final phase begins later,
    continues from there and retrains the epochs after it: the same run, bit for bit, as one trained
    for that many epochs from the start. A resume that cannot be made exact is refused, saying why.
    """
    done = int(state["epoch"])
    begins = estimator.final_phase_start(epochs)
    saved = state.get("objective_state")
    if done >= epochs or not isinstance(saved, dict) or saved.get("name") != estimator.name:
        return state  # nothing to train, or another objective (refused when its state is loaded)
    began = _final_phase_began(state)
    kept = state.get(BEFORE_FINAL_PHASE)
    # The gates are fixed at the first epoch from `begins` on at which the Lagrangian has arrived, or at the last.
    # The checkpoint's run decided at every epoch from its own earliest start (`checked_from`) on; where this run
    # would decide at an epoch the other did not check, or the other was forced by its last epoch, it cannot
    # continue from the checkpoint as it is.
    checked_from = saved.get("checked_from")  # (absent from checkpoints of earlier versions, and without a final phase)
    same_checks = begins is None or (checked_from is not None and checked_from <= begins)
    forced = bool(saved.get("forced", False))
    if began is None and (begins is None or done <= begins or same_checks):
        return state
    if began is not None and not forced and begins is not None and begins <= began and (began == begins or same_checks):
        return state
    if began is not None and kept is not None and (begins is None or began < begins or same_checks):
        return kept  # the run when its final phase began: this run decides there anew
    waits = getattr(estimator, "arrival", None) is not None
    begin = "may begin from" if waits else "begins at"
    where = f"its final phase {begin} epoch {begins + 1}" if begins is not None else "it has no final phase"
    if began is None:  # the checkpoint went past this run's final phase without one (a shorter run)
        why = f"the checkpoint is at epoch {done} and its gates were not fixed yet"
        hint = _fewest_epochs(estimator, done)
    elif kept is None:  # written by an earlier version, without the state before its final phase
        why = (
            f"the checkpoint fixed its gates at epoch {began + 1} and holds no state from before its final phase "
            "(a checkpoint of an earlier version)"
        )
        hint = _epochs_fixing_at(estimator, began)
    else:
        why = f"the checkpoint fixed its gates at epoch {began + 1}, later"
        hint = _fewest_epochs(estimator, began)
    raise ValueError(
        f"cannot resume from {checkpoint!r} with epochs={epochs}: the constrained objective fixes the gates for "
        f"{'at most ' if waits else ''}the last final_phase={estimator.final_phase:g} of the epochs, so with {epochs} "
        f"epochs {where}, "
        f"but {why}; "
        f"resuming could not give the run of {epochs} epochs. Resume with {hint}, or train anew"
    )


def _final_phase_began(state):
    """The epoch (0-based) at which a checkpoint's final phase began, or ``None`` while it has not."""
    saved = state["objective_state"]
    if saved.get("fixed") is None:
        return None
    if saved.get("fixed_at") is not None:
        return int(saved["fixed_at"])
    # A checkpoint of an earlier version: the first record with fixed gates.
    return next((int(r["epoch"]) - 1 for r in state["history"] if r.get("gates_fixed")), int(state["epoch"]) - 1)


def _fewest_epochs(estimator, start):
    """``"epochs >= E"``: the runs whose final phase begins at epoch ``start`` (0-based) or later."""
    runs = [e for e in _epochs_up_to(estimator, start) if estimator.final_phase_start(e) >= start]
    return f"epochs >= {runs[0]}"


def _epochs_fixing_at(estimator, start):
    """``"epochs=E"`` or ``"epochs from E1 to E2"``: the runs whose final phase begins at epoch ``start``."""
    runs = [e for e in _epochs_up_to(estimator, start) if estimator.final_phase_start(e) == start]
    if not runs:  # (no final phase in this run)
        return f"the final_phase the checkpoint was trained with (its gates were fixed at epoch {start + 1})"
    return f"epochs={runs[0]}" if len(runs) == 1 else f"epochs from {runs[0]} to {runs[-1]}"


def _epochs_up_to(estimator, start):
    """Numbers of epochs from ``start + 1`` past the first whose final phase begins after epoch ``start``."""
    if estimator.final_phase_start(start + 1) is None:
        return []
    # final_phase_start(E) >= (1 - final_phase) E - 1, which exceeds start beyond this E.
    last = math.ceil((start + 2) / (1 - estimator.final_phase)) + 1
    return range(start + 1, last + 1)


def run_signature(objective, lr, batch_size, x, y):
    """What must not change when a run is resumed: objective, learning rate, batch size and the data.

    The data's fingerprint (shapes and sums) is taken of tensors in memory; an iterable of batches has none.
    """
    if not torch.is_tensor(x):
        return {"objective": objective, "lr": float(lr), "batch_size": batch_size}
    with torch.no_grad():
        data = [list(x.shape), float(x.sum(dtype=torch.float64)), list(y.shape), float(y.sum(dtype=torch.float64))]
    return {"objective": objective, "lr": float(lr), "batch_size": int(batch_size), "data": data}


def held_out_signature(data):
    """The fingerprint of ``validation_data`` a resume must match (what early stopping chose on): shapes and
    sums of a pair of tensors, ``"batches"`` for an iterable of batches (which has none), ``None`` without."""
    if data is None:
        return None
    if isinstance(data, (tuple, list)) and len(data) == 2 and all(torch.is_tensor(t) for t in data):
        with torch.no_grad():
            return [[list(t.shape), float(t.sum(dtype=torch.float64))] for t in data]
    return "batches"


def check_signature(state, signature, checkpoint):
    saved = state.get("run")
    if saved is None:  # written before checkpoints stored it
        return
    # Entries a checkpoint of an earlier version lacks (the optimiser, the schedule) are not compared.
    keys = [k for k in signature if k in saved]
    changed = [c for k in keys for c in _differences(k, saved[k], signature[k])]
    if changed:
        raise ValueError(f"cannot resume from {checkpoint!r}: the run changed: {'; '.join(changed)}")


def _differences(name, old, new):
    """``["name.key old -> new", ...]`` for every leaf where two plain containers differ."""
    if name == "data":
        return [] if old == new else ["data (shape or values of x, y)"]
    if name == "validation":
        kinds = ["none" if v is None else "batches" if v == "batches" else "tensors" for v in (old, new)]
        return [] if old == new else [f"validation_data ({kinds[0]} -> {kinds[1]}, or other shapes or values)"]
    if isinstance(old, dict) and isinstance(new, dict) and old.get("type") == new.get("type"):
        return [c for k in sorted(set(old) | set(new)) for c in _differences(f"{name}.{k}", old.get(k), new.get(k))]
    if isinstance(old, list) and isinstance(new, list) and len(old) == len(new):
        return [c for k, (a, b) in enumerate(zip(old, new, strict=True)) for c in _differences(f"{name}[{k}]", a, b)]
    if isinstance(old, dict) and "type" in old or isinstance(new, dict) and "type" in new:  # another class
        kinds = [v.get("type") if isinstance(v, dict) else v for v in (old, new)]
        return [f"{name} {kinds[0]} -> {kinds[1]}"]
    return [] if old == new else [f"{name} {old!r} -> {new!r}"]
