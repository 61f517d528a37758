"""The experiment scripts end to end on a tiny MNIST-format fixture: runs, commands, table and figures."""

import importlib.util
import json
import os
import pathlib
import types

import pytest
from idx_fixtures import write_mnist_dir

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _script(name):
    spec = importlib.util.spec_from_file_location(name, ROOT / "experiments" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _in_process(command, check):
    """``subprocess.run(command, check=True)`` of a ``python -m l0bayes ...`` command, run by its ``main``."""
    import subprocess
    import sys

    from l0bayes.cli import main

    assert command[:3] == [sys.executable, "-m", "l0bayes"] and check
    code = main(command[3:])
    if code != 0:
        raise subprocess.CalledProcessError(code, command)
    return subprocess.CompletedProcess(command, code)


def test_paper_script_runs_the_protocol_and_summarises(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)  # the L0 runs are `python -m l0bayes fit` subprocesses
    data = tmp_path / "mnist"
    write_mnist_dir(data, n_train=60, n_test=30)
    out = tmp_path / "paper"
    paper = _script("paper")
    argv = ["--data", "mnist-dir", "--data-dir", str(data), "--epochs", "2", "--threads", "1", "--out", str(out)]
    assert paper.main([*argv, "--runs", "mlp", "mlp-dense"]) == 0
    printed = capsys.readouterr().out
    commands = json.loads((out / "commands.json").read_text())
    # the paper code's protocol reaches the command line of the L0 run
    for flag in ("--ema 0.999", "--init he", "--log-alpha-range paper", "--lam 0.1", "--epochs 2"):
        assert flag in commands["mlp"], flag
    for name in ("mlp", "mlp-dense"):
        history = json.loads((out / name / "history.json").read_text())
        assert [r["epoch"] for r in history] == [1, 2]
        summary = json.loads((out / name / "summary.json").read_text())
        assert summary["test"] == pytest.approx(history[-1]["test_error"])  # the averaged model is the one reported
        assert f"| {name} | 2 |" in printed
    assert (out / "history.png").stat().st_size > 0
    # the dense baseline is saved as a state dict + layer list (no pickled module) and reproduces its error
    import torch

    from l0bayes.data import load_dataset
    from l0bayes.pruning import load_pruned

    dense, metadata = load_pruned(out / "mlp-dense" / "dense.pt")
    test = load_dataset("mnist-dir", data_dir=data)
    with torch.no_grad():
        error = float((dense(test.x_test).argmax(-1) != test.y_test).double().mean())
    summary = json.loads((out / "mlp-dense" / "summary.json").read_text())
    assert metadata["model"] == "mlp-dense" and error == pytest.approx(summary["test"])
    # a second invocation into the same directory keeps the first one's commands; its run goes through the command
    # line in this process (the subprocess itself was checked above: it adds only an interpreter's start-up)
    monkeypatch.setattr(paper, "subprocess", types.SimpleNamespace(run=_in_process))
    assert paper.main([*argv, "--runs", "mlp-sep", "--ema", "0", "--log-alpha-range", "none", "--init", "torch"]) == 0
    commands = json.loads((out / "commands.json").read_text())
    assert set(commands) == {"mlp", "mlp-dense", "mlp-sep"}
    assert "--ema" not in commands["mlp-sep"] and "--init" not in commands["mlp-sep"]
    assert "--log-alpha-range" not in commands["mlp-sep"]


def test_compare_runs_reads_both_history_formats(tmp_path):
    compare = _script("compare_runs")
    records = [{"epoch": e, "test_error": 0.1, "active_gates": [50 - e, 20, 10], "expected_flops": 1e4} for e in (1, 2)]
    rows = [[1, 0.12, [60, 20, 10], 2e4], [2, 0.11, [55, 20, 10], 1.5e4]]
    (tmp_path / "a.json").write_text(json.dumps(records))
    (tmp_path / "b.json").write_text(json.dumps(rows))
    assert compare.load_history(tmp_path / "b.json") == ([1, 2], [0.12, 0.11], [r[2] for r in rows], [2e4, 1.5e4])
    figure = tmp_path / "cmp.png"
    compare.main([f"cli={tmp_path / 'a.json'}", f"variants={tmp_path / 'b.json'}", "--figure", str(figure)])
    assert os.path.getsize(figure) > 0
    with pytest.raises(SystemExit):
        compare.main([f"x={tmp_path / 'missing.json'}", "--figure", str(figure)])
