"""The pruned-model file: a state dict plus a layer list, loaded with ``weights_only=True``, never code."""

import pytest
import torch
from torch import nn

from l0bayes.io import CheckpointError, save_checkpoint
from l0bayes.nn import L0MLP, MLP, L0LeNet5, LeNet5, l0_layers
from l0bayes.pruning import prune
from l0bayes.pruning.describe import LAYER_TYPES, describe_pruned
from l0bayes.pruning.export import load_pruned, save_pruned


def _gated(make, seed=0):
    """A network with closed, fractional and open Eq. 13 gates in every layer (so prune() removes units)."""
    torch.manual_seed(seed)
    model = make()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, layer in l0_layers(model):
            la = torch.randn(layer.num_gates, generator=g, dtype=layer.gate.log_alpha.dtype) * 3.0
            la[0], la[-1] = -6.0, 0.0
            layer.gate.log_alpha.copy_(la)
    return model.eval()


NETWORKS = {
    "mlp": (lambda: L0MLP(64, (32, 16)), (64,)),
    "lenet5": (lambda: L0LeNet5(input_size=8, padding=2), (1, 8, 8)),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("net", list(NETWORKS))
def test_round_trip_gives_the_gated_models_outputs(tmp_path, net, dtype):
    make, shape = NETWORKS[net]
    model = _gated(lambda: make().to(dtype))
    pruned = prune(model)
    path = tmp_path / "pruned.pt"
    save_pruned(pruned, path, {"input_shape": list(shape), "note": "x"})
    loaded, metadata = load_pruned(path)
    assert metadata == {"input_shape": list(shape), "note": "x"}
    assert isinstance(loaded, nn.Sequential) and not loaded.training
    assert [type(m) for m in loaded] == [type(m) for m in pruned]
    assert [n for n, _ in loaded.named_children()] == [n for n, _ in pruned.named_children()]
    x = torch.randn(7, *shape, dtype=dtype)
    with torch.no_grad():  # the reference is the gated model itself (test-time gates of Eq. 13)
        torch.testing.assert_close(loaded(x), model(x), atol=1e-12 if dtype == torch.float64 else 1e-5, rtol=1e-5)
    assert all(p.dtype == dtype for p in loaded.parameters())


@pytest.mark.parametrize("make", [lambda: MLP(20, (8, 4), 3), lambda: LeNet5(1, 10, 8, padding=2)])
def test_dense_networks_round_trip_too(tmp_path, make):
    net = make().eval()
    save_pruned(net, tmp_path / "dense.pt")
    loaded, metadata = load_pruned(tmp_path / "dense.pt")
    x = torch.randn(5, 20) if isinstance(net, MLP) else torch.randn(5, 1, 8, 8)
    with torch.no_grad():
        torch.testing.assert_close(loaded(x), net(x), atol=0, rtol=0)
    assert metadata == {}


class _Exploit:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_a_malicious_pickle_runs_nothing(tmp_path):
    marker = tmp_path / "pwned"
    path = tmp_path / "pruned.pt"
    torch.save({"format": "l0bayes.pruned", "layers": [], "state_dict": {}, "x": _Exploit(str(marker))}, path)
    with pytest.raises(ValueError, match="pruned.pt"):
        load_pruned(path)
    assert not marker.exists()
    torch.save(nn.Sequential(nn.Linear(2, 1)), path)  # the old format: a whole pickled module
    with pytest.raises(ValueError, match="pruned.pt"):
        load_pruned(path)


def test_layer_types_outside_the_allow_list_are_refused(tmp_path):
    class Custom(nn.ReLU):  # a subclass may run anything in forward: not taken for a ReLU
        pass

    with pytest.raises(TypeError, match="'1'.*Custom"):
        describe_pruned(nn.Sequential(nn.Linear(2, 3), Custom()))
    assert not (tmp_path / "x.pt").exists()
    assert "os.system" not in LAYER_TYPES
    good = nn.Sequential(nn.Linear(2, 3))
    path = tmp_path / "crafted.pt"
    layers = [{"name": "0", "type": "os.system", "args": {}}]
    save_checkpoint(path, {"format": "l0bayes.pruned", "version": 1, "layers": layers, "state_dict": {}})
    with pytest.raises(ValueError, match="crafted.pt.*os.system"):
        load_pruned(path)
    layers = describe_pruned(good)
    state = {"0.weight": torch.zeros(4, 2), "0.bias": torch.zeros(3)}  # wrong shape
    save_checkpoint(path, {"format": "l0bayes.pruned", "version": 1, "layers": layers, "state_dict": state})
    with pytest.raises(ValueError, match="does not fit"):
        load_pruned(path)
    save_checkpoint(path, {"format": "something else", "layers": [], "state_dict": {}})
    with pytest.raises(ValueError, match="not an l0bayes pruned model"):
        load_pruned(path)


def test_every_allowed_layer_round_trips(tmp_path):
    from l0bayes.pruning import SelectFeatures

    net = nn.Sequential(
        nn.Conv2d(2, 4, 3, stride=1, padding=1, dilation=1, groups=2, bias=False),
        nn.BatchNorm2d(4, eps=1e-3, momentum=None),
        nn.LeakyReLU(0.2),
        nn.MaxPool2d(2, ceil_mode=True),
        nn.Conv2d(4, 3, (3, 1), padding=(1, 0), padding_mode="reflect"),
        nn.ELU(0.5),
        nn.AvgPool2d(2, count_include_pad=False),
        nn.AdaptiveAvgPool2d((2, 2)),
        nn.AdaptiveMaxPool2d(2),
        nn.Hardtanh(-0.5, 0.7),
        nn.Dropout2d(0.3),
        nn.Flatten(),
        SelectFeatures(torch.tensor([0, 3, 5, 6, 11]), 12),
        nn.Linear(5, 6),
        nn.BatchNorm1d(6, affine=False, momentum=0.2),
        nn.GELU("tanh"),
        nn.Softplus(2.0, 10.0),
        nn.SiLU(),
        nn.Tanh(),
        nn.Sigmoid(),
        nn.ReLU6(),
        nn.ReLU(),
        nn.Dropout(0.1),
        nn.Identity(),
        nn.Linear(6, 1),
        nn.Flatten(0),
    ).eval()
    one_d = nn.Sequential(
        nn.Conv1d(2, 4, 3, padding=1, bias=False),
        nn.Conv1d(4, 4, 3, padding=1, groups=4, padding_mode="circular"),  # depthwise
        nn.BatchNorm1d(4),
        nn.MaxPool1d(2),
        nn.Dropout1d(0.2),
        nn.AvgPool1d(2, count_include_pad=False),
        nn.AdaptiveAvgPool1d(3),
        nn.AdaptiveMaxPool1d(2),
        nn.Flatten(),
    ).eval()
    three_d = nn.Sequential(
        nn.Conv3d(1, 3, (1, 3, 3), padding=(0, 1, 1), padding_mode="replicate"),
        nn.BatchNorm3d(3),
        nn.MaxPool3d(2, ceil_mode=True),
        nn.Dropout3d(0.1),
        nn.AvgPool3d((1, 2, 2)),
        nn.AdaptiveAvgPool3d((1, 2, None)),
        nn.AdaptiveMaxPool3d(1),
        nn.Flatten(),
    ).eval()
    networks = {"all.pt": (net, (3, 2, 8, 8)), "1d.pt": (one_d, (3, 2, 16)), "3d.pt": (three_d, (3, 1, 4, 8, 8))}
    assert {type(m) for n, _ in networks.values() for m in n} == {cls for cls, _ in LAYER_TYPES.values()}
    for name, (network, shape) in networks.items():
        save_pruned(network, tmp_path / name)
        loaded, _ = load_pruned(tmp_path / name)
        assert repr(loaded) == repr(network)
        x = torch.randn(shape)
        with torch.no_grad():
            torch.testing.assert_close(loaded(x), network(x), atol=0, rtol=0)


def test_missing_and_corrupt_files(tmp_path):
    with pytest.raises(FileNotFoundError):
        load_pruned(tmp_path / "absent.pt")
    (tmp_path / "empty.pt").write_bytes(b"")
    with pytest.raises(CheckpointError, match="empty.pt"):
        load_pruned(tmp_path / "empty.pt")


# --------------------------------------------------------------- a pruned model of your own class


@pytest.mark.parametrize(
    "layers",
    [["block1.conv1", "block2.conv1", "fc2"], ["block1.conv2", "fc1"]],
    ids=["channels-removed", "select-features"],
)
def test_a_pruned_residual_cnn_of_its_own_class_round_trips(tmp_path, layers):
    """A residual CNN with batch norm (not an nn.Sequential), gates closed at random, pruned: saved and reloaded
    into a fresh instance of its class, it computes what the pruned model computes."""
    from test_sparsify import ResNet, _trained_like, _x

    pruned = prune(_trained_like(layers=layers, pattern=(0.5, 0.2)))
    assert type(pruned) is ResNet
    shapes = {k: v.shape for k, v in pruned.state_dict().items()}
    assert shapes != {k: v.shape for k, v in ResNet().state_dict().items()}  # some channels or inputs are gone
    path = tmp_path / "pruned.pt"
    save_pruned(pruned, path, {"input_shape": [1, 8, 8]})
    x = _x(6, seed=7)
    for fresh in (ResNet, ResNet()):  # the class, or an instance of it
        loaded, metadata = load_pruned(path, model=fresh)
        assert type(loaded) is ResNet and not loaded.training and metadata == {"input_shape": [1, 8, 8]}
        assert {k: v.shape for k, v in loaded.state_dict().items()} == shapes
        with torch.no_grad():
            torch.testing.assert_close(loaded(x), pruned(x), atol=1e-6, rtol=0)


def test_a_pruned_model_of_its_own_class_needs_the_right_fresh_model(tmp_path):
    from test_sparsify import ResNet, _trained_like

    path = tmp_path / "pruned.pt"
    save_pruned(prune(_trained_like(layers=["block1.conv1"])), path)
    with pytest.raises(ValueError, match=r"pass model= a fresh ResNet"):
        load_pruned(path)
    with pytest.raises(ValueError, match="model= is a Linear"):
        load_pruned(path, model=nn.Linear(2, 2))
    other = ResNet()
    other.block1.extra = nn.Linear(2, 2)
    with pytest.raises(ValueError, match="block1.extra"):
        load_pruned(path, model=other)
    with pytest.raises(ValueError, match="loads without model="):
        sequential = tmp_path / "sequential.pt"
        save_pruned(prune(_gated(NETWORKS["mlp"][0])), sequential)
        load_pruned(sequential, model=ResNet)


def test_a_file_of_the_first_version_still_loads(tmp_path):
    """Files written before SelectFeatures recorded its dim (always 1 in an nn.Sequential) and convolutions their
    groups (always 1: grouped ones were refused) load as before."""
    from l0bayes.pruning import SelectFeatures

    net = nn.Sequential(
        nn.Conv1d(2, 3, 1), nn.Flatten(), SelectFeatures(torch.tensor([0, 2]), 3), nn.Linear(2, 1)
    ).eval()
    layers = describe_pruned(net)
    del layers[0]["args"]["groups"]
    del layers[2]["args"]["dim"]
    path = tmp_path / "v1.pt"
    save_checkpoint(path, {"format": "l0bayes.pruned", "version": 1, "layers": layers, "state_dict": net.state_dict()})
    loaded, _ = load_pruned(path)
    assert repr(loaded) == repr(net)
    x = torch.randn(4, 2, 1)
    with torch.no_grad():
        torch.testing.assert_close(loaded(x), net(x), atol=0, rtol=0)


def test_a_grouped_convolution_round_trips_and_its_groups_are_checked(tmp_path):
    """A grouped convolution (a pruned one, or a depthwise one) was refused by save_pruned; its groups must divide
    its channels and fit its weight."""
    net = nn.Sequential(nn.Conv2d(4, 6, 3, groups=2), nn.ReLU(), nn.Conv2d(6, 6, 1, groups=6)).eval()
    save_pruned(net, tmp_path / "grouped.pt")
    loaded, _ = load_pruned(tmp_path / "grouped.pt")
    assert [m.groups for m in loaded[::2]] == [2, 6]
    x = torch.randn(2, 4, 5, 5)
    with torch.no_grad():
        torch.testing.assert_close(loaded(x), net(x), atol=0, rtol=0)
    layers = describe_pruned(net)
    for groups, message in ((4, "groups = 4 must divide in_channels = 4 and out_channels = 6"), (1, "weight")):
        layers[0]["args"]["groups"] = groups
        save_checkpoint(
            tmp_path / "bad.pt",
            {"format": "l0bayes.pruned", "version": 1, "layers": layers, "state_dict": net.state_dict()},
        )
        with pytest.raises(ValueError, match=rf"bad.pt.*layer '0'.*{message}"):
            load_pruned(tmp_path / "bad.pt")


def test_a_crafted_description_of_a_model_of_its_own_class_is_refused(tmp_path):
    from test_sparsify import ResNet

    path = tmp_path / "crafted.pt"
    state = {"format": "l0bayes.pruned", "version": 2, "model_class": "ResNet", "state_dict": {}}
    for modules, message in (
        ([{"name": "stem", "type": "os.system", "args": {}}], "os.system"),
        ([{"name": "__class__", "type": "Linear", "args": {}}], "'__class__' of the file is not a module of the model"),
        ([{"name": "fc1", "type": "Sequential", "args": {"children": ["a.b"]}}], "the name 'a.b' is not allowed"),
        ([{"name": "block1", "type": "module", "args": {"class": "Other"}}], "is a Other, the model has a Block"),
        ("stem", "not a list"),
    ):
        save_checkpoint(path, {**state, "modules": modules})
        with pytest.raises(ValueError, match=message):
            load_pruned(path, model=ResNet)


def test_save_pruned_checks_its_arguments_before_writing(tmp_path):
    net = nn.Sequential(nn.Linear(2, 3)).eval()
    with pytest.raises(TypeError, match=r"^module must be an nn.Module \(the output of prune\(\)\), got str$"):
        save_pruned("net", tmp_path / "x.pt")
    with pytest.raises(FileNotFoundError, match=r"^the directory of path '.*absent/x.pt' does not exist$"):
        save_pruned(net, tmp_path / "absent" / "x.pt")
    with pytest.raises(IsADirectoryError, match=r"^path '.*' is a directory; give the name of a file in it$"):
        save_pruned(net, tmp_path)
    with pytest.raises(TypeError, match=r"^path must be a str or an os.PathLike, got int$"):
        save_pruned(net, 5)
    # what load_pruned would refuse is refused at save time: a padding beyond the kernel's reach
    wide = nn.Sequential(nn.Conv2d(1, 2, 1, padding=1)).eval()
    with pytest.raises(ValueError, match=r"^layer '0' \(Conv2d\): padding \[1, 1\] must be at most dilation \* \("):
        save_pruned(wide, tmp_path / "x.pt")
    assert list(tmp_path.iterdir()) == []


def test_a_file_loads_into_a_model_on_another_device_dtype_and_every_tensor_is_the_files(tmp_path):
    """Layers are built on the meta device and take the file's tensors (float64 kept), nothing else."""
    net = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.ReLU(), nn.Linear(4, 1)).double().eval()
    save_pruned(net, tmp_path / "x.pt")
    loaded, _ = load_pruned(tmp_path / "x.pt")
    assert not any(t.is_meta for t in [*loaded.parameters(), *loaded.buffers()])
    for key, tensor in net.state_dict().items():
        assert loaded.state_dict()[key].dtype == tensor.dtype and torch.equal(loaded.state_dict()[key], tensor)
    assert all(p.requires_grad for p in loaded.parameters())


def test_a_pruned_model_refuses_an_input_of_another_width():
    """SelectFeatures knows how many inputs it selects from: another width is an error, not a silent answer."""
    from l0bayes.pruning.select import SelectFeatures

    select = SelectFeatures([0, 2, 4], num_inputs=6)
    assert torch.equal(select(torch.arange(12.0).view(2, 6)), torch.tensor([[0.0, 2, 4], [6, 8, 10]]))
    with pytest.raises(ValueError, match=r"keeps 3 of 6 inputs along dimension 1, got an input of width 7"):
        select(torch.zeros(2, 7))
    with pytest.raises(ValueError, match=r"along dimension 1, got an input of shape \(5,\)"):
        select(torch.zeros(5))


def test_load_pruned_names_a_path_of_the_wrong_type():
    with pytest.raises(TypeError, match=r"path must be a file path \(a str or os.PathLike\), got int"):
        load_pruned(5)
