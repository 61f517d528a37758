r"""Knowledge distillation from a frozen teacher while the gates learn, and after pruning.

:class:`Distillation` is a loss ``(output, target) -> mean loss`` for :class:`~l0bayes.models.SparseModel` (or
:class:`~l0bayes.models.PlainModel`, for a pruned model trained further) that pulls the student towards a frozen
teacher, usually the dense model before it was gated (Hinton, Vinyals & Dean, 2015; CoFi, Xia, Zhong & Chen, 2022,
adds the hidden states):

.. math::

    \mathcal L = \alpha\, T^2\, \overline{\mathrm{KL}}\big(p_t^{(T)} \,\|\, p_s^{(T)}\big)
      + (1 - \alpha)\, \overline{\mathrm{CE}}(s, y)
      + w \sum_{l} \overline{\|h_s^l - h_t^l\|^2} / d,

with :math:`p^{(T)} = \mathrm{softmax}(\text{logits} / T)`, the bars means over the counted tokens (every
position whose label is not ``ignore_index``; for a causal language model, position :math:`t` predicts label
:math:`t + 1`, as Hugging Face's causal LM loss counts them), and :math:`h^l` the outputs of the modules named in
``hidden_layers``. :math:`T^2` keeps the size of the KL term's gradients independent of the temperature.

A loss only sees the output and the target, and the teacher needs the student's input: :meth:`Distillation.attach`
hooks the student, so that every forward pass of the student also runs the teacher (in ``eval()`` mode, under
``torch.no_grad()``) on the same inputs and returns both, as a :class:`DistillationOutput`. Nothing is kept
between calls but the teacher's outputs ``cache_bytes`` asks for, and the teacher is no part of the trained model
(its parameters are neither in the optimiser nor in a checkpoint)::

    distillation = Distillation(teacher, temperature=2.0, alpha=0.5)
    with distillation.attach(gated):  # the student's forward now runs the teacher too
        train(SparseModel(gated, distillation), ids, ids, objective=Constrained(target_density=0.5))
    small = prune(gated)  # outside the block: a plain model again
"""

import math
import numbers
import weakref
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from .._checks import COUNT, NON_NEGATIVE_COUNT, check_args, whole
from .teacher_cache import TeacherCache
from .tempered_kl import tempered_kl_divergence
from .top_k_kl import TopKLogits, top_k_logits, top_k_token_losses

__all__ = ["Distillation", "DistillationHandle", "DistillationOutput"]

#: From this temperature on, the KL term is :func:`~l0bayes.models.tempered_kl.tempered_kl_divergence` (computed
#: from the logit differences, finite at any temperature) rather than the difference of two log-probabilities times
#: :math:`T^2`, whose rounding grows as :math:`T^2`.
TEMPERED_FROM = 8.0


class DistillationOutput(NamedTuple):
    """What an attached student returns: its own output and the teacher's, for :class:`Distillation`'s loss.

    :ivar student: the student's own output (a tensor, a tuple, a Hugging Face ``ModelOutput``, ...).
    :ivar teacher_logits: the teacher's logits on the same inputs, without gradients (or their top k, ``TopKLogits``).
    :ivar student_hidden: ``{name: output}`` of the student's modules named in ``hidden_layers``.
    :ivar teacher_hidden: the same of the teacher (without gradients).
    """

    student: Any
    teacher_logits: Any
    student_hidden: dict
    teacher_hidden: dict

    @property
    def logits(self):
        """The student's logits (so that code reading ``output.logits`` reads the student's)."""
        return _logits(self.student, "the student's output")


class Distillation:
    r"""The distillation loss of a student from a frozen ``teacher``: ``loss(output, target)``, the mean over the
    tokens that count of

    .. math::

        \begin{aligned}
        & \alpha\, T^2\, \mathrm{KL}\big(\mathrm{softmax}(t/T) \,\|\, \mathrm{softmax}(s/T)\big)\\
        & \quad + (1 - \alpha)\, \mathrm{CE}(s, y) + w \sum_l \|h_s^l - h_t^l\|^2 / d,
        \end{aligned}

    with :math:`s, t` the student's and the teacher's logits, :math:`y` the labels and :math:`h^l` the outputs
    (:math:`d` features) of the modules named in ``hidden_layers``; with ``top_k``, the KL is :math:`\sum_{i \in K}
    q_i \log(q_i/p_i) + q_\circ \log(q_\circ/p_\circ)` between both distributions grouped into the teacher's top k
    tokens :math:`K` and one bucket :math:`\circ` for the rest (:mod:`~l0bayes.models.top_k_kl`). A loss of
    :class:`~l0bayes.models.SparseModel` or :class:`~l0bayes.models.PlainModel`; the student runs inside ``with
    distillation.attach(student):``, which makes its forward pass run the teacher on the same inputs too::

        distillation = Distillation(teacher, temperature=2.0, alpha=0.5)
        with distillation.attach(gated):
            train(SparseModel(gated, distillation), ids, ids, objective=Constrained(target_density=0.5))

    :param teacher: the frozen model, e.g. a copy of the dense model taken before
        :func:`~l0bayes.pruning.sparsify_transformer`; it is put in ``eval()`` mode, runs under ``torch.no_grad()``,
        is never updated and follows the inputs to their device. It must share no parameter with the student.
    :param temperature: :math:`T > 0` of the softened distributions of the KL term (any finite value: from
        :data:`TEMPERED_FROM` on the term is computed from the logit differences, so that it stays finite and tends to
        logit matching, :math:`\frac{1}{2C}\sum_i (d_i - \bar d)^2` of the differences :math:`d = t - s` over
        :math:`C` classes, as :math:`T` grows).
    :param alpha: :math:`\alpha \in [0, 1]`, the weight of the KL term; ``1 - alpha`` weighs the cross-entropy with
        the target (``alpha=1``: the target only says which tokens count).
    :param hidden_layers: names of modules (e.g. ``["model.layers.7", "model.layers.15"]``) whose outputs (their
        first tensor) the student matches to the teacher's module of the same name by mean squared error, as CoFi
        does. The names stay valid after :func:`~l0bayes.pruning.prune`, which keeps every block.
    :param hidden_weight: :math:`w \ge 0`, the weight of the hidden-state term.
    :param bool causal: logits at position :math:`t` predict the label at :math:`t + 1` (a causal language model
        trained on its input ids as labels, as Hugging Face shifts them); ``False``: logits and labels are aligned
        (``logits.shape[:-1] == target.shape``, e.g. a classifier). The hidden states are matched at every position
        whose own label counts (when their shape is the target's plus features; otherwise at every position).
    :param int ignore_index: the label of positions that do not count (Hugging Face's ``-100``).
    :param top_k: keep the teacher's logits at each position as their ``top_k`` largest and the log-sum-exp of the
        others (:func:`~l0bayes.models.top_k_kl.top_k_logits`; exact when ``top_k`` is the vocabulary); ``None``:
        all. Needs a temperature below :data:`TEMPERED_FROM` (flat distributions put their mass outside any top k).
    :param int cache_bytes: keep the teacher's outputs (logits or their top k, hidden states) of each batch within
        this many bytes, so that a batch seen again does not run the teacher (``distillation.cache``, a
        :class:`~l0bayes.models.teacher_cache.TeacherCache`, counts hits and misses); ``0``: none. Batches repeat in
        a list of batches; ``train()`` with tensors draws new minibatches every epoch.
    """

    def __init__(
        self,
        teacher,
        temperature=1.0,
        alpha=0.5,
        hidden_layers=(),
        hidden_weight=1.0,
        causal=True,
        ignore_index=-100,
        top_k=None,
        cache_bytes=0,
    ):
        if not isinstance(teacher, nn.Module):
            raise TypeError(f"Distillation: teacher must be a torch.nn.Module, got {type(teacher).__name__}")
        self.teacher = teacher.eval()
        self.temperature = _real("temperature", temperature, lambda v: v > 0, "a finite number > 0")
        self.alpha = _real("alpha", alpha, lambda v: 0 <= v <= 1, "a number in [0, 1]")
        self.hidden_weight = _real("hidden_weight", hidden_weight, lambda v: v >= 0, "a finite number >= 0")
        if isinstance(hidden_layers, str) or not isinstance(hidden_layers, (list, tuple)):
            hint = f" (write [{hidden_layers!r}])" if isinstance(hidden_layers, str) else ""
            raise TypeError(f"Distillation: hidden_layers must be a list of module names, got {hidden_layers!r}{hint}")
        for name in hidden_layers:
            if not isinstance(name, str):
                raise TypeError(f"Distillation: hidden_layers must hold module names (str), got {name!r}")
            _submodule(teacher, name, "the teacher")
        if len(set(hidden_layers)) != len(hidden_layers):
            raise ValueError(f"Distillation: hidden_layers names a module twice: {list(hidden_layers)}")
        self.hidden_layers = tuple(hidden_layers)
        if not isinstance(causal, bool):
            raise TypeError(f"Distillation: causal must be True or False, got {causal!r}")
        self.causal = causal
        if not isinstance(ignore_index, numbers.Integral) or isinstance(ignore_index, bool):
            raise TypeError(f"Distillation: ignore_index must be an int, got {ignore_index!r}")
        self.ignore_index = int(ignore_index)
        rules = {"top_k": COUNT.or_none(), "cache_bytes": NON_NEGATIVE_COUNT}
        check_args("Distillation", rules, top_k=top_k, cache_bytes=cache_bytes)
        self.top_k = None if top_k is None else whole(top_k)
        if self.top_k is not None and self.temperature >= TEMPERED_FROM:
            raise ValueError(f"Distillation: top_k needs a temperature < {TEMPERED_FROM}, got {self.temperature}")
        self.cache = TeacherCache(whole(cache_bytes))
        self._attached = weakref.WeakKeyDictionary()  # student -> its handle

    def __repr__(self):
        hidden = f", hidden_layers={list(self.hidden_layers)}, hidden_weight={self.hidden_weight}"
        return (
            f"Distillation(teacher={type(self.teacher).__name__}, temperature={self.temperature}, alpha={self.alpha}"
            f"{hidden if self.hidden_layers else ''}, causal={self.causal}, top_k={self.top_k}, cache={self.cache})"
        )

    # -- attaching the student -------------------------------------------------------------------------------------

    def attach(self, student):
        """Hook ``student`` so that each of its forward passes also runs the teacher on the same inputs and returns
        a :class:`DistillationOutput`; returns a :class:`DistillationHandle` (``with distillation.attach(s): ...``,
        or ``handle.remove()``).

        A copy of the student (``copy.deepcopy``, :func:`~l0bayes.pruning.prune`'s result) is not attached: its
        forward returns its own output. Leave the block before ``generate()`` or any code that expects the
        student's own output.
        """
        if not isinstance(student, nn.Module):
            raise TypeError(f"Distillation.attach: student must be a torch.nn.Module, got {type(student).__name__}")
        if student is self.teacher:
            raise ValueError("Distillation.attach: the student is the teacher; distil from a frozen copy")
        teacher_parameters = {id(p) for p in self.teacher.parameters()}
        shared = [n for n, p in student.named_parameters() if id(p) in teacher_parameters]
        if shared:
            raise ValueError(
                f"Distillation.attach: the student shares parameters with the teacher ({shared[0]!r}, ...): the "
                "teacher must stay frozen. Gate a copy (sparsify_transformer without inplace=True) or pass "
                "copy.deepcopy(model) as the teacher"
            )
        for name in self.hidden_layers:
            _submodule(student, name, "the student")
        if student in self._attached:
            raise ValueError("Distillation.attach: this student is attached already")
        handle = DistillationHandle(self, student)
        self._attached[student] = handle
        return handle

    @torch.no_grad()
    def teacher_outputs(self, args, kwargs):
        """``(logits, {name: hidden output})`` of the teacher on a student's inputs (moved to the teacher's device
        and floating dtype), in ``eval()`` mode and without gradients (the logits as ``TopKLogits`` with top_k)."""
        teacher = self.teacher
        if teacher.training:
            teacher.eval()
        device = _device_of(args, kwargs)
        parameter = next((p for p in teacher.parameters() if p.is_floating_point()), None)
        if device is not None and parameter is not None and parameter.device != device:
            teacher.to(device)
            parameter = next(p for p in teacher.parameters() if p.is_floating_point())
        dtype = None if parameter is None else parameter.dtype
        args = tuple(_cast(a, dtype) for a in args)
        kwargs = {k: _cast(v, dtype) for k, v in kwargs.items()}
        hidden = {}
        hooks = [
            teacher.get_submodule(name).register_forward_hook(_Capture(hidden, name)) for name in self.hidden_layers
        ]
        try:
            output = teacher(*args, **kwargs)
        finally:
            for hook in hooks:
                hook.remove()
        logits = _logits(output, "the teacher's output")
        return (logits if self.top_k is None else top_k_logits(logits, self.top_k, self.temperature)), hidden

    # -- the loss ------------------------------------------------------------------------------------------------

    def __call__(self, output, target):
        """The mean distillation loss over the counted tokens (module docstring) of an attached student's output.

        A minibatch where no token counts has loss 0 (attached to the graph).
        """
        if not isinstance(output, DistillationOutput):
            raise TypeError(
                f"Distillation: the output must be an attached student's (a DistillationOutput), got "
                f"{type(output).__name__}: run the student inside `with distillation.attach(student):`"
            )
        student = output.logits
        teacher = output.teacher_logits
        if student.shape != teacher.shape:
            raise ValueError(
                f"Distillation: the student's logits have shape {tuple(student.shape)} and the teacher's "
                f"{tuple(teacher.shape)}; they must match (the same vocabulary or classes)"
            )
        top_k = isinstance(teacher, TopKLogits)
        dtype = torch.promote_types(student.dtype, torch.float32)
        student, teacher = student.to(dtype), (teacher if top_k else teacher.to(dtype))
        labels = self._labels(target, student)
        if self.causal and labels.shape[-1] > 0:  # position t predicts label t + 1; the last one predicts nothing
            ignored = labels.new_full((*labels.shape[:-1], 1), self.ignore_index)
            labels = torch.cat([labels[..., 1:], ignored], dim=-1)
        vocabulary = student.shape[-1]
        student, labels = student.reshape(-1, vocabulary), labels.reshape(-1)
        teacher = teacher.rows() if top_k else teacher.reshape(-1, vocabulary)
        counted = labels != self.ignore_index
        count = int(counted.sum())
        tokens = max(count, 1)
        last_positions = labels.numel() // max(target.shape[-1], 1) if self.causal else 0  # one per sequence
        every = count == labels.numel() - last_positions
        if every and (top_k or not bool(torch.isneginf(student).any())):
            rows = (self._exact_token_losses if top_k else self._token_losses)(student, teacher, labels)  # no copies
            loss = torch.where(counted, rows, 0.0).sum() / tokens
        else:  # the counted tokens copied out: padding's logits may be anything
            kept = teacher.rows(counted) if top_k else teacher[counted]
            loss = self._exact_token_losses(student[counted], kept, labels[counted]).sum() / tokens
        if self.hidden_layers:
            loss = loss + self.hidden_weight * self._hidden_loss(output, target, dtype)
        return loss

    def _token_losses(self, student, teacher, labels):
        r"""Each row's ``alpha T^2 KL + (1 - alpha) CE`` from one ``log_softmax`` of the student shared by both terms
        (at ``T = 1``): :math:`\mathrm{KL} = \sum p_t \log p_t - \sum p_t \log p_s`, the first sum without
        gradients. For finite student logits (a student logit of ``-inf`` takes :meth:`_exact_token_losses`). From
        :data:`TEMPERED_FROM` on, the KL term is :func:`~l0bayes.models.tempered_kl.tempered_kl_divergence`."""
        t = self.temperature
        tempered = t >= TEMPERED_FROM
        log_p_s = None if tempered else F.log_softmax(student if t == 1 else student / t, dim=-1)
        loss = 0.0
        if self.alpha > 0 and tempered:
            loss = self.alpha * tempered_kl_divergence(student, teacher, t)
        elif self.alpha > 0:
            with torch.no_grad():
                log_p_t = F.log_softmax(teacher if t == 1 else teacher / t, dim=-1)
                p_t = log_p_t.exp()
                own = (p_t * log_p_t).nan_to_num_(nan=0.0).sum(-1)  # 0 log 0 = 0 where the teacher rules a class out
            loss = self.alpha * t**2 * (own - (p_t * log_p_s).sum(-1))
        if self.alpha < 1:
            log_q = log_p_s if t == 1 else F.log_softmax(student, dim=-1)
            picked = torch.where(labels == self.ignore_index, 0, labels)
            loss = loss - (1 - self.alpha) * log_q.gather(-1, picked[:, None]).squeeze(-1)
        return loss

    def _exact_token_losses(self, student, teacher, labels):
        """Each row's ``alpha T^2 KL + (1 - alpha) CE`` from :func:`kl_divergence` and ``cross_entropy``."""
        if isinstance(teacher, TopKLogits):
            return top_k_token_losses(student, teacher, labels, self.temperature, self.alpha, self.ignore_index)
        loss = student.new_zeros(student.shape[:-1])
        if self.alpha > 0 and self.temperature >= TEMPERED_FROM:
            loss = loss + self.alpha * tempered_kl_divergence(student, teacher, self.temperature)
        elif self.alpha > 0:
            kl = kl_divergence(student / self.temperature, teacher / self.temperature)
            loss = loss + self.alpha * self.temperature**2 * kl
        if self.alpha < 1:
            loss = loss + (1 - self.alpha) * F.cross_entropy(student, labels, reduction="none")
        return loss

    def _labels(self, target, logits):
        if (
            not torch.is_tensor(target)
            or target.is_floating_point()
            or target.is_complex()
            or target.dtype == torch.bool
        ):
            got = f"a {target.dtype} tensor" if torch.is_tensor(target) else type(target).__name__
            raise TypeError(f"Distillation: target must be an integer tensor of labels (class indices), got {got}")
        if target.shape != logits.shape[:-1]:
            raise ValueError(
                f"Distillation: target has shape {tuple(target.shape)}; the logits' shape {tuple(logits.shape)} "
                f"needs labels of shape {tuple(logits.shape[:-1])}"
            )
        if self.causal and logits.dim() < 3:
            raise ValueError(
                f"Distillation(causal=True) needs logits of shape (batch, positions, vocabulary), got "
                f"{tuple(logits.shape)}; for a classifier use causal=False"
            )
        labels = target.to(logits.device)
        if self.alpha < 1:
            bad = (labels != self.ignore_index) & ((labels < 0) | (labels >= logits.shape[-1]))
            if bool(bad.any()):
                raise ValueError(
                    f"Distillation: target holds labels outside [0, {logits.shape[-1]}) other than ignore_index="
                    f"{self.ignore_index}, e.g. {int(labels[bad][0])}"
                )
        return labels

    def _hidden_loss(self, output, target, dtype):
        total = 0.0
        for name in self.hidden_layers:
            s, t = output.student_hidden.get(name), output.teacher_hidden.get(name)
            if s is None or t is None:
                raise ValueError(f"Distillation: the module {name!r} did not run in the forward pass")
            if s.shape != t.shape:
                raise ValueError(
                    f"Distillation: hidden layer {name!r} has shape {tuple(s.shape)} in the student and "
                    f"{tuple(t.shape)} in the teacher"
                )
            s, t = s.to(dtype), t.to(device=s.device, dtype=dtype)
            if s.shape[:-1] == target.shape:
                counted = target.to(s.device) != self.ignore_index
                s, t = s[counted], t[counted]
            squared = (s - t).square().mean(-1) if s.dim() > 0 else (s - t).square()
            total = total + squared.sum() / max(squared.numel(), 1)
        return total


def kl_divergence(student_logits, teacher_logits):
    r""":math:`\mathrm{KL}(p_t \| p_s)` over the last dimension, one value per row, from logits.

    Both sides go through ``log_softmax`` (no probabilities are formed before the logarithm); a class with
    :math:`p_t = 0` adds nothing (also where the student's probability is zero).
    """
    log_p_s = F.log_softmax(student_logits, dim=-1)
    log_p_t = F.log_softmax(teacher_logits, dim=-1)
    p_t = log_p_t.exp()
    return torch.where(p_t > 0, p_t * (log_p_t - log_p_s), 0.0).sum(-1)


class DistillationHandle:
    """The hooks :meth:`Distillation.attach` put on a student; ``remove()`` takes them off (also at the end of a
    ``with`` block)."""

    def __init__(self, distillation, student):
        self.distillation = distillation
        self._student = weakref.ref(student)
        self._capture = None
        hooks = [
            student.register_forward_pre_hook(_Open(self), with_kwargs=True),
            student.register_forward_hook(_Close(self), with_kwargs=True),
        ]
        for name in distillation.hidden_layers:
            hooks.append(student.get_submodule(name).register_forward_hook(_Into(self, name)))
        self._hooks = hooks

    @property
    def attached(self):
        return bool(self._hooks)

    def remove(self):
        for hook in self._hooks:
            hook.remove()
        self._hooks = []
        self._capture = None
        student = self._student()
        if student is not None:
            self.distillation._attached.pop(student, None)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.remove()


class _Hook:
    """A hook of :class:`DistillationHandle`: a copy of the module it hooks (``copy.deepcopy``, ``prune``, a
    pickle) gets an inert hook, so that neither the teacher nor the handle travels with the copy."""

    def __init__(self, handle, name=None):
        self.handle = handle
        self.name = name

    def __deepcopy__(self, memo):
        return _Inert()

    def __reduce__(self):
        return (_Inert, ())


class _Inert:
    def __call__(self, *args, **kwargs):
        return None


class _Open(_Hook):
    def __call__(self, module, args, kwargs):
        self.handle._capture = {}


class _Into(_Hook):
    def __call__(self, module, args, output):
        if self.handle._capture is not None:
            self.handle._capture[self.name] = _first_tensor(output)


class _Close(_Hook):
    def __call__(self, module, args, kwargs, output):
        student_hidden, self.handle._capture = self.handle._capture or {}, None
        distillation = self.handle.distillation  # through its cache: the outputs of a batch seen before are kept
        teacher_logits, teacher_hidden = distillation.cache.get_or_compute(distillation.teacher_outputs, args, kwargs)
        return DistillationOutput(output, teacher_logits, student_hidden, teacher_hidden)


class _Capture:
    def __init__(self, into, name):
        self.into, self.name = into, name

    def __call__(self, module, args, output):
        self.into[self.name] = _first_tensor(output)


def _first_tensor(output):
    if torch.is_tensor(output):
        return output
    if isinstance(output, dict):
        output = list(output.values())
    if isinstance(output, (list, tuple)):
        for part in output:
            found = _first_tensor(part)
            if found is not None:
                return found
    return None


def _logits(output, what):
    """The logits of a model's output: the tensor itself, its ``logits`` (a Hugging Face ``ModelOutput``) or its
    first element (a tuple)."""
    if torch.is_tensor(output):
        logits = output
    elif getattr(output, "logits", None) is not None:
        logits = output.logits
    elif isinstance(output, (list, tuple)) and output and torch.is_tensor(output[0]):
        logits = output[0]
    else:
        logits = None
    if logits is None or not logits.is_floating_point():
        raise TypeError(
            f"Distillation: {what} must be floating-point logits (a tensor, an output with .logits, or a tuple "
            f"whose first element is the logits), got {type(output).__name__}"
        )
    return logits


def _device_of(args, kwargs):
    for value in (*args, *kwargs.values()):
        if torch.is_tensor(value):
            return value.device
    return None


def _cast(value, dtype):
    if dtype is not None and torch.is_tensor(value) and value.is_floating_point() and value.dtype != dtype:
        return value.to(dtype)
    return value


def _submodule(model, name, what):
    try:
        return model.get_submodule(name)
    except AttributeError:
        raise ValueError(f"Distillation: hidden_layers names {name!r}, which is not a module of {what}") from None


def _real(name, value, test, requirement):
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"Distillation: {name} must be {requirement}, got {value!r}")
    value = float(value)
    if not (math.isfinite(value) and test(value)):
        raise ValueError(f"Distillation: {name} must be {requirement}, got {value!r}")
    return value
