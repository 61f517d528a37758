"""plot_head_map: a gated transformer's heads as an image, layers by heads, from the gates themselves."""

import io

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

matplotlib = pytest.importorskip("matplotlib")
matplotlib.use("Agg")

from l0bayes.analysis import plot_head_map  # noqa: E402
from l0bayes.analysis.plots import head_map  # noqa: E402
from l0bayes.models import SparseModel  # noqa: E402
from l0bayes.pruning import prune, sparsify_transformer  # noqa: E402

D, VOCAB, T = 16, 7, 5


class Attention(nn.Module):
    def __init__(self, n_head):
        super().__init__()
        self.n_head, self.head_dim = n_head, 4
        self.q, self.k, self.v = (nn.Linear(D, 4 * n_head) for _ in range(3))
        self.out = nn.Linear(4 * n_head, D)

    def forward(self, x):
        b, t, _ = x.shape
        q, k, v = (f(x).view(b, t, self.n_head, 4).transpose(1, 2) for f in (self.q, self.k, self.v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.out(y.transpose(1, 2).reshape(b, t, 4 * self.n_head))


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(D, 8), nn.Linear(8, D)

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x)))


class Block(nn.Module):
    def __init__(self, n_head):
        super().__init__()
        self.attn, self.mlp = Attention(n_head), MLP()

    def forward(self, x):
        x = x + self.attn(x)
        return x + self.mlp(x)


class Net(nn.Module):
    """Three blocks of 4, 2 and 3 heads."""

    def __init__(self):
        super().__init__()
        self.tok = nn.Embedding(VOCAB, D)
        self.blocks = nn.ModuleList(Block(h) for h in (4, 2, 3))
        self.head = nn.Linear(D, VOCAB)

    def forward(self, idx):
        x = self.tok(idx)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def _tokens():
    return torch.randint(0, VOCAB, (2, T), generator=torch.Generator().manual_seed(0))


def _gated(**kwargs):
    torch.manual_seed(0)
    gated = sparsify_transformer(Net(), example_inputs=_tokens(), **kwargs)
    with torch.no_grad():
        for block in gated.blocks:
            if hasattr(block, "l0_heads"):
                block.l0_heads.gate.log_alpha.fill_(8.0)  # Eq. 13 gate exactly 1
            if hasattr(block, "l0_attention"):
                block.l0_attention.gate.log_alpha.fill_(8.0)
        if hasattr(gated.blocks[0], "l0_heads"):
            gated.blocks[0].l0_heads.gate.log_alpha[1] = -8.0  # closed
            gated.blocks[0].l0_heads.gate.log_alpha[2] = 0.5  # fractional: Eq. 13 gate in (0, 1)
        if hasattr(gated.blocks[1], "l0_attention"):
            gated.blocks[1].l0_attention.gate.log_alpha.fill_(-8.0)  # the whole attention branch closed
    return gated


def _png(fig):
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    assert buffer.getvalue()[:8] == b"\x89PNG\r\n\x1a\n"


def test_head_map_shows_each_heads_gate():
    gated = _gated().eval()
    fig, ax = plot_head_map(gated)
    _png(fig)
    image = np.ma.filled(ax.images[0].get_array(), np.nan)
    z = gated.blocks[0].l0_heads.gate.deterministic().detach().double().numpy()
    assert 0.0 < z[2] < 1.0
    expected = np.array([z, [0.0, 0.0, np.nan, np.nan], [1.0, 1.0, 1.0, np.nan]])
    np.testing.assert_allclose(image, expected, rtol=1e-12)
    assert [t.get_text() for t in ax.get_yticklabels()] == ["blocks.0", "blocks.1", "blocks.2"]
    assert ax.get_title() == "heads: test_gate, 6 of 9 open"
    # the open heads are those prune() keeps (a closed branch keeps none)
    values, _ = head_map(gated, "active")
    pruned = prune(gated)
    assert pruned.blocks[0].attn.n_head == 3 and pruned.blocks[2].attn.n_head == 3
    assert not hasattr(pruned.blocks[1].attn, "n_head")  # a ZeroBranch
    assert np.nansum(values, axis=1).tolist() == [3.0, 0.0, 3.0]


def test_head_map_of_q_and_of_a_wrapped_model():
    gated = _gated()
    model = SparseModel(gated, lambda out, y: F.cross_entropy(out.flatten(0, 1), y.flatten()))
    fig, ax = plot_head_map(model, quantity="prob_nonzero", annotate=False)
    image = np.ma.filled(ax.images[0].get_array(), np.nan)
    q0 = gated.blocks[0].l0_heads.gate.prob_nonzero().detach().double()
    q0 = (q0 * gated.blocks[0].l0_attention.gate.prob_nonzero().detach().double()).numpy()
    np.testing.assert_allclose(image[0], q0, rtol=1e-12)
    assert not ax.texts
    assert ax.get_title() == f"heads: prob_nonzero, {np.nansum(image):.1f} of 9 open in expectation"


def test_head_map_with_branch_gates_only_and_errors():
    gated = _gated(heads=False, units=False)  # every head of a block open or closed with its branch
    values, names = head_map(gated)
    assert names == ["blocks.0", "blocks.1", "blocks.2"]
    np.testing.assert_array_equal(np.nan_to_num(values, nan=-1), [[1, 1, 1, 1], [0, 0, -1, -1], [1, 1, 1, -1]])
    with pytest.raises(ValueError, match="sparsify_transformer"):
        plot_head_map(Net())
    with pytest.raises(ValueError, match="unknown quantity"):
        plot_head_map(gated, quantity="mean")
