"""Conditional computation (l0bayes.nn.gated_ops): only the open groups are computed, with the same numbers.

The reference is the plain product of the layers' definition, ``F.linear(x * z, W, b)`` and
``z_c * conv2d(x, W, b)_c``, differentiated by autograd, on the same gate draw ``z``.
"""

import pytest
import torch
import torch.nn.functional as F

from l0bayes.models import SparseClassifier
from l0bayes.nn import L0MLP, L0Conv2d, L0Linear
from l0bayes.nn.gate_set import GateSet
from l0bayes.nn.gated_ops import LINEAR_OPEN_FRACTION, gated_linear, use_compact
from l0bayes.nn.gates import hard_concrete_rsample

DTYPES = [torch.float64, torch.float32]
MODES = [True, False, "auto"]


def _tol(dtype):
    return {"rtol": 1e-12, "atol": 1e-12} if dtype == torch.float64 else {"rtol": 1e-5, "atol": 1e-5}


def _close_some(layer, fraction, seed=0):
    """Set the ``log_alpha`` of a random ``fraction`` of the layer's gates very negative (closed in every draw)."""
    g = torch.Generator().manual_seed(seed)
    closed = torch.randperm(layer.num_gates, generator=g)[: int(fraction * layer.num_gates)]
    with torch.no_grad():
        layer.gate.log_alpha[closed] = -30.0
    return closed


def _draw(layer, seed):
    torch.manual_seed(seed)
    gate = layer.gate
    return hard_concrete_rsample(gate.log_alpha, gate.temperature, gate.lower, gate.upper)


def _grads(loss, tensors):
    return torch.autograd.grad(loss, [t for t in tensors if t.requires_grad])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("input_grad", [False, True])
@pytest.mark.parametrize("shape", [(7, 30), (30,), (2, 5, 30)])
def test_linear_equals_full_product(dtype, mode, input_grad, shape, device):
    torch.manual_seed(0)
    layer = L0Linear(30, 9).to(dtype=dtype, device=device).set_conditional(mode)
    _close_some(layer, 0.6)
    x = torch.randn(shape, dtype=dtype).to(device).requires_grad_(input_grad)
    w_out = torch.randn(shape[:-1] + (9,), dtype=dtype).to(device)
    torch.manual_seed(1)
    y = layer(x)
    loss = (y * w_out).sum() + y.pow(2).sum()
    params = [x, layer.weight, layer.bias, layer.gate.log_alpha]
    grads = _grads(loss, params)

    z = _draw(layer, 1)
    assert 0 < int((z == 0).sum()) < 30  # some gates closed, some open
    ref_y = F.linear(x * z, layer.weight, layer.bias)
    ref_loss = (ref_y * w_out).sum() + ref_y.pow(2).sum()
    ref_grads = _grads(ref_loss, params)
    torch.testing.assert_close(y, ref_y, **_tol(dtype))
    for a, b in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(a, b, **_tol(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mode", MODES)
def test_conv_equals_full_product(dtype, mode, device):
    torch.manual_seed(0)
    layer = L0Conv2d(3, 8, 3, padding=1).to(dtype=dtype, device=device).set_conditional(mode)
    _close_some(layer, 0.6)
    x = torch.randn(4, 3, 6, 6, dtype=dtype).to(device).requires_grad_()
    w_out = torch.randn(4, 8, 6, 6, dtype=dtype).to(device)
    torch.manual_seed(1)
    y = layer(x)
    loss = (y * w_out).sum() + y.pow(2).sum()
    params = [x, layer.weight, layer.bias, layer.gate.log_alpha]
    grads = _grads(loss, params)

    z = _draw(layer, 1)
    ref_y = F.conv2d(x, layer.weight, layer.bias, padding=1) * z[:, None, None]
    ref_loss = (ref_y * w_out).sum() + ref_y.pow(2).sum()
    ref_grads = _grads(ref_loss, params)
    torch.testing.assert_close(y, ref_y, **_tol(dtype))
    assert torch.all(y[:, z == 0] == 0)  # closed maps are exact zeros
    for a, b in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(a, b, **_tol(dtype))


def test_all_gates_closed():
    torch.manual_seed(0)
    for layer, x in ((L0Linear(6, 3), torch.randn(2, 6)), (L0Conv2d(2, 3, 3), torch.randn(2, 2, 5, 5))):
        layer.set_conditional(True)
        with torch.no_grad():
            layer.gate.log_alpha.fill_(-30.0)
        y = layer(x)
        expected = layer.bias.expand(2, 3) if isinstance(layer, L0Linear) else torch.zeros(2, 3, 3, 3)
        torch.testing.assert_close(y, expected)
        y.sum().backward()
        assert torch.all(layer.weight.grad == 0) and torch.all(layer.gate.log_alpha.grad == 0)


@pytest.mark.parametrize("dtype", DTYPES)
def test_network_loss_and_gradients_equal_across_modes(dtype, device):
    """A whole penalised step (Eq. 22, fused gate draw) gives the same loss and gradients with and without skipping."""
    torch.manual_seed(0)
    model = SparseClassifier(L0MLP(40, (20, 10), 3), lam=0.1).to(dtype=dtype, device=device)
    for layer in (model.net.fc1, model.net.fc2):
        _close_some(layer, 0.55)
    x, y = torch.randn(16, 40, dtype=dtype).to(device), torch.randint(0, 3, (16,)).to(device)
    results = []
    for mode in (False, True):
        for layer in (model.net.fc1, model.net.fc2, model.net.fc3):
            layer.set_conditional(mode)
        torch.manual_seed(3)
        loss = sum(model.penalized_loss(x, y, 1000))
        results.append((loss, torch.autograd.grad(loss, list(model.parameters()))))
    (loss_full, grads_full), (loss_skip, grads_skip) = results
    torch.testing.assert_close(loss_skip, loss_full, **_tol(dtype))
    for a, b in zip(grads_skip, grads_full, strict=True):
        torch.testing.assert_close(a, b, **_tol(dtype))


def test_use_compact_rule():
    z = torch.tensor([0.0, 0.3, 0.0, 1.0, 0.0, 0.0, 0.7, 0.0, 0.0, 0.0])  # 3 of 10 open
    torch.testing.assert_close(use_compact(z, True, 0.5), torch.tensor([1, 3, 6]))
    torch.testing.assert_close(use_compact(z, "auto", 0.5), torch.tensor([1, 3, 6]))
    assert use_compact(z, "auto", 0.2) is None  # 30% open is above the threshold: the full product
    assert use_compact(z, False, 1.0) is None
    assert use_compact(torch.ones(5), True, 1.0) is None  # nothing to skip
    assert use_compact(z, True, 0.5, num_open=10) is None  # a given count is trusted
    assert 0 < LINEAR_OPEN_FRACTION < 1


def test_gated_linear_with_a_sample_dimension_takes_the_general_path():
    z = torch.rand(4, 6)
    z[:, :3] = 0
    x, w = torch.randn(4, 5, 6), torch.randn(2, 6)
    torch.testing.assert_close(gated_linear(x, z[:, None, :], w, mode=True), F.linear(x * z[:, None, :], w))


def test_gate_set_counts_the_open_gates_of_each_layer():
    torch.manual_seed(0)
    net = L0MLP(30, (20, 10), 3)
    _close_some(net.fc1, 0.5)
    gates = GateSet(net)
    with gates.sampled():
        for layer in (net.fc1, net.fc2, net.fc3):
            z = layer.gate()
            assert layer.gate.num_open(z) == int(torch.count_nonzero(z))
            assert layer.gate.num_open(z.clone()) is None  # another tensor: not counted
    assert net.fc1.gate._num_open is None


def test_set_conditional_rejects_unknown_modes():
    layer = L0Linear(3, 2)
    assert layer.conditional == "auto"
    assert layer.set_conditional(False).conditional is False
    with pytest.raises(ValueError, match="conditional"):
        layer.set_conditional("sometimes")
    with pytest.raises(ValueError, match="conditional"):
        layer.set_conditional(1)


def test_first_layer_product_refuses_double_backward():
    layer = L0Linear(5, 3)
    z = torch.rand(5, requires_grad=True)
    y = gated_linear(torch.randn(4, 5), z, layer.weight, layer.bias, mode=False)
    (g,) = torch.autograd.grad(y.pow(2).sum(), z, create_graph=True)
    with pytest.raises(RuntimeError):
        torch.autograd.grad(g.sum(), z)


@pytest.mark.parametrize("mode", [False, True])
@pytest.mark.parametrize("out_features", [3, 40])  # W scaled (3 x 5 < 4 x 5) or x scaled
def test_hidden_layer_products_are_twice_differentiable(mode, out_features):
    # Second derivatives with respect to the gates, from the closed form of d^2/dz^2 sum(y^2):
    # y = (x * z) W^T, so H = 2 (W^T W) * (x^T x) elementwise (the third gate closed for the compact path).
    torch.manual_seed(3)
    x = torch.randn(4, 5, dtype=torch.float64, requires_grad=True)
    w = torch.randn(out_features, 5, dtype=torch.float64)
    z = torch.tensor([0.3, 0.9, 0.0, 1.0, 0.5], dtype=torch.float64, requires_grad=True)
    y = gated_linear(x, z, w, mode=mode)
    (g,) = torch.autograd.grad(y.pow(2).sum(), z, create_graph=True)
    v = torch.randn(5, dtype=torch.float64)
    (hv,) = torch.autograd.grad(g @ v, z)
    hessian = 2 * (w.t() @ w) * (x.t() @ x)
    if mode:  # the compact product forms no derivative with respect to a closed gate's value
        hessian[2, :] = hessian[:, 2] = 0.0
    expected = hessian.detach() @ v
    torch.testing.assert_close(hv, expected)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(7, 30), (2, 5, 30)])
@pytest.mark.parametrize("mode", [False, "auto"])
def test_first_layer_gate_gradient_including_closed_gates(dtype, shape, mode, device):
    # The gate gradient read off the weight gradient (divided by z), against autograd on (x * z) W^T + b,
    # gates from 1e-6 to 1; a closed gate's value gets no derivative (the hard sigmoid is flat there).
    torch.manual_seed(5)
    x = torch.randn(shape, dtype=dtype).to(device)
    z = torch.rand(30, dtype=dtype) * torch.logspace(-6, 0, 30, dtype=dtype)
    z[[0, 7, 29]] = 0.0
    z = z.to(device).requires_grad_()
    w = torch.randn(9, 30, dtype=dtype).to(device).requires_grad_()
    b = torch.randn(9, dtype=dtype).to(device).requires_grad_()
    w_out = torch.randn(shape[:-1] + (9,), dtype=dtype).to(device)
    y = gated_linear(x, z, w, b, mode=mode)
    grads = torch.autograd.grad((y * w_out).sum() + y.pow(2).sum(), [z, w, b])
    ref_y = F.linear(x * z, w, b)
    ref = list(torch.autograd.grad((ref_y * w_out).sum() + ref_y.pow(2).sum(), [z, w, b]))
    assert torch.all(ref[0][[0, 7, 29]] != 0)
    ref[0][[0, 7, 29]] = 0.0
    torch.testing.assert_close(y, ref_y, **_tol(dtype))
    for a, r in zip(grads, ref, strict=True):
        torch.testing.assert_close(a, r, **_tol(dtype))
