"""The model object that :func:`~l0bayes.inference.train` trains, built from the settings and the data set."""

from .errors import CLIError


def default_hidden(data):
    return [300, 100] if data.num_features == 784 else [100, 50]


def _check_size(hidden, data):
    """Refuse, before any allocation, an MLP too large to hold (``--hidden 100000,100000``)."""
    from .arguments import MAX_WEIGHTS

    sizes = [data.num_features, *hidden, data.num_classes]
    weights = sum(a * b for a, b in zip(sizes[:-1], sizes[1:], strict=False))
    if weights > MAX_WEIGHTS:
        raise CLIError(
            f"--hidden {','.join(map(str, hidden))}: the dense network would have {weights:,} weights "
            f"on {data.num_features} inputs; at most {MAX_WEIGHTS:,}"
        )


def build_model(cfg, data):
    """The model object :func:`~l0bayes.inference.train` trains, for the settings and data set.

    A setting the model's constructor refuses (e.g. per-layer lambdas naming unknown layers) is a
    :class:`~l0bayes.cli.errors.CLIError`.
    """
    import torch

    torch.manual_seed(cfg["seed"])
    try:
        return _build(cfg, data)
    except ValueError as err:
        raise CLIError(str(err)) from None


def _build(cfg, data):
    from ..models import SparseClassifier, SparseLinearRegression, SparseLogisticRegression
    from ..nn import L0MLP, L0LeNet5

    model = cfg["model"]
    if model == "mlp":
        _check_size(cfg["hidden"] or default_hidden(data), data)
    if model in ("linear", "logistic"):
        cls = SparseLinearRegression if model == "linear" else SparseLogisticRegression
        return cls(data.num_features, prior_inclusion=cfg["prior_inclusion"], slab=cfg["slab"], code_cost=cfg["lam"])
    weight_init = cfg.get("init") or "torch"  # absent from configs saved before --init existed
    if model == "mlp":
        hidden = cfg["hidden"] or default_hidden(data)
        net = L0MLP(
            in_features=data.num_features,
            hidden=tuple(hidden),
            num_classes=data.num_classes,
            weight_init=weight_init,
        )
    else:
        if not data.is_image:
            raise CLIError(f"--model lenet5 needs image data, {data.name} has input shape {data.input_shape}")
        channels, height, width = data.input_shape
        padding = 0 if min(height, width) >= 28 else 2
        net = L0LeNet5(
            in_channels=channels,
            num_classes=data.num_classes,
            input_size=(height, width),
            padding=padding,
            weight_init=weight_init,
        )
    return SparseClassifier(
        net, lam=cfg["lam"], weight_decay=cfg["weight_decay"], prior_inclusion=cfg["prior_inclusion"]
    )


def train_targets(cfg, data):
    """Labels as the model wants them: float 0/1 for the logistic regression, else as loaded."""
    import torch

    if cfg["model"] == "logistic":
        return data.y_train.to(torch.float32), data.y_test.to(torch.float32)
    return data.y_train, data.y_test
