"""Distillation from a frozen teacher (l0bayes.models.Distillation) and PlainModel, the loss of a pruned model
trained further: the loss against independent computations (scipy, Hugging Face's own causal LM loss), the
teacher frozen, the hooks' life cycle, and a tiny Llama gated, trained, pruned and trained on."""

import copy
import math

import numpy as np
import pytest
import torch
from scipy.special import log_softmax as np_log_softmax
from scipy.special import rel_entr, softmax
from torch import nn

from l0bayes.inference import train
from l0bayes.models import Distillation, DistillationOutput, PlainModel, SparseModel
from l0bayes.models.distillation import kl_divergence
from l0bayes.models.tempered_kl import tempered_kl_divergence
from l0bayes.nn import gates_of
from l0bayes.pruning import fix_architecture, prune, sparsify_transformer

transformers = pytest.importorskip("transformers")


def tiny_llama(seed=0, layers=2):
    config = transformers.LlamaConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=64,
        max_position_embeddings=32,
        use_cache=False,
    )
    torch.manual_seed(seed)
    return transformers.LlamaForCausalLM(config).eval()


def ids(n=32, t=16, seed=0):
    return torch.randint(0, 64, (n, t), generator=torch.Generator().manual_seed(seed))


def output_of(student, teacher, hidden=None):
    return DistillationOutput(student, teacher, hidden or {}, hidden or {})


def reference(student, teacher, labels, temperature, alpha, causal=True):
    """The loss in float64 with scipy: T^2 KL(p_t || p_s) and the cross-entropy, over the counted positions."""
    s, t, y = (np.asarray(a.detach(), dtype=np.float64) for a in (student, teacher, labels))
    if causal:
        s, t, y = s[:, :-1], t[:, :-1], y[:, 1:]
    keep = y != -100
    s, t, y = s[keep], t[keep], y[keep].astype(int)
    kl = rel_entr(softmax(t / temperature, axis=-1), softmax(s / temperature, axis=-1)).sum(-1)
    ce = -np_log_softmax(s, axis=-1)[np.arange(len(y)), y]
    n = max(len(y), 1)
    return alpha * temperature**2 * kl.sum() / n + (1 - alpha) * ce.sum() / n


# -- the loss against independent computations ------------------------------------------------------------------


@pytest.mark.parametrize("dtype, tol", [(torch.float64, 1e-12), (torch.float32, 1e-5)])
@pytest.mark.parametrize("temperature, alpha", [(1.0, 1.0), (2.0, 0.5), (0.5, 0.0), (3.0, 0.9)])
def test_loss_equals_scipy(dtype, tol, temperature, alpha):
    g = torch.Generator().manual_seed(1)
    student = 3 * torch.randn(3, 7, 11, generator=g, dtype=torch.float64)
    teacher = 3 * torch.randn(3, 7, 11, generator=g, dtype=torch.float64)
    labels = torch.randint(0, 11, (3, 7), generator=g)
    labels[0, 2:5] = -100
    labels[2, :] = -100
    loss = Distillation(nn.Linear(1, 1), temperature=temperature, alpha=alpha)(
        output_of(student.to(dtype), teacher.to(dtype)), labels
    )
    assert loss.dtype == dtype
    expected = reference(student, teacher, labels, temperature, alpha)
    assert abs(float(loss) - expected) <= tol * max(1.0, abs(expected))


@pytest.mark.parametrize("dtype, tol", [(torch.float64, 1e-12), (torch.float32, 1e-5)])
@pytest.mark.parametrize("temperature, alpha", [(1.0, 0.5), (2.0, 0.5), (1.0, 1.0), (0.5, 0.0)])
@pytest.mark.parametrize("causal", [True, False])
def test_every_token_counted_equals_scipy_and_the_copying_path(dtype, tol, temperature, alpha, causal, monkeypatch):
    """With every token counted the loss reads the logits in place (one log_softmax of the student for both
    terms); its value equals scipy's and its gradient the gradient through the counted tokens copied out, the
    path taken when some label is ignored (a teacher that rules a class out included)."""
    g = torch.Generator().manual_seed(3)
    student = (3 * torch.randn(3, 7, 11, generator=g, dtype=torch.float64)).to(dtype)
    teacher = (3 * torch.randn(3, 7, 11, generator=g, dtype=torch.float64)).to(dtype)
    teacher[1, 2, 4] = float("-inf")
    labels = torch.randint(0, 11, (3, 7), generator=g)
    distillation = Distillation(nn.Linear(1, 1), temperature=temperature, alpha=alpha, causal=causal)
    fast = student.clone().requires_grad_(True)
    with monkeypatch.context() as patch:  # the in-place path, not the copies
        patch.setattr(Distillation, "_exact_token_losses", None)
        loss = distillation(output_of(fast, teacher), labels)
    loss.backward()
    expected = reference(student, teacher, labels, temperature, alpha, causal=causal)
    assert loss.dtype == dtype and abs(float(loss.detach()) - expected) <= tol * max(1.0, abs(expected))
    copied = student.clone().requires_grad_(True)  # the other path: an extra sequence whose labels are all ignored
    padded = torch.cat([labels, torch.full((1, 7), -100)])
    distillation(output_of(torch.cat([copied, student[:1]]), torch.cat([teacher, teacher[:1]])), padded).backward()
    assert torch.allclose(fast.grad, copied.grad, rtol=tol, atol=tol * float(copied.grad.abs().max()))


def test_a_student_logit_of_minus_infinity_is_exact():
    """A class the student rules out where the teacher does too adds nothing (no nan from 0 * -inf)."""
    student = torch.tensor([[[0.3, float("-inf"), 2.0, 0.0], [1.0, float("-inf"), 0.0, 0.5]]], dtype=torch.float64)
    teacher = torch.tensor([[[1.0, float("-inf"), 0.5, -2.0], [0.0, float("-inf"), 1.0, 0.0]]], dtype=torch.float64)
    labels = torch.tensor([[0, 2]])
    loss = Distillation(nn.Linear(1, 1), alpha=0.5)(output_of(student, teacher), labels)
    assert float(loss) == pytest.approx(reference(student, teacher, labels, 1.0, 0.5), rel=1e-12)


def test_aligned_labels_of_a_classifier_equal_scipy():
    g = torch.Generator().manual_seed(2)
    student, teacher = torch.randn(9, 5, generator=g, dtype=torch.float64), torch.randn(9, 5, generator=g).double()
    labels = torch.randint(0, 5, (9,), generator=g)
    labels[3] = -100
    loss = Distillation(nn.Linear(1, 1), temperature=2.0, alpha=0.3, causal=False)(output_of(student, teacher), labels)
    expected = reference(student[None], teacher[None], labels[None], 2.0, 0.3, causal=False)
    assert float(loss) == pytest.approx(expected, rel=1e-12)


def test_cross_entropy_part_is_hugging_faces_causal_lm_loss():
    """alpha=0: the loss of LlamaForCausalLM(input_ids, labels=...) itself (shifted labels, -100 ignored)."""
    model = tiny_llama()
    x = ids(4, 12)
    labels = x.clone()
    labels[0, :5] = -100
    labels[3, 7:] = -100
    with torch.no_grad():
        hf = model(x, labels=labels)
    loss = Distillation(tiny_llama(seed=1), alpha=0.0)(output_of(hf, hf.logits), labels)
    assert float(loss) == pytest.approx(float(hf.loss), rel=1e-6)


def test_kl_is_exact_where_the_teacher_gives_zero_probability():
    """A class the teacher rules out (logit -inf, p_t = 0) adds nothing: scipy's rel_entr(0, q) = 0."""
    student = torch.tensor([[0.3, -1.0, 2.0, 0.0]], dtype=torch.float64)
    teacher = torch.tensor([[1.0, float("-inf"), 0.5, -2.0]], dtype=torch.float64)
    kl = kl_divergence(student, teacher)
    expected = rel_entr(softmax(teacher.numpy(), -1), softmax(student.numpy(), -1)).sum()
    assert torch.isfinite(kl).all() and float(kl) == pytest.approx(expected, rel=1e-12)
    # far apart logits: no overflow, no probabilities formed before the logarithm
    big = torch.tensor([[800.0, -800.0]], dtype=torch.float32)
    assert float(kl_divergence(big, big.flip(-1))) == pytest.approx(1600.0, rel=1e-6)


def _precise_scaled_kl(student, teacher, temperature):
    """T^2 KL(softmax(t/T) || softmax(s/T)) of every row in mpmath, with the digits the cancellation of order T^2
    takes and 50 more (the rounding of a float64 computation would be multiplied by T^2); a class both rule out
    (-inf) is left out."""
    mpmath = pytest.importorskip("mpmath")
    with mpmath.workdps(50 + 2 * max(0, math.ceil(math.log10(temperature)))):
        out, scale = [], mpmath.mpf(temperature)
        for s_row, t_row in zip(student.tolist(), teacher.tolist(), strict=True):
            pairs = [(mpmath.mpf(s) / scale, mpmath.mpf(t) / scale) for s, t in zip(s_row, t_row, strict=True)]
            pairs = [(s, t) for s, t in pairs if not (mpmath.isinf(s) and mpmath.isinf(t))]
            log_zs = mpmath.log(mpmath.fsum(mpmath.exp(s) for s, _ in pairs))
            log_zt = mpmath.log(mpmath.fsum(mpmath.exp(t) for _, t in pairs))
            counted = [(s, t) for s, t in pairs if t > -mpmath.inf]  # p_t = 0 adds nothing
            kl = mpmath.fsum(mpmath.exp(t - log_zt) * ((t - log_zt) - (s - log_zs)) for s, t in counted)
            out.append(float(kl * scale**2))
    return np.array(out)


def _precise_loss(student, teacher, labels, temperature, alpha):
    """The loss of a causal student (labels shifted, -100 ignored) from :func:`_precise_scaled_kl`."""
    s, t, y = student[:, :-1], teacher[:, :-1], labels[:, 1:]
    keep = y != -100
    s, t, y = s[keep].double(), t[keep].double(), y[keep]
    ce = -np_log_softmax(s.numpy(), axis=-1)[np.arange(len(y)), y.numpy()]
    return (alpha * _precise_scaled_kl(s, t, temperature).sum() + (1 - alpha) * ce.sum()) / max(len(y), 1)


@pytest.mark.parametrize("dtype, tol", [(torch.float64, 1e-12), (torch.float32, 1e-5)])
@pytest.mark.parametrize("temperature", [8.0, 50.0, 1e4, 1e30, 1e300])
@pytest.mark.parametrize("padded", [False, True], ids=["in place", "copied"])
def test_a_high_temperature_gives_the_exact_finite_loss(dtype, tol, temperature, padded):
    """T^2 KL at any temperature to the dtype's precision (Distillation(temperature=1e30) was NaN: a KL of about 0
    times T^2 = inf), on both paths: every token counted, and the counted tokens copied out (a padded position)."""
    g = torch.Generator().manual_seed(4)
    student = (3 * torch.randn(2, 5, 6, generator=g, dtype=torch.float64)).to(dtype)
    teacher = (3 * torch.randn(2, 5, 6, generator=g, dtype=torch.float64)).to(dtype)
    labels = torch.randint(0, 6, (2, 5), generator=g)
    if padded:
        labels[1, 3] = -100
    fast = student.clone().requires_grad_(True)
    loss = Distillation(nn.Linear(1, 1), temperature=temperature, alpha=0.7)(output_of(fast, teacher), labels)
    expected = _precise_loss(student, teacher, labels, temperature, 0.7)
    assert loss.dtype == dtype and abs(float(loss.detach()) - expected) <= tol * max(1.0, abs(expected))
    loss.backward()
    assert torch.isfinite(fast.grad).all()


def test_an_infinite_temperature_is_logit_matching_with_its_gradient():
    """As T grows, T^2 KL tends to (1/2C) sum_i (d_i - mean d)^2 of the logit differences d = t - s (Hinton et al.);
    at T = 1e30 they agree to rounding, and so do their gradients."""
    g = torch.Generator().manual_seed(5)
    student = torch.randn(7, 9, generator=g, dtype=torch.float64, requires_grad=True)
    teacher = torch.randn(7, 9, generator=g, dtype=torch.float64)
    loss = Distillation(nn.Linear(1, 1), temperature=1e30, alpha=1.0, causal=False)(
        output_of(student, teacher), torch.zeros(7, dtype=torch.long)
    )
    (grad,) = torch.autograd.grad(loss, student)
    reference_student = student.detach().clone().requires_grad_(True)
    d = teacher - reference_student
    matching = (d - d.mean(-1, keepdim=True)).square().mean(-1).div(2).mean()
    (expected_grad,) = torch.autograd.grad(matching, reference_student)
    assert float(loss) == pytest.approx(float(matching), rel=1e-12)
    assert torch.allclose(grad, expected_grad, rtol=1e-10, atol=1e-14)


@pytest.mark.parametrize("temperature", [20.0, 1e30])
def test_a_high_temperature_with_classes_ruled_out_is_exact(temperature):
    """A class both rule out adds nothing at any temperature; one only the teacher rules out keeps T^2 KL growing
    as T^2 (its exact value, infinite once that is beyond the dtype); one only the student rules out is infinite."""
    inf = float("-inf")
    student = torch.tensor([[0.3, inf, 2.0, 0.0], [1.0, -0.5, 0.0, 0.5], [0.2, inf, 0.1, 0.0]], dtype=torch.float64)
    teacher = torch.tensor([[1.0, inf, 0.5, -2.0], [0.0, inf, 1.0, 0.0], [0.0, 0.3, 0.1, 0.0]], dtype=torch.float64)
    rows = tempered_kl_divergence(student.requires_grad_(True), teacher, temperature)
    expected = _precise_scaled_kl(student.detach(), teacher, temperature)
    assert rows.detach().tolist()[:2] == pytest.approx(expected[:2].tolist(), rel=1e-12)
    assert float(rows[2].detach()) == float("inf")
    rows[:2].sum().backward()
    assert torch.isfinite(student.grad).all()


def test_no_counted_token_gives_zero_with_finite_gradients():
    student = torch.randn(2, 5, 7, requires_grad=True)
    labels = torch.full((2, 5), -100)
    loss = Distillation(nn.Linear(1, 1), alpha=0.5)(output_of(student, torch.randn(2, 5, 7)), labels)
    loss.backward()
    assert float(loss.detach()) == 0.0 and torch.equal(student.grad, torch.zeros_like(student))


@pytest.mark.parametrize("positions", [0, 1])
def test_sequences_too_short_to_predict_give_zero(positions):
    """A causal sequence of 0 or 1 positions has no next token to predict: loss 0, gradients 0."""
    student = torch.randn(2, positions, 7, requires_grad=True)
    labels = torch.zeros(2, positions, dtype=torch.long)
    loss = Distillation(nn.Linear(1, 1), alpha=0.5)(output_of(student, torch.randn(2, positions, 7)), labels)
    loss.backward()
    assert float(loss.detach()) == 0.0 and torch.equal(student.grad, torch.zeros_like(student))


# -- the teacher, attached ------------------------------------------------------------------------------------------


def test_zero_when_the_student_is_the_teachers_copy():
    teacher = tiny_llama()
    student = copy.deepcopy(teacher)
    x = ids(4, 12)
    distillation = Distillation(teacher, temperature=2.0, alpha=1.0, hidden_layers=["model.layers.0", "model.norm"])
    with distillation.attach(student):
        out = student(x)
    assert isinstance(out, DistillationOutput) and set(out.student_hidden) == {"model.layers.0", "model.norm"}
    assert float(distillation(out, x).detach()) == 0.0


def test_hidden_term_is_the_mean_squared_error_over_counted_positions():
    teacher, student = tiny_llama(seed=0), tiny_llama(seed=1)
    x = ids(3, 10)
    labels = x.clone()
    labels[1, 4:] = -100
    name = "model.layers.0"
    distillation = Distillation(teacher, alpha=1.0, hidden_layers=[name], hidden_weight=0.25)
    with distillation.attach(student), torch.no_grad():
        out = student(x)
    hidden_only = float(distillation(out, labels)) - float(Distillation(teacher, alpha=1.0)(out, labels))
    s, t = out.student_hidden[name].double().numpy(), out.teacher_hidden[name].double().numpy()
    keep = labels.numpy() != -100
    expected = 0.25 * ((s - t) ** 2).mean(-1)[keep].mean()
    assert hidden_only == pytest.approx(expected, rel=1e-4)
    # the teacher's hidden state is its own module's output, not the student's
    with torch.no_grad():
        reference_state = teacher(x, output_hidden_states=True).hidden_states[1]  # after block 0
    assert torch.allclose(out.teacher_hidden[name], reference_state)


def test_gradients_reach_the_student_only_and_the_teacher_stays_frozen():
    teacher, student = tiny_llama(seed=0), tiny_llama(seed=1).train()
    before = copy.deepcopy(teacher.state_dict())
    distillation = Distillation(teacher, temperature=2.0, alpha=0.5)
    teacher.train()  # put back in training mode by the user: the forward still runs it in eval mode
    with distillation.attach(student):
        out = student(ids(4, 12))
        distillation(out, ids(4, 12)).backward()
    assert not teacher.training
    assert all(p.grad is None for p in teacher.parameters())
    assert all(p.grad is not None for p in student.parameters())
    assert not out.teacher_logits.requires_grad
    assert all(torch.equal(before[k], v) for k, v in teacher.state_dict().items())


def test_the_teacher_is_no_part_of_the_trained_model_and_nothing_is_kept_between_steps():
    teacher = tiny_llama()
    gated = sparsify_transformer(copy.deepcopy(teacher), example_inputs=ids(2, 8))
    distillation = Distillation(teacher, hidden_layers=["model.layers.0"])
    model = SparseModel(gated, distillation)
    teacher_ids = {id(p) for p in teacher.parameters()}
    assert not teacher_ids & {id(p) for p in model.parameters()}
    assert not any(k.startswith("teacher") for k in model.state_dict())
    with distillation.attach(gated) as handle:
        model(ids(2, 8))
        assert handle._capture is None  # the hidden states went into the output, none stay behind
    held = [v for v in vars(distillation).values() if torch.is_tensor(v)]
    assert held == [] and not handle.attached


def test_a_float64_student_with_a_float32_teacher():
    teacher = nn.Sequential(nn.Linear(3, 4))
    student = nn.Sequential(nn.Linear(3, 4)).double()
    x = torch.randn(5, 3, dtype=torch.float64)
    y = torch.randint(0, 4, (5,))
    distillation = Distillation(teacher, alpha=0.5, causal=False, hidden_layers=["0"])
    with distillation.attach(student):
        loss = distillation(student(x), y)
    with torch.no_grad():
        t = teacher(x.float())
    expected = reference(student(x)[None], t[None], y[None], 1.0, 0.5, causal=False)
    expected += float(((student(x) - t.double()) ** 2).mean().detach())
    assert loss.dtype == torch.float64 and float(loss.detach()) == pytest.approx(expected, rel=1e-6)


def test_a_copy_or_a_pruned_model_is_not_attached_and_removing_detaches():
    teacher = tiny_llama()
    gated = sparsify_transformer(copy.deepcopy(teacher), example_inputs=ids(2, 8))
    distillation = Distillation(teacher)
    x = ids(2, 8)
    with distillation.attach(gated):
        assert isinstance(gated(x), DistillationOutput)
        assert not isinstance(copy.deepcopy(gated)(x), DistillationOutput)
        small = prune(gated.eval())  # inside the block: prune's deep copy is a plain model
        assert not isinstance(small(x), DistillationOutput)
    assert not isinstance(gated(x), DistillationOutput)
    distillation.attach(gated).remove()  # attachable again once removed
    assert not isinstance(gated(x), DistillationOutput)


# -- training ----------------------------------------------------------------------------------------------------


def kl_of(model, teacher, x):
    distillation = Distillation(teacher, alpha=1.0)
    with distillation.attach(model), torch.no_grad():
        return float(distillation(model.eval()(x), x))


def test_a_gated_llama_distilled_while_its_masks_learn_then_pruned_and_trained_on():
    teacher = tiny_llama(seed=0)
    x = ids(32, 16, seed=3)
    # a student that starts far from the teacher (other random weights)
    gated = sparsify_transformer(tiny_llama(seed=1), example_inputs=x[:2], layers=False, init_drop_rate=0.1)
    kl_start = kl_of(gated, teacher, x)
    distillation = Distillation(teacher, temperature=2.0, alpha=1.0)
    with distillation.attach(gated):
        result = train(
            SparseModel(gated, distillation, lam=0.0),
            x,
            x,
            objective="penalized",
            epochs=8,
            batch_size=8,
            lr=1e-2,
            progress=False,
            device="cpu",
            validation_data=(x[:8], x[:8]),
        )
    kl_trained = kl_of(gated, teacher, x)
    assert kl_trained < 0.5 * kl_start
    assert result.history[-1]["validation_loss"] > 0  # the held-out loss ran the teacher too
    # one architecture, pruned, and trained on with the same loss as a plain model
    fix_architecture(gated, num_key_value_heads=1, intermediate_size=32)
    small = prune(gated.eval())
    assert not gates_of(small) and small.config.num_key_value_heads == 1
    kl_pruned = kl_of(small, teacher, x)
    with distillation.attach(small):
        result = train(
            PlainModel(small, distillation),
            x,
            x,
            objective="penalized",
            epochs=8,
            batch_size=8,
            lr=1e-2,
            progress=False,
            device="cpu",
        )
    assert result.history[-1]["code_cost"] == 0.0 and result.history[-1]["expected_l0"] == 0.0
    assert kl_of(small, teacher, x) < 0.5 * kl_pruned
    # the teacher never moved
    assert all(torch.equal(a, b) for a, b in zip(teacher.parameters(), tiny_llama(seed=0).parameters(), strict=True))


def test_plain_model_trains_as_the_data_term_alone():
    """PlainModel's penalized and bayes losses are N * loss_fn, with zero code cost and KL."""
    torch.manual_seed(0)
    net = nn.Linear(3, 2)
    x, y = torch.randn(8, 3), torch.randint(0, 2, (8,))
    model = PlainModel(net, nn.functional.cross_entropy)
    nll, cost = model.penalized_loss(x, y, 100)
    expected = 100 * nn.functional.cross_entropy(net(x), y)
    assert torch.allclose(nll, expected) and float(cost.detach()) == 0.0
    assert [float(v.detach()) for v in model.bayes_loss(x, y, 100)] == pytest.approx([float(expected.detach()), 0, 0])
    result = train(model, x, y, objective="bayes", epochs=2, batch_size=4, progress=False, device="cpu")
    assert result.history[-1]["gate_kl"] == 0.0


# -- clear errors ----------------------------------------------------------------------------------------------------


def test_errors_name_the_argument():
    teacher = tiny_llama()
    with pytest.raises(TypeError, match="teacher must be a torch.nn.Module"):
        Distillation("gpt2")
    with pytest.raises(ValueError, match="temperature must be a finite number > 0, got 0.0"):
        Distillation(teacher, temperature=0)
    with pytest.raises(TypeError, match="temperature"):
        Distillation(teacher, temperature=True)
    with pytest.raises(ValueError, match=r"alpha must be a number in \[0, 1\], got 1.5"):
        Distillation(teacher, alpha=1.5)
    with pytest.raises(ValueError, match="hidden_weight"):
        Distillation(teacher, hidden_weight=float("nan"))
    with pytest.raises(TypeError, match=r"hidden_layers must be a list of module names.*write \['model.norm'\]"):
        Distillation(teacher, hidden_layers="model.norm")
    with pytest.raises(ValueError, match="hidden_layers names 'model.layer.0', which is not a module of the teacher"):
        Distillation(teacher, hidden_layers=["model.layer.0"])
    with pytest.raises(TypeError, match="causal must be True or False"):
        Distillation(teacher, causal=1)
    with pytest.raises(TypeError, match="ignore_index must be an int"):
        Distillation(teacher, ignore_index=-100.0)
    distillation = Distillation(teacher)
    with pytest.raises(ValueError, match="the student is the teacher"):
        distillation.attach(teacher)
    other = tiny_llama()
    with pytest.raises(ValueError, match="the student is the teacher"):  # gated in place: the teacher itself
        Distillation(other).attach(sparsify_transformer(other, example_inputs=ids(2, 8), inplace=True))
    with pytest.raises(ValueError, match=r"shares parameters with the teacher \('0.weight'"):
        distillation.attach(nn.Sequential(teacher.model.embed_tokens, nn.Linear(32, 64)))
    student = tiny_llama(seed=1)
    with pytest.raises(TypeError, match=r"output must be an attached student's.*distillation.attach\(student\)"):
        distillation(student(ids(2, 8)), ids(2, 8))
    with distillation.attach(student):
        with pytest.raises(ValueError, match="attached already"):
            distillation.attach(student)
        out = student(ids(2, 8))
    with pytest.raises(TypeError, match="target must be an integer tensor of labels"):
        distillation(out, ids(2, 8).float())
    with pytest.raises(ValueError, match=r"target has shape \(2, 7\).*labels of shape \(2, 8\)"):
        distillation(out, ids(2, 7))
    with pytest.raises(ValueError, match="labels outside \\[0, 64\\)"):
        distillation(out, ids(2, 8) + 64)
    with pytest.raises(ValueError, match=r"Distillation\(causal=True\) needs logits of shape"):
        Distillation(nn.Linear(1, 1))(output_of(torch.randn(4, 3), torch.randn(4, 3)), torch.zeros(4, dtype=torch.long))
    with pytest.raises(ValueError, match="the student's logits have shape"):
        distillation(output_of(torch.randn(2, 8, 64), torch.randn(2, 8, 65)), ids(2, 8))
    with pytest.raises(ValueError, match="not a module of the student"):
        Distillation(teacher, hidden_layers=["model.layers.1"]).attach(tiny_llama(layers=1))


def test_plain_model_errors():
    with pytest.raises(TypeError, match="net must be a torch.nn.Module"):
        PlainModel(lambda x: x, nn.functional.mse_loss)
    with pytest.raises(TypeError, match="loss_fn must be a function"):
        PlainModel(nn.Linear(2, 2), "mse")
    gated = sparsify_transformer(tiny_llama(), example_inputs=ids(2, 8))
    with pytest.raises(ValueError, match="net has .* HardConcreteGate modules.*SparseModel"):
        PlainModel(gated, nn.functional.mse_loss)
    model = PlainModel(nn.Linear(2, 2), lambda out, y: 1.0)
    with pytest.raises(TypeError, match="loss_fn .* must return the mean loss"):
        model.penalized_loss(torch.randn(3, 2), torch.randn(3, 2), 3)
