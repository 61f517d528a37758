"""Write a checkpoint after every epoch, and restore a run from one (bit for bit on the same machine)."""

from ...io import cpu_copy, save_checkpoint
from ..resume import BEFORE_FINAL_PHASE
from ..rng import rng_state, set_rng_state
from .base import Callback, plain

__all__ = ["Checkpointing"]

#: Callback states kept at the top level of a checkpoint (the names checkpoints have always used);
#: every other callback's state goes under ``"callbacks"``.
TOP_LEVEL = ("ema", "scheduler")


class Checkpointing(Callback):
    """After every epoch, save the run to ``path`` atomically (:func:`~l0bayes.io.save_checkpoint`).

    The checkpoint holds the model, the optimiser, the objective's state and multipliers, every
    callback's state, the history, the batch order's generator and the random states (of every rank
    when data-parallel), and the run's signature (:func:`~l0bayes.inference.resume.run_signature`).
    A constrained run's checkpoints during its final phase also keep the state from when that phase
    began, from which a resume with more epochs continues (:func:`~l0bayes.inference.resume.resume_point`).
    Put it last among the callbacks, so that their state after the epoch is what it saves.

    :param path: the checkpoint file (its directory must exist).
    :param ddp: the run's :class:`~l0bayes.inference.distributed.DataParallelContext`.
    :param dict signature: what a resume must match.
    """

    def __init__(self, path, ddp, signature):
        self.path, self.ddp, self.signature = path, ddp, signature
        self.before_final = None  # the run's state when its final phase began, kept in every later checkpoint

    def _rank_rng(self):
        return self.ddp.gather(rng_state()) if self.ddp.enabled else None

    def on_epoch_start(self, run):
        start = run.objective.final_phase_start(run.epochs)
        # Every epoch at which the objective may fix its gates (it decides after this hook): the last one kept
        # is the state when the final phase began.
        if start is not None and run.epoch >= start and run.objective.final_phase_began is None:
            rank_rng = self._rank_rng()  # (every rank takes part)
            if run.is_main:
                self.before_final = cpu_copy(self.state(run, run.epoch, rank_rng))

    def on_epoch_end(self, run, record):
        rank_rng = self._rank_rng()
        if not run.is_main:
            return
        state = self.state(run, run.epoch + 1, rank_rng)
        if self.before_final is not None:
            state[BEFORE_FINAL_PHASE] = self.before_final
        save_checkpoint(self.path, state)

    def state(self, run, epoch, rank_rng=None):
        """The checkpoint of ``run`` after ``epoch`` epochs (``rank_rng``: the RNG state of every rank, when DDP)."""
        batches = run.batches.state_dict()
        state = {
            "model": run.model.state_dict(),
            "optimizer": run.optimizer.state_dict(),
            "multipliers": run.objective.multipliers().detach().cpu(),
            "history": run.history,
            "epoch": epoch,
            "shuffle": batches.get("shuffle"),
            "rng": rng_state(),
        }
        if rank_rng is not None:
            state.update(self.ddp.checkpoint_extra(rank_rng))
        # NumPy scalars as Python numbers; anything a weights_only load cannot rebuild is refused, naming the callback
        callbacks = {
            k: plain(v, f"the state_dict() of callback {k!r} holds") for k, v in run.callbacks.state_dict().items()
        }
        state.update({k: callbacks.pop(k) for k in TOP_LEVEL if k in callbacks})
        if callbacks:
            state["callbacks"] = callbacks
        state.update(objective_state=run.objective.state_dict(), run=self.signature)
        return state

    def restore(self, run, state, seed):
        """Load a checkpoint's ``state`` into ``run``: parameters, optimiser, objective, callbacks, order, RNG."""
        run.model.load_state_dict(state["model"])
        run.optimizer.load_state_dict(state["optimizer"])
        if "objective_state" in state:
            run.objective.load_state_dict(state["objective_state"])
        elif run.objective.name == "constrained":  # a checkpoint written before objects held their state
            run.objective.set_multipliers(state["multipliers"])
        callbacks = dict(state.get("callbacks", {}))
        callbacks.update({k: state[k] for k in TOP_LEVEL if k in state})
        for cb in run.callbacks:
            if getattr(cb, "required_in_checkpoint", None) and cb.key not in callbacks:
                raise ValueError(f"checkpoint {self.path!r} {cb.required_in_checkpoint}")
        run.callbacks.load_state_dict(callbacks)
        if state.get("shuffle") is not None:
            run.batches.load_state_dict({"shuffle": state["shuffle"]})
        self.ddp.restore_rng(state, seed, set_rng_state)
        self.before_final = state.get(BEFORE_FINAL_PHASE)
        run.history, run.epoch = state["history"], int(state["epoch"])
