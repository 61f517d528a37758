"""experiments/char_gpt.py on tiny settings: the runs, their numbers checked against prune(), skipping, the table."""

import importlib.util
import json
import pathlib
import sys

import pytest
import torch

from l0bayes.pruning import count_parameters, flops_per_token, prune, sparsify_transformer

ROOT = pathlib.Path(__file__).resolve().parents[1]
TINY = [
    "--layers", "2", "--d-model", "16", "--heads", "2", "--context", "16", "--steps", "6", "--epochs", "3",
    "--batch", "4", "--val-windows", "8", "--repeats-1", "2", "--repeats-32", "1", "--val-every", "3",
    "--modules", "abc", "bisect", "colorsys", "getopt", "keyword", "sched",
]  # fmt: skip


def _script():
    sys.path.insert(0, str(ROOT / "experiments"))  # the script imports its neighbour `_common`
    try:
        spec = importlib.util.spec_from_file_location("char_gpt", ROOT / "experiments" / "char_gpt.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(ROOT / "experiments"))
    return module


def test_text_is_split_by_file_and_encoded():
    script = _script()
    train, val, info = script.stdlib_text(["keyword", "abc", "bisect"], val_every=2)
    assert [f["module"] for f in info["files"]] == ["abc", "bisect", "keyword"]
    assert [f["split"] for f in info["files"]] == ["val", "train", "val"]
    sizes = [f["bytes"] for f in info["files"]]
    assert len(train) == info["train_bytes"] == sizes[1]
    assert len(val) == info["val_bytes"] == sizes[0] + 1 + sizes[2]  # the files joined by a newline
    ids = script.encode(b"a\x80\n")
    assert ids.tolist() == [97, 0, 10]
    with pytest.raises(FileNotFoundError, match="no_such_module.py"):
        script.stdlib_text(["abc", "no_such_module"])


def test_scratch_model_matches_the_target_size():
    script = _script()
    config = {"n_layer": 4, "d_model": 128, "n_head": 4, "head_dim": 32, "d_ff": 512, "context": 64}
    dense = count_parameters(script.GPT(**config))
    for fraction in (0.5, 0.25):
        heads, d_ff = script.scratch_config(config, fraction)
        small = count_parameters(script.GPT(**{**config, "n_head": heads, "d_ff": d_ff}))
        assert small / dense == pytest.approx(fraction, abs=0.01)


@pytest.mark.filterwarnings("ignore:constrained")  # six steps: the Lagrangian does not arrive
def test_runs_are_measured_on_the_pruned_model(tmp_path, capsys):
    script = _script()
    out = tmp_path / "runs"
    assert script.main([*TINY, "--targets", "0.5", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    names = sorted(p.stem for p in out.glob("*.json"))
    assert names == ["c0.5-s0", "dense-s0", "protocol", "scratch0.5-s0", "scratch0.5-short-s0"]
    run = json.loads((out / "c0.5-s0.json").read_text())
    final, config = run["final"], run["settings"]["config"]
    # the recorded numbers are those of prune() of the saved gated model
    gated = sparsify_transformer(script.GPT(**config), example_inputs=torch.zeros(1, 16, dtype=torch.long))
    gated.load_state_dict(torch.load(out / "weights" / "c0.5-s0.pt", weights_only=True))
    pruned = prune(gated.eval())
    dense = script.GPT(**config)
    x = torch.zeros(1, 16, dtype=torch.long)
    assert final["params_fraction"] == count_parameters(pruned) / count_parameters(dense)
    assert final["params_fraction"] <= 0.5 and final["params_fraction"] == pytest.approx(final["params_fraction_size"])
    assert final["flops_fraction"] == flops_per_token(pruned, x) / flops_per_token(dense, x)
    assert set(final["speedup"]) == {"1", "32"} and all(v["speedup"] > 0 for v in final["speedup"].values())
    assert len(final["heads"]) == 2 and all(len(row) == 2 for row in final["heads"])
    scratch = json.loads((out / "scratch0.5-s0.json").read_text())
    assert 0.3 < scratch["final"]["params_fraction"] < 0.7
    short = json.loads((out / "scratch0.5-short-s0.json").read_text())
    settings = run["settings"]
    assert scratch["settings"]["scratch_steps"] == settings["steps"] + settings["prune_steps"]
    assert short["settings"]["scratch_steps"] == settings["prune_steps"]
    assert "| c0.5 | 1 | " in printed and "| scratch0.5 | 1 | " in printed and "| scratch0.5-short | 1 | " in printed
    # an existing run is skipped; another protocol in the same OUT is refused
    before = (out / "c0.5-s0.json").read_text()
    script.main([*TINY, "--targets", "0.5", "--runs", "constrained", "--out", str(out)])
    assert "c0.5-s0: exists, skipped" in capsys.readouterr().out
    assert (out / "c0.5-s0.json").read_text() == before
    with pytest.raises(SystemExit, match="other prune_steps, steps:"):
        steps = TINY.index("--steps") + 1
        script.main([*TINY[:steps], "7", *TINY[steps + 1 :], "--out", str(out)])
    # the speed-ups again from the saved weights (into speed.json, which the table then reads)
    assert script.main(["--out", str(out), "--measure-speed", "--repeats-1", "2", "--repeats-32", "1"]) == 0
    speed = json.loads((out / "speed.json").read_text())
    assert set(speed) == {"c0.5-s0"} and speed["c0.5-s0"]["32"]["speedup"] > 0
    s32 = speed["c0.5-s0"]["32"]["speedup"]
    assert f"| {s32:.3f} | {s32 * final['flops_fraction']:.3f} |" in capsys.readouterr().out
    # the table again, and the head map of a pruned run
    assert script.main(["--out", str(out), "--summarize-only"]) == 0
    assert (out / "head_map.png").stat().st_size > 0
