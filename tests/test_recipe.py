"""The library's recipe for "half of every block": the target architecture of a share of the blocks' parameters, and
the stop once the constrained objective has fixed every gate."""

import pytest
import torch

from l0bayes.inference import Constrained, train
from l0bayes.inference.callbacks import StopWhenFixed
from l0bayes.models import SparseClassifier
from l0bayes.nn import L0MLP
from l0bayes.pruning import count_parameters, prune, sparsify_transformer
from l0bayes.pruning.transformer import TargetArchitecture, fix_architecture

transformers = pytest.importorskip("transformers")

HIDDEN, UNITS, LAYERS, HEADS, KV = 48, 96, 4, 6, 2


def _gated(seed=0):
    config = transformers.LlamaConfig(
        hidden_size=HIDDEN, intermediate_size=UNITS, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
        num_key_value_heads=KV, vocab_size=257, max_position_embeddings=64, tie_word_embeddings=True, use_cache=False,
    )  # fmt: skip
    torch.manual_seed(seed)
    model = transformers.LlamaForCausalLM(config).eval()
    return model, sparsify_transformer(model, example_inputs=torch.randint(0, 257, (1, 8)), layers=False)


def _block_parameters(kv_groups, width):
    """A Llama block by hand: q, o for its query heads, k, v for its key-value heads (head_dim 8), three SwiGLU
    matrices per unit, two RMSNorm weights."""
    head_dim, per_group = HIDDEN // HEADS, HEADS // KV
    attention = kv_groups * (2 * per_group + 2) * head_dim * HIDDEN
    return attention + 3 * HIDDEN * width + 2 * HIDDEN


@pytest.mark.parametrize(("share", "kv"), [(0.5, None), (0.5, 1), (0.3, 1), (0.8, 2), (1.0, None)])
def test_the_width_keeps_the_share_nearest_by_a_hand_count(share, kv):
    model, gated = _gated()
    dense = sum(count_parameters(layer) for layer in model.model.layers) / LAYERS
    assert dense == _block_parameters(KV, UNITS)  # the hand count is the model's
    target = TargetArchitecture.share_of_blocks(gated, share, num_key_value_heads=kv)
    groups = kv or KV
    miss = {w: abs(_block_parameters(groups, w) - share * dense) for w in range(1, UNITS + 1)}
    best = min(miss.values())
    assert target.intermediate_size == min(w for w, m in miss.items() if m == best)  # nearest, ties narrower
    assert target.num_key_value_heads == kv


def test_the_pruned_model_has_the_share_it_was_given():
    model, gated = _gated()
    dense = sum(count_parameters(layer) for layer in model.model.layers)
    target = TargetArchitecture.share_of_blocks(gated, 0.5, num_key_value_heads=1)
    fix_architecture(gated, **target.as_dict())
    small = prune(gated)
    kept = sum(count_parameters(layer) for layer in small.model.layers)
    assert small.config.intermediate_size == target.intermediate_size
    assert abs(kept / dense - 0.5) <= 3 * HIDDEN / _block_parameters(KV, UNITS)  # within one unit per block


def test_a_share_no_width_reaches_is_refused_naming_what_to_change():
    _, gated = _gated()
    with pytest.raises(ValueError, match="keep fewer key-value heads"):
        TargetArchitecture.share_of_blocks(gated, 0.05)
    with pytest.raises(ValueError, match=r"share must be a number in \(0, 1\]"):
        TargetArchitecture.share_of_blocks(gated, 1.5)
    with pytest.raises(ValueError, match="sparsify_transformer"):
        TargetArchitecture.share_of_blocks(L0MLP(4, (3,), 2), 0.5)


def _digits_like(n=60):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 6, generator=g)
    return x, (x[:, 0] > 0).long()


@pytest.mark.filterwarnings("ignore:constrained. the gates are fixed:UserWarning")
def test_training_stops_after_the_epoch_that_fixed_the_gates():
    torch.manual_seed(0)
    objective = Constrained(target_density=0.6, final_phase=0.5)
    run = train(SparseClassifier(L0MLP(6, (8,), 2)), *_digits_like(), objective=objective, epochs=10, batch_size=20,
                progress=False, callbacks=[StopWhenFixed()])  # fmt: skip
    fixed = [r["gates_fixed"] for r in run.history]
    assert len(run.history) == 6 and fixed == [False] * 5 + [True]  # the final phase began at epoch 6 of 10
    assert run.history[-1]["stopped_early"] is True


def test_it_needs_an_objective_that_fixes_its_gates():
    with pytest.raises(ValueError, match="objective=Constrained"):
        train(SparseClassifier(L0MLP(6, (8,), 2)), *_digits_like(), objective="penalized", epochs=2,
              progress=False, callbacks=[StopWhenFixed()])  # fmt: skip
