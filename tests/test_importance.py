"""Importance scores of the gates from calibration batches, and gates that start from them (l0bayes.pruning.importance).

The scores are checked against computations that do not go through the gates: an independent autograd of the
network with explicit multipliers, closed forms, norms of the signals read by forward hooks, torch-pruning's
GroupTaylorImportance. The initialisation is checked against the constrained objective's own cut and count.
"""

import math
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from l0bayes.inference import Constrained
from l0bayes.inference.objectives.final_phase import fit_groups
from l0bayes.models import SparseClassifier
from l0bayes.nn import L0MLP, HardConcreteGate, gate_owners, gates_of
from l0bayes.pruning import (
    count_parameters,
    importance_scores,
    init_from_importance,
    network_size,
    prune,
    sparsify,
    sparsify_transformer,
)


def _mlp(seed=0):
    """A 5-6-3 L0MLP with hand-set weights (a fixed pattern, no random draw)."""
    torch.manual_seed(seed)
    net = L0MLP(5, [6], 3)
    with torch.no_grad():
        for layer in (net.fc1, net.fc2):
            n = layer.weight.numel()
            values = torch.sin(torch.arange(n, dtype=torch.float32) * 1.7 + layer.in_features)
            layer.weight.copy_(values.view_as(layer.weight))
            layer.bias.copy_(torch.cos(torch.arange(layer.out_features, dtype=torch.float32)) * 0.1)
    return net


def _batches(seed=0, n=2, size=8, features=5, classes=3):
    g = torch.Generator().manual_seed(seed)
    return [
        (torch.randn(size, features, generator=g), torch.randint(0, classes, (size,), generator=g)) for _ in range(n)
    ]


def _explicit_taylor(net, batches):
    """|sum_b dL_b/dz| of the ungated network computed with explicit multipliers on fc1's and fc2's inputs."""
    z1 = torch.ones(net.fc1.in_features, dtype=torch.float64, requires_grad=True)
    z2 = torch.ones(net.fc2.in_features, dtype=torch.float64, requires_grad=True)
    w1, b1, w2, b2 = (t.detach().double() for t in (net.fc1.weight, net.fc1.bias, net.fc2.weight, net.fc2.bias))
    total = 0.0
    for x, y in batches:
        h = torch.relu(F.linear(x.double() * z1, w1, b1))
        total = total + F.cross_entropy(F.linear(h * z2, w2, b2), y)
    g1, g2 = torch.autograd.grad(total, (z1, z2))
    return g1.abs(), g2.abs()


def test_taylor_scores_are_the_gradient_at_open_gates():
    net = _mlp()
    batches = _batches()
    scores = importance_scores(net, batches, F.cross_entropy)
    assert list(scores) == ["fc1.gate", "fc2.gate"]
    t1, t2 = _explicit_taylor(net, batches)
    torch.testing.assert_close(scores["fc1.gate"], t1, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(scores["fc2.gate"], t2, rtol=1e-5, atol=1e-7)
    # by hand for the output layer's inputs: dL/dz_i = sum_o W[o, i] sum_n (softmax - onehot)[n, o] h[n, i] / N
    w1, b1, w2, b2 = (t.detach().double() for t in (net.fc1.weight, net.fc1.bias, net.fc2.weight, net.fc2.bias))
    hand = torch.zeros(net.fc2.in_features, dtype=torch.float64)
    for x, y in batches:
        h = torch.relu(x.double() @ w1.T + b1)
        delta = (torch.softmax(h @ w2.T + b2, dim=1) - F.one_hot(y, 3).double()) / x.shape[0]
        hand += ((delta.T @ h) * w2).sum(0)
    torch.testing.assert_close(scores["fc2.gate"], hand.abs(), rtol=1e-5, atol=1e-7)
    # the Taylor score of a group of weights: |sum_b sum_{w in column i} w dL_b/dw| (multivariable Taylor)
    plain = nn.Sequential(nn.Linear(5, 6), nn.ReLU(), nn.Linear(6, 3)).double()
    with torch.no_grad():
        for dst, src in ((plain[0], net.fc1), (plain[2], net.fc2)):
            dst.weight.copy_(src.weight)
            dst.bias.copy_(src.bias)
    for x, y in batches:
        F.cross_entropy(plain(x.double()), y).backward()
    for layer, name in ((plain[0], "fc1.gate"), (plain[2], "fc2.gate")):
        weights = (layer.weight * layer.weight.grad).sum(0).abs().detach()
        torch.testing.assert_close(scores[name], weights, rtol=1e-5, atol=1e-7)


def test_activation_scores_are_signal_norms_times_the_reading_weights():
    net = _mlp()
    batches = _batches()
    scores = importance_scores(net, batches, kind="activation")
    x = torch.cat([b[0] for b in batches]).double()
    h = torch.relu(x @ net.fc1.weight.detach().double().T + net.fc1.bias.detach().double())
    expected1 = x.norm(dim=0) * net.fc1.weight.detach().double().abs().sum(0)
    expected2 = h.norm(dim=0) * net.fc2.weight.detach().double().abs().sum(0)
    torch.testing.assert_close(scores["fc1.gate"], expected1, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(scores["fc2.gate"], expected2, rtol=1e-5, atol=1e-6)


def test_taylor_equals_torch_pruning_group_taylor_on_hidden_units():
    tp = pytest.importorskip("torch_pruning")
    torch.manual_seed(1)
    plain = nn.Sequential(nn.Linear(6, 8, bias=False), nn.ReLU(), nn.Linear(8, 3)).eval()
    gated = sparsify(plain)
    batches = _batches(seed=3, features=6)
    scores = importance_scores(gated, batches, F.cross_entropy)
    for x, y in batches:
        F.cross_entropy(plain(x), y).backward()
    graph = tp.DependencyGraph().build_dependency(plain, example_inputs=batches[0][0])
    group = graph.get_pruning_group(plain[0], tp.prune_linear_out_channels, idxs=list(range(8)))
    reference = tp.importance.GroupTaylorImportance(multivariable=True, normalizer=None)(group)
    torch.testing.assert_close(scores["2.gate"], reference.double(), rtol=1e-4, atol=1e-7)


class _ConvNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(2, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4)
        self.drop = nn.Dropout(0.5)
        self.fc = nn.Linear(4 * 4 * 4, 3)

    def forward(self, x):
        return self.fc(self.drop(torch.relu(self.bn(self.conv(x)))).flatten(1))


def _cnn():
    torch.manual_seed(0)
    model = _ConvNet()
    with torch.no_grad():  # batch norm statistics of its own, so that eval() differs from the identity
        model.bn.running_mean.uniform_(-0.5, 0.5)
        model.bn.running_var.uniform_(0.5, 2.0)
        model.bn.weight.uniform_(0.5, 1.5)
    return sparsify(model, example_inputs=torch.randn(2, 2, 4, 4))


def _image_batches():
    g = torch.Generator().manual_seed(5)
    return [(torch.randn(4, 2, 4, 4, generator=g), torch.randint(0, 3, (4,), generator=g)) for _ in range(2)]


@pytest.mark.parametrize("kind", ["taylor", "activation"])
def test_scores_leave_the_model_as_it_was(kind):
    model = _cnn()
    model.train()
    model.bn.eval()  # a mixed mode is restored module by module
    model.fc.weight.grad = torch.full_like(model.fc.weight, 0.5)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    modes = {name: m.training for name, m in model.named_modules()}
    flags = {name: p.requires_grad for name, p in model.named_parameters()}
    torch.manual_seed(11)
    scores = importance_scores(model, _image_batches(), F.cross_entropy, kind=kind)
    after = torch.rand(3)
    torch.manual_seed(11)
    assert torch.equal(after, torch.rand(3))  # the generator is where it was
    assert set(scores) == {name for name, _ in gates_of(model)} == {"conv.gate", "fc.gate"}
    assert all(
        s.shape == (g.num_gates,) and bool(torch.isfinite(s).all())
        for (_, g), s in zip(gates_of(model), scores.values())
    )
    for k, v in model.state_dict().items():
        assert torch.equal(v, state[k]), k
    assert {name: m.training for name, m in model.named_modules()} == modes
    assert {name: p.requires_grad for name, p in model.named_parameters()} == flags
    assert torch.equal(model.fc.weight.grad, torch.full_like(model.fc.weight, 0.5))
    assert all(p.grad is None for name, p in model.named_parameters() if name != "fc.weight")
    for _, gate in gates_of(model):
        assert gate._value is None and gate._num_open is None and gate.observer is None
        assert "observer" not in gate.__dict__


def test_activation_scores_of_conv_channels_are_their_batch_norm_outputs():
    model = _cnn()
    batches = _image_batches()
    scores = importance_scores(model, batches, kind="activation")
    model.eval()
    with torch.no_grad():
        x = torch.cat([b[0] for b in batches])
        z = nn.BatchNorm2d.forward(model.bn, nn.Conv2d.forward(model.conv, x))  # forward without hooks: no gates
        flat = torch.relu(z).flatten(1)
    torch.testing.assert_close(
        scores["conv.gate"], z.double().transpose(0, 1).flatten(1).norm(dim=1), rtol=1e-5, atol=1e-6
    )
    torch.testing.assert_close(
        scores["fc.gate"],
        flat.double().norm(dim=0) * model.fc.weight.detach().double().abs().sum(0),
        rtol=1e-5,
        atol=1e-6,
    )


def test_a_sparse_model_brings_its_own_loss():
    net = _mlp()
    batches = _batches()
    own = importance_scores(SparseClassifier(net), batches)
    given = importance_scores(net, batches, F.cross_entropy)
    assert list(own) == ["net.fc1.gate", "net.fc2.gate"]
    for name, value in given.items():
        torch.testing.assert_close(own["net." + name], value)


def _llama():
    transformers = pytest.importorskip("transformers")
    transformers.logging.set_verbosity_error()
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        vocab_size=40, max_position_embeddings=8, use_cache=False,
    )  # fmt: skip
    model = transformers.LlamaForCausalLM(config).eval()
    ids = torch.randint(0, 40, (2, 8), generator=torch.Generator().manual_seed(1))
    return sparsify_transformer(model, example_inputs=ids, depth=True), ids


def _lm_loss(output, y):
    return F.cross_entropy(output.logits.flatten(0, 1), y.flatten())


@pytest.mark.parametrize("kind", ["taylor", "activation"])
def test_transformer_scores_exist_for_every_gate(kind):
    model, ids = _llama()
    scores = importance_scores(model, [(ids, ids), (ids.flip(1), ids.flip(1))], _lm_loss, kind=kind)
    named = gates_of(model)
    assert list(scores) == [name for name, _ in named]
    kinds = {name.split(".")[-2] for name in scores}
    assert kinds == {"l0_heads", "l0_units", "l0_attention", "l0_mlp", "l0_block"}
    for (name, gate), s in zip(named, scores.values()):
        assert s.shape == (gate.num_gates,) and bool(torch.isfinite(s).all()), name
        assert bool((s > 0).any()), name


class _Encoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok = nn.Embedding(20, 16)
        layer = nn.TransformerEncoderLayer(16, 2, 24, dropout=0.1, batch_first=True, norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.head = nn.Linear(16, 20)

    def forward(self, idx):
        return self.head(self.encoder(self.tok(idx)))


def test_a_block_gate_sees_both_branches():
    torch.manual_seed(0)
    ids = torch.randint(0, 20, (2, 6), generator=torch.Generator().manual_seed(2))
    encoder = sparsify_transformer(_Encoder(), example_inputs=ids, depth=True)
    llama, llama_ids = _llama()
    for model, x in ((encoder, ids), (llama, llama_ids)):
        scores = importance_scores(model, [(x, None)], kind="activation")
        blocks = [name.rpartition(".l0_block")[0] for name in scores if name.endswith("l0_block.gate")]
        assert len(blocks) == 2
        for b in blocks:  # at open gates the block gate multiplies the outputs its branches' gates multiply
            branches = scores[f"{b}.l0_attention.gate"] ** 2 + scores[f"{b}.l0_mlp.gate"] ** 2
            torch.testing.assert_close(scores[f"{b}.l0_block.gate"] ** 2, branches)
            assert bool((scores[f"{b}.l0_heads.gate"] > 0).all()) and bool((scores[f"{b}.l0_units.gate"] > 0).all())


def _ranks(scores):
    """The normalised log-scores init_from_importance ranks by: each vector over its median, the one-gate vectors of
    one kind (the attention branches of every block, ...) over their common median."""
    shared = {}
    for name, s in scores.items():
        if s.numel() == 1:
            shared.setdefault(name.split(".")[-2], []).append(s)
    out = []
    for name, s in scores.items():
        joined = torch.cat(shared[name.split(".")[-2]]) if s.numel() == 1 else s
        out.append(torch.log(s / joined.median()).clamp(-20, 20))
    return out


def _check_init(model, scores, target):
    objective = Constrained(target_density=target)
    kept = init_from_importance(model, scores, objective)
    size = network_size(model)
    assert float(size.fraction("parameters", "expected").detach()) == pytest.approx(target, abs=1e-3)
    layers = [layer for layer, _ in gate_owners(model)]
    greedy = fit_groups(size, layers, _ranks(scores), "parameters", [target], False)
    for (name, gate), mask, by_hand in zip(gates_of(model), kept.values(), greedy):
        assert torch.equal(mask, by_hand), name  # the importance cut, by the final phase's greedy fit
        assert torch.equal(gate.active().cpu(), mask), name  # Eq. 13 at step 0
    for built_mask, mask in zip(objective.build(model, 1).keep_masks(), kept.values()):
        assert torch.equal(built_mask, mask)  # a cut at step 0 is the importance cut
    return kept


def test_init_from_importance_mlp():
    net = _mlp()
    scores = importance_scores(net, _batches(), F.cross_entropy)
    kept = _check_init(net, scores, 0.5)
    pruned = prune(net)
    assert pruned.fc1.in_features == int(kept["fc1.gate"].sum())
    assert pruned.fc2.in_features == int(kept["fc2.gate"].sum())
    fraction = count_parameters(pruned) / count_parameters(net)
    assert fraction == pytest.approx(network_size(net).fraction("parameters", "test")) and fraction <= 0.5
    for (_, gate), s, mask in zip(gates_of(net), scores.values(), kept.values()):
        la = gate.log_alpha.detach()
        threshold = math.log(-gate.lower / gate.upper)
        assert bool((la[mask] > threshold).all()) and bool((la[~mask] < threshold).all())
        for side in (mask, ~mask):  # the scores' order among the kept groups and among the dropped ones
            order = torch.argsort(s[side])
            assert bool((la[side][order].diff() > 0).all())


def test_init_from_importance_cnn_and_transformer():
    model = _cnn()
    _check_init(model, importance_scores(model, _image_batches(), F.cross_entropy), 0.4)
    llama, ids = _llama()
    scores = importance_scores(llama, [(ids, ids)], _lm_loss, kind="activation")
    _check_init(llama, scores, 0.6)


def test_init_from_importance_target_architecture():
    model, ids = _llama()
    scores = importance_scores(model, [(ids, ids)], _lm_loss)
    objective = Constrained(target_architecture={"num_key_value_heads": 1, "intermediate_size": 20})
    kept = init_from_importance(model, scores, objective)
    built = objective.build(model, 1)
    torch.testing.assert_close(built.expected().double(), torch.tensor(built.target_values).double(), atol=1e-3, rtol=0)
    for name, mask in kept.items():
        if name.endswith("l0_heads.gate"):
            assert int(mask.sum()) == 1 and int(scores[name].argmax()) == int(mask.nonzero())
        elif name.endswith("l0_units.gate"):
            assert int(mask.sum()) == 20
            assert set(mask.nonzero().flatten().tolist()) == set(scores[name].topk(20).indices.tolist())
        else:  # the branches and blocks the target does not name stay open
            assert bool(mask.all())
    pruned = prune(model)
    assert pruned.config.num_key_value_heads == 1 and pruned.config.intermediate_size == 20


def test_unreachable_target_warns():
    net = _mlp()
    scores = importance_scores(net, _batches(), F.cross_entropy)
    with pytest.warns(UserWarning, match="init_from_importance: no shift"):
        init_from_importance(net, scores, Constrained(target_density=0.01))
    # the cut is still the objective's: one group per layer
    assert [int(g.active().sum()) for _, g in gates_of(net)] == [1, 1]


class _Bare(nn.Module):
    """A gate multiplied without reporting its signal."""

    def __init__(self):
        super().__init__()
        self.gate = HardConcreteGate(3)

    def forward(self, x):
        return x * self.gate()


def test_bad_arguments():
    net = _mlp()
    batches = _batches()
    with pytest.raises(ValueError, match="kind must be one of"):
        importance_scores(net, batches, F.cross_entropy, kind="wanda")
    with pytest.raises(ValueError, match="batches is empty"):
        importance_scores(net, [], F.cross_entropy)
    with pytest.raises(ValueError, match="batches is empty"):
        importance_scores(net, iter([]), kind="activation")
    with pytest.raises(TypeError, match=r"\(x, y\) pairs"):
        importance_scores(net, [batches[0][0]], F.cross_entropy)
    with pytest.raises(TypeError, match="needs a loss"):
        importance_scores(net, batches)
    with pytest.raises(ValueError, match="scalar"):
        importance_scores(net, batches, lambda out, y: F.cross_entropy(out, y, reduction="none"))
    with pytest.raises(ValueError, match="no HardConcreteGate"):
        importance_scores(nn.Linear(2, 2), batches)
    with pytest.raises(ValueError, match="reported no signal"):
        importance_scores(_Bare(), [(torch.ones(2, 3), None)], kind="activation")
    assert importance_scores(_Bare(), [(torch.ones(2, 3), torch.zeros(2, 3))], F.mse_loss)["gate"].shape == (3,)
    bare = _Bare()
    bare.unused = HardConcreteGate(2)
    with pytest.warns(UserWarning, match=r"does not depend on the gates \['unused'\]"):
        scores = importance_scores(bare, [(torch.ones(2, 3), torch.zeros(2, 3))], F.mse_loss)
    assert torch.equal(scores["unused"], torch.zeros(2, dtype=torch.float64)) and bool((scores["gate"] > 0).all())
    scores = importance_scores(net, batches, F.cross_entropy)
    before = [g.log_alpha.detach().clone() for _, g in gates_of(net)]
    with pytest.raises(TypeError, match="Constrained"):
        init_from_importance(net, scores, "constrained")
    with pytest.raises(ValueError, match="per_layer"):
        init_from_importance(net, scores, Constrained(target_density=0.5, per_layer=True))
    with pytest.raises(ValueError, match="rank must be 'log_alpha'"):
        init_from_importance(net, scores, Constrained(target_density=0.5, rank="norm"))
    with pytest.raises(TypeError, match="must be a dict"):
        init_from_importance(net, list(scores.values()), Constrained(target_density=0.5))
    with pytest.raises(ValueError, match=r"missing \['fc2.gate'\]"):
        init_from_importance(net, {"fc1.gate": scores["fc1.gate"]}, Constrained(target_density=0.5))
    with pytest.raises(ValueError, match="shape"):
        init_from_importance(net, {**scores, "fc2.gate": torch.ones(2)}, Constrained(target_density=0.5))
    with pytest.raises(ValueError, match="finite and >= 0"):
        init_from_importance(net, {**scores, "fc2.gate": -torch.ones(6)}, Constrained(target_density=0.5))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(ValueError, match="target_architecture"):  # the objective's own check, gates untouched
            init_from_importance(net, scores, Constrained(target_architecture={"intermediate_size": 2}))
    for (_, g), la in zip(gates_of(net), before):
        assert torch.equal(g.log_alpha.detach(), la)
