"""Forward hooks: how gates act on a model, and how pruning looks inside one.

:func:`~l0bayes.pruning.sparsify` and :func:`~l0bayes.pruning.sparsify_transformer` apply their gates
through forward hooks, which :func:`remove_hooks` takes off again by their owner. The FLOP counters and
the pruning of a sparsified model see the layers' outputs through hooks too, during one forward pass of
the example inputs: :func:`probe_forward`, with the inputs as :func:`as_input_tuple` and
:func:`on_device_of` give them.
"""

import torch

__all__ = ["as_input_tuple", "on_device_of", "probe_forward", "remove_hooks"]


def as_input_tuple(example_inputs):
    """``example_inputs`` as the tuple of a model's positional arguments: a tuple as it is, anything else (a
    tensor) as a tuple of one."""
    return example_inputs if isinstance(example_inputs, tuple) else (example_inputs,)


def on_device_of(module, inputs):
    """``inputs`` (a tuple) on the device of ``module``'s parameters: example inputs are kept as given, often on
    the CPU, while the model may have moved to an accelerator since.

    Entries that are not tensors stay as they are; a module without parameters leaves every entry where it is.
    """
    device = next((p.device for p in module.parameters()), None)
    if device is None:
        return tuple(inputs)
    return tuple(t.to(device) if torch.is_tensor(t) else t for t in inputs)


def probe_forward(module, inputs, handles):
    """One ``eval()``, no-grad forward of ``module`` on ``inputs`` (a tuple, moved to the module's device) for
    the hooks behind ``handles``.

    The hooks are removed and every submodule's training flag restored afterwards, even when the forward raises.
    """
    training = [(m, m.training) for m in module.modules()]
    try:
        module.eval()
        with torch.no_grad():
            module(*on_device_of(module, inputs))
    finally:
        for h in handles:
            h.remove()
        for m, mode in training:
            m.training = mode


def remove_hooks(module, owner):
    """Remove the forward hooks and forward pre-hooks of ``module`` that are bound methods of ``owner`` (a gated
    layer or a gate holder), leaving every other hook in place."""
    for hooks in (module._forward_hooks, module._forward_pre_hooks):
        for key in [k for k, h in hooks.items() if getattr(h, "__self__", None) is owner]:
            del hooks[key]
