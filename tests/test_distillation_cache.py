"""Distillation from the teacher's top k logits (l0bayes.models.top_k_kl) and the cache of the teacher's outputs
(l0bayes.models.teacher_cache): the (k + 1)-bucket KL against the full KL and against a computation written out
with scipy, its gradient against the closed form, the cache's hits, misses and evictions, and training that gives
the same parameters with and without the cache."""

import copy

import numpy as np
import pytest
import torch
from scipy.special import log_softmax as np_log_softmax
from scipy.special import logsumexp, rel_entr, softmax
from torch import nn

from l0bayes.inference import train
from l0bayes.models import Distillation, DistillationOutput, PlainModel
from l0bayes.models import teacher_cache as teacher_cache_module
from l0bayes.models.teacher_cache import TeacherCache
from l0bayes.models.top_k_kl import TopKLogits, top_k_kl_divergence, top_k_logits, top_k_token_losses

transformers = pytest.importorskip("transformers")

VOCAB = 64


def tiny_llama(seed=0, vocab=VOCAB):
    config = transformers.LlamaConfig(
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=vocab,
        max_position_embeddings=32,
        use_cache=False,
    )
    torch.manual_seed(seed)
    return transformers.LlamaForCausalLM(config).eval()


def ids(n=4, t=12, seed=0):
    return torch.randint(0, VOCAB, (n, t), generator=torch.Generator().manual_seed(seed))


def logits(shape, seed, dtype=torch.float64, scale=3.0):
    return (scale * torch.randn(shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)).to(dtype)


def counting(teacher):
    """The teacher with a count of its forward passes in ``teacher.calls``."""
    teacher.calls = 0

    def count(module, args):
        module.calls += 1

    teacher.register_forward_pre_hook(count)
    return teacher


def bucket_reference(student, teacher, labels, k, temperature, alpha, causal=True):
    """The loss written out in float64 with numpy/scipy: the teacher's k largest logits K (by argsort), the two
    softmaxes at T grouped into K and one bucket for the rest (its mass summed from the other tokens'
    probabilities), T^2 KL between these (k + 1)-category distributions, and the cross-entropy."""
    s, t, y = (np.asarray(a.detach(), dtype=np.float64) for a in (student, teacher, labels))
    if causal:
        s, t, y = s[:, :-1], t[:, :-1], y[:, 1:]
    keep = y != -100
    s, t, y = s[keep], t[keep], y[keep].astype(int)
    kl = np.zeros(len(y))
    for row in range(len(y)):
        order = np.argsort(-t[row], kind="stable")
        kept, others = order[:k], order[k:]
        q, p = softmax(t[row] / temperature), softmax(s[row] / temperature)
        q_buckets = np.append(q[kept], q[others].sum())
        p_buckets = np.append(p[kept], p[others].sum())
        kl[row] = rel_entr(q_buckets, p_buckets).sum()
    ce = -np_log_softmax(s, axis=-1)[np.arange(len(y)), y]
    n = max(len(y), 1)
    return alpha * temperature**2 * kl.sum() / n + (1 - alpha) * ce.sum() / n


def top_k_output(student, teacher, k, temperature):
    return DistillationOutput(student, top_k_logits(teacher, k, temperature), {}, {})


def full_output(student, teacher):
    return DistillationOutput(student, teacher, {}, {})


# -- the top-k KL --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("temperature, alpha", [(1.0, 1.0), (2.0, 0.5), (0.5, 0.0), (3.0, 0.9), (1.0, 0.5)])
@pytest.mark.parametrize("padded", [False, True])
def test_all_of_the_vocabulary_is_the_full_kl_with_its_gradient(temperature, alpha, padded):
    """top_k = vocabulary (or more): the remaining bucket is empty and the loss and its gradient are the full
    distillation loss's, in float64 to 1e-12 (the in-place path and, with ignored labels, the copying one)."""
    student, teacher = logits((3, 7, 11), 1), logits((3, 7, 11), 2)
    labels = torch.randint(0, 11, (3, 7), generator=torch.Generator().manual_seed(3))
    if padded:
        labels[0, 2:5] = -100
    full_student = student.clone().requires_grad_(True)
    full = Distillation(nn.Linear(1, 1), temperature=temperature, alpha=alpha)(
        full_output(full_student, teacher), labels
    )
    full.backward()
    for k in (11, 20):
        distillation = Distillation(nn.Linear(1, 1), temperature=temperature, alpha=alpha, top_k=k)
        top_student = student.clone().requires_grad_(True)
        loss = distillation(top_k_output(top_student, teacher, k, temperature), labels)
        loss.backward()
        assert loss.dtype == torch.float64
        assert abs(float(loss.detach()) - float(full.detach())) <= 1e-12 * max(1.0, abs(float(full.detach())))
        assert torch.allclose(top_student.grad, full_student.grad, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("dtype, tol", [(torch.float64, 1e-12), (torch.float32, 1e-5)])
@pytest.mark.parametrize("k", [1, 3, 8])
@pytest.mark.parametrize("temperature, alpha", [(1.0, 1.0), (2.0, 0.5), (0.5, 0.7), (4.0, 1.0)])
@pytest.mark.parametrize("padded", [False, True])
def test_top_k_loss_equals_the_bucket_kl_written_out(dtype, tol, k, temperature, alpha, padded):
    student, teacher = logits((3, 7, 11), 4), logits((3, 7, 11), 5)
    labels = torch.randint(0, 11, (3, 7), generator=torch.Generator().manual_seed(6))
    if padded:
        labels[0, 2:5] = -100
        labels[2, :] = -100
    distillation = Distillation(nn.Linear(1, 1), temperature=temperature, alpha=alpha, top_k=k)
    loss = distillation(top_k_output(student.to(dtype), teacher.to(dtype), k, temperature), labels)
    expected = bucket_reference(student, teacher, labels, k, temperature, alpha)
    assert loss.dtype == dtype
    assert abs(float(loss) - expected) <= tol * max(1.0, abs(expected))


@pytest.mark.parametrize("temperature", [1.0, 2.5])
def test_gradient_is_the_closed_form(temperature):
    r"""d KL_K / d s_j = (p_j - q_j) / T on the kept tokens and p_j (1 - q_o / p_o) / T on the others (numpy)."""
    k, rows = 4, 6
    student, teacher = logits((rows, 13), 7), logits((rows, 13), 8)
    s = student.clone().requires_grad_(True)
    top = top_k_logits(teacher, k, temperature)
    top_k_kl_divergence(s, top, temperature).sum().backward()
    ns, nt = student.numpy(), teacher.numpy()
    expected = np.zeros_like(ns)
    for row in range(rows):
        p, q = softmax(ns[row] / temperature), softmax(nt[row] / temperature)
        kept = np.argsort(-nt[row], kind="stable")[:k]
        others = np.setdiff1d(np.arange(13), kept)
        expected[row, kept] = (p[kept] - q[kept]) / temperature
        expected[row, others] = p[others] * (1 - q[others].sum() / p[others].sum()) / temperature
    assert np.allclose(s.grad.numpy(), expected, rtol=1e-11, atol=1e-14)


@pytest.mark.parametrize("temperature, alpha", [(1.0, 0.3), (2.0, 0.3), (1.0, 1.0), (0.7, 0.0)])
def test_gradient_passes_gradcheck(temperature, alpha):
    """The hand-written backward of the fused loss against finite differences (float64), with a teacher that rules
    tokens out and a student logit of -inf left out of the top k."""
    student, teacher = logits((5, 9), 21), logits((5, 9), 22)
    teacher[1, 4:] = float("-inf")
    top = top_k_logits(teacher, 3, temperature)
    labels = torch.tensor([0, 2, -100, 8, 5])
    s = student.clone().requires_grad_(True)
    assert torch.autograd.gradcheck(
        lambda s: top_k_token_losses(s, top, labels, temperature, alpha, -100), (s,), eps=1e-6, atol=1e-8
    )
    weights = torch.randn(5, dtype=torch.float64)  # any upstream gradient, through the KL alone too
    assert torch.autograd.gradcheck(lambda s: (weights * top_k_kl_divergence(s, top, temperature)).sum(), (s,))


def test_the_bucket_kl_grows_with_k_up_to_the_full_kl():
    """Grouping tokens never increases a KL: KL_1 <= KL_2 <= ... <= KL_V = KL."""
    student, teacher = logits((5, 16), 9), logits((5, 16), 10)
    values = [top_k_kl_divergence(student, top_k_logits(teacher, k, 1.5), 1.5) for k in range(1, 17)]
    for smaller, larger in zip(values, values[1:], strict=False):
        assert bool((smaller <= larger + 1e-12).all())
    full = rel_entr(softmax(teacher.numpy() / 1.5, axis=-1), softmax(student.numpy() / 1.5, axis=-1)).sum(-1)
    assert np.allclose(values[-1].numpy(), full, rtol=1e-12)


def test_ruled_out_tokens_and_an_empty_remainder_are_exact_with_finite_gradients():
    """A teacher that rules out all but 3 tokens: with k >= 3 the remaining bucket holds nothing; student logits of
    -inf that the teacher also rules out add nothing, in the in-place path too."""
    student, teacher = logits((2, 5, 9), 11), logits((2, 5, 9), 12)
    teacher[..., 3:] = float("-inf")
    student[0, :, 5] = float("-inf")
    labels = torch.randint(0, 3, (2, 5), generator=torch.Generator().manual_seed(13))
    for k in (2, 3, 5):
        s = student.clone().requires_grad_(True)
        distillation = Distillation(nn.Linear(1, 1), temperature=1.0, alpha=0.5, top_k=k)
        loss = distillation(top_k_output(s, teacher, k, 1.0), labels)
        loss.backward()
        expected = bucket_reference(student, teacher, labels, k, 1.0, 0.5)
        assert abs(float(loss.detach()) - expected) <= 1e-12 * max(1.0, abs(expected))
        assert bool(torch.isfinite(s.grad).all())
        assert bool((s.grad[0, :, 5] == 0).all())


def test_the_in_place_and_copying_paths_give_the_same_gradient():
    student, teacher = logits((3, 7, 11), 14), logits((3, 7, 11), 15)
    labels = torch.randint(0, 11, (3, 7), generator=torch.Generator().manual_seed(16))
    distillation = Distillation(nn.Linear(1, 1), temperature=2.0, alpha=0.5, top_k=4)
    fast = student.clone().requires_grad_(True)
    distillation(top_k_output(fast, teacher, 4, 2.0), labels).backward()
    copied = student.clone().requires_grad_(True)  # one more sequence whose labels are all ignored
    padded = torch.cat([labels, torch.full((1, 7), -100)])
    both = torch.cat([teacher, teacher[:1]])
    distillation(top_k_output(torch.cat([copied, student[:1]]), both, 4, 2.0), padded).backward()
    assert torch.allclose(fast.grad, copied.grad, rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
def test_the_kept_logits_are_compact_and_exact(dtype):
    teacher = logits((2, 3, 50), 17, dtype=dtype)
    before = teacher.clone()
    top = top_k_logits(teacher, 8, 2.0)
    assert torch.equal(teacher, before) and torch.equal(
        top_k_logits(teacher, 8, 1.0).rest, top_k_logits(teacher, 8).rest
    )
    assert torch.equal(teacher, before)  # the teacher's logits are read, never written
    assert top.values.dtype == dtype and top.indices.dtype == torch.int32
    assert top.rest.dtype == torch.promote_types(dtype, torch.float32)
    assert top.shape == teacher.shape and top.values.shape == (2, 3, 8)
    assert torch.equal(top.values, teacher.gather(-1, top.indices.long()))  # the logits themselves, unrounded
    assert torch.equal(top.values.sort(-1).values, teacher.topk(8, -1).values.sort(-1).values)
    wide = teacher.double().numpy() / 2.0
    rest = np.array([[logsumexp(np.delete(wide[i, j], top.indices[i, j].numpy())) for j in range(3)] for i in range(2)])
    assert np.allclose(top.rest.double().numpy(), rest, rtol=1e-12 if dtype == torch.float64 else 1e-6)
    assert top_k_logits(teacher, 80, 1.0).values.shape[-1] == 50  # k above the vocabulary: all of it


def test_the_rest_is_formed_in_chunks(monkeypatch):
    teacher = logits((4, 6, 30), 18)
    whole = top_k_logits(teacher, 5, 1.0)
    monkeypatch.setattr("l0bayes.models.top_k_kl.CHUNK_ELEMENTS", 70)  # two rows at a time
    chunked = top_k_logits(teacher, 5, 1.0)
    assert torch.equal(whole.rest, chunked.rest) and torch.equal(whole.indices, chunked.indices)


def test_an_attached_student_gets_the_teachers_top_k():
    teacher, student = tiny_llama(0), tiny_llama(1)
    x = ids()
    distillation = Distillation(teacher, temperature=2.0, alpha=0.5, top_k=5)
    with distillation.attach(student):
        out = student(x)
    assert isinstance(out.teacher_logits, TopKLogits) and out.teacher_logits.values.shape == (4, 12, 5)
    loss = distillation(out, x)
    with torch.no_grad():
        full = teacher(x).logits
    expected = bucket_reference(out.logits, full, x, 5, 2.0, 0.5)
    assert float(loss.detach()) == pytest.approx(expected, rel=1e-5)


# -- the cache ---------------------------------------------------------------------------------------------------


def test_a_repeated_batch_runs_the_teacher_once_and_another_batch_is_a_miss():
    teacher, student = counting(tiny_llama(0)), tiny_llama(1)
    distillation = Distillation(teacher, top_k=8, cache_bytes=1 << 20, hidden_layers=["model.layers.0"])
    a, b = ids(seed=1), ids(seed=2)  # the same shape, dtype and device
    with distillation.attach(student):
        first = student(a)
        second = student(a.clone())  # the same content in another tensor
        assert teacher.calls == 1 and distillation.cache.hits == 1 and distillation.cache.misses == 1
        student(b)
        assert teacher.calls == 2 and distillation.cache.misses == 2 and len(distillation.cache) == 2
        student(a, attention_mask=torch.ones_like(a))  # other arguments: another key
        assert teacher.calls == 3
        student(a, attention_mask=torch.ones_like(a))
        assert teacher.calls == 3 and distillation.cache.hits == 2
    assert all(torch.equal(u, v) for u, v in zip(first.teacher_logits[:3], second.teacher_logits[:3], strict=True))
    hidden = first.teacher_hidden["model.layers.0"]  # the hidden states come from the cache too
    assert torch.equal(hidden, second.teacher_hidden["model.layers.0"])
    assert float(distillation(first, a).detach()) == float(distillation(second, a).detach())


def test_no_false_hit_when_two_inputs_share_a_digest(monkeypatch):
    class Same:
        def __init__(self, data, digest_size):
            pass

        def digest(self):
            return b"0" * 16

    monkeypatch.setattr(teacher_cache_module.hashlib, "blake2b", Same)
    cache = TeacherCache(1 << 20)
    run = lambda args, kwargs: args[0].float() * 2  # noqa: E731
    a, b = torch.tensor([1, 2, 3]), torch.tensor([1, 2, 4])
    assert torch.equal(cache.get_or_compute(run, (a,), {}), a.float() * 2)
    assert torch.equal(cache.get_or_compute(run, (b,), {}), b.float() * 2)  # same key, other bytes: a miss
    assert cache.misses == 2 and cache.hits == 0 and len(cache) == 1
    assert torch.equal(cache.get_or_compute(run, (b,), {}), b.float() * 2) and cache.hits == 1


def test_keys_follow_content_dtype_shape_and_plain_arguments():
    cache = TeacherCache(1 << 20)
    calls = []

    def run(args, kwargs):
        calls.append(1)
        return torch.zeros(2)

    x = torch.arange(6)
    for args, kwargs in [
        ((x,), {}),
        ((x.clone(),), {}),  # hit
        ((x.to(torch.int32),), {}),
        ((x.reshape(2, 3),), {}),
        ((x,), {"flag": True}),
        ((x,), {"flag": 1}),
        ((x,), {"flag": True}),  # hit
        ([x, (x, None)], {"d": {"a": x}}),
        ([x, (x, None)], {"d": {"a": x}}),  # hit
    ]:
        cache.get_or_compute(run, args, kwargs)
    assert cache.hits == 3 and len(calls) == 6
    x[0] = 7  # changed in place: its content is a new key (the cache kept a copy of the bytes)
    cache.get_or_compute(run, (x,), {})
    assert len(calls) == 7
    anything = object()  # an argument that is neither a tensor nor a plain value: never cached
    cache.get_or_compute(run, (x, anything), {})
    cache.get_or_compute(run, (x, anything), {})
    assert len(calls) == 9 and cache.misses == 9


def test_eviction_keeps_the_budget_and_the_least_recently_used_goes_first():
    cache = TeacherCache(1 << 20)
    run = lambda args, kwargs: (args[0].double().repeat(1, 4), {})  # noqa: E731
    batches = [ids(2, 8, seed=s) for s in range(4)]
    cache.get_or_compute(run, (batches[0],), {})
    size = cache.nbytes
    assert size == 2 * 8 * 8 + 2 * 32 * 8  # the ids' bytes kept for comparison and the output's
    cache = TeacherCache(2 * size + size // 2)  # room for two batches
    for b in (0, 1, 0, 2):  # 0 used again after 1: 1 is the least recently used when 2 comes
        cache.get_or_compute(run, (batches[b],), {})
    assert len(cache) == 2 and cache.evictions == 1 and cache.nbytes == 2 * size <= cache.max_bytes
    cache.get_or_compute(run, (batches[0],), {})
    cache.get_or_compute(run, (batches[2],), {})
    assert cache.hits == 3
    cache.get_or_compute(run, (batches[1],), {})  # evicted: a miss
    assert cache.misses == 4 and cache.evictions == 2
    small = TeacherCache(size - 1)  # an output larger than the budget is not kept
    small.get_or_compute(run, (batches[0],), {})
    small.get_or_compute(run, (batches[0],), {})
    assert small.misses == 2 and len(small) == 0 and small.nbytes == 0
    none = TeacherCache(0)  # no cache: every call runs
    none.get_or_compute(run, (batches[0],), {})
    none.get_or_compute(run, (batches[0],), {})
    assert none.misses == 2 and none.hits == 0 and len(none) == 0
    cache.clear()
    assert len(cache) == 0 and cache.nbytes == 0 and "hits=3" in repr(cache)


def test_the_cached_top_k_take_the_bytes_they_announce():
    teacher, student = tiny_llama(0), tiny_llama(1)
    distillation = Distillation(teacher, top_k=8, cache_bytes=1 << 20)
    x = ids(4, 12)
    with distillation.attach(student):
        out = student(x)
    per_token = 8 * 4 + 8 * 4 + 4  # float32 values, int32 indices, the float32 remainder
    assert distillation.cache.nbytes == x.numel() * (per_token + 8)  # plus the int64 ids kept for the comparison
    assert out.teacher_logits.nbytes == x.numel() * per_token


@pytest.mark.parametrize("top_k", [None, 6])
def test_training_on_a_list_of_batches_is_the_same_with_and_without_the_cache(top_k):
    """Three epochs over a list of batches, then a second phase on the same batches: with the cache the teacher
    runs once per distinct batch (and the held-out batch), and the student's parameters are the same bit for bit."""
    teacher = tiny_llama(0)
    batches = [(ids(4, 10, seed=s), ids(4, 10, seed=s)) for s in range(3)]
    results = {}
    for cache_bytes in (0, 1 << 22):
        counted = counting(copy.deepcopy(teacher))
        student = tiny_llama(1).train()
        distillation = Distillation(counted, temperature=2.0, alpha=0.7, top_k=top_k, cache_bytes=cache_bytes)
        with distillation.attach(student):
            for _ in range(2):  # the second phase sees the same windows again
                train(
                    PlainModel(student, distillation),
                    batches,
                    num_data=12,
                    objective="penalized",
                    epochs=3,
                    lr=1e-2,
                    progress=False,
                    device="cpu",
                    seed=0,
                )
        results[cache_bytes] = ([p.detach().clone() for p in student.parameters()], counted.calls, distillation.cache)
    (plain, runs, none), (cached, cached_runs, cache) = results[0], results[1 << 22]
    assert all(torch.equal(a, b) for a, b in zip(plain, cached, strict=True))
    assert none.hits == 0 and none.misses == runs
    assert cache.misses == cached_runs == len(cache) == 3 and cache.hits == runs - 3
    assert runs > 3 * cached_runs


# -- clear errors ----------------------------------------------------------------------------------------------------


def test_errors_name_the_argument():
    teacher = nn.Linear(2, 3)
    for bad in ("64", True, [8]):
        with pytest.raises(TypeError, match="Distillation: top_k must be a whole number >= 1"):
            Distillation(teacher, top_k=bad)
    for bad in (0, -3, 2.5, float("inf")):
        with pytest.raises(ValueError, match="Distillation: top_k must be a whole number >= 1"):
            Distillation(teacher, top_k=bad)
    for bad in ("1GB", False, None):
        with pytest.raises(TypeError, match="Distillation: cache_bytes must be a whole number >= 0"):
            Distillation(teacher, cache_bytes=bad)
    for bad in (-1, 1.5, float("nan")):
        with pytest.raises(ValueError, match="Distillation: cache_bytes must be a whole number >= 0"):
            Distillation(teacher, cache_bytes=bad)
    with pytest.raises(ValueError, match=r"Distillation: top_k needs a temperature < 8.0, got 8.0"):
        Distillation(teacher, temperature=8.0, top_k=16)
    assert Distillation(teacher, temperature=8.0).top_k is None  # the tempered full KL stays available
    distillation = Distillation(teacher, top_k=64.0, cache_bytes=1e6)
    assert distillation.top_k == 64 and distillation.cache.max_bytes == 1_000_000
    assert "top_k=64" in repr(distillation) and "TeacherCache(0 batches" in repr(distillation)
    student, teacher_logits = logits((1, 4, 11), 19), logits((1, 4, 11), 20)
    with pytest.raises(ValueError, match="the teacher's top k are at temperature 2.0, not 1.0"):
        Distillation(nn.Linear(1, 1), top_k=3)(top_k_output(student, teacher_logits, 3, 2.0), ids(1, 4) % 11)
    with pytest.raises(ValueError, match="the student's logits have shape"):
        Distillation(nn.Linear(1, 1), top_k=3)(top_k_output(logits((1, 4, 12), 1), teacher_logits, 3, 1.0), ids(1, 4))
