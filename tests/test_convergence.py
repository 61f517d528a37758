"""The vectorised convergence diagnostics against ArviZ's, quantity by quantity."""

import numpy as np
import pytest

from l0bayes.selection.sampler.convergence import ess_mean, rank_rhat

az = pytest.importorskip("arviz")


def _chains(chains, draws, k, seed):
    """AR(1) chains with per-quantity autocorrelation and offsets (some chains shifted), plus odd cases."""
    rng = np.random.default_rng(seed)
    phi = rng.uniform(-0.5, 0.97, k)
    x = np.empty((chains, draws, k))
    x[:, 0] = rng.standard_normal((chains, k))
    for t in range(1, draws):
        x[:, t] = phi * x[:, t - 1] + np.sqrt(1 - phi**2) * rng.standard_normal((chains, k))
    x += rng.normal(0, 0.3, (chains, 1, k)) * (rng.random(k) < 0.3)  # some quantities unmixed
    x[:, :, 0] = 0.25  # constant
    x[:, :, 1] = np.round(x[:, :, 1])  # many ties
    x[:, :, 2] = (x[:, :, 2] > 1.5).astype(float)  # a rare 0/1 indicator
    return x


def _reference(x):
    ds = az.convert_to_dataset({"v": x})
    return (
        np.asarray(az.rhat(ds, method="rank")["v"].values, dtype=np.float64),
        np.asarray(az.ess(ds, method="mean")["v"].values, dtype=np.float64),
    )


@pytest.mark.parametrize("chains, draws", [(4, 200), (4, 201), (2, 37), (1, 50), (3, 9)])
def test_rank_rhat_and_ess_mean_equal_arviz(chains, draws):
    x = _chains(chains, draws, 40, seed=chains * 1000 + draws)
    rhat, ess = _reference(x)
    np.testing.assert_allclose(rank_rhat(x), rhat, rtol=1e-10, atol=1e-12, equal_nan=True)
    np.testing.assert_allclose(ess_mean(x), ess, rtol=1e-8, atol=1e-8, equal_nan=True)


def test_too_short_or_nan_gives_nan():
    x = _chains(4, 3, 5, seed=1)
    assert np.isnan(rank_rhat(x)).all() and np.isnan(ess_mean(x)).all()
    y = _chains(4, 60, 5, seed=2)
    y[1, 7, 3] = np.nan
    assert np.isnan(rank_rhat(y)[3]) and np.isnan(ess_mean(y)[3]) and np.isfinite(ess_mean(y)[4])
    assert np.isnan(rank_rhat(y[:1])).all()  # one chain: no R-hat
