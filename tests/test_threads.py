"""The library's heavy calls run under a thread policy and give the caller's torch thread count back."""

import importlib

import pytest
import torch
from torch import nn

import l0bayes
from l0bayes import HardConcrete, kl_hard_concrete, select_variables
from l0bayes.distributions import kl as kl_module
from l0bayes.inference import train
from l0bayes.models import SparseClassifier
from l0bayes.nn import L0MLP
from l0bayes.selection import api as selection_module
from l0bayes.threads import choose_threads, thread_policy


@pytest.fixture
def user_threads(monkeypatch):
    """The caller's count is 3 (not what the policy picks) and the environment chooses nothing."""
    for key in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OMP_WAIT_POLICY"):
        monkeypatch.delenv(key, raising=False)
    before = torch.get_num_threads()
    torch.set_num_threads(3)
    yield 3
    torch.set_num_threads(before)


class _Recorder(nn.Module):
    """An L0 MLP whose forward notes torch's thread count (and raises when told to)."""

    def __init__(self, fail_after=None):
        super().__init__()
        self.net = L0MLP(4, (5,), 3)
        self.seen = []
        self.fail_after = fail_after

    def forward(self, x):
        self.seen.append(torch.get_num_threads())
        if self.fail_after is not None and len(self.seen) > self.fail_after:
            raise RuntimeError("stop")
        return self.net(x)


def _classifier(fail_after=None):
    torch.manual_seed(0)
    recorder = _Recorder(fail_after)
    return SparseClassifier(recorder, lam=0.1), recorder


def _data():
    return torch.randn(40, 4), torch.randint(0, 3, (40,))


@pytest.mark.parametrize(("threads", "inside"), [("auto", 1), (None, 3), (2, 2)])
def test_train_runs_under_the_policy_and_restores_the_count(user_threads, threads, inside):
    model, recorder = _classifier()
    x, y = _data()
    train(model, x, y, objective="penalized", epochs=2, batch_size=20, progress=False, threads=threads)
    assert recorder.seen and set(recorder.seen) == {inside}
    assert torch.get_num_threads() == user_threads


def test_train_restores_the_count_after_an_error(user_threads):
    model, recorder = _classifier(fail_after=2)
    x, y = _data()
    with pytest.raises(RuntimeError, match="stop"):
        train(model, x, y, objective="penalized", epochs=2, batch_size=20, progress=False)
    assert set(recorder.seen) == {1}
    assert torch.get_num_threads() == user_threads


def test_auto_follows_the_environment_and_an_enclosing_policy(user_threads, monkeypatch):
    model, recorder = _classifier()
    x, y = _data()
    with thread_policy(2) as count:
        assert count == 2
        train(model, x, y, objective="penalized", epochs=1, batch_size=40, progress=False)
    assert set(recorder.seen) == {2} and torch.get_num_threads() == user_threads
    assert choose_threads("auto", environ={"OMP_NUM_THREADS": "3"}) is None  # the user's count stands
    assert choose_threads("auto", environ={"MKL_NUM_THREADS": "2"}) is None
    assert choose_threads("auto", environ={"OMP_WAIT_POLICY": "PASSIVE"}) == 1
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    recorder.seen.clear()
    train(model, x, y, objective="penalized", epochs=1, batch_size=40, progress=False)
    assert set(recorder.seen) == {3}


@pytest.mark.parametrize("bad", [0, -1, 1.5, "two", True])
def test_a_bad_thread_count_is_refused_before_anything_runs(user_threads, bad):
    model, recorder = _classifier()
    x, y = _data()
    with pytest.raises(ValueError, match="threads must be"):
        train(model, x, y, epochs=1, progress=False, threads=bad)
    with pytest.raises(ValueError, match="threads must be"):
        select_variables(x.double().numpy(), x[:, 0].double().numpy(), threads=bad)
    assert recorder.seen == [] and torch.get_num_threads() == user_threads


def test_the_kl_of_many_pairs_runs_on_one_thread(user_threads, monkeypatch):
    seen = []
    shared = kl_module._shared_constants
    general = kl_module._kl_quadrature

    def note_shared(*args):
        seen.append(("shared", torch.get_num_threads()))
        return shared(*args)

    def note_general(*args):
        seen.append(("general", torch.get_num_threads()))
        return general(*args)

    monkeypatch.setattr(kl_module, "_shared_constants", note_shared)
    monkeypatch.setattr(kl_module, "_kl_quadrature", note_general)
    many = torch.randn(10**5)
    prior = HardConcrete(torch.zeros(()), 2 / 3)
    kl_hard_concrete(HardConcrete(many, 2 / 3), prior)  # shared temperature and stretch
    kl_hard_concrete(HardConcrete(many, torch.full_like(many, 0.5)), prior)  # the general path
    assert {path for path, _ in seen} == {"shared", "general"}
    assert {n for _, n in seen} == {1} and torch.get_num_threads() == user_threads
    seen.clear()
    kl_hard_concrete(HardConcrete(torch.randn(10), 2 / 3), prior)  # too small to run in parallel: left alone
    assert seen == [("shared", user_threads)]
    with pytest.raises(ValueError, match="num_samples"):
        kl_hard_concrete(HardConcrete(many, 2 / 3), prior, method="monte_carlo", num_samples=0)
    assert torch.get_num_threads() == user_threads


def test_select_variables_runs_under_the_policy(user_threads, monkeypatch):
    seen = []
    fit = selection_module.select_gaussian

    def note(*args, **kwargs):
        seen.append(torch.get_num_threads())
        if len(seen) == 2:
            raise RuntimeError("stop")
        return fit(*args, **kwargs)

    monkeypatch.setattr(selection_module, "select_gaussian", note)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(60, 5, generator=gen, dtype=torch.float64)
    y = x[:, 0] + 0.5 * torch.randn(60, generator=gen, dtype=torch.float64)
    select_variables(x.numpy(), y.numpy(), seed=0)
    assert seen == [1] and torch.get_num_threads() == user_threads
    with pytest.raises(RuntimeError, match="stop"):
        select_variables(x.numpy(), y.numpy(), seed=0, threads=2)
    assert seen == [1, 2] and torch.get_num_threads() == user_threads


def test_the_policy_is_exported_at_the_top_level():
    assert l0bayes.thread_policy is thread_policy


def test_prune_and_the_gate_analysis_run_under_the_policy(user_threads, monkeypatch):
    from l0bayes.analysis import to_inference_data
    from l0bayes.pruning import PruneReport, prune

    prune_module = importlib.import_module("l0bayes.pruning.prune")  # (l0bayes.pruning.prune is also the function)
    report_module = importlib.import_module("l0bayes.pruning.report")
    inference_data = importlib.import_module("l0bayes.analysis.inference_data")

    seen = []

    def noting(function):
        def wrapper(*args, **kwargs):
            seen.append((function.__name__, torch.get_num_threads()))
            return function(*args, **kwargs)

        return wrapper

    for module, name in (
        (prune_module, "_dense_copy"),
        (report_module, "expected_flops"),
        (inference_data, "gate_layers"),
    ):
        monkeypatch.setattr(module, name, noting(getattr(module, name)))
    torch.manual_seed(0)
    net = L0MLP(6, (5,), 3).eval()
    prune(net)
    PruneReport.from_model(net, (6,))
    to_inference_data(net, num_draws=10)
    assert {name for name, _ in seen} == {"_dense_copy", "expected_flops", "gate_layers"}
    assert {n for _, n in seen} == {1} and torch.get_num_threads() == user_threads


def test_the_command_line_keeps_its_own_count_for_the_library_calls(user_threads, monkeypatch, tmp_path):
    """``l0bayes fit --threads 2``: training and pruning run on two threads, and the caller's count is back after."""
    from l0bayes.cli import main

    training = importlib.import_module("l0bayes.inference.training")
    prune_module = importlib.import_module("l0bayes.pruning.prune")
    seen = []
    run, dense_copy = training._train, prune_module._dense_copy

    def note_train(*args, **kwargs):
        seen.append(("train", torch.get_num_threads()))
        return run(*args, **kwargs)

    def note_prune(*args, **kwargs):
        seen.append(("prune", torch.get_num_threads()))
        return dense_copy(*args, **kwargs)

    monkeypatch.setattr(training, "_train", note_train)
    monkeypatch.setattr(prune_module, "_dense_copy", note_prune)
    argv = ["fit", "--hidden", "8", "--epochs", "1", "--no-progress", "--threads", "2", "--out", str(tmp_path / "r")]
    assert main(argv) == 0
    assert {name for name, _ in seen} == {"train", "prune"} and {n for _, n in seen} == {2}
    assert torch.get_num_threads() == user_threads
