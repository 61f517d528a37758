"""Property-based probes of the transformer surface: ``sparsify_transformer``, ``prune`` and ``fix_architecture``
on tiny Hugging Face configs of every covered family, with random gate patterns and odd arguments.

Every property checks an outcome: a ``TypeError`` / ``ValueError`` whose message names the argument, or a pruned
model equal to the gated one (logits within 1e-5 of their scale) whose parameter count is the exact count of
``network_size``. Each runs twice: a few examples in the default run (building and pruning a model costs about a
tenth of a second, so fewer than the other probe suites), many more under ``-m slow``.
"""

import math
import warnings

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from l0bayes.nn import gates_of
from l0bayes.pruning import (
    Block,
    Group,
    count_parameters,
    fix_architecture,
    network_size,
    prune,
    sparsify,
    sparsify_transformer,
)
from l0bayes.pruning.transformer.target import KEYS

transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()

#: Examples per property: the default run, and the ``slow`` profile.
FAST, SLOW = 8, 100
PROFILES = [pytest.param(FAST, id="fast"), pytest.param(SLOW, marks=pytest.mark.slow, id="slow")]
VOCAB, T = 24, 6
FAMILIES = ("llama", "qwen2", "mistral", "opt", "gpt_neox", "gpt2", "bert")


def _profile(examples):
    return settings(max_examples=examples, deadline=None, derandomize=True, database=None)


def _ids(n=2, seed=0):
    return torch.randint(0, VOCAB, (n, T), generator=torch.Generator().manual_seed(seed))


def _model(family, heads=4, kv_heads=2, head_dim=4, layers=2, units=12, seed=0, dtype=torch.float32):
    torch.manual_seed(seed)
    hidden = heads * head_dim
    if family in ("llama", "qwen2", "mistral"):
        config_class = {"llama": transformers.LlamaConfig, "qwen2": transformers.Qwen2Config}.get(
            family, transformers.MistralConfig
        )
        config = config_class(
            hidden_size=hidden, intermediate_size=units, num_hidden_layers=layers, num_attention_heads=heads,
            num_key_value_heads=kv_heads, head_dim=head_dim, vocab_size=VOCAB, max_position_embeddings=T,
        )  # fmt: skip
        model = transformers.AutoModelForCausalLM.from_config(config)
    elif family == "opt":
        config = transformers.OPTConfig(
            vocab_size=VOCAB, hidden_size=hidden, ffn_dim=units, num_hidden_layers=layers, num_attention_heads=heads,
            word_embed_proj_dim=hidden, max_position_embeddings=T,
        )  # fmt: skip
        model = transformers.OPTForCausalLM(config)
    elif family == "gpt_neox":
        config = transformers.GPTNeoXConfig(
            vocab_size=VOCAB, hidden_size=hidden, intermediate_size=units, num_hidden_layers=layers,
            num_attention_heads=heads, max_position_embeddings=T,
        )  # fmt: skip
        model = transformers.GPTNeoXForCausalLM(config)
    elif family == "gpt2":
        config = transformers.GPT2Config(
            vocab_size=VOCAB, n_positions=T, n_embd=hidden, n_layer=layers, n_head=heads, n_inner=units
        )
        model = transformers.GPT2LMHeadModel(config)
    elif family == "distilbert":
        config = transformers.DistilBertConfig(
            vocab_size=VOCAB, dim=hidden, n_layers=layers, n_heads=heads, hidden_dim=units, max_position_embeddings=T
        )
        model = transformers.DistilBertModel(config)
    else:
        config = transformers.BertConfig(
            vocab_size=VOCAB, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
            intermediate_size=units, max_position_embeddings=T,
        )  # fmt: skip
        model = transformers.BertModel(config, add_pooling_layer=False)
    return model.to(dtype).eval()


def _out(model, x):
    out = model(x)
    return out.logits if hasattr(out, "logits") else out.last_hidden_state


def _set_gates(model, seed, p_closed):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, gate in gates_of(model):
            n = gate.num_gates
            closed = torch.rand(n, generator=g) < p_closed
            value = torch.where(closed, torch.full((n,), -9.0), torch.randn(n, generator=g) * 2.0 + 1.0)
            gate.log_alpha.copy_(value.to(gate.log_alpha.dtype))


def _assert_pruned_equals_gated(gated, x):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a non-uniform HF result keeps its config, and says so
        pruned = prune(gated.eval())
    with torch.no_grad():
        a, b = _out(gated, x), _out(pruned, x)
    assert a.shape == b.shape
    assert float((a - b).abs().max()) <= 1e-5 * float(a.abs().max())
    assert network_size(gated).parameters("test") == count_parameters(pruned)
    return pruned


# --------------------------------------------------------------------------------------------- properties


@pytest.mark.parametrize("examples", PROFILES)
def test_pruned_equals_gated_for_every_family_and_gate_pattern(examples):
    @_profile(examples)
    @given(
        family=st.sampled_from(FAMILIES),
        heads=st.sampled_from([2, 4]),
        groups=st.sampled_from([1, 2]),
        head_dim=st.sampled_from([2, 4]),
        layers=st.integers(1, 2),
        units=st.integers(1, 12),
        seed=st.integers(0, 2**16),
        p_closed=st.sampled_from([0.0, 0.3, 0.7, 1.0]),
    )
    def prop(family, heads, groups, head_dim, layers, units, seed, p_closed):
        grouped = family in ("llama", "qwen2", "mistral")
        kv_heads = heads // groups if grouped else heads
        model = _model(family, heads, kv_heads, head_dim, layers, units, seed)
        gated = sparsify_transformer(model, example_inputs=_ids())
        r = gated._l0_transformer[0]
        assert (r.num_heads, r.groups, r.head_dim) == (heads, kv_heads, head_dim)
        _set_gates(gated, seed, p_closed)
        pruned = _assert_pruned_equals_gated(gated, _ids(3, seed=seed % 97))
        if grouped:  # every kept attention stays a valid layout: as many query heads per key-value head
            for layer in pruned.model.layers:
                attn = layer.self_attn
                if hasattr(attn, "q_proj"):
                    assert attn.q_proj.out_features == attn.k_proj.out_features * (heads // kv_heads)

    prop()


@pytest.mark.parametrize("examples", PROFILES)
def test_fixed_architecture_is_reached_exactly_and_uniformly(examples):
    @_profile(examples)
    @given(
        family=st.sampled_from(("llama", "qwen2", "mistral")),
        keep_groups=st.integers(1, 2),
        units=st.integers(1, 12),
        seed=st.integers(0, 2**16),
    )
    def prop(family, keep_groups, units, seed):
        gated = sparsify_transformer(_model(family, 4, 2, 4, 2, 12, seed), example_inputs=_ids())
        _set_gates(gated, seed, 0.5)
        fix_architecture(gated, num_key_value_heads=keep_groups, intermediate_size=units)
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # uniform: the config is updated, no warning
            pruned = prune(gated.eval())
        assert (pruned.config.num_key_value_heads, pruned.config.num_attention_heads) == (keep_groups, 2 * keep_groups)
        assert pruned.config.intermediate_size == units
        for layer in pruned.model.layers:
            assert layer.self_attn.k_proj.out_features == 4 * keep_groups
            assert layer.mlp.down_proj.in_features == units
        with torch.no_grad():
            a, b = _out(gated, _ids(2, 5)), _out(pruned, _ids(2, 5))
        assert float((a - b).abs().max()) <= 1e-5 * float(a.abs().max())

    prop()


class _Wrapped(nn.Module):
    """A Hugging Face model inside a module of your own."""

    def __init__(self, lm):
        super().__init__()
        self.lm = lm

    def forward(self, ids):
        return self.lm(ids)


@pytest.mark.parametrize("examples", PROFILES)
def test_save_pretrained_round_trips_or_refuses_saying_why(examples):
    """Whatever the gates (random, or fixed to the same sizes in every block), alone or inside a module of your
    own: the pruned Hugging Face model's config describes it and save_pretrained / from_pretrained rebuild it with
    the gated model's outputs, or prune warns and its save_pretrained raises a ValueError naming save_pruned and
    what the config describes, writing nothing."""
    import tempfile
    from pathlib import Path

    @_profile(examples)
    @given(
        family=st.sampled_from((*FAMILIES, "distilbert")),
        seed=st.integers(0, 2**16),
        p_closed=st.sampled_from([0.0, 0.3]),
        uniform=st.one_of(st.none(), st.tuples(st.sampled_from([2, 4]), st.integers(1, 12))),
        wrap=st.booleans(),
    )
    def prop(family, seed, p_closed, uniform, wrap):
        model = _model(family, seed=seed)
        gated = sparsify_transformer(_Wrapped(model) if wrap else model, example_inputs=_ids())
        _set_gates(gated, seed, p_closed)
        if uniform is not None:
            fix_architecture(gated, num_attention_heads=uniform[0], intermediate_size=uniform[1])
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            pruned = prune(gated.eval())
        hf = pruned.lm if wrap else pruned
        refused = [w for w in caught if "keeps its original config" in str(w.message)]
        with tempfile.TemporaryDirectory() as tmp:
            folder = Path(tmp) / "model"
            if refused:
                with pytest.raises(ValueError, match="save_pretrained: .*save_pruned.* describes the same sizes"):
                    hf.save_pretrained(folder)
                assert not folder.exists()
                return
            hf.save_pretrained(folder)
            loaded = type(hf).from_pretrained(folder, **({"add_pooling_layer": False} if family == "bert" else {}))
        with torch.no_grad():
            a, b = _out(gated, _ids(2, 5)), _out(loaded.eval(), _ids(2, 5))
        assert float((a - b).abs().max()) <= 1e-5 * float(a.abs().max())

    prop()


@pytest.mark.parametrize("examples", PROFILES)
def test_block_gates_prune_exactly_for_every_family(examples):
    """depth=True: a gate per block; random patterns of every gate. The blocks whose block gate or every branch
    closes are removed (BERT's post-norm layers cannot be: a ValueError naming depth=True); the pruned model equals
    the gated one, and its parameter count is the exact count, norms of the removed blocks left out."""

    @_profile(examples)
    @given(
        family=st.sampled_from(FAMILIES),
        layers=st.integers(1, 3),
        seed=st.integers(0, 2**16),
        p_closed=st.sampled_from([0.0, 0.3, 0.6]),
    )
    def prop(family, layers, seed, p_closed):
        model = _model(family, 4, 2, 4, layers, 8, seed)
        if family == "bert":
            with pytest.raises(ValueError, match="depth=True: block 'encoder.layer.0' cannot be removed"):
                sparsify_transformer(model, example_inputs=_ids(), depth=True)
            return
        gated = sparsify_transformer(model, example_inputs=_ids(), depth=True)
        _set_gates(gated, seed, p_closed)
        alive = 0
        for r in gated._l0_transformer:
            block = gated.get_submodule(r.name)
            branches = [bool(block.get_submodule(k).gate.active()) for k in ("l0_attention", "l0_mlp")]
            alive += bool(block.l0_block.gate.active()) and any(branches)
        pruned = _assert_pruned_equals_gated(gated, _ids(3, seed=seed % 89))
        assert sum(p.numel() for p in pruned.parameters()) == network_size(gated).parameters("test")
        layer_list = [m for n, m in pruned.named_modules() if n.endswith(("layers", ".h"))]
        assert len(layer_list[0]) == alive

    prop()


@pytest.mark.parametrize("examples", PROFILES)
def test_fixed_architecture_with_fewer_blocks_round_trips(examples):
    """fix_architecture with num_hidden_layers: the kept blocks are the best-ranked block gates, the config says so,
    and a model built from the config and loaded with the pruned state dict gives the same logits."""

    @_profile(examples)
    @given(
        family=st.sampled_from(("llama", "qwen2", "mistral")),
        keep_layers=st.integers(1, 3),
        keep_groups=st.integers(1, 2),
        units=st.integers(1, 12),
        seed=st.integers(0, 2**16),
    )
    def prop(family, keep_layers, keep_groups, units, seed):
        gated = sparsify_transformer(_model(family, 4, 2, 4, 3, 12, seed), example_inputs=_ids(), depth=True)
        _set_gates(gated, seed, 0.5)
        ranks = torch.stack([layer.l0_block.gate.log_alpha.detach()[0] for layer in gated.model.layers])
        top = sorted(torch.topk(ranks, keep_layers).indices.tolist())
        norms = [gated.model.layers[i].input_layernorm.weight.detach().clone() for i in top]
        fix_architecture(gated, num_key_value_heads=keep_groups, intermediate_size=units, num_hidden_layers=keep_layers)
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # uniform: the config is updated, no warning
            pruned = prune(gated.eval())
        config = pruned.config
        assert (config.num_hidden_layers, config.num_key_value_heads, config.intermediate_size) == (
            keep_layers, keep_groups, units,
        )  # fmt: skip
        assert all(torch.equal(a.input_layernorm.weight, b) for a, b in zip(pruned.model.layers, norms, strict=True))
        fresh = type(pruned)(config).eval()
        fresh.load_state_dict(pruned.state_dict())
        with torch.no_grad():
            a, b = _out(gated, _ids(2, 5)), _out(fresh, _ids(2, 5))
        assert float((a - b).abs().max()) <= 1e-5 * float(a.abs().max())

    prop()


ODD_TARGETS = st.one_of(
    st.sampled_from(KEYS).flatmap(
        lambda k: st.one_of(st.integers(-2, 0), st.floats(0.5, 3.0), st.just("2"), st.just(True)).map(lambda v: {k: v})
    ),
    st.just({}),
    st.just({"hidden_size": 8}),
    st.just({"num_heads": 2}),
    st.just([("intermediate_size", 4)]),
    st.just(4),
    st.just({"num_key_value_heads": 3}),
    st.just({"num_attention_heads": 3}),
    st.just({"num_attention_heads": 2, "num_key_value_heads": 2}),
    st.just({"intermediate_size": 13}),
    st.just({"num_hidden_layers": 3}),
)


@pytest.mark.parametrize("examples", PROFILES)
def test_odd_target_architectures_are_clear_errors(examples):
    """Every odd target_architecture (a wrong kind, a size the blocks do not have, layers without block gates) is a
    TypeError or ValueError that names target_architecture, before any training step."""
    from l0bayes.inference import Constrained
    from l0bayes.models import SparseModel

    model = SparseModel(sparsify_transformer(_model("llama"), example_inputs=_ids()), lambda out, y: out.logits.sum())

    @_profile(examples)
    @given(target=ODD_TARGETS)
    def prop(target):
        with pytest.raises((TypeError, ValueError), match="target_architecture"):
            Constrained(target_architecture=target).build(model, 8)

    prop()


ODD_BLOCKS = st.one_of(
    st.integers(-3, 9).map(lambda i: [i]),
    st.sampled_from(["model.layers.0", "layers.0", ""]),
    st.just([]),
    st.just([None]),
    st.just([1.5]),
    st.just({"a": 1}),
    st.just(7),
    st.sampled_from([["nope"], ["model.layers.9"], ["model.norm"]]),
)


@pytest.mark.parametrize("examples", PROFILES)
def test_odd_blocks_are_clear_errors(examples):
    model = _model("llama")

    @_profile(examples)
    @given(blocks=ODD_BLOCKS)
    def prop(blocks):
        with pytest.raises((TypeError, ValueError), match=r"blocks|model\.|no attention|Block"):
            sparsify_transformer(model, blocks, example_inputs=_ids())

    prop()


ODD_INPUTS = st.one_of(
    st.just([[1, 2, 3]]),
    st.just("hello"),
    st.just(()),
    st.just(torch.tensor(3)),
    st.just(torch.zeros(0, T, dtype=torch.long)),
    st.just(torch.randn(2, T)),
    st.just(torch.full((2, T), VOCAB + 5)),
    st.just((torch.zeros(2, T, dtype=torch.long), "mask")),
    st.just({"input_ids": torch.zeros(2, T, dtype=torch.long)}),
)


@pytest.mark.parametrize("examples", PROFILES)
def test_odd_example_inputs_are_clear_errors(examples):
    model = _model("llama")

    @_profile(examples)
    @given(example_inputs=ODD_INPUTS)
    def prop(example_inputs):
        with pytest.raises((TypeError, ValueError), match="example_inputs"):
            sparsify_transformer(model, example_inputs=example_inputs)

    prop()


# ------------------------------------------------------------------------------------------- fixed cases


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_gates_take_the_models_dtype_and_prune_checks_in_its_precision(dtype):
    """float64 model: float64 gates (were float32), and prune's check no longer reports a false mismatch (a float32
    gate folded into float64 weights differed by 1e-8 from the float64 gated model)."""
    gated = sparsify_transformer(_model("llama", dtype=dtype), example_inputs=_ids())
    assert {g.log_alpha.dtype for _, g in gates_of(gated)} == {dtype}
    _set_gates(gated, 3, 0.3)
    _assert_pruned_equals_gated(gated, _ids(2, 4))


def test_blocks_given_as_one_name_or_an_int_are_clear_errors():
    model = _model("llama")
    with pytest.raises(TypeError, match=r"blocks must be a list .*blocks=\['model.layers.0'\]"):
        sparsify_transformer(model, "model.layers.0", example_inputs=_ids())
    with pytest.raises(TypeError, match="blocks: every entry must be a block name .* got 5"):
        sparsify_transformer(model, [5], example_inputs=_ids())
    with pytest.raises(ValueError, match="blocks: no module named 'layers.0'"):
        sparsify_transformer(model, ["layers.0"], example_inputs=_ids())
    with pytest.raises(ValueError, match="num_kv_heads must be a positive int"):
        sparsify_transformer(model, [Block("model.layers.0", num_kv_heads=0)], example_inputs=_ids())


def test_odd_example_inputs_name_the_argument():
    model = _model("llama")
    with pytest.raises(TypeError, match=r"example_inputs must be a tensor .* got list"):
        sparsify_transformer(model, example_inputs=[[1, 2]])
    with pytest.raises(ValueError, match=r"example_inputs must have a batch dimension .* shape \(\)"):
        sparsify_transformer(model, example_inputs=torch.tensor(3))
    with pytest.raises(ValueError, match=r"example_inputs: the model does not run on them"):
        sparsify_transformer(model, example_inputs=torch.randn(2, T))
    with pytest.raises(TypeError, match=r"example_inputs\[1\] must be a tensor"):
        sparsify_transformer(model, example_inputs=(_ids(), "mask"))
    with pytest.raises(TypeError, match="may_remove_all must be True or False"):
        sparsify_transformer(model, example_inputs=_ids(), may_remove_all="yes")


def test_fix_architecture_arguments_are_checked():
    gated = sparsify_transformer(_model("llama"), example_inputs=_ids())
    with pytest.raises(ValueError, match="intermediate_size must be a positive int, got 0"):
        fix_architecture(gated, intermediate_size=0)
    with pytest.raises(ValueError, match="num_key_value_heads=3: block model.layers.0 has 2"):
        fix_architecture(gated, num_key_value_heads=3)
    with pytest.raises(ValueError, match="num_attention_heads=4 and num_key_value_heads=1 disagree"):
        fix_architecture(gated, num_attention_heads=4, num_key_value_heads=1)
    with pytest.raises(ValueError, match="needs a model of sparsify_transformer"):
        fix_architecture(_model("llama"), intermediate_size=2)


@pytest.mark.parametrize(
    ("gate_kwargs", "error", "message"),
    [
        (
            {"init_drop_rate": "0.5"},
            TypeError,
            r"init_drop_rate must be a probability strictly between 0 and 1, got str",
        ),
        ({"init_drop_rate": True}, TypeError, "init_drop_rate must be a probability .* got the bool True"),
        ({"init_drop_rate": 1.0}, ValueError, "init_drop_rate must be a probability strictly between 0 and 1, got 1.0"),
        ({"init_drop_rate": torch.tensor([0.2, 0.3])}, TypeError, r"init_drop_rate must be one number .* shape \(2,\)"),
        ({"temperature": "1"}, TypeError, "temperature must be a finite number > 0"),
        ({"lower": 0.1}, ValueError, "lower must be a finite number < 0"),
        ({"init_std": -1.0}, ValueError, "init_std must be a finite number >= 0"),
        ({"drop_rate": 0.5}, TypeError, r"unknown gate arguments \['drop_rate'\]; the gate arguments are"),
        ({"inplace": "no"}, TypeError, "inplace must be True or False, got 'no'"),
    ],
)
def test_gate_arguments_are_checked_at_the_entry(gate_kwargs, error, message):
    """init_drop_rate='0.5' crashed deep in the gates ('<' between float and str); inplace='no' gated the model
    itself."""
    model = _model("llama")
    with pytest.raises(error, match=message):
        sparsify_transformer(model, example_inputs=_ids(), **gate_kwargs)
    assert not gates_of(model)


def test_numpy_scalar_gate_arguments_are_the_python_numbers():
    import numpy as np

    gated = sparsify_transformer(_model("llama"), example_inputs=_ids(), init_drop_rate=np.float32(0.25))
    reference = sparsify_transformer(_model("llama"), example_inputs=_ids(), init_drop_rate=0.25)
    means = [float(g.log_alpha.detach().mean()) for m in (gated, reference) for _, g in gates_of(m)[:1]]
    assert means[0] == pytest.approx(means[1], abs=0.05)  # both near logit(0.75) = log 3
    assert means[0] == pytest.approx(math.log(3.0), abs=0.05)


def test_sparsify_checks_its_gate_arguments_too():
    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
    with pytest.raises(TypeError, match="sparsify: init_drop_rate must be a probability .* got str '0.5'"):
        sparsify(model, init_drop_rate="0.5")
    with pytest.raises(TypeError, match=r"sparsify: unknown gate arguments \['foo'\]"):
        sparsify(model, foo=1)
    with pytest.raises(TypeError, match="sparsify: inplace must be True or False"):
        sparsify(model, inplace=1)
    with pytest.raises(TypeError, match=r"sparsify: groups must be a dict \{name: Group\(...\)\}"):
        sparsify(model, groups=[Group(["0"])])
    with pytest.raises(ValueError, match="group 'g': dim must be a nonzero int"):
        sparsify(model, groups={"g": Group(["0"], dim=0)})
    assert not gates_of(model)


@pytest.mark.parametrize(
    ("example_inputs", "error", "message"),
    [
        (
            torch.zeros(2, 5),
            ValueError,
            r"example_inputs: the model does not run on them .*\[\(\(2, 5\), 'float32'\)\]",
        ),
        ("x", TypeError, "example_inputs must be a tensor .* got str"),
        (torch.full((2, 5), 999), ValueError, r"example_inputs: the model does not run on them \(IndexError"),
        ((_ids(), "mask"), TypeError, r"example_inputs\[1\] must be a tensor"),
    ],
)
def test_prune_blames_example_inputs_the_gated_model_does_not_take(example_inputs, error, message):
    """Float token ids were blamed on the attention's head count; a string was an AttributeError; ids beyond the
    vocabulary torch's IndexError. The gated model runs on them first: its failure is example_inputs'."""
    gated = sparsify_transformer(_model("llama"), example_inputs=_ids())
    with pytest.raises(error, match=message):
        prune(gated, example_inputs=example_inputs)
    _assert_pruned_equals_gated(gated, _ids(2, 1))  # the stored inputs still serve


def test_a_pruned_model_that_does_not_run_is_the_prunings_error(monkeypatch):
    """Only a failure of the pruned model, after the gated one ran, is reported as the pruning's."""
    from l0bayes.pruning.transformer import prune as prune_module

    gated = sparsify_transformer(_model("llama"), example_inputs=_ids())
    original = prune_module._remove_blocks

    def broken(plain, resolved, removed):
        kept = original(plain, resolved, removed)
        plain.model.layers[0].self_attn.o_proj = nn.Linear(3, 3)  # a width the attention's output does not have
        return kept

    monkeypatch.setattr(prune_module, "_remove_blocks", broken)
    warnings.simplefilter("ignore")  # (within pytest's per-test catch) a pruned model of mixed sizes keeps its config
    with pytest.raises(
        ValueError, match=r"the pruned model does not run \(RuntimeError: .*\) where the gated one does"
    ):
        prune(gated)
