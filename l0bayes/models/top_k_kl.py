r"""A teacher's logits kept as their :math:`k` largest per position, and the distillation KL on that support.

:func:`top_k_logits` keeps, per position, the :math:`k` largest logits :math:`t_K` (values and indices) and
:math:`r_t = \log \sum_{i \notin K} e^{t_i / T}`, the log-sum-exp of the logits it leaves out at the temperature
:math:`T`. That is enough to normalise exactly: the teacher's distribution on the :math:`k + 1` categories "each kept
token" and "any other token" is

.. math::

    q_i = e^{t_i/T - Z_t}\ (i \in K), \qquad q_\circ = e^{r_t - Z_t}, \qquad
    Z_t = \log\Big(\sum_{i \in K} e^{t_i/T} + e^{r_t}\Big),

so each kept token has exactly the probability the full softmax gives it, and the rest of the mass is one bucket
(stored as its own log-sum-exp, not as one minus the kept mass, so that a small remainder keeps its precision).
The student's full logits :math:`s` are grouped the same way (:math:`p_i`, :math:`i \in K`, and :math:`p_\circ`
from :math:`r_s = \log\sum_{i \notin K} e^{s_i/T}`), and :func:`top_k_kl_divergence` is the KL between these two
distributions on :math:`k + 1` categories:

.. math::

    \mathrm{KL}_K(q \,\|\, p) = \sum_{i \in K} q_i \log\frac{q_i}{p_i} + q_\circ \log\frac{q_\circ}{p_\circ}.

By the grouping property of the KL it never exceeds the full :math:`\mathrm{KL}(\mathrm{softmax}(t/T) \|
\mathrm{softmax}(s/T))`, equals it when :math:`k` is the vocabulary (:math:`q_\circ = 0`), and its gradient pulls
the student's kept tokens to the teacher's probabilities and its remaining mass, as a whole, to the teacher's.
"""

import math
from typing import NamedTuple

import torch

__all__ = ["TopKLogits", "top_k_kl_divergence", "top_k_logits", "top_k_token_losses"]

#: Logits read at a time (rows times vocabulary) when :func:`top_k_logits` forms the remaining log-sum-exp.
CHUNK_ELEMENTS = 1 << 24


class TopKLogits(NamedTuple):
    r"""A teacher's logits at each position kept as their ``k`` largest (module docstring).

    :ivar values: ``(..., k)`` the ``k`` largest logits, in the logits' dtype.
    :ivar indices: ``(..., k)`` their tokens (``int32``).
    :ivar rest: ``(...,)`` :math:`r_t = \log\sum_{i \notin K} e^{t_i/T}` (at least ``float32``; ``-inf`` where
        nothing is left out).
    :ivar vocabulary: the number of logits at each position.
    :ivar temperature: the :math:`T` of ``rest``.
    """

    values: torch.Tensor
    indices: torch.Tensor
    rest: torch.Tensor
    vocabulary: int
    temperature: float

    @property
    def shape(self):
        """The shape of the full logits these stand for, ``(..., vocabulary)``."""
        return torch.Size((*self.rest.shape, self.vocabulary))

    def rows(self, keep=None):
        """The positions flattened to rows, ``(n, k)`` (``keep``: a boolean mask of the rows to keep)."""
        k = self.values.shape[-1]
        values, indices, rest = self.values.reshape(-1, k), self.indices.reshape(-1, k), self.rest.reshape(-1)
        if keep is not None:
            values, indices, rest = values[keep], indices[keep], rest[keep]
        return self._replace(values=values, indices=indices, rest=rest)

    @property
    def nbytes(self):
        return sum(t.numel() * t.element_size() for t in (self.values, self.indices, self.rest))


@torch.no_grad()
def top_k_logits(logits, k, temperature=1.0):
    """The ``k`` largest of ``logits`` over the last dimension (all of them where ``k`` is the vocabulary or more)
    and the log-sum-exp of the others at ``temperature``, as :class:`TopKLogits`."""
    vocabulary = logits.shape[-1]
    k = min(int(k), vocabulary)
    t = float(temperature)
    values, indices = logits.topk(k, dim=-1)
    wide = torch.promote_types(logits.dtype, torch.float32)
    rows, kept = logits.reshape(-1, vocabulary), indices.reshape(-1, k)
    rest = torch.empty(rows.shape[0], dtype=wide, device=logits.device)
    step = max(1, CHUNK_ELEMENTS // max(vocabulary, 1))
    for start in range(0, rows.shape[0], step):
        part = rows[start : start + step].to(wide, copy=True)  # a copy: the logits stay as they are
        part = (part if t == 1 else part.div_(t)).scatter_(-1, kept[start : start + step], -math.inf)
        rest[start : start + step] = torch.logsumexp(part, dim=-1)
    return TopKLogits(values, indices.to(torch.int32), rest.reshape(logits.shape[:-1]), vocabulary, t)


def top_k_kl_divergence(student_logits, teacher, temperature=1.0):
    r""":math:`\mathrm{KL}_K(q \| p)` (module docstring) per row of ``student_logits`` ``(n, vocabulary)`` against
    ``teacher``, :class:`TopKLogits` of ``n`` rows, at ``temperature``, in the student's dtype.

    A kept token where the teacher's probability is zero adds nothing, as does the remaining bucket where nothing
    is left out. Its gradient is the closed form :math:`\partial \mathrm{KL}_K / \partial s_j = (p_j - q_j)/T` for
    :math:`j \in K` and :math:`p_j (1 - q_\circ / p_\circ)/T` otherwise.
    """
    return _BucketLoss.apply(student_logits, teacher, float(temperature), 1.0, 0.0, None)


def top_k_token_losses(student, teacher, labels, temperature, alpha, ignore_index):
    r"""Each row's :math:`\alpha T^2 \mathrm{KL}_K + (1 - \alpha)\,\mathrm{CE}` for student logits ``(n, vocabulary)``,
    :class:`TopKLogits` of ``n`` rows and ``n`` labels (the label ``ignore_index`` counts as token 0: leave those
    rows out or weigh them 0), both terms from one pass over the logits."""
    if teacher.temperature != temperature:
        raise ValueError(
            f"Distillation: the teacher's top k are at temperature {teacher.temperature}, not {temperature}"
        )
    picked = torch.where(labels == ignore_index, 0, labels)
    return _BucketLoss.apply(student, teacher, float(temperature), alpha * temperature**2, 1 - alpha, picked)


class _BucketLoss(torch.autograd.Function):
    r"""``kl_weight * KL_K + ce_weight * CE`` per row from one exponential pass over the logits,
    :math:`e = e^{(s - m)/T}` with :math:`m` the row's maximum (and :math:`e^{s - m}` for the cross-entropy where
    :math:`T \ne 1`), kept for the gradient as ``cross_entropy`` keeps its log-probabilities. The remaining bucket's
    sum is :math:`e` summed after the kept tokens are zeroed, never the total less the kept ones."""

    @staticmethod
    def forward(ctx, s, teacher, t, kl_weight, ce_weight, labels):
        indices = teacher.indices.long()
        m = s.amax(-1, keepdim=True)
        m = torch.where(torch.isfinite(m), m, 0.0)  # a row of -inf: zeros below, not nan
        shifted = s - m
        e_ce = shifted.exp() if ce_weight and t != 1 else None
        e = shifted.exp_() if t == 1 else shifted.div_(t).exp_()
        e_kept = e.gather(-1, indices)
        e.scatter_(-1, indices, 0.0)
        rest = e.sum(-1)
        total = rest + e_kept.sum(-1)
        log_total = total.log()
        x_kept = (s.gather(-1, indices) - m) / t
        log_p = torch.cat([x_kept - log_total[:, None], (rest.log() - log_total)[:, None]], -1)
        t_kept = teacher.values.to(s.dtype)
        t_kept = t_kept if t == 1 else t_kept / t
        t_rest = teacher.rest.to(s.dtype)
        z_t = torch.logaddexp(torch.logsumexp(t_kept, dim=-1), t_rest)
        log_q = torch.cat([t_kept - z_t[:, None], (t_rest - z_t)[:, None]], dim=-1)
        q = log_q.exp()
        loss = kl_weight * torch.where(q > 0, q * (log_q - log_p), 0.0).sum(-1) if kl_weight else total * 0
        total_ce = total if e_ce is None else e_ce.sum(-1)
        if ce_weight:  # log sum_i e^{s_i} - s_y
            loss = loss + ce_weight * (total_ce.log() - (s.gather(-1, labels[:, None]) - m)[:, 0])
        ctx.save_for_backward(e, e_ce, indices, e_kept, total, rest, total_ce, q, labels)
        ctx.constants = (t, kl_weight, ce_weight)
        return loss

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad):
        e, e_ce, indices, e_kept, total, rest, total_ce, q, labels = ctx.saved_tensors
        t, kl_weight, ce_weight = ctx.constants
        q_rest = q[:, -1]
        ratio = torch.where((q_rest > 0) & (rest > 0), q_rest / torch.where(rest > 0, rest, 1.0) * total, 0.0)
        kl = grad * (kl_weight / t)  # d(kl_weight KL_K)/ds = kl_weight / T dKL_K/d(s/T)
        ce = grad * ce_weight if e_ce is None else 0.0 * grad  # the cross-entropy's p, where it shares e
        g = e * ((kl * (1 - ratio) + ce) / total)[:, None]  # the tokens left out: p (1 - q_o/p_o)
        p_kept = e_kept / total[:, None]
        g.scatter_(-1, indices, kl[:, None] * (p_kept - q[:, :-1]) + ce[:, None] * p_kept)
        if e_ce is not None:
            g.addcmul_(e_ce, (grad * ce_weight / total_ce)[:, None])
        if ce_weight:
            g.scatter_add_(-1, labels[:, None], -(grad * ce_weight)[:, None])
        return g, None, None, None, None, None
