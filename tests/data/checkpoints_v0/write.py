"""How the checkpoints beside this file were written: by l0bayes before objectives were objects (train() then took the
constrained settings, ``ema_decay`` and ``log_alpha_range`` itself). Kept as the record of what they hold; it runs
only against that version. tests/test_settings_resume.py resumes them with today's API."""

import math
import sys

import torch

from l0bayes.inference import train
from l0bayes.models import SparseClassifier
from l0bayes.nn import L0MLP


def data():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(48, 6, generator=g)
    return x, (x[:, 0] + x[:, 1] > 0).long()


def model():
    torch.manual_seed(0)
    return SparseClassifier(L0MLP(6, (5,), 2), lam=0.1)


if __name__ == "__main__":
    out = sys.argv[1]
    x, y = data()
    common = dict(batch_size=16, lr=0.05, seed=3, progress=False, threads=1)
    train(
        model(),
        x,
        y,
        objective="constrained",
        target_density=0.5,
        target_warmup=4,
        epochs=2,
        checkpoint=f"{out}/constrained.pt",
        **common,
    )
    train(
        model(),
        x,
        y,
        objective="bayes",
        ema_decay=0.9,
        log_alpha_range=(math.log(0.01), math.log(100)),
        epochs=2,
        checkpoint=f"{out}/bayes_ema.pt",
        **common,
    )
    # What the same runs give trained for 4 epochs from the start (the resumes must give these numbers).
    import json

    runs = {
        "constrained": train(
            model(), x, y, objective="constrained", target_density=0.5, target_warmup=4, epochs=4, **common
        ),
        "bayes_ema": train(
            model(),
            x,
            y,
            objective="bayes",
            ema_decay=0.9,
            log_alpha_range=(math.log(0.01), math.log(100)),
            epochs=4,
            **common,
        ),
    }
    with open(f"{out}/expected.json", "w") as f:
        json.dump({k: [r["train_loss"] for r in run.history] for k, run in runs.items()}, f, indent=1)
