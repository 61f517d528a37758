"""A pruned Hugging Face model's config: the kept sizes, so that ``save_pretrained`` / ``from_pretrained`` work.

Nothing here imports ``transformers``: a model is a Hugging Face model when it has a ``config`` with
``to_dict`` (the pruned model itself, or the Hugging Face models inside a module of your own). A config
describes one size for every block: the pruned model is described when every block keeps the same number of
query heads, key-value heads and MLP units and keeps both of its branches (a block with a closed branch has no
place in the config of its class), and when its config class has entries for them: Llama, Qwen2 and Mistral
set the heads, key-value heads and head width, but GPT-2, OPT, GPT-NeoX, BERT and DistilBERT derive the head
width from the embedding width and the head count, so they describe all the heads and no fewer. Whether the
new config describes the model is checked, not assumed: a model of the same class is built from it (on the
``meta`` device: no memory) and its parameter shapes compared with the pruned model's. Where it does not, the
model keeps its config, ``prune`` warns, and the model's ``save_pretrained`` raises a ``ValueError`` saying
what its config class describes, rather than writing a folder ``from_pretrained`` cannot load.
"""

import copy

import torch

from ..._warnings import warn
from .attention import ZeroBranch
from .projections import features

#: Config entries of the MLP's width, by family (Llama, GPT-NeoX, BERT: ``intermediate_size``; GPT-2:
#: ``n_inner``; OPT: ``ffn_dim``; DistilBERT: ``hidden_dim``; T5: ``d_ff``).
INTERMEDIATE_KEYS = ("intermediate_size", "n_inner", "ffn_dim", "hidden_dim", "d_ff")


def _is_hf(model):
    config = getattr(model, "config", None)
    return config is not None and callable(getattr(config, "to_dict", None))


def _removed(plain, name):
    try:
        return isinstance(plain.get_submodule(name), ZeroBranch)
    except AttributeError:  # an encoder layer's dropped branch
        return True


def block_shapes(plain, resolved):
    """``[(query heads, key-value heads, head_dim) or None, units or None]`` of each pruned block."""
    out = []
    for r in resolved:
        if r.kind != "linear" or r.cross is not None:
            return None
        if _removed(plain, r.out) or _removed(plain, r.attention):
            attention = None
        else:
            heads = features(plain.get_submodule(r.out))[0] // r.head_dim
            attention = (heads, heads // (r.num_heads // r.groups), r.head_dim)
        if _removed(plain, r.down) or (not r.mlp_at_projection and _removed(plain, r.mlp)):
            units = None
        else:
            units = features(plain.get_submodule(r.down))[0]
        out.append((attention, units))
    return out


def _describes(plain, config):
    """``None`` when a model of ``plain``'s class built from ``config`` has ``plain``'s parameter shapes, else why."""
    try:
        with torch.device("meta"):
            fresh = type(plain)(config)
    except Exception as err:  # noqa: BLE001 - any failure to build means the config does not describe it
        return f"{type(plain).__name__}(config) fails: {str(err).splitlines()[0] if str(err) else type(err).__name__}"
    want = {k: tuple(v.shape) for k, v in plain.state_dict().items()}
    got = {k: tuple(v.shape) for k, v in fresh.state_dict().items()}
    for key in sorted(set(want) | set(got)):
        if want.get(key) != got.get(key) and not (key not in want and _left_out(plain, key)):
            return f"{key}: the pruned model has {want.get(key)}, a model of its config {got.get(key)}"
    return None


def _left_out(model, key):
    """Whether the module of state dict entry ``key`` is a part ``model`` was built without (an attribute set to
    ``None``, as BERT's ``pooler`` with ``add_pooling_layer=False``): not a size its config sets."""
    m = model
    for part in key.split(".")[:-1]:
        m = getattr(m, part, False)
        if m is None:
            return True
        if not isinstance(m, torch.nn.Module):
            return False
    return False


#: Config entries of the number of blocks, by family (Llama, BERT, OPT: ``num_hidden_layers``; GPT-2: ``n_layer``;
#: DistilBERT: ``n_layers``).
LAYER_KEYS = ("num_hidden_layers", "n_layer", "num_layers", "n_layers")


def hf_models(model):
    """``(name, module)`` of the outermost Hugging Face models in ``model`` (``model`` itself where it is one; the
    models inside a module of your own otherwise)."""
    found = []
    for name, m in model.named_modules():
        if _is_hf(m) and not any(_inside(name, outer) for outer, _ in found):
            found.append((name, m))
    return found


def _inside(name, prefix):
    return prefix == "" or name == prefix or name.startswith(prefix + ".")


def update_config(plain, resolved, removed=None):
    """Set the config of each Hugging Face model in the pruned ``plain`` (``plain`` itself, or the models inside a
    module of your own) to its kept sizes; where its config cannot describe them, keep it, warn, and make the
    model's ``save_pretrained`` raise a ``ValueError`` saying so.

    ``removed``: ``{list name: (the kept blocks' former positions, the former length)}`` where whole blocks were
    removed; the config's number of layers (and its per-layer ``layer_types``) then follows. The quantization
    marks of a model whose weights are all plain tensors are removed (see :func:`clear_quantization`). Models
    without a Hugging Face config are left as they are.
    """
    for prefix, hf in hf_models(plain):
        inner = [r for r in resolved if _inside(r.name, prefix)]  # its kept blocks
        lists = {k: v for k, v in (removed or {}).items() if _inside(k, prefix)}
        if inner or lists:
            why = _update(plain, hf, inner, lists)
            if why is not None:
                _cannot(hf, why, _describable(hf, inner[0], prefix) if inner else "")
        clear_quantization(hf)


def _update(plain, hf, resolved, removed):
    """Point ``hf`` at a config of the kept sizes of its blocks ``resolved``; ``None``, or why it cannot."""
    shapes = block_shapes(plain, resolved)
    if shapes is None:
        return "only blocks with linear q, k, v projections and no cross-attention are described"
    lost = [i for i, (a, u) in enumerate(shapes) if a is None or u is None]
    if lost:
        return f"block {resolved[lost[0]].name} lost a residual branch"
    if len(set(shapes)) > 1:
        return f"the blocks keep different sizes ((heads, kv heads, head_dim), units): {shapes}"
    config = copy.deepcopy(hf.config)
    entries = config.to_dict()
    if shapes:  # (none: every block was removed)
        (heads, kv_heads, head_dim), units = shapes[0]
        _set_heads(config, entries, heads, kv_heads, head_dim)
        key = next((k for k in INTERMEDIATE_KEYS if k in entries), None)
        if key is not None:
            setattr(config, key, units)
    if removed:
        why = _set_layers(config, entries, removed)
        if why is not None:
            return why
    why = _describes(hf, config)
    if why is not None:
        return why
    _set_config(hf, config)
    for m in hf.modules():  # (a model pruned before, its save_pretrained refused, now described)
        if isinstance(m.__dict__.get("save_pretrained"), _RefusedSave):
            del m.__dict__["save_pretrained"]
    return None


def _set_heads(config, entries, heads, kv_heads, head_dim):
    """Set the config's heads, key-value heads and head width."""
    config.num_attention_heads = heads
    if "num_key_value_heads" in entries:
        config.num_key_value_heads = kv_heads
    if "head_dim" in entries or entries.get("hidden_size", head_dim * heads) != head_dim * heads:
        config.head_dim = head_dim  # read by Llama-family attentions, which default it to hidden_size // heads


def _set_layers(config, entries, removed):
    """Lower the config's number of layers (and subset its ``layer_types``) to the kept blocks; ``None``, or why not."""
    if len(removed) > 1:
        return f"blocks were removed from {len(removed)} lists of layers ({sorted(removed)})"
    ((where, (kept, before)),) = removed.items()
    key = next((k for k in LAYER_KEYS if k in entries), None)
    if key is None or entries[key] != before:
        return f"blocks were removed from {where}, whose {before} layers the config does not count"
    setattr(config, key, len(kept))
    types = entries.get("layer_types")
    if isinstance(types, list) and len(types) == before:
        config.layer_types = [types[i] for i in kept]
    return None


def _set_config(model, config):
    """Point ``model`` and every submodule that held its old config at ``config``."""
    old = model.config
    for m in model.modules():
        if getattr(m, "config", None) is old:
            m.config = config


def _key(config, name):
    """The config's own name of a standard entry (GPT-2's ``n_head`` for ``num_attention_heads``)."""
    return getattr(config, "attribute_map", {}).get(name, name)


def _fewer_heads(hf, r, prefix):
    """Whether ``hf``'s config class describes blocks of fewer heads (one key-value group fewer) of the same
    width: a model built from such a config (on the ``meta`` device) has the narrower output projection."""
    per_group = r.num_heads // r.groups
    heads = r.num_heads - (per_group if r.groups > 1 else 1)
    if heads < 1:
        return False
    config = copy.deepcopy(hf.config)
    _set_heads(config, config.to_dict(), heads, max(heads // per_group, 1), r.head_dim)
    try:
        with torch.device("meta"):
            fresh = type(hf)(config)
        out = fresh.get_submodule(r.out[len(prefix) + 1 :] if prefix else r.out)
        return features(out)[0] == heads * r.head_dim
    except Exception:  # noqa: BLE001 - a config that cannot be built with fewer heads does not describe them
        return False


def _describable(hf, r, prefix):
    """What ``hf``'s config class describes (read from a block ``r`` of it), and the ``fix_architecture`` call that
    prunes to it."""
    config, entries = hf.config, hf.config.to_dict()
    heads = _key(config, "num_attention_heads")
    if _fewer_heads(hf, r, prefix):
        kv = "num_key_value_heads" in entries
        parts = [f"the heads ({heads}{', num_key_value_heads' if kv else ''}, head_dim)"]
        call = ["num_key_value_heads=..." if kv else "num_attention_heads=..."]
    else:
        hidden = _key(config, "hidden_size")
        parts = [f"all {r.num_heads} heads but not fewer (the head width is {hidden} / {heads})"]
        call = [f"num_attention_heads={r.num_heads}"]
    mlp = next((k for k in INTERMEDIATE_KEYS if k in entries), None)
    if mlp is not None:
        parts.append(f"the MLP width ({mlp})")
        call.append("intermediate_size=...")
    layers = next((k for k in LAYER_KEYS if k in entries), None)
    if layers is not None:
        parts.append(f"the number of blocks ({layers})")
    listed = parts[0] if len(parts) == 1 else f"{', '.join(parts[:-1])} and {parts[-1]}"
    return (
        f"{type(config).__name__} describes the same sizes in every block, each with both of its branches: "
        f"{listed}; fix_architecture(gated, {', '.join(call)}) before prune gives such a model"
    )


class _RefusedSave:
    """The ``save_pretrained`` of a pruned Hugging Face model that its config does not describe: a ``ValueError``
    saying why, instead of a folder that ``from_pretrained`` cannot load."""

    def __init__(self, message):
        self.message = message

    def __call__(self, *args, **kwargs):
        raise ValueError(self.message)

    def __repr__(self):
        return f"_RefusedSave({self.message!r})"


def _cannot(hf, why, describable):
    """Warn that ``hf`` keeps its config (``why``), and make its ``save_pretrained`` raise saying so."""
    name, why = type(hf).__name__, why.rstrip(".")
    way_out = f" or torch.export, or prune to what its config describes: {describable}" if describable else ""
    refusal = _RefusedSave(
        f"save_pretrained: this pruned {name} keeps its original config, which does not describe it ({why}), so "
        "from_pretrained could not load the folder. Save it with l0bayes.pruning.save_pruned (load_pruned "
        f"rebuilds it in a fresh {name}){way_out}"
    )
    for m in hf.modules():  # the model and the Hugging Face models inside it (LlamaForCausalLM.model)
        if _is_hf(m) and m.config is hf.config and callable(getattr(m, "save_pretrained", None)):
            m.save_pretrained = refusal
    warn(
        f"the pruned {name} keeps its original config ({why}): its save_pretrained raises, as from_pretrained "
        f"could not rebuild it. Save it with l0bayes.pruning.save_pruned{way_out}"
    )


#: The float types of plain, unquantized weights.
PLAIN_FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def clear_quantization(hf):
    """Remove the marks transformers leaves on a quantized model (``hf_quantizer``, ``config.quantization_config``,
    ``is_quantized``, ...) when every parameter and buffer of ``hf`` is a plain tensor, the parameters in a float
    type: a model loaded from a GGUF file whose weights transformers dequantized, which ``save_pretrained`` would
    otherwise refuse as quantized. A model whose weights are still quantized keeps them."""
    config = hf.config
    marked = (
        getattr(hf, "hf_quantizer", None) is not None
        or getattr(config, "quantization_config", None) is not None
        or getattr(hf, "is_quantized", False)
        or getattr(config, "_is_quantized", False)
    )
    if not marked:
        return
    for p in hf.parameters():
        if type(p.data) is not torch.Tensor or p.dtype not in PLAIN_FLOATS:
            return
    if any(type(b) is not torch.Tensor for b in hf.buffers()):
        return
    for m in hf.modules():
        if _is_hf(m):
            for attr in ("hf_quantizer", "quantization_method", "is_quantized", "_weight_conversions"):
                m.__dict__.pop(attr, None)
            for attr in ("quantization_config", "_is_quantized"):
                m.config.__dict__.pop(attr, None)
