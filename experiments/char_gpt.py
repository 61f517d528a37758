"""A character-level GPT on the CPython standard library's source, pruned to 50% and 25% of its parameters.

The end-to-end transformer example of ``docs/guide/transformers.md``, small enough for one CPU thread:

* **data**: the text of a fixed, sorted list of modules of the standard library (:data:`MODULES`, found under
  ``sysconfig.get_paths()["stdlib"]``) as bytes; every ``--val-every``-th file (in sorted order) is the
  validation set, the others the training set. The vocabulary is ASCII (128 ids); the few non-ASCII bytes are
  id 0 (NUL never occurs in the source otherwise). The file names, sizes and a SHA-256 of the text are
  recorded, since the text depends on the Python version.
* **model**: :class:`GPT`, pre-norm, causal, with q/k/v/out ``nn.Linear`` projections and a GELU MLP (the
  default names :func:`~l0bayes.pruning.sparsify_transformer` finds).
* **runs** (``--runs``), per seed:

  - ``dense``: trains ``--steps + --prune-steps`` steps of Adam (``--prune-steps`` defaults to ``--steps``);
    its weights after ``--steps`` steps start the pruned runs, and its validation loss is recorded after
    ``--steps`` steps and at the end;
  - ``c0.5``, ``c0.25`` (``--targets``): from the dense weights after ``--steps`` steps,
    ``sparsify_transformer`` (heads, MLP units, branches) and ``train(objective=Constrained(target_density=...))``
    for ``--prune-steps`` more steps (the gates' Adam step ``--gate-lr``, the multipliers' three times that, the
    last ``--final-phase`` of the steps with the gates fixed); then ``prune`` gives a plain, smaller :class:`GPT`;
  - ``scratch0.5``, ``scratch0.25``: a dense :class:`GPT` of the same depth with fewer heads and MLP units, its
    parameter count within a few percent of the target fraction of the dense model's (:func:`scratch_config`),
    trained from scratch for ``--steps + --prune-steps`` steps: as many as the pruned model saw (dense, then
    pruning);
  - ``scratch0.5-short``, ``scratch0.25-short`` (``scratch-short``): the same small models trained for
    ``--prune-steps`` steps only, as many as the pruning run (the comparison of Sheared-LLaMA, which does not
    count the training of the model that is pruned).

  Every run reports its validation loss (nats per character, on the same fixed windows), its parameter
  fraction ``count_parameters(prune(m)) / count_parameters(m)``, its fraction of FLOPs per token
  (:func:`~l0bayes.pruning.flops_per_token`), and for the pruned runs the measured CPU speed-up against the
  dense model at batch 1 and 32 (:func:`speedup`: medians of interleaved timings, one thread,
  ``torch.no_grad``, the same process). One JSON per run in ``OUT`` (``OUT/weights`` holds the dense
  weights the pruned runs start from); an existing run is skipped, so a command with more seeds trains only
  the new ones. ``--summarize-only`` prints the markdown table (mean ± sd over seeds) and draws
  ``OUT/head_map.png``.

With the defaults (4 layers, 4 heads, d_model 128, context 64, batch 32, ``--steps 400``) each run takes
about 1-3 minutes on one thread of the machine of ``benchmarks/RESULTS.md`` ("Transformers")::

    python experiments/char_gpt.py --seeds 0 1 2 --out runs/char-gpt
    python experiments/char_gpt.py --out runs/char-gpt --measure-speed --repeats-1 200 --repeats-32 40
    python experiments/char_gpt.py --out runs/char-gpt --summarize-only

``--measure-speed`` times the pruned runs again from their saved weights (into ``OUT/speed.json``, which the
table then uses): for a machine that was busy while the runs trained.
"""

import argparse
import copy
import hashlib
import json
import math
import os
import platform
import statistics
import sys
import sysconfig
import time

import torch
import torch.nn.functional as F
from _common import machine
from torch import nn

from l0bayes._atomic import atomic_write
from l0bayes.analysis.plots import head_map
from l0bayes.inference import Constrained, parameter_groups, train
from l0bayes.inference.objectives import FINAL_PHASE
from l0bayes.models import SparseModel
from l0bayes.pruning import count_parameters, flops_per_token, network_size, prune, sparsify_transformer

#: The modules whose source is the text: single-file modules present in CPython 3.10-3.13, sorted.
MODULES = (
    "abc", "argparse", "ast", "base64", "bisect", "calendar", "cmd", "codecs", "colorsys", "configparser",
    "contextlib", "copy", "csv", "dataclasses", "datetime", "difflib", "dis", "enum", "filecmp", "fnmatch",
    "fractions", "functools", "getopt", "gettext", "glob", "gzip", "heapq", "hmac", "inspect", "ipaddress",
    "keyword", "linecache", "locale", "mimetypes", "numbers", "operator", "optparse", "pickle", "pkgutil",
    "platform", "plistlib", "pprint", "queue", "quopri", "random", "reprlib", "sched", "secrets", "selectors",
    "shlex", "shutil", "signal", "socket", "statistics", "string", "stringprep", "struct", "subprocess",
    "tarfile", "tempfile", "textwrap", "threading", "timeit", "token", "tokenize", "trace", "traceback",
    "types", "typing", "uuid", "warnings", "wave", "weakref", "zipapp",
)  # fmt: skip
VOCAB = 128


# ----------------------------------------------------------------------------------------------- data


def stdlib_text(modules=MODULES, val_every=10, stdlib=None):
    """``(train bytes, validation bytes, description)``: the source of ``modules``, split by file.

    Every ``val_every``-th module (counting from the first, in sorted order) goes to validation.
    """
    stdlib = stdlib or sysconfig.get_paths()["stdlib"]
    names = sorted(modules)
    missing = [m for m in names if not os.path.isfile(os.path.join(stdlib, f"{m}.py"))]
    if missing:
        raise FileNotFoundError(f"{stdlib}: no {', '.join(m + '.py' for m in missing)} (this Python's stdlib)")
    train_parts, val_parts, files = [], [], []
    for i, name in enumerate(names):
        with open(os.path.join(stdlib, f"{name}.py"), "rb") as f:
            data = f.read()
        (val_parts if i % val_every == 0 else train_parts).append(data)
        files.append({"module": name, "bytes": len(data), "split": "val" if i % val_every == 0 else "train"})
    train_text, val_text = b"\n".join(train_parts), b"\n".join(val_parts)
    info = {
        "stdlib": stdlib,
        "python": platform.python_version(),
        "files": files,
        "train_bytes": len(train_text),
        "val_bytes": len(val_text),
        "sha256": hashlib.sha256(train_text + b"\0" + val_text).hexdigest(),
    }
    return train_text, val_text, info


def encode(text):
    """Token ids (int64) of bytes: ASCII as itself, any other byte as 0."""
    ids = torch.frombuffer(bytearray(text), dtype=torch.uint8).long()
    return torch.where(ids < VOCAB, ids, torch.zeros_like(ids))


def windows(ids, count, context, generator):
    """``(x, y)``: ``count`` windows of ``context`` ids at random offsets, and the next ids (the targets)."""
    starts = torch.randint(0, len(ids) - context - 1, (count,), generator=generator)
    index = starts[:, None] + torch.arange(context + 1)
    chunk = ids[index]
    return chunk[:, :-1].contiguous(), chunk[:, 1:].contiguous()


def validation_windows(ids, context, count):
    """Up to ``count`` non-overlapping windows spread evenly over the validation text (the same for every run)."""
    n = (len(ids) - 1) // context
    picks = torch.linspace(0, n - 1, min(count, n)).long()
    index = picks[:, None] * context + torch.arange(context + 1)
    chunk = ids[index]
    return chunk[:, :-1].contiguous(), chunk[:, 1:].contiguous()


# ---------------------------------------------------------------------------------------------- model


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention with q/k/v/out projections; ``n_head`` heads of ``head_dim`` features.

    The forward reads the head count from ``n_head``, which :func:`~l0bayes.pruning.prune` lowers.
    """

    def __init__(self, d_model, n_head, head_dim):
        super().__init__()
        self.n_head, self.head_dim = n_head, head_dim
        width = n_head * head_dim
        self.q, self.k, self.v = (nn.Linear(d_model, width) for _ in range(3))
        self.out = nn.Linear(width, d_model)

    def forward(self, x):
        b, t, _ = x.shape
        q, k, v = (f(x).view(b, t, self.n_head, self.head_dim).transpose(1, 2) for f in (self.q, self.k, self.v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.out(y.transpose(1, 2).reshape(b, t, self.n_head * self.head_dim))


class MLP(nn.Module):
    def __init__(self, d_model, d_ff):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(d_model, d_ff), nn.Linear(d_ff, d_model)

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x)))


class Block(nn.Module):
    """Pre-norm block: ``x + attn(ln1(x))``, then ``x + mlp(ln2(x))``."""

    def __init__(self, d_model, n_head, head_dim, d_ff):
        super().__init__()
        self.ln1, self.attn = nn.LayerNorm(d_model), CausalSelfAttention(d_model, n_head, head_dim)
        self.ln2, self.mlp = nn.LayerNorm(d_model), MLP(d_model, d_ff)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    """A character-level GPT: token and position embeddings, ``n_layer`` blocks, final norm, linear read-out."""

    def __init__(self, n_layer=4, d_model=128, n_head=4, head_dim=None, d_ff=None, context=128, vocab=VOCAB):
        super().__init__()
        head_dim = head_dim or d_model // n_head
        d_ff = d_ff or 4 * d_model
        heads = n_head if isinstance(n_head, list | tuple) else [n_head] * n_layer
        units = d_ff if isinstance(d_ff, list | tuple) else [d_ff] * n_layer
        self.tok, self.pos = nn.Embedding(vocab, d_model), nn.Embedding(context, d_model)
        self.blocks = nn.ModuleList(Block(d_model, h, head_dim, u) for h, u in zip(heads, units, strict=True))
        self.ln, self.head = nn.LayerNorm(d_model), nn.Linear(d_model, vocab, bias=False)

    def forward(self, idx):
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln(x))


def token_loss(logits, targets):
    """Mean cross-entropy per character, in nats."""
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten())


def scratch_config(config, fraction):
    """``(n_head, d_ff)`` of a dense :class:`GPT` of the same depth whose parameters are closest to ``fraction``
    of ``config``'s: the heads scaled by ``fraction`` (at least one), then the MLP width that fits the rest."""
    dense = count_parameters(GPT(**config))
    heads = max(1, round(config["n_head"] * fraction))

    def size(d_ff):
        return count_parameters(GPT(**{**config, "n_head": heads, "d_ff": d_ff}))

    per_unit = size(2) - size(1)
    d_ff = max(1, round(1 + (fraction * dense - size(1)) / per_unit))
    return heads, d_ff


@torch.no_grad()
def validation_loss(net, x_val, y_val, batch=64):
    """Mean cross-entropy per character of ``net`` in eval mode on the validation windows, in nats."""
    net.eval()
    total = 0.0
    for i in range(0, len(x_val), batch):
        total += float(token_loss(net(x_val[i : i + batch]), y_val[i : i + batch])) * len(x_val[i : i + batch])
    return total / len(x_val)


def train_dense(net, train_ids, steps, batch, context, lr, seed, checkpoints=()):
    """Adam on ``net`` for ``steps`` minibatches of random windows; ``{step: state dict copy}`` at ``checkpoints``."""
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.Adam(net.parameters(), lr=lr)
    saved = {}
    net.train()
    for step in range(1, steps + 1):
        x, y = windows(train_ids, batch, context, generator)
        loss = token_loss(net(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if step in checkpoints:
            saved[step] = copy.deepcopy(net.state_dict())
    return saved


class RandomWindows:
    """An iterable of ``steps`` minibatches of random training windows, fresh ones every epoch (for ``train()``)."""

    def __init__(self, ids, steps, batch, context, seed):
        self.ids, self.steps, self.batch, self.context = ids, steps, batch, context
        self.generator = torch.Generator().manual_seed(seed)

    def __len__(self):
        return self.steps

    def __iter__(self):
        for _ in range(self.steps):
            yield windows(self.ids, self.batch, self.context, self.generator)


# ---------------------------------------------------------------------------------------------- speed


@torch.no_grad()
def speedup(dense, pruned, batch, context, repeats, seed=0):
    """Median time of ``dense`` over median time of ``pruned`` on a ``(batch, context)`` batch, one thread.

    The two are timed alternately (after two warm-up calls each), so both see the same machine load.
    Returns ``(speed-up, dense median s, pruned median s)``.
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        x = torch.randint(0, VOCAB, (batch, context), generator=torch.Generator().manual_seed(seed))
        dense, pruned = dense.eval(), pruned.eval()
        for _ in range(2):
            dense(x), pruned(x)
        times = {"dense": [], "pruned": []}
        for _ in range(repeats):
            for name, net in (("dense", dense), ("pruned", pruned)):
                start = time.perf_counter()
                net(x)
                times[name].append(time.perf_counter() - start)
        d, p = statistics.median(times["dense"]), statistics.median(times["pruned"])
        return d / p, d, p
    finally:
        torch.set_num_threads(threads)


# ----------------------------------------------------------------------------------------------- runs


def _config(args):
    return {
        "n_layer": args.layers,
        "d_model": args.d_model,
        "n_head": args.heads,
        "head_dim": args.d_model // args.heads,
        "d_ff": 4 * args.d_model,
        "context": args.context,
    }


def _protocol(args, info):
    """What every run in one OUT shares: the text, the model and the training settings."""
    keys = ("steps", "prune_steps", "epochs", "batch", "lr", "gate_lr", "final_phase", "init_drop_rate")
    keys += ("val_every", "val_windows")
    return {"sha256": info["sha256"], "python": info["python"], "config": _config(args),
            **{k: getattr(args, k) for k in keys}}  # fmt: skip


def _settings(args, name, seed, data_info):
    return {
        "run": name,
        "seed": seed,
        "config": _config(args),
        "steps": args.steps,
        "prune_steps": args.prune_steps,
        "batch": args.batch,
        "lr": args.lr,
        "gate_lr": args.gate_lr,
        "val_windows": args.val_windows,
        "torch": torch.__version__,
        "python": sys.version.split()[0],
        "machine": machine(),
        "threads": torch.get_num_threads(),
        "data": {k: v for k, v in data_info.items() if k != "files"},
        "load_average_at_start": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
    }


def _write(args, name, record):
    atomic_write(os.path.join(args.out, f"{name}.json"), json.dumps(record, indent=1))


def _exists(args, name):
    if os.path.exists(os.path.join(args.out, f"{name}.json")):
        print(f"{name}: exists, skipped", flush=True)
        return True
    return False


def run_dense(args, data, seed):
    name = f"dense-s{seed}"
    weights = os.path.join(args.out, "weights", f"dense-s{seed}-step{args.steps}.pt")
    if _exists(args, name):
        return
    settings = _settings(args, name, seed, data["info"])
    torch.manual_seed(seed)
    net = GPT(**_config(args))
    start = time.perf_counter()
    total = args.steps + args.prune_steps
    saved = train_dense(net, data["train"], total, args.batch, args.context, args.lr, seed, {args.steps})
    wall = time.perf_counter() - start
    half = GPT(**_config(args))
    half.load_state_dict(saved[args.steps])
    os.makedirs(os.path.dirname(weights), exist_ok=True)
    atomic_write(weights, lambda f: torch.save(saved[args.steps], f))
    x_val, y_val = data["val"]
    final = {
        "val_loss": validation_loss(half, x_val, y_val),
        "val_loss_long": validation_loss(net, x_val, y_val),
        "params": count_parameters(net),
        "params_fraction": 1.0,
        "flops_per_token": flops_per_token(net, x_val[:1]),
        "flops_fraction": 1.0,
        "wall_s": wall,
    }
    _write(args, name, {"settings": settings, "final": final})
    print(
        f"{name}: val {final['val_loss']:.4f} nats/char after {args.steps} steps, {final['val_loss_long']:.4f} after "
        f"{total}; {final['params']} parameters, {wall:.0f} s",
        flush=True,
    )


def run_constrained(args, data, seed, target):
    name = f"c{target:g}-s{seed}"
    if _exists(args, name):
        return
    weights = os.path.join(args.out, "weights", f"dense-s{seed}-step{args.steps}.pt")
    if not os.path.exists(weights):
        raise FileNotFoundError(f"{weights}: run dense-s{seed} first (--runs dense ...)")
    settings = {**_settings(args, name, seed, data["info"]), "target_density": target}
    dense = GPT(**_config(args))
    dense.load_state_dict(torch.load(weights, weights_only=True))
    x_val, y_val = data["val"]
    gated = sparsify_transformer(dense, example_inputs=x_val[:1], init_drop_rate=args.init_drop_rate)
    model = SparseModel(gated, token_loss)
    epochs = args.epochs
    per_epoch = math.ceil(args.prune_steps / epochs)
    batches = RandomWindows(data["train"], per_epoch, args.batch, args.context, seed + 1000)

    def optimizer(m):
        groups = parameter_groups(m, gates={"lr": args.gate_lr}, weights={"lr": args.lr})
        return torch.optim.Adam(groups)

    start = time.perf_counter()
    result = train(
        model, batches, None,
        objective=Constrained(target_density=target, multiplier_lr=3 * args.gate_lr, final_phase=args.final_phase),
        epochs=epochs, lr=args.lr, optimizer=optimizer, num_data=per_epoch * args.batch, seed=seed, progress=False,
        device="cpu", threads=None,
    )  # fmt: skip
    wall = time.perf_counter() - start
    gated.eval()
    pruned = prune(gated)
    size = network_size(gated)
    final = {
        "val_loss": validation_loss(pruned, x_val, y_val),
        "val_loss_gated": validation_loss(gated, x_val, y_val),
        "params": count_parameters(pruned),
        "params_fraction": count_parameters(pruned) / count_parameters(dense),
        "params_fraction_size": size.fraction("parameters", "test"),
        "flops_per_token": flops_per_token(pruned, x_val[:1]),
        "flops_fraction": flops_per_token(pruned, x_val[:1]) / flops_per_token(dense, x_val[:1]),
        "heads": head_map(gated)[0].tolist(),  # Eq. 13 gate of each head (times its branch's), per block
        "units": [int(b.l0_units.gate.active().sum()) for b in gated.blocks],
        "branches": [[int(b.l0_attention.gate.active()), int(b.l0_mlp.gate.active())] for b in gated.blocks],
        "density_at_final_phase": result.history[-1].get("density_at_final_phase"),
        "wall_s": wall,
        "speedup": {},
    }
    for batch, repeats in ((1, args.repeats_1), (32, args.repeats_32)):
        ratio, t_dense, t_pruned = speedup(dense, pruned, batch, args.context, repeats)
        final["speedup"][str(batch)] = {"speedup": ratio, "dense_s": t_dense, "pruned_s": t_pruned}
    os.makedirs(os.path.join(args.out, "weights"), exist_ok=True)
    atomic_write(os.path.join(args.out, "weights", f"{name}.pt"), lambda f: torch.save(gated.state_dict(), f))
    _write(args, name, {"settings": settings, "final": final})
    s1, s32 = final["speedup"]["1"]["speedup"], final["speedup"]["32"]["speedup"]
    print(
        f"{name}: val {final['val_loss']:.4f} nats/char, params {final['params_fraction']:.3f}, FLOPs "
        f"{final['flops_fraction']:.3f} (ratio {1 / final['flops_fraction']:.2f}), speed-up {s1:.2f} (batch 1) "
        f"{s32:.2f} (batch 32), heads {final['heads']}, {wall:.0f} s",
        flush=True,
    )


def run_scratch(args, data, seed, target, short=False):
    """A dense GPT at the target's size from scratch: for all the steps the pruned model saw (dense and pruning),
    or, ``short``, for the pruning run's steps only (the comparison of Sheared-LLaMA, which does not count the
    training of the model that is pruned)."""
    name = f"scratch{target:g}-short-s{seed}" if short else f"scratch{target:g}-s{seed}"
    steps = args.prune_steps if short else args.steps + args.prune_steps
    if _exists(args, name):
        return
    config = _config(args)
    heads, d_ff = scratch_config(config, target)
    small_config = {**config, "n_head": heads, "d_ff": d_ff}
    settings = {**_settings(args, name, seed, data["info"]), "target_density": target, "small_config": small_config}
    settings["scratch_steps"] = steps
    torch.manual_seed(seed)
    net = GPT(**small_config)
    start = time.perf_counter()
    train_dense(net, data["train"], steps, args.batch, args.context, args.lr, seed)
    wall = time.perf_counter() - start
    x_val, y_val = data["val"]
    dense_params = count_parameters(GPT(**config))
    dense_flops = flops_per_token(GPT(**config), x_val[:1])
    final = {
        "val_loss": validation_loss(net, x_val, y_val),
        "params": count_parameters(net),
        "params_fraction": count_parameters(net) / dense_params,
        "flops_per_token": flops_per_token(net, x_val[:1]),
        "flops_fraction": flops_per_token(net, x_val[:1]) / dense_flops,
        "wall_s": wall,
    }
    _write(args, name, {"settings": settings, "final": final})
    print(
        f"{name}: val {final['val_loss']:.4f} nats/char after {steps} steps, {heads} heads, d_ff {d_ff}, params "
        f"{final['params_fraction']:.3f}, {wall:.0f} s",
        flush=True,
    )


def load_gated(out, name):
    """``(dense model it was pruned from, gated model)`` of the pruned run ``name`` in ``out``, from their weights."""
    with open(os.path.join(out, f"{name}.json")) as f:
        settings = json.load(f)["settings"]
    config = settings["config"]
    dense = GPT(**config)
    path = os.path.join(out, "weights", f"dense-s{settings['seed']}-step{settings['steps']}.pt")
    dense.load_state_dict(torch.load(path, weights_only=True))
    example = torch.zeros(1, config["context"], dtype=torch.long)
    gated = sparsify_transformer(GPT(**config), example_inputs=example)
    gated.load_state_dict(torch.load(os.path.join(out, "weights", f"{name}.pt"), weights_only=True))
    return dense, gated.eval()


def measure_speed(args):
    """The speed-up of every pruned run in ``OUT`` again, from the saved weights, into ``OUT/speed.json``.

    For a machine that was busy while the runs trained: run it when the machine is quiet. Runs already in
    ``speed.json`` are skipped; :func:`summarize` prefers these figures to the ones taken right after training.
    """
    path = os.path.join(args.out, "speed.json")
    speeds = {}
    if os.path.exists(path):
        with open(path) as f:
            speeds = json.load(f)
    torch.set_num_threads(1)
    for name in sorted(n for n in load_runs(args.out) if n.startswith("c")):
        if name in speeds:
            print(f"{name}: speed measured, skipped", flush=True)
            continue
        dense, gated = load_gated(args.out, name)
        pruned = prune(gated)
        record = {"load_average_at_start": os.getloadavg()[0] if hasattr(os, "getloadavg") else None}
        for batch, repeats in ((1, args.repeats_1), (32, args.repeats_32)):
            ratio, t_dense, t_pruned = speedup(dense, pruned, batch, dense.pos.num_embeddings, repeats)
            record[str(batch)] = {"speedup": ratio, "dense_s": t_dense, "pruned_s": t_pruned, "repeats": repeats}
        speeds[name] = record
        atomic_write(path, json.dumps(speeds, indent=1))
        print(f"{name}: speed-up {record['1']['speedup']:.2f} (batch 1), {record['32']['speedup']:.2f} (batch 32)")


# ------------------------------------------------------------------------------------------- summary


def load_runs(out):
    runs = {}
    for file in sorted(os.listdir(out)):
        if file.endswith(".json") and file not in ("protocol.json", "speed.json"):
            with open(os.path.join(out, file)) as f:
                runs[file[: -len(".json")]] = json.load(f)
    return runs


def _mean_sd(values):
    values = [v for v in values if v is not None]
    if not values:
        return "-"
    if len(values) == 1:
        return f"{values[0]:.3f}"
    return f"{statistics.mean(values):.3f} ± {statistics.stdev(values):.3f}"


def summarize(out):
    """The markdown table of the runs in ``out`` (mean ± sd over seeds), printed and returned."""
    runs = load_runs(out)
    speeds = {}
    if os.path.exists(os.path.join(out, "speed.json")):  # measured again on a quiet machine (--measure-speed)
        with open(os.path.join(out, "speed.json")) as f:
            speeds = json.load(f)
    for name, run in runs.items():
        if name in speeds:
            run["final"]["speedup"] = speeds[name]
    groups = {}
    for name, run in runs.items():
        groups.setdefault(name.rsplit("-s", 1)[0], []).append(run)

    def key(group):  # dense first, then by target (largest first), the pruned run before its scratch run
        target = groups[group][0]["settings"].get("target_density")
        return (target is not None, -(target or 0.0), group.startswith("scratch"))

    order = sorted(groups, key=key)
    dense = {r["settings"]["seed"]: r["final"] for r in groups.get("dense", [])}
    lines = [
        "| run | seeds | params | FLOPs/token | val loss (nats/char) | vs dense pruned | vs dense, same steps | "
        "speed-up b=1 | speed-up b=32 | speed-up / FLOP ratio (b=32) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for group in order:
        if group not in groups:
            continue
        finals = [(r["settings"]["seed"], r["final"]) for r in groups[group]]
        relative = [f["val_loss"] / dense[s]["val_loss"] for s, f in finals if s in dense]
        same_steps = [f["val_loss"] / dense[s]["val_loss_long"] for s, f in finals if s in dense]
        s1 = [f["speedup"]["1"]["speedup"] for _, f in finals if "speedup" in f]
        s32 = [f["speedup"]["32"]["speedup"] for _, f in finals if "speedup" in f]
        of_ratio = [f["speedup"]["32"]["speedup"] * f["flops_fraction"] for _, f in finals if "speedup" in f]
        label = group
        if group == "dense":
            label = f"dense, {groups[group][0]['settings']['steps']} steps (pruned from)"
        lines.append(
            f"| {label} | {len(finals)} | {_mean_sd([f['params_fraction'] for _, f in finals])} | "
            f"{_mean_sd([f['flops_fraction'] for _, f in finals])} | {_mean_sd([f['val_loss'] for _, f in finals])} | "
            f"{_mean_sd(relative)} | {_mean_sd(same_steps)} | {_mean_sd(s1)} | {_mean_sd(s32)} | {_mean_sd(of_ratio)} |"
        )
        if group == "dense":
            long = [f["val_loss_long"] for _, f in finals]
            settings = groups[group][0]["settings"]
            steps = settings["steps"] + settings.get("prune_steps", settings["steps"])
            lines.append(
                f"| dense, {steps} steps | {len(finals)} | 1.000 | 1.000 | {_mean_sd(long)} | - | 1.000 | - | - | - |"
            )
    text = "\n".join(lines)
    print(text)
    return text


def plot_runs_head_map(out, name):
    """Draw the head map of run ``name`` (its saved gated weights) into ``OUT/head_map.png``."""
    from matplotlib.figure import Figure

    from l0bayes.analysis import plot_head_map

    _, gated = load_gated(out, name)
    fig = Figure(figsize=(4.0, 3.2), layout="constrained")
    plot_head_map(gated, ax=fig.add_subplot())
    path = os.path.join(out, "head_map.png")
    fig.savefig(path, dpi=120)
    return path


# ---------------------------------------------------------------------------------------------- main


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", nargs="+", default=["dense", "constrained", "scratch", "scratch-short"],
                        choices=["dense", "constrained", "scratch", "scratch-short"])  # fmt: skip
    parser.add_argument("--targets", type=float, nargs="+", default=[0.5, 0.25], help="parameter fractions")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--steps", type=int, default=400, help="dense steps before pruning")
    parser.add_argument("--prune-steps", type=int, default=None, help="steps of the pruning run (default --steps)")
    parser.add_argument("--epochs", type=int, default=10, help="epochs of the constrained run (of steps/epochs)")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--lr", type=float, default=3e-3, help="Adam step size of the weights")
    parser.add_argument("--gate-lr", type=float, default=0.1, help="Adam step size of the gates' log_alpha")
    parser.add_argument(
        "--final-phase", type=float, default=0.6, help=f"Constrained's final_phase (its default: {FINAL_PHASE})"
    )
    parser.add_argument("--init-drop-rate", type=float, default=0.05, help="initial gate drop rate (from dense)")
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--d-model", type=int, default=128)
    parser.add_argument("--context", type=int, default=64)
    parser.add_argument("--val-every", type=int, default=10, help="every N-th module is validation text")
    parser.add_argument("--val-windows", type=int, default=256, help="validation windows of --context characters")
    parser.add_argument("--repeats-1", type=int, default=50, help="timed calls per model at batch 1")
    parser.add_argument("--repeats-32", type=int, default=15, help="timed calls per model at batch 32")
    parser.add_argument("--modules", nargs="+", default=None, help="stdlib modules of the text (default MODULES)")
    parser.add_argument("--out", required=True)
    parser.add_argument("--summarize-only", action="store_true")
    parser.add_argument("--measure-speed", action="store_true", help="time the pruned runs in OUT again")
    parser.add_argument("--head-map", default=None, help="the run whose head map --summarize-only draws")
    args = parser.parse_args(argv)
    if args.measure_speed:
        measure_speed(args)
        summarize(args.out)
        return 0
    if args.summarize_only:
        summarize(args.out)
        runs = [n for n in load_runs(args.out) if n.startswith("c")]
        name = args.head_map or (sorted(runs)[0] if runs else None)
        if name:
            print(f"head map of {name}: {plot_runs_head_map(args.out, name)}")
        return 0
    for t in args.targets:
        if not 0 < t < 1:
            parser.error(f"--targets are fractions in (0, 1), got {t}")
    if args.d_model % args.heads:
        parser.error(f"--d-model {args.d_model} does not split into --heads {args.heads}")
    args.prune_steps = args.steps if args.prune_steps is None else args.prune_steps
    torch.set_num_threads(1)
    train_text, val_text, info = stdlib_text(args.modules or MODULES, args.val_every)
    os.makedirs(args.out, exist_ok=True)
    protocol = _protocol(args, info)
    described = os.path.join(args.out, "protocol.json")
    if os.path.exists(described):  # runs of another protocol (text, model, steps) are not mixed into one table
        with open(described) as f:
            before = json.load(f)
        changed = sorted(k for k in set(before) | set(protocol) if before.get(k) != protocol.get(k))
        if changed:
            raise SystemExit(f"{args.out} holds runs with other {', '.join(changed)}: choose another --out")
    else:
        atomic_write(described, json.dumps(protocol, indent=1))
    data = {
        "train": encode(train_text),
        "val": validation_windows(encode(val_text), args.context, args.val_windows),
        "info": info,
    }
    print(f"text: {info['train_bytes']} training and {info['val_bytes']} validation bytes (Python {info['python']})")
    for seed in args.seeds:
        if "dense" in args.runs:
            run_dense(args, data, seed)
        if "constrained" in args.runs:
            for target in args.targets:
                run_constrained(args, data, seed, target)
        if "scratch" in args.runs:
            for target in args.targets:
                run_scratch(args, data, seed, target)
        if "scratch-short" in args.runs:
            for target in args.targets:
                run_scratch(args, data, seed, target, short=True)
    summarize(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
