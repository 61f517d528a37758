"""A pruned Hugging Face model and its config: save_pretrained / from_pretrained for every family, a clear refusal
where the config cannot describe the pruned model, a model loaded from a GGUF file, a model inside a module of
your own; and prune's float64 check, which casts a block at a time (tiny configs, random weights, nothing
downloaded)."""

import gc
import warnings

import pytest
import torch
from test_transformer_pruning import _random_gates
from torch import nn

from l0bayes.pruning import fix_architecture, load_pruned, prune, save_pruned, sparsify_transformer
from l0bayes.pruning.transformer import prune as prune_module

transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()

VOCAB, T = 40, 8


def _ids(n=2, seed=0):
    return torch.randint(0, VOCAB, (n, T), generator=torch.Generator().manual_seed(seed))


def _llama(layers=2, seed=0, **kwargs):
    torch.manual_seed(seed)
    config = transformers.LlamaConfig(
        hidden_size=32, intermediate_size=48, num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
        vocab_size=VOCAB, max_position_embeddings=16, **kwargs,
    )  # fmt: skip
    return transformers.LlamaForCausalLM(config).eval()


def _grouped_query(model_class, config_class):
    """A tiny model of a Llama-like family (Qwen2, Mistral): 4 heads in 2 key-value groups, an MLP of 48 units."""
    config = config_class(
        hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        vocab_size=VOCAB, max_position_embeddings=T,
    )  # fmt: skip
    return model_class(config)


#: Every family of the guide's table, as ``(model, what from_pretrained needs besides the folder)``.
FAMILIES = {
    "llama": lambda: (_llama(), {}),
    "qwen2": lambda: (_grouped_query(transformers.Qwen2ForCausalLM, transformers.Qwen2Config), {}),
    "mistral": lambda: (_grouped_query(transformers.MistralForCausalLM, transformers.MistralConfig), {}),
    "gpt2": lambda: (
        transformers.GPT2LMHeadModel(
            transformers.GPT2Config(vocab_size=VOCAB, n_positions=T, n_embd=32, n_layer=2, n_head=4, n_inner=48)
        ),
        {},
    ),  # fmt: skip
    "opt": lambda: (
        transformers.OPTForCausalLM(
            transformers.OPTConfig(
                vocab_size=VOCAB,
                hidden_size=32,
                ffn_dim=48,
                num_hidden_layers=2,
                num_attention_heads=4,
                word_embed_proj_dim=32,
                max_position_embeddings=T,
            )
        ),
        {},
    ),  # fmt: skip
    "gpt_neox": lambda: (
        transformers.GPTNeoXForCausalLM(
            transformers.GPTNeoXConfig(
                vocab_size=VOCAB,
                hidden_size=32,
                intermediate_size=48,
                num_hidden_layers=2,
                num_attention_heads=4,
                max_position_embeddings=T,
            )
        ),
        {},
    ),  # fmt: skip
    "bert": lambda: (
        transformers.BertModel(
            transformers.BertConfig(
                vocab_size=VOCAB,
                hidden_size=32,
                num_hidden_layers=2,
                num_attention_heads=4,
                intermediate_size=48,
                max_position_embeddings=T,
            ),
            add_pooling_layer=False,
        ),
        {"add_pooling_layer": False},
    ),  # fmt: skip
    "roberta": lambda: (
        transformers.RobertaModel(
            transformers.RobertaConfig(
                vocab_size=VOCAB,
                hidden_size=32,
                num_hidden_layers=2,
                num_attention_heads=4,
                intermediate_size=48,
                max_position_embeddings=T + 2,
            ),
            add_pooling_layer=False,
        ),
        {"add_pooling_layer": False},
    ),  # fmt: skip
    "distilbert": lambda: (
        transformers.DistilBertModel(
            transformers.DistilBertConfig(
                vocab_size=VOCAB, dim=32, n_layers=2, n_heads=4, hidden_dim=48, max_position_embeddings=T
            )
        ),
        {},
    ),  # fmt: skip
}

#: Whether the family's config describes fewer heads: Llama, Qwen2 and Mistral have head_dim; the others derive
#: the head width from the embedding width and the head count.
FEWER_HEADS = {"llama", "qwen2", "mistral"}


def _family(name, seed=0):
    torch.manual_seed(seed)
    model, load_kwargs = FAMILIES[name]()
    return model.eval(), load_kwargs


def _out(model, x):
    out = model(x)
    return out.logits if hasattr(out, "logits") else out.last_hidden_state


def _close(a, b):
    return float((a - b).abs().max()) <= 1e-5 * float(a.abs().max())


# ------------------------------------------------------------------------------------ save_pretrained round trip


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_a_uniform_pruned_model_round_trips_for_every_family(tmp_path, family):
    """fix_architecture to what the family's config describes (fewer heads where it has head_dim, all heads
    otherwise; 20 MLP units): prune updates the config (DistilBERT's hidden_dim too; a BERT built without its
    pooler is still described), and from_pretrained rebuilds the pruned model with the gated model's outputs."""
    model, load_kwargs = _family(family)
    gated = sparsify_transformer(model, example_inputs=_ids())
    _random_gates(gated, 3, p_closed=0.0)
    fix_architecture(gated, num_attention_heads=2 if family in FEWER_HEADS else 4, intermediate_size=20)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # described: no warning
        pruned = prune(gated.eval())
    pruned.save_pretrained(tmp_path)
    loaded = type(pruned).from_pretrained(tmp_path, **load_kwargs).eval()
    entries = loaded.config.to_dict()
    assert [entries[k] for k in ("intermediate_size", "n_inner", "ffn_dim", "hidden_dim") if k in entries] == [20]
    ids = _ids(2, seed=3)
    with torch.no_grad():
        assert _close(_out(gated, ids), _out(loaded, ids))


def test_every_block_removed_still_round_trips(tmp_path):
    """Every block gate closed (may_remove_all=True): the config says no layers, and from_pretrained rebuilds the
    model with the gated model's logits."""
    gated = sparsify_transformer(_llama(), example_inputs=_ids(), depth=True, may_remove_all=True)
    for layer in gated.model.layers:
        with torch.no_grad():
            layer.l0_block.gate.log_alpha.fill_(-50.0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        pruned = prune(gated.eval())
    assert len(pruned.model.layers) == 0 and pruned.config.num_hidden_layers == 0
    pruned.save_pretrained(tmp_path)
    loaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    ids = _ids(2, seed=3)
    with torch.no_grad():
        assert _close(gated(ids).logits, loaded(ids).logits)


# ------------------------------------------------------------------------- a config that cannot describe it


def test_a_default_gated_gpt2_refuses_save_pretrained_saying_what_its_config_describes(tmp_path):
    """GPT-2 with its default gates (different sizes per block): prune warns with what a GPT2Config describes (all
    heads, n_inner, n_layer), and save_pretrained raises that, writing nothing, where it wrote a folder
    from_pretrained could not load. save_pruned / load_pruned still work."""
    model, _ = _family("gpt2")
    gated = sparsify_transformer(model, example_inputs=_ids())
    _random_gates(gated, 1)
    describes = r"all 4 heads but not fewer \(the head width is n_embd / n_head\), the MLP width \(n_inner\)"
    with pytest.warns(UserWarning, match=f"keeps its original config.*save_pretrained raises.*{describes}") as rec:
        pruned = prune(gated.eval())
    assert rec[0].filename == __file__  # the warning names the line of the call to prune
    with pytest.raises(ValueError, match=f"save_pretrained: .*save_pruned.*{describes}.*num_attention_heads=4"):
        pruned.save_pretrained(tmp_path / "hf")
    assert not (tmp_path / "hf").exists()
    save_pruned(pruned, tmp_path / "pruned.pt")
    reloaded, _ = load_pruned(tmp_path / "pruned.pt", model=_family("gpt2")[0])
    ids = _ids(2, seed=3)
    with torch.no_grad():
        assert _close(_out(pruned, ids), _out(reloaded, ids))


def test_a_refused_model_pruned_again_to_what_its_config_describes_saves(tmp_path):
    """A GPT-2 whose blocks keep different MLP widths (its save_pretrained refused), gated and pruned again to the
    same width in every block: its config describes it, and its save_pretrained saves again."""
    gated = fix_architecture(sparsify_transformer(_family("gpt2")[0], example_inputs=_ids()), num_attention_heads=4)
    with torch.no_grad():
        gated.transformer.h[0].l0_units.gate.log_alpha[:10] = -50.0
    with pytest.warns(UserWarning, match="keeps its original config"):
        pruned = prune(gated.eval())
    gated = sparsify_transformer(pruned, example_inputs=_ids())
    fix_architecture(gated, num_attention_heads=4, intermediate_size=30)
    again = prune(gated.eval())
    again.save_pretrained(tmp_path)
    loaded = type(again).from_pretrained(tmp_path).eval()
    with torch.no_grad():
        assert _close(gated(_ids()).logits, loaded(_ids()).logits)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_the_refusal_says_truly_whether_the_config_describes_fewer_heads(tmp_path, family):
    """A closed MLP branch: the config cannot describe the model, the refusal says whether the family's config
    describes fewer heads, and that claim holds: fewer heads in every block are described (the config updated,
    saved and loaded) exactly where it says so."""
    model, load_kwargs = _family(family)
    gated = sparsify_transformer(model, example_inputs=_ids())
    fix_architecture(gated, num_attention_heads=4)
    block = [m for name, m in gated.named_modules() if name.endswith(".1") and hasattr(m, "l0_mlp")][0]
    with torch.no_grad():
        block.l0_mlp.gate.log_alpha.fill_(-50.0)
    with pytest.warns(UserWarning, match="keeps its original config"):
        pruned = prune(gated.eval())
    with pytest.raises(ValueError, match="save_pruned") as refusal:
        pruned.save_pretrained(tmp_path / "refused")
    says_fewer = "but not fewer" not in str(refusal.value)
    assert says_fewer == (family in FEWER_HEADS)
    gated = sparsify_transformer(_family(family)[0], example_inputs=_ids())
    fix_architecture(gated, num_attention_heads=2)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        pruned = prune(gated.eval())
    assert (not caught) == says_fewer
    if says_fewer:
        pruned.save_pretrained(tmp_path / "fewer")
        loaded = type(pruned).from_pretrained(tmp_path / "fewer", **load_kwargs)
        assert loaded.config.num_attention_heads == 2


# ------------------------------------------------------------------------------- a model loaded from GGUF


def _as_loaded_from_gguf(model):
    """The marks transformers' from_pretrained(..., gguf_file=...) leaves on a model whose architecture it
    dequantizes while loading (Llama, as SmolLM2): its GGUF quantizer's preprocess and postprocess steps."""
    from transformers.quantizers.quantizer_gguf import GgufHfQuantizer
    from transformers.utils.quantization_config import GgufConfig

    quantizer = GgufHfQuantizer(GgufConfig(gguf_file="model.gguf"))
    quantizer.preprocess_model(model, dtype=torch.float32, device_map=None, checkpoint_files=["model.gguf"])
    model.hf_quantizer = quantizer
    quantizer.postprocess_model(model)
    return model


def test_a_model_loaded_from_gguf_prunes_into_a_model_that_saves(tmp_path):
    """The GGUF marks (hf_quantizer, is_quantized, config.quantization_config) make save_pretrained refuse the
    model, whose weights are plain tensors; the pruned model is saved without them and loads with the same
    logits. The gated model keeps its marks."""
    model = _as_loaded_from_gguf(_llama())
    with pytest.raises(ValueError, match="quantized with gguf"):
        model.save_pretrained(tmp_path / "original")
    gated = sparsify_transformer(model, example_inputs=_ids())
    fix_architecture(gated, num_key_value_heads=1, intermediate_size=20)
    pruned = prune(gated.eval())
    assert not getattr(pruned, "is_quantized", False) and getattr(pruned, "hf_quantizer", None) is None
    pruned.save_pretrained(tmp_path / "pruned")
    loaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "pruned").eval()
    assert getattr(loaded.config, "quantization_config", None) is None
    ids = _ids(2, seed=3)
    with torch.no_grad():
        assert _close(gated(ids).logits, loaded(ids).logits)
    assert gated.is_quantized and gated.config.quantization_config is not None


def test_quantized_weights_keep_their_marks():
    """Only plain floating weights lose the marks: a packed (uint8) weight, as a GGUF module keeps, does not."""
    from l0bayes.pruning.transformer.hf_config import clear_quantization

    model = _as_loaded_from_gguf(_llama())
    model.lm_head.packed = nn.Parameter(torch.zeros(4, dtype=torch.uint8), requires_grad=False)
    clear_quantization(model)
    assert model.is_quantized and model.hf_quantizer is not None and model.config.quantization_config is not None
    del model.lm_head.packed
    clear_quantization(model)
    assert getattr(model, "hf_quantizer", None) is None and getattr(model.config, "quantization_config", None) is None


# ------------------------------------------------------------------------ a model inside a module of your own


class _Wrapper(nn.Module):
    def __init__(self, lm):
        super().__init__()
        self.lm = lm

    def forward(self, ids):
        return self.lm(ids).logits


def test_a_hugging_face_model_inside_a_module_of_your_own_gets_its_config(tmp_path):
    """The Llama inside a wrapper: its config follows the kept sizes and blocks (one of three removed), so its
    save_pretrained / from_pretrained round-trip; with different sizes per block it warns and refuses to save."""
    gated = sparsify_transformer(_Wrapper(_llama(layers=3)), example_inputs=_ids(), depth=True)
    _random_gates(gated, 2, p_closed=0.0)
    fix_architecture(gated, num_key_value_heads=1, intermediate_size=20, num_hidden_layers=2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        pruned = prune(gated.eval())
    config = pruned.lm.config
    assert (config.num_key_value_heads, config.intermediate_size, config.num_hidden_layers) == (1, 20, 2)
    pruned.lm.save_pretrained(tmp_path)
    loaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    ids = _ids(2, seed=3)
    with torch.no_grad():
        assert _close(gated(ids), loaded(ids).logits)
    gated = sparsify_transformer(_Wrapper(_llama()), example_inputs=_ids())
    _random_gates(gated, 1)
    with pytest.warns(UserWarning, match="the pruned LlamaForCausalLM keeps its original config"):
        pruned = prune(gated.eval())
    with pytest.raises(ValueError, match="save_pruned"):
        pruned.lm.save_pretrained(tmp_path / "refused")
    with pytest.raises(ValueError, match="save_pruned"):
        pruned.lm.model.save_pretrained(tmp_path / "refused")  # the base model inside shares the config


def test_the_warning_of_a_model_without_attention_names_the_call_to_prune():
    """Every attention branch closed: the warning names the line of the call to prune (it named torch's no_grad
    wrapper)."""
    gated = sparsify_transformer(_llama(), example_inputs=_ids())
    for layer in gated.model.layers:
        with torch.no_grad():
            layer.l0_attention.gate.log_alpha.fill_(-50.0)
    with pytest.warns(UserWarning) as rec:  # (and: the config cannot describe a model without attention)
        prune(gated.eval())
    assert [w.filename for w in rec if "close the attention branch of every block" in str(w.message)] == [__file__]


# ------------------------------------------------------------------------------------ prune's float64 check


def _float64_bytes(objects):
    """The bytes of the float64 tensors among ``objects`` (each storage once)."""
    storages = {}
    for obj in objects:
        if type(obj) in (torch.Tensor, nn.Parameter) and obj.dtype == torch.float64 and obj.device.type != "meta":
            storage = obj.untyped_storage()
            storages[storage.data_ptr()] = storage.nbytes()
    return sum(storages.values())


def _numel(module):
    return sum(t.numel() for t in [*module.parameters(), *module.buffers()] if t.is_floating_point())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_prunes_check_holds_one_block_in_float64_at_a_time(dtype):
    """prune checks the pruned model against the gated one in float64, casting each module only while it runs: at
    the calls of two blocks, the embedding and the output layer, the float64 tensors alive hold about one block
    (they held a float64 copy of the whole model); the gated model's weights are left exactly as they were."""
    gated = sparsify_transformer(_llama(layers=4, use_cache=False).to(dtype), example_inputs=_ids())
    _random_gates(gated, 4)
    blocks = list(gated.model.layers)
    sampled = [blocks[1], blocks[3], gated.model.embed_tokens, gated.lm_head]
    peaks = []
    before = {name: (p.dtype, p.data_ptr(), p.detach().clone()) for name, p in gated.named_parameters()}

    # What is alive now (this test's set-up, what other tests of this process left) leaves the youngest generation
    # of the garbage collector; with the collector off until prune returns, every object prune creates stays in it.
    # The float64 tensors of the check are there, or are the gated model's own tensors cast in place (a scan of
    # every object of the process is slow).
    def measure(*_):
        peaks.append(_float64_bytes([*gc.get_objects(generation=0), *gated.parameters(), *gated.buffers()]))

    handles = [m.register_forward_hook(measure) for m in sampled]
    gc.collect()
    collections = [generation["collections"] for generation in gc.get_stats()]
    gc.disable()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # different sizes per block
            pruned = prune(gated.eval())
        # no collection ran (nothing prune created left the generation scanned)
        assert [generation["collections"] for generation in gc.get_stats()] == collections
    finally:
        gc.enable()
    for h in handles:
        h.remove()
    block = max(_numel(b) for b in blocks)
    assert len(peaks) >= 2 * len(sampled)  # the gated and the pruned model ran
    assert max(peaks) <= 8 * block * 1.5 < 8 * _numel(gated) / 2  # one block, and the activations
    for name, p in gated.named_parameters():
        dtype_, ptr, value = before[name]
        assert p.dtype == dtype_ and p.data_ptr() == ptr and torch.equal(p, value)
    ids = _ids(2, seed=3)
    with torch.no_grad():
        a, b = gated(ids).logits.double(), pruned(ids).logits.double()
    assert float((a - b).abs().max()) <= (1e-5 if dtype == torch.float32 else 0.1) * float(a.abs().max())


def test_prunes_check_still_finds_a_pruned_model_that_differs(monkeypatch):
    """Two heads swapped in the output projection of the pruned model: it runs, but prune says it differs."""
    gated = sparsify_transformer(_llama(), example_inputs=_ids())
    original = prune_module._remove_blocks

    def swapped(plain, resolved, removed):
        kept = original(plain, resolved, removed)
        o_proj = plain.model.layers[1].self_attn.o_proj
        with torch.no_grad():
            o_proj.weight.copy_(torch.cat([o_proj.weight[:, 8:16], o_proj.weight[:, :8], o_proj.weight[:, 16:]], 1))
        return kept

    monkeypatch.setattr(prune_module, "_remove_blocks", swapped)
    with pytest.raises(ValueError, match="the pruned model differs from the gated one"):
        prune(gated.eval())


def test_a_model_reading_weights_of_a_module_it_does_not_call_is_checked_whole():
    """A forward that multiplies by the embedding's weight without calling the embedding cannot run a module at a
    time (mixed precisions): prune checks it on a float64 copy of the whole model."""

    class Tied(nn.Module):
        def __init__(self):
            super().__init__()
            self.tok = nn.Embedding(VOCAB, 16)
            layer = nn.TransformerEncoderLayer(16, 4, 32, batch_first=True)
            self.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)

        def forward(self, ids):
            return self.encoder(self.tok(ids)) @ self.tok.weight.T

    torch.manual_seed(0)
    gated = sparsify_transformer(Tied().eval(), example_inputs=_ids())
    _random_gates(gated, 2)
    pruned = prune(gated.eval())
    ids = _ids(2, seed=3)
    with torch.no_grad():
        assert _close(gated(ids), pruned(ids))
