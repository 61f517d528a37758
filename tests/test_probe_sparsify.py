"""Property-based probes of sparsify and prune on small convolutional networks, and of sparsify's example inputs.

The networks are drawn: 1-, 2- or 3-d convolutions in every ``padding_mode``, a batch norm or not, a second
convolution that is plain, grouped, depthwise or depthwise with a multiplier, and gates closed, fractional and open
at random. Each one is pruned within a deadline (never a hang), computes what the gated network computes in
``eval()`` mode (float64), has the channels that a count by hand from the closed gates predicts, and saves and loads
back exactly. Example inputs of any shape or type either fit the model or are an error naming ``example_inputs``.
The file of a pruned grouped network, its convolutions' ``groups`` and channels tampered with, loads as what it
describes or is refused naming the file and the layer.

Each property runs twice: a few examples in the default run, many more under ``-m slow``.
"""

import copy

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from test_sparsify_convnd import _within
from torch import nn

from l0bayes.nn import gates_of
from l0bayes.pruning import count_parameters, prune, sparsify
from l0bayes.pruning.describe import describe_pruned
from l0bayes.pruning.export import load_pruned, save_pruned

FAST, SLOW = 6, 150
PROFILES = [pytest.param(FAST, id="fast"), pytest.param(SLOW, marks=pytest.mark.slow, id="slow")]
_CONVS = {1: nn.Conv1d, 2: nn.Conv2d, 3: nn.Conv3d}
_BATCH_NORMS = {1: nn.BatchNorm1d, 2: nn.BatchNorm2d, 3: nn.BatchNorm3d}


def _profile(examples):
    return settings(max_examples=examples, deadline=None, derandomize=True, database=None)


@st.composite
def _networks(draw):
    """``(spec, net, x, closed)``: a 3-conv network, an input batch and the closed gates of its first two convs."""
    dims = draw(st.sampled_from([1, 2, 3]))
    mode = draw(st.sampled_from(["zeros", "reflect", "replicate", "circular"]))
    kind = draw(st.sampled_from(["plain", "grouped", "depthwise", "multiplier"]))
    groups = {"plain": 1, "grouped": draw(st.sampled_from([2, 3])), "depthwise": 0, "multiplier": 0}[kind]
    c1 = draw(st.integers(2, 4)) * max(groups, 1) if kind in ("plain", "grouped") else draw(st.integers(2, 6))
    groups = groups or c1
    c2 = {"plain": draw(st.integers(1, 5)), "grouped": groups * draw(st.integers(1, 3)), "depthwise": c1}.get(
        kind, 2 * c1
    )
    spec = {"dims": dims, "mode": mode, "kind": kind, "c1": c1, "c2": c2, "groups": groups}
    spec["batch_norm"] = draw(st.booleans())
    conv = _CONVS[dims]
    layers = [conv(2, c1, 3, padding=1, padding_mode=mode)]
    layers += [_BATCH_NORMS[dims](c1)] if spec["batch_norm"] else []
    layers += [nn.ReLU(), conv(c1, c2, 3, padding=1, groups=groups, padding_mode=mode), nn.ReLU(), conv(c2, 2, 1)]
    torch.manual_seed(draw(st.integers(0, 2**16)))
    net = nn.Sequential(*layers).double()
    if spec["batch_norm"]:
        with torch.no_grad():
            net[1].running_mean.normal_()
            net[1].running_var.uniform_(0.5, 1.5)
            net[1].weight.normal_()
            net[1].bias.normal_()
    x = torch.randn(3, 2, *[5] * dims, dtype=torch.float64)
    closed = [draw(st.sets(st.integers(0, c - 1), max_size=c)) for c in (c1, c2)]
    return spec, net, x, closed


def _removed(closed, channels, groups, depthwise):
    """How many of ``closed`` (channels of one side of a convolution with ``groups``) prune removes, by hand: all
    but one when all are closed, then as many from every group as the group with the fewest has, at most all but
    one of each; none where a depthwise convolution ties them to channels that are not zero."""
    if depthwise:
        return 0
    closed = sorted(closed)[1:] if len(closed) == channels else sorted(closed)
    per = channels // groups
    return groups * min(min(sum(1 for c in closed if c // per == g) for g in range(groups)), per - 1)


@pytest.mark.parametrize("examples", PROFILES)
@pytest.mark.filterwarnings("ignore:prune kept")  # grouped convolutions keep closed channels: said
def test_pruned_networks_equal_the_gated_ones_and_keep_valid_groups(tmp_path, examples):
    @_profile(examples)
    @given(drawn=_networks(), fractional=st.booleans())
    def prop(drawn, fractional):
        spec, net, x, closed = drawn
        gated = sparsify(net, example_inputs=x)
        with torch.no_grad():
            for (name, gate), shut in zip(gates_of(gated), [*closed, set()], strict=True):
                gate.log_alpha.fill_(0.6 if fractional else 30.0)  # fractional: Eq. 13 gate about 0.77
                gate.log_alpha[sorted(shut)] = -30.0
        gated.eval()
        pruned = _within(20, prune, gated)
        convs = [m for m in pruned.modules() if isinstance(m, tuple(_CONVS.values()))]
        c1, c2, groups = spec["c1"], spec["c2"], spec["groups"]
        depthwise = c2 == groups > 1  # one output channel per group (torch-pruning's depthwise convolution)
        kept1 = c1 - _removed(closed[0], c1, groups, depthwise or spec["kind"] == "multiplier")
        kept2 = c2 - _removed(closed[1], c2, groups, depthwise)
        assert [(m.in_channels, m.out_channels, m.groups) for m in convs] == [
            (2, kept1, 1),
            (kept1, kept2, groups),
            (kept2, 2, 1),
        ], spec
        assert all(m.padding_mode == spec["mode"] for m in convs[:2])
        taps = 3 ** spec["dims"]
        expected = (
            kept1 * (2 * taps + 1 + 2 * spec["batch_norm"]) + kept2 * (kept1 // groups * taps + 1) + 2 * kept2 + 2
        )
        assert count_parameters(pruned) == expected, spec
        probe = torch.randn(4, *x.shape[1:], dtype=torch.float64)
        with torch.no_grad():
            reference = gated(probe)
            torch.testing.assert_close(pruned(probe), reference, atol=1e-10, rtol=1e-10)
            save_pruned(pruned, tmp_path / "pruned.pt")
            loaded, _ = load_pruned(tmp_path / "pruned.pt")
            assert torch.equal(loaded(probe), pruned(probe))

    prop()


_ANY_INPUTS = st.one_of(
    st.integers(1, 4).map(lambda n: torch.randn(n, 3, 6)),
    st.lists(st.integers(0, 7), min_size=0, max_size=5).map(lambda shape: torch.randn(shape)),
    st.tuples(st.integers(1, 3), st.integers(1, 5), st.integers(1, 9)).map(lambda s: (torch.randn(s), torch.randn(s))),
    st.sampled_from(
        [None, 3, "x", [torch.randn(2, 3, 6)], (), (torch.randn(2, 3, 6), None), torch.randn(2, 3, 6).numpy()]
    ),
)


@pytest.mark.parametrize("examples", PROFILES)
def test_example_inputs_fit_the_model_or_are_named(examples):
    net = nn.Sequential(nn.Conv1d(3, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 4, 2))  # inputs (3, 6)

    @_profile(examples * 3)
    @given(inputs=_ANY_INPUTS)
    def prop(inputs):
        fits = torch.is_tensor(inputs) and inputs.dim() == 3 and inputs.shape[0] >= 1 and inputs.shape[1:] == (3, 6)
        if inputs is None:
            with pytest.raises(ValueError, match=r"gating a convolution needs example_inputs"):
                sparsify(net, example_inputs=inputs)
            return
        if fits:
            gated = sparsify(net, example_inputs=inputs)
            assert [n for n, _ in gates_of(gated)] == ["0.gate", "3.gate"]
            return
        with pytest.raises((TypeError, ValueError), match=r"^sparsify: example_inputs ") as info:
            sparsify(net, example_inputs=inputs)
        assert not isinstance(info.value, TypeError) or not torch.is_tensor(inputs)

    prop()


@pytest.mark.parametrize("examples", PROFILES)
def test_a_grouped_convolution_in_a_file_tampered(tmp_path, examples):
    net = nn.Sequential(nn.Conv2d(4, 6, 3, groups=2), nn.ReLU(), nn.Conv2d(6, 6, 3, groups=6, bias=False)).eval()
    save_pruned(net, tmp_path / "grouped.pt")
    saved = torch.load(tmp_path / "grouped.pt", weights_only=True)
    path = tmp_path / "tampered.pt"

    @_profile(examples * 5)
    @given(
        layer=st.sampled_from([0, 2]),
        key=st.sampled_from(["groups", "in_channels", "out_channels"]),
        value=st.one_of(
            st.integers(-2, 40), st.just(2**40), st.none(), st.booleans(), st.floats(), st.text(max_size=2)
        ),
    )
    def prop(layer, key, value):
        state = copy.deepcopy(saved)
        entry = state["layers"][layer]
        entry["args"][key] = value
        torch.save(state, path)
        try:
            loaded, _ = load_pruned(path)
        except (TypeError, ValueError) as err:
            assert repr(str(path)) in str(err) and f"layer '{layer}'" in str(err), str(err)
            return
        assert describe_pruned(loaded) == state["layers"]  # what the file describes, with the file's tensors
        for name, tensor in loaded.state_dict().items():
            assert torch.equal(tensor, state["state_dict"][name])

    prop()
