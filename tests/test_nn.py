"""L0 layers, networks, penalty, pruning and FLOP counts (Sections 2.3-2.4, Eq. 12-17; Table 1, Fig. 3)."""

import math

import pyro
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from l0bayes.distributions import HardConcrete
from l0bayes.nn import (
    L0MLP,
    MLP,
    L0Conv2d,
    L0LeNet5,
    L0Linear,
    LeNet5,
    architecture,
    expected_l0,
    expected_l2,
    l0_layers,
    penalty,
    pyro_gates,
)
from l0bayes.pruning import PruneReport, SelectFeatures, count_parameters, expected_flops, flops, prune

BETA, GAMMA, ZETA = 2.0 / 3.0, -0.1, 1.1


def _q_nonzero(log_alpha, beta=BETA, gamma=GAMMA, zeta=ZETA):
    """Eq. 12 by hand, one float at a time."""
    return 1.0 / (1.0 + math.exp(-(log_alpha - beta * math.log(-gamma / zeta))))


def _zhat(log_alpha, gamma=GAMMA, zeta=ZETA):
    """Eq. 13 by hand."""
    return min(1.0, max(0.0, (zeta - gamma) / (1.0 + math.exp(-log_alpha)) + gamma))


def _set_log_alpha(module, scale=3.0, seed=0):
    """Random log_alpha with closed (zhat = 0), fractional and fully open gates in every layer."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, layer in l0_layers(module):
            la = torch.randn(layer.num_gates, generator=g, dtype=layer.gate.log_alpha.dtype) * scale
            la[0], la[-1] = -6.0, 0.0  # one surely closed, one fractional
            layer.gate.log_alpha.copy_(la)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    pyro.set_rng_seed(0)


# ---------------------------------------------------------------------------- layers


@pytest.mark.parametrize("beta,gamma,zeta", [(BETA, GAMMA, ZETA), (0.5, -0.2, 1.05)])
def test_expected_l0_matches_sigmoid_formula(beta, gamma, zeta):
    lin = L0Linear(7, 5, temperature=beta, lower=gamma, upper=zeta)
    conv = L0Conv2d(3, 4, (3, 2), temperature=beta, lower=gamma, upper=zeta)
    for layer, group in [(lin, 5), (conv, 3 * 3 * 2)]:
        with torch.no_grad():
            layer.gate.log_alpha.normal_(0.0, 2.0)
        la = layer.gate.log_alpha.tolist()
        hand = group * sum(_q_nonzero(a, beta, gamma, zeta) for a in la)
        assert layer.group_size == group
        assert layer.expected_l0().item() == pytest.approx(hand, rel=1e-6)
        assert torch.equal(layer.active_mask(), torch.tensor([_zhat(a, gamma, zeta) > 0 for a in la]))
    assert expected_l0(nn.Sequential(lin, nn.Flatten(), conv)).item() == pytest.approx(
        lin.expected_l0().item() + conv.expected_l0().item(), rel=1e-6
    )


def test_expected_l2_by_hand():
    lin = L0Linear(2, 3).double()
    conv = L0Conv2d(2, 2, 2).double()
    with torch.no_grad():
        lin.weight.copy_(torch.tensor([[1.0, 2.0], [3.0, -1.0], [0.5, 0.0]]))
        lin.bias.copy_(torch.tensor([1.0, -2.0, 0.5], dtype=torch.float64))
        lin.gate.log_alpha.copy_(torch.tensor([0.3, -1.2], dtype=torch.float64))
        conv.weight.copy_(torch.arange(16.0).view(2, 2, 2, 2) / 4 - 1)
        conv.bias.copy_(torch.tensor([0.7, -0.4], dtype=torch.float64))
        conv.gate.log_alpha.copy_(torch.tensor([1.5, -0.5], dtype=torch.float64))
    # L0Linear: the group of input i is the column W[:, i]; the ungated bias counts fully
    q0, q1 = _q_nonzero(0.3), _q_nonzero(-1.2)
    hand = q0 * (1 + 9 + 0.25) + q1 * (4 + 1 + 0) + (1 + 4 + 0.25)
    assert lin.expected_l2().item() == pytest.approx(hand, rel=1e-12)
    # L0Conv2d: the group of map c is W[c] and its bias
    w = (torch.arange(16.0) / 4 - 1).tolist()
    hand = _q_nonzero(1.5) * (sum(v * v for v in w[:8]) + 0.49) + _q_nonzero(-0.5) * (sum(v * v for v in w[8:]) + 0.16)
    assert conv.expected_l2().item() == pytest.approx(hand, rel=1e-12)
    assert expected_l2(nn.Sequential(lin)).item() == pytest.approx(lin.expected_l2().item(), rel=1e-12)


def test_eval_mode_uses_eq13():
    lin, conv = L0Linear(6, 4).double().eval(), L0Conv2d(2, 5, 3, padding=1).double().eval()
    with torch.no_grad():
        lin.gate.log_alpha.copy_(torch.tensor([-4.0, -2.0, 0.0, 0.5, 2.0, 4.0]))
        conv.gate.log_alpha.copy_(torch.tensor([-3.0, -0.5, 0.0, 2.3, 5.0]))
    z = torch.tensor([_zhat(a) for a in lin.gate.log_alpha.tolist()], dtype=torch.float64)
    assert (z == 0).any() and ((z > 0) & (z < 1)).any() and (z == 1).any()
    x = torch.randn(3, 6, dtype=torch.float64)
    torch.testing.assert_close(lin(x), F.linear(x * z, lin.weight, lin.bias))
    torch.testing.assert_close(lin(x), lin(x))  # deterministic
    z = torch.tensor([_zhat(a) for a in conv.gate.log_alpha.tolist()], dtype=torch.float64)
    x = torch.randn(2, 2, 5, 5, dtype=torch.float64)
    ref = F.conv2d(x, conv.weight, conv.bias, padding=1) * z.view(1, -1, 1, 1)
    torch.testing.assert_close(conv(x), ref)
    assert (conv(x)[:, z == 0] == 0).all()  # a closed map is exactly zero, bias included


def test_train_mode_exact_zeros_for_very_negative_log_alpha():
    lin, conv = L0Linear(4, 3).train(), L0Conv2d(2, 4, 3).train()
    with torch.no_grad():
        lin.gate.log_alpha.copy_(torch.tensor([-30.0, 0.0, -30.0, 30.0]))
        conv.gate.log_alpha.copy_(torch.tensor([0.0, -30.0, 30.0, -30.0]))
    x = torch.randn(5, 4)
    for _ in range(50):
        z = lin.gate()
        assert z[0] == 0 and z[2] == 0 and z[3] == 1
        # the closed inputs do not reach the output
        x2 = x.clone()
        x2[:, [0, 2]] = 1e6
        torch.manual_seed(1)
        a = lin(x)
        torch.manual_seed(1)
        b = lin(x2)
        assert torch.equal(a, b)
        y = conv(torch.randn(2, 2, 6, 6))
        assert (y[:, [1, 3]] == 0).all() and (y[:, 2] != 0).any()


@pytest.mark.parametrize("kind", ["linear", "conv"])
def test_monte_carlo_l0_norm_matches_expected_l0(kind):
    layer = L0Linear(30, 4) if kind == "linear" else L0Conv2d(2, 30, 2)
    with torch.no_grad():
        layer.gate.log_alpha.copy_(torch.linspace(-4.0, 4.0, 30))
    layer.train()
    n = 4000
    counts = torch.empty(n)
    for k in range(n):
        z = layer.gate()
        theta = layer.weight * (z if kind == "linear" else z[:, None, None, None])  # theta = theta~ . z
        counts[k] = torch.count_nonzero(theta)
    se = counts.std() / math.sqrt(n)
    assert abs(counts.mean() - layer.expected_l0().detach()) < 4 * se
    assert se > 0


def test_gradients_flow_to_log_alpha_and_weights():
    for model, shape in [(L0MLP(64, (16, 8)), (64,)), (L0LeNet5(input_size=8, padding=2), (1, 8, 8))]:
        model.train()
        x, y = torch.randn(8, *shape), torch.randint(0, 10, (8,))
        loss = F.cross_entropy(model(x), y) + penalty(model, 1e-3, weight_decay=1e-4)
        loss.backward()
        for name, p in model.named_parameters():
            assert p.grad is not None and torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0, name


def test_pyro_gates_sites_in_networks():
    model = L0LeNet5(input_size=8, padding=2)
    prior = HardConcrete(torch.tensor(0.0))
    # a callable gate -> prior (a bare Pyro distribution is itself callable, see gates.pyro_gates)
    with pyro_gates(model, lambda gate: prior):
        trace = pyro.poutine.trace(model).get_trace(torch.randn(2, 1, 8, 8))
    sites = [n for n, s in trace.nodes.items() if s["type"] == "sample"]
    assert sites == ["conv1.gate", "conv2.gate", "fc1.gate", "fc2.gate"]
    assert trace.nodes["fc1.gate"]["value"].shape == (200,)


# ---------------------------------------------------------------------------- penalty


def test_penalty_float_and_per_layer_dict():
    model = L0MLP(64, (16, 8))
    lam, wd = 0.3, 0.01
    ref = sum(lam * m.expected_l0() + 0.5 * wd * m.expected_l2() for _, m in l0_layers(model))
    torch.testing.assert_close(penalty(model, lam, weight_decay=wd), ref)
    torch.testing.assert_close(penalty(model, lam), lam * expected_l0(model))
    lams = {"fc1": 1.0, "fc2": 0.0, "fc3": 2.0}
    ref = model.fc1.expected_l0() + 2 * model.fc3.expected_l0()
    torch.testing.assert_close(penalty(model, lams), ref)
    with pytest.raises(ValueError, match="missing"):
        penalty(model, {"fc1": 1.0})
    with pytest.raises(ValueError, match="unknown"):
        penalty(model, {**lams, "fc4": 1.0})
    with pytest.raises(ValueError):
        penalty(model, -1.0)


# ---------------------------------------------------------------------------- networks


def test_network_shapes_and_sizes():
    assert L0MLP()(torch.randn(2, 1, 28, 28)).shape == (2, 10)
    assert L0MLP(64, (32, 16))(torch.randn(2, 64)).shape == (2, 10)
    lenet = L0LeNet5()
    assert lenet.flat_features == 800 and lenet(torch.randn(2, 1, 28, 28)).shape == (2, 10)
    assert [m.num_gates for _, m in l0_layers(lenet)] == [20, 50, 800, 500]
    assert [m.group_size for _, m in l0_layers(lenet)] == [25, 500, 500, 10]
    small = L0LeNet5(input_size=8, padding=2)
    assert small.flat_features == 200 and small(torch.randn(2, 1, 8, 8)).shape == (2, 10)
    assert L0LeNet5(3, 5, input_size=(16, 20)).flat_features == 50 * 1 * 2  # 12x16, 6x8, 2x4, 1x2
    with pytest.raises(ValueError, match="padding"):
        L0LeNet5(input_size=8)
    assert [name for name, _ in l0_layers(L0MLP())] == ["fc1", "fc2", "fc3"]


def test_init_drop_rates():
    model = L0MLP(init_drop_rates=(0.2, 0.5, 0.5))
    keep = [torch.sigmoid(m.gate.log_alpha).mean().item() for _, m in l0_layers(model)]
    assert keep == pytest.approx([0.8, 0.5, 0.5], abs=0.01)


# ---------------------------------------------------------------------------- prune


NETWORKS = {
    "mlp784": (lambda: L0MLP(), (784,)),
    "mlp64": (lambda: L0MLP(64, (32, 16)), (64,)),
    "lenet28": (lambda: L0LeNet5(), (1, 28, 28)),
    "lenet8": (lambda: L0LeNet5(input_size=8, padding=2), (1, 8, 8)),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("net", list(NETWORKS))
def test_pruned_export_equals_gated_model(net, dtype):
    make, shape = NETWORKS[net]
    model = make().to(dtype)
    _set_log_alpha(model)
    model.eval()
    for _, layer in l0_layers(model):
        z = layer.gate_values()
        assert (z == 0).any() and ((z > 0) & (z < 1)).any()
    pruned = prune(model)
    assert all(
        isinstance(m, (nn.Linear, nn.Conv2d, nn.ReLU, nn.MaxPool2d, nn.Flatten, SelectFeatures))
        for m in pruned.children()
    )
    assert not any(isinstance(m, (L0Linear, L0Conv2d)) for m in pruned.modules())
    x = torch.randn(16, *shape, dtype=dtype)
    with torch.no_grad():
        ref, out = model(x), pruned(x)
    tol = 1e-5 if dtype == torch.float32 else 1e-12
    torch.testing.assert_close(out, ref, atol=tol, rtol=tol)
    assert count_parameters(pruned) < count_parameters(model)
    assert flops(pruned, shape) < flops(model, shape)
    assert pruned[0].weight.dtype == dtype if isinstance(pruned[0], nn.Conv2d) else True


def test_prune_removes_the_right_units_lenet():
    model = L0LeNet5(input_size=8, padding=2).double().eval()  # 20 -> 50 maps, fc1 200 -> 500, fc2 500 -> 10
    with torch.no_grad():
        for _, layer in l0_layers(model):
            layer.gate.log_alpha.fill_(5.0)  # all open (zhat = 1)
        model.conv1.gate.log_alpha[[3, 7]] = -5.0  # 2 closed conv1 maps: conv2 loses 2 input channels
        model.conv2.gate.log_alpha[:10] = -5.0  # 10 closed conv2 maps: 10 * 4 flattened columns go
        model.conv2.gate.log_alpha[10] = 0.0  # a fractional map, kept and folded
        fc1_gate = model.fc1.gate.log_alpha.view(50, 4)
        fc1_gate[20] = -5.0  # open conv2 map 20 with all its 4 columns closed: map removed too
        fc1_gate[21, :2] = -5.0  # 2 of the 4 columns of map 21 closed: selected out after flatten
        model.fc2.gate.log_alpha[:100] = -5.0  # fc1 loses 100 output rows
    assert architecture(model) == "18-40-194-400"
    pruned = prune(model)
    assert pruned.conv1.weight.shape == (18, 1, 5, 5)
    assert pruned.conv2.weight.shape == (39, 18, 5, 5)
    assert isinstance(pruned.select_fc1, SelectFeatures) and pruned.select_fc1.index.numel() == 154
    assert pruned.select_fc1.num_inputs == 39 * 4
    assert pruned.fc1.weight.shape == (400, 154)
    assert pruned.fc2.weight.shape == (10, 400)
    x = torch.randn(4, 1, 8, 8, dtype=torch.float64)
    with torch.no_grad():
        torch.testing.assert_close(pruned(x), model(x), atol=1e-12, rtol=1e-12)


def test_prune_linear_chain_and_input_select():
    model = L0MLP(10, (6, 4), num_classes=3).eval()
    with torch.no_grad():
        model.fc1.gate.log_alpha.copy_(torch.tensor([5.0, -5, 5, 5, -5, 5, 0, 5, 5, -5]))
        model.fc2.gate.log_alpha.copy_(torch.tensor([-5.0, 5, 5, -5, 0.0, 5]))
        model.fc3.gate.log_alpha.copy_(torch.tensor([5.0, -5, 5, 5]))
    assert architecture(model) == "7-4-3"
    pruned = prune(model)
    assert pruned.select_fc1.index.tolist() == [0, 2, 3, 5, 6, 7, 8]
    assert pruned.fc1.weight.shape == (4, 7)  # rows of the 2 inputs closed by fc2 removed
    assert pruned.fc2.weight.shape == (3, 4)
    assert pruned.fc3.weight.shape == (3, 3)  # network outputs never removed
    x = torch.randn(5, 10)
    with torch.no_grad():
        torch.testing.assert_close(pruned(x), model(x), atol=1e-6, rtol=1e-6)


def test_prune_with_every_gate_of_a_layer_closed():
    model = L0LeNet5(input_size=8, padding=2).eval()
    with torch.no_grad():
        model.conv2.gate.log_alpha.fill_(-8.0)
        model.fc2.gate.log_alpha.fill_(-8.0)
    assert architecture(model).split("-")[1] == "0"
    pruned = prune(model)
    x = torch.randn(3, 1, 8, 8)
    with torch.no_grad():
        torch.testing.assert_close(pruned(x), model(x), atol=1e-6, rtol=1e-6)


def test_architecture_string_constructed():
    mlp = L0MLP()
    with torch.no_grad():
        for layer, n_open in zip([mlp.fc1, mlp.fc2, mlp.fc3], [219, 214, 100]):
            la = torch.full((layer.num_gates,), -3.0)
            la[torch.randperm(layer.num_gates)[:n_open]] = 0.5  # zhat = 0.6 > 0; -3.0 gives zhat = 0
            layer.gate.log_alpha.copy_(la)
    assert architecture(mlp) == "219-214-100"
    lenet = L0LeNet5()
    with torch.no_grad():
        for (_, layer), n_open in zip(l0_layers(lenet), [20, 25, 45, 462]):
            la = torch.full((layer.num_gates,), -2.4)  # just below the Eq. 13 threshold logit(1/12) = -2.398
            la[:n_open] = -2.39
            layer.gate.log_alpha.copy_(la)
    assert architecture(lenet) == "20-25-45-462"


# ---------------------------------------------------------------------------- counting


def test_count_parameters_and_flops_dense_mlp_by_hand():
    dense = MLP()
    params = 784 * 300 + 300 + 300 * 100 + 100 + 100 * 10 + 10
    ops = 2 * (784 * 300 + 300 * 100 + 100 * 10) + (300 + 100 + 10)  # 2 * multiply-adds + bias adds
    assert count_parameters(dense) == params == 266610
    assert flops(dense, (784,)) == ops == flops(dense, (1, 28, 28))
    gated = L0MLP()
    assert count_parameters(gated) == params  # gates excluded
    assert count_parameters(gated, include_gates=True) == params + 784 + 300 + 100
    assert flops(gated, 784) == ops
    torch.testing.assert_close(expected_flops(MLP(), (784,)), torch.tensor(float(ops)))


def test_flops_dense_lenet_by_hand():
    ops = (
        2 * 1 * 25 * 20 * 24 * 24
        + 20 * 24 * 24
        + 2 * 20 * 25 * 50 * 8 * 8
        + 50 * 8 * 8
        + 2 * 800 * 500
        + 500
        + 2 * 500 * 10
        + 10
    )
    assert flops(LeNet5(), (1, 28, 28)) == ops == flops(L0LeNet5(), (1, 28, 28))
    assert count_parameters(LeNet5()) == count_parameters(L0LeNet5()) == 20 * 26 + 50 * 501 + 800 * 500 + 500 + 5010


@pytest.mark.parametrize("net", ["mlp64", "lenet28"])
def test_expected_flops_limits(net):
    make, shape = NETWORKS[net]
    model = make().double()
    with torch.no_grad():
        for _, layer in l0_layers(model):
            layer.gate.log_alpha.fill_(50.0)
    assert expected_flops(model, shape).item() == pytest.approx(flops(model, shape), rel=1e-12)
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for _, layer in l0_layers(model):  # gates almost surely 0 or 1: expected = pruned FLOPs
            layer.gate.log_alpha.copy_(torch.where(torch.rand(layer.num_gates, generator=g) < 0.4, -50.0, 50.0))
    assert expected_flops(model, shape).item() == pytest.approx(flops(prune(model), shape), rel=1e-9)
    _set_log_alpha(model)
    e = expected_flops(model, shape)
    assert 0 < e.item() < flops(model, shape)
    e.backward()
    assert all(layer.gate.log_alpha.grad.abs().sum() > 0 for _, layer in l0_layers(model))


def test_prune_report_summary():
    model = L0MLP(64, (32, 16))
    _set_log_alpha(model)
    report = PruneReport.from_model(model, (64,))
    assert report.architecture == architecture(model)
    assert report.params_dense == count_parameters(MLP(64, (32, 16)))
    assert report.params_pruned == count_parameters(report.pruned) < report.params_dense
    assert report.flops_pruned == flops(report.pruned, (64,)) < report.flops_dense
    text = report.summary()
    assert report.architecture in text and "FLOPs" in text and "parameters" in text
    assert model.training  # counting does not change the mode


def test_prune_generic_sequential():
    """Nested Sequentials, dense layers in between, a non-zero-preserving activation, average pooling."""
    model = nn.Sequential(
        nn.Sequential(L0Conv2d(2, 6, 3, padding=1), nn.Tanh(), nn.AvgPool2d(2)),
        L0Conv2d(6, 5, 3),
        nn.Sigmoid(),  # sigmoid(0) != 0: the closed maps of this conv must stay
        nn.Conv2d(5, 4, 1),
        nn.ReLU(),
        nn.Flatten(),
        L0Linear(4 * 2 * 2, 7),
        nn.Linear(7, 3),
    ).double()
    _set_log_alpha(model, seed=5)
    model.eval()
    pruned = prune(model)
    layers = dict(pruned.named_children())  # nested names joined by "_": "0_0", "0_1", ..., "1", ...
    assert layers["0_0"].weight.shape[0] == int(model[0][0].active_mask().sum()) < 6
    assert layers["1"].weight.shape == (5, layers["0_0"].weight.shape[0], 3, 3)  # not removed: a sigmoid follows
    x = torch.randn(3, 2, 8, 8, dtype=torch.float64)
    with torch.no_grad():
        torch.testing.assert_close(pruned(x), model(x), atol=1e-12, rtol=1e-12)
    single = L0Linear(5, 2).eval()
    _set_log_alpha(single)
    x = torch.randn(4, 5)
    with torch.no_grad():
        torch.testing.assert_close(prune(single)(x), single(x))
    with pytest.raises(TypeError, match="not supported"):
        prune(nn.Sequential(L0Linear(3, 3), nn.LayerNorm(3)))


def test_weight_init_schemes():
    """``torch`` draws from torch.nn's distributions; ``he`` is N(0, 2 / fan_in) with zero bias."""
    from l0bayes.nn import L0MLP, MLP, L0Conv2d, L0LeNet5, L0Linear

    torch.manual_seed(0)
    for layer, fan_in in ((L0Linear(1500, 800), 1500), (L0Conv2d(60, 400, 5), 1500)):
        w, bound = layer.weight.detach().double().flatten(), 1.0 / math.sqrt(fan_in)
        # torch.nn's: U(-1/sqrt(fan_in), 1/sqrt(fan_in)) for weights (sd bound / sqrt 3) and bias
        assert float(w.abs().max()) <= bound and float(w.abs().max()) > 0.999 * bound
        assert float(w.std()) == pytest.approx(bound / math.sqrt(3.0), rel=5e-3)
        assert float(layer.bias.abs().max()) <= bound and torch.count_nonzero(layer.bias) == layer.bias.numel()
    torch.manual_seed(0)
    for layer, fan_in in (
        (L0Linear(1500, 800, weight_init="he"), 1500),
        (L0Conv2d(60, 400, 5, weight_init="he"), 1500),
    ):
        w = layer.weight.detach().double().flatten()
        # 1.2e6 draws: the sample sd is within 0.5% of sqrt(2 / fan_in) (its s.e. is 0.07%), mean ~ 0
        assert float(w.std()) == pytest.approx(math.sqrt(2.0 / fan_in), rel=5e-3)
        assert abs(float(w.mean())) < 5 * math.sqrt(2.0 / fan_in) / math.sqrt(w.numel())
        assert torch.count_nonzero(layer.bias) == 0
    nets = (
        L0MLP(64, (32,), 10, init_drop_rates=(0.2, 0.5), weight_init="he"),
        MLP(64, (32,), 10, weight_init="he"),
        L0LeNet5(weight_init="he"),
    )
    for net in nets:
        for module in net.modules():
            if hasattr(module, "weight") and module.weight is not None:
                assert torch.count_nonzero(module.bias) == 0
    bad_inits = (
        lambda: L0Linear(3, 2, weight_init="xavier"),
        lambda: L0Conv2d(1, 2, 3, weight_init="lecun"),
        lambda: MLP(3, (2,), 2, weight_init="glorot"),
    )
    for bad in bad_inits:
        with pytest.raises(ValueError, match="weight_init"):
            bad()


@pytest.mark.parametrize(
    "kwargs, name",
    [
        ({"temperature": float("inf")}, "temperature"),
        ({"temperature": float("nan")}, "temperature"),
        ({"lower": float("-inf")}, "lower"),
        ({"upper": float("nan")}, "upper"),
        ({"upper": 0.9}, "upper"),
        ({"num_gates": 0}, "num_gates"),
        ({"group_size": 2.5}, "group_size"),
        ({"init_std": -1.0}, "init_std"),
    ],
)
def test_gate_refuses_non_finite_or_out_of_range_shape(kwargs, name):
    """An infinite temperature or stretch would give NaN gates: refused up front, naming the argument."""
    import l0bayes.nn as l0nn

    with pytest.raises(ValueError, match=f"HardConcreteGate: {name} must be"):
        l0nn.HardConcreteGate(**{"num_gates": 3, **kwargs})


def test_gate_owners_pairs_each_gate_with_the_layer_holding_it():
    from l0bayes.models import SparseLinearRegression
    from l0bayes.nn import gate_owners

    net = L0MLP(8, (4,), 2)
    assert [(layer, gate) for layer, gate in gate_owners(net)] == [(net.fc1, net.fc1.gate), (net.fc2, net.fc2.gate)]
    regression = SparseLinearRegression(3)  # a gate held directly by the model
    assert gate_owners(regression) == [(regression, regression.gate)]
