"""sparsify() on a user's residual CNN with batch norm, residual-aware prune(), the Wide ResNet."""

import math

import pytest
import torch
import torch.nn.functional as F
from residual_cnn import ResNet
from torch import nn

from l0bayes.inference import Constrained, ExpectedFlops, train
from l0bayes.models import SparseClassifier
from l0bayes.nn import L0Layer, WideResNet, architecture, gates_of, penalty
from l0bayes.pruning import (
    GatedLayer,
    Group,
    SelectFeatures,
    count_parameters,
    expected_flops,
    expected_flops_fraction,
    flops,
    l0_wide_resnet,
    prune,
    sparsify,
    strip_gates,
)

BETA, GAMMA, ZETA = 2.0 / 3.0, -0.1, 1.1


def _x(n=5, size=8, dtype=torch.float32, seed=0):
    return torch.randn(n, 1, size, size, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def _randomise_batch_norms(model, seed=0):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                n = m.num_features
                m.running_mean.copy_(torch.randn(n, generator=g))
                m.running_var.copy_(torch.rand(n, generator=g) + 0.5)
                m.weight.copy_(torch.randn(n, generator=g))
                m.bias.copy_(torch.randn(n, generator=g))


def _set_gates(model, pattern, seed=0):
    """Closed (log_alpha -30), open (+30) or fractional (near 0.8 after Eq. 13) gates at random."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, gate in gates_of(model):
            u = torch.rand(gate.num_gates, generator=g)
            values = torch.where(u < pattern[0], -30.0, torch.where(u < pattern[0] + pattern[1], 0.6, 30.0))
            gate.log_alpha.copy_(values)


def _q(log_alpha):
    """Eq. 12 written out: P(z != 0) = sigmoid(log_alpha - beta log(-gamma / zeta))."""
    return torch.sigmoid(log_alpha - BETA * math.log(-GAMMA / ZETA))


def _test_gate(log_alpha):
    """Eq. 13 written out."""
    return (torch.sigmoid(log_alpha) * (ZETA - GAMMA) + GAMMA).clamp(0, 1)


# ------------------------------------------------------------------------------------------- sparsify


def test_sparsify_choice_of_layers_and_names():
    net = ResNet()
    x = _x()
    gated = sparsify(net, example_inputs=x)
    convs = [n for n, m in net.named_modules() if isinstance(m, nn.Conv2d)]
    linears = [n for n, m in net.named_modules() if isinstance(m, nn.Linear)]
    assert [n for n, _ in gates_of(gated)] == [f"{n}.gate" for n, _ in gated.named_modules() if n in convs + linears]
    assert not gates_of(net)  # the user's model is left alone
    only = sparsify(net, example_inputs=x, include=r"conv1$")
    assert [n for n, _ in gates_of(only)] == ["block1.conv1.gate", "block2.conv1.gate"]
    listed = sparsify(net, ["fc2", "block1.conv1"], example_inputs=x)
    assert [n for n, _ in gates_of(listed)] == ["block1.conv1.gate", "fc2.gate"]
    by_type = sparsify(net, nn.Linear, exclude="fc1")
    assert [n for n, _ in gates_of(by_type)] == ["fc2.gate"]
    layer = only.block1.conv1
    assert isinstance(layer, nn.Conv2d) and isinstance(layer, L0Layer) and isinstance(layer, GatedLayer)
    assert layer.gated_batch_norm is only.block1.bn2  # the batch norm its output goes into
    assert only.block2.shortcut is None or only.block2.shortcut.__class__ is nn.Conv2d
    # state-dict keys of the original model are kept, the gates add theirs
    assert set(only.state_dict()) == set(net.state_dict()) | {
        "block1.conv1.gate.log_alpha",
        "block2.conv1.gate.log_alpha",
    }
    # group sizes: a conv channel holds in * kh * kw weights, a linear input neuron out_features
    assert layer.gate.num_gates == 6 and layer.gate.group_size == 6 * 9
    assert listed.fc2.gate.num_gates == 12 and listed.fc2.gate.group_size == 3


def test_sparsify_errors():
    net = ResNet()
    with pytest.raises(ValueError, match="example_inputs"):
        sparsify(net)
    with pytest.raises(ValueError, match="no modules named"):
        sparsify(net, ["nope"])
    with pytest.raises(TypeError, match="cannot be gated"):
        sparsify(net, ["bn"])
    with pytest.raises(ValueError, match="no layer"):
        sparsify(net, nn.Linear, include="nothing")
    net.block1.bn2 = nn.BatchNorm2d(6, affine=False)
    with pytest.raises(NotImplementedError, match="affine"):
        sparsify(net, ["block1.conv1"], example_inputs=_x())
    gated = sparsify(ResNet(), nn.Linear)
    with pytest.raises(ValueError, match="already"):
        sparsify(gated, nn.Linear)


def test_gated_forward_matches_the_formulas():
    """Eval mode: the conv gate multiplies the batch norm's output (Eq. 13), the linear gate the inputs."""
    torch.manual_seed(0)
    net = ResNet().eval()
    _randomise_batch_norms(net)
    gated = sparsify(net, ["block1.conv1", "fc2"], example_inputs=_x()).eval()
    with torch.no_grad():
        gated.block1.conv1.gate.log_alpha.copy_(torch.tensor([-5.0, 5.0, 0.3, -0.3, 2.0, -2.5]))
        gated.fc2.gate.log_alpha.copy_(torch.linspace(-4, 4, 12))
    z1, z2 = _test_gate(gated.block1.conv1.gate.log_alpha), _test_gate(gated.fc2.gate.log_alpha)
    assert (z1 == 0).any() and (z1 == 1).any()
    x = _x()
    with torch.no_grad():
        h = net.stem(x)
        b = net.block1
        o = F.relu(b.bn1(h))
        y = b.conv2(F.relu(b.bn2(b.conv1(o)) * z1[:, None, None]))
        h = net.block2(h + y)
        h = F.adaptive_avg_pool2d(F.relu(net.bn(h)), 2).flatten(1)
        expected = net.fc2(F.relu(net.fc1(h)) * z2)
        assert torch.allclose(gated(x), expected, atol=1e-6)


def test_one_gate_draw_per_forward_in_training():
    gated = sparsify(ResNet(), example_inputs=_x()).train()
    calls = {}
    for name, gate in gates_of(gated):
        gate.register_forward_hook(lambda m, a, out, name=name: calls.__setitem__(name, calls.get(name, 0) + 1))
    gated(_x())
    assert calls == {name: 1 for name, _ in gates_of(gated)}


def test_penalty_and_gradients_in_a_users_own_loop():
    gated = sparsify(ResNet(), example_inputs=_x())
    expected_l0 = sum(gate.group_size * _q(gate.log_alpha).sum() for _, gate in gates_of(gated))
    assert float(penalty(gated, 0.01).detach()) == pytest.approx(0.01 * float(expected_l0.detach()), rel=1e-6)
    conv = gated.block1.conv1
    l2 = (_q(conv.gate.log_alpha) * conv.weight.pow(2).sum((1, 2, 3))).sum()
    assert float(conv.expected_l2()) == pytest.approx(float(l2), rel=1e-6)
    fc = gated.fc2
    l2 = (_q(fc.gate.log_alpha) * fc.weight.pow(2).sum(0)).sum() + fc.bias.pow(2).sum()
    assert float(fc.expected_l2()) == pytest.approx(float(l2), rel=1e-6)
    # a user's loop: data loss + penalty; the gates get gradients from both
    before = {n: g.log_alpha.detach().clone() for n, g in gates_of(gated)}
    optimizer = torch.optim.Adam(gated.parameters(), lr=0.05)
    y = torch.tensor([0, 1, 2, 0, 1])
    for _ in range(3):
        optimizer.zero_grad()
        loss = F.cross_entropy(gated(_x()), y) + penalty(gated, 1e-3, weight_decay=1e-4)
        loss.backward()
        assert all(g.log_alpha.grad is not None and g.log_alpha.grad.abs().sum() > 0 for _, g in gates_of(gated))
        optimizer.step()
    assert all(not torch.equal(before[n], g.log_alpha) for n, g in gates_of(gated))


@pytest.mark.parametrize("objective", ["penalized", "constrained", "bayes"])
def test_train_under_every_objective(objective):
    gated = sparsify(ResNet(), example_inputs=_x())
    model = SparseClassifier(gated, lam=0.1)
    x, y = _x(20, seed=1), torch.arange(20) % 3
    if objective == "constrained":
        objective = Constrained(target_density=0.5)
    result = train(model, x, y, objective=objective, epochs=2, batch_size=10, lr=0.05, progress=False,
                   test_data=(x, y), device="cpu", callbacks=[ExpectedFlops((1, 8, 8))])  # fmt: skip
    assert [r["epoch"] for r in result.history] == [1, 2]
    for record in result.history:
        assert 0 < record["expected_flops"] <= flops(gated, (1, 8, 8))
        assert math.isfinite(record["mean_loss"]) and 0 <= record["test_error"] <= 1
        assert len(record["active_gates"]) == len(gates_of(gated))


# ------------------------------------------------------------------------------------------- prune


def _trained_like(dtype=torch.float32, layers=None, pattern=(0.4, 0.2), seed=0):
    torch.manual_seed(seed)
    net = ResNet().to(dtype)
    _randomise_batch_norms(net, seed)
    gated = sparsify(net, layers, example_inputs=_x(dtype=dtype)).eval()
    _set_gates(gated, pattern, seed)
    return gated


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_prune_residual_cnn_equals_gated_model(dtype):
    gated = _trained_like(dtype, ["block1.conv1", "block2.conv1", "fc2"])
    pruned = prune(gated)
    assert type(pruned) is ResNet and not gates_of(pruned)
    assert not any(isinstance(m, GatedLayer) for m in pruned.modules())
    x = _x(7, dtype=dtype, seed=3)
    with torch.no_grad():
        tol = 1e-5 if dtype == torch.float32 else 1e-12
        assert torch.allclose(pruned(x), gated(x), atol=tol, rtol=tol)
    # inside a block: conv1's closed channels go, with bn2's and conv2's input channels
    for name in ("block1", "block2"):
        open_ = int((_test_gate(getattr(gated, name).conv1.gate.log_alpha) > 0).sum())
        block = getattr(pruned, name)
        assert block.conv1.out_channels == block.bn2.num_features == block.conv2.in_channels == open_
        assert block.conv2.out_channels == getattr(gated, name).conv2.out_channels  # the residual stream stays
        assert block.bn2.running_mean.shape == (open_,)
    # fc2's closed inputs go together with fc1's units that feed only them
    open_fc = int((_test_gate(gated.fc2.gate.log_alpha) > 0).sum())
    assert pruned.fc1.out_features == pruned.fc2.in_features == open_fc
    assert count_parameters(pruned) < count_parameters(gated)
    kept = (pruned.block1.conv1.out_channels, pruned.block2.conv1.out_channels, open_fc)
    assert architecture(gated).split("-") == [str(n) for n in kept]


def test_a_sparsified_model_moved_to_another_device_is_sized_and_pruned_there(device):
    """Example inputs are kept where sparsify() got them (the CPU); the model may move after, before or after
    its size was first computed."""
    layers = ["block1.conv1", "block2.conv1", "fc2"]
    sized_first = _trained_like(torch.float32, layers)
    expected = float(expected_flops_fraction(sized_first))
    for gated in (sized_first.to(device), _trained_like(torch.float32, layers).to(device)):
        assert float(expected_flops_fraction(gated)) == pytest.approx(expected, rel=1e-6)
        pruned = prune(gated)
        assert next(pruned.parameters()).device.type == device.type
        x = _x(7, seed=3).to(device)
        with torch.no_grad():
            assert torch.allclose(pruned(x), gated(x), atol=1e-5, rtol=1e-5)


def test_on_device_of_moves_tensors_to_the_parameters_device():
    from l0bayes.pruning.hooks import on_device_of

    moved = on_device_of(nn.Linear(2, 2, device="meta"), (torch.zeros(1, 2), 3))
    assert moved[0].device.type == "meta" and moved[1] == 3
    assert on_device_of(nn.ReLU(), (torch.zeros(1),))[0].device.type == "cpu"


def test_prune_keeps_channels_that_enter_a_residual_addition():
    """A gate on block1.conv2 (added to the stream): closed channels are zeroed, not removed."""
    gated = _trained_like(layers=["block1.conv2", "fc1"], pattern=(0.5, 0.0))
    closed = int((_test_gate(gated.block1.conv2.gate.log_alpha) == 0).sum())
    assert closed > 0
    pruned = prune(gated)
    assert pruned.block1.conv2.out_channels == 6
    assert torch.equal(pruned.block1.conv2.weight[_test_gate(gated.block1.conv2.gate.log_alpha) == 0],
                       torch.zeros_like(pruned.block1.conv2.weight[:closed]))  # fmt: skip
    # fc1 reads the pooled stream, which other layers read too: its closed inputs are selected away
    assert isinstance(pruned.fc1, nn.Sequential) and isinstance(pruned.fc1[0], SelectFeatures)
    assert pruned.fc1[1].in_features == int((_test_gate(gated.fc1.gate.log_alpha) > 0).sum())
    x = _x(6, seed=4)
    with torch.no_grad():
        assert torch.allclose(pruned(x), gated(x), atol=1e-5)


def test_prune_user_named_group_over_two_producers():
    """Two convolutions summed into one tensor share a Group's gates; closed sums are removed."""

    class TwoBranch(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Conv2d(1, 5, 3, padding=1)
            self.b = nn.Conv2d(1, 5, 1)
            self.c = nn.Conv2d(5, 4, 3)
            self.fc = nn.Linear(4, 2)

        def forward(self, x):
            h = self.c(F.relu(self.a(x) + self.b(x)))
            return self.fc(h.mean((2, 3)))

    net = TwoBranch()
    gated = sparsify(net, [], groups={"sum": Group(["a", "b"])}).eval()
    holder = gated.l0_groups["sum"]
    assert [n for n, _ in gates_of(gated)] == ["l0_groups.sum.gate"]
    assert holder.gate.group_size == (5 * 9 + 5 + 5 * 1 + 5) // 5  # weights and biases of a and b per channel
    with torch.no_grad():
        holder.gate.log_alpha.copy_(torch.tensor([30.0, -30.0, 0.5, -30.0, 30.0]))
    z = _test_gate(holder.gate.log_alpha)
    x = _x(3, size=6)
    with torch.no_grad():
        expected = net.fc(net.c(F.relu((net.a(x) + net.b(x)) * z[:, None, None])).mean((2, 3)))
        assert torch.allclose(gated(x), expected, atol=1e-6)
        pruned = prune(gated, x)
        assert pruned.a.out_channels == pruned.b.out_channels == pruned.c.in_channels == 3
        assert torch.allclose(pruned(x), expected, atol=1e-5)
    # one draw per forward for the whole group, and the penalty sees it
    gated.train()
    calls = []
    holder.gate.register_forward_hook(lambda *a: calls.append(1))
    gated(x)
    assert len(calls) == 1
    assert float(penalty(gated, 1.0)) == pytest.approx(float(holder.gate.group_size * _q(holder.gate.log_alpha).sum()))


def test_pruned_model_round_trips_through_torch_export(tmp_path):
    gated = _trained_like(layers=["block1.conv1", "block2.conv1", "fc2"])
    pruned = prune(gated)
    x = _x(4, seed=5)
    path = tmp_path / "pruned.pt2"
    torch.export.save(torch.export.export(pruned, (x,)), str(path))
    loaded = torch.export.load(str(path)).module()
    with torch.no_grad():
        assert torch.allclose(loaded(x), gated(x), atol=1e-5)
        assert torch.allclose(loaded(_x(4, seed=6)), gated(_x(4, seed=6)), atol=1e-5)


def test_strip_gates_folds_without_removing():
    gated = _trained_like(layers=["block1.conv1", "fc2"])
    plain = strip_gates(gated)
    assert not gates_of(plain) and type(plain.block1.conv1) is nn.Conv2d
    assert not plain.block1.bn2._forward_hooks and not plain.fc2._forward_pre_hooks
    assert plain.block1.conv1.out_channels == 6
    x = _x(3)
    with torch.no_grad():
        assert torch.allclose(plain(x), gated(x), atol=1e-6)
    assert gates_of(gated)  # the gated model is untouched


def test_expected_flops_follow_the_pruned_model():
    """With gates almost surely 0 or 1, E[FLOPs] equals the FLOPs of the pruned model."""
    gated = _trained_like(layers=["block1.conv1", "block2.conv1", "fc2"], pattern=(0.5, 0.0))
    pruned = prune(gated)
    assert float(expected_flops(gated, (1, 8, 8))) == pytest.approx(flops(pruned, (1, 8, 8)), rel=1e-6)
    # FLOPs of block1.conv1 by hand: 2 * in * 9 * out * 64 positions, no bias
    open_ = pruned.block1.conv1.out_channels
    dense = flops(gated, (1, 8, 8))
    saved = 2 * 6 * 9 * (6 - open_) * 64 + 2 * (6 - open_) * 9 * 6 * 64  # conv1 outputs, conv2 inputs
    saved += 2 * (12 - pruned.block2.conv1.out_channels) * 9 * (6 + 12) * 16  # block2: conv1 out (in 6), conv2 in
    saved += (2 * 48 + 1) * (12 - pruned.fc1.out_features) + 2 * 3 * (12 - pruned.fc2.in_features)
    assert flops(pruned, (1, 8, 8)) == dense - saved
    # differentiable in the gates
    total = expected_flops(gated, (1, 8, 8))
    total.backward()
    assert gated.block1.conv1.gate.log_alpha.grad is not None


def test_sparsify_train_prune_end_to_end():
    """A residual CNN with batch norm: sparsify, train (constrained), prune, export-equal."""
    torch.manual_seed(0)
    net = ResNet()
    gated = sparsify(net, include=r"conv1$|fc2", example_inputs=_x(), init_drop_rate=0.3)
    x, y = _x(40, seed=7), torch.arange(40) % 3
    train(SparseClassifier(gated), x, y, objective=Constrained(target_density=0.3), epochs=12, batch_size=20,
          lr=0.3, progress=False, device="cpu")  # fmt: skip
    gated.eval()
    closed = sum(int((gate.deterministic() == 0).sum()) for _, gate in gates_of(gated))
    assert closed > 0, "the constraint should close some gates"
    pruned = prune(gated)
    assert count_parameters(pruned) < count_parameters(gated)
    with torch.no_grad():
        assert torch.allclose(pruned(x), gated(x), atol=1e-5)


# ------------------------------------------------------------------------------------------- Wide ResNet


def test_wide_resnet_sizes():
    # Zagoruyko & Komodakis (2016), Table 1 / CIFAR-10: WRN-16-4 has 2.7M parameters, WRN-28-10 36.5M
    assert count_parameters(WideResNet(16, 4)) / 1e6 == pytest.approx(2.7, abs=0.05)
    assert count_parameters(WideResNet(28, 10)) / 1e6 == pytest.approx(36.5, abs=0.1)
    net = WideResNet(10, 1, num_classes=7, in_channels=1)
    assert net(torch.zeros(2, 1, 32, 32)).shape == (2, 7)
    assert net.first_convolutions() == ["group1.0.conv1", "group2.0.conv1", "group3.0.conv1"]
    with pytest.raises(ValueError, match="6n"):
        WideResNet(12, 1)


def test_l0_wide_resnet_gate_placement():
    net = l0_wide_resnet(16, 2, in_channels=1)
    names = [n for n, _ in gates_of(net)]
    assert names == [f"group{g}.{b}.conv1.gate" for g in (1, 2, 3) for b in (0, 1)]
    assert [gate.num_gates for _, gate in gates_of(net)] == [32, 32, 64, 64, 128, 128]
    for name, gate in gates_of(net):
        block = net.get_submodule(name.rsplit(".", 2)[0])
        assert block.conv1.gated_batch_norm is block.bn2
        # the paper's init: log_alpha ~ N(logit(1 - 0.3), 0.01^2)
        assert float(gate.log_alpha.detach().mean()) == pytest.approx(math.log(0.7 / 0.3), abs=0.01)


def test_analysis_functions_read_a_sparsified_model():
    pytest.importorskip("arviz")
    from l0bayes.analysis import layer_summary, pruned_architecture, to_inference_data

    gated = _trained_like(layers=["block1.conv1", "fc2"])
    idata = to_inference_data(SparseClassifier(gated), num_draws=100)
    table = layer_summary(idata)
    assert list(table.index) == ["block1.conv1", "fc2"]
    assert list(table["num_gates"]) == [6, 12] and list(table["group_size"]) == [54, 3]
    assert pruned_architecture(idata) == architecture(gated)
    q = _q(gated.fc2.gate.log_alpha.detach())
    assert table.loc["fc2", "expected_active"] == pytest.approx(float(q.sum()), rel=1e-5)


def test_wrn_experiment_script_end_to_end(tmp_path, capsys):
    """experiments/wrn.py on a tiny MNIST-format fixture: trains, prunes, exports, refuses to overwrite."""
    import importlib.util
    import json
    import pathlib

    from idx_fixtures import write_mnist_dir

    root = pathlib.Path(__file__).resolve().parents[1]
    spec = importlib.util.spec_from_file_location("wrn_script", root / "experiments" / "wrn.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    write_mnist_dir(tmp_path / "mnist", n_train=20, n_test=10)
    out = tmp_path / "runs"
    argv = ["--data", "mnist-dir", "--data-dir", str(tmp_path / "mnist"), "--depth", "10", "--width", "1",
            "--epochs", "1", "--batch-size", "10", "--out", str(out), "--runs", "constrained"]  # fmt: skip
    assert script.main(argv) == 0
    summary = json.loads((out / "constrained" / "summary.json").read_text())
    assert summary["export_max_abs_diff"] < 1e-4 and summary["test_error"] == summary["test_error_pruned"]
    history = json.loads((out / "constrained" / "history.json").read_text())
    assert len(history) == 1 and history[0]["expected_flops"] <= summary["flops"]
    assert (out / "constrained" / "pruned.pt2").stat().st_size > 0
    assert script.main(argv) == 2  # an existing run is never overwritten
    assert "| constrained |" in capsys.readouterr().out


def test_wrn_experiment_sgd_schedule(tmp_path):
    """--optimizer sgd: SGD for weights and gates (own step size), the paper's drops scaled to the epochs."""
    import argparse
    import importlib.util
    import json
    import pathlib

    from idx_fixtures import write_mnist_dir

    root = pathlib.Path(__file__).resolve().parents[1]
    spec = importlib.util.spec_from_file_location("wrn_script", root / "experiments" / "wrn.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    # 60/120/160 of 200 epochs, scaled
    for epochs, expected in ((200, [60, 120, 160]), (5, [2, 3, 4]), (10, [3, 6, 8])):
        assert script.milestones(argparse.Namespace(milestones=None, epochs=epochs)) == expected
    write_mnist_dir(tmp_path / "mnist", n_train=20, n_test=10)
    out = tmp_path / "runs"
    argv = ["--data", "mnist-dir", "--data-dir", str(tmp_path / "mnist"), "--depth", "10", "--width", "1",
            "--epochs", "2", "--batch-size", "10", "--out", str(out), "--runs", "penalized", "dense",
            "--optimizer", "sgd", "--lr", "0.1", "--gate-lr", "0.05", "--milestones", "1",
            "--gamma", "0.2"]  # fmt: skip
    assert script.main(argv) == 0
    history = json.loads((out / "penalized" / "history.json").read_text())
    assert [r["lr"][k] for r in history for k in (0, 1)] == pytest.approx([0.1, 0.05, 0.02, 0.01])
    dense = json.loads((out / "dense" / "history.json").read_text())  # one group: no gates
    assert [r["lr"] for r in dense] == pytest.approx([0.1, 0.02])
    # densities: recomputed from model.pt by --summarize-only when a summary lacks them
    path = out / "penalized" / "summary.json"
    summary = json.loads(path.read_text())
    assert 0 < summary["expected_density"] <= 1 and summary["test_time_density"] == 1.0  # no gate closed
    path.write_text(json.dumps({k: v for k, v in summary.items() if "density" not in k}))
    _, again = script.load_run(out / "penalized")
    assert again["expected_density"] == pytest.approx(summary["expected_density"], rel=1e-6)
    assert script.main(["--out", str(out), "--summarize-only"]) == 0


# ------------------------------------------------------------------------------------------- deployment


def test_fold_batch_norm_equals_the_eval_model():
    from l0bayes.pruning.folding import fold_batch_norm, for_inference

    for dtype, tol in ((torch.float32, 1e-5), (torch.float64, 1e-12)):
        torch.manual_seed(0)
        model = ResNet().to(dtype)
        _randomise_batch_norms(model)
        before = {k: v.clone() for k, v in model.state_dict().items()}
        folded = fold_batch_norm(model)
        # each block's bn2 follows conv1 alone; bn1 and the last bn follow a residual addition / the stem,
        # whose output also feeds the skip connection
        remaining = [n for n, m in folded.named_modules() if isinstance(m, nn.BatchNorm2d)]
        assert sorted(remaining) == ["block1.bn1", "block2.bn1", "bn"]
        x = _x(dtype=dtype)
        with torch.no_grad():
            expected = model.eval()(x)
            torch.testing.assert_close(folded(x), expected, rtol=tol, atol=tol)
            deployed = for_inference(model)
            assert deployed.block1.conv1.weight.is_contiguous(memory_format=torch.channels_last)
            nhwc = x.contiguous(memory_format=torch.channels_last)
            torch.testing.assert_close(deployed(nhwc), expected, rtol=tol, atol=tol)
        assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())  # the model is not changed


def test_fold_batch_norm_written_out():
    """One conv + bn: s = gamma / sqrt(var + eps), W' = s W, b' = s (b - mean) + beta, by hand in NumPy."""
    import numpy as np

    from l0bayes.pruning.folding import fold_batch_norm

    torch.manual_seed(1)
    net = nn.Sequential(nn.Conv2d(2, 3, 3, bias=True), nn.BatchNorm2d(3, eps=1e-3))
    _randomise_batch_norms(net)
    folded = fold_batch_norm(net)
    conv, bn = net[0], net[1]
    s = bn.weight.detach().numpy() / np.sqrt(bn.running_var.numpy() + 1e-3)
    np.testing.assert_allclose(folded.get_submodule("0").weight.detach().numpy(),
                               conv.weight.detach().numpy() * s[:, None, None, None], rtol=1e-6)  # fmt: skip
    bias = s * (conv.bias.detach().numpy() - bn.running_mean.numpy()) + bn.bias.detach().numpy()
    np.testing.assert_allclose(folded.get_submodule("0").bias.detach().numpy(), bias, rtol=1e-6, atol=1e-6)
    assert not any(isinstance(m, nn.BatchNorm2d) for m in folded.modules())


def test_fold_batch_norm_leaves_a_convolution_used_twice():
    from l0bayes.pruning.folding import fold_batch_norm

    class Twice(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(1, 2, 3, padding=1)
            self.bn = nn.BatchNorm2d(2)

        def forward(self, x):
            y = self.conv(x)
            return self.bn(y) + y  # the convolution's output is needed unnormalised too

    model = Twice()
    _randomise_batch_norms(model)
    folded = fold_batch_norm(model)
    assert any(isinstance(m, nn.BatchNorm2d) for m in folded.modules())
    with torch.no_grad():
        torch.testing.assert_close(folded(_x()), model.eval()(_x()))
