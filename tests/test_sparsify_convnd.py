"""Conv1d and Conv3d models through sparsify, training, prune, the FLOP counts and the pruned file.

The models are written as a user would: a 1-d residual CNN with batch norm (an audio or time-series
model) and a tiny 3-d CNN. Their output channels are gated as a Conv2d's are; pruned, they compute
what the gated model computes in ``eval()`` mode, and their FLOPs are checked against a count by hand
from the layer sizes and the output-length formula of a convolution.
"""

import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from l0bayes import pruning
from l0bayes.nn import gates_of, penalty
from l0bayes.pruning import count_parameters, expected_flops, flops, prune, sparsify
from l0bayes.pruning.export import load_pruned, save_pruned


class Block1d(nn.Module):
    def __init__(self, c_in, c_out, stride=1):
        super().__init__()
        self.conv1 = nn.Conv1d(c_in, c_out, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm1d(c_out)
        self.conv2 = nn.Conv1d(c_out, c_out, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm1d(c_out)
        self.shortcut = nn.Conv1d(c_in, c_out, 1, stride, bias=False) if stride != 1 or c_in != c_out else None

    def forward(self, x):
        y = self.bn2(self.conv2(F.relu(self.bn1(self.conv1(x)))))
        return F.relu(y + (x if self.shortcut is None else self.shortcut(x)))


class AudioNet(nn.Module):
    """Two input channels of 16 samples, a stem, two residual blocks (the second halves the length), a pooling."""

    def __init__(self, width=6, classes=3):
        super().__init__()
        self.stem = nn.Conv1d(2, width, 5, padding=2)
        self.bn = nn.BatchNorm1d(width)
        self.block1 = Block1d(width, width)
        self.block2 = Block1d(width, 2 * width, stride=2)
        self.pool = nn.MaxPool1d(2)
        self.fc = nn.Linear(2 * width * 4, classes)

    def forward(self, x):
        x = self.block2(self.block1(F.relu(self.bn(self.stem(x)))))
        return self.fc(self.pool(x).flatten(1))


class Tiny3d(nn.Module):
    """One channel of 4 x 4 x 4 voxels."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv3d(1, 4, 3, padding=1)
        self.bn1 = nn.BatchNorm3d(4)
        self.conv2 = nn.Conv3d(4, 4, 3, padding=1)
        self.pool = nn.MaxPool3d(2)
        self.fc = nn.Linear(4 * 8, 2)

    def forward(self, x):
        x = F.relu(self.conv2(F.relu(self.bn1(self.conv1(x)))))
        return self.fc(self.pool(x).flatten(1))


MODELS = {"conv1d": (AudioNet, (2, 16)), "conv3d": (Tiny3d, (1, 4, 4, 4))}


def _x(shape, n=8, dtype=torch.float32, seed=0):
    return torch.randn(n, *shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def _randomise_batch_norms(model, seed=0):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.modules.batchnorm._BatchNorm):
                n = m.num_features
                m.running_mean.copy_(torch.randn(n, generator=g))
                m.running_var.copy_(torch.rand(n, generator=g) + 0.5)
                m.weight.copy_(torch.randn(n, generator=g))
                m.bias.copy_(torch.randn(n, generator=g))


def _set_gates(model, closed=0.4, fractional=0.2, seed=1):
    """Eq. 13 gates closed (log_alpha -30), fractional (0.6: about 0.77) or open (+30) at random."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, gate in gates_of(model):
            u = torch.rand(gate.num_gates, generator=g)
            gate.log_alpha.copy_(torch.where(u < closed, -30.0, torch.where(u < closed + fractional, 0.6, 30.0)))
            gate.log_alpha[:2] = torch.tensor([30.0, -30.0])  # at least one open and one closed unit in each layer


def _trained(name, dtype=torch.float32, steps=3):
    """The model gated by sparsify, trained a few steps (gates and weights move), then gates set at random."""
    make, shape = MODELS[name]
    torch.manual_seed(0)
    model = make().to(dtype)
    _randomise_batch_norms(model)
    x = _x(shape, dtype=dtype)
    gated = sparsify(model, example_inputs=x)
    before = {n: g.log_alpha.detach().clone() for n, g in gates_of(gated)}
    optimizer = torch.optim.Adam(gated.parameters(), lr=0.05)
    y = torch.arange(8) % 2
    for _ in range(steps):
        optimizer.zero_grad()
        (F.cross_entropy(gated(x), y) + penalty(gated, 1e-3)).backward()
        optimizer.step()
    assert all(not torch.equal(before[n], g.log_alpha) for n, g in gates_of(gated))
    _set_gates(gated)
    return gated.eval(), x


def test_sparsify_gates_every_conv1d_and_conv3d():
    """By default sparsify gated only the Linear layers of these models; their convolutions stayed dense."""
    for name, expected in (
        ("conv1d", ["stem", "block1.conv1", "block1.conv2", "block2.conv1", "block2.conv2", "block2.shortcut", "fc"]),
        ("conv3d", ["conv1", "conv2", "fc"]),
    ):
        make, shape = MODELS[name]
        model = make()
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # every layer with parameters is gated or a batch norm: no warning
            gated = sparsify(model, example_inputs=_x(shape))
        assert [n for n, _ in gates_of(gated)] == [f"{n}.gate" for n in expected]
        convs = [m for m in gated.modules() if isinstance(m, (nn.Conv1d, nn.Conv3d))]
        assert all(m.gate.num_gates == m.out_channels and m.gate.group_size == m.weight[0].numel() for m in convs)
        if name == "conv1d":  # the gate multiplies the batch norm's output, as after a Conv2d
            assert gated.block1.conv1.gated_batch_norm is gated.block1.bn1


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("name", list(MODELS))
def test_pruned_conv_nd_model_equals_the_gated_one(name, dtype):
    gated, _ = _trained(name, dtype)
    pruned = prune(gated)
    assert type(pruned) is MODELS[name][0] and not gates_of(pruned)
    x = _x(MODELS[name][1], n=7, dtype=dtype, seed=3)
    with torch.no_grad():
        tol = 1e-5 if dtype == torch.float32 else 1e-12
        torch.testing.assert_close(pruned(x), gated(x), atol=tol, rtol=tol)

    def open_(layer):
        return int((layer.gate.deterministic() > 0).sum())

    if name == "conv1d":  # a block's first convolution loses its closed channels, with its batch norm's
        for block in ("block1", "block2"):
            g, p = gated.get_submodule(block), pruned.get_submodule(block)
            assert p.conv1.out_channels == p.bn1.num_features == p.conv2.in_channels == open_(g.conv1)
            assert p.conv1.out_channels < g.conv1.out_channels
            assert p.conv2.out_channels == g.conv2.out_channels  # the residual stream stays
    else:  # both convolutions lose theirs; the flattened columns of conv2's closed channels go too
        assert pruned.conv1.out_channels == pruned.bn1.num_features == open_(gated.conv1) < 4
        assert pruned.conv2.out_channels == open_(gated.conv2) < 4
    assert count_parameters(pruned) < count_parameters(gated)
    kept = pruning.test_time_density(gated) * count_parameters(gated)
    assert count_parameters(pruned) == pytest.approx(kept, rel=1e-12)


def _length(n, layer, axis=0):
    """The output length of a convolution or pooling along one axis (PyTorch's formula, floor mode)."""

    def at(v):
        return v[axis] if isinstance(v, tuple) else v

    k, s, p, d = at(layer.kernel_size), at(layer.stride), at(layer.padding), at(layer.dilation)
    return (n + 2 * p - d * (k - 1) - 1) // s + 1


def _conv_flops(conv, out_positions):
    """2 multiply-adds' worth of operations per weight and output position, plus a bias add per output."""
    taps = conv.weight[0, 0].numel()
    return 2 * conv.in_channels * taps * conv.out_channels * out_positions + (
        conv.out_channels * out_positions if conv.bias is not None else 0
    )


def _linear_flops(linear):
    return 2 * linear.in_features * linear.out_features + linear.out_features


def _hand_flops(name, net):
    """The FLOPs of one example, written out layer by layer from the sizes of ``net`` (dense or pruned)."""
    if name == "conv1d":
        n = _length(16, net.stem)
        total = _conv_flops(net.stem, n)
        for block in (net.block1, net.block2):
            n1 = _length(n, block.conv1)
            total += _conv_flops(block.conv1, n1) + _conv_flops(block.conv2, _length(n1, block.conv2))
            if block.shortcut is not None:
                total += _conv_flops(block.shortcut, _length(n, block.shortcut))
            n = n1
    else:
        side = _length(4, net.conv1)
        total = _conv_flops(net.conv1, side**3) + _conv_flops(net.conv2, _length(side, net.conv2) ** 3)
    fc = net.fc[-1] if isinstance(net.fc, nn.Sequential) else net.fc
    return total + _linear_flops(fc)


@pytest.mark.parametrize("name", list(MODELS))
def test_flops_of_conv_nd_models_are_counted_by_hand(name):
    gated, _ = _trained(name)
    pruned = prune(gated)
    shape = MODELS[name][1]
    assert flops(gated, shape) == _hand_flops(name, gated)  # (a gated model counts as its dense counterpart)
    assert flops(pruned, shape) == _hand_flops(name, pruned) < flops(gated, shape)
    fraction = flops(pruned, shape) / flops(gated, shape)
    assert pruning.test_time_flops_fraction(gated) == pytest.approx(fraction, rel=1e-12)
    # with every gate almost surely open or closed (no fractional ones), the expectation is the pruned count
    _set_gates(gated, closed=0.4, fractional=0.0)
    pruned = prune(gated)
    assert float(expected_flops(gated, shape).detach()) == pytest.approx(flops(pruned, shape), rel=1e-6)


def test_flops_of_a_sequential_of_conv1d_and_conv3d():
    """The count of a plain network: Conv1d and Conv3d layers were not counted (nor their output positions)."""
    net = nn.Sequential(nn.Conv1d(3, 5, 3, stride=2, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(5 * 8, 2))
    assert flops(net, (3, 16)) == (2 * 3 * 3 * 5 * 8 + 5 * 8) + (2 * 40 * 2 + 2)
    net = nn.Sequential(nn.Conv3d(2, 4, (1, 3, 3), bias=False, groups=2), nn.Flatten(), nn.Linear(4 * 5 * 4 * 4, 1))
    assert flops(net, (2, 5, 6, 6)) == 2 * 1 * 9 * 4 * (5 * 4 * 4) + (2 * 320 + 1)


@pytest.mark.parametrize("name", list(MODELS))
def test_a_pruned_conv_nd_model_saves_and_loads(tmp_path, name):
    gated, _ = _trained(name)
    pruned = prune(gated)
    save_pruned(pruned, tmp_path / "pruned.pt")
    loaded, _ = load_pruned(tmp_path / "pruned.pt", model=MODELS[name][0])
    x = _x(MODELS[name][1], n=4, seed=5)
    with torch.no_grad():
        torch.testing.assert_close(loaded(x), pruned(x), atol=0, rtol=0)


class _Mixed(nn.Module):
    """Layers sparsify gates, a batch norm and a layer norm (which follow units), and layers it cannot gate."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(10, 4)
        self.rnn = nn.GRU(4, 4, batch_first=True)
        self.up = nn.ConvTranspose1d(4, 4, 2, stride=2)
        self.conv = nn.Conv1d(4, 4, 3, padding=1)
        self.bn = nn.BatchNorm1d(4)
        self.norm = nn.LayerNorm(4)
        self.scale = nn.Parameter(torch.ones(()))
        self.head = nn.Linear(4, 2)

    def forward(self, tokens):
        h, _ = self.rnn(self.embed(tokens))
        h = self.bn(self.conv(self.up(h.transpose(1, 2)))).mean(-1)
        return self.head(self.norm(h) * self.scale)


def test_sparsify_names_the_layers_with_parameters_it_leaves_ungated():
    tokens = torch.randint(0, 10, (2, 5))
    listed = r"the model itself \(_Mixed\), 'embed' \(Embedding\), 'rnn' \(GRU\), 'up' \(ConvTranspose1d\) \(pass"
    with pytest.warns(UserWarning, match=rf"^sparsify gates nn.Linear and nn.Conv1d/2d/3d layers; .*: {listed}"):
        gated = sparsify(_Mixed(), example_inputs=tokens)
    assert [n for n, _ in gates_of(gated)] == ["conv.gate", "head.gate"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # chosen by name: the user chose, no warning
        sparsify(_Mixed(), ["conv", "head"], example_inputs=tokens)
    with pytest.raises(TypeError, match=r"^up: ConvTranspose1d cannot be gated; sparsify gates nn.Linear and nn.Conv"):
        sparsify(_Mixed(), ["up"], example_inputs=tokens)


def test_the_warning_counts_what_it_does_not_list():
    net = nn.Sequential(*[nn.Embedding(3, 2) for _ in range(10)], nn.Linear(2, 2))
    with pytest.warns(UserWarning, match=r"'7' \(Embedding\) and 2 more \(pass layers="):
        sparsify(net)


# ------------------------------------------------------------------------------------------------ edge cases
def _within(seconds, fn, *args):
    """``fn(*args)`` run in a thread that must end within ``seconds`` (the suite itself never hangs on it)."""
    import threading

    result = {}

    def run():
        try:
            result["value"] = fn(*args)
        except Exception as err:  # noqa: BLE001 - handed to the caller
            result["error"] = err

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"{getattr(fn, '__name__', fn)} did not return within {seconds} s"
    if "error" in result:
        raise result["error"]
    return result["value"]


def _closing(gated, closed):
    """Gates set: ``closed[name]`` the closed units of layer ``name`` (Eq. 13 gate 0), every other unit open."""
    with torch.no_grad():
        for name, gate in gates_of(gated):
            gate.log_alpha.fill_(30.0)
            gate.log_alpha[list(closed.get(name.removesuffix(".gate"), []))] = -30.0
    return gated.eval()


_CONV_ND = {1: nn.Conv1d, 2: nn.Conv2d, 3: nn.Conv3d}


@pytest.mark.parametrize("dims", [1, 2, 3])
@pytest.mark.parametrize("mode", ["zeros", "circular", "reflect", "replicate"])
def test_every_padding_mode_keeps_closed_channels_zero_and_is_pruned(dims, mode):
    """Circular padding made prune() loop for ever in a Conv1d or Conv3d network (torch-pruning read the copies of
    slices along the length as copies of channels, round a loop); reflect and replicate padding (and circular in
    2-d) left every closed channel in place. Each pads a channel with its own values: a zero channel stays zero."""
    conv = _CONV_ND[dims]
    torch.manual_seed(0)
    net = nn.Sequential(
        conv(3, 8, 3, padding=2, padding_mode=mode), nn.ReLU(), conv(8, 4, 3, padding=1, padding_mode=mode)
    )
    x = torch.randn(2, 3, *[6] * dims, dtype=torch.float64)
    gated = _closing(sparsify(net.double(), example_inputs=x), {"0": [1, 4, 6], "2": [0]})
    pruned = _within(60, prune, gated)
    taps = 3**dims
    assert [pruned[0].out_channels, pruned[2].in_channels, pruned[2].out_channels] == [5, 5, 4]
    assert pruned[0].padding_mode == pruned[2].padding_mode == mode
    assert count_parameters(pruned) == 5 * 3 * taps + 5 + 4 * 5 * taps + 4  # by hand: 136 in 1-d, against 180
    with torch.no_grad():
        torch.testing.assert_close(pruned(x), gated(x), atol=1e-12, rtol=1e-12)


class _PadsInForward(nn.Module):
    """Circular padding of a Conv1d's output in the model's own forward: an in-place copy into slices of the length."""

    def __init__(self):
        super().__init__()
        self.a = nn.Conv1d(3, 8, 3)
        self.b = nn.Conv1d(8, 4, 3)

    def forward(self, x):
        return self.b(F.pad(torch.relu(self.a(x)), (2, 0), mode="circular"))


def test_a_graph_that_loops_is_refused_naming_the_layer():
    """torch-pruning follows such a graph for ever; prune() and the expected FLOPs now stop with a ValueError."""
    x = torch.randn(2, 3, 10)
    gated = _closing(sparsify(_PadsInForward(), example_inputs=x), {"a": [1, 4]})
    with pytest.raises(
        ValueError, match=r"the gates of 'a' cannot be found .* goes round a loop .*\(sparsify's exclude=\)"
    ):
        _within(60, prune, gated)
    with pytest.raises(ValueError, match=r"the gates of 'a' cannot be found"):
        _within(60, expected_flops, gated, (3, 10))


@pytest.mark.filterwarnings("ignore:prune kept")  # (the closed channels that stay: the next test but one)
@pytest.mark.parametrize("reader", ["conv", "transposed"])
def test_a_grouped_convolution_loses_as_many_closed_inputs_in_every_group(tmp_path, reader):
    """The closed channels a grouped convolution read stayed, and save_pruned refused the model. Now every group
    loses as many as the group with the fewest closed has (the others stay, zero), whichever their positions."""
    grouped = nn.Conv1d(8, 4, 3, groups=2) if reader == "conv" else nn.ConvTranspose1d(8, 4, 3, groups=2)
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv1d(3, 8, 3, padding=1), nn.ReLU(), grouped).double()
    x = torch.randn(3, 3, 10, dtype=torch.float64)
    gated = _closing(sparsify(net, ["0"], example_inputs=x), {"0": [1, 4, 5]})  # group 0: {1}, group 1: {4, 5}
    pruned = prune(gated)
    assert pruned[0].out_channels == pruned[2].in_channels == 6 and pruned[2].groups == 2
    kept = [0, 2, 3, 5, 6, 7]  # 1 and 4 removed; 5 stays (zero)
    reference = net[2].weight.detach()
    if reader == "conv":  # weight (out, in / groups, k): group 0 keeps inputs 0, 2, 3; group 1 inputs 5, 6, 7
        expected = torch.cat([reference[:2, [0, 2, 3]], reference[2:, [1, 2, 3]]])
    else:  # weight (in, out / groups, k): the rows of the kept inputs
        expected = reference[kept]
    assert torch.equal(pruned[2].weight, expected)
    producer = net[0].weight.detach()[kept]
    producer[3] = 0.0  # channel 5: closed and kept, its gate folded into its weights
    assert torch.equal(pruned[0].weight, producer)
    with torch.no_grad():
        torch.testing.assert_close(pruned(x), gated(x), atol=1e-12, rtol=1e-12)
    gated = _closing(sparsify(net, ["0"], example_inputs=x), {"0": [4, 5]})  # group 0 has none closed
    assert prune(gated)[2].in_channels == 8
    if reader == "conv":
        save_pruned(pruned, tmp_path / "grouped.pt")
        loaded, _ = load_pruned(tmp_path / "grouped.pt")
        with torch.no_grad():
            torch.testing.assert_close(loaded(x), pruned(x), atol=0, rtol=0)


@pytest.mark.filterwarnings("ignore:prune kept")
def test_a_grouped_convolution_loses_as_many_of_its_own_closed_outputs_in_every_group():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv1d(8, 6, 3, groups=2), nn.ReLU(), nn.Conv1d(6, 2, 1)).double()
    x = torch.randn(3, 8, 10, dtype=torch.float64)
    gated = _closing(sparsify(net, ["0"], example_inputs=x), {"0": [0, 1, 4]})  # group 0: {0, 1}, group 1: {4}
    pruned = prune(gated)
    assert pruned[0].out_channels == pruned[2].in_channels == 4 and pruned[0].groups == 2
    kept = net[0].weight.detach()[[1, 2, 3, 5]]  # 0 and 4 removed; 1 closed and kept, its weights zero
    kept[0] = 0.0
    assert torch.equal(pruned[0].weight, kept)
    with torch.no_grad():
        torch.testing.assert_close(pruned(x), gated(x), atol=1e-12, rtol=1e-12)


def test_a_depthwise_convolution_keeps_the_channels_it_reads_and_saves(tmp_path):
    """A closed channel that a depthwise convolution reads becomes its bias there, not zero: it stays. The pruned
    model saves and loads (save_pruned refused every grouped convolution)."""
    torch.manual_seed(0)
    net = nn.Sequential(
        nn.Conv1d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv1d(8, 8, 3, groups=8), nn.ReLU(), nn.Conv1d(8, 2, 1)
    )
    x = torch.randn(3, 3, 10)
    gated = _closing(sparsify(net, example_inputs=x), {"0": [1, 5], "2": [3]})
    pruned = prune(gated)
    assert [pruned[0].out_channels, pruned[2].groups, pruned[4].in_channels] == [8, 8, 8]
    with torch.no_grad():
        torch.testing.assert_close(pruned(x), gated(x), atol=1e-6, rtol=1e-6)
    save_pruned(pruned, tmp_path / "depthwise.pt")
    loaded, _ = load_pruned(tmp_path / "depthwise.pt")
    with torch.no_grad():
        torch.testing.assert_close(loaded(x), pruned(x), atol=0, rtol=0)


def test_example_inputs_that_the_model_does_not_take_are_named():
    """Wrong channels reached torch as a raw RuntimeError from inside the model's forward."""
    net = nn.Sequential(nn.Conv1d(3, 8, 3), nn.ReLU(), nn.Conv1d(8, 4, 3))
    with pytest.raises(
        ValueError,
        match=r"^sparsify: example_inputs do not fit the model: a tensor of shape \(2, 5, 10\) "
        r"fails in '0' \(Conv1d\) with: .*expected input\[2, 5, 10\] to have 3 channels",
    ) as info:
        sparsify(net, example_inputs=torch.randn(2, 5, 10))
    assert isinstance(info.value.__cause__, RuntimeError)
    with pytest.raises(
        ValueError,
        match=r"example_inputs do not fit the model: a tuple \(a tensor of shape \(2, 3, 10\), "
        r"a tensor of shape \(2,\)\) fails with: .*positional arguments",
    ):
        sparsify(net, example_inputs=(torch.randn(2, 3, 10), torch.randn(2)))
    with pytest.raises(ValueError, match=r"example_inputs do not fit the model: .* in '0' \(Linear\)"):
        sparsify(nn.Sequential(nn.Linear(3, 2)), example_inputs=torch.randn(2, 4))  # no convolution: checked too
    with pytest.raises(
        TypeError, match=r"^sparsify: example_inputs must be a tensor or a non-empty tuple of tensors .* a list"
    ):
        sparsify(net, example_inputs=[torch.randn(2, 3, 10)])
    for bad in (torch.tensor(1.0), torch.randn(0, 3, 10), ()):
        with pytest.raises((TypeError, ValueError), match=r"^sparsify: example_inputs must"):
            sparsify(net, example_inputs=bad)
    assert net[0].weight.shape == (8, 3, 3) and not gates_of(net)  # the model passed in is unchanged


def test_prune_names_example_inputs_that_do_not_fit_the_model():
    """prune's own example_inputs (not sparsify's) that the model does not take: a ValueError naming them (it was
    torch's error from inside the forward), and a non-tensor a TypeError."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.Conv2d(8, 4, 3))
    gated = sparsify(model, example_inputs=torch.randn(2, 3, 8, 8))
    with pytest.raises(ValueError, match=r"prune: example_inputs of shape \(2, 5, 8, 8\) do not fit the model"):
        prune(gated.eval(), example_inputs=torch.randn(2, 5, 8, 8))
    with pytest.raises(TypeError, match="prune: example_inputs must be a tensor"):
        prune(gated.eval(), example_inputs=[torch.randn(2, 3, 8, 8)])
    assert prune(gated.eval(), example_inputs=torch.randn(1, 3, 8, 8))(torch.randn(2, 3, 8, 8)).shape == (2, 4, 4, 4)


def test_prune_says_when_a_grouped_convolution_keeps_more_than_the_counts():
    """A grouped convolution whose two groups read 3 and 1 closed channels keeps 2 of them (as many in each group):
    prune warns that it keeps more than test_time_density counts, naming both counts; with as many closed channels in
    each group it removes them all, matches the count and says nothing."""
    torch.manual_seed(0)
    for closed, extra in (([0, 1, 2, 5], True), ([0, 1, 4, 5], False)):
        model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.Conv2d(8, 8, 3, groups=2), nn.ReLU())
        gated = sparsify(model, ["0", "2"], example_inputs=torch.randn(2, 3, 8, 8))
        for name, gate in gates_of(gated):
            with torch.no_grad():
                gate.log_alpha.fill_(10.0)
                if name.startswith("0"):
                    gate.log_alpha[closed] = -10.0
        counted = round(pruning.test_time_density(gated) * count_parameters(gated))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            pruned = prune(gated.eval())
        said = [str(w.message) for w in caught if "test_time_density counts" in str(w.message)]
        kept = count_parameters(pruned)
        assert (kept > counted) == extra
        assert len(said) == int(extra) and (not extra or f"prune kept {kept:,} parameters" in said[0])
        assert not extra or f"test_time_density counts {counted:,}" in said[0]


def test_closed_output_channels_of_the_network_are_counted_as_prune_keeps_them():
    """The network's own output channels stay in the pruned model (its output keeps its shape): test_time_density
    counted a closed one as removed (155 of 180 parameters, against the 180 prune keeps), and the expected density
    gave the constrained objective a gate it could close for nothing."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv1d(3, 8, 3, padding=2), nn.ReLU(), nn.Conv1d(8, 4, 3, padding=1))
    gated = _closing(sparsify(net, example_inputs=torch.randn(2, 3, 6)), {"0": [1], "2": [0]})
    pruned = prune(gated)
    assert [pruned[0].out_channels, pruned[2].out_channels] == [7, 4]
    assert count_parameters(pruned) == 7 * 3 * 3 + 7 + 4 * 7 * 3 + 4  # by hand
    assert round(pruning.test_time_density(gated) * count_parameters(gated)) == count_parameters(pruned)
    output_gate = dict(gates_of(gated))["2.gate"]
    output_gate.log_alpha.grad = None
    pruning.expected_density(gated).backward()
    assert output_gate.log_alpha.grad is None or not output_gate.log_alpha.grad.any()


def test_a_bfloat16_network_is_gated_and_pruned_in_bfloat16():
    """The gates (float32) multiplied bfloat16 activations into float32 ones, and the next layer raised torch's
    "Input type (float) and bias type (BFloat16)": the gated outputs now keep the activations' dtype."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU(), nn.Conv2d(8, 4, 3), nn.Flatten())
    x = torch.randn(2, 3, 8, 8, dtype=torch.bfloat16)
    gated = sparsify(net.bfloat16(), example_inputs=x)
    out = gated(x)
    assert out.dtype == torch.bfloat16
    out.float().sum().backward()
    assert all(gate.log_alpha.grad is not None for _, gate in gates_of(gated))
    gated = _closing(gated, {"0": [1, 2]})
    pruned = prune(gated)
    assert pruned[0].out_channels == 6 and pruned(x).dtype == torch.bfloat16
    with torch.no_grad():
        torch.testing.assert_close(pruned(x).float(), gated(x).float(), atol=0.05, rtol=0.05)


def test_sizes_of_a_model_sparsified_without_example_inputs_say_what_to_give():
    gated = sparsify(nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2)))
    with pytest.raises(ValueError, match="sparsified without them; sparsify it with example_inputs"):
        pruning.test_time_density(gated)


def test_prune_says_when_its_count_differs_from_the_sizes():
    """An ungated transposed convolution reading a gated convolution's closed channels: prune removes them from it,
    the sizes do not follow it (they counted 200 parameters where prune keeps 152). prune says so, with both."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.ConvTranspose2d(8, 2, 3))
    gated = _closing(sparsify(net, ["0"], example_inputs=torch.randn(2, 3, 6, 6)), {"0": [0, 3, 5]})
    counted = round(pruning.test_time_density(gated) * count_parameters(gated))
    with pytest.warns(UserWarning, match="test_time_density counts") as said:
        pruned = prune(gated)
    kept = count_parameters(pruned)
    assert kept != counted
    assert f"prune kept {kept:,} parameters where test_time_density counts {counted:,}" in str(said[0].message)
