"""benchmarks/bench_smollm2.py end to end on a random tiny Llama (``--tiny``: nothing downloaded or converted), and
its pieces: the data split, the sizes of SmolLM2's blocks, layer dropping and block influence."""

import importlib.util
import json
import pathlib
import sys

import pytest
import torch

transformers = pytest.importorskip("transformers")

ROOT = pathlib.Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def bench():
    sys.path.insert(0, str(ROOT / "benchmarks"))  # the script imports its neighbour `tables`
    try:
        spec = importlib.util.spec_from_file_location(
            "bench_smollm2_under_test", ROOT / "benchmarks" / "bench_smollm2.py"
        )
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    return module


@pytest.mark.slow  # about 8 CPU seconds
def test_every_method_runs_on_a_tiny_llama(bench, tmp_path):
    pytest.importorskip("torch_pruning")  # the peers' (pip install "l0bayes[bench-llm]")
    out = tmp_path / "run"
    record = bench.main(
        ["--tiny", "--out", str(out), "--steps", "2", "--eval-sequences", "2", "--seq-len", "16",
         "--timing-steps", "1", "--timing-repeats", "1", "--calibration-batches", "1", "--threads", "1",
         "--alpha", "0.5", "--hidden-weight", "0.1"]
    )  # fmt: skip
    saved = json.loads((out / "results.json").read_text())
    assert saved["dense_ppl"] == pytest.approx(record["dense_ppl"])
    runs = {r["method"]: r for r in saved["runs"]}
    assert set(runs) == set(bench.METHODS)
    for run in runs.values():
        assert torch.isfinite(torch.tensor([run["ppl"], run["ppl_pruned"]])).all()
    # the same size for every pruned model: half of the blocks' parameters, whole blocks or half the MLP width
    for method in ("ours", "tp-magnitude", "tp-taylor"):
        assert runs[method]["block_parameter_ratio"] == pytest.approx(0.5, abs=0.01), method
    assert runs["tp-magnitude"]["parameters"] == runs["tp-taylor"]["parameters"]
    assert runs["layer-drop"]["block_parameter_ratio"] == 0.5
    assert runs["ours"]["mask_steps"] == 1 and runs["ours"]["steps"] == 2
    assert set(runs["ours"]["throughput"]) == {"batch1", "batch8"}
    assert saved["step_times"]["gated_over_dense"] > 0
    assert "| ours | 1 |" in (out / "results.md").read_text()
    with pytest.raises(SystemExit, match="exists and is not an empty folder"):
        bench.main(["--tiny", "--out", str(out), "--steps", "2"])


def test_the_cut_at_arrival(bench, tmp_path):
    """``--cut arrival`` ends the mask learning after the first step whose expected fractions are all within the
    margin of their targets (a margin of 1 holds at once), and the rest of the steps train the pruned model; with
    a margin of 0 on a tiny run the Lagrangian has not arrived, and the cap (``--mask-fraction``) ends it. ``--alpha
    0`` trains with the causal LM loss alone (no teacher)."""
    common = ["--tiny", "--methods", "ours", "--steps", "6", "--eval-sequences", "2", "--seq-len", "16",
              "--timing-steps", "0", "--timing-repeats", "1", "--threads", "1", "--cut", "arrival",
              "--mask-fraction", "0.5"]  # fmt: skip
    early = bench.main([*common, "--out", str(tmp_path / "early"), "--arrival", "1", "--alpha", "0"])["runs"][0]
    assert early["mask_steps"] == 1 and early["steps"] == 6
    capped = bench.main([*common, "--out", str(tmp_path / "capped"), "--arrival", "0"])["runs"][0]
    assert capped["mask_steps"] == 3


def test_the_cut_when_every_block_is_fixed(bench, tmp_path):
    """``--cut each`` fixes each block's size the step its constraint arrives and prunes once all are: the units of
    every block are then exactly the target's (the expected number is the pruned one, not past it), the pruned
    model starts where the gated one was, and the rest of the steps train it."""
    out = tmp_path / "each"
    run = bench.main(["--tiny", "--methods", "ours", "--steps", "40", "--eval-sequences", "2", "--seq-len", "16",
                      "--timing-steps", "0", "--timing-repeats", "1", "--threads", "1", "--cut", "each",
                      "--mask-fraction", "0.9", "--multiplier-lr", "20", "--gate-lr", "1", "--alpha", "0",
                      "--out", str(out)])["runs"][0]  # fmt: skip
    assert 1 < run["mask_steps"] < 36 and run["steps"] == 40
    assert run["expected_units"] == run["architecture"]["intermediate_size"]
    blocks = len(bench.tiny_model()[0].model.layers)
    assert run["mask_history_last"]["constraints_fixed"] == 2 * blocks  # key-value groups and units of every block


def test_ours_loss(bench):
    """The distillation of ours, or the plain causal LM loss when the teacher has nothing to add."""
    model, _, _ = bench.tiny_model()
    args = bench.parse_args(["--out", "unused", "--alpha", "0"])
    assert bench.distillation(model, args) is bench.causal_lm_loss
    args = bench.parse_args(["--out", "unused", "--alpha", "0", "--hidden-weight", "0.1"])
    assert isinstance(bench.distillation(model, args), bench.Distillation)
    args = bench.parse_args(["--out", "unused", "--alpha", "0.5"])
    assert bench.distillation(model, args).alpha == 0.5


def test_the_data_split(bench):
    training, validation = bench.stdlib_files()
    names = [p.name for p in training]
    assert bench.HELD_BACK not in names and names == sorted(names) and len(names) > 30
    assert all("a" <= n[0].lower() <= "m" for n in names)
    assert all("n" <= p.name[0] <= "z" for p in validation) and not set(names) & {p.name for p in validation}
    stream = torch.arange(1000)
    windows = bench.eval_windows(stream, 8, 100)
    assert windows.shape == (8, 100) and windows[0, 0] == 0 and windows[-1, -1] == 999
    assert (windows[1:, 0] >= windows[:-1, -1]).all()  # not overlapping
    with pytest.raises(SystemExit, match="fewer than --eval-sequences x --seq-len"):
        bench.eval_windows(stream, 11, 100)


def test_smollm2_sizes(bench):
    """SmolLM2-135M's blocks (built on the meta device): half of a block is about its attention and 512 MLP units
    (1,770,624 of 3,540,096 parameters: the norms stay whole)."""
    config = transformers.LlamaConfig(
        hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3,
        vocab_size=49152, tie_word_embeddings=True, head_dim=64,
    )  # fmt: skip
    with torch.device("meta"):
        model = transformers.LlamaForCausalLM(config)
    blocks, group, unit, rest = bench.block_sizes(model)
    assert (blocks, group, unit, rest) == (30 * 3_540_096, 294_912, 1728, 1152)
    assert [bench.half_width(model, g) for g in (3, 2, 1)] == [512, 682, 853]


def test_block_influence_and_layer_dropping(bench, tmp_path):
    model, _, _ = bench.tiny_model()
    ids = torch.randint(0, 257, (2, 12), generator=torch.Generator().manual_seed(0))
    influence = bench.block_influence(model, [ids])
    with torch.no_grad():
        states = model(ids, output_hidden_states=True).hidden_states
    # 1 - cos(input, output) of block 0 (the last hidden state has the final norm applied)
    expected = (1 - torch.nn.functional.cosine_similarity(states[0], states[1], dim=-1)).mean()
    assert influence[0] == pytest.approx(float(expected), rel=1e-5)
    bench.drop_layers(model, [0, 3])
    with torch.no_grad():
        logits = model(ids).logits
    model.save_pretrained(tmp_path)
    loaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert loaded.config.num_hidden_layers == 2
    with torch.no_grad():
        assert torch.allclose(loaded(ids).logits, logits, atol=1e-5)


def test_the_target_warmup(bench, tmp_path):
    """``--target-warmup`` moves the targets down over its steps: the blocks reach the target architecture, and so
    the cut, later than with the target at once (the same run otherwise); the pruned model still has exactly the
    target's units."""

    def run(warmup):
        out = bench.main(["--tiny", "--methods", "ours", "--steps", "40", "--eval-sequences", "2", "--seq-len", "16",
                           "--timing-steps", "0", "--timing-repeats", "1", "--threads", "1", "--cut", "each",
                           "--mask-fraction", "0.9", "--multiplier-lr", "20", "--gate-lr", "1", "--alpha", "0",
                           "--target-warmup", str(warmup), "--out", str(tmp_path / f"w{warmup}")])  # fmt: skip
        return out["runs"][0]

    at_once, warmed = run(0), run(20)
    assert at_once["mask_steps"] < warmed["mask_steps"] < 36 and warmed["steps"] == 40
    assert warmed["expected_units"] == warmed["architecture"]["intermediate_size"]
    with pytest.raises(SystemExit):
        bench.parse_args(["--out", "unused", "--target-warmup", "-1"])


def test_the_importance_prior(bench, tmp_path):
    """``prior-taylor`` and ``prior-activation``: gates set from importance scores at the peers' architecture (every
    key-value group, the MLP width that halves the blocks), cut at step 0 (the cut equals the initialisation's, or
    the run stops), pruned and fine-tuned for every step; the pruned model has the peers' size, and each seed scores
    its own calibration batches, the peers' of that seed."""
    pytest.importorskip("torch_pruning")
    out = tmp_path / "prior"
    record = bench.main(["--tiny", "--methods", "tp-taylor", "prior-taylor", "prior-activation", "--seeds", "0", "1",
                         "--steps", "2", "--eval-sequences", "2", "--seq-len", "16", "--timing-steps", "0",
                         "--timing-repeats", "1", "--calibration-batches", "2", "--threads", "1",
                         "--out", str(out)])  # fmt: skip
    runs = {(r["method"], r["seed"]): r for r in record["runs"]}
    model = bench.tiny_model()[0]
    width = bench.half_width(model, model.config.num_key_value_heads)
    for seed in (0, 1):
        peer = runs["tp-taylor", seed]
        for kind in ("taylor", "activation"):
            run = runs[f"prior-{kind}", seed]
            assert run["importance"] == kind and run["steps"] == 2 and run["cut_is_init"]
            assert run["architecture"] == {"num_key_value_heads": model.config.num_key_value_heads,
                                           "intermediate_size": width}  # fmt: skip
            assert run["parameters"] == peer["parameters"]
            assert run["expected_units_at_init"] == pytest.approx(width, abs=0.01)
            assert 0 <= run["score_cpu_s"] <= run["prune_cpu_s"] <= run["cpu_seconds"]
            assert torch.isfinite(torch.tensor([run["ppl"], run["ppl_pruned"]])).all()
    # the seeds' calibration batches differ (and so may the cut); the held-out windows are the same
    args = bench.parse_args(["--out", "unused", "--seq-len", "16", "--calibration-batches", "2"])
    stream = torch.arange(500)
    assert not torch.equal(bench.calibration_windows(stream, args, 0)[0], bench.calibration_windows(stream, args, 1)[0])
    assert "| prior-taylor | 2 |" in (out / "results.md").read_text()


@pytest.mark.parametrize("cut", ["share", "each"])
def test_masks_from_the_importance_prior(bench, tmp_path, cut):
    """``prior-masks``: the gates of ``prior-taylor``, masks learned from there and cut as ours' are: after
    ``--mask-fraction`` of the steps (share), or once every block's size is fixed (each: from gates whose expected
    size is the target, after the first step); the pruned model has the peers' architecture and the rest of the
    steps fine-tune it."""
    run = bench.main(["--tiny", "--methods", "prior-masks", "--steps", "10", "--eval-sequences", "2", "--seq-len",
                      "16", "--timing-steps", "0", "--timing-repeats", "1", "--calibration-batches", "2", "--threads",
                      "1", "--mask-fraction", "0.4", "--cut", cut, "--out", str(tmp_path / cut)])  # fmt: skip
    run = run["runs"][0]
    model = bench.tiny_model()[0]
    width = bench.half_width(model, model.config.num_key_value_heads)
    assert run["mask_steps"] == (4 if cut == "share" else 1) and run["steps"] == 10
    assert run["architecture"]["intermediate_size"] == width and 0 < run["kept_as_init"] <= 1
    assert run["expected_units_at_init"] == pytest.approx(width, abs=0.01)
    if cut == "each":  # fixed at the first step: the gated model is the pruned one
        assert run["expected_units"] == width
    assert run["prune_cpu_s"] <= run["cpu_seconds"] and torch.isfinite(torch.tensor(run["ppl"]))
