"""Whether the pruned model equals the gated one: both run on the example inputs in float64, a part at a time.

A float64 copy of a whole model would take four times the memory of a bfloat16 model (twice that of a float32
one), on top of the model and its pruned copy. Instead, each module's floating parameters and buffers are
cast to float64 only while it runs, and put back (the same storage, untouched) when it returns: the whole
module where it holds no more numbers than the largest gated block, its own tensors alone otherwise (the
model, a list of blocks). The memory this takes beyond the two models is that of one block in float64 (or of
the largest single layer outside the blocks, such as the embedding, while it runs), with the activations.
A model whose forward reads the weights of a module it does not call (``x @ self.embedding.weight.T``) does
not run that way (mixed precisions): it is then checked on a float64 copy of the whole model.
"""

import contextlib
import copy
import functools
from collections.abc import Mapping

import torch

from ..hooks import on_device_of
from .attach import FORWARD_ERRORS, run_on_example_inputs


def _tensors(module, recurse):
    """``module``'s floating parameters and ``(owner, name)`` of its floating buffers, below float64 precision."""
    owners = module.named_modules() if recurse else [("", module)]
    params, buffers, seen = [], [], set()
    for _, owner in owners:
        for p in owner._parameters.values():
            if p is not None and id(p) not in seen and p.is_floating_point() and p.dtype != torch.float64:
                seen.add(id(p))
                params.append(p)
        for name, b in owner._buffers.items():
            if b is not None and b.is_floating_point() and b.dtype != torch.float64:
                buffers.append((owner, name))
    return params, buffers


def _numel(params, buffers):
    return sum(p.numel() for p in params) + sum(owner._buffers[name].numel() for owner, name in buffers)


def block_budget(model, resolved):
    """The most numbers a gated block of ``model`` holds (parameters and buffers): what is cast at once."""
    return max((_numel(*_tensors(model.get_submodule(r.name), True)) for r in resolved), default=0)


class InFloat64ByParts:
    """Within the context, every module of ``model`` runs with its floating tensors in float64 (the whole module
    where it holds at most ``budget`` numbers, else its own tensors alone), cast when it is called and put back
    when it returns; everything is put back on leaving, also after an error."""

    def __init__(self, model, budget):
        self.model, self.budget = model, budget
        self.handles, self.frames = [], []

    def __enter__(self):
        for m in self.model.modules():
            params, buffers = _tensors(m, recurse=True)
            if _numel(params, buffers) > self.budget:
                params, buffers = _tensors(m, recurse=False)
            if not params and not buffers:
                continue
            self.handles.append(
                m.register_forward_pre_hook(functools.partial(self._cast, params, buffers), prepend=True)
            )
            self.handles.append(m.register_forward_hook(self._put_back, always_call=True))
        return self

    def __exit__(self, *exc):
        for h in self.handles:
            h.remove()
        while self.frames:
            self._restore(self.frames.pop()[1])
        return False

    def _cast(self, params, buffers, module, args):
        changed = []
        for p in params:
            if p.dtype != torch.float64:  # (not already cast by the call of a module around this one)
                changed.append((p, None, p.data))
                p.data = p.data.double()
        for owner, name in buffers:
            b = owner._buffers.get(name)
            if b is not None and b.is_floating_point() and b.dtype != torch.float64:
                changed.append((owner, name, b))
                owner._buffers[name] = b.double()
        self.frames.append((module, changed))

    def _put_back(self, module, args, output):
        # the frames of this call, and of any call inside it that did not return
        while self.frames:
            owner, changed = self.frames.pop()
            self._restore(changed)
            if owner is module:
                break

    @staticmethod
    def _restore(changed):
        for holder, name, original in reversed(changed):
            if name is None:
                holder.data = original
            else:
                holder._buffers[name] = original


def flat(output):
    """Every floating tensor of a model's output (a tensor, a tuple, a dict or a Hugging Face ``ModelOutput``),
    flattened into one float64 vector."""
    found = []

    def visit(x):
        if torch.is_tensor(x):
            if x.is_floating_point():
                found.append(x.detach().double().flatten())
        elif isinstance(x, Mapping):
            for v in x.values():
                visit(v)
        elif isinstance(x, (tuple, list)):
            for v in x:
                visit(v)

    visit(output)
    return torch.cat(found) if found else torch.zeros(0, dtype=torch.float64)


@contextlib.contextmanager
def _hooks_as_copied(model):
    """Run ``model`` with the forward hooks a copy of it has: the pruned model is a copy, and a hook that says how it
    is copied (``__deepcopy__``; a distillation's hooks, which run the teacher and add its outputs to the model's,
    copy as hooks that do nothing) runs as its copy in the reference too. Other hooks (functions, the gates' bound
    methods) are those of the copy already."""
    saved = []
    for module in model.modules():
        for name in _HOOKS:
            hooks = getattr(module, name)
            own = {k: h for k, h in hooks.items() if hasattr(type(h), "__deepcopy__")}
            if own:
                saved.append((hooks, own))
    try:
        for hooks, own in saved:
            hooks.update({k: copy.deepcopy(h) for k, h in own.items()})
        yield
    finally:
        for hooks, own in saved:
            hooks.update(own)


_HOOKS = ("_forward_pre_hooks", "_forward_hooks")


def gated_reference(model, example_inputs, budget):
    """The probe (``example_inputs`` twice over, floating ones in float64), the gated model's output on it in
    float64 (flattened) and how it was computed (``budget``, or ``None``: on a float64 copy of the whole model):
    the reference the pruned model must reproduce. A ``ValueError`` naming ``example_inputs`` where the gated
    model does not run on them."""
    probe = tuple(
        t.repeat(2, *([1] * (t.dim() - 1))).double() if t.is_floating_point() else t.repeat(2, *([1] * (t.dim() - 1)))
        for t in on_device_of(model, example_inputs)
    )
    try:
        with InFloat64ByParts(model, budget), _hooks_as_copied(model):
            return probe, flat(run_on_example_inputs(model, probe, shown=example_inputs)), budget
    except ValueError:
        pass  # a model that reads weights of modules it does not call, or example inputs it does not take
    gated64 = copy.deepcopy(model).double()
    out = flat(run_on_example_inputs(gated64, probe, shown=example_inputs))
    del gated64
    return probe, out, None


def check_equal(model, plain, probe, a, budget):
    """A ``ValueError`` where the pruned model ``plain`` does not run on ``probe`` or differs from the gated
    ``model``'s output ``a`` there, beyond the rounding of folding the gates in the model's precision. ``plain``
    runs in float64 as the gated model did (``budget``: a part at a time; ``None``: a float64 copy)."""
    try:
        with torch.no_grad():
            if budget is None:
                b = flat(copy.deepcopy(plain).double().eval()(*probe))
            else:
                with InFloat64ByParts(plain.eval(), budget):
                    b = flat(plain(*probe))
    except FORWARD_ERRORS as err:
        first = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise ValueError(
            f"the pruned model does not run ({type(err).__name__}: {first}) where the gated one does: does the "
            "attention's forward read its head count from the attribute prune() lowers, rather than from the "
            "embedding width?"
        ) from None
    # the gates are folded in the precision of the model's parameters (weights and gates): a structural mismatch
    # is far larger than that rounding, relative to the scale of the outputs
    eps = max((torch.finfo(p.dtype).eps for p in model.parameters() if p.is_floating_point()), default=2.0**-23)
    scale = float(a.abs().max()) if a.numel() else 0.0
    if a.shape != b.shape or float((a - b).abs().max()) > 256 * eps * scale:
        raise ValueError(
            "the pruned model differs from the gated one: does the attention's forward read its head count from "
            "the attribute prune() lowers, and is each branch's output its last linear layer's (scaled) output?"
        )
