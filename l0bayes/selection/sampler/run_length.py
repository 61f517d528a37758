r"""How long :func:`~l0bayes.selection.tempered_gibbs` samples: :class:`RunLength`.

As an estimator's settings live on an object (Pyro's ``TraceMeanField_ELBO(num_particles=...)``), the sampler's
run length is one small object: the warm-up, the bounds on the number of steps, how often convergence is checked
and the time budget, each defined, checked and documented here once, when the object is built.
"""

import numpy as np
import torch

from ..._checks import COUNT, NON_NEGATIVE_COUNT, Rule, check_args, whole

__all__ = ["RunLength"]

_RULES = {
    "warmup": NON_NEGATIVE_COUNT,
    "max_steps": COUNT,
    "min_steps": NON_NEGATIVE_COUNT,
    "check_every": COUNT,
    "time_budget": Rule("a number of seconds > 0 (inf: no limit)", lambda v: v > 0).or_none(),
}
_FIELDS = tuple(_RULES)


class RunLength:
    r"""How long :func:`~l0bayes.selection.tempered_gibbs` samples: ``tempered_gibbs(..., run_length=RunLength(...))``.

    Each chain first takes ``warmup`` steps, which are discarded, then at least ``min_steps`` and at most
    ``max_steps`` steps; sampling stops early at a convergence check (every ``check_every`` steps) where every
    probability of at least 0.01 has R-hat <= 1.01 and ESS >= 100, or once ``time_budget`` seconds have passed.
    The object is immutable; two compare equal when their settings are.

    :param int warmup: steps per chain discarded first.
    :param int max_steps: at most this many steps per chain after warm-up.
    :param int min_steps: at least this many steps per chain after warm-up before stopping early.
    :param int check_every: steps between convergence checks; sampling stops early when every
        probability of at least 0.01 has R-hat <= 1.01 and ESS >= 100.
    :param time_budget: seconds; sampling stops when they have passed (``None``: no limit; ``inf`` too).
    :raises TypeError: for a setting of the wrong kind (a string, a bool); :class:`ValueError` for one outside its
        range (a negative or fractional number of steps, a time budget that is not positive), naming it.
    """

    __slots__ = _FIELDS

    def __init__(self, *, warmup=500, max_steps=100_000, min_steps=1000, check_every=1000, time_budget=None):
        given = {
            "warmup": warmup,
            "max_steps": max_steps,
            "min_steps": min_steps,
            "check_every": check_every,
            "time_budget": time_budget,
        }
        for name, value in given.items():
            if (torch.is_tensor(value) or isinstance(value, np.ndarray)) and value.ndim:
                raise TypeError(
                    f"RunLength: {name} must be a single number, got an array of shape {tuple(value.shape)}"
                )
        check_args("RunLength", _RULES, **given)
        settings = {
            "warmup": whole(warmup),
            "max_steps": whole(max_steps),
            "min_steps": whole(min_steps),
            "check_every": whole(check_every),
            "time_budget": None if time_budget is None else float(time_budget),
        }
        for name, value in settings.items():
            object.__setattr__(self, name, value)

    def settings(self):
        """The settings, by name (what ``repr`` shows and two objects compare by)."""
        return {name: getattr(self, name) for name in _FIELDS}

    def __setattr__(self, name, value):
        raise AttributeError(f"RunLength is immutable: build another, e.g. RunLength({name}={value!r}, ...)")

    def __delattr__(self, name):
        raise AttributeError("RunLength is immutable")

    def __repr__(self):
        shown = ", ".join(f"{k}={v!r}" for k, v in self.settings().items())
        return f"RunLength({shown})"

    def __eq__(self, other):
        if not isinstance(other, RunLength):
            return NotImplemented
        return self.settings() == other.settings()

    def __hash__(self):
        return hash(tuple(self.settings().values()))

    def __reduce__(self):
        return (_rebuild, (self.settings(),))


def _rebuild(settings):
    """A :class:`RunLength` from its settings (what pickling and :func:`copy.copy` use)."""
    return RunLength(**settings)
