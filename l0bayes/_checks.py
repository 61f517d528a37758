"""Argument checks as data: a module declares ``{argument: rule}`` once and calls :func:`check_args`.

Every failed rule raises an error that names the owner and the argument: :class:`TypeError` for a
value of the wrong kind (a string, a bool, an integer tensor where a real is needed),
:class:`ValueError` for a value of the right kind outside its domain (NaN, infinity, a negative
scale, a fractional count). A tensor or array passes only if every element does.
"""

import math
import numbers

import numpy as np
import torch


class Rule:
    """A named requirement on one scalar (or every element of a tensor / array).

    :param requirement: the phrase completing ``"<name> must be ..."`` in the error message.
    :param test: ``float64 numpy array -> bool array``, true where the value is allowed.
    :param optional: ``None`` is allowed (the argument's default, e.g. "learn it").
    :param integer: the value must be a whole number (an ``int``, or a float such as ``3.0``).
    """

    def __init__(self, requirement, test, optional=False, integer=False):
        self.requirement = requirement
        self.test = test
        self.optional = optional
        self.integer = integer

    def or_none(self):
        """The same rule, also allowing ``None``."""
        return Rule(self.requirement + " (or None)", self.test, optional=True, integer=self.integer)

    def __call__(self, owner, name, value):
        if value is None and self.optional:
            return
        array = _as_real_array(owner, name, value, self.requirement)
        ok = bool(np.all(self.test(array)))
        if ok and self.integer:
            ok = bool(np.all(np.isfinite(array) & (array == np.round(array))))
        if not ok:
            raise ValueError(f"{owner}: {name} must be {self.requirement}, got {_show(value)}")


def _show(value):
    if torch.is_tensor(value) or isinstance(value, np.ndarray):
        if value.size == 1 if isinstance(value, np.ndarray) else value.numel() == 1:
            return repr(value.item())
        return f"an array of shape {tuple(value.shape)} with elements outside that range"
    return repr(value)


def _as_real_array(owner, name, value, requirement):
    """``value`` as a float64 numpy array; :class:`TypeError` naming ``name`` if it is not real-valued."""
    if isinstance(value, bool) or (torch.is_tensor(value) and value.dtype == torch.bool):
        raise TypeError(f"{owner}: {name} must be {requirement}, got the bool {value!r}")
    if torch.is_tensor(value):
        if value.is_complex():
            raise TypeError(f"{owner}: {name} must be real, got a {value.dtype} tensor")
        return value.detach().to("cpu", torch.float64).numpy()
    if isinstance(value, numbers.Real) or (isinstance(value, np.ndarray) and value.dtype.kind in "iuf"):
        return np.asarray(value, dtype=np.float64)
    raise TypeError(f"{owner}: {name} must be {requirement}, got {type(value).__name__} {value!r}")


def check_args(owner, table, **values):
    """Check each of ``values`` against its rule in ``table`` (names absent from ``table`` are an error).

    :param str owner: who is checking, for the message (``"SparseClassifier"``).
    :param dict table: ``{argument name: Rule}``, the module's table of argument checks.
    """
    for name, value in values.items():
        table[name](owner, name, value)


class Choice:
    """A rule for a setting that takes one of a few values (compared with ``==``, never coerced): a
    :class:`ValueError` naming the owner, the argument and the values allowed otherwise."""

    def __init__(self, values):
        self.values = tuple(values)

    def __call__(self, owner, name, value):
        if not any(type(value) is type(v) and value == v for v in self.values):
            raise ValueError(f"{owner}: {name} must be one of {self.values}, got {value!r}")


class Flag:
    """A rule for a switch: ``True`` or ``False`` (a :class:`TypeError` for anything else: ``0``, ``"yes"``)."""

    def __call__(self, owner, name, value):
        if not isinstance(value, (bool, np.bool_)):
            raise TypeError(f"{owner}: {name} must be True or False, got {type(value).__name__} {value!r}")


FLAG = Flag()
FINITE = Rule("a finite real number", np.isfinite)
POSITIVE = Rule("a finite number > 0", lambda v: np.isfinite(v) & (v > 0))
NON_NEGATIVE = Rule("a finite number >= 0", lambda v: np.isfinite(v) & (v >= 0))
PROBABILITY = Rule("a probability strictly between 0 and 1", lambda v: (v > 0) & (v < 1))
BELOW_ZERO = Rule("a finite number < 0", lambda v: np.isfinite(v) & (v < 0))
ABOVE_ONE = Rule("a finite number > 1", lambda v: np.isfinite(v) & (v > 1))
COUNT = Rule("a whole number >= 1", lambda v: v >= 1, integer=True)
SEED = Rule("a whole number >= 0", lambda v: (v >= 0) & (v < 2**64), integer=True)
NON_NEGATIVE_COUNT = Rule("a whole number >= 0", lambda v: v >= 0, integer=True)

#: Seeds lie in ``[0, SEED_LIMIT)``: what ``torch.manual_seed`` and ``torch.Generator.manual_seed`` accept
#: (negative seeds are taken modulo ``2**64`` there; here they are refused).
SEED_LIMIT = 2**64

# The hard concrete stretch and temperature, shared by every module that builds a gate.
GATE_SHAPE = {"temperature": POSITIVE, "lower": BELOW_ZERO, "upper": ABOVE_ONE}


def check_seed(seed, name="seed"):
    """``seed`` as a Python ``int`` when it is a whole number in ``[0, 2**64)``, exactly (no rounding through a float).

    :raises TypeError: naming ``name`` for anything but an integer (a float, a bool, a string).
    :raises ValueError: naming ``name`` and the value for an integer outside the range.
    """
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral):
        raise TypeError(f"{name} must be a whole number in [0, 2**64), got {type(seed).__name__} {seed!r}")
    if not 0 <= int(seed) < SEED_LIMIT:
        raise ValueError(f"{name} must be a whole number in [0, 2**64) (what torch.manual_seed accepts), got {seed}")
    return int(seed)


def whole(value):
    """A value that passed a ``COUNT`` / ``SEED`` rule (a whole number) as a Python ``int``: an integer exactly, a
    float such as ``3.0`` (or a one-element tensor) through ``float``."""
    if isinstance(value, numbers.Integral):
        return int(value)
    return int(math.floor(float(value)))


def check_shape(owner, name, shape):
    """``shape`` (one example's shape without the batch dimension: a whole number or a sequence of them, each
    ``>= 1``) as a tuple of Python ints; a :class:`ValueError` naming ``owner`` and ``name`` otherwise (a
    :class:`TypeError` for what is not a number or a sequence)."""
    if isinstance(shape, numbers.Integral) and not isinstance(shape, bool):
        shape_values = (shape,)
    else:
        try:
            shape_values = tuple(shape)
        except TypeError:
            raise TypeError(
                f"{owner}: {name} must be a tuple of whole numbers >= 1, got {type(shape).__name__} {shape!r}"
            ) from None
    if not shape_values or not all(
        isinstance(v, numbers.Integral) and not isinstance(v, bool) and v >= 1 for v in shape_values
    ):
        raise ValueError(f"{owner}: {name} must be a tuple of whole numbers >= 1, got {shape!r}")
    return tuple(int(v) for v in shape_values)
