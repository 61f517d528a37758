"""Data-parallel training: 2 gloo processes on the CPU against one process on the same global batches.

One ``torch.multiprocessing.spawn`` of two ranks (module fixture) runs every distributed scenario
and saves what it saw; the tests compare it with single-process runs made here.

What is compared, and why:

* **Exact equality (float64, to 1e-10)** with ``DistributedConfig(shared_gate_noise=True)``: every
  rank then draws the same gate sample as the single process, so after the DDP gradient average a
  2-process step on two local batches of 8 must equal a 1-process step on the global batch of 16
  (the ``N/(B/K)`` data scaling, KL and code cost counted once). Gates are one sample per minibatch
  (Section 2.1), so this needs only equal seeds, no change to the model. Checked for the
  penalised, Bayesian (SVI) and constrained (per-layer multipliers) objectives and for resume
  across world sizes (2 -> 1 and 1 -> 2).
* **Within Monte Carlo error** for the default, the paper's protocol (each rank its own gates):
  the mean over ranks of the per-rank free-energy estimates (Eq. 21) has the same expectation as
  the single-process estimate on the global batch; 300 draws of each are compared with a 4.5-sigma
  bound. The ranks' gate samples are checked to differ.
"""

import os
import shutil
import socket
import time

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from l0bayes.inference import Constrained, free_energy, train
from l0bayes.inference.distributed import (
    DataParallelContext,
    DistributedConfig,
    DistributedError,
    init_distributed,
    is_main_process,
    rank_seed,
    shard_order,
    world_size,
)
from l0bayes.models import SparseClassifier
from l0bayes.nn import L0MLP

N, B, EPOCHS, LR, SEED = 96, 16, 2, 1e-2, 5
MC_DRAWS, MC_BATCH = 300, 32
SHARED = DistributedConfig(shared_gate_noise=True)
OBJECTIVES = {
    "penalized": {"objective": "penalized"},
    "bayes": {"objective": "bayes"},
    "constrained": {"objective": Constrained(target_density=0.5, per_layer=True)},
}


def _data():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(N, 12, generator=g, dtype=torch.float64)
    y = torch.randint(0, 4, (N,), generator=g)
    return x, y


def _model():
    torch.manual_seed(1)
    return SparseClassifier(L0MLP(12, (8,), 4, init_drop_rates=0.3), lam=0.1).double()


def _train(model, objective, **kwargs):
    x, y = _data()
    # CPU even where CUDA exists: gloo ranks, and no CUDA context in the parent before fork
    kw = dict(epochs=EPOCHS, batch_size=B, lr=LR, seed=SEED, progress=False, device="cpu")
    kw.update(OBJECTIVES[objective])
    kw.update(kwargs)
    return train(model, x, y, **kw)


def _state(model):
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


# ---------------------------------------------------------------------------- the 2 ranks
def _worker(rank, nprocs, port, port2, out):
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(nprocs), LOCAL_RANK=str(rank)
    )
    torch.set_num_threads(1)
    seen = {"world_size_before": world_size()}
    # train() itself joins the group from the env:// variables (as under torchrun).
    for objective in OBJECTIVES:
        model = _model()
        result = _train(model, objective, distributed=SHARED)
        seen[objective] = {"state": _state(model), "history": result.history, "mu": result.multipliers.cpu()}
    seen["is_main"] = is_main_process()

    # 2 -> 1: one epoch with a checkpoint, kept for the parent; then 2 processes resume it.
    ckpt = os.path.join(out, "bayes_2procs.pt")
    _train(_model(), "bayes", epochs=1, checkpoint=ckpt, distributed=SHARED)
    if rank == 0:
        shutil.copy(ckpt, os.path.join(out, "bayes_2procs_epoch1.pt"))
    model = _train(_model(), "bayes", checkpoint=ckpt, resume=True, distributed=SHARED).model
    seen["bayes_resumed_on_2"] = _state(model)

    # 1 -> 2: the parent's single-process checkpoint after one epoch, resumed here on 2.
    model = _model()
    _train(model, "penalized", checkpoint=os.path.join(out, "penalized_1proc.pt"), resume=True, distributed=SHARED)
    seen["penalized_resumed_on_2"] = _state(model)

    # The default (each rank draws its own gates): DDP keeps the ranks' parameters identical.
    model = _model()
    _train(model, "bayes", epochs=1)
    seen["own_noise_state"] = _state(model)

    # Monte Carlo: the rank-mean of the per-rank free-energy estimates on the shards of one global batch.
    ctx = DataParallelContext(None, "cpu")
    x, y = _data()
    idx = ctx.shard(torch.arange(MC_BATCH))
    model = _model()
    estimates = []
    with torch.no_grad():
        for m in range(MC_DRAWS):
            torch.manual_seed(rank_seed(1000 + m, rank))
            local = free_energy(model.model, model.guide, x[idx], y[idx], N).total
            estimates.append(float(ctx.mean(local)[0]))
        torch.manual_seed(rank_seed(7, rank))
        seen["gate_sample"] = model.net.fc1.gate().clone()
    seen["mc"] = estimates

    try:  # the global batch must split evenly
        _train(_model(), "penalized", batch_size=15)
    except ValueError as err:
        seen["batch_error"] = str(err)

    # A stuck rank: rank 1 joins a new group (2 s timeout) but never calls train(); rank 0 must fail, not hang.
    dist.destroy_process_group()
    os.environ["MASTER_PORT"] = str(port2)
    init_distributed("cpu", timeout_s=2)
    if rank == 1:
        time.sleep(4)
    else:
        start = time.perf_counter()
        try:
            _train(_model(), "penalized", epochs=1)
        except DistributedError as err:
            seen["stuck"] = (str(err), time.perf_counter() - start)
    torch.save(seen, os.path.join(out, f"rank{rank}.pt"))


def _free_ports(n):
    sockets = [socket.socket() for _ in range(n)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    out = tmp_path_factory.mktemp("ddp")
    model = _model()  # single-process checkpoint after epoch 1, for the 1 -> 2 resume
    _train(model, "penalized", epochs=1, checkpoint=str(out / "penalized_1proc.pt"), distributed=SHARED)
    # fork where available: the ranks inherit the imported modules (a fresh interpreter costs seconds per rank);
    # not after this process ran CUDA (autograd's device threads do not survive a fork): then spawn
    forkable = "fork" in mp.get_all_start_methods() and not torch.cuda.is_initialized()
    method = "fork" if forkable else "spawn"
    mp.start_processes(_worker, args=(2, *_free_ports(2), str(out)), nprocs=2, join=True, start_method=method)
    return out, [torch.load(out / f"rank{r}.pt", weights_only=True) for r in range(2)]


@pytest.fixture(scope="module")
def single():
    """Single-process reference runs (same seed, global batch B)."""
    out = {}
    for objective in OBJECTIVES:
        model = _model()
        result = _train(model, objective, distributed=False)
        out[objective] = {"state": _state(model), "history": result.history, "mu": result.multipliers}
    return out


def _assert_close(a, b, atol=1e-10):
    assert a.keys() == b.keys()
    for k in a:
        assert torch.allclose(a[k], b[k], rtol=0, atol=atol), (k, (a[k] - b[k]).abs().max())


# ---------------------------------------------------------------------------- tests
@pytest.mark.parametrize("objective", list(OBJECTIVES))
def test_two_processes_take_the_single_process_steps(ranks, single, objective):
    _, (r0, r1) = ranks
    for k in r0[objective]["state"]:  # DDP keeps the replicas bitwise identical
        assert torch.equal(r0[objective]["state"][k], r1[objective]["state"][k]), k
    _assert_close(r0[objective]["state"], single[objective]["state"])
    assert torch.equal(r0[objective]["mu"], r1[objective]["mu"])
    assert torch.allclose(r0[objective]["mu"].to(single[objective]["mu"]), single[objective]["mu"], atol=1e-10)
    # rank 0 keeps the history (with the rank-mean loss), the others return none
    assert r1[objective]["history"] == []
    hist, ref = r0[objective]["history"], single[objective]["history"]
    assert [h["epoch"] for h in hist] == [1, 2]
    for h, g in zip(hist, ref, strict=True):
        assert h["mean_loss"] == pytest.approx(g["mean_loss"], rel=1e-9)
        assert h["free_energy"] == pytest.approx(g["free_energy"], rel=1e-9)
    if objective == "constrained":
        assert single[objective]["mu"].abs().sum() > 0  # the multipliers did move


def test_rank_helpers_inside_the_job(ranks):
    _, (r0, r1) = ranks
    assert r0["world_size_before"] == r1["world_size_before"] == 2
    assert r0["is_main"] and not r1["is_main"]
    assert "divisible by the number of processes (2)" in r0["batch_error"]


def test_a_stuck_rank_gives_a_clear_error_not_a_hang(ranks):
    _, (r0, _) = ranks
    message, seconds = r0["stuck"]
    assert "rank 0/2" in message and "crashed" in message and "timeout" in message
    assert seconds < 30


def test_checkpoint_from_two_processes_resumes_on_one(ranks, single):
    out, (r0, r1) = ranks
    ckpt = out / "bayes_2procs_epoch1.pt"
    state = torch.load(ckpt, weights_only=True)
    assert state["world_size"] == 2 and len(state["rank_rng"]) == 2 and state["epoch"] == 1
    model = _model()
    result = _train(model, "bayes", checkpoint=str(ckpt), resume=True, distributed=False)
    assert [h["epoch"] for h in result.history] == [1, 2]
    _assert_close(_state(model), single["bayes"]["state"])
    _assert_close(r0["bayes_resumed_on_2"], single["bayes"]["state"])  # 2 -> 2 as well


def test_checkpoint_from_one_process_resumes_on_two(ranks, single):
    _, (r0, r1) = ranks
    _assert_close(r0["penalized_resumed_on_2"], single["penalized"]["state"])
    _assert_close(r1["penalized_resumed_on_2"], single["penalized"]["state"])


def test_own_gate_noise_per_rank(ranks, single):
    _, (r0, r1) = ranks
    assert not torch.equal(r0["gate_sample"], r1["gate_sample"])
    for k in r0["own_noise_state"]:
        assert torch.equal(r0["own_noise_state"][k], r1["own_noise_state"][k]), k
    # it trained, and on different gate noise than the shared-noise run
    a, b = r0["own_noise_state"]["net.fc1.gate.log_alpha"], _model().state_dict()["net.fc1.gate.log_alpha"]
    assert not torch.allclose(a, b)


def test_rank_mean_objective_is_the_free_energy_within_mc_error(ranks):
    _, (r0, r1) = ranks
    assert r0["mc"] == r1["mc"]  # the all-reduced value is the same on every rank
    dist_est = torch.tensor(r0["mc"], dtype=torch.float64)
    x, y = _data()
    model = _model()
    with torch.no_grad():
        ref = []
        for m in range(MC_DRAWS):
            torch.manual_seed(50_000 + m)
            ref.append(float(free_energy(model.model, model.guide, x[:MC_BATCH], y[:MC_BATCH], N).total))
    ref = torch.tensor(ref, dtype=torch.float64)
    se = (dist_est.var() / MC_DRAWS + ref.var() / MC_DRAWS).sqrt()
    assert (dist_est.mean() - ref.mean()).abs() < 4.5 * se, (dist_est.mean(), ref.mean(), se)


# ---------------------------------------------------------------------------- no processes needed
@pytest.mark.parametrize("n, k", [(10, 2), (11, 2), (7, 3), (2, 4), (96, 2)])
def test_shard_order_is_distributed_sampler(n, k):
    from torch.utils.data import DistributedSampler

    order = torch.randperm(n, generator=torch.Generator().manual_seed(n + k))
    for r in range(k):
        sampler = DistributedSampler(range(n), num_replicas=k, rank=r, shuffle=False, drop_last=False)
        assert shard_order(order, r, k).tolist() == order[list(sampler)].tolist()
    # the first B/K of every shard together are the first B of the order
    b = 2 * k
    if n >= b:
        firsts = torch.stack([shard_order(order, r, k)[: b // k] for r in range(k)], 1).reshape(-1)
        assert firsts.tolist() == order[:b].tolist()


def test_single_process_defaults_and_errors(monkeypatch):
    for var in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(var, raising=False)
    ctx = DataParallelContext(None, "cpu")
    assert not ctx.enabled and ctx.world_size == 1 and ctx.is_main
    assert init_distributed("cpu") is False
    with pytest.raises(RuntimeError, match="torchrun"):
        DataParallelContext(True, "cpu")
    with pytest.raises(TypeError, match="DistributedConfig"):
        DataParallelContext("yes", "cpu")
    with pytest.raises(ValueError, match="rank"):
        shard_order(torch.arange(4), 2, 2)
    monkeypatch.setenv("RANK", "1")
    assert not is_main_process()
    assert not DataParallelContext(None, "cpu").is_main  # agrees with is_main_process()
    assert DataParallelContext(False, "cpu").is_main  # explicitly on its own
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(RuntimeError, match="MASTER_ADDR"):
        init_distributed("cpu")
    assert rank_seed(3, 0) == 3 and rank_seed(3, 1) != 3 and rank_seed(3, 1, shared=True) == 3
