"""CPU inference speed of a pruned Wide ResNet against the dense one, next to their FLOP ratio.

For each closed fraction ``f`` the gates of a WRN-d-k with the paper's placement
(:func:`~l0bayes.pruning.l0_wide_resnet`, one gate per output channel of every block's first
convolution) are set so that a fraction ``f`` of every gated layer's channels is closed (Eq. 13
gate 0) and the rest fully open; the model is pruned (:func:`~l0bayes.pruning.prune`), exported with
``torch.export`` and loaded back, and the loaded module is timed against the dense
:class:`~l0bayes.nn.WideResNet` of the same size, interleaved (dense, pruned, dense, pruned, ...) in
one process, one thread, ``eval()`` mode, no gradients. ``--state`` times a trained model instead
(``model.pt`` of ``experiments/wrn.py``, loaded with ``weights_only=True``).

``--deploy`` chooses how both networks are prepared, the dense one and the pruned one alike, before
both go through ``torch.export`` (save, load) and are timed: ``eager`` as they are (NCHW, batch norms
separate); ``channels_last`` NHWC weights and input; ``fold`` batch norms folded into the
convolutions before them (:func:`~l0bayes.pruning.folding.fold_batch_norm`) and NHWC
(:func:`~l0bayes.pruning.folding.for_inference`); ``compile`` as ``fold``, then the loaded program is
compiled with ``torch.compile`` (Inductor: C++ kernels that fuse the residual addition, batch norm and
ReLU into one pass; needs a C++ compiler; the compilation happens in the untimed warm-up call).

Reported: FLOP ratio (dense / pruned), measured speedup (median over repeats of dense time / pruned
time), and speedup / FLOP ratio (the target is at least 0.8; results in ``benchmarks/RESULTS.md``,
"Pruning and export")::

    python benchmarks/bench_pruned_speed.py --depth 16 --width 4 --batch-size 64 --fractions 0.25 0.5 0.75
"""

import argparse
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from tables import format_table  # noqa: E402

from l0bayes.nn import WideResNet, gates_of  # noqa: E402
from l0bayes.pruning import flops, l0_wide_resnet, prune  # noqa: E402
from l0bayes.pruning.folding import for_inference  # noqa: E402

DEPLOY = {
    "eager": lambda m: m.eval(),
    "channels_last": lambda m: for_inference(m, channels_last=True, fold=False),
    "fold": lambda m: for_inference(m, channels_last=True, fold=True),
    "compile": lambda m: for_inference(m, channels_last=True, fold=True),
}


def closed_model(depth, width, fraction, in_channels, seed=0):
    """An L0 WRN with ``fraction`` of every gated layer's channels closed (random channels) and random BN stats."""
    generator = torch.Generator().manual_seed(seed)
    net = l0_wide_resnet(depth, width, in_channels=in_channels)
    with torch.no_grad():
        for _, gate in gates_of(net):
            closed = torch.randperm(gate.num_gates, generator=generator)[: round(fraction * gate.num_gates)]
            gate.log_alpha.fill_(30.0)
            gate.log_alpha[closed] = -30.0
        for m in net.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.running_mean.normal_(0, 0.1, generator=generator)
                m.running_var.uniform_(0.5, 1.5, generator=generator)
    return net.eval()


def exported(pruned, example):
    warnings.filterwarnings("ignore", message="No complete tensor found")  # torch.export.load, CPU weights
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "pruned.pt2"
        torch.export.save(torch.export.export(pruned, (example,)), str(path))
        return torch.export.load(str(path)).module()


@torch.no_grad()
def time_pair(dense, pruned, x, repeats):
    """Interleaved wall times of ``dense(x)`` and ``pruned(x)``: lists of seconds."""
    dense(x), pruned(x)  # warm-up
    t_dense, t_pruned = [], []
    for _ in range(repeats):
        for model, times in ((dense, t_dense), (pruned, t_pruned)):
            start = time.perf_counter()
            model(x)
            times.append(time.perf_counter() - start)
    return t_dense, t_pruned


def measure(label, gated, dense, args, in_channels, deploy):
    shape = (in_channels, 32, 32)
    x = torch.randn(args.batch_size, *shape, generator=torch.Generator().manual_seed(1))
    pruned = prune(gated)
    ratio = flops(dense, shape) / flops(pruned, shape)
    if deploy != "eager":
        x = x.contiguous(memory_format=torch.channels_last)
    # the same preparation and the same torch.export round trip for both (the batch size is specialised)
    loaded = exported(DEPLOY[deploy](pruned), x)
    loaded_dense = exported(DEPLOY[deploy](dense), x)
    if deploy == "compile":
        loaded, loaded_dense = torch.compile(loaded), torch.compile(loaded_dense)
    with torch.no_grad():
        err = float((loaded(x) - gated(x)).abs().max())
    t_dense, t_pruned = time_pair(loaded_dense, loaded, x, args.repeats)
    speedups = [d / p for d, p in zip(t_dense, t_pruned, strict=True)]
    speedup = statistics.median(speedups)
    return [
        label,
        deploy,
        f"{flops(pruned, shape) / 1e6:.0f}M",
        f"{ratio:.2f}x",
        f"{statistics.median(t_dense) * 1e3:.0f}",
        f"{statistics.median(t_pruned) * 1e3:.0f}",
        f"{speedup:.2f}x",
        f"{speedup / ratio:.2f}",
        f"{err:.1e}",
    ]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--depth", type=int, default=16)
    p.add_argument("--width", type=int, default=4)
    p.add_argument("--in-channels", type=int, default=1)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--fractions", type=float, nargs="*", default=[0.25, 0.5, 0.75])
    p.add_argument("--state", nargs="*", default=None, help="model.pt files of trained L0 runs of experiments/wrn.py")
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--deploy", nargs="+", default=["eager", "fold"], choices=list(DEPLOY))
    p.add_argument("--markdown", action="store_true")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    dense = WideResNet(args.depth, args.width, in_channels=args.in_channels).eval()
    rows = []
    for fraction in args.fractions:
        gated = closed_model(args.depth, args.width, fraction, args.in_channels)
        for deploy in args.deploy:
            rows.append(measure(f"{fraction:.2f} closed", gated, dense, args, args.in_channels, deploy))
            print(rows[-1], flush=True)
    for state in args.state or []:
        gated = l0_wide_resnet(args.depth, args.width, in_channels=args.in_channels)
        gated.load_state_dict(torch.load(state, weights_only=True))
        for deploy in args.deploy:
            label = f"trained ({Path(state).parent.parent.name}/{Path(state).parent.name})"
            rows.append(measure(label, gated.eval(), dense, args, args.in_channels, deploy))
            print(rows[-1], flush=True)
    header = [
        "model",
        "deploy",
        "FLOPs",
        "FLOP ratio",
        "dense ms",
        "pruned ms",
        "speedup",
        "speedup / FLOP ratio",
        "max abs diff",
    ]
    print(format_table(header, rows, markdown=args.markdown))
    return 0


if __name__ == "__main__":
    sys.exit(main())
