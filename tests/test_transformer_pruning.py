"""Transformers: head, MLP unit and branch gates (sparsify_transformer), prune(), and the pruned model's size."""

import itertools
import math
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from l0bayes.inference import Constrained, train
from l0bayes.inference.objectives.final_phase import fit_groups as _fit_groups
from l0bayes.models import SparseModel
from l0bayes.nn import gates_of
from l0bayes.pruning import (
    Block,
    PrunedMultiheadAttention,
    count_parameters,
    flops_per_token,
    network_size,
    prune,
    sparsify_transformer,
)
from l0bayes.pruning.transformer import ZeroBranch
from l0bayes.pruning.transformer.attention import _ExplicitMultiheadAttention

VOCAB, D, HEADS, T = 11, 16, 4, 6


class CausalSelfAttention(nn.Module):
    """GPT-like attention as a user writes it: q/k/v/out linear layers, ``n_head`` heads."""

    def __init__(self, d=D, n_head=HEADS):
        super().__init__()
        self.n_head, self.head_dim = n_head, d // n_head
        self.q, self.k, self.v = nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, d)
        self.proj = nn.Linear(d, d)

    def forward(self, x):
        b, t, _ = x.shape
        q, k, v = (f(x).view(b, t, self.n_head, self.head_dim).transpose(1, 2) for f in (self.q, self.k, self.v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(b, t, self.n_head * self.head_dim))


class MLP(nn.Module):
    def __init__(self, d=D, hidden=4 * D):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(d, hidden), nn.Linear(hidden, d)

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x)))


class GPTBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1, self.attn, self.ln2, self.mlp = nn.LayerNorm(D), CausalSelfAttention(), nn.LayerNorm(D), MLP()

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class TinyGPT(nn.Module):
    def __init__(self, layers=2):
        super().__init__()
        self.tok, self.pos = nn.Embedding(VOCAB, D), nn.Embedding(T, D)
        self.blocks = nn.ModuleList(GPTBlock() for _ in range(layers))
        self.ln, self.head = nn.LayerNorm(D), nn.Linear(D, VOCAB, bias=False)

    def forward(self, idx):
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln(x))


class Encoder(nn.Module):
    def __init__(self, batch_first=True, norm_first=False):
        super().__init__()
        self.batch_first = batch_first
        self.tok = nn.Embedding(VOCAB, D)
        layer = nn.TransformerEncoderLayer(D, HEADS, 32, dropout=0.1, batch_first=batch_first, norm_first=norm_first)
        self.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.head = nn.Linear(D, VOCAB)

    def forward(self, idx):
        x = self.tok(idx if self.batch_first else idx.T)
        out = self.head(self.encoder(x))
        return out if self.batch_first else out.transpose(0, 1)


def _tokens(n=3, seed=0):
    return torch.randint(0, VOCAB, (n, T), generator=torch.Generator().manual_seed(seed))


def _random_gates(model, seed, p_closed=0.4):
    """A random pattern: some gates exactly closed (Eq. 13 gate 0), the others open or fractional."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, gate in gates_of(model):
            n = gate.num_gates
            closed = torch.rand(n, generator=g) < p_closed
            value = torch.where(closed, torch.full((n,), -8.0), torch.randn(n, generator=g) * 2.0 + 1.0)
            gate.log_alpha.copy_(value)


def _gpt(seed=0, **kwargs):
    torch.manual_seed(seed)
    return sparsify_transformer(TinyGPT(), example_inputs=_tokens(), **kwargs)


def _encoder(seed=0, **kwargs):
    torch.manual_seed(seed)
    return sparsify_transformer(Encoder(**kwargs), example_inputs=_tokens())


# ------------------------------------------------------------------------------------------ gating


def test_gates_found_by_default_names():
    gated = _gpt()
    names = [n for n, _ in gates_of(gated)]
    assert names == [
        f"blocks.{i}.{g}.gate" for i in range(2) for g in ("l0_heads", "l0_units", "l0_attention", "l0_mlp")
    ]
    sizes = {n: g.num_gates for n, g in gates_of(gated)}
    assert sizes["blocks.0.l0_heads.gate"] == HEADS and sizes["blocks.0.l0_units.gate"] == 4 * D
    assert sizes["blocks.0.l0_attention.gate"] == 1
    enc = _encoder()
    assert [n for n, _ in gates_of(enc)][:4] == [
        f"encoder.layers.0.{g}.gate" for g in ("l0_heads", "l0_units", "l0_attention", "l0_mlp")
    ]


def test_head_gate_multiplies_each_heads_output():
    """Closing a head equals zeroing its columns of the output projection (its contribution to the output)."""
    gated = _gpt().eval()
    x = _tokens()
    with torch.no_grad():
        gated.blocks[0].l0_heads.gate.log_alpha[1] = -10.0
        reference = TinyGPT()
        reference.load_state_dict({k: v for k, v in gated.state_dict().items() if ".l0_" not in k})
        for block in gated.blocks:  # the other gates are Eq. 13 values: fold them into the reference
            for gate in ("l0_heads", "l0_units", "l0_attention", "l0_mlp"):
                getattr(block, gate).gate.log_alpha.fill_(10.0)
        gated.blocks[0].l0_heads.gate.log_alpha[1] = -10.0
        reference.blocks[0].attn.proj.weight[:, 4:8] = 0.0
        assert torch.allclose(gated(x), reference(x), atol=1e-6)


@pytest.mark.parametrize("batch_first", [True, False])
@pytest.mark.parametrize("norm_first", [False, True])
def test_multihead_attention_with_open_gates_equals_the_original(batch_first, norm_first):
    torch.manual_seed(1)
    original = Encoder(batch_first, norm_first).eval()
    gated = sparsify_transformer(original, example_inputs=_tokens()).eval()
    with torch.no_grad():
        for _, gate in gates_of(gated):
            gate.log_alpha.fill_(10.0)  # every Eq. 13 gate exactly 1
        x = _tokens(4, seed=3)
        assert torch.allclose(gated(x), original(x), atol=1e-6)
        # the attention itself, with masks and weights, against nn.MultiheadAttention's fused path
        mha = original.encoder.layers[0].self_attn
        explicit = gated.encoder.layers[0].self_attn
        assert isinstance(explicit, _ExplicitMultiheadAttention)
        q = torch.randn(2, 5, D) if batch_first else torch.randn(5, 2, D)
        pad = torch.tensor([[False] * 4 + [True], [False] * 5])
        causal = nn.Transformer.generate_square_subsequent_mask(5)
        for kwargs in ({}, {"key_padding_mask": pad}, {"attn_mask": causal}, {"average_attn_weights": False}):
            a, wa = mha(q, q, q, **kwargs)
            b, wb = explicit(q, q, q, **kwargs)
            assert torch.allclose(a, b, atol=1e-6) and torch.allclose(wa, wb, atol=1e-6)


def test_one_draw_per_forward_in_training():
    gated = _gpt().train()
    calls = []
    gate = gated.blocks[0].l0_heads.gate
    gate.register_forward_hook(lambda *a: calls.append(1))
    gated(_tokens())
    assert len(calls) == 1


def test_bad_block_names_raise():
    with pytest.raises(ValueError, match="no module named 'nope'"):
        sparsify_transformer(TinyGPT(), [Block("nope")], example_inputs=_tokens())
    with pytest.raises(ValueError, match="q: no module named .blocks.0.attn.query."):
        sparsify_transformer(TinyGPT(), [Block("blocks.0", q="query")], example_inputs=_tokens())
    with pytest.raises(ValueError, match="split into num_heads=5"):
        sparsify_transformer(TinyGPT(), [Block("blocks.0", num_heads=5)], example_inputs=_tokens())
    with pytest.raises(ValueError, match="example_inputs"):
        sparsify_transformer(TinyGPT(), example_inputs=None)
    with pytest.raises(ValueError, match="already has gates"):
        sparsify_transformer(_gpt(), example_inputs=_tokens())


# ------------------------------------------------------------------------------------------- prune


@pytest.mark.parametrize("seed", range(4))
def test_pruned_gpt_equals_gated_and_exports(seed):
    gated = _gpt(seed)
    _random_gates(gated, seed)
    if seed == 0:  # a whole branch closed, and a block with every head closed
        with torch.no_grad():
            gated.blocks[1].l0_mlp.gate.log_alpha.fill_(-8.0)
            gated.blocks[0].l0_heads.gate.log_alpha.fill_(-8.0)
    gated.eval()
    pruned = prune(gated)
    x = _tokens(4, seed=seed + 10)
    with torch.no_grad():
        assert torch.allclose(pruned(x), gated(x), atol=1e-5)
    assert count_parameters(pruned) < count_parameters(gated)
    kept = int(gated.blocks[1].l0_heads.gate.active().sum())
    alive = [bool(b.l0_attention.gate.active() or b.l0_mlp.gate.active()) for b in gated.blocks]
    assert len(pruned.blocks) == sum(alive)  # a block with both branches closed is removed
    if gated.blocks[1].l0_attention.gate.active().item():
        attn = pruned.blocks[int(alive[0])].attn
        assert attn.n_head == max(kept, 1) and attn.q.out_features == max(kept, 1) * D // HEADS
    exported = torch.export.export(pruned, (x,))
    assert torch.allclose(exported.module()(x), pruned(x), atol=1e-6)


@pytest.mark.parametrize("batch_first", [True, False])
def test_pruned_encoder_equals_gated_and_exports(batch_first):
    gated = _encoder(2, batch_first=batch_first)
    _random_gates(gated, 5)
    with torch.no_grad():
        gated.encoder.layers[1].l0_attention.gate.log_alpha.fill_(-8.0)
    gated.eval()
    pruned = prune(gated)
    x = _tokens(4, seed=9)
    with torch.no_grad():
        assert torch.allclose(pruned(x), gated(x), atol=1e-5)
    assert isinstance(pruned.encoder.layers[0].self_attn, PrunedMultiheadAttention)
    assert "l0_" not in str(pruned) and not any(".l0_" in k for k in pruned.state_dict())
    exported = torch.export.export(pruned, (x,))
    assert torch.allclose(exported.module()(x), pruned(x), atol=1e-6)


# ------------------------------------------------------------------------------------------- sizes


@pytest.mark.parametrize("make", [_gpt, _encoder])
@pytest.mark.parametrize("seed", range(3))
def test_exact_counts_equal_the_pruned_model(make, seed):
    gated = make(seed)
    _random_gates(gated, seed + 20, p_closed=0.5)
    if seed == 1:
        with torch.no_grad():  # every unit of one block closed: prune() keeps one
            next(g for n, g in gates_of(gated) if "l0_units" in n).log_alpha.fill_(-8.0)
    gated.eval()
    size = network_size(gated)
    pruned = prune(gated)
    assert size.parameters("test") == count_parameters(pruned)
    x = gated._l0_example_inputs[0]
    assert size.flops("test") == pytest.approx(flops_per_token(pruned, x), rel=1e-12)
    assert size.fraction("parameters", "test") == pytest.approx(count_parameters(pruned) / count_parameters(gated))
    assert size.dense_flops == pytest.approx(flops_per_token(gated, x), rel=1e-12)


def test_dense_flops_per_token_of_the_original_encoder():
    """flops_per_token counts nn.MultiheadAttention's fused projections as its gated, explicit form does."""
    torch.manual_seed(0)
    original = Encoder().eval()
    gated = sparsify_transformer(original, example_inputs=_tokens())
    per_layer = 2 * (4 * D * D) + 4 * D + 2 * 2 * D * 32 + 32 + D  # q, k, v, out; linear1, linear2
    expected = 2 * per_layer + 2 * D * VOCAB + VOCAB
    assert flops_per_token(original, _tokens()) == expected
    assert network_size(gated).dense_flops == expected


def test_expectation_equals_enumeration():
    """E_q[count] over every 0/1 pattern of a small model's gates (product of Eq. 12 probabilities)."""
    torch.manual_seed(0)

    class Tiny(nn.Module):
        def __init__(self):
            super().__init__()
            self.tok = nn.Embedding(VOCAB, 4)
            self.block = GPTBlock.__new__(GPTBlock)
            nn.Module.__init__(self.block)
            self.block.ln1, self.block.ln2 = nn.LayerNorm(4), nn.LayerNorm(4)
            self.block.attn, self.block.mlp = CausalSelfAttention(4, 2), MLP(4, 3)

        def forward(self, idx):
            return self.block(self.tok(idx))

    gated = sparsify_transformer(Tiny(), ["block"], example_inputs=_tokens())
    _random_gates(gated, 3, p_closed=0.0)
    size = network_size(gated)
    gates = [g for _, g in gates_of(gated)]
    layers = size.gated
    q = torch.cat([g.prob_nonzero().detach().double() for g in gates])
    total = {"parameters": 0.0, "flops": 0.0}
    for bits in itertools.product([0.0, 1.0], repeat=q.numel()):
        z = torch.tensor(bits, dtype=torch.float64)
        p = float(torch.prod(torch.where(z > 0, q, 1 - q)))
        values, i = {}, 0
        for layer, g in zip(layers, gates, strict=True):
            values[id(layer)] = z[i : i + g.num_gates]
            i += g.num_gates
        for what in total:
            # without prune()'s "at least one head / unit" rule, which the expectation leaves out
            exact = size._count(values, exact=False, flops=what == "flops")
            total[what] += p * float(exact)
    assert float(size.parameters("expected").detach()) == pytest.approx(total["parameters"], rel=1e-5)
    assert float(size.flops("expected").detach()) == pytest.approx(total["flops"], rel=1e-5)
    size.fraction("parameters", "expected").backward()
    assert all(g.log_alpha.grad is not None and g.log_alpha.grad.abs().sum() > 0 for g in gates)


def test_expectation_matches_sampled_pruned_models():
    """Monte Carlo: the mean of count_parameters(prune(.)) over gates drawn from q, up to the keep-one rule."""
    gated = _gpt(3)
    _random_gates(gated, 4, p_closed=0.0)
    size = network_size(gated)
    gates = [g for _, g in gates_of(gated)]
    saved = [g.log_alpha.detach().clone() for g in gates]
    g = torch.Generator().manual_seed(0)
    counts = []
    for _ in range(200):
        with torch.no_grad():
            for gate, la in zip(gates, saved, strict=True):
                open_ = torch.rand(la.shape, generator=g) < torch.sigmoid(la - 2.0 / 3.0 * math.log(0.1 / 1.1))
                gate.log_alpha.copy_(torch.where(open_, 10.0, -10.0))
        counts.append(size.parameters("test"))
        with torch.no_grad():
            for gate, la in zip(gates, saved, strict=True):
                gate.log_alpha.copy_(la)
    mean = sum(counts) / len(counts)
    assert float(size.parameters("expected").detach()) == pytest.approx(mean, rel=0.03)


def test_per_layer_and_fraction_at():
    gated = _gpt(1)
    _random_gates(gated, 2)
    size = network_size(gated)
    per = size.fraction("parameters", "test", per_layer=True)
    assert list(per) == [n[: -len(".gate")] for n, _ in gates_of(gated)]
    assert all(0.0 <= v <= 1.0 for v in per.values())
    assert size.fraction("parameters", "expected", per_layer=True).shape == (8,)
    ones = {id(layer): torch.ones(g.num_gates, dtype=torch.float64) for layer, g in zip(size.gated, size.gates)}
    assert size.fraction_at(ones) == [1.0]
    zeros = {k: torch.zeros_like(v) for k, v in ones.items()}
    assert size.fraction_at(zeros)[0] == pytest.approx(size.const / size.dense_parameters)


# ---------------------------------------------------------------------------------------- training


def test_constrained_training_reaches_the_target_density():
    torch.manual_seed(0)
    gated = sparsify_transformer(TinyGPT(), example_inputs=_tokens(), init_drop_rate=0.1)
    x = torch.randint(0, VOCAB, (64, T), generator=torch.Generator().manual_seed(1))
    y = torch.roll(x, -1, dims=1)
    model = SparseModel(gated, lambda out, target: F.cross_entropy(out.flatten(0, 1), target.flatten()))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        train(model, x, y, objective=Constrained(target_density=0.5), epochs=40, batch_size=16, lr=0.05,
              progress=False, device="cpu")  # fmt: skip
    assert not [w for w in caught if "constrained" in str(w.message)], "the Lagrangian should arrive"
    gated.eval()
    pruned = prune(gated)
    fraction = count_parameters(pruned) / count_parameters(gated)
    assert 0.3 <= fraction <= 0.5 + 1e-9  # (on random tokens the Lagrangian may close whole MLP branches)
    assert network_size(gated).fraction("parameters", "test") == pytest.approx(fraction)
    with torch.no_grad():
        assert torch.allclose(pruned(x[:4]), gated(x[:4]), atol=1e-5)


def _final_cut_to_the_constant(gated):
    """The final cut at a target no head or unit can meet: only the parameters outside the branches."""
    size = network_size(gated)
    scores = [g.log_alpha.detach().double() for g in size.gates]
    target = size.const / size.dense_parameters + 1e-9
    masks = _fit_groups(size, size.gated, scores, "parameters", [target], False)
    names = [n for n, _ in gates_of(gated)]
    open_branches = [n for n, m in zip(names, masks, strict=True) if ("l0_attention" in n or "l0_mlp" in n) and m.any()]
    return size, masks, target, open_branches


def test_final_phase_may_close_a_whole_branch_but_not_every_one():
    """A target no head or unit can meet: the final phase closes branch gates, but keeps the best-scored attention
    branch and the best-scored MLP branch of the model open (a model without attention is not a missed target's
    side effect)."""
    gated = _gpt(0)
    with torch.no_grad():
        gated.blocks[1].l0_attention.gate.log_alpha.fill_(3.0)  # the best-scored attention branch
        gated.blocks[0].l0_mlp.gate.log_alpha.fill_(3.0)  # the best-scored MLP branch
    size, masks, target, open_branches = _final_cut_to_the_constant(gated)
    assert open_branches == ["blocks.0.l0_mlp.gate", "blocks.1.l0_attention.gate"]
    assert size.fraction_at({id(la): m.double() for la, m in zip(size.gated, masks, strict=True)})[0] > target
    pruned = prune(_with_masks(gated, size, masks))
    assert not isinstance(pruned.blocks[1].attn, ZeroBranch) and isinstance(pruned.blocks[0].attn, ZeroBranch)
    assert not isinstance(pruned.blocks[0].mlp, ZeroBranch) and isinstance(pruned.blocks[1].mlp, ZeroBranch)


def test_final_phase_closes_every_branch_when_allowed():
    gated = _gpt(0, may_remove_all=True)
    size, masks, target, open_branches = _final_cut_to_the_constant(gated)
    assert open_branches == []
    values = {id(layer): m.double() for layer, m in zip(size.gated, masks, strict=True)}
    assert size.fraction_at(values)[0] <= target
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # allowed: no warning
        pruned = prune(_with_masks(gated, size, masks))
    assert count_parameters(pruned) == size.const


def test_prune_warns_when_the_gates_close_every_attention_branch():
    gated = _gpt(0)
    with torch.no_grad():
        for block in gated.blocks:
            block.l0_attention.gate.log_alpha.fill_(-50.0)
    with pytest.warns(UserWarning, match="close the attention branch of every block .2.*may_remove_all=True"):
        pruned = prune(gated.eval())
    assert all(isinstance(block.attn, ZeroBranch) for block in pruned.blocks)


def _with_masks(gated, size, masks):
    with torch.no_grad():
        for gate, m in zip(size.gates, masks, strict=True):
            gate.log_alpha.copy_(torch.where(m, 50.0, -50.0))
    return gated


def test_constrained_objective_bounds_flops_per_token():
    gated = _gpt(0)
    model = SparseModel(gated, lambda out, target: F.cross_entropy(out.flatten(0, 1), target.flatten()))
    objective = Constrained(target_flops=0.5).build(model, 64)
    expected = objective.expected()
    assert expected.shape == (1,) and 0.0 < float(expected.detach()) < 1.0
    expected.sum().backward()
    assert gated.blocks[0].l0_units.gate.log_alpha.grad.abs().sum() > 0
    assert objective.test_time("flops") == network_size(gated).fraction("flops", "test")


class MHABlock(nn.Module):
    """A user block around nn.MultiheadAttention (returns a pair) and an MLP."""

    def __init__(self):
        super().__init__()
        self.tok = nn.Embedding(VOCAB, D)
        self.attn, self.mlp = nn.MultiheadAttention(D, HEADS, batch_first=True), MLP()

    def forward(self, idx):
        x = self.tok(idx)
        x = x + self.attn(x, x, x, need_weights=False)[0]
        return x + self.mlp(x)


@pytest.mark.parametrize("close_attention", [False, True])
def test_user_block_with_multihead_attention(close_attention):
    torch.manual_seed(0)
    gated = sparsify_transformer(MHABlock(), [""], example_inputs=_tokens())
    _random_gates(gated, 7)
    if close_attention:
        with torch.no_grad():
            gated.l0_attention.gate.log_alpha.fill_(-8.0)
    gated.eval()
    pruned = prune(gated)
    x = _tokens(4, seed=2)
    with torch.no_grad():
        assert torch.allclose(pruned(x), gated(x), atol=1e-5)
    assert count_parameters(pruned) == network_size(gated).parameters("test")
    exported = torch.export.export(pruned, (x,))
    assert torch.allclose(exported.module()(x), pruned(x), atol=1e-6)


# ------------------------------------------------------------------------------------------- decoder


class Decoder(nn.Module):
    """``nn.TransformerDecoder`` over token ids, attending to an embedded memory sequence."""

    def __init__(self, norm_first=False):
        super().__init__()
        self.tok, self.mem = nn.Embedding(VOCAB, D), nn.Embedding(VOCAB, D)
        layer = nn.TransformerDecoderLayer(D, HEADS, 32, dropout=0.1, batch_first=True, norm_first=norm_first)
        self.decoder = nn.TransformerDecoder(layer, 2)
        self.head = nn.Linear(D, VOCAB)

    def forward(self, idx, memory_idx):
        mask = nn.Transformer.generate_square_subsequent_mask(idx.shape[1])
        return self.head(self.decoder(self.tok(idx), self.mem(memory_idx), tgt_mask=mask, tgt_is_causal=True))


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("seed", range(3))
def test_decoder_layers_are_gated_pruned_and_counted(norm_first, seed):
    torch.manual_seed(seed)
    original = Decoder(norm_first).eval()
    x = (_tokens(2, seed=1), _tokens(2, seed=2))
    gated = sparsify_transformer(original, example_inputs=x)
    assert [n for n, _ in gates_of(gated)][:6] == [
        f"decoder.layers.0.{k}.gate"
        for k in ("l0_heads", "l0_units", "l0_attention", "l0_mlp", "l0_cross_heads", "l0_cross_attention")
    ]
    with torch.no_grad():  # open gates: the original function
        for _, gate in gates_of(gated):
            gate.log_alpha.fill_(20.0)
        assert torch.allclose(gated.eval()(*x), original(*x), atol=1e-6)
    _random_gates(gated, seed + 30)
    with torch.no_grad():
        if seed == 0:
            gated.decoder.layers[0].l0_attention.gate.log_alpha.fill_(-8.0)
            gated.decoder.layers[1].l0_mlp.gate.log_alpha.fill_(-8.0)
        if seed == 1:  # a closed cross-attention branch; two of four cross-attention heads in the other layer
            gated.decoder.layers[0].l0_cross_attention.gate.log_alpha.fill_(-8.0)
            gated.decoder.layers[1].l0_cross_attention.gate.log_alpha.fill_(5.0)
            gated.decoder.layers[1].l0_cross_heads.gate.log_alpha.copy_(torch.tensor([5.0, -8.0, -8.0, 5.0]))
    gated.eval()
    pruned = prune(gated)
    if seed == 1:
        assert isinstance(pruned.decoder.layers[0].multihead_attn, ZeroBranch)
        cross = pruned.decoder.layers[1].multihead_attn
        assert isinstance(cross, PrunedMultiheadAttention) and cross.num_heads == 2
    probe = (_tokens(3, seed=seed + 5), _tokens(3, seed=seed + 6))
    with torch.no_grad():
        assert torch.allclose(pruned(*probe), gated(*probe), atol=1e-5)
    size = network_size(gated)
    assert size.parameters("test") == count_parameters(pruned) < count_parameters(original)
    assert size.flops("test") == pytest.approx(flops_per_token(pruned, probe), rel=1e-12)
    assert size.dense_flops == pytest.approx(flops_per_token(original, probe), rel=1e-12)
    exported = torch.export.export(pruned, probe)
    assert torch.allclose(exported.module()(*probe), pruned(*probe), atol=1e-6)


# ------------------------------------------------------------------------------ fused qkv, projection branches


class FusedAttention(nn.Module):
    """q, k and v from one ``nn.Linear`` (``qkv``), the head count in ``num_heads``, the width read from it."""

    def __init__(self, d=D, heads=HEADS, out=True):
        super().__init__()
        self.num_heads, self.head_dim = heads, d // heads
        self.qkv = nn.Linear(d, 3 * d)
        self.out = nn.Linear(d, d) if out else nn.Identity()

    def forward(self, x):
        b, t, _ = x.shape
        q, k, v = self.qkv(x).split(self.num_heads * self.head_dim, dim=-1)
        q, k, v = (z.view(b, t, self.num_heads, self.head_dim).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.out(y.transpose(1, 2).reshape(b, t, -1))


class PostNormBlock(nn.Module):
    """Adds and normalises inside the modules holding the projections (as BERT does); no MLP module."""

    def __init__(self):
        super().__init__()
        self.heads = FusedAttention(out=False)
        self.proj, self.norm1 = nn.Linear(D, D), nn.LayerNorm(D)
        self.up, self.down, self.norm2 = nn.Linear(D, 24), nn.Linear(24, D), nn.LayerNorm(D)

    def forward(self, x):
        x = self.norm1(x + self.proj(self.heads(x)))
        return self.norm2(x + self.down(F.relu(self.up(x))))


class PostNormNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok = nn.Embedding(VOCAB, D)
        self.blocks = nn.ModuleList(PostNormBlock() for _ in range(2))
        self.head = nn.Linear(D, VOCAB)

    def forward(self, idx):
        x = self.tok(idx)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def _post_norm_blocks():
    # the attention is the block itself ("heads" computes the heads, "proj" is the output projection)
    return [
        Block(f"blocks.{i}", attention="", qkv="heads.qkv", out="proj", heads_attr="heads.num_heads", mlp="",
              up="up", down="down", branch_output="projection")
        for i in range(2)
    ]  # fmt: skip


def test_fused_linear_qkv_and_projection_branches_prune_exactly():
    torch.manual_seed(0)
    net = PostNormNet().eval()
    gated = sparsify_transformer(net, _post_norm_blocks(), example_inputs=_tokens())
    assert gated._l0_transformer[0].fused and gated._l0_transformer[0].mlp_at_projection
    _random_gates(gated, 3)
    with torch.no_grad():
        gated.blocks[0].l0_attention.gate.log_alpha.fill_(-8.0)
        gated.blocks[1].l0_mlp.gate.log_alpha.fill_(-8.0)
        gated.blocks[1].l0_attention.gate.log_alpha.fill_(5.0)
        gated.blocks[1].l0_heads.gate.log_alpha.copy_(torch.tensor([5.0, -8.0, 5.0, -8.0]))
    gated.eval()
    pruned = prune(gated)
    x = _tokens(4, seed=11)
    with torch.no_grad():
        assert torch.allclose(pruned(x), gated(x), atol=1e-5)
    assert pruned.blocks[1].heads.num_heads == 2 and pruned.blocks[1].heads.qkv.out_features == 3 * 2 * D // HEADS
    assert network_size(gated).parameters("test") == count_parameters(pruned)
    assert flops_per_token(pruned, x) == pytest.approx(network_size(gated).flops("test"), rel=1e-12)


def test_branch_output_is_checked():
    with pytest.raises(ValueError, match="branch_output must be"):
        sparsify_transformer(TinyGPT(), [Block("blocks.0", branch_output="residual")], example_inputs=_tokens())
    with pytest.raises(ValueError, match="needs q, k and v in a module of their own"):  # q, k, v, proj share attn
        sparsify_transformer(TinyGPT(), [Block("blocks.0", branch_output="projection")], example_inputs=_tokens())


# ------------------------------------------------------------------------------------------- whole blocks


def _set_fixed(gates, bits):
    """Gates fixed open (1) or closed (0), one entry of ``bits`` per gate (Eq. 13 gate exactly 1 or 0)."""
    with torch.no_grad():
        for gate, bit in zip(gates, bits, strict=True):
            gate.log_alpha.fill_(50.0 if bit else -50.0)


def test_block_gate_expectation_equals_enumeration_of_pruned_models():
    """Branch and block gates of a 2-block GPT (the second block's gate fixed open): E_q[count] (the norms of a
    block count while its block gate and one of its branches are open) equals the sum over all 32 open/closed
    patterns of their probability times count_parameters(prune(.)) of that pattern, an independent count; the exact
    count equals it for each pattern."""
    gated = _gpt(0, heads=False, units=False, depth=True)
    gates = [g for _, g in gates_of(gated)]
    assert [n.rsplit(".", 2)[-2] for n, _ in gates_of(gated)][:3] == ["l0_attention", "l0_mlp", "l0_block"]
    _random_gates(gated, 1, p_closed=0.0)
    with torch.no_grad():
        gates[5].log_alpha.fill_(50.0)  # q(z != 0) = 1 within float64
    size = network_size(gated)
    q = [float(g.prob_nonzero().detach().double()) for g in gates]
    assert q[5] == 1.0
    expected = float(size.parameters("expected").detach())
    total = 0.0
    for bits in itertools.product([0, 1], repeat=5):
        bits = (*bits, 1)
        _set_fixed(gates, bits)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # patterns that close every attention branch
            pruned = prune(gated.eval())
        count = sum(p.numel() for p in pruned.parameters())
        assert size.parameters("test") == count
        alive = [bool(bits[3 * i + 2] and (bits[3 * i] or bits[3 * i + 1])) for i in range(2)]
        assert len(pruned.blocks) == sum(alive)
        total += math.prod(qi if b else 1 - qi for qi, b in zip(q, bits, strict=True)) * count
    assert expected == pytest.approx(total, rel=1e-6)


def test_a_closed_block_is_removed_and_the_pruned_model_equals_the_gated_one():
    """A block whose block gate closes is removed with its norms; a block whose two branch gates close (no block
    gate) too; a fractional open block gate is folded into both branches."""
    gated = _gpt(2, depth=True)
    _random_gates(gated, 3, p_closed=0.0)
    with torch.no_grad():
        gated.blocks[0].l0_block.gate.log_alpha.fill_(-8.0)
        gated.blocks[1].l0_block.gate.log_alpha.fill_(0.3)  # Eq. 13 gate in (0, 1)
    z = float(gated.blocks[1].l0_block.gate.deterministic())
    assert 0 < z < 1
    pruned = prune(gated.eval())
    assert len(pruned.blocks) == 1 and not any(isinstance(m, ZeroBranch) for m in pruned.modules())
    x = _tokens(4, seed=1)
    with torch.no_grad():
        assert torch.allclose(pruned(x), gated(x), atol=1e-5)
    assert (
        count_parameters(pruned)
        == network_size(gated).parameters("test")
        == count_parameters(TinyGPT(1)) - (count_parameters(GPTBlock()) - count_parameters(pruned.blocks[0]))
    )
    gated = _gpt(2)
    with torch.no_grad():
        gated.blocks[1].l0_attention.gate.log_alpha.fill_(-8.0)
        gated.blocks[1].l0_mlp.gate.log_alpha.fill_(-8.0)
    pruned = prune(gated.eval())
    assert len(pruned.blocks) == 1 and count_parameters(pruned) == network_size(gated).parameters("test")
    with torch.no_grad():
        assert torch.allclose(pruned(x), gated(x), atol=1e-5)


def test_block_gate_is_drawn_once_per_call_of_its_block():
    """In training the block gate multiplies both branches by the same draw."""
    gated = _gpt(0, heads=False, units=False, layers=False, depth=True).train()
    seen = []
    holder = gated.blocks[0].l0_block
    for name in ("attn", "mlp"):
        gated.blocks[0].get_submodule(name).register_forward_hook(lambda m, a, out: seen.append(holder._z.clone()))
    gated(_tokens())
    assert len(seen) == 2 and torch.equal(seen[0], seen[1]) and holder._z is None


@pytest.mark.parametrize("norm_first", [False, True])
def test_depth_needs_blocks_that_are_the_identity_when_closed(norm_first):
    """A post-norm encoder layer normalises even with both branches closed: depth=True is refused naming it, and
    its closed branches leave the layer in place; a pre-norm layer is removed."""
    torch.manual_seed(0)
    if not norm_first:
        with pytest.raises(ValueError, match="depth=True: block 'encoder.layers.0' cannot be removed"):
            sparsify_transformer(Encoder(norm_first=False), example_inputs=_tokens(), depth=True)
        gated = sparsify_transformer(Encoder(norm_first=False), example_inputs=_tokens())
    else:
        gated = sparsify_transformer(Encoder(norm_first=True), example_inputs=_tokens(), depth=True)
    with torch.no_grad():
        gated.encoder.layers[0].l0_attention.gate.log_alpha.fill_(-8.0)
        gated.encoder.layers[0].l0_mlp.gate.log_alpha.fill_(-8.0)
    pruned = prune(gated.eval())
    assert len(pruned.encoder.layers) == (1 if norm_first else 2)
    assert count_parameters(pruned) == network_size(gated).parameters("test")
    x = _tokens(3, seed=4)
    with torch.no_grad():
        assert torch.allclose(pruned(x), gated(x), atol=1e-5)


def test_target_architecture_arguments_are_checked():
    from l0bayes.pruning import TargetArchitecture, fix_architecture

    assert TargetArchitecture.of({"intermediate_size": 8}).as_dict() == {"intermediate_size": 8}
    cases = [
        ({"hidden_size": 8}, ValueError, "target_architecture: hidden_size cannot be pruned"),
        ({"heads": 2}, ValueError, r"unknown entries \['heads'\]"),
        ({}, ValueError, "target_architecture is empty"),
        ({"intermediate_size": 2.0}, TypeError, "target_architecture: intermediate_size must be a positive int"),
        ({"num_hidden_layers": 0}, ValueError, "target_architecture: num_hidden_layers must be a positive int"),
        ([("intermediate_size", 8)], TypeError, "target_architecture must be a dict"),
    ]
    for value, error, match in cases:
        with pytest.raises(error, match=match):
            TargetArchitecture.of(value)
    with pytest.raises(ValueError, match="num_hidden_layers=1: the blocks have no block gates.*depth=True"):
        fix_architecture(_gpt(0), num_hidden_layers=1)
    with pytest.raises(ValueError, match="num_hidden_layers=3: the model has 2 gated blocks"):
        fix_architecture(_gpt(0, depth=True), num_hidden_layers=3)
    with pytest.raises(ValueError, match="intermediate_size: the blocks have no l0_units gates"):
        fix_architecture(_gpt(0, units=False), intermediate_size=3)
    model = SparseModel(_gpt(0), lambda out, target: F.cross_entropy(out.flatten(0, 1), target.flatten()))
    with pytest.raises(ValueError, match="target_architecture: intermediate_size=100: block blocks.0 has 64"):
        Constrained(target_architecture={"intermediate_size": 100}).build(model, 8)
    with pytest.raises(ValueError, match="exactly one of target_density.*target_architecture"):
        Constrained(target_density=0.5, target_architecture={"intermediate_size": 8})
    with pytest.raises(ValueError, match="per_layer=True, but a target_architecture already constrains every block"):
        Constrained(per_layer=True, target_architecture={"intermediate_size": 8})


def test_fix_architecture_keeps_the_top_ranked_blocks():
    from l0bayes.pruning import fix_architecture

    gated = _gpt(0, depth=True)
    with torch.no_grad():
        gated.blocks[0].l0_block.gate.log_alpha.fill_(-1.0)
        gated.blocks[1].l0_block.gate.log_alpha.fill_(1.0)
    fix_architecture(gated, num_hidden_layers=1, intermediate_size=5)
    pruned = prune(gated.eval())
    assert len(pruned.blocks) == 1 and pruned.blocks[0].mlp.fc1.out_features == 5
    before = _gpt(0, depth=True)
    with torch.no_grad():
        assert torch.equal(pruned.blocks[0].ln1.weight, before.blocks[1].ln1.weight)  # block 1 kept
