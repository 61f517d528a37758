"""experiments/constrained.py: every run measured on its pruned network, the FLOP targets, the summary tables."""

import importlib.util
import json
import math
import pathlib
import sys

import pytest
import torch

from l0bayes.inference import Constrained
from l0bayes.nn import gates_of
from l0bayes.pruning import count_parameters, flops, prune

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _script():
    sys.path.insert(0, str(ROOT / "experiments"))  # the script imports its neighbour `_common`
    try:
        spec = importlib.util.spec_from_file_location("constrained", ROOT / "experiments" / "constrained.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(ROOT / "experiments"))
    return module


def _check_against_pruned(script, out, name, x_test, y_test):
    """The run's numbers recomputed from ``prune()`` of its saved network."""
    run = json.loads((out / f"{name}.json").read_text())
    final, settings = run["final"], run["settings"]
    net, _ = script.load_net(out, name)
    pruned = prune(net, torch.zeros((1, *settings["input_shape"])))
    shape = tuple(settings["input_shape"])
    assert final["params_fraction"] == count_parameters(pruned) / count_parameters(net)
    assert final["flops_fraction"] == flops(pruned, shape) / flops(net, shape)
    with torch.no_grad():
        wrong = int((pruned(x_test).argmax(-1) != y_test).sum())
        assert final["test_error"] == final["test_error_gated"] == wrong / len(y_test)
        assert final["emptied"] == [n for n, g in gates_of(net) if not (g.deterministic() > 0).any()]
    assert final["wall_s"] > 0 and final["architecture"] and final["pruned_sizes"]
    assert [r["epoch"] for r in run["history"]] == list(range(1, settings["epochs"] + 1))
    return run


def test_runs_record_the_pruned_network(tmp_path, capsys):
    from l0bayes.data import load_dataset

    script = _script()
    out = tmp_path / "runs"
    argv = ["--data", "digits", "--epochs", "2", "--train-subset", "500", "--out", str(out)]
    script.main([*argv, "--targets", "0.3", "--lam", "0.3"])
    data = load_dataset("digits", seed=0)
    for name in ("mlp-cmodel0.3-n500-s0", "mlp-lam0.3-n500-s0"):
        run = _check_against_pruned(script, out, name, data.x_test, data.y_test)
        assert run["settings"]["n_train"] == 500 and run["settings"]["train_subset"] == 500
    constrained = json.loads((out / "mlp-cmodel0.3-n500-s0.json").read_text())
    assert constrained["settings"]["target_kind"] == "density"
    assert constrained["final"]["constrained_summary"]["target_density"] == 0.3
    # a run whose file exists is skipped
    before = (out / "mlp-lam0.3-n500-s0.json").read_text()
    script.main([*argv, "--lam", "0.3"])
    assert "mlp-lam0.3-n500-s0: exists, skipped" in capsys.readouterr().out
    assert (out / "mlp-lam0.3-n500-s0.json").read_text() == before
    script.main(["--out", str(out), "--summarize-only"])
    printed = capsys.readouterr().out
    assert "| mlp-cmodel0.3-n500 | density | 0.3 | 1 |" in printed
    assert "| mlp-lam0.3-n500 | penalised | lam 0.3 | 1 |" in printed
    assert "against the penalised objective at the same params fraction" in printed


def test_resnet_is_sparsified_trained_and_pruned(tmp_path):
    from l0bayes.data import load_dataset

    script = _script()
    out = tmp_path / "runs"
    script.main(["--data", "digits", "--model", "resnet", "--width", "4", "--epochs", "1", "--targets", "0.5",
                 "--out", str(out)])  # fmt: skip
    data = load_dataset("digits", seed=0)
    run = _check_against_pruned(script, out, "resnet-cmodel0.5-s0", data.x_test, data.y_test)
    # every Conv2d and Linear is gated by default: stem, 2 convs per block, 2 shortcuts, the head
    assert len(run["final"]["open_gates"]) == 1 + 2 * 3 + 2 + 1
    assert "expected_flops" in run["history"][-1]


def test_flop_targets_reach_train(tmp_path, monkeypatch):
    script = _script()
    seen = []
    real_train = script.train

    def train_with_flops(model, x, y, *, objective, **kwargs):
        seen.append((objective, tuple(x.shape[1:])))  # the FLOPs are counted for the shape of the examples
        return real_train(model, x, y, objective="penalized", **kwargs)

    monkeypatch.setattr(script, "train", train_with_flops)
    out = tmp_path / "runs"
    script.main(["--data", "digits", "--epochs", "1", "--target-flops", "0.25", "--out", str(out)])
    assert seen == [(Constrained(target_flops=0.25), (1, 8, 8))]
    run = json.loads((out / "mlp-cflops0.25-s0.json").read_text())
    assert run["settings"]["target_kind"] == "flops" and run["settings"]["target"] == 0.25
    (row,) = script.summary_rows(script.load_runs(out))
    assert row["kind"] == "flops" and row["off"] == pytest.approx(abs(run["final"]["flops_fraction"] - 0.25))


def test_flop_targets_need_a_constrained_objective_that_takes_them(tmp_path, monkeypatch, capsys):
    script = _script()

    class DensityOnly:  # a version of the constrained objective without FLOP targets
        def __init__(self, target_density=None, *, per_layer=False):
            raise AssertionError("no run should start")

    def train(*args, **kwargs):
        raise AssertionError("no run should start")

    monkeypatch.setattr(script, "Constrained", DensityOnly)
    monkeypatch.setattr(script, "train", train)
    with pytest.raises(SystemExit):
        script.main(["--data", "digits", "--target-flops", "0.25", "--targets", "0.3", "--out", str(tmp_path / "r")])
    assert "has no target_flops argument" in capsys.readouterr().err


def _run(name, objective, seed, params, error, target=None, lam=0.1, kind="density", flops_fraction=None, emptied=()):
    settings = {"data": "digits", "model": "mlp", "objective": objective, "target": target, "lam": lam,
                "target_kind": kind if objective == "constrained" else None, "per_layer": False, "seed": seed,
                "epochs": 100, "lr": 0.01, "batch_size": 100, "variant": {}, "train_subset": None}  # fmt: skip
    final = {"params_fraction": params, "flops_fraction": params if flops_fraction is None else flops_fraction,
             "test_error": error, "gate_density": params, "architecture": "1-2-3",
             "emptied": list(emptied)}  # fmt: skip
    return {"name": f"{name}-s{seed}", "settings": settings, "final": final}


def test_interpolation_in_log_fraction_between_the_bracketing_lambdas():
    script = _script()
    # the penalised error halfway (in log fraction) between 0.2 and 0.8 is halfway between the errors
    assert script.interpolate([(0.8, 0.02, "a"), (0.2, 0.10, "b")], 0.4)[0] == pytest.approx(0.06)
    assert script.interpolate([(0.8, 0.02, "a"), (0.2, 0.10, "b")], 0.1) is None
    at = 0.3
    expected = 0.10 + (math.log(at) - math.log(0.2)) / (math.log(0.8) - math.log(0.2)) * (0.02 - 0.10)
    assert script.interpolate([(0.9, 0.01, "c"), (0.8, 0.02, "a"), (0.2, 0.10, "b")], at)[0] == pytest.approx(expected)
    runs = [
        _run("mlp-lam0.1", "penalized", 0, 0.7, 0.01),
        _run("mlp-lam0.1", "penalized", 1, 0.9, 0.03),
        _run("mlp-lam1", "penalized", 0, 0.1, 0.12, lam=1.0),
        _run("mlp-lam1", "penalized", 1, 0.3, 0.08, lam=1.0, emptied=["fc2.gate"]),
        _run("mlp-lam1", "penalized", 2, 0.9, 0.9, lam=1.0),  # a seed the constrained runs do not have: left out
        _run("mlp-cmodel0.4", "constrained", 0, 0.39, 0.05, target=0.4),
        _run("mlp-cmodel0.4", "constrained", 1, 0.41, 0.07, target=0.4),
        _run("mlp-cmodel0.05", "constrained", 0, 0.05, 0.3, target=0.05),
        _run("mlp-cflops0.5", "constrained", 0, 0.3, 0.04, target=0.5, kind="flops", flops_fraction=0.4),
    ]
    rows = script.summary_rows(runs)
    by_group = {r["group"]: r for r in rows}
    assert by_group["mlp-cmodel0.4"]["off"] == pytest.approx(0.01)
    assert by_group["mlp-lam1"]["emptied"] == [(1, ["fc2.gate"])]
    assert by_group["mlp-cflops0.5"]["off"] == pytest.approx(0.1)  # against the FLOP fraction
    table = "\n".join(script.comparison(rows, "density", "params"))
    # mean params fraction 0.4 between lam 1 (0.2, 10%) and lam 0.1 (0.8, 2%) over seeds 0 and 1: 6%
    assert "| mlp-cmodel0.4 | 0.4 | 2 | 0.400 ± 0.014 | 6.00 ± 1.41 | 6.00 | +0.00 |" in table
    assert (
        "lam 1: 10.00 ± 2.83% at 0.200 (emptied layers in 1 of 2)" in table
        and "lam 0.1: 2.00 ± 1.41% at 0.800" in table
    )
    assert "| mlp-cmodel0.05 | 0.05 | 1 | 0.050 ± 0.000 | 30.00 ± 0.00 | outside the grid (0.100-0.700) |" in table
    flop_table = "\n".join(script.comparison(rows, "flops", "flops"))
    assert "| mlp-cflops0.5 | 0.5 | 1 | 0.400 ± 0.000 | 4.00 ± 0.00 |" in flop_table
    assert "mlp-cmodel" not in flop_table
