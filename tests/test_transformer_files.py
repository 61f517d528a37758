"""A pruned transformer of different sizes per block saved with ``save_pruned`` and loaded into a fresh model."""

import copy
import warnings

import pytest
import torch

from l0bayes.io import CheckpointError, CheckpointTypeError
from l0bayes.nn import gates_of
from l0bayes.pruning import load_pruned, prune, save_pruned, sparsify_transformer
from l0bayes.pruning.transformer import ZeroBranch

transformers = pytest.importorskip("transformers")

OPEN = 50.0  # a log_alpha whose Eq. 13 gate is exactly 1 (and its negative, exactly 0)


def _fix(gated, name, keep):
    """Fix the gates of ``name`` open where ``keep`` is true, closed elsewhere."""
    log_alpha = gated.get_submodule(name).gate.log_alpha
    with torch.no_grad():
        log_alpha.copy_(torch.where(torch.tensor(keep), OPEN, -OPEN).to(log_alpha).expand_as(log_alpha))


def _pruned(model, tokens, closed):
    """``model`` gated (with block gates), every gate open but those of ``closed`` (name -> kept pattern), pruned."""
    gated = sparsify_transformer(model, example_inputs=tokens, depth=True)
    for _, gate in gates_of(gated):
        with torch.no_grad():
            gate.log_alpha.fill_(OPEN)
    for name, keep in closed.items():
        _fix(gated, name, keep)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # the config cannot describe different sizes per block
        return prune(gated.eval())


def _llama_config():
    return transformers.LlamaConfig(
        hidden_size=16, intermediate_size=24, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
        vocab_size=32, max_position_embeddings=16,
    )  # fmt: skip


def _gpt2_config():
    return transformers.GPT2Config(
        n_embd=16, n_layer=3, n_head=4, n_inner=24, vocab_size=32, n_positions=16, bos_token_id=0, eos_token_id=0
    )


TOKENS = torch.randint(0, 32, (2, 6), generator=torch.Generator().manual_seed(1))


@pytest.fixture(scope="module")
def llama():
    """A Llama pruned differently in every block: block 0 removed, block 1 keeps one key-value group and a third
    of its units, block 2 keeps both groups and loses its MLP."""
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(_llama_config()).eval()
    closed = {
        "model.layers.0.l0_block": [False],
        "model.layers.1.l0_heads": [False, True],
        "model.layers.1.l0_units": [i % 3 == 0 for i in range(24)],
        "model.layers.2.l0_mlp": [False],
    }
    return _pruned(model, TOKENS, closed)


@pytest.fixture(scope="module")
def gpt2():
    """A GPT-2 pruned differently in every block: block 0 keeps 2 of its 4 heads, block 1 loses its attention,
    block 2 is removed."""
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(_gpt2_config()).eval()
    closed = {
        "transformer.h.0.l0_heads": [True, False, False, True],
        "transformer.h.1.l0_attention": [False],
        "transformer.h.2.l0_block": [False],
    }
    return _pruned(model, TOKENS, closed)


def _round_trip(pruned, fresh, tmp_path):
    path = tmp_path / "pruned.pt"
    save_pruned(pruned, path, metadata={"family": type(fresh).__name__})
    loaded, metadata = load_pruned(path, model=fresh)
    assert loaded is fresh and metadata == {"family": type(fresh).__name__}
    with torch.no_grad():
        expected, got = pruned(TOKENS).logits, loaded(TOKENS).logits
    torch.testing.assert_close(got, expected, rtol=0, atol=0)  # the same layers and tensors: the same numbers
    return loaded


def test_non_uniform_llama_round_trip(llama, tmp_path):
    layers = llama.model.layers
    assert len(layers) == 2 and isinstance(layers[1].mlp, ZeroBranch)
    assert (layers[0].self_attn.k_proj.out_features, layers[1].self_attn.k_proj.out_features) == (4, 8)
    loaded = _round_trip(llama, transformers.LlamaForCausalLM(_llama_config()), tmp_path)
    assert len(loaded.model.layers) == 2 and isinstance(loaded.model.layers[1].mlp, ZeroBranch)
    assert loaded.model.layers[0].mlp.down_proj.in_features == 8
    with torch.no_grad():  # the key-value cache of the kept blocks: greedy tokens as the pruned model's
        want = llama.generate(TOKENS, max_new_tokens=4, do_sample=False)
        got = loaded.generate(TOKENS, max_new_tokens=4, do_sample=False)
    assert torch.equal(got, want)


def test_non_uniform_gpt2_round_trip(gpt2, tmp_path):
    blocks = gpt2.transformer.h
    assert len(blocks) == 2 and isinstance(blocks[1].attn, ZeroBranch)
    assert (blocks[0].attn.num_heads, blocks[0].attn.split_size, blocks[0].attn.c_attn.nf) == (2, 8, 24)
    loaded = _round_trip(gpt2, transformers.GPT2LMHeadModel(_gpt2_config()), tmp_path)
    attn = loaded.transformer.h[0].attn
    assert (attn.num_heads, attn.split_size, attn.c_attn.nf, attn.c_proj.nx) == (2, 8, 24, 8)


def _tampered(pruned, tmp_path, name, change):
    """A file of ``pruned`` whose description entry ``name`` is changed by ``change(args)``."""
    path = tmp_path / "pruned.pt"
    save_pruned(pruned, path)
    state = torch.load(path, weights_only=True)
    (spec,) = [spec for spec in state["modules"] if spec["name"] == name]
    change(spec["args"])
    torch.save(state, path)
    return path


def _set(key, value):
    return lambda args: args.__setitem__(key, value)


def _set_attribute(key, value):
    return lambda args: args["attributes"].__setitem__(key, value)


@pytest.mark.parametrize(
    "family, name, change, match",
    [
        ("gpt2", "transformer.h.0.attn", _set_attribute("num_heads", 3), r"h\.0\.attn'.*split_size = 8 .*num_heads"),
        ("gpt2", "transformer.h.0.attn", _set_attribute("num_heads", 1), r"h\.0\.attn'.*same share"),
        (
            "gpt2",
            "transformer.h.0.attn",
            lambda args: args["attributes"].update(num_heads=1, split_size=4),  # in agreement, not with the tensors
            r"h\.0\.attn'.*num_heads = 1 of the model's 4 does not fit the file's tensors: transformer\.h\.0\.attn\.c_",
        ),
        ("gpt2", "transformer.h.0.attn", _set_attribute("num_heads", 8), r"h\.0\.attn'.*more than the model's 4"),
        ("gpt2", "transformer.h.0.attn", _set_attribute("embed_dim", 8), r"h\.0\.attn'.*'embed_dim' may not"),
        ("gpt2", "transformer.h.0.attn.c_attn", _set("nf", 48), r"h\.0\.attn\.c_attn' \(Conv1D\).*shape"),
        ("gpt2", "transformer.h.0.mlp.c_fc", _set("nf", 12), r"h\.0\.mlp\.c_fc' \(Conv1D\).*shape"),
        ("gpt2", "transformer.h", _set("length", 3), r"does not describe: \['transformer\.h\.2'"),
        ("gpt2", "transformer.h.1.attn", _set("features", 10**9), r"h\.1\.attn' \(ZeroBranch\).*features"),
        ("llama", "model.layers", _set("length", 4), r"'model\.layers'.*length = 4 is more than the model's 3"),
        ("llama", "model.layers.0.self_attn.k_proj", _set("out_features", 8), r"layers\.0\.self_attn\.k_proj'"),
        ("llama", "model.layers.1.mlp", _set("features", 0), r"layers\.1\.mlp' \(ZeroBranch\).*features"),
        ("llama", "model.layers.1.mlp", _set("pair", 1), r"layers\.1\.mlp' \(ZeroBranch\).*pair"),
    ],
)
def test_a_tampered_file_is_refused_naming_the_entry(request, tmp_path, family, name, change, match):
    pruned = request.getfixturevalue(family)
    fresh = (
        transformers.GPT2LMHeadModel(_gpt2_config())
        if family == "gpt2"
        else transformers.LlamaForCausalLM(_llama_config())
    )
    before = copy.deepcopy(fresh.state_dict())
    modules = [n for n, _ in fresh.named_modules()]
    with pytest.raises((CheckpointError, CheckpointTypeError), match=match):
        load_pruned(_tampered(pruned, tmp_path, name, change), model=fresh)
    assert [n for n, _ in fresh.named_modules()] == modules  # model= as it was
    for key, tensor in fresh.state_dict().items():
        assert torch.equal(tensor, before[key])


def test_a_model_with_fewer_blocks_than_the_file_is_refused(llama, tmp_path):
    config = _llama_config()
    config.num_hidden_layers = 1
    with pytest.raises(CheckpointError, match=r"'model\.layers': length = 2 is more than the model's 1"):
        load_pruned(
            _tampered(llama, tmp_path, "model.layers", lambda args: None), model=transformers.LlamaForCausalLM(config)
        )


class _TorchTransformer(torch.nn.Module):
    """torch's own layers: a 2-layer encoder and a decoder layer (self- and cross-attention), and a head."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        layer = torch.nn.TransformerEncoderLayer(16, 4, 24, dropout=0.0, batch_first=True, norm_first=True)
        self.encoder = torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.decoder = torch.nn.TransformerDecoderLayer(16, 4, 24, dropout=0.0, batch_first=True)
        self.head = torch.nn.Linear(16, 3)

    def forward(self, x):
        memory = self.encoder(x)
        return self.head(self.decoder(x, memory))


INPUTS = torch.randn(2, 5, 16, generator=torch.Generator().manual_seed(2))


@pytest.fixture(scope="module")
def torch_layers():
    """Encoder layer 0 keeps 2 of its 4 heads and loses its MLP; layer 1 loses its attention and keeps 8 of its 24
    units; the decoder layer keeps 3 self-attention heads, 1 cross-attention head."""
    gated = sparsify_transformer(_TorchTransformer().eval(), example_inputs=INPUTS)
    for _, gate in gates_of(gated):
        with torch.no_grad():
            gate.log_alpha.fill_(OPEN)
    closed = {
        "encoder.layers.0.l0_heads": [True, False, True, False],
        "encoder.layers.0.l0_mlp": [False],
        "encoder.layers.1.l0_attention": [False],
        "encoder.layers.1.l0_units": [i < 8 for i in range(24)],
        "decoder.l0_heads": [True, True, True, False],
        "decoder.l0_cross_heads": [False, False, True, False],
    }
    for name, keep in closed.items():
        _fix(gated, name, keep)
    return prune(gated.eval())


def test_torch_encoder_and_decoder_layers_round_trip(torch_layers, tmp_path):
    """What prune makes of torch's layers (a PrunedTransformerEncoderLayer, PrunedMultiheadAttention) is described
    in the file and rebuilt in a fresh model: the same modules and the same outputs, bit for bit."""
    path = tmp_path / "pruned.pt"
    save_pruned(torch_layers, path)
    fresh = _TorchTransformer()
    loaded, _ = load_pruned(path, model=fresh)
    assert loaded is fresh
    assert [(n, type(m).__name__) for n, m in loaded.named_modules()] == [
        (n, type(m).__name__) for n, m in torch_layers.named_modules()
    ]
    first, second = loaded.encoder.layers
    assert not first.feed_forward and first.self_attn.num_heads == 2 and first.linear1 is None
    assert isinstance(second.self_attn, ZeroBranch) and second.linear1.out_features == 8
    assert loaded.decoder.multihead_attn.num_heads == 1
    with torch.no_grad():
        torch.testing.assert_close(loaded(INPUTS), torch_layers(INPUTS), rtol=0, atol=0)


@pytest.mark.parametrize(
    "name, change, match",
    [
        (
            "encoder.layers.0.self_attn",
            _set("num_heads", 4),
            r"layers\.0\.self_attn' \(PrunedMultiheadAttention\)\.q_proj.*shape",
        ),
        (
            "encoder.layers.0.self_attn",
            _set("head_dim", 10**9),
            r"self_attn' \(PrunedMultiheadAttention\)\.q_proj.*shape",
        ),
        ("encoder.layers.0.self_attn", _set("dropout", 2.0), r"self_attn' \(PrunedMultiheadAttention\): dropout"),
        ("encoder.layers.0.self_attn", _set("bias", False), r"\.q_proj: the state dict holds 'bias'"),
        ("encoder.layers.0.self_attn", _set("kdim", 0), r"kdim = 0 must be at least 1"),
        ("encoder.layers.0", _set("feed_forward", True), r"does not describe: \['encoder\.layers\.0\.linear1'"),
        ("encoder.layers.0", _set("feed_forward", "yes"), r"feed_forward must be True or False"),
        (
            "decoder.multihead_attn",
            _set("embed_dim", 8),
            r"decoder\.multihead_attn' \(PrunedMultiheadAttention\)\.q_proj",
        ),
    ],
)
def test_a_tampered_torch_layer_is_refused_and_the_model_is_untouched(torch_layers, tmp_path, name, change, match):
    fresh = _TorchTransformer()
    before = copy.deepcopy(fresh.state_dict())
    modules = [(n, type(m)) for n, m in fresh.named_modules()]
    with pytest.raises((CheckpointError, CheckpointTypeError), match=match):
        load_pruned(_tampered(torch_layers, tmp_path, name, change), model=fresh)
    assert [(n, type(m)) for n, m in fresh.named_modules()] == modules
    for key, tensor in fresh.state_dict().items():
        assert torch.equal(tensor, before[key])


def test_a_pruned_torch_layer_where_the_model_has_another_is_refused(torch_layers, tmp_path):
    path = tmp_path / "pruned.pt"
    save_pruned(torch_layers, path)
    fresh = _TorchTransformer()
    fresh.encoder.layers[0] = torch.nn.Linear(16, 16)
    match = r"PrunedTransformerEncoderLayer \(a pruned TransformerEncoderLayer\) where the model has a Linear"
    with pytest.raises(CheckpointError, match=match):
        load_pruned(path, model=fresh)
