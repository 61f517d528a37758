"""What a distilled training step costs next to a plain one: full logits, the teacher's top k, and the cache.

A tiny Llama-style model (Hugging Face ``LlamaForCausalLM``, random weights, a vocabulary of a few thousand so that
the logits weigh) is trained with Adam, each kind of step on its own copy of the student, interleaved in one
process on the same batches:

* ``plain``: the causal language model's cross-entropy alone (the reference);
* ``distill``: :class:`~l0bayes.models.Distillation` with the full logits: the teacher runs on every step;
* ``top_k``: ``Distillation(top_k=K)`` without a cache: the teacher still runs on every step;
* ``top_k_cached``: ``Distillation(top_k=K, cache_bytes=...)`` on a second pass over the same batches: every
  batch is a hit, the teacher does not run (the first pass, which fills the cache, is timed once on its own).

The teacher is the dense model and the student a copy of it (the size of a lightly pruned model). Each repeat
times one pass over the batches per kind; the ratios to ``plain`` are the medians of the repeats' ratios. The
bytes the cache holds per token are its ``nbytes`` over the tokens of the cached batches.

Example::

    python benchmarks/bench_distillation.py --threads 1 --repeats 5
"""

import argparse
import copy
import json
import platform
import statistics
import time

import torch
import torch.nn.functional as F

from l0bayes.models import Distillation

KINDS = ("plain", "distill", "top_k", "top_k_cached")


def tiny_llama(args, seed=0):
    import transformers

    config = transformers.LlamaConfig(
        hidden_size=args.hidden,
        intermediate_size=args.intermediate,
        num_hidden_layers=args.layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=args.vocab,
        max_position_embeddings=args.positions,
        use_cache=False,
    )
    torch.manual_seed(seed)
    return transformers.LlamaForCausalLM(config)


def plain_loss(logits, ids):
    """Hugging Face's causal language-model loss: position t predicts token t + 1."""
    return F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))


class Runner:
    """One kind of step: its own student, optimiser and (for the distilled kinds) attached distillation."""

    def __init__(self, kind, teacher, args):
        self.kind = kind
        self.student = copy.deepcopy(teacher).train()
        self.optimizer = torch.optim.Adam(self.student.parameters(), lr=1e-4)
        self.distillation = None
        if kind != "plain":
            top_k = None if kind == "distill" else args.top_k
            cache_bytes = args.cache_bytes if kind == "top_k_cached" else 0
            self.distillation = Distillation(
                teacher, temperature=args.temperature, alpha=args.alpha, top_k=top_k, cache_bytes=cache_bytes
            )
            self.handle = self.distillation.attach(self.student)

    def step(self, ids):
        self.optimizer.zero_grad(set_to_none=True)
        output = self.student(ids)
        if self.distillation is None:
            loss = plain_loss(output.logits, ids)
        else:
            loss = self.distillation(output, ids)
        loss.backward()
        self.optimizer.step()
        return loss

    def epoch(self, batches):
        start = time.perf_counter()
        for ids in batches:
            self.step(ids)
        return (time.perf_counter() - start) / len(batches)


def run(args):
    torch.set_num_threads(args.threads)
    teacher = tiny_llama(args).eval()
    generator = torch.Generator().manual_seed(1)
    batches = [
        torch.randint(0, args.vocab, (args.batch, args.positions), generator=generator) for _ in range(args.steps)
    ]
    runners = {kind: Runner(kind, teacher, args) for kind in KINDS}
    for runner in runners.values():  # warm-up: allocator, Adam's state; fills the cache of top_k_cached
        runner.step(batches[0])
    cached = runners["top_k_cached"]
    cached.distillation.cache.clear()
    first_pass = cached.epoch(batches)  # the pass that fills the cache: the teacher runs on every batch
    cache = cached.distillation.cache
    assert len(cache) == len(batches), "the cache budget is too small for the batches"
    times = {kind: [] for kind in KINDS}
    for _ in range(args.repeats):
        for kind in KINDS:
            times[kind].append(runners[kind].epoch(batches))
    hits = cache.hits
    tokens = args.steps * args.batch * args.positions
    top_k_bytes = sum(entry[1][0].nbytes for entry in cache._entries.values()) / tokens
    ratios = {
        kind: statistics.median(t / p for t, p in zip(times[kind], times["plain"], strict=True)) for kind in KINDS
    }
    return {
        "device": f"CPU ({platform.processor() or platform.machine()}), torch {torch.__version__}",
        "threads": args.threads,
        "model": {
            "hidden": args.hidden,
            "intermediate": args.intermediate,
            "layers": args.layers,
            "vocab": args.vocab,
            "batch": args.batch,
            "positions": args.positions,
            "parameters": sum(p.numel() for p in teacher.parameters()),
        },
        "temperature": args.temperature,
        "alpha": args.alpha,
        "top_k": args.top_k,
        "steps_per_pass": args.steps,
        "repeats": args.repeats,
        "step_ms_median": {kind: 1e3 * statistics.median(times[kind]) for kind in KINDS},
        "ratio_to_plain_median": ratios,
        "top_k_cached_first_pass_ms": 1e3 * first_pass,
        "cache_hits_in_timed_passes": hits,
        "cache_bytes_per_token": cache.nbytes / tokens,
        "cache_top_k_bytes_per_token": top_k_bytes,
        "full_logits_bytes_per_token": args.vocab * teacher.lm_head.weight.element_size(),
    }


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--steps", type=int, default=6, help="batches per pass")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--positions", type=int, default=128)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--intermediate", type=int, default=384)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=4096)
    parser.add_argument("--top-k", type=int, default=64)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--alpha", type=float, default=0.5)
    parser.add_argument("--cache-bytes", type=int, default=1 << 30)
    parser.add_argument("--json", help="write the results to this file too")
    args = parser.parse_args(argv)
    result = run(args)
    print(json.dumps(result, indent=2))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    ratios = result["ratio_to_plain_median"]
    print(
        f"step / plain step (median of {args.repeats}): distill {ratios['distill']:.2f}x, "
        f"top_k {ratios['top_k']:.2f}x, "
        f"top_k + cache (second pass) {ratios['top_k_cached']:.2f}x; the cache holds "
        f"{result['cache_bytes_per_token']:.0f} bytes per token"
    )
    return result


if __name__ == "__main__":
    main()
