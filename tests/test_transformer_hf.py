"""Hugging Face models (GPT-2: fused ``Conv1D`` projections; BERT: post-norm layers), built from configs with random
weights (nothing downloaded): gated by ``sparsify_transformer``'s defaults, pruned, counted and trained."""

import warnings

import pytest
import torch
import torch.nn.functional as F
from test_transformer_pruning import _random_gates

from l0bayes.inference import Callback, Constrained, parameter_groups, train
from l0bayes.models import SparseModel
from l0bayes.nn import gates_of
from l0bayes.pruning import count_parameters, flops_per_token, network_size, prune, sparsify_transformer
from l0bayes.pruning.transformer import ZeroBranch

transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()

VOCAB, T = 40, 8


def _ids(n=2, seed=0):
    return torch.randint(0, VOCAB, (n, T), generator=torch.Generator().manual_seed(seed))


def _gpt2(seed=0):
    torch.manual_seed(seed)
    config = transformers.GPT2Config(
        vocab_size=VOCAB, n_positions=T, n_embd=32, n_layer=2, n_head=4, n_inner=48, use_cache=False,
        bos_token_id=0, eos_token_id=0,
    )  # fmt: skip
    return transformers.GPT2LMHeadModel(config).eval()


def _bert(seed=0):
    torch.manual_seed(seed)
    config = transformers.BertConfig(
        vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=48,
        max_position_embeddings=T, pad_token_id=0,
    )  # fmt: skip
    return transformers.BertModel(config, add_pooling_layer=False).eval()


def _llama_config(cls=None, **kwargs):
    cls = cls or transformers.LlamaConfig
    base = dict(hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                vocab_size=VOCAB, max_position_embeddings=T, use_cache=False)  # fmt: skip
    return cls(**{**base, **kwargs})


#: Every family of the guide's table: a tiny model with random weights (nothing downloaded).
FAMILIES = {
    "gpt2": lambda: transformers.GPT2LMHeadModel(
        transformers.GPT2Config(
            vocab_size=VOCAB, n_positions=T, n_embd=32, n_layer=2, n_head=4, n_inner=48, use_cache=False
        )
    ),  # fmt: skip
    "bert": lambda: transformers.BertModel(
        transformers.BertConfig(
            vocab_size=VOCAB,
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=4,
            intermediate_size=48,
            max_position_embeddings=T,
        ),
        add_pooling_layer=False,
    ),  # fmt: skip
    "llama": lambda: transformers.LlamaForCausalLM(_llama_config()),
    "qwen2": lambda: transformers.Qwen2ForCausalLM(_llama_config(transformers.Qwen2Config)),
    "mistral": lambda: transformers.MistralForCausalLM(
        _llama_config(transformers.MistralConfig, num_key_value_heads=1)
    ),  # fmt: skip
    "opt": lambda: transformers.OPTForCausalLM(
        transformers.OPTConfig(
            vocab_size=VOCAB,
            hidden_size=32,
            ffn_dim=48,
            num_hidden_layers=2,
            num_attention_heads=4,
            word_embed_proj_dim=32,
            max_position_embeddings=T,
        )
    ),  # fmt: skip
    "gpt_neox": lambda: transformers.GPTNeoXForCausalLM(
        transformers.GPTNeoXConfig(
            vocab_size=VOCAB,
            hidden_size=32,
            intermediate_size=48,
            num_hidden_layers=2,
            num_attention_heads=4,
            max_position_embeddings=T,
            use_cache=False,
        )
    ),  # fmt: skip
}


def _family(name, seed=0):
    torch.manual_seed(seed)
    return FAMILIES[name]().eval()


def _out(model, x):
    out = model(x)
    return out.logits if hasattr(out, "logits") else out.last_hidden_state


def test_default_blocks_of_gpt2_and_bert():
    gpt = sparsify_transformer(_gpt2(), example_inputs=_ids())
    names = [n for n, _ in gates_of(gpt)]
    assert names == [
        f"transformer.h.{i}.{k}.gate" for i in range(2) for k in ("l0_heads", "l0_units", "l0_attention", "l0_mlp")
    ]
    r = gpt._l0_transformer[0]
    assert r.fused and r.q == "transformer.h.0.attn.c_attn" and r.out == "transformer.h.0.attn.c_proj"
    assert (r.num_heads, r.head_dim, r.up, r.down) == (4, 8, ["transformer.h.0.mlp.c_fc"], "transformer.h.0.mlp.c_proj")
    bert = sparsify_transformer(_bert(), example_inputs=_ids())
    r = bert._l0_transformer[1]
    assert r.name == "encoder.layer.1" and r.branch_output == "projection"
    layer = "encoder.layer.1"
    assert (r.q, r.out, r.heads_owner) == (
        f"{layer}.attention.self.query", f"{layer}.attention.output.dense", f"{layer}.attention.self"
    )  # fmt: skip
    assert (r.up, r.down) == (["encoder.layer.1.intermediate.dense"], "encoder.layer.1.output.dense")


@pytest.mark.parametrize("make", [_gpt2, _bert])
def test_open_gates_equal_the_original(make):
    original = make()
    gated = sparsify_transformer(original, example_inputs=_ids())
    with torch.no_grad():
        for _, gate in gates_of(gated):
            gate.log_alpha.fill_(20.0)  # Eq. 13 gate exactly 1
        x = _ids(3, seed=4)
        assert torch.allclose(_out(gated.eval(), x), _out(original, x), atol=1e-6)


@pytest.mark.parametrize("make", [_gpt2, _bert])
@pytest.mark.parametrize("seed", range(3))
def test_pruned_equals_gated_and_counts_are_exact(make, seed):
    gated = sparsify_transformer(make(seed), example_inputs=_ids())
    _random_gates(gated, seed)
    blocks = [gated.get_submodule(r.name) for r in gated._l0_transformer]
    with torch.no_grad():
        if seed == 0:  # a closed attention branch and a closed MLP branch
            blocks[0].l0_attention.gate.log_alpha.fill_(-8.0)
            blocks[1].l0_mlp.gate.log_alpha.fill_(-8.0)
        if seed == 1:  # every head of a block closed: prune keeps one
            blocks[1].l0_heads.gate.log_alpha.fill_(-8.0)
            blocks[1].l0_attention.gate.log_alpha.fill_(3.0)
    gated.eval()
    pruned = prune(gated)
    x = _ids(3, seed=seed + 7)
    with torch.no_grad():
        assert torch.allclose(_out(pruned, x), _out(gated, x), atol=1e-5)
    size = network_size(gated)
    assert size.parameters("test") == count_parameters(pruned) < count_parameters(gated)
    assert size.flops("test") == pytest.approx(flops_per_token(pruned, x), rel=1e-12)
    assert size.dense_flops == pytest.approx(flops_per_token(gated, x), rel=1e-12)
    if seed == 0:
        assert sum(isinstance(m, ZeroBranch) for m in pruned.modules()) >= 2
    if make is _gpt2 and seed == 1:
        attn = pruned.transformer.h[1].attn
        assert attn.num_heads == 1 and attn.split_size == 8 and attn.c_attn.weight.shape == (32, 24)
    if make is _bert and seed == 1:
        self_attn = pruned.encoder.layer[1].attention.self
        assert self_attn.num_attention_heads == 1 and self_attn.query.out_features == 8


def test_gpt2_parameter_counts_by_hand():
    """One kept head and 5 kept units in block 0; the count from the Conv1D shapes, written out."""
    gated = sparsify_transformer(_gpt2(), example_inputs=_ids(), layers=False)
    block = gated.transformer.h[0]
    with torch.no_grad():
        for _, gate in gates_of(gated):
            gate.log_alpha.fill_(20.0)
        block.l0_heads.gate.log_alpha.copy_(torch.tensor([-8.0, 20.0, -8.0, -8.0]))
        block.l0_units.gate.log_alpha.copy_(torch.cat([torch.full((5,), 20.0), torch.full((43,), -8.0)]))
    removed_per_head = 3 * (32 * 8 + 8) + 8 * 32  # c_attn columns and biases of q, k, v; rows of c_proj
    removed_per_unit = 32 + 1 + 32  # c_fc column and bias, c_proj row
    expected = count_parameters(gated) - 3 * removed_per_head - 43 * removed_per_unit
    assert count_parameters(prune(gated.eval())) == expected == network_size(gated).parameters("test")


@pytest.mark.parametrize("make", [_gpt2, _bert])
def test_pruned_model_exports(make):
    gated = sparsify_transformer(make(), example_inputs=_ids())
    _random_gates(gated, 3)
    pruned = prune(gated.eval())
    x = _ids(2, seed=5)
    exported = torch.export.export(pruned, (x,))
    with torch.no_grad():
        assert torch.allclose(_out(exported.module(), x), _out(pruned, x), atol=1e-5)


def test_constrained_training_of_gpt2_reaches_its_target():
    gated = sparsify_transformer(_gpt2().train(), example_inputs=_ids(), init_drop_rate=0.1)
    x = torch.randint(0, VOCAB, (64, T), generator=torch.Generator().manual_seed(1))
    y = torch.roll(x, -1, dims=1)
    model = SparseModel(gated, lambda out, target: F.cross_entropy(out.logits.flatten(0, 1), target.flatten()))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        train(model, x, y, objective=Constrained(target_density=0.5), epochs=30, batch_size=16, lr=0.05,
              progress=False, device="cpu")  # fmt: skip
    gated.eval()
    pruned = prune(gated)
    fraction = count_parameters(pruned) / count_parameters(gated)
    assert 0.48 <= fraction <= 0.5 + 1e-9
    assert network_size(gated).fraction("parameters", "test") == pytest.approx(fraction)
    with torch.no_grad():
        assert torch.allclose(pruned(x[:4]).logits, gated(x[:4]).logits, atol=1e-5)


# ------------------------------------------------------------------------------------- the families


@pytest.mark.parametrize("family", sorted(FAMILIES))
@pytest.mark.parametrize("seed", range(2))
def test_every_family_prunes_to_the_gated_model(family, seed):
    """Gated with no names; random gates, and (seed 0) the first block's attention branch closed (a ZeroBranch
    called as the layer calls its attention: by keyword in Llama and OPT); pruned equals gated within 1e-5 of the
    logits' scale, and the exact count is the pruned model's."""
    gated = sparsify_transformer(_family(family, seed), example_inputs=_ids())
    _random_gates(gated, seed)
    if seed == 0:  # the attention closed, the MLP open: the block stays, with a ZeroBranch for its attention
        with torch.no_grad():
            gated.get_submodule(gated._l0_transformer[0].name).l0_attention.gate.log_alpha.fill_(-8.0)
            gated.get_submodule(gated._l0_transformer[0].name).l0_mlp.gate.log_alpha.fill_(8.0)
    gated.eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a non-uniform result keeps its config, and says so
        pruned = prune(gated)
    x = _ids(3, seed=seed + 7)
    with torch.no_grad():
        a, b = _out(gated, x), _out(pruned, x)
    assert float((a - b).abs().max()) <= 1e-5 * float(a.abs().max())
    assert network_size(gated).parameters("test") == count_parameters(pruned) < count_parameters(gated)
    if seed == 0:
        assert sum(isinstance(m, ZeroBranch) for m in pruned.modules()) >= 1


def test_zero_branch_takes_any_call_of_the_module_it_replaces():
    x = torch.randn(2, 5, 8)
    out, weights = ZeroBranch(pair=True)(hidden_states=x, attention_mask=None, position_embeddings=(x, x))
    assert weights is None and torch.equal(out, torch.zeros_like(x))
    assert ZeroBranch(features=3)(x, None).shape == (2, 5, 3)
    with pytest.raises(TypeError, match="no tensor input"):
        ZeroBranch()(attention_mask=None)


def test_grouped_query_attention_is_gated_by_key_value_group():
    """Llama with 4 query heads and 2 key-value heads: one head gate per key-value group (2 query heads and their
    key-value head); closing group 0 keeps query heads 2, 3 and key-value head 1, a valid grouped-query layout."""
    gated = sparsify_transformer(_family("llama"), example_inputs=_ids())
    layer = gated.model.layers[0]
    assert layer.l0_heads.gate.num_gates == 2 and layer.l0_units.gate.num_gates == 48
    assert gated._l0_transformer[0].up == ["model.layers.0.mlp.gate_proj", "model.layers.0.mlp.up_proj"]
    with torch.no_grad():
        for _, gate in gates_of(gated):
            gate.log_alpha.fill_(20.0)
        layer.l0_heads.gate.log_alpha.copy_(torch.tensor([-20.0, 20.0]))
    original = _family("llama")
    pruned = prune(gated.eval())
    attn = pruned.model.layers[0].self_attn
    assert (attn.q_proj.out_features, attn.k_proj.out_features, attn.o_proj.in_features) == (16, 8, 16)
    assert attn.num_key_value_groups == 2
    with torch.no_grad():
        assert torch.equal(attn.q_proj.weight, original.model.layers[0].self_attn.q_proj.weight[16:])
        assert torch.equal(attn.k_proj.weight, original.model.layers[0].self_attn.k_proj.weight[8:])
        assert torch.equal(attn.o_proj.weight, original.model.layers[0].self_attn.o_proj.weight[:, 16:])


def test_t5_is_refused_with_what_to_do():
    config = transformers.T5Config(vocab_size=VOCAB, d_model=32, d_kv=8, d_ff=48, num_layers=1, num_heads=4)
    with pytest.raises(ValueError, match="T5-style blocks are not supported.*sparsify"):
        sparsify_transformer(transformers.T5EncoderModel(config), example_inputs=_ids())


def test_llama_final_cut_keeps_an_attention_branch():
    """A target below what the branches hold: the final cut keeps one attention and one MLP branch of the Llama
    (the constant part alone would be an embedding and a head), unless may_remove_all=True."""
    from l0bayes.inference.objectives.final_phase import fit_groups as _fit_groups

    for allowed in (False, True):
        gated = sparsify_transformer(_family("llama"), example_inputs=_ids(), may_remove_all=allowed)
        size = network_size(gated)
        scores = [g.log_alpha.detach().double() for g in size.gates]
        masks = _fit_groups(size, size.gated, scores, "parameters", [size.const / size.dense_parameters], False)
        names = [n for n, _ in gates_of(gated)]
        kept = [n.split(".")[-2] for n, m in zip(names, masks, strict=True) if m.any() and "l0_" in n]
        kept = sorted(k for k in kept if k in ("l0_attention", "l0_mlp"))
        assert kept == ([] if allowed else ["l0_attention", "l0_mlp"])


# ------------------------------------------------------------------------ an HF model after pruning

_LOAD = """
import sys, torch, transformers
transformers.logging.set_verbosity_error()
assert not any(m.startswith("l0bayes") for m in sys.modules)
out = {}
for folder in sys.argv[2:]:
    model = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
    model.generation_config.eos_token_id = None
    ids = torch.load(sys.argv[1] + "/ids.pt", weights_only=True)
    with torch.no_grad():
        out[folder + "/logits"] = model(ids).logits
        out[folder + "/greedy"] = model.generate(ids[:1, :4], max_new_tokens=4, do_sample=False, use_cache=True,
                                                 pad_token_id=0)
    assert not any(m.startswith("l0bayes") for m in sys.modules)
torch.save(out, sys.argv[1] + "/out.pt")
"""


def _greedy(model, ids, steps):
    """Greedy tokens by full forward passes (no KV cache): the reference for generate()."""
    with torch.no_grad():
        for _ in range(steps):
            ids = torch.cat([ids, model(ids).logits[:, -1:].argmax(-1)], dim=1)
    return ids


#: Query heads kept per block in the round trip: Mistral's tiny config has one key-value head (4 query heads per
#: group); OPT's and GPT-NeoX's configs derive the head width from hidden_size / heads, so they keep all heads.
ROUND_TRIP_HEADS = {"llama": 2, "qwen2": 2, "mistral": 4, "gpt_neox": 4, "opt": 4}


@pytest.mark.parametrize("families", [("llama",), pytest.param(("qwen2", "mistral", "gpt_neox", "opt"))])
def test_uniform_pruned_model_round_trips_in_process(tmp_path, families):
    """fix_architecture, prune: a model of the same class whose config has the kept sizes, rebuilt by
    from_pretrained with the same logits; generate() with the KV cache gives the gated model's greedy tokens."""
    from l0bayes.pruning import fix_architecture

    ids = _ids(2, seed=3)
    for family in families:
        gated = sparsify_transformer(_family(family), example_inputs=_ids())
        _random_gates(gated, 5)
        fix_architecture(gated, num_attention_heads=ROUND_TRIP_HEADS[family], intermediate_size=20)
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # a uniform result: no warning
            pruned = prune(gated.eval())
        pruned.save_pretrained(tmp_path / family)
        loaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / family).eval()
        assert type(loaded) is type(pruned) and loaded.config.num_attention_heads == ROUND_TRIP_HEADS[family]
        with torch.no_grad():
            logits = gated(ids).logits
            assert float((loaded(ids).logits - logits).abs().max()) <= 1e-5 * float(logits.abs().max())
            loaded.generation_config.eos_token_id = None  # four tokens whatever they are
            tokens = loaded.generate(ids[:1, :4], max_new_tokens=4, do_sample=False, use_cache=True, pad_token_id=0)
        assert torch.equal(tokens, _greedy(gated, ids[:1, :4], 4))


@pytest.mark.slow
def test_uniform_pruned_model_round_trips_through_from_pretrained(tmp_path, families=tuple(ROUND_TRIP_HEADS)):
    """As above, loaded in a process that never imports l0bayes (slow: the import of transformers alone)."""
    import subprocess
    import sys

    from l0bayes.pruning import fix_architecture

    ids = _ids(2, seed=3)
    torch.save(ids, tmp_path / "ids.pt")
    expected, folders = {}, []
    for family in families:
        gated = sparsify_transformer(_family(family), example_inputs=_ids())
        _random_gates(gated, 5)
        heads = ROUND_TRIP_HEADS[family]
        fix_architecture(gated, num_attention_heads=heads, intermediate_size=20)
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # a uniform result: no warning
            pruned = prune(gated.eval())
        assert type(pruned) is type(_family(family))
        assert pruned.config.num_attention_heads == heads and count_parameters(pruned) < count_parameters(gated)
        entries = pruned.config.to_dict()
        assert entries.get("intermediate_size", entries.get("ffn_dim")) == 20
        folder = str(tmp_path / family)
        pruned.save_pretrained(folder)
        folders.append(folder)
        with torch.no_grad():
            expected[folder] = (gated(ids).logits, _greedy(gated, ids[:1, :4], 4))
    run = subprocess.run([sys.executable, "-c", _LOAD, str(tmp_path), *folders], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-2000:]
    out = torch.load(tmp_path / "out.pt", weights_only=True)
    for folder, (logits, greedy) in expected.items():
        assert float((out[folder + "/logits"] - logits).abs().max()) <= 1e-5 * float(logits.abs().max())
        assert torch.equal(out[folder + "/greedy"], greedy)


def test_a_config_that_cannot_describe_the_pruned_model_is_kept_with_a_warning():
    """GPT-2's config derives the head width from n_embd / n_head: fewer heads of 8 features are not a GPT-2
    config, so the config is kept and prune says why; without pruned heads the config is updated."""
    from l0bayes.pruning import fix_architecture

    gated = fix_architecture(sparsify_transformer(_family("gpt2"), example_inputs=_ids()), 2, intermediate_size=20)
    with pytest.warns(UserWarning, match="keeps its original config.*attn"):
        pruned = prune(gated.eval())
    assert pruned.config.n_head == 4 and pruned.config.n_inner == 48
    gated = fix_architecture(sparsify_transformer(_family("gpt2"), example_inputs=_ids()), 4, intermediate_size=20)
    pruned = prune(gated.eval())
    assert pruned.config.n_head == 4 and pruned.config.n_inner == 20
    with pytest.raises(ValueError, match="num_attention_heads=3: block model.layers.0 has 4 query heads in groups"):
        fix_architecture(sparsify_transformer(_family("llama"), example_inputs=_ids()), num_attention_heads=3)


# ------------------------------------------------------------------------ whole blocks, target architectures


def _three_layer(family, seed=0):
    torch.manual_seed(seed)
    cls = {"llama": transformers.LlamaConfig, "qwen2": transformers.Qwen2Config}[family]
    model = {"llama": transformers.LlamaForCausalLM, "qwen2": transformers.Qwen2ForCausalLM}[family]
    return model(_llama_config(cls, num_hidden_layers=3, max_position_embeddings=16)).eval()


def _pruned_with_block_removed(family, removed=1):
    """A 3-block model with block gates, random open gates and block ``removed`` closed, fixed to 1 key-value head
    and 20 units per block."""
    from l0bayes.pruning import fix_architecture

    gated = sparsify_transformer(_three_layer(family), example_inputs=_ids(), depth=True)
    _random_gates(gated, 2, p_closed=0.0)
    fix_architecture(gated, num_key_value_heads=1, intermediate_size=20)
    with torch.no_grad():
        gated.model.layers[removed].l0_block.gate.log_alpha.fill_(-50.0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a uniform result: no warning
        return gated, prune(gated.eval())


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_a_removed_block_leaves_a_model_of_the_same_class(tmp_path, family):
    """One of three blocks removed: pruned equals gated; the exact count is the pruned model's sum of numel; the
    config says 2 layers (Qwen2's layer_types too) and the attentions' layer_idx are 0, 1, so that from_pretrained
    rebuilds it with the same logits and generate() with the KV cache gives the gated model's greedy tokens."""
    gated, pruned = _pruned_with_block_removed(family)
    assert type(pruned) is type(_three_layer(family)) and len(pruned.model.layers) == 2
    assert pruned.config.num_hidden_layers == 2 and pruned.config.num_key_value_heads == 1
    if family == "qwen2":
        assert pruned.config.layer_types == ["full_attention"] * 2
    assert [layer.self_attn.layer_idx for layer in pruned.model.layers] == [0, 1]
    assert network_size(gated).parameters("test") == sum(p.numel() for p in pruned.parameters())
    ids = _ids(2, seed=3)
    with torch.no_grad():
        logits = gated(ids).logits
        assert float((pruned(ids).logits - logits).abs().max()) <= 1e-5 * float(logits.abs().max())
    pruned.save_pretrained(tmp_path)
    loaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    loaded.generation_config.eos_token_id = None
    with torch.no_grad():
        assert float((loaded(ids).logits - logits).abs().max()) <= 1e-5 * float(logits.abs().max())
        tokens = loaded.generate(ids[:1, :4], max_new_tokens=4, do_sample=False, use_cache=True, pad_token_id=0)
    assert torch.equal(tokens, _greedy(gated, ids[:1, :4], 4))


@pytest.mark.slow
def test_a_removed_block_round_trips_through_a_process_without_l0bayes(tmp_path):
    import subprocess
    import sys

    gated, pruned = _pruned_with_block_removed("llama", removed=0)
    ids = _ids(2, seed=3)
    torch.save(ids, tmp_path / "ids.pt")
    folder = str(tmp_path / "llama")
    pruned.save_pretrained(folder)
    run = subprocess.run([sys.executable, "-c", _LOAD, str(tmp_path), folder], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-2000:]
    out = torch.load(tmp_path / "out.pt", weights_only=True)
    with torch.no_grad():
        logits = gated(ids).logits
    assert float((out[folder + "/logits"] - logits).abs().max()) <= 1e-5 * float(logits.abs().max())
    assert torch.equal(out[folder + "/greedy"], _greedy(gated, ids[:1, :4], 4))


def _next_token_loss(out, target):
    return F.cross_entropy(out.logits[:, :-1].flatten(0, 1), target[:, 1:].flatten())


def test_train_reaches_a_target_architecture_exactly(tmp_path):
    """train(objective=Constrained(target_architecture=...)) on a 3-block Llama: the pruned model is a plain
    LlamaForCausalLM with exactly the target's sizes in every block and its config (no gates, no hooks), equal to
    the gated model, and from_pretrained rebuilds it with the same logits."""
    gated = sparsify_transformer(_three_layer("llama"), example_inputs=_ids(), depth=True)
    ids = _ids(64, seed=5)
    target = {"num_key_value_heads": 1, "intermediate_size": 20, "num_hidden_layers": 2}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # three epochs: the Lagrangian has not arrived when the gates are fixed
        result = train(SparseModel(gated, _next_token_loss), ids, ids,
                       objective=Constrained(target_architecture=target), epochs=3, batch_size=32, lr=0.02,
                       progress=False, device="cpu")  # fmt: skip
    record = result.history[-1]
    assert record["target_architecture"] == target and record["gates_fixed"]
    assert len(record["constraint"]) == 3 + 3 + 1  # heads and units of each block, and the blocks
    pruned = prune(gated.eval())
    assert type(pruned) is transformers.LlamaForCausalLM and len(pruned.model.layers) == 2
    config = pruned.config
    assert (config.num_hidden_layers, config.num_key_value_heads, config.num_attention_heads) == (2, 1, 2)
    assert config.intermediate_size == 20
    for layer in pruned.model.layers:
        attn, mlp = layer.self_attn, layer.mlp
        assert (attn.q_proj.out_features, attn.k_proj.out_features, mlp.up_proj.out_features) == (16, 8, 20)
    assert not any(m._forward_hooks or m._forward_pre_hooks for m in pruned.modules())
    assert not any("l0_" in name for name, _ in pruned.named_modules())
    with torch.no_grad():
        logits = gated(ids[:2]).logits
        assert float((pruned(ids[:2]).logits - logits).abs().max()) <= 1e-5 * float(logits.abs().max())
    pruned.save_pretrained(tmp_path)
    loaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    with torch.no_grad():
        assert float((loaded(ids[:2]).logits - logits).abs().max()) <= 1e-5 * float(logits.abs().max())


def test_arrival_each_fixes_a_block_the_step_its_constraint_arrives():
    """``arrival="each"``: after a step where one block's expected MLP fraction is at most its target, exactly that
    block's units are fixed, to the top-``k`` of its ``log_alpha`` (chosen by hand here), its multiplier is zero and
    its expected fraction is ``k / n`` from then on, however the optimiser moves its ``log_alpha``; the other blocks
    learn on; once every constraint has arrived the objective says so, and the checkpoint state keeps the fixed
    blocks."""
    gated = sparsify_transformer(_three_layer("llama"), example_inputs=_ids())
    target = {"num_key_value_heads": 2, "intermediate_size": 12}  # 12 of 48 units; the key-value groups all kept
    objective = Constrained(target_architecture=target, arrival="each", final_phase=0.0, multiplier_lr=1.0).build(
        gated, 8
    )
    units = [c for c in objective.architecture.constrained if c.kind == "units"]
    assert [c.k for c in units] == [12, 12, 12]
    first = units[0].holders[0].gate.log_alpha
    values = torch.linspace(-30.0, 3.0, 48)[torch.randperm(48, generator=torch.Generator().manual_seed(0))]
    with torch.no_grad():
        first.copy_(values)  # q(z != 0) of most of these is small: block 0's expected fraction is below 12/48
    with torch.no_grad():
        expected = objective.expected()
    index = objective.architecture.constrained.index(units[0])
    assert float(expected[index]) <= 0.25 and all(float(expected[objective.architecture.constrained.index(c)]) > 0.25
                                                 for c in units[1:])  # fmt: skip
    objective.mu.fill_(3.0)
    objective.update(expected - objective.targets)
    keep = torch.zeros(48, dtype=torch.bool)
    keep[torch.topk(values, 12).indices] = True
    assert torch.equal(first, torch.where(keep, 50.0, -50.0))
    heads = {i for i, c in enumerate(objective.architecture.constrained) if c.kind == "heads"}
    assert len(heads) == 3  # (2 of 2 key-value groups: these constraints hold at once, and are fixed open)
    assert set(objective.fixed_each) == {index} | heads and float(objective.mu[index]) == 0.0
    assert all(bool((c.holders[0].gate.log_alpha == 50.0).all()) for c in objective.architecture.constrained
               if c.kind == "heads")  # fmt: skip
    for c in units[1:]:  # the others' multipliers took their ascent step
        i = objective.architecture.constrained.index(c)
        assert float(objective.mu[i]) == pytest.approx(3.0 + float(expected[i]) - 0.25, rel=1e-6)
    with torch.no_grad():
        first.add_(torch.randn(48))  # an optimiser step moves it: the next update puts it back
    objective.update(objective.expected().detach() - objective.targets)
    assert torch.equal(first, torch.where(keep, 50.0, -50.0)) and float(objective.expected().detach()[index]) == 0.25
    assert not objective.all_fixed and objective.record()["constraints_fixed"] == 4
    copy = Constrained(target_architecture=target, arrival="each", final_phase=0.0).build(gated, 8)
    copy.load_state_dict(objective.state_dict())
    assert set(copy.fixed_each) == {index} | heads and all(
        torch.equal(a, b) for a, b in zip(copy.fixed_each[index], objective.fixed_each[index], strict=True)
    )
    for c in units[1:]:
        with torch.no_grad():
            c.holders[0].gate.log_alpha.fill_(-10.0)
    objective.update(objective.expected().detach() - objective.targets)
    assert objective.all_fixed and all(float(objective.expected().detach()[objective.architecture.constrained.index(c)])
                                       == 0.25 for c in units)  # fmt: skip


def test_train_with_arrival_each_reaches_the_target_without_passing_it():
    """A run of ``train(..., objective=Constrained(..., arrival="each"))`` on a 3-block Llama: every block's units
    and key-value groups are fixed on their own (the history counts them, never fewer than before), no expected
    fraction of a fixed constraint is ever below its target, and the pruned model has the target's sizes and equals
    the gated one."""
    gated = sparsify_transformer(_three_layer("llama"), example_inputs=_ids())
    ids = _ids(64, seed=5)
    target = {"num_key_value_heads": 1, "intermediate_size": 20}
    seen = []

    class Watch(Callback):
        def on_step_end(self, run):
            objective = run.objective
            fixed = sorted(objective.fixed_each)
            expected = objective.expected().tolist()
            seen.append((fixed, [expected[i] - objective.target_values[i] for i in fixed]))

    objective = Constrained(target_architecture=target, arrival="each", final_phase=0.0, multiplier_lr=5.0)
    result = train(SparseModel(gated, _next_token_loss), ids, ids, objective=objective, epochs=40, batch_size=32,
                   lr=0.05, progress=False, device="cpu", callbacks=[Watch()])  # fmt: skip
    counts = [h["constraints_fixed"] for h in result.history]
    assert counts == sorted(counts) and counts[-1] == 6 and counts[0] < 6
    assert all(abs(gap) <= 1e-6 for _, gaps in seen for gap in gaps)
    pruned = prune(gated.eval())
    assert pruned.config.num_key_value_heads == 1 and pruned.config.intermediate_size == 20
    with torch.no_grad():
        logits = gated(ids[:2]).logits
        assert float((pruned(ids[:2]).logits - logits).abs().max()) <= 1e-5 * float(logits.abs().max())


def test_arrival_each_needs_a_target_architecture():
    gated = sparsify_transformer(_three_layer("llama"), example_inputs=_ids())
    with pytest.raises(ValueError, match="^Constrained: arrival='each' fixes each constraint of a target_architecture"):
        Constrained(target_density=0.5, arrival="each")
    with pytest.raises(ValueError, match="^Constrained: arrival must be a number >= 0, None or 'each', got 'every'"):
        Constrained(target_architecture={"intermediate_size": 8}, arrival="every")
    objective = Constrained(target_architecture={"intermediate_size": 8}, arrival="each").build(gated, 8)
    assert objective.fixed_each == {}  # (nothing has arrived before the first step)


@pytest.mark.parametrize("arrival", [None, "each"])
def test_a_target_architecture_run_resumes_bit_exactly_across_its_final_phase(tmp_path, interrupt_at_epoch, arrival):
    """A 4-epoch run to a target architecture, interrupted after its checkpoint of epoch 2 and resumed: the same
    weights, gates, multipliers and history as the straight run (the gates fixed at the same epoch, the resume
    crossing into the final phase; with ``arrival="each"``, the blocks fixed before the checkpoint stay fixed), and
    the same pruned model; a resume with another target is refused."""

    def run(**extra):
        torch.manual_seed(0)
        gated = sparsify_transformer(_three_layer("llama"), example_inputs=_ids(), depth=True)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # four epochs: the Lagrangian has not arrived when the gates are fixed
            objective = Constrained(target_architecture=extra.pop("target", target), final_phase=0.5,
                                    arrival=arrival, multiplier_lr=20.0 if arrival else None)  # fmt: skip
            result = train(SparseModel(gated, _next_token_loss), ids, ids, objective=objective, epochs=4,
                           batch_size=32, lr=0.02, progress=False, device="cpu", seed=1, **(fast if arrival else {}),
                           **extra)  # fmt: skip
        return gated, result

    ids = _ids(64, seed=5)
    target = {"num_key_value_heads": 1, "intermediate_size": 20, "num_hidden_layers": 2}
    # With "each": gates fast enough that some blocks arrive within the two epochs before the checkpoint.
    fast = {"optimizer": lambda m: torch.optim.Adam(parameter_groups(m, gates={"lr": 1.0}))}  # and multiplier_lr=20
    straight_model, straight = run()
    checkpoint = tmp_path / "run.pt"
    with interrupt_at_epoch(2):
        run(checkpoint=checkpoint)
    torch.manual_seed(99)  # the resume restores torch's random state itself
    resumed_model, resumed = run(checkpoint=checkpoint, resume=True)
    for (name, a), b in zip(straight_model.state_dict().items(), resumed_model.state_dict().values(), strict=True):
        assert torch.equal(a, b), name
    assert torch.equal(straight.multipliers, resumed.multipliers)
    fixed = [h["gates_fixed"] for h in resumed.history]
    assert fixed == [h["gates_fixed"] for h in straight.history] and fixed[:2] == [False, False] and fixed[-1]
    assert [h["mean_loss"] for h in straight.history] == [h["mean_loss"] for h in resumed.history]
    each = [h["constraints_fixed"] for h in straight.history]
    assert each == [h["constraints_fixed"] for h in resumed.history]
    if arrival == "each":  # some blocks were fixed on their own before the checkpoint, not all
        assert 0 < each[1] < 7
    a, b = prune(straight_model.eval()), prune(resumed_model.eval())
    assert a.config.to_dict() == b.config.to_dict()
    with pytest.raises(ValueError, match=r"trained for target_architecture=\{.*'intermediate_size': 20.*asks .*16"):
        run(checkpoint=checkpoint, resume=True, target={**target, "intermediate_size": 16})


def test_target_architecture_only_with_the_constrained_objective():
    gated = sparsify_transformer(_three_layer("llama"), example_inputs=_ids())
    model, ids = SparseModel(gated, _next_token_loss), _ids(8)
    with pytest.raises(TypeError, match="unexpected keyword argument 'target_architecture'"):
        train(model, ids, ids, objective="penalized", target_architecture={"intermediate_size": 8}, progress=False)
    with pytest.raises(ValueError, match="needs exactly one of target_density.*target_architecture"):
        Constrained(target_density=0.5, target_architecture={"intermediate_size": 8})
    with pytest.raises(ValueError, match="num_hidden_layers=2: the blocks have no block gates.*depth=True"):
        train(model, ids, ids, objective=Constrained(target_architecture={"num_hidden_layers": 2}), progress=False)


def test_arrival_each_with_target_warmup_waits_for_the_final_target():
    """With a target warm-up, ``arrival="each"`` fixes a block when its expected fraction reaches the final target,
    not the warm-up's current one, which lies above it until the warm-up ends."""
    gated = sparsify_transformer(_three_layer("llama"), example_inputs=_ids())
    target = {"num_key_value_heads": 2, "intermediate_size": 12}  # 12 of 48 units
    objective = Constrained(target_architecture=target, arrival="each", final_phase=0.0, target_warmup=10).build(
        gated, 8
    )
    units = [c for c in objective.architecture.constrained if c.kind == "units"]
    index = objective.architecture.constrained.index(units[0])
    assert float(objective.targets[index]) == pytest.approx(1 - 0.75 / 10)
    log_alpha = units[0].holders[0].gate.log_alpha
    with torch.no_grad():  # about half of block 0's units open: below the current target, above the final 0.25
        log_alpha.copy_(torch.where(torch.arange(48) < 24, 5.0, -30.0))
        expected = objective.expected()
    assert 0.25 < float(expected[index]) < float(objective.targets[index])
    objective.update(expected - objective.targets)
    assert index not in objective.fixed_each and float(objective.mu[index]) == 0.0  # (the current target holds)
    assert float(objective.targets[index]) == pytest.approx(1 - 0.75 * 2 / 10)
    with torch.no_grad():  # 11 open: the final target reached
        log_alpha.copy_(torch.where(torch.arange(48) < 11, 5.0, -30.0))
        expected = objective.expected()
    objective.update(expected - objective.targets)
    assert index in objective.fixed_each
    assert int((log_alpha == 50.0).sum()) == 12 and bool((log_alpha[:11] == 50.0).all())
