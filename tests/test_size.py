"""What the pruned model keeps: NetworkSize against prune() on the MLP, LeNet-5 and residual CNNs."""

import math

import pytest
import torch
import torch.nn.functional as F
from residual_cnn import ResNet
from torch import nn

from l0bayes.nn import L0MLP, L0LeNet5, gates_of
from l0bayes.pruning import (
    Group,
    NetworkSize,
    count_parameters,
    expected_flops,
    flops,
    prune,
    sparsify,
)
from l0bayes.pruning import (
    test_time_density as kept_density,
)
from l0bayes.pruning import test_time_flops_fraction as kept_flops_fraction


def _pattern(net, closed=0.4, fractional=0.2, seed=0, scale=1.0):
    """Closed, open and fractional (Eq. 13 gate in (0, 1)) gates at random."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, gate in gates_of(net):
            u = torch.rand(gate.num_gates, generator=g)
            values = torch.where(u < closed, -30.0, torch.where(u < closed + fractional, 0.6, 30.0))
            gate.log_alpha.copy_(values * scale if scale != 1.0 else values)


def _x(n=4):
    return torch.randn(n, 1, 8, 8, generator=torch.Generator().manual_seed(1))


def _networks():
    torch.manual_seed(0)
    yield "mlp", L0MLP(64, (100, 50), 10), (64,), None
    yield "lenet5", L0LeNet5(1, 10, (28, 28)), (1, 28, 28), None
    for layers in (["block1.conv1", "block2.conv1", "fc2"], ["block1.conv2", "fc1"], None):
        yield f"resnet-{layers}", sparsify(ResNet(), layers, example_inputs=_x()).eval(), (1, 8, 8), _x()


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_test_time_counts_equal_the_pruned_model(seed):
    for name, net, shape, example in _networks():
        _pattern(net, seed=seed)
        pruned = prune(net, example) if example is not None else prune(net)
        size = NetworkSize(net, shape)
        assert size.parameters("test") == count_parameters(pruned), name
        assert size.flops("test") == flops(pruned, shape), name
        assert kept_density(net) == count_parameters(pruned) / count_parameters(net), name
        assert kept_flops_fraction(net, shape) == flops(pruned, shape) / flops(net, shape), name


def test_expected_counts_are_the_pruned_counts_for_almost_sure_gates():
    for name, net, shape, example in _networks():
        _pattern(net, closed=0.3, fractional=0.0, seed=4)  # log_alpha +-30: q(z != 0) within 1e-12 of 0 or 1
        # (no layer emptied: prune() keeps one unit of an emptied tensor, which the expectation leaves out)
        assert all(bool(gate.active().any()) for _, gate in gates_of(net)), name
        pruned = prune(net, example) if example is not None else prune(net)
        size = NetworkSize(net, shape)
        assert float(size.parameters("expected").detach()) == pytest.approx(count_parameters(pruned), rel=1e-9), name
        assert float(expected_flops(net, shape).detach()) == pytest.approx(flops(pruned, shape), rel=1e-9), name


def test_expected_count_is_the_mean_over_gate_draws():
    # Monte Carlo over independent gates z ~ Bernoulli(q(z != 0)): the mean pruned count (prune() itself, on the
    # residual CNN) against the closed form, to within four standard errors.
    net = sparsify(ResNet(), ["block1.conv1", "block2.conv1", "fc2"], example_inputs=_x()).eval()
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for _, gate in gates_of(net):
            gate.log_alpha.copy_(torch.randn(gate.num_gates, generator=g))
    expected = float(NetworkSize(net).parameters("expected").detach())
    q = [gate.prob_nonzero().detach() for _, gate in gates_of(net)]
    counts = []
    for _ in range(60):
        with torch.no_grad():
            for (_, gate), p in zip(gates_of(net), q, strict=True):
                gate.log_alpha.copy_(torch.where(torch.rand(p.shape, generator=g) < p, 30.0, -30.0))
        counts.append(count_parameters(prune(net)))
    counts = torch.tensor(counts, dtype=torch.float64)
    se = float(counts.std()) / math.sqrt(len(counts))
    assert abs(float(counts.mean()) - expected) < 4 * se + 1.0  # (+1: prune keeps a unit of an emptied tensor)


def test_user_group_and_per_layer_fractions():
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

    x = torch.randn(3, 1, 6, 6)
    gated = sparsify(TwoBranch(), [], groups={"sum": Group(["a", "b"])}, example_inputs=x).eval()
    with torch.no_grad():
        gated.l0_groups["sum"].gate.log_alpha.copy_(torch.tensor([30.0, -30.0, 0.5, -30.0, 30.0]))
    pruned = prune(gated, x)
    size = NetworkSize(gated)
    assert size.parameters("test") == count_parameters(pruned)
    # the group's own modules a and b keep 3 of 5 channels: weights and biases
    assert size.fraction(kind="test", per_layer=True) == {"l0_groups.sum": pytest.approx(3 / 5)}


def test_flops_need_an_input_shape_and_errors_name_it():
    net = L0MLP(8, (4,), 2)
    with pytest.raises(ValueError, match="input_shape"):
        NetworkSize(net).flops()
    with pytest.raises(ValueError, match="'parameters' or 'flops'"):
        NetworkSize(net).fraction("weights")
    with pytest.raises(ValueError, match="no HardConcreteGate"):
        kept_density(nn.Linear(3, 2))


@pytest.mark.parametrize("width", [1, 2, 3, 7, 16])
def test_row_products_are_torch_prod_zeros_included(width):
    from l0bayes.pruning.size import _row_products

    g = torch.Generator().manual_seed(width)
    m = torch.rand(5, width, generator=g, dtype=torch.float64)
    m[1, 0] = 0.0  # one zero in a row, and two in another: the cases prod's own backward treats apart
    if width > 1:
        m[2, :2] = 0.0
    torch.testing.assert_close(_row_products(m), torch.prod(m, dim=1), rtol=1e-15, atol=0)
    a, b = m.clone().requires_grad_(), m.clone().requires_grad_()
    w = torch.randn(5, generator=g, dtype=torch.float64)
    ((_row_products(a) * w).sum()).backward()
    ((torch.prod(b, dim=1) * w).sum()).backward()
    torch.testing.assert_close(a.grad, b.grad, rtol=1e-14, atol=1e-300)
    assert torch.autograd.gradcheck(_row_products, (m.clone().requires_grad_(),))
