"""Run directories of ``l0bayes fit``: refused when used, locked, written atomically; resume and Ctrl-C safety."""

import json
import os
import subprocess
import sys

import pytest
import torch
from idx_fixtures import write_mnist_dir

import l0bayes.inference
from l0bayes._atomic import atomic_write
from l0bayes.cli import main
from l0bayes.cli.rundir import LOCK, OUTPUTS, RunDirectory
from l0bayes.data import load_dataset
from l0bayes.io import save_checkpoint

TINY = ["--hidden", "8,4", "--epochs", "1", "--no-progress", "--threads", "1"]


def _error(capsys, code):
    """The one stderr line of a failed command (no traceback)."""
    err = capsys.readouterr().err
    assert code not in (0, None) and "Traceback" not in err, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("l0bayes: error: "), lines
    return lines[0]


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """One finished run (1 epoch), copied by the tests that change it."""
    out = tmp_path_factory.mktemp("finished") / "run"
    assert main([*TINY, "--out", str(out)]) == 0
    return out


def _copy(src, dst):
    dst.mkdir()
    for name in os.listdir(src):
        (dst / name).write_bytes((src / name).read_bytes())
    return dst


# ---------------------------------------------------------------------------- a used directory


def test_a_finished_run_is_not_replaced(finished, tmp_path, capsys):
    run = _copy(finished, tmp_path / "run")
    before = {n: (run / n).read_bytes() for n in os.listdir(run)}
    line = _error(capsys, main([*TINY, "--lr", "0.02", "--out", str(run)]))
    assert "is not empty" in line and "--resume" in line and "--overwrite" in line
    assert {n: (run / n).read_bytes() for n in os.listdir(run)} == before


def test_overwrite_replaces_the_outputs_and_keeps_other_files(finished, tmp_path, capsys):
    run = _copy(finished, tmp_path / "run")
    (run / "notes.txt").write_text("mine")
    (run / ".history.json.abc123.tmp").write_text("left by a crash")
    old = json.loads((run / "config.json").read_text())
    assert main([*TINY, "--lr", "0.02", "--out", str(run), "--overwrite"]) == 0
    out = capsys.readouterr().out
    assert "--overwrite: removed the earlier run's" in out and "checkpoint.pt" in out
    assert (run / "notes.txt").read_text() == "mine" and not (run / ".history.json.abc123.tmp").exists()
    new = json.loads((run / "config.json").read_text())
    assert old["lr"] == 0.01 and new["lr"] == 0.02
    assert all((run / n).is_file() for n in OUTPUTS)


def test_an_empty_directory_is_fine_and_resume_with_overwrite_is_refused(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    assert main([*TINY, "--out", str(tmp_path / "empty")]) == 0
    capsys.readouterr()
    line = _error(capsys, main(["--resume", "--overwrite", "--out", str(tmp_path / "empty")]))
    assert "--resume" in line and "--overwrite" in line


@pytest.mark.parametrize("kind", ["file", "under-a-file"])
def test_out_on_a_file_or_an_unwritable_path(tmp_path, capsys, kind):
    (tmp_path / "f").write_text("x")
    out = tmp_path / "f" if kind == "file" else tmp_path / "f" / "sub"
    line = _error(capsys, main([*TINY, "--out", str(out)]))
    assert "--out" in line and str(tmp_path / "f") in line
    assert (tmp_path / "f").read_text() == "x"


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0, reason="root may write anywhere")
def test_out_in_a_read_only_directory(tmp_path, capsys):
    parent = tmp_path / "ro"
    parent.mkdir()
    parent.chmod(0o500)
    try:
        line = _error(capsys, main([*TINY, "--out", str(parent / "run")]))
    finally:
        parent.chmod(0o700)
    assert "not writable" in line


# ---------------------------------------------------------------------------- one writer


def test_a_second_fit_into_a_locked_directory_fails_clearly(tmp_path, capsys):
    out = tmp_path / "run"
    holder = RunDirectory(out).open()  # as a running `l0bayes fit` holds it
    try:
        line = _error(capsys, main([*TINY, "--out", str(out)]))
        assert "in use by another l0bayes fit" in line and str(os.getpid()) in line
        assert os.listdir(out) == [LOCK]
    finally:
        holder.close()
    assert main([*TINY, "--out", str(out)]) == 0  # released: the directory is usable again
    capsys.readouterr()
    holder = RunDirectory(out).open(resume=True)  # a running fit in a used directory: "in use", not "not empty"
    try:
        for argv in ([], ["--overwrite"]):
            line = _error(capsys, main([*TINY, "--out", str(out), *argv]))
            assert "in use by another l0bayes fit" in line
        line = _error(capsys, main(["--resume", "--out", str(out), "--no-progress"]))
        assert "in use by another l0bayes fit" in line
    finally:
        holder.close()


def test_the_lock_is_held_across_processes(tmp_path):
    out = tmp_path / "run"
    holder = RunDirectory(out).open()
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "l0bayes", "fit", *TINY, "--out", str(out)], capture_output=True, text=True
        )
    finally:
        holder.close()
    assert proc.returncode == 1 and "in use by another l0bayes fit" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_atomic_write_keeps_the_old_file_when_a_write_fails(tmp_path, monkeypatch):
    path = tmp_path / "summary.json"
    atomic_write(path, "old")

    def fail(*args):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", fail)
    with pytest.raises(OSError, match="disk full"):
        atomic_write(path, "new")
    assert path.read_text() == "old" and os.listdir(tmp_path) == ["summary.json"]


def test_temporary_names_are_unique(tmp_path, monkeypatch):
    seen = []
    real = os.replace

    def record(src, dst):
        seen.append(os.path.basename(src))
        real(src, dst)

    monkeypatch.setattr(os, "replace", record)
    for k in range(3):
        atomic_write(tmp_path / "history.json", str(k))
    assert len(set(seen)) == 3 and all(s.startswith(".history.json.") and s.endswith(".tmp") for s in seen)


# ---------------------------------------------------------------------------- Ctrl-C and stale checkpoints


def _interrupt_before_any_epoch(*args, **kwargs):
    raise KeyboardInterrupt


def test_ctrl_c_never_reports_an_earlier_runs_checkpoint(finished, tmp_path, capsys, monkeypatch):
    run = _copy(finished, tmp_path / "run")
    save_checkpoint(run / "checkpoint.pt", {"epoch": 7, "model": {}})  # an earlier run's, epoch 7
    monkeypatch.setattr(l0bayes.inference, "train", _interrupt_before_any_epoch)
    assert main([*TINY, "--out", str(run), "--overwrite"]) == 130
    err = capsys.readouterr().err
    assert "no epoch finished" in err and "epoch 7" not in err and "--resume" not in err


def test_ctrl_c_ignores_a_checkpoint_it_did_not_write(tmp_path, monkeypatch):
    """The snapshot taken when the directory opens, independent of --overwrite's clean-up."""
    run = RunDirectory(tmp_path / "run").open()
    try:
        assert not run.checkpoint_written_by_this_run()
        save_checkpoint(run.file("checkpoint.pt"), {"epoch": 2})
        assert run.checkpoint_written_by_this_run() and run.checkpoint_epoch() == 2
    finally:
        run.close()
    again = RunDirectory(tmp_path / "run").open(resume=True)
    try:
        assert not again.checkpoint_written_by_this_run()  # present at the start: not this run's
    finally:
        again.close()


def test_ctrl_c_right_after_a_resume(finished, tmp_path, capsys, monkeypatch):
    run = _copy(finished, tmp_path / "run")
    monkeypatch.setattr(l0bayes.inference, "train", _interrupt_before_any_epoch)
    assert main(["--resume", "--out", str(run), "--epochs", "3"]) == 130
    err = capsys.readouterr().err
    assert "no epoch finished since the resume" in err and "epoch 1" in err


# ---------------------------------------------------------------------------- resume


def test_resume_names_every_changed_setting(finished, tmp_path, capsys):
    run = _copy(finished, tmp_path / "run")
    argv = ["--resume", "--out", str(run), "--lr", "0.5", "--objective", "bayes", "--data", "digits", "--seed", "3"]
    line = _error(capsys, main(argv))
    assert "--lr 0.5 (the run has 0.01)" in line and "--objective bayes" in line and "--seed 3" in line
    assert "--data" not in line.split("differs")[0]  # unchanged: not named
    line = _error(capsys, main(["--resume", "--out", str(run), "--model", "lenet5"]))
    assert "--model lenet5 (the run has mlp)" in line


@pytest.mark.parametrize(
    "content",
    [b"{not json", b"[1, 2]", b'{"model": "mlp", "colour": "red"}', b'{"lr": "fast"}', b'{"epochs": 0}'],
    ids=["not-json", "a-list", "unknown-key", "lr-not-a-number", "epochs-0"],
)
def test_corrupt_config_on_resume(finished, tmp_path, capsys, content):
    run = _copy(finished, tmp_path / "run")
    if content.startswith(b'{"lr"') or content.startswith(b'{"epochs"'):
        cfg = json.loads((run / "config.json").read_text())
        cfg.update(json.loads(content))
        content = json.dumps(cfg).encode()
    (run / "config.json").write_bytes(content)
    line = _error(capsys, main(["--resume", "--out", str(run)]))
    assert "config.json" in line


@pytest.mark.parametrize(("key", "value"), [("tensorboard", 5), ("hidden", "x"), ("tensorboard", "")])
def test_a_tampered_setting_is_exit_2_naming_it(finished, tmp_path, capsys, key, value):
    """Each setting of config.json is checked as its option: a wrong one is argparse's exit 2, never a traceback."""
    run = _copy(finished, tmp_path / "run")
    cfg = json.loads((run / "config.json").read_text())
    (run / "config.json").write_text(json.dumps({**cfg, key: value}))
    code = main(["--resume", "--out", str(run)])
    line = _error(capsys, code)
    assert code == 2 and f"config.json: setting {key!r} (--{key})" in line


class _Exploit:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


@pytest.mark.parametrize("kind", ["empty", "truncated", "malicious", "other-model"])
def test_bad_checkpoint_on_resume_is_one_line_naming_the_file(finished, tmp_path, capsys, kind):
    run = _copy(finished, tmp_path / "run")
    path = run / "checkpoint.pt"
    marker = tmp_path / "pwned"
    if kind == "empty":
        path.write_bytes(b"")
    elif kind == "truncated":
        path.write_bytes(path.read_bytes()[:500])
    elif kind == "malicious":
        torch.save({"epoch": 1, "model": _Exploit(str(marker))}, path)
    else:  # config.json edited to another network: the checkpoint does not hold it
        cfg = json.loads((run / "config.json").read_text())
        (run / "config.json").write_text(json.dumps({**cfg, "hidden": [9, 5]}))
    line = _error(capsys, main(["--resume", "--out", str(run)]))
    assert "checkpoint.pt" in line and "cannot resume" in line
    assert not marker.exists()


# ---------------------------------------------------------------------------- data definitions


def test_num_classes_comes_from_the_data_set_not_the_labels(tmp_path, capsys):
    write_mnist_dir(tmp_path / "five", n_train=30, n_test=10, num_classes=5)  # labels 0..4 only
    data = load_dataset("mnist-dir", data_dir=tmp_path / "five")
    assert int(data.y_train.max()) == 4 and data.num_classes == 10
    out = tmp_path / "run"
    assert main(["--data", "mnist-dir", "--data-dir", str(tmp_path / "five"), *TINY, "--out", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["params_dense"] == 784 * 8 + 8 + 8 * 4 + 4 + 4 * 10 + 10  # ten outputs, not five


def test_labels_outside_the_definition_are_refused(tmp_path, capsys):
    write_mnist_dir(tmp_path / "twelve", n_train=24, n_test=12, num_classes=12, size=28)
    with pytest.raises(ValueError, match="outside the 10 classes"):
        load_dataset("mnist-dir", data_dir=tmp_path / "twelve")
    argv = ["--data", "mnist-dir", "--data-dir", str(tmp_path / "twelve"), *TINY, "--out", str(tmp_path / "r")]
    line = _error(capsys, main(argv))
    assert "outside the 10 classes" in line
