"""ParameterAveraging and LogAlphaProjection: the paper's code's parameter averaging and log_alpha projection.

References are independent: the average is recomputed with NumPy from the raw iterates of separate runs (one step
per epoch, so every iterate is the end of a run), the projection against plain min/max.
"""

import math

import numpy as np
import pytest
import torch

from l0bayes.inference import LogAlphaProjection, ParameterAverage, ParameterAveraging, train
from l0bayes.models import SparseClassifier, SparseLinearRegression
from l0bayes.nn import L0MLP, gates_of


def _regression(n=64, p=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, p, generator=g)
    y = x[:, 0] * 2.0 - x[:, 1] + 0.3 * torch.randn(n, generator=g)
    return x, y


def _weighted_mean(iterates, beta):
    """sum_s (1 - beta) beta^(t - s) theta_s / (1 - beta^t), in float64 NumPy."""
    t = len(iterates)
    weights = np.array([(1 - beta) * beta ** (t - s) for s in range(1, t + 1)]) / (1 - beta**t)
    return sum(w * np.asarray(th, dtype=np.float64) for w, th in zip(weights, iterates, strict=True))


def test_parameter_average_is_the_bias_corrected_weighted_mean():
    layer = torch.nn.Linear(3, 2)
    average = ParameterAverage(layer, 0.8)
    rng = np.random.default_rng(0)
    iterates = []
    for _ in range(7):
        with torch.no_grad():
            layer.weight.copy_(torch.as_tensor(rng.normal(size=(2, 3)), dtype=torch.float32))
        iterates.append(layer.weight.detach().numpy().copy())
        average.update()
    np.testing.assert_allclose(average.averaged()[0].numpy(), _weighted_mean(iterates, 0.8), rtol=1e-5, atol=1e-6)
    # swapped(): the average inside, the raw parameters restored after
    raw = layer.weight.detach().clone()
    with average.swapped():
        np.testing.assert_allclose(layer.weight.detach().numpy(), _weighted_mean(iterates, 0.8), rtol=1e-5, atol=1e-6)
    assert torch.equal(layer.weight, raw)
    # decay 0 is the last iterate; weights of a constant sequence sum to one
    last = ParameterAverage(layer, 0.0)
    last.update()
    assert torch.equal(last.averaged()[0], layer.weight)
    const = ParameterAverage(layer, 0.999)
    for _ in range(3):
        const.update()
    torch.testing.assert_close(const.averaged()[0], layer.weight)


def test_parameter_average_errors_and_state_round_trip():
    layer = torch.nn.Linear(2, 2)
    for bad in (-0.1, 1.0, 1.5):
        with pytest.raises(ValueError, match="decay"):
            ParameterAverage(layer, bad)
    average = ParameterAverage(layer, 0.5)
    with pytest.raises(RuntimeError, match="no update"):
        average.averaged()
    average.update()
    copy = ParameterAverage(layer, 0.5)
    copy.load_state_dict(average.state_dict())
    assert copy.steps == 1 and all(torch.equal(a, b) for a, b in zip(copy.averaged(), average.averaged(), strict=True))
    with pytest.raises(ValueError, match="decay"):
        ParameterAverage(layer, 0.9).load_state_dict(average.state_dict())
    with pytest.raises(ValueError, match="tensors"):
        ParameterAverage(torch.nn.Linear(2, 2, bias=False), 0.5).load_state_dict(average.state_dict())


def _run(epochs, **kwargs):
    x, y = _regression()
    torch.manual_seed(0)
    model = SparseLinearRegression(6)
    # batch_size = N: one step per epoch, so the raw iterate after step t is the end of a t-epoch run
    result = train(model, x, y, objective="penalized", epochs=epochs, batch_size=64, lr=0.05, seed=1, progress=False,
                   test_data=None, **kwargs)  # fmt: skip
    return result, model


def test_train_returns_and_reports_the_average_of_its_iterates(tmp_path):
    beta, epochs = 0.7, 6
    iterates = []
    for t in range(1, epochs + 1):
        _, raw = _run(t)
        iterates.append({k: v.detach().numpy().copy() for k, v in raw.named_parameters()})
    result, model = _run(epochs, callbacks=[ParameterAveraging(beta)], checkpoint=str(tmp_path / "ckpt.pt"))
    for name, param in model.named_parameters():
        expected = _weighted_mean([it[name] for it in iterates], beta)
        np.testing.assert_allclose(param.detach().numpy(), expected, rtol=1e-5, atol=1e-6, err_msg=name)
    # the last record describes the averaged model: its gates' expected L0 under the averaged log_alpha
    assert result.history[-1]["expected_l0"] == pytest.approx(float(model.gate.expected_l0().detach()), rel=1e-6)
    # averaging does not change the training trajectory: the checkpoint holds the raw end point of a plain run
    saved = torch.load(tmp_path / "ckpt.pt", map_location="cpu", weights_only=True)["model"]
    for name, value in iterates[-1].items():
        assert torch.equal(saved[name], torch.as_tensor(value)), name


def test_resume_with_averaging_is_bit_identical(tmp_path):
    ckpt = tmp_path / "ckpt.pt"
    _, straight = _run(5, callbacks=[ParameterAveraging(0.9)])
    _run(2, callbacks=[ParameterAveraging(0.9)], checkpoint=str(ckpt))
    torch.manual_seed(99)
    x, y = _regression()
    resumed = SparseLinearRegression(6)
    train(resumed, x, y, objective="penalized", epochs=5, batch_size=64, lr=0.05, seed=1, progress=False,
          callbacks=[ParameterAveraging(0.9)], checkpoint=str(ckpt), resume=True)  # fmt: skip
    for (name, a), b in zip(straight.named_parameters(), resumed.parameters(), strict=True):
        assert torch.equal(a, b), name
    _run(2, checkpoint=str(tmp_path / "plain.pt"))  # trained without averaging: nothing to resume it from
    with pytest.raises(ValueError, match="no parameter average"):
        train(SparseLinearRegression(6), *_regression(), objective="penalized", epochs=3, batch_size=64, lr=0.05,
              seed=1, progress=False, callbacks=[ParameterAveraging(0.9)], checkpoint=str(tmp_path / "plain.pt"),
              resume=True)  # fmt: skip


def test_log_alpha_projection_bounds_every_gate():
    from sklearn.datasets import load_digits

    data = load_digits()
    x = torch.tensor(data.data[:300], dtype=torch.float32) / 16.0
    y = torch.tensor(data.target[:300])
    low, high = math.log(0.01), math.log(100.0)

    def fit(**kwargs):
        torch.manual_seed(0)
        net = L0MLP(in_features=64, hidden=(16,), num_classes=10, init_drop_rates=(0.2, 0.5))
        # a large lambda and learning rate push many log_alpha far below log 0.01 within a few epochs
        train(SparseClassifier(net, lam=200.0), x, y, objective="penalized", epochs=8, batch_size=50, lr=0.2,
              progress=False, **kwargs)  # fmt: skip
        return torch.cat([g.log_alpha.detach() for _, g in gates_of(net)])

    free = fit()
    assert float(free.min()) < low - 1  # without the projection log_alpha leaves the interval
    projected = fit(callbacks=[LogAlphaProjection(low, high)])
    low32, high32 = (torch.tensor(v, dtype=projected.dtype) for v in (low, high))  # the bounds in float32
    assert bool((projected >= low32).all()) and bool((projected <= high32).all())
    assert int((projected == low32).sum()) > 0  # some sit on the bound
    x2, y2 = _regression()
    for bad in ((1.0, -1.0), (0.0, 0.0)):
        with pytest.raises(ValueError, match="LogAlphaProjection: low must be below high"):
            LogAlphaProjection(*bad)
    with pytest.raises(ValueError, match=r"ParameterAveraging: decay must be a number in \[0, 1\), got 1.0"):
        ParameterAveraging(1.0)
    # both are callbacks: train() itself takes neither setting
    with pytest.raises(TypeError, match="log_alpha_range"):
        train(SparseLinearRegression(6), x2, y2, epochs=1, progress=False, log_alpha_range=(low, high))
    with pytest.raises(TypeError, match="ema_decay"):
        train(SparseLinearRegression(6), x2, y2, epochs=1, progress=False, ema_decay=0.9)
