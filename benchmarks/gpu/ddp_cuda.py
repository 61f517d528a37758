"""Data-parallel training on CUDA, end to end with checkpoint and resume; run under torchrun.

Every rank trains the L0 MLP 784-300-100 (penalised, lambda 0.1/N, Adam 1e-3, global batch ``--batch-size``)
on the first ``--subset`` Fashion-MNIST training images through :func:`l0bayes.inference.train` three
times: ``--epochs`` + 1 epochs straight; ``--epochs`` epochs writing a checkpoint; then resumed from it to
``--epochs`` + 1. Rank 0 prints one JSON line: world size, backend, whether the resumed run ended with
bit-identical parameters, the last test error, seconds.

With ``--nproc_per_node=1`` ``train()`` runs as one process (a group of one is not data-parallel), so
``--ddp-step`` also joins a one-rank ``nccl`` group itself and checks that ``DistributedDataParallel``
over the library's :class:`~l0bayes.inference.distributed.ObjectiveModule` gives the plain gradients.
Several ranks on ONE GPU need ``--backend gloo`` (NCCL refuses two ranks on one device)::

    torchrun --standalone --nproc_per_node=1 benchmarks/gpu/ddp_cuda.py --ddp-step --out runs/ddp1
    torchrun --standalone --nproc_per_node=2 benchmarks/gpu/ddp_cuda.py --backend gloo --out runs/ddp2
"""

import argparse
import json
import os
import sys
import time

import torch


def _data(args):
    from l0bayes.data import find_fashion_mnist, load_mnist_format

    directory = args.data_dir or find_fashion_mnist()
    if directory is None:
        sys.exit("Fashion-MNIST not found: pass --data-dir")
    images, labels = load_mnist_format(directory, "train")
    x = images.reshape(images.shape[0], -1).to(torch.float32).div_(255.0)
    return x[: args.subset], labels[: args.subset], x[-2000:], labels[-2000:]


def _model():
    from l0bayes.models import SparseClassifier
    from l0bayes.nn import L0MLP

    torch.manual_seed(0)
    return SparseClassifier(L0MLP(784, (300, 100), 10), lam=0.1)


def ddp_step(device):
    """One-rank nccl group: DDP's gradient of the penalised objective equals the plain one."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from l0bayes.inference.distributed import ObjectiveModule

    if not dist.is_initialized():
        dist.init_process_group("nccl", device_id=device)
    model = _model().to(device)
    x = torch.rand(64, 784, device=device)
    y = torch.randint(0, 10, (64,), device=device)
    grads = []
    for wrapped in (False, True):
        model.zero_grad(set_to_none=True)
        torch.manual_seed(1)
        if wrapped:
            loss = DistributedDataParallel(ObjectiveModule(model))(
                lambda a, b: sum(model.penalized_loss(a, b, 1000)), x, y
            )
        else:
            loss = sum(model.penalized_loss(x, y, 1000))
        loss.backward()
        grads.append([p.grad.detach().clone() for p in model.parameters()])
    same = all(torch.allclose(a, b, rtol=1e-6, atol=1e-7) for a, b in zip(*grads, strict=True))
    backend = dist.get_backend()
    dist.destroy_process_group()
    return {"ddp_step_backend": backend, "ddp_step_gradients_equal": bool(same)}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", choices=("nccl", "gloo"), default=None, help="default: nccl on CUDA")
    parser.add_argument("--device", default="cuda", help="cuda (cuda:LOCAL_RANK) or cuda:0 for every rank")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=200)
    parser.add_argument("--subset", type=int, default=6000)
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--ddp-step", action="store_true")
    parser.add_argument("--out", required=True, help="directory for the checkpoint (must be new)")
    args = parser.parse_args(argv)

    from l0bayes.inference import DistributedConfig, train
    from l0bayes.inference.distributed import is_initialized, is_main_process, local_rank

    device = args.device
    if args.backend == "gloo" and device == "cuda":
        device = "cuda:0"  # several ranks on one GPU
    x, y, x_test, y_test = _data(args)
    config = DistributedConfig(backend=args.backend)
    run = dict(objective="penalized", batch_size=args.batch_size, lr=1e-3, seed=0, device=device, progress=False)
    run.update(distributed=config, test_data=(x_test, y_test))
    os.makedirs(args.out, exist_ok=False) if local_rank() == 0 else None
    ckpt = os.path.join(args.out, "checkpoint.pt")
    start = time.perf_counter()
    straight = _model()
    train(straight, x, y, epochs=args.epochs + 1, **run)
    first = _model()
    train(first, x, y, epochs=args.epochs, checkpoint=ckpt, **run)
    resumed = _model()
    result = train(resumed, x, y, epochs=args.epochs + 1, checkpoint=ckpt, resume=True, **run)
    seconds = time.perf_counter() - start
    import torch.distributed as dist

    record = {
        "world_size": dist.get_world_size() if is_initialized() else 1,
        "backend": dist.get_backend() if is_initialized() else "none (one process: train() makes no group)",
        "device": str(result.device),
        "resume_bit_identical": all(
            torch.equal(a, b)
            for a, b in zip(straight.state_dict().values(), resumed.state_dict().values(), strict=True)
        ),
        "epochs_in_history": [h["epoch"] for h in result.history],
        "test_error": result.history[-1]["test_error"] if result.history else None,
        "seconds": round(seconds, 1),
    }
    if args.ddp_step and torch.cuda.is_available():
        record.update(ddp_step(torch.device("cuda", local_rank())))
    if is_main_process():
        print("DDP_RESULT " + json.dumps(record), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
