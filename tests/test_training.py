"""train(): support recovery by SVI, exact resume, constrained sparsity, errors, networks, GPU."""

import pytest
import torch

from l0bayes.inference import Constrained, ExpectedFlops, NonFiniteLossError, train
from l0bayes.models import SparseClassifier, SparseLinearRegression
from l0bayes.nn import L0MLP, architecture


def _sparse_regression(n=500, p=50, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, p, generator=g)
    beta = torch.zeros(p)
    beta[:5] = torch.tensor([2.0, -1.5, 1.0, 0.8, -0.6])
    y = x @ beta + 0.5 * torch.randn(n, generator=g)
    return x, y


def test_svi_recovers_true_support(device):
    x, y = _sparse_regression()
    model = SparseLinearRegression(50, prior_inclusion=0.1)
    result = train(model, x, y, objective="bayes", epochs=100, batch_size=100, lr=0.05, device=device, progress=False)
    assert result.device.type == device.type and next(model.parameters()).device.type == "cpu"  # back home
    pi = model.inclusion_probabilities().cpu()
    assert (pi[:5] > 0.9).all(), pi[:5]
    assert (pi[5:] < 0.1).all(), pi[5:].max()
    last = result.history[-1]
    for key in ("free_energy", "nll", "gate_kl", "code_cost", "expected_l0", "wall_s"):
        assert key in last
    assert last["free_energy"] == pytest.approx(last["nll"] + last["gate_kl"] + last["code_cost"] + last["other_kl"])
    assert last["active_gates"] == [5]


def test_resume_gives_bit_identical_next_steps(tmp_path, device):
    # On CUDA too: the checkpoint holds the CUDA generator's state, and the next steps draw the same gates.
    x, y = _sparse_regression(n=200, p=10)
    ckpt = tmp_path / "ckpt.pt"
    run = {"batch_size": 50, "lr": 0.05, "seed": 3, "device": device, "progress": False}
    torch.manual_seed(0)  # same initial parameters for both runs
    straight = SparseLinearRegression(10)
    train(straight, x, y, epochs=4, **run)
    torch.manual_seed(0)
    first = SparseLinearRegression(10)
    train(first, x, y, epochs=2, checkpoint=str(ckpt), **run)
    torch.manual_seed(1234)  # disturb the global RNGs (the CUDA one too): resume must restore them
    resumed = SparseLinearRegression(10)
    result = train(resumed, x, y, epochs=4, checkpoint=str(ckpt), resume=True, **run)
    assert [h["epoch"] for h in result.history] == [1, 2, 3, 4]
    for a, b in zip(straight.state_dict().values(), resumed.state_dict().values(), strict=True):
        assert torch.equal(a, b)


def test_seeded_runs_are_reproducible():
    x, y = _sparse_regression(n=100, p=8)
    torch.manual_seed(0)
    a = SparseLinearRegression(8)
    torch.manual_seed(0)
    b = SparseLinearRegression(8)
    ha = train(a, x, y, epochs=2, batch_size=25, seed=7, progress=False).history
    hb = train(b, x, y, epochs=2, batch_size=25, seed=7, progress=False).history
    assert [h["free_energy"] for h in ha] == [h["free_energy"] for h in hb]


def test_constrained_training_meets_target_density(device):
    x, y = _sparse_regression()
    target = 0.06  # three of fifty gates, fewer than the five true features: the constraint binds
    model = SparseLinearRegression(50)
    result = train(
        model, x, y, objective=Constrained(target_density=target), epochs=60, batch_size=100, lr=0.05,
        device=device, progress=False,
    )  # fmt: skip
    density = result.history[-1]["constraint"][0]
    assert abs(density - target) <= 0.01
    assert max(h["multipliers"][0] for h in result.history) > 0


def test_errors_are_clear():
    x, y = _sparse_regression(n=50, p=5)
    model = SparseLinearRegression(5)
    with pytest.raises(ValueError, match="objective"):
        train(model, x, y, objective="map", progress=False)
    with pytest.raises(ValueError, match=r"objective='constrained' needs its target.*Constrained\(target_density="):
        train(model, x, y, objective="constrained", progress=False)
    with pytest.raises(ValueError, match="rows"):
        train(model, x, y[:10], progress=False)
    bad = x.clone()
    bad[3, 2] = float("nan")
    with pytest.raises(ValueError, match="NaN"):
        train(model, bad, y, progress=False)
    with pytest.raises(FileNotFoundError):
        train(model, x, y, resume=True, checkpoint="/nonexistent/ckpt.pt", progress=False)
    with pytest.raises(NonFiniteLossError):
        train(SparseLinearRegression(5), x, y * 1e30, epochs=1, progress=False)


def _digits(n=400):
    from sklearn.datasets import load_digits

    data = load_digits()
    x = torch.tensor(data.data[:n], dtype=torch.float32) / 16.0
    y = torch.tensor(data.target[:n], dtype=torch.long)
    return x, y


@pytest.mark.parametrize("objective", ["penalized", "bayes", "constrained"])
def test_l0_mlp_classifier_trains(objective, device):
    pytest.importorskip("sklearn")
    x, y = _digits()
    net = L0MLP(in_features=64, hidden=(32, 16), num_classes=10)
    model = SparseClassifier(net, lam=0.1)
    result = train(
        model,
        x,
        y,
        objective=Constrained(target_density=0.8) if objective == "constrained" else objective,
        epochs=12,
        batch_size=50,
        lr=2e-2,
        device=device,
        test_data=(x, y),
        callbacks=[ExpectedFlops((64,))],
        progress=False,
    )
    assert result.device.type == device.type and next(model.parameters()).device.type == "cpu"  # back home
    assert result.history[-1]["test_error"] < 0.35
    if objective == "constrained":  # the final phase fixes the gates within the target
        assert result.history[-1]["test_time_density"] <= 0.8 + 1e-9
    assert result.history[-1]["expected_flops"] > 0
    assert len(architecture(net).split("-")) == 3
    with pytest.raises(ValueError, match="labels"):
        train(model, x, y + 10, epochs=1, progress=False)


def test_per_layer_lambdas_and_pyro_gate_sites():
    import pyro

    from l0bayes.nn import gate_prior, pyro_gates

    net = L0MLP(in_features=6, hidden=(4, 3), num_classes=2)
    model = SparseClassifier(net, lam={"fc1": 0.5, "fc3": 2.0})
    expected = 0.5 * net.fc1.gate.expected_l0() + 2.0 * net.fc3.gate.expected_l0()
    assert float(model.code_cost()) == pytest.approx(float(expected))
    with pytest.raises(ValueError, match="unknown layers"):
        SparseClassifier(net, lam={"fc9": 1.0})
    with pyro.poutine.trace() as tracer, pyro_gates(net, gate_prior(0.3)):  # a bare prior, not a callable
        net(torch.randn(5, 6))
    sites = [name for name, site in tracer.trace.nodes.items() if site["type"] == "sample"]
    assert sites == ["fc1.gate", "fc2.gate", "fc3.gate"]


def test_regression_records_test_rmse_each_epoch():
    """``test_rmse`` is the RMSE of the Eq. 13 prediction, checked against NumPy for the final model."""
    import numpy as np

    x, y = _sparse_regression(n=600)
    model = SparseLinearRegression(50, prior_inclusion=0.1)
    test = (x[500:], y[500:])
    result = train(model, x[:500], y[:500], objective="bayes", epochs=40, batch_size=100, lr=0.05, test_data=test)
    rmse = [r["test_rmse"] for r in result.history]
    assert len(rmse) == 40 and all(r is not None for r in rmse)
    coef = model.coefficients().numpy().astype(np.float64)
    pred = test[0].numpy().astype(np.float64) @ coef + float(model.bias)
    expected = np.sqrt(np.mean((pred - test[1].numpy()) ** 2))
    assert rmse[-1] == pytest.approx(expected, rel=1e-5)
    assert rmse[-1] < 0.7 < rmse[0]  # noise sd 0.5: the fit gets there from an empty model's ~2.8
    assert result.history[-1]["test_error"] is None


@pytest.mark.parametrize("kl", [True, False])
def test_record_free_energy_equals_pyro_traces(kl):
    # The end-of-epoch record takes the model's fused losses; Pyro's traces of model and guide
    # (free_energy) are the reference, for the same gate draws.
    from l0bayes.inference.callbacks.records import _free_energy_terms
    from l0bayes.inference.free_energy import free_energy

    torch.manual_seed(0)
    model = SparseClassifier(L0MLP(6, (5, 4), 3), lam=0.3, weight_decay=0.01).double().train()
    x = torch.randn(40, 6, dtype=torch.float64)
    y = torch.randint(0, 3, (40,))
    torch.manual_seed(7)
    fast = _free_energy_terms(model, x, y, 1000, kl)
    torch.manual_seed(7)
    reference = free_energy(model.model, model.guide, x, y, 1000, kl=kl)
    for name in ("nll", "gate_kl", "other_kl", "code_cost"):
        a, b = float(getattr(fast, name)), float(getattr(reference, name))
        assert abs(a - b) <= 1e-12 * max(1.0, abs(b)), (name, a, b)
    assert (float(fast.gate_kl) > 0) == kl


def test_train_names_the_first_non_finite_step_on_each_device(device):
    # On the CPU the objective is read every step; on a GPU the flag is read at the epoch's end here.
    x, y = _sparse_regression(n=200, p=5)
    with pytest.raises(NonFiniteLossError, match=r"epoch 1, step 1[ ;]"):
        train(SparseLinearRegression(5), x, y * 1e30, epochs=2, batch_size=50, progress=False, device=device)


class _RowCounter(torch.nn.Module):
    """A gated network (gates that stay open: log_alpha 30, so every draw is exactly 1) that remembers the largest
    number of rows any forward pass saw."""

    def __init__(self):
        super().__init__()
        from l0bayes.pruning import sparsify

        torch.manual_seed(0)
        self.body = sparsify(torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 1)))
        for _, gate in gates_of_net(self.body):
            gate.log_alpha.data.fill_(30.0)
        self.most = 0

    def forward(self, x):
        self.most = max(self.most, x.shape[0])
        return self.body(x).squeeze(-1)


def gates_of_net(net):
    from l0bayes.nn import gates_of

    return gates_of(net)


@pytest.mark.parametrize("as_loader", [False, True])
def test_the_full_record_and_held_out_metrics_run_one_training_batch_at_a_time(as_loader):
    """A record of the fixed training examples (up to 1000) and of held-out data runs the network on no more rows
    than a training step: a language model's record would otherwise hold a thousand sequences' logits at once.
    The chunked record is the whole subset's: the data term equals N times the mean loss over all its rows."""
    from l0bayes.models import SparseModel

    torch.manual_seed(1)
    x, y = torch.randn(50, 3), torch.randn(50)
    net = _RowCounter()
    model = SparseModel(net, torch.nn.functional.mse_loss, lam=0.0)
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=8) if as_loader else x
    result = train(
        model,
        data,
        None if as_loader else y,
        objective="penalized",
        epochs=1,
        batch_size=8,
        test_data=(x, y),
        validation_data=(x, y),
        progress=False,
        device="cpu",
    )
    assert net.most == 8
    record = result.history[-1]  # after the epoch's steps: the trained weights'
    with torch.no_grad():
        mean_loss = float(torch.nn.functional.mse_loss(net.body(x).squeeze(-1), y))
    assert record["nll"] == pytest.approx(50 * mean_loss, rel=1e-5)
    assert record["test_loss"] == pytest.approx(mean_loss, rel=1e-5)
    assert record["validation_loss"] == pytest.approx(mean_loss, rel=1e-5)
