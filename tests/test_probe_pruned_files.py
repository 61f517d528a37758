"""Property-based probes of the pruned-model file: real pruned models saved, then every entry of the file tampered with.

The models are an MLP of L0 layers (an ``nn.Sequential`` with a ``SelectFeatures``), LeNet-5 (convolutions,
pooling, flatten) and a residual CNN of its own class pruned through its dependency graph (batch norms, a
``Sequential(SelectFeatures, Linear)``, loaded into a fresh instance passed as ``model=``). Each tampered
file has one of two outcomes:

* a ``TypeError`` / ``ValueError`` whose message names the file and the entry (the layer, or the top-level
  key), raised before anything larger than a few MiB is allocated (a guard refuses any larger allocation
  on a device other than ``meta``), leaving the ``model=`` passed in exactly as it was;
* a model that is exactly what the file describes: its tensors are the file's, its layers have the file's
  arguments, and where the description is the original's, its outputs are the original model's.

Each property runs twice: a few examples in the default run, many more under ``-m slow``.
"""

import contextlib
import copy
import functools
import math
import re
import string

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from residual_cnn import ResNet
from test_archive import MiB, deflated, refused_within
from torch import nn

from l0bayes.io import CheckpointError
from l0bayes.nn import L0MLP, L0LeNet5
from l0bayes.pruning import prune
from l0bayes.pruning.build import build_into, build_pruned
from l0bayes.pruning.describe import LAYER_TYPES, describe_modules, describe_pruned
from l0bayes.pruning.export import load_pruned, save_pruned

#: Examples per property: the default run, and the ``slow`` profile.
FAST, SLOW = 12, 200
PROFILES = [pytest.param(FAST, id="fast"), pytest.param(SLOW, marks=pytest.mark.slow, id="slow")]
MODELS = ("mlp", "lenet5", "resnet")
#: The guard's limit: the largest tensor of these models is a few kB; a file may not make the loader allocate more.
LIMIT_BYTES = 4 * 2**20
#: Names that reach an nn.Module's internals, or are not names at all.
RESERVED = (
    "_modules",
    "_parameters",
    "_buffers",
    "__class__",
    "__dict__",
    "training",
    "forward",
    "T_destination",
    "weight",
    "",
    ".",
    "a.b",
    "a..b",
    "0.weight",
    "block1._modules",
    "stem.weight",
    "fc1.0",
    "1 2",
    "é",
)


def _profile(examples):
    return settings(max_examples=examples, deadline=None, derandomize=True, database=None)


# ------------------------------------------------------------------------------------------------ the models
def _gated(make, seed=0):
    """An L0 network with closed, fractional and open Eq. 13 gates in every layer."""
    from l0bayes.nn import l0_layers

    torch.manual_seed(seed)
    model = make()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, layer in l0_layers(model):
            la = torch.randn(layer.num_gates, generator=g) * 3.0
            la[0], la[-1] = -6.0, 0.0
            layer.gate.log_alpha.copy_(la)
    return model.eval()


@functools.cache
def _model(name):
    """``(pruned model, example input, model= argument)``."""
    if name == "mlp":
        return prune(_gated(lambda: L0MLP(16, (12, 8), 3))), torch.randn(5, 16), None
    if name == "lenet5":
        return prune(_gated(lambda: L0LeNet5(input_size=8, padding=2))), torch.randn(5, 1, 8, 8), None
    from test_sparsify import _trained_like, _x

    pruned = prune(_trained_like(layers=["block1.conv1", "block2.conv2", "fc1", "fc2"], pattern=(0.5, 0.2)))
    assert any(type(m) is nn.Sequential for m in pruned.modules())  # a SelectFeatures -> Linear
    return pruned, _x(5, seed=3), ResNet


@functools.cache
def _saved(name, tmp):
    path = f"{tmp}/{name}.pt"
    save_pruned(_model(name)[0], path, {"input_shape": list(_model(name)[1].shape[1:]), "note": name})
    return torch.load(path, weights_only=True)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("pruned")
    return lambda name: copy.deepcopy(_saved(name, str(tmp)))


def _entries(state):
    return state["layers"] if "layers" in state else state["modules"]


def _describe(module):
    return describe_pruned(module) if type(module) is nn.Sequential else describe_modules(module)


# ------------------------------------------------------------------------------------------------ the oracle
@contextlib.contextmanager
def _allocation_guard(limit=LIMIT_BYTES):
    """Refuse (``MemoryError``) any tensor factory call that would allocate more than ``limit`` bytes off ``meta``."""
    factories = ("empty", "zeros", "ones", "full", "rand", "randn", "empty_like", "zeros_like", "ones_like")
    originals = {name: getattr(torch, name) for name in factories}

    def guarded(name):
        real = originals[name]

        def factory(*args, **kwargs):
            like = name.endswith("_like")
            device = kwargs.get("device") or (args[0].device if like else torch.get_default_device())
            if torch.device(device).type != "meta":
                shape_only = real(*args, **{**kwargs, "device": "meta"})
                if shape_only.numel() * shape_only.element_size() > limit:
                    raise MemoryError(f"torch.{name} of {shape_only.numel()} elements")
            return real(*args, **kwargs)

        return factory

    try:
        for name in factories:
            setattr(torch, name, guarded(name))
        yield
    finally:
        for name, real in originals.items():
            setattr(torch, name, real)


def _snapshot(module):
    return repr(module), {k: v.clone() for k, v in module.state_dict().items()}, [m.training for m in module.modules()]


def _assert_unchanged(module, snapshot):
    text, tensors, training = _snapshot(module)
    assert text == snapshot[0] and training == snapshot[2]
    assert tensors.keys() == snapshot[1].keys()
    assert all(torch.equal(tensors[k], snapshot[1][k]) for k in tensors)


def _same_value(a, b):
    """Argument values that build the same layer: ``3`` and ``[3, 3]``, a list and a tuple."""
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same_value(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, int) and isinstance(b, (list, tuple)):
        return all(_same_value(a, y) for y in b)
    if isinstance(b, int) and isinstance(a, (list, tuple)):
        return _same_value(b, a)
    return type(a) is type(b) and a == b or (isinstance(a, float) and isinstance(b, int) and a == b)


def _same_description(a, b, ordered):
    """The same layers with the same arguments (in the same order, for an ``nn.Sequential``)."""
    if ordered and [d["name"] for d in a] != [d["name"] for d in b]:
        return False
    a = {d["name"]: d for d in a}
    b = {d["name"]: d for d in b}
    return a.keys() == b.keys() and all(
        a[n]["type"] == b[n]["type"]
        and a[n]["args"].keys() == b[n]["args"].keys()
        and all(_same_value(a[n]["args"][k], b[n]["args"][k]) for k in a[n]["args"])
        for n in a
    )


def _outcome(tmp_path, name, state, names):
    """Load the tampered ``state``: a clear error naming the file and one of ``names``, or the file's model."""
    original, x, make = _model(name)
    path = tmp_path / "tampered.pt"
    torch.save(state, path)
    fresh = make() if make is not None else None
    before = _snapshot(fresh) if fresh is not None else None
    try:
        with _allocation_guard():
            loaded, metadata = load_pruned(path, model=fresh)
    except (TypeError, ValueError) as err:
        message = str(err)
        assert isinstance(err, CheckpointError) and repr(str(path)) in message, message
        # a layer that cannot run on the input the metadata records is named, wherever the tampered entry is
        runs = re.search(r"layer '\w+' \(\w+\) cannot run on what it receives from an input of the shape", message)
        assert runs or any(n in message for n in names), f"{message!r} names none of {names}"
        assert not re.search(r"\.tmp\b", message)
        if fresh is not None:
            _assert_unchanged(fresh, before)
        return "error"
    # loaded: the model is what the file says
    file_tensors = state["state_dict"]
    assert loaded.state_dict().keys() == file_tensors.keys()
    for key, tensor in loaded.state_dict().items():
        assert tensor.dtype == file_tensors[key].dtype and torch.equal(tensor, file_tensors[key]), key
    ordered = "layers" in state
    assert _same_description(_describe(loaded), _entries(state), ordered)
    assert not loaded.training and metadata == state.get("metadata", {})
    if ordered and isinstance(metadata.get("input_shape"), list):  # an nn.Sequential runs on the input it records
        dtype = next((t.dtype for t in loaded.state_dict().values() if t.is_floating_point()), None)
        with torch.no_grad():
            loaded(torch.zeros(2, *metadata["input_shape"], dtype=dtype))
    reference = original.state_dict()
    if _same_description(_entries(state), _describe(original), ordered) and file_tensors.keys() == reference.keys():
        if all(v.dtype == reference[k].dtype and torch.equal(reference[k], v) for k, v in file_tensors.items()):
            with torch.no_grad():
                assert torch.equal(loaded(x), original(x))
    return "loaded"


# ------------------------------------------------------------------------------------------------ strategies
def _ints():
    edges = (0, 1, 2, -1, 3, 2**31 - 1, 2**31, 2**40, 2**62, 2**63, 2**64, 2**70, -(2**63))
    return st.one_of(st.sampled_from(edges), st.integers(-8, 40), st.integers(-(2**80), 2**80))


VALUES = st.one_of(
    _ints(),
    st.booleans(),
    st.none(),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from((math.nan, math.inf, -math.inf, 0.5, 1e-300, 1e300)),
    st.text(alphabet=string.ascii_letters + "_.", max_size=6),
    st.sampled_from(("same", "valid", "zeros", "reflect", "circular", "tanh", "none")),
    st.lists(_ints(), max_size=4),
    st.just(list(range(10_000))),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
)


def _tamper_value(original, value, element):
    """``value`` in place of ``original``, or in place of one of its elements (``element``)."""
    if isinstance(original, list) and original and element is not None:
        out = list(original)
        out[element % len(out)] = value
        return out
    return value


def _shifted(value, delta):
    """A plausible wrong value: an int or the elements of a list moved by ``delta``."""
    if type(value) is int:
        return value + delta
    if isinstance(value, list):
        return [_shifted(v, delta) for v in value]
    return value


# ------------------------------------------------------------------------------------------------ fixed cases
def _sequential_file(tmp_path, layers, state_dict, **extra):
    path = tmp_path / "crafted.pt"
    torch.save({"format": "l0bayes.pruned", "version": 1, "layers": layers, "state_dict": state_dict, **extra}, path)
    return path


@pytest.mark.parametrize("count", [2**40, 2**28, 3])
def test_a_select_features_index_larger_than_its_tensor_allocates_nothing(tmp_path, saved, count):
    """An index length of 2**40 asked for 8 TB (2**28: 2 GiB, which the loader did allocate): every size must
    agree with the file's tensors, refused before anything is allocated."""
    state = saved("mlp")
    k = next(i for i, d in enumerate(state["layers"]) if d["type"] == "SelectFeatures")
    name, true_count = state["layers"][k]["name"], state["layers"][k]["args"]["index"]
    assert count != true_count
    state["layers"][k]["args"]["index"] = count
    path = tmp_path / "tampered.pt"
    torch.save(state, path)
    message = rf"tampered\.pt': the state dict does not fit layer '{name}' \(SelectFeatures\): its index has shape "
    message += rf"\[{true_count}\], but the arguments ask for \[{count}\]"
    with _allocation_guard(), pytest.raises(ValueError, match=message):
        load_pruned(path)


@pytest.mark.parametrize(
    ("entry", "key", "value", "message"),
    [
        ("Linear", "in_features", 2**40, r"its weight has shape \[\d+, \d+\], but the arguments ask for"),
        ("Linear", "out_features", 2**62, r"its weight has shape \[\d+, \d+\], but the arguments ask for"),
        ("SelectFeatures", "num_inputs", 2**40, r"num_inputs = 1099511627776 must be in \[1, 2147483647\]"),
        ("SelectFeatures", "num_inputs", 1, r"its index must lie in \[0, num_inputs\) = \[0, 1\)"),
        ("Linear", "in_features", -3, r"in_features = -3 must be at least 0"),
        ("Linear", "in_features", "12", r"in_features must be an int, got '12'"),
        ("Linear", "bias", 1, r"bias must be True or False, got 1"),
    ],
)
def test_every_size_in_a_sequential_file_is_bounded(tmp_path, saved, entry, key, value, message):
    state = saved("mlp")
    spec = next(d for d in state["layers"] if d["type"] == entry)
    spec["args"][key] = value
    path = tmp_path / "tampered.pt"
    torch.save(state, path)
    with (
        _allocation_guard(),
        pytest.raises((TypeError, ValueError), match=rf"tampered\.pt.*'{spec['name']}'.*{message}"),
    ):
        load_pruned(path)


@pytest.mark.parametrize(
    ("entry", "key", "value", "message"),
    [
        (
            "BatchNorm2d",
            "num_features",
            2**40,
            r"its weight has shape \[\d+\], but the arguments ask for \[1099511627776\]",
        ),
        ("Conv2d", "out_channels", 2**33, r"its weight has shape \[\d+, \d+, 3, 3\], but the arguments ask for"),
        ("Conv2d", "kernel_size", [3, 2**40], r"its weight has shape \[\d+, \d+, 3, 3\], but the arguments ask for"),
        (
            "Conv2d",
            "padding",
            [2**40, 1],
            r"padding \[1099511627776, 1\] must be at most dilation \* \(kernel",
        ),
        ("Conv2d", "stride", [0, 1], r"stride\[0\] = 0 must be in \[1, 2147483647\]"),
        ("BatchNorm2d", "eps", math.nan, r"eps = nan must be a finite number > 0"),
        ("BatchNorm2d", "momentum", -0.5, r"momentum = -0.5 must be a finite number in \[0, 1\]"),
    ],
)
def test_every_size_in_a_file_of_a_model_of_its_own_class_is_bounded(tmp_path, saved, entry, key, value, message):
    state = saved("resnet")
    spec = next(d for d in state["modules"] if d["type"] == entry)
    spec["args"][key] = value
    path = tmp_path / "tampered.pt"
    torch.save(state, path)
    fresh = ResNet()
    before = _snapshot(fresh)
    with _allocation_guard(), pytest.raises(ValueError, match=rf"tampered\.pt.*'{spec['name']}'.*{message}"):
        load_pruned(path, model=fresh)
    _assert_unchanged(fresh, before)


@pytest.mark.parametrize("name", ["_modules", "_parameters", "_buffers", "__class__", "training", "forward"])
def test_a_module_named_after_an_internal_leaves_the_model_as_it_was(tmp_path, saved, name):
    """The file's name of a module reached ``model._modules`` itself (and so on) through ``setattr``."""
    state = saved("resnet")
    state["modules"][-1]["name"] = name  # fc2, the last entry: all others are put in first
    path = tmp_path / "tampered.pt"
    torch.save(state, path)
    fresh = ResNet()
    before = _snapshot(fresh)
    with pytest.raises(ValueError, match=rf"tampered\.pt': module '{name}' of the file is not a module of the model"):
        load_pruned(path, model=fresh)
    _assert_unchanged(fresh, before)
    assert type(fresh._modules) is dict and isinstance(fresh.training, bool)


@pytest.mark.parametrize("name", ["_modules", "training", "forward", "append", "", "a.b", "_x", "1 2"])
def test_a_sequential_layer_of_a_reserved_or_odd_name_is_refused(tmp_path, name):
    layers = [{"name": name, "type": "ReLU", "args": {}}]
    with pytest.raises(ValueError, match=rf"crafted\.pt': layer {re.escape(repr(name))}: the name .* is not allowed"):
        load_pruned(_sequential_file(tmp_path, layers, {}))
    with pytest.raises(ValueError, match=r"layer .*: the name .* is not allowed"):
        build_pruned(layers, {})


def test_a_failure_late_in_the_file_leaves_the_model_as_it_was(tmp_path, saved):
    """Every layer but the last is put in place and the tensors are loaded before the last entry fails."""
    fresh = ResNet()
    before = _snapshot(fresh)
    for tamper in (
        lambda s: s["modules"][-1]["args"].__setitem__("out_features", 99),
        lambda s: s["state_dict"].__setitem__("block1.extra", torch.zeros(2)),  # only strict loading finds it
    ):
        state = saved("resnet")
        tamper(state)
        with pytest.raises(ValueError):
            build_into(fresh, state["modules"], state["state_dict"])
        _assert_unchanged(fresh, before)
    state = saved("resnet")
    assert build_into(fresh, state["modules"], state["state_dict"]) is fresh  # and it still loads
    with torch.no_grad():
        torch.testing.assert_close(fresh(_model("resnet")[1]), _model("resnet")[0](_model("resnet")[1]), atol=0, rtol=0)


class _Recurrent(nn.Module):
    """A model of its own class holding an RNN, whose weights are also listed in a list of its own."""

    def __init__(self):
        super().__init__()
        self.rnn = nn.GRU(3, 4, batch_first=True)
        self.head = nn.Linear(4, 2)

    def forward(self, x):
        return self.head(self.rnn(x)[0][:, -1])


def test_a_failed_load_leaves_an_rnns_list_of_weights_as_it_was(tmp_path):
    """Loading assigns the GRU's weights, and the GRU also writes them into its list ``_flat_weights``: that list
    belongs to the copy being loaded, not to the model passed in, until the whole file has fitted."""
    net = _Recurrent().eval()
    save_pruned(net, tmp_path / "rnn.pt")
    state = torch.load(tmp_path / "rnn.pt", weights_only=True)
    state["state_dict"]["rnn.extra"] = torch.zeros(1)  # found only by strict loading, after the GRU's weights
    torch.save(state, tmp_path / "tampered.pt")
    fresh = _Recurrent()
    before = _snapshot(fresh)
    with pytest.raises(ValueError, match=r"tampered\.pt': the state dict does not fit .* Unexpected key.*rnn\.extra"):
        load_pruned(tmp_path / "tampered.pt", model=fresh)
    _assert_unchanged(fresh, before)
    assert all(w is getattr(fresh.rnn, n) for w, n in zip(fresh.rnn._flat_weights, fresh.rnn._flat_weights_names))
    loaded, _ = load_pruned(tmp_path / "rnn.pt", model=_Recurrent)
    x = torch.randn(2, 5, 3)
    with torch.no_grad():
        torch.testing.assert_close(loaded(x), net(x), atol=0, rtol=0)


@pytest.mark.parametrize(
    ("tamper", "error", "message"),
    [
        (lambda s: s.__setitem__("layers", None), TypeError, r"layers is a NoneType, not a list"),
        (lambda s: s["layers"][0].__setitem__("name", 5), TypeError, r"layer 0 of the description: its name must be"),
        (lambda s: s["layers"][0].__setitem__("type", ["Linear"]), TypeError, r"its type must be a str"),
        (lambda s: s["layers"][0].__setitem__("args", None), TypeError, r"its args must be a dict, got None"),
        (lambda s: s["layers"].__setitem__(0, "Linear"), TypeError, r"layer 0 of the description must be a dict"),
        (lambda s: s.__setitem__("metadata", [1]), TypeError, r"its metadata must be a dict, got list"),
        (lambda s: s.__setitem__("state_dict", [1]), TypeError, r"state_dict must be a dict of tensors, got list"),
        (lambda s: s.__setitem__("version", True), ValueError, r"version True, not one of \[1, 2\]"),
        (lambda s: s.__setitem__("extra", 1), ValueError, r"holds the unknown entries \[\"'extra'\"\]"),
        (lambda s: s.__delitem__("layers"), ValueError, r"lacks 'layers'"),
        (lambda s: s["layers"].append(s["layers"][0]), ValueError, r"layer '\w+' is described twice"),
        (lambda s: s["layers"].extend({"name": f"r{i}", "type": "ReLU", "args": {}} for i in range(2000)),
         ValueError, r"layers holds 2\d+ entries, more than the \d+ that a file of \d+ tensors may describe"),
    ],
)  # fmt: skip
def test_wrong_types_and_structure_name_the_entry(tmp_path, saved, tamper, error, message):
    state = saved("mlp")
    tamper(state)
    path = tmp_path / "tampered.pt"
    torch.save(state, path)
    with pytest.raises(error, match=rf"tampered\.pt.*{message}"):
        load_pruned(path)


def test_build_pruned_names_its_arguments():
    with pytest.raises(TypeError, match=r"^layers is a NoneType, not a list"):
        build_pruned(None, {})
    with pytest.raises(TypeError, match=r"^layer 0 of the description: its name must be a str, got 5$"):
        build_pruned([{"name": 5, "type": "ReLU", "args": {}}], {})
    with pytest.raises(TypeError, match=r"^state_dict must be a dict of tensors, got NoneType$"):
        build_pruned([], None)
    with pytest.raises(TypeError, match=r"^model must be an nn.Module, got str$"):
        build_into("model", [], {})


@pytest.mark.parametrize(
    ("metadata", "where"),
    [
        ({"scaler": lambda x: x}, r"metadata\['scaler'\] is a builtins.function"),
        ({"a": {"b": [1, object()]}}, r"metadata\['a'\]\['b'\]\[1\] is a builtins.object"),
        ({"mean": np.float64(1.5)}, r"metadata\['mean'\] is a numpy.float64"),
        ({"x": {1, 2}}, r"metadata\['x'\] is a builtins.set"),
        ({("a", "b"): 1}, r"metadata has the key \('a', 'b'\): keys must be str"),
        ([("a", 1)], r"metadata must be a dict \(or None\), got list"),
    ],
)
def test_save_pruned_refuses_metadata_it_cannot_save_before_writing(tmp_path, metadata, where):
    """A lambda in ``metadata`` was a pickling error naming a temporary file: now a ``TypeError`` naming the key,
    and nothing is written: no partial file, and an existing file is left as it was."""
    pruned = _model("mlp")[0]
    path = tmp_path / "pruned.pt"
    save_pruned(pruned, path, {"version": "first"})
    first = path.read_bytes()
    with pytest.raises(TypeError, match=rf"^{where}"):
        save_pruned(pruned, path, metadata)
    assert path.read_bytes() == first and sorted(p.name for p in tmp_path.iterdir()) == ["pruned.pt"]
    assert load_pruned(path)[1] == {"version": "first"}


def test_save_pruned_metadata_that_contains_itself_is_refused(tmp_path):
    loop = {"a": []}
    loop["a"].append(loop)
    with pytest.raises(TypeError, match=r"^metadata\['a'\]\[0\] contains itself"):
        save_pruned(_model("mlp")[0], tmp_path / "pruned.pt", loop)
    assert list(tmp_path.iterdir()) == []


# ------------------------------------------------------------------------------------------------ bytes and shapes
def test_a_deflated_pruned_file_is_refused_before_it_is_inflated(tmp_path):
    """load_pruned reads through load_checkpoint: a pruned model's archive deflated, 48 MiB of zeros in place of its
    first tensor (48 kB on disk), is refused before torch inflates it (torch allocated all of it first)."""
    save_pruned(_model("mlp")[0], tmp_path / "p.pt", {"input_shape": [16]})
    deflated(tmp_path / "p.pt", tmp_path / "bomb.pt", 48)
    message = r"bomb\.pt' was refused before it was loaded: its zip entry '.*' is compressed \(method 8\)"
    refused_within(8 * MiB, lambda: load_pruned(tmp_path / "bomb.pt"), message)


_RUNS = r"cannot run on what it receives from an input of the shape that the metadata records"


@pytest.mark.parametrize(
    ("layer", "key", "value", "fails"),
    [
        ("pool1", "kernel_size", [9, 9], "pool1"),  # a window larger than its 8 x 8 maps
        ("pool1", "stride", 10**6, "pool2"),  # its 1 x 1 maps are smaller than pool2's window
        ("pool2", "dilation", 5, "pool2"),
        ("conv2", "dilation", [2, 9], "conv2"),  # a kernel reaching 37 across maps of 4 (+ 2 + 2 of padding)
        ("flatten", "start_dim", 7, "flatten"),
        ("conv1", "stride", [1, 2], "select_fc1"),  # maps half as wide: half the features fc1's inputs select from
    ],
)
def test_a_layer_that_cannot_run_on_the_recorded_input_is_refused(tmp_path, saved, layer, key, value, fails):
    """The file records the shape of one example (``metadata["input_shape"]``): every layer of an ``nn.Sequential``
    must run on what it receives (checked on the meta device). A pooling window of 9 on LeNet-5's 8 x 8 maps loaded,
    and failed only when the model ran."""
    state = saved("lenet5")
    next(d for d in state["layers"] if d["name"] == layer)["args"][key] = value
    torch.save(state, tmp_path / "tampered.pt")
    match = rf"tampered\.pt': layer '{fails}' \(\w+\) {_RUNS} \(input_shape \[1, 8, 8\]\): \[\d+(, \d+)*\] per example"
    with _allocation_guard(), pytest.raises(CheckpointError, match=match):
        load_pruned(tmp_path / "tampered.pt")


_POOL_ARGS = {
    "MaxPool": {"stride": 1, "padding": 0, "dilation": 1, "ceil_mode": False},
    "AvgPool": {"stride": 1, "padding": 0, "ceil_mode": False, "count_include_pad": True},
}
_POOLS = [f"{kind}Pool{n}d" for kind in ("Max", "Avg") for n in (1, 2, 3)]


def _pool_file(tmp_path, kind, shape, **args):
    layers = [{"name": "pool", "type": kind, "args": {"kernel_size": 2, **_POOL_ARGS[kind[:7]], **args}}]
    return _sequential_file(tmp_path, layers, {}, metadata={"input_shape": shape})


@pytest.mark.parametrize("kind", _POOLS)
def test_every_pooling_window_must_fit_the_recorded_input(tmp_path, kind):
    shape = [2] + [4] * _spatial_dims(kind)
    module, _ = load_pruned(_pool_file(tmp_path, kind, shape, kernel_size=4))  # a window as large as the maps
    assert module(torch.zeros(2, *shape)).shape == (2, 2, *[1] * (len(shape) - 1))
    seen = re.escape(str(shape))
    with pytest.raises(CheckpointError, match=rf"crafted\.pt': layer 'pool' \({kind}\) {_RUNS} .*: {seen} per example"):
        load_pruned(_pool_file(tmp_path, kind, shape, kernel_size=5))


def _spatial_dims(kind):
    return int(kind[-2])


@pytest.mark.parametrize("kind", _POOLS)
@pytest.mark.parametrize(
    ("key", "value", "error", "message"),
    [
        ("kernel_size", 0, ValueError, r"kernel_size = 0 must be in \[1, 2147483647\]"),
        ("kernel_size", True, TypeError, r"kernel_size must be an int, got True"),
        ("kernel_size", [2, 2, 2, 2], ValueError, r"kernel_size must be an int or \d ints, got \[2, 2, 2, 2\]"),
        ("stride", -1, ValueError, r"stride = -1 must be in \[1, 2147483647\]"),
        ("stride", 2**31, ValueError, r"stride = 2147483648 must be in \[1, 2147483647\]"),
        ("padding", 3, ValueError, r"padding \[3(, 3)*\] must be at most half the window"),
        ("ceil_mode", 1, TypeError, r"ceil_mode must be True or False, got 1"),
    ],
)
def test_a_pooling_argument_of_the_wrong_type_or_range_is_refused(tmp_path, kind, key, value, error, message):
    path = _pool_file(tmp_path, kind, [2] + [4] * _spatial_dims(kind), **{key: value})
    with pytest.raises(error, match=rf"crafted\.pt': layer 'pool' \({kind}\): {message}"):
        load_pruned(path)


@pytest.mark.parametrize(
    ("kind", "output_size", "shape", "error", "message"),
    [
        ("AdaptiveAvgPool3d", 1, [4], ValueError, rf"{_RUNS} \(input_shape \[4\]\): \[4\] per example"),
        ("AdaptiveMaxPool3d", [1, 1, None], [3, 4], ValueError, rf"{_RUNS} \(input_shape \[3, 4\]\)"),
        ("AdaptiveAvgPool1d", 0, [2, 4], ValueError, r"output_size = 0 must be in \[1, 2147483647\]"),
        ("AdaptiveMaxPool2d", [2, True], [2, 4, 4], TypeError, r"output_size must be an int, got True"),
        ("AdaptiveAvgPool3d", [2, 2], [2, 4, 4, 4], ValueError, r"output_size must be an int or 3 ints"),
    ],
)
def test_an_adaptive_pooling_must_fit_the_recorded_input(tmp_path, kind, output_size, shape, error, message):
    layers = [{"name": "pool", "type": kind, "args": {"output_size": output_size}}]
    path = _sequential_file(tmp_path, layers, {}, metadata={"input_shape": shape})
    with pytest.raises(error, match=rf"crafted\.pt': layer 'pool' \({kind}\)(:)? {message}"):
        load_pruned(path)


def test_save_pruned_refuses_a_network_that_cannot_run_on_its_input_shape_before_writing(tmp_path):
    """What load_pruned refuses is not written: LeNet-5's second pooling window does not fit maps of 3 x 3."""
    with pytest.raises(ValueError, match=rf"^layer 'pool2' \(MaxPool2d\) {_RUNS} \(input_shape \[1, 3, 3\]\)"):
        save_pruned(_model("lenet5")[0], tmp_path / "p.pt", {"input_shape": [1, 3, 3]})
    assert list(tmp_path.iterdir()) == []
    save_pruned(_model("lenet5")[0], tmp_path / "p.pt", {"input_shape": (1, 8, 8)})  # a tuple, as a torch.Size
    assert load_pruned(tmp_path / "p.pt")[1]["input_shape"] == (1, 8, 8)


@pytest.mark.parametrize(
    ("shape", "error"),
    [("1x8x8", TypeError), ([1, 0, 8], ValueError), ([1.0, 8, 8], TypeError), ([], ValueError), ([True], TypeError)],
)
def test_a_recorded_input_shape_that_is_no_shape_is_refused(tmp_path, saved, shape, error):
    wanted = r"metadata\['input_shape'\] must be the shape of one example \(an int or a list of 1 to 63 ints"
    with pytest.raises(error, match=rf"^{wanted}"):
        save_pruned(_model("mlp")[0], tmp_path / "p.pt", {"input_shape": shape})
    state = saved("mlp")
    state["metadata"]["input_shape"] = shape
    torch.save(state, tmp_path / "tampered.pt")
    with pytest.raises(error, match=rf"tampered\.pt': {wanted}"):
        load_pruned(tmp_path / "tampered.pt")


# ------------------------------------------------------------------------------------------------ properties
@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("examples", PROFILES)
def test_every_argument_of_every_layer_tampered(tmp_path, saved, model, examples):
    """Any value in place of any constructor argument (or one of its elements) of any layer."""
    entries = [d for d in _entries(saved(model)) if d["type"] in LAYER_TYPES and d["args"]]

    @_profile(examples)
    @given(
        which=st.integers(0, 10**6),
        key=st.integers(0, 10**6),
        value=st.one_of(VALUES, st.integers(-3, 3).map(lambda d: ("shift", d))),
        element=st.one_of(st.none(), st.integers(0, 3)),
    )
    def prop(which, key, value, element):
        state = saved(model)
        spec = next(d for d in _entries(state) if d["name"] == entries[which % len(entries)]["name"])
        arg = sorted(spec["args"])[key % len(spec["args"])]
        if isinstance(value, tuple):
            value = _shifted(spec["args"][arg], value[1])
        spec["args"][arg] = _tamper_value(spec["args"][arg], value, element)
        _outcome(tmp_path, model, state, [repr(spec["name"])])

    prop()


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("examples", PROFILES)
def test_every_name_tampered(tmp_path, saved, model, examples):
    """A reserved, odd or other layer's name in place of a layer's name (or a Sequential's child's)."""
    names = [d["name"] for d in _entries(saved(model))]

    @_profile(examples)
    @given(
        which=st.integers(0, 10**6),
        name=st.one_of(
            st.sampled_from(RESERVED),
            st.sampled_from(names),
            st.text(alphabet=string.ascii_letters + string.digits + "_. ", max_size=6),
            st.integers(-2, 2**40),
            st.none(),
            st.lists(st.text(max_size=2), max_size=2),
        ),
        child=st.booleans(),
    )
    def prop(which, name, child):
        state = saved(model)
        entries = _entries(state)
        sequentials = [d for d in entries if d["type"] == "Sequential"]
        if child and sequentials:
            spec = sequentials[which % len(sequentials)]
            old = spec["args"]["children"][which % len(spec["args"]["children"])]
            spec["args"]["children"][which % len(spec["args"]["children"])] = name
        else:
            spec = entries[which % len(entries)]
            old, spec["name"] = spec["name"], name
        names = [repr(old), repr(name), repr(spec["name"]), "state dict", "not describe", "not a module", "twice"]
        _outcome(tmp_path, model, state, names)

    prop()


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("examples", PROFILES)
def test_the_structure_of_the_file_tampered(tmp_path, saved, model, examples):
    """Top-level entries replaced, deleted or added; entries of the description dropped, repeated, swapped,
    retyped, given extra or fewer keys."""
    top = ("format", "version", "state_dict", "metadata", "layers", "modules", "model_class")

    @_profile(examples)
    @given(
        action=st.sampled_from(("replace", "delete", "add", "drop", "repeat", "swap", "retype", "extra key", "no key")),
        key=st.sampled_from(top),
        which=st.integers(0, 10**6),
        value=st.one_of(VALUES, st.sampled_from(list(LAYER_TYPES) + ["Sequential", "module", "os.system"])),
    )
    def prop(action, key, which, value):
        state = saved(model)
        entries = _entries(state)
        spec = entries[which % len(entries)]
        names = [repr(spec["name"])]
        if action in ("replace", "delete", "add") and key in state:
            names = [key, "format", "version", "not a complete", "model=", "model_class", "state dict"]
            if action == "replace":
                state[key] = value
            elif action == "delete":
                del state[key]
            else:
                state[key + "_extra"] = value
                names = ["unknown entries"]
        elif action == "drop":
            entries.remove(spec)
            names += ["state dict", "not describe", "lacks", "has no module"]
        elif action == "repeat":
            entries.append(copy.deepcopy(spec))
            names += ["described twice"]
        elif action == "swap":
            other = entries[(which // 7) % len(entries)]
            i, j = entries.index(spec), entries.index(other)
            entries[i], entries[j] = other, spec
            names += [repr(other["name"]), "state dict", "not describe", "not a module", "has no module"]
        elif action == "retype":
            spec["type"] = value
            names += ["type"]
        elif action == "extra key":
            spec[f"x{str(value)[:5]}"] = value
            names = ["entries", repr(spec["name"])]
        elif action == "no key":
            del spec[sorted(spec)[which % 3]]
            names = ["entries"]
        _outcome(tmp_path, model, state, names)

    prop()


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("examples", PROFILES)
def test_the_tensors_of_the_file_tampered(tmp_path, saved, model, examples):
    """A tensor of another shape or dtype, a stray or missing tensor, a non-tensor, an index out of range."""

    @_profile(examples)
    @given(
        action=st.sampled_from(("shape", "dtype", "delete", "stray", "not a tensor", "index", "scalar", "empty")),
        which=st.integers(0, 10**6),
        delta=st.sampled_from((-1, 1, 2)),
        dtype=st.sampled_from((torch.float16, torch.float64, torch.int64, torch.int32, torch.bool, torch.complex64)),
        big=st.sampled_from((-1, 2**31, 2**40, 10**6)),
    )
    def prop(action, which, delta, dtype, big):
        state = saved(model)
        tensors = state["state_dict"]
        key = sorted(tensors)[which % len(tensors)]
        t = tensors[key]
        owner = key.rpartition(".")[0]
        names = [repr(owner), repr(key), "state dict", "state_dict"]
        if action == "shape" and t.dim():
            shape = list(t.shape)
            shape[which % len(shape)] = max(0, shape[which % len(shape)] + delta)
            tensors[key] = torch.zeros(shape, dtype=t.dtype)
        elif action == "dtype":
            tensors[key] = t.to(dtype)
        elif action == "delete":
            del tensors[key]
        elif action == "stray":
            tensors[f"{owner}.stray" if which % 2 else "stray.weight"] = torch.zeros(2)
        elif action == "not a tensor":
            tensors[key] = t.tolist()
        elif action == "index":
            index_keys = [k for k in tensors if k.endswith(".index")]
            if index_keys:
                key = index_keys[which % len(index_keys)]
                tensors[key] = tensors[key].clone()
                tensors[key][which % tensors[key].numel()] = big
                names = [repr(key.rpartition(".")[0])]
        elif action == "scalar":
            tensors[key] = torch.tensor(1.0)
        elif action == "empty":
            tensors[key] = torch.empty(0, dtype=t.dtype)
        _outcome(tmp_path, model, state, names)

    prop()


PLAIN = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(-(2**70), 2**70),
        st.floats(allow_nan=False),
        st.text(max_size=5),
        st.complex_numbers(allow_nan=False, max_magnitude=1e6),
        st.builds(torch.tensor, st.lists(st.floats(-1, 1), max_size=3)),
    ),
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.lists(inner, max_size=3).map(tuple),
        st.dictionaries(st.one_of(st.text(max_size=4), st.integers()), inner, max_size=3),
    ),
    max_leaves=8,
)
UNSAVEABLE = st.sampled_from((lambda: 1, object(), {1, 2}, frozenset(), np.float32(1), np.zeros(2), ValueError, b""))


def _equal(a, b):
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and torch.equal(a, b)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        return type(b) is dict and a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    return type(a) is type(b) and a == b


@pytest.mark.parametrize("examples", PROFILES)
def test_metadata_round_trips_or_is_refused_before_writing(tmp_path, examples):
    pruned = _model("mlp")[0]
    path = tmp_path / "pruned.pt"

    @_profile(examples)
    @given(metadata=st.dictionaries(st.text(max_size=4), PLAIN, max_size=4), bad=st.one_of(st.none(), UNSAVEABLE))
    def prop(metadata, bad):
        save_pruned(pruned, path, {"before": 1})
        first = path.read_bytes()
        if bad is not None:
            metadata = {**metadata, "bad": [bad]}
            with pytest.raises(TypeError, match=r"^metadata\['bad'\]\[0\] is a "):
                save_pruned(pruned, path, metadata)
            assert path.read_bytes() == first and [p.name for p in tmp_path.iterdir()] == ["pruned.pt"]
            return
        save_pruned(pruned, path, metadata)
        loaded, back = load_pruned(path)
        assert _equal(metadata, back)

    prop()


def _torch_transformer():
    """torch's own layers, pruned: an encoder layer with 2 of its 4 heads and no MLP, one without attention."""
    from l0bayes.nn import gates_of
    from l0bayes.pruning import sparsify_transformer

    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(16, 4, 24, dropout=0.0, batch_first=True, norm_first=True)
    encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False).eval()
    gated = sparsify_transformer(encoder, example_inputs=torch.randn(2, 5, 16))
    patterns = {"layers.0.l0_heads": [1, -1, 1, -1], "layers.0.l0_mlp": [-1], "layers.1.l0_attention": [-1]}
    for name, gate in gates_of(gated):
        with torch.no_grad():
            gate.log_alpha.fill_(50.0)
            sign = patterns.get(name.removesuffix(".gate"))
            if sign is not None:
                gate.log_alpha.mul_(torch.tensor(sign, dtype=gate.log_alpha.dtype))
    return prune(gated.eval())


_ATTENTION_ARGS = {
    "embed_dim": st.integers(-2, 10**12),
    "num_heads": st.integers(-2, 10**12),
    "head_dim": st.integers(-2, 10**12),
    "kdim": st.integers(-2, 10**12),
    "vdim": st.integers(-2, 10**12),
    "bias": st.sampled_from([True, False, 1, None]),
    "batch_first": st.sampled_from([True, False, 0, "yes"]),
    "dropout": st.sampled_from([0.0, 0.5, 1.0, -0.1, 2.0, math.nan, math.inf, "0"]),
    "feed_forward": st.sampled_from([True, False, 1, None]),
}


@pytest.mark.parametrize("examples", PROFILES)
def test_torch_transformer_layers_tampered(tmp_path, examples):
    """A pruned torch transformer's file, one argument of a PrunedMultiheadAttention or PrunedTransformerEncoderLayer
    entry changed: refused naming the entry (nothing large allocated, the fresh model as it was), or the model the
    file describes, whose outputs are the pruned model's."""
    pruned = _torch_transformer()
    path = tmp_path / "pruned.pt"
    save_pruned(pruned, path)
    state = torch.load(path, weights_only=True)
    entries = [(k, spec) for k, spec in enumerate(state["modules"]) if spec["type"].startswith("Pruned")]
    assert {spec["type"] for _, spec in entries} == {"PrunedMultiheadAttention", "PrunedTransformerEncoderLayer"}
    x = torch.randn(2, 5, 16, generator=torch.Generator().manual_seed(3))

    @settings(max_examples=examples, deadline=None, database=None)
    @given(data=st.data())
    def probe(data):
        k, spec = data.draw(st.sampled_from(entries))
        key = data.draw(st.sampled_from(sorted(spec["args"])))
        value = data.draw(_ATTENTION_ARGS[key])
        tampered = copy.deepcopy(state)
        tampered["modules"][k]["args"][key] = value
        file = tmp_path / "tampered.pt"
        torch.save(tampered, file)
        layer = nn.TransformerEncoderLayer(16, 4, 24, dropout=0.0, batch_first=True, norm_first=True)
        fresh = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        before = copy.deepcopy(fresh.state_dict())
        modules = [(n, type(m)) for n, m in fresh.named_modules()]
        try:
            loaded, _ = load_pruned(file, model=fresh)
        except (TypeError, ValueError) as err:
            assert str(file) in str(err) and spec["name"] in str(err), str(err)
            assert [(n, type(m)) for n, m in fresh.named_modules()] == modules
            assert all(torch.equal(t, before[name]) for name, t in fresh.state_dict().items())
            return
        # accepted: an argument that changes nothing the tensors fix (dropout in [0, 1], batch_first), or the same
        assert key in ("dropout", "batch_first", "bias", "feed_forward") or value == spec["args"][key], (key, value)
        assert key in ("bias", "kdim", "vdim") or getattr(loaded.get_submodule(spec["name"]), key) == value
        if key != "batch_first":
            with torch.no_grad():
                torch.testing.assert_close(loaded(x), pruned(x), rtol=0, atol=0)

    probe()
