"""RunLength, the run-length settings of tempered_gibbs: its checks, and the chains it gives.

The reference numbers below were recorded from fixed-seed runs of the sampler with these run lengths: the same
settings must keep giving the same chains, step for step.
"""

import copy
import inspect
import math
import pickle

import numpy as np
import pytest
import torch

from l0bayes.selection import RunLength, tempered_gibbs
from l0bayes.selection.sampler.run_length import RunLength as HomeRunLength

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")

DEFAULTS = {"warmup": 500, "max_steps": 100_000, "min_steps": 1000, "check_every": 1000, "time_budget": None}


# ------------------------------------------------------------------ the settings and their checks
def test_defaults_and_types():
    assert RunLength().settings() == DEFAULTS
    assert HomeRunLength is RunLength
    run = RunLength(warmup=10.0, max_steps=np.int64(300), min_steps=torch.tensor(20), check_every=5, time_budget=2)
    assert run.settings() == {"warmup": 10, "max_steps": 300, "min_steps": 20, "check_every": 5, "time_budget": 2.0}
    for name in ("warmup", "max_steps", "min_steps", "check_every"):
        assert type(getattr(run, name)) is int, name
    assert type(run.time_budget) is float
    assert RunLength(time_budget=math.inf).time_budget == math.inf  # no limit, as None
    assert RunLength(warmup=0, min_steps=0, max_steps=1, check_every=1).settings()["warmup"] == 0


def test_repr_equality_and_copies():
    run = RunLength(warmup=100, max_steps=2000, time_budget=1.5)
    assert repr(run) == "RunLength(warmup=100, max_steps=2000, min_steps=1000, check_every=1000, time_budget=1.5)"
    assert repr(RunLength()) == (
        "RunLength(warmup=500, max_steps=100000, min_steps=1000, check_every=1000, time_budget=None)"
    )
    assert eval(repr(run)) == run
    assert run == RunLength(warmup=100.0, max_steps=2000, time_budget=1.5)
    assert run != RunLength(warmup=101, max_steps=2000, time_budget=1.5) and run != "RunLength"
    assert hash(run) == hash(RunLength(warmup=100, max_steps=2000, time_budget=1.5))
    assert pickle.loads(pickle.dumps(run)) == run and copy.deepcopy(run) == run and copy.copy(run) == run


def test_settings_are_fixed_once_checked():
    run = RunLength()
    with pytest.raises(AttributeError, match="immutable"):
        run.warmup = -5
    with pytest.raises(AttributeError, match="immutable"):
        del run.max_steps
    with pytest.raises(AttributeError):
        run.steps = 10
    assert run == RunLength()


def test_settings_are_keywords():
    with pytest.raises(TypeError):
        RunLength(100, 2000)


BAD = [
    ("warmup", -1, ValueError, "warmup must be a whole number >= 0, got -1"),
    ("warmup", 2.5, ValueError, "warmup must be a whole number >= 0, got 2.5"),
    ("warmup", math.nan, ValueError, "warmup must be a whole number >= 0, got nan"),
    ("warmup", True, TypeError, "warmup must be a whole number >= 0, got the bool True"),
    ("warmup", "500", TypeError, "warmup must be a whole number >= 0, got str '500'"),
    ("max_steps", 0, ValueError, "max_steps must be a whole number >= 1, got 0"),
    ("max_steps", math.inf, ValueError, "max_steps must be a whole number >= 1, got inf"),
    ("max_steps", None, TypeError, "max_steps must be a whole number >= 1, got NoneType None"),
    ("min_steps", -3, ValueError, "min_steps must be a whole number >= 0, got -3"),
    ("min_steps", 0.5, ValueError, "min_steps must be a whole number >= 0, got 0.5"),
    ("check_every", 0, ValueError, "check_every must be a whole number >= 1, got 0"),
    ("check_every", False, TypeError, "check_every must be a whole number >= 1, got the bool False"),
    ("time_budget", 0, ValueError, r"time_budget must be a number of seconds > 0 \(inf: no limit\) \(or None\), got 0"),
    ("time_budget", -2.0, ValueError, "time_budget must be a number of seconds > 0 .*, got -2.0"),
    ("time_budget", math.nan, ValueError, "time_budget must be a number of seconds > 0 .*, got nan"),
    ("time_budget", -math.inf, ValueError, "time_budget must be a number of seconds > 0 .*, got -inf"),
    ("time_budget", "10s", TypeError, "time_budget must be a number of seconds > 0 .*, got str '10s'"),
    ("time_budget", True, TypeError, "time_budget must be a number of seconds > 0 .*, got the bool True"),
    ("warmup", np.array([1, 2]), TypeError, r"warmup must be a single number, got an array of shape \(2,\)"),
    (
        "time_budget",
        torch.tensor([1.0]),
        TypeError,
        r"time_budget must be a single number, got an array of shape \(1,\)",
    ),
]


@pytest.mark.parametrize(("name", "value", "error", "message"), BAD, ids=[f"{b[0]}={b[1]!r}" for b in BAD])
def test_bad_settings_are_refused(name, value, error, message):
    with pytest.raises(error, match=f"^RunLength: {message}$"):
        RunLength(**{name: value})


def test_tempered_gibbs_takes_a_run_length_or_none():
    x, y = torch.randn(20, 3, dtype=torch.float64), torch.randn(20, dtype=torch.float64)
    for bad in ({"warmup": 10}, 500, "short"):
        with pytest.raises(TypeError, match="^run_length must be a RunLength .*, got "):
            tempered_gibbs(x, y, 0.5, 1.0, 1.0, run_length=bad)
    with pytest.raises(TypeError, match="warmup"):
        tempered_gibbs(x, y, 0.5, 1.0, 1.0, warmup=10)  # the run length is one argument
    parameters = inspect.signature(tempered_gibbs).parameters
    assert len(parameters) <= 20 and parameters["run_length"].default is None


# ------------------------------------------------------------------ the same chains as the same arguments gave
def _data():
    rng = np.random.default_rng(11)
    n, p, rho = 150, 10, 0.9
    x = np.empty((n, p))
    x[:, 0] = rng.standard_normal(n)
    for j in range(1, p):
        x[:, j] = rho * x[:, j - 1] + math.sqrt(1 - rho**2) * rng.standard_normal(n)
    x = (x - x.mean(0)) / x.std(0, ddof=1)
    y = x[:, 2] - x[:, 5] + 0.6 * x[:, 8] + rng.standard_normal(n)
    return torch.tensor(x), torch.tensor(y - y.mean())


# fixed-seed runs (generator seed 5; prior_inclusion 0.2, slab_scale 0.5, noise_scale 1.0): steps after warm-up,
# why the run stopped, the inclusion probabilities
DEFAULT_RUN = (
    3000,
    "mixed",
    [0.06954841740220832, 0.11525450862181214, 0.9979909359880971, 0.11953765224835708, 0.1037021902876772,
     0.9948602516598997, 0.1468610226670987, 0.107380737594292, 0.7627714642316992, 0.3028497988598093],
)  # fmt: skip
EARLY_RUN = (  # warmup=50, min_steps=200, max_steps=5000, check_every=100: mixed at a check between the 1,000s
    2800,
    "mixed",
    [0.06959631782611254, 0.11465413314318829, 0.9980357758780767, 0.11933985167478252, 0.10380325944742068,
     0.9947291940204085, 0.14703537626909308, 0.10729050620038867, 0.7657999949310786, 0.2976816435599982],
)  # fmt: skip
NOISE_RUN = (  # noise_prior="jeffreys", warmup=20, min_steps=0, max_steps=300, check_every=7
    300,
    "steps",
    [0.06621647522576654, 0.107615388026487, 0.9989701448142899, 0.1162926360893041, 0.10259491438365319,
     0.9966713534166053, 0.14969401037170302, 0.09844432165150928, 0.8142910774856019, 0.2517027693894819],
)  # fmt: skip
NOISE_MEAN = 0.9414352094338656


def _run(run_length, **kw):
    x, y = _data()
    return tempered_gibbs(x, y, 0.2, 0.5, 1.0, run_length=run_length, generator=torch.Generator().manual_seed(5), **kw)


def _same(run, reference, warmup):
    steps, stopped, inclusion = reference
    assert (run.num_steps, run.details["stopped"], run.num_warmup) == (steps, stopped, warmup)
    np.testing.assert_allclose(run.inclusion, inclusion, rtol=1e-10, atol=0)


def test_the_default_run_length():
    none, default = _run(None), _run(RunLength())
    _same(none, DEFAULT_RUN, 500)
    np.testing.assert_array_equal(none.inclusion, default.inclusion)
    np.testing.assert_array_equal(none.coef_mean, default.coef_mean)
    assert default.num_steps == none.num_steps


def test_a_run_stopped_at_a_check_between_the_default_ones():
    _same(_run(RunLength(warmup=50, min_steps=200, max_steps=5000, check_every=100)), EARLY_RUN, 50)


def test_a_run_of_max_steps_with_the_noise_sampled():
    run = _run(RunLength(warmup=20, min_steps=0, max_steps=300, check_every=7), noise_prior="jeffreys")
    _same(run, NOISE_RUN, 20)
    assert run.details["noise_scale_mean"] == pytest.approx(NOISE_MEAN, rel=1e-10)
