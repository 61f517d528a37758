"""A pruned Hugging Face model's config: the kept sizes, so that ``save_pretrained`` / ``from_pretrained`` work.

Nothing here imports ``transformers``: a model is a Hugging Face model when it has a ``config`` with
``to_dict``. The config can describe the pruned model when every block keeps the same number of query heads,
key-value heads and MLP units and keeps both of its branches (a block with a closed branch has no place in the
config of its class). Whether the new config describes the model is checked, not assumed: a model of the same
class is built from it (on the ``meta`` device: no memory) and its parameter shapes compared with the pruned
model's.
"""

import copy
import warnings

import torch

from .attention import ZeroBranch
from .projections import features

#: Config entries of the MLP's width, by family (Llama, GPT-NeoX, BERT: ``intermediate_size``; GPT-2:
#: ``n_inner``; OPT: ``ffn_dim``; T5: ``d_ff``).
INTERMEDIATE_KEYS = ("intermediate_size", "n_inner", "ffn_dim", "d_ff")


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
        if want.get(key) != got.get(key):
            return f"{key}: the pruned model has {want.get(key)}, a model of its config {got.get(key)}"
    return None


#: Config entries of the number of blocks, by family (Llama, BERT, OPT: ``num_hidden_layers``; GPT-2: ``n_layer``).
LAYER_KEYS = ("num_hidden_layers", "n_layer", "num_layers")


def update_config(plain, resolved, removed=None):
    """Set the config of the pruned Hugging Face model ``plain`` to its kept sizes; warn when it cannot be.

    ``removed``: ``{list name: (the kept blocks' former positions, the former length)}`` where whole blocks were
    removed; the config's number of layers (and its per-layer ``layer_types``) then follows. Models without a
    Hugging Face config are left as they are.
    """
    if not _is_hf(plain):
        return
    shapes = block_shapes(plain, resolved)
    if shapes is None:
        _cannot(plain, "only blocks with linear q, k, v projections and no cross-attention are described")
        return
    lost = [i for i, (a, u) in enumerate(shapes) if a is None or u is None]
    if lost:
        _cannot(plain, f"block {resolved[lost[0]].name} lost a residual branch")
        return
    if len(set(shapes)) > 1:
        _cannot(plain, f"the blocks keep different sizes ((heads, kv heads, head_dim), units): {shapes}")
        return
    config = copy.deepcopy(plain.config)
    entries = config.to_dict()
    if shapes:  # (none: every block was removed)
        _set_sizes(config, entries, *shapes[0])
    if removed:
        why = _set_layers(config, entries, removed)
        if why is not None:
            _cannot(plain, why)
            return
    why = _describes(plain, config)
    if why is not None:
        _cannot(plain, why)
        return
    _set_config(plain, config)


def _set_sizes(config, entries, attention, units):
    """Set the config's heads, key-value heads, head width and MLP width to one block's."""
    heads, kv_heads, head_dim = attention
    config.num_attention_heads = heads
    if "num_key_value_heads" in entries:
        config.num_key_value_heads = kv_heads
    if "head_dim" in entries or entries.get("hidden_size", head_dim * heads) != head_dim * heads:
        config.head_dim = head_dim  # read by Llama-family attentions, which default it to hidden_size // heads
    key = next((k for k in INTERMEDIATE_KEYS if k in entries), None)
    if key is not None:
        setattr(config, key, units)


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


def _cannot(plain, why):
    warnings.warn(
        f"the pruned {type(plain).__name__} keeps its original config (save_pretrained / from_pretrained would not "
        f"rebuild it): {why}. Save it with l0bayes.pruning.save_pruned or torch.export, or prune to a uniform "
        "architecture (the same heads and units in every kept block)",
        UserWarning,
        stacklevel=6,
    )
    return plain
